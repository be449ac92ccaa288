//! `cargo xtask bench [--quick]`: release builds of `mongocoord` and `lab`, a
//! fresh SecantusDB (or `MONGODB_URI`), then `lab bench`, which writes
//! `target/bench/summary.json`.

use std::process::Command;

use crate::server::{self, root, run_cmd};

pub(crate) fn run(quick: bool) -> Result<(), String> {
    crate::cargo(&["build", "--release", "-p", "mongocoord", "-p", "lab"], &[])?;
    let venv = server::venv()?;
    let (server, uri, label) = match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => (None, uri, "MONGODB_URI".to_owned()),
        _ => {
            let (s, u) = server::start(&venv)?;
            (Some(s), u, "SecantusDB 0.7.0b3 (fresh, in memory, retryWrites=false)".to_owned())
        }
    };
    let release = root().join("target").join("release");
    let out = root().join("target").join("bench").join("summary.json");
    let mut cmd = Command::new(release.join("lab"));
    cmd.args(["--uri", &uri, "--db", "mongocoord_bench", "bench", "--out"])
        .arg(&out)
        .arg("--mongocoord")
        .arg(release.join("mongocoord"))
        .arg("--python")
        .arg(venv.join("bin").join("python"))
        .arg("--seed-script")
        .arg(root().join("lab").join("bench").join("seed_bench.py"))
        .env("MONGOCOORD_BENCH_SERVER", label);
    if quick {
        cmd.arg("--quick");
    }
    let result = run_cmd(&mut cmd);
    drop(server);
    result
}
