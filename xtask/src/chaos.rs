//! `cargo xtask chaos [--minutes N] [--seed S]`: a debug build of `lab`, and a
//! SecantusDB that `lab chaos` may kill and restart (on-disk storage), or
//! `MONGODB_URI` (not restarted).

use std::process::Command;

use crate::server::{self, root, run_cmd};

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    // The same flags as the test build, so inside `cargo xtask ci` nothing is rebuilt.
    crate::cargo(&["build", "-p", "lab", "-p", "mongocoord"], &[("RUSTFLAGS", "-Dwarnings")])?;
    let mut cmd = Command::new(crate::bin_dir("debug").join("lab"));
    match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => {
            cmd.env("MONGODB_URI", &uri).arg("chaos");
        }
        _ => {
            let venv = server::venv()?;
            cmd.args(["--db", "mongocoord_chaos", "chaos", "--server-bin"]).arg(venv.join("bin").join("secantusd-py"));
        }
    }
    let dir = root().join("target").join("chaos");
    cmd.arg("--mongocoord").arg(crate::bin_dir("debug").join("mongocoord"));
    cmd.arg("--dir").arg(&dir).args(args);
    run_cmd(&mut cmd).inspect_err(|_| keep_failed_run(&dir))
}

/// Moves a failed run's directory (every worker's log, the server's data, the
/// summary) aside, so the next run does not overwrite what shows the failure.
fn keep_failed_run(dir: &std::path::Path) {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let kept = dir.with_file_name(format!("chaos-failed-{secs}"));
    match std::fs::rename(dir, &kept) {
        Ok(()) => eprintln!("xtask chaos: the failed run's logs are kept in {}", kept.display()),
        Err(e) => eprintln!("xtask chaos: could not keep the failed run's logs ({e})"),
    }
}
