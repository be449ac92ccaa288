//! `cargo xtask chaos [--minutes N] [--seed S]`: a debug build of `lab`, and a
//! SecantusDB that `lab chaos` may kill and restart (on-disk storage), or
//! `MONGODB_URI` (not restarted).

use std::process::Command;

use crate::server::{self, root, run_cmd};

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    // The same flags as the test build, so inside `cargo xtask ci` nothing is rebuilt.
    crate::cargo(&["build", "-p", "lab", "-p", "mongocoord"], &[("RUSTFLAGS", "-Dwarnings")])?;
    let mut cmd = Command::new(root().join("target").join("debug").join("lab"));
    match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => {
            cmd.args(["--uri", &uri, "chaos"]);
        }
        _ => {
            let venv = server::venv()?;
            cmd.args(["--db", "mongocoord_chaos", "chaos", "--server-bin"]).arg(venv.join("bin").join("secantusd-py"));
        }
    }
    cmd.arg("--mongocoord").arg(root().join("target").join("debug").join("mongocoord"));
    cmd.arg("--dir").arg(root().join("target").join("chaos")).args(args);
    run_cmd(&mut cmd)
}
