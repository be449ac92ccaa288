//! The seed's Python `mongoelector` (`lab/bench/seed_bench.py`) on the same
//! server as ours: lock cycles, and election handovers (and, in a full run,
//! failovers) measured as ours are.

use std::path::Path;

use super::election;
use super::figures::{Figures, Section};
use super::size::{BenchOpts, Mode};
use super::stats::{pct, sorted};
use crate::error::LabError;

/// The seed's Python `mongoelector` on the same server: lock cycles, and
/// election handovers (and, in a full run, failovers) as ours are measured.
pub(super) async fn put_figures(
    f: &mut Figures,
    uri: &str,
    db: &str,
    o: &BenchOpts,
    py: &Path,
    script: &Path,
) -> Result<(), LabError> {
    let size = o.mode.size();
    eprintln!("the seed's Python mongoelector, same server…");
    let cycles = tokio::process::Command::new(py)
        .arg(script)
        .env("MONGODB_URI", uri)
        .args([db, "lock-cycles", &size.seed_cycles.to_string()])
        .output()
        .await
        .map_err(|e| LabError::io(format!("cannot run {} {}", py.display(), script.display()), e))?;
    let text = String::from_utf8_lossy(&cycles.stdout);
    match text.trim().parse::<f64>() {
        Ok(v) => f.put("seed_lock_cycles_per_s", v),
        Err(_) => f.skip_figure(
            "seed_lock_cycles_per_s",
            format!("seed_bench.py lock-cycles failed: {}", String::from_utf8_lossy(&cycles.stderr).trim()),
        ),
    }
    let seed = |key: &str, file: &Path| {
        let mut c = tokio::process::Command::new(py);
        c.arg(script).env("MONGODB_URI", uri).args([db, "elect", key, "3", &file.display().to_string()]);
        c
    };
    // The seed replaces a killed leader only after MongoDB's TTL monitor
    // deletes its lock (about once a minute): only full runs kill it.
    let kills = if o.mode == Mode::Full { size.elect_trials } else { 0 };
    let t = election::trials("seed-elect", &o.out, size.elect_trials, kills, None, seed).await?;
    f.put("seed_handover_ms_p50", pct(&sorted(t.handovers_ms), 0.5));
    if kills > 0 {
        f.put("seed_failover_s_p50", pct(&sorted(t.failovers_s), 0.5));
    } else {
        f.skip(Section::SeedFailover, "full runs only: a failover waits for the TTL monitor, about a minute a trial");
    }
    Ok(())
}
