//! The seed's Python `mongoelector` (`lab/bench/seed_bench.py`) on the same
//! server as ours: lock cycles, and election handovers (and, in a full run,
//! failovers) measured as ours are.

use std::path::Path;
use std::time::Duration;

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
    // At its default `timeparanoid`: its clock check reads `serverStatus`
    // once and trusts the answer for ten minutes, so after the untimed first
    // cycle the setting costs a cycle nothing either way.
    match lock_cycles(uri, db, py, script, size.calls).await {
        Ok(v) => f.put("seed_lock_cycles_per_s", v),
        Err(e) => f.skip_figure("seed_lock_cycles_per_s", e.to_string()),
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

/// `seed_bench.py DB lock-cycles N`: the seed's lock's cycles per second,
/// bounded by a minute plus 100 ms a cycle.
async fn lock_cycles(uri: &str, db: &str, py: &Path, script: &Path, n: usize) -> Result<f64, LabError> {
    let run = tokio::process::Command::new(py)
        .arg(script)
        .env("MONGODB_URI", uri)
        .args([db, "lock-cycles", &n.to_string()])
        .kill_on_drop(true)
        .output();
    let limit =
        Duration::from_secs(60) + Duration::from_millis(100).saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
    let out = tokio::time::timeout(limit, run)
        .await
        .map_err(|_| LabError::timed_out("seed_bench.py lock-cycles did not finish", limit))?
        .map_err(|e| LabError::io(format!("cannot run {} {}", py.display(), script.display()), e))?;
    String::from_utf8_lossy(&out.stdout).trim().parse::<f64>().map_err(|_| {
        LabError::Unreadable(format!(
            "seed_bench.py lock-cycles failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    })
}
