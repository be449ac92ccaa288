//! `cargo xtask bench [--quick]`: release builds of `mongocoord` and `lab`, a
//! fresh SecantusDB (or `MONGODB_URI`), the pinned Agenda harness (when `node`
//! and `npm` exist), then `lab bench`, which writes `target/bench/summary.json`.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::server::{self, root, run_cmd};

pub(crate) fn run(quick: bool) -> Result<(), String> {
    crate::cargo(&["build", "--release", "-p", "mongocoord", "-p", "lab"], &[])?;
    let venv = server::venv()?;
    let agenda = agenda();
    let (server, uri, label) = match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => (None, uri, "MONGODB_URI".to_owned()),
        _ => {
            let (s, u) = server::start(&venv)?;
            (Some(s), u, format!("{} (fresh, in memory, retryWrites=false)", server::SECANTUS.replace("==", " ")))
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
    if let Some(dir) = &agenda {
        cmd.arg("--agenda").arg(dir);
    }
    if quick {
        cmd.arg("--quick");
    }
    let result = run_cmd(&mut cmd);
    drop(server);
    result
}

/// Whether `tool --version` runs.
fn has(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// The Agenda harness in `target/bench/agenda`: `lab/bench/agenda/{package.json,
/// bench.mjs}` copied there and `npm install`ed (again when the pinned
/// `package.json` changed). `None`, with a message, when `node` or `npm` is
/// missing or the install fails: the Agenda figures are then skipped.
fn agenda() -> Option<PathBuf> {
    if !has("node") || !has("npm") {
        eprintln!("node or npm not found: the Agenda figures are skipped");
        return None;
    }
    let src = root().join("lab").join("bench").join("agenda");
    let dir = root().join("target").join("bench").join("agenda");
    let install = || -> Result<(), String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let pinned = std::fs::read(src.join("package.json")).map_err(|e| e.to_string())?;
        let installed = std::fs::read(dir.join("package.json")).ok();
        std::fs::copy(src.join("bench.mjs"), dir.join("bench.mjs")).map_err(|e| e.to_string())?;
        let present = dir.join("node_modules").join("agenda").join("package.json").exists();
        if installed.as_deref() != Some(&pinned[..]) || !present {
            eprintln!("installing Agenda (lab/bench/agenda/package.json) into {}", dir.display());
            std::fs::write(dir.join("package.json"), &pinned).map_err(|e| e.to_string())?;
            run_cmd(Command::new("npm").args(["install", "--no-audit", "--no-fund", "--prefix"]).arg(&dir))?;
        }
        Ok(())
    };
    match install() {
        Ok(()) => Some(dir),
        Err(e) => {
            eprintln!("cannot install the Agenda harness ({e}): the Agenda figures are skipped");
            None
        }
    }
}
