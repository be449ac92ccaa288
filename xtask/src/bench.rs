//! `cargo xtask bench [--quick | --smoke]`: builds of `mongocoord` and `lab`, a
//! fresh SecantusDB (or `MONGODB_URI`), the pinned Agenda harness (when `node`
//! and `npm` exist), then `lab bench`, which writes `target/bench/summary.json`
//! (`--smoke`: `target/bench/smoke.json`, then checks that every promised
//! figure is there).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::server::{self, root, run_cmd};

/// How big a run is (`lab bench`'s modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every section at a tiny size, every figure checked: on the debug
    /// build the tests and the chaos run use (the same flags), so inside
    /// `cargo xtask ci` it builds nothing; its numbers mean nothing anyway.
    /// Agenda only when its install is already there (no `npm install`).
    Smoke,
    /// A short release run.
    Quick,
    /// The README's figures (release).
    Full,
}

/// Runs the bench; with `strict` (`cargo xtask ci`, or `CI` set), a smoke run
/// may skip only Agenda and the seed's failover.
pub(crate) fn run(mode: Mode, strict: bool) -> Result<(), String> {
    let profile = if mode == Mode::Smoke {
        crate::cargo(&["build", "-p", "lab", "-p", "mongocoord"], &[("RUSTFLAGS", "-Dwarnings")])?;
        "debug"
    } else {
        crate::cargo(&["build", "--release", "-p", "mongocoord", "-p", "lab"], &[])?;
        "release"
    };
    let venv = server::venv()?;
    let agenda = agenda(mode != Mode::Smoke);
    let (server, uri, label) = match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => (None, uri, "MONGODB_URI".to_owned()),
        _ => {
            let (s, u) = server::start(&venv)?;
            (Some(s), u, format!("{} (fresh, in memory, retryWrites=false)", server::SECANTUS.replace("==", " ")))
        }
    };
    let bin = root().join("target").join(profile);
    let file = if mode == Mode::Smoke { "smoke.json" } else { "summary.json" };
    let out = root().join("target").join("bench").join(file);
    let mut cmd = Command::new(bin.join("lab"));
    cmd.args(["--uri", &uri, "--db", "mongocoord_bench", "bench", "--out"])
        .arg(&out)
        .arg("--mongocoord")
        .arg(bin.join("mongocoord"))
        .arg("--python")
        .arg(venv.join("bin").join("python"))
        .arg("--seed-script")
        .arg(root().join("lab").join("bench").join("seed_bench.py"))
        .env("MONGOCOORD_BENCH_SERVER", label);
    if let Some(dir) = &agenda {
        cmd.arg("--agenda").arg(dir);
    }
    match mode {
        Mode::Smoke => {
            cmd.arg("--smoke");
        }
        Mode::Quick => {
            cmd.arg("--quick");
        }
        Mode::Full => {}
    }
    if strict {
        cmd.env("CI", "true");
    }
    let started = std::time::Instant::now();
    let result = run_cmd(&mut cmd);
    eprintln!("  (lab bench: {:.1} s)", started.elapsed().as_secs_f64());
    drop(server);
    result
}

/// Whether `tool --version` runs.
fn has(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// The Agenda harness in `target/bench/agenda`: `lab/bench/agenda/{package.json,
/// bench.mjs}` copied there and, with `install`, `npm install`ed (again when
/// the pinned `package.json` changed). `None`, with a message, when `node` or
/// `npm` is missing, the install fails, or (without `install`) it is not
/// installed yet: the Agenda figures are then skipped.
fn agenda(install: bool) -> Option<PathBuf> {
    if !has("node") || !has("npm") {
        eprintln!("node or npm not found: the Agenda figures are skipped");
        return None;
    }
    let src = root().join("lab").join("bench").join("agenda");
    let dir = root().join("target").join("bench").join("agenda");
    let prepare = || -> Result<(), String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let pinned = std::fs::read(src.join("package.json")).map_err(|e| e.to_string())?;
        let installed = std::fs::read(dir.join("package.json")).ok();
        std::fs::copy(src.join("bench.mjs"), dir.join("bench.mjs")).map_err(|e| e.to_string())?;
        let present = dir.join("node_modules").join("agenda").join("package.json").exists();
        if installed.as_deref() != Some(&pinned[..]) || !present {
            if !install {
                return Err("not installed (a smoke run installs nothing; `cargo xtask bench --quick` does)".into());
            }
            eprintln!("installing Agenda (lab/bench/agenda/package.json) into {}", dir.display());
            std::fs::write(dir.join("package.json"), &pinned).map_err(|e| e.to_string())?;
            run_cmd(Command::new("npm").args(["install", "--no-audit", "--no-fund", "--prefix"]).arg(&dir))?;
        }
        Ok(())
    };
    match prepare() {
        Ok(()) => Some(dir),
        Err(e) => {
            eprintln!("no Agenda harness ({e}): the Agenda figures are skipped");
            None
        }
    }
}
