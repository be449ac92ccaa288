//! The end of a run: the figures derived from others (ours against Agenda,
//! the names of earlier runs), `summary.json` with its header, the scaling
//! plot, and the check that every promised figure is there, which decides
//! the exit status.

use super::figures::{Figures, SHAPES};
use super::scaling;
use super::size::{BenchOpts, Mode};
use crate::error::LabError;

/// Derives the last figures, writes the summary and the plot, and checks
/// the figures: 0 when every promised one is there (or skipped with a
/// reason this run may give), else 1, the summary written all the same.
/// `server` and `version` say what the figures were measured on.
pub(super) fn finish(mut f: Figures, o: &BenchOpts, server: &str, version: &str) -> Result<u8, LabError> {
    // Against Agenda at its best setting of the sweep.
    let agenda = f.get("agenda_best_tasks_per_s");
    for shape in SHAPES {
        if let (Some(a), Some(rate)) = (agenda, f.get(&format!("queue_{shape}_tasks_per_s"))) {
            f.put(format!("queue_{shape}_vs_agenda"), rate / a);
        }
    }
    // The figure names of earlier runs, where they still mean the same thing.
    let (per_agent, shared) = (f.get("queue_per_agent_tasks_per_s"), f.get("queue_shared_tasks_per_s"));
    if let (Some(per_agent), Some(shared), Some(raw_rate)) = (per_agent, shared, f.get("raw_fam_per_s")) {
        f.put("queue_tasks_per_s", per_agent);
        f.put("queue_vs_raw", per_agent / raw_rate);
        f.put("queue_shared_vs_raw", shared / raw_rate);
    }

    let name = std::env::var("MONGOCOORD_BENCH_SERVER_NAME").unwrap_or_else(|_| "uri".into());
    let commit = std::env::var("MONGOCOORD_BENCH_COMMIT").unwrap_or_else(|_| "unknown".into());
    let date = bson::DateTime::now().try_to_rfc3339_string().unwrap_or_default();
    let date = date.get(..10).unwrap_or("unknown");
    let checked = f.check(std::env::var_os("CI").is_some());
    // Whether the run kept every promise, checked as strictly as under CI
    // whatever the environment: `bench-table` publishes no other.
    let check = match f.check(true) {
        Ok(()) => "passed".to_owned(),
        Err(e) => format!("failed: {e}"),
    };
    let header = [
        ("check", check.as_str()),
        ("server", server),
        ("server_name", &name),
        ("server_version", version),
        ("mode", o.mode.name()),
        ("commit", &commit),
        ("agenda_server", if o.peer_server.is_some() { "a fresh server per setting" } else { "the run's server" }),
        (
            "idle_server",
            if o.peer_server.is_some() { "a fresh server per role" } else { "the run's server, a database per role" },
        ),
        ("date", date),
    ];
    f.write(&o.out, &header)?;
    let plot = o.out.with_extension("svg");
    scaling::write_plot(&f, server, &plot)?;
    eprintln!("wrote {}", plot.display());
    eprintln!("wrote {}", o.out.display());
    match checked {
        Ok(()) => Ok(0),
        Err(e) if o.mode == Mode::Smoke => {
            eprintln!("lab bench --smoke: {e}");
            Ok(1)
        }
        Err(e) => {
            // The summary is written (what was measured stays usable), but a
            // run that lost figures without a reason is not a good run.
            eprintln!("lab bench: {e}");
            Ok(1)
        }
    }
}
