//! `cargo xtask bench [--quick | --smoke] [--server py|rs|URI]`: builds of
//! `mongocoord` and `lab`, a fresh server (`py`, the default: SecantusDB's
//! Python server; `rs`: its Rust server, `secantusd-rs`; or a URI, the
//! default when `MONGODB_URI` is set), the pinned Agenda harness (when `node`
//! and `npm` exist; each of its settings then gets a fresh server of the
//! same kind), then `lab bench`, which writes
//! `target/bench/summary-<py|rs|uri>.json` and a copy as `summary.json`
//! (`--smoke`: `smoke-<server>.json`, then checks that every promised figure
//! is there).
//!
//! `cargo xtask bench-table` rewrites the README's Performance table from
//! `summary-py.json` and `summary-rs.json`; `cargo xtask bench-report` writes
//! every figure of summaries side by side (two runs of a server before and
//! after a change, say) with the targets checked.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::server::{self, root, run_cmd, Target};

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

/// `cargo xtask bench`'s arguments: the mode and the server, or why they
/// are refused.
pub(crate) fn parse_args(args: &[String]) -> Result<(Mode, Target), String> {
    check_args(args)?;
    let target = Target::from_args(args)?;
    let mode = match (args.iter().any(|a| a == "--smoke"), args.iter().any(|a| a == "--quick")) {
        (true, true) => return Err("--smoke and --quick exclude each other".into()),
        (true, false) => Mode::Smoke,
        (false, true) => Mode::Quick,
        (false, false) => Mode::Full,
    };
    Ok((mode, target))
}

/// Refuses what `cargo xtask bench` does not know: a typo such as `--qiuck`
/// would otherwise start a full run, which takes the better part of an hour;
/// and a second `--server`, which would otherwise be ignored.
fn check_args(args: &[String]) -> Result<(), String> {
    let mut rest = args.iter();
    let mut servers = 0;
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--quick" | "--smoke" => {}
            "--server" => {
                servers += 1;
                rest.next();
            }
            s if s.starts_with("--server=") => servers += 1,
            other => {
                return Err(format!(
                    "bench: unknown argument {other:?} (give --quick, --smoke, --server py|rs|URI; none for a full run)"
                ))
            }
        }
    }
    if servers > 1 {
        return Err("bench: give --server once".into());
    }
    Ok(())
}

/// Runs the bench; with `strict` (`cargo xtask ci`, or `CI` set), a smoke run
/// may skip only the seed's failover, and installs Agenda when it is not
/// there yet (`.ci/run` provides `node` and `npm`).
pub(crate) fn run(mode: Mode, target: &Target, strict: bool) -> Result<(), String> {
    let profile = if mode == Mode::Smoke {
        debug_lab()?;
        "debug"
    } else {
        crate::cargo(&["build", "--release", "-p", "mongocoord", "-p", "lab"], &[])?;
        "release"
    };
    let venv = server::venv()?;
    let agenda = agenda(mode != Mode::Smoke || strict);
    if strict && agenda.is_none() {
        return Err("under CI the bench needs its Agenda harness: node and npm (see the message above)".into());
    }
    server::remove_stale_data();
    let (server, uri, label) = target.start(&venv)?;
    let bin = crate::bin_dir(profile);
    let stem = if mode == Mode::Smoke { "smoke" } else { "summary" };
    let out = root().join("target").join("bench").join(format!("{stem}-{}.json", target.name()));
    let mut cmd = Command::new(bin.join("lab"));
    // The URI goes in the environment, not the command line, where `ps`
    // would show a password in it to every user of the machine.
    cmd.env("MONGODB_URI", &uri)
        .args(["--db", "mongocoord_bench", "bench", "--out"])
        .arg(&out)
        .arg("--mongocoord")
        .arg(bin.join("mongocoord"))
        .arg("--python")
        .arg(venv.join("bin").join("python"))
        .arg("--seed-script")
        .arg(root().join("lab").join("bench").join("seed_bench.py"))
        .env("MONGOCOORD_BENCH_SERVER", label)
        .env("MONGOCOORD_BENCH_SERVER_NAME", target.name())
        .env("MONGOCOORD_BENCH_COMMIT", commit());
    // Fresh servers of the run's kind: one per Agenda setting, one per idle role.
    cmd.args(target.fresh_server_args(&venv)?);
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
        // On `secantusd-py` every write costs time in proportion to its
        // collection's size, so a full run's 2,000 tasks per queue run would
        // take hours and measure the server: there the queue sections keep
        // `--quick`'s 400 (ours, the raw loop's and Agenda's alike).
        Mode::Full if *target == Target::Py => {
            cmd.args(["--tasks", "400"]);
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
    result?;
    let latest = out.with_file_name(format!("{stem}.json"));
    std::fs::copy(&out, &latest).map_err(|e| format!("{}: {e}", latest.display()))?;
    Ok(())
}

/// `cargo xtask bench-table`: the README's Performance table from the
/// summaries of full runs on each server there is one of (`lab bench-table`).
pub(crate) fn table() -> Result<(), String> {
    debug_lab()?;
    let summaries = full_run_summaries()?;
    run_cmd(
        Command::new(crate::bin_dir("debug").join("lab"))
            .arg("bench-table")
            .arg("--readme")
            .arg(root().join("README.md"))
            .args(&summaries),
    )
}

/// `cargo xtask bench-report [SUMMARY...]`: `target/bench/report.md`, every
/// figure of the summaries side by side with the change from the first, and
/// the targets checked (`lab bench-report`). Without summaries: those of
/// full runs on each server there is one of.
pub(crate) fn report(summaries: &[String]) -> Result<(), String> {
    debug_lab()?;
    let summaries =
        if summaries.is_empty() { full_run_summaries()? } else { summaries.iter().map(PathBuf::from).collect() };
    let out = root().join("target").join("bench").join("report.md");
    run_cmd(
        Command::new(crate::bin_dir("debug").join("lab")).arg("bench-report").arg("--out").arg(&out).args(&summaries),
    )
}

/// The debug `lab`, built as the smoke run (and the tests) build it: with
/// `mongocoord` beside it, so that the features of their dependencies, and
/// so the build, are the same, and a table after a smoke run builds nothing.
fn debug_lab() -> Result<(), String> {
    crate::cargo(&["build", "-p", "lab", "-p", "mongocoord"], &[("RUSTFLAGS", "-Dwarnings")])
}

/// The summaries of the last full run on each server there is one of.
fn full_run_summaries() -> Result<Vec<PathBuf>, String> {
    let dir = root().join("target").join("bench");
    let summaries: Vec<PathBuf> =
        ["py", "rs"].iter().map(|s| dir.join(format!("summary-{s}.json"))).filter(|p| p.exists()).collect();
    if summaries.is_empty() {
        return Err(format!("no {}/summary-py.json or summary-rs.json: run `cargo xtask bench` first", dir.display()));
    }
    Ok(summaries)
}

/// The commit the bench runs, with `+dirty` when the work tree has changes.
fn commit() -> String {
    let git = |args: &[&str]| Command::new("git").args(args).current_dir(root()).output().ok();
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]).filter(|o| o.status.success()) else {
        return "unknown".into();
    };
    let mut c = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    if git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|o| !o.stdout.is_empty()) {
        c.push_str("+dirty");
    }
    c
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
                return Err(
                    "not installed (a smoke run outside CI installs nothing; `cargo xtask bench --quick` does)".into(),
                );
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

#[cfg(test)]
mod tests {
    use super::{parse_args, Mode, Target};

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn bench_arguments_are_checked_before_anything_runs() {
        assert!(matches!(parse_args(&args(&["--smoke", "--server", "rs"])), Ok((Mode::Smoke, Target::Rs))));
        assert!(matches!(parse_args(&args(&["--quick", "--server=py"])), Ok((Mode::Quick, Target::Py))));
        let refused: [&[&str]; 6] = [
            &["--qiuck"],
            &["--smoke", "--quick"],
            &["--server", "py", "--server", "bogus"],
            &["--server=py", "--server", "rs"],
            &["--server", "bogus"],
            &["--server"],
        ];
        for bad in refused {
            assert!(parse_args(&args(bad)).is_err(), "{bad:?}");
        }
    }
}
