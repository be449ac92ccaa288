//! Project automation, in the rust-analyzer style: one small binary, std only,
//! one file per subcommand.
//!
//! ```text
//! cargo xtask ci      fmt, clippy, docs, no-default-features builds, the whole test
//!                     suite against a real server (and headless Chromium, installed
//!                     from Debian's packages when absent), `test-rs`, the bench's
//!                     smoke run, `upstream`, a short chaos run (the README's test
//!                     command; .ci/run calls it)
//! cargo xtask test [ARGS]
//!                     the test suite only (CI semantics: a Mongo test never skips)
//! cargo xtask test-rs
//!                     the conformance suite, then the other crates' Mongo tests, on a
//!                     fresh secantusd-rs (SecantusDB's Rust server, built once into
//!                     target/; what it lacks declared: docs/test-servers.md); `ci`
//!                     runs it after the tests
//! cargo xtask demo [ARGS]
//!                     runs the demo (`mongocoord demo`)
//! cargo xtask chaos [--minutes N] [--seed S]
//!                     `lab chaos`: worker processes killed, paused and restarted, the
//!                     server killed and restarted; a history checker; target/chaos/summary.json
//! cargo xtask upstream
//!                     the Python mongoelector's own tests (0.5.0 and 1.0.2, unedited)
//!                     against our package in `python/` (the Rust core under PyO3),
//!                     then our own tests of it (`python/tests/test_*.py`)
//! cargo xtask bench [--quick | --smoke] [--server py|rs|URI]
//!                     `lab bench` on release builds, a fresh server (py: SecantusDB's
//!                     Python server, the default; rs: its Rust server, built once into
//!                     target/; or a URI, the default when MONGODB_URI is set) and the
//!                     Python `mongoelector` in a venv under target/bench; writes
//!                     target/bench/summary-SERVER.json. --smoke: every section at a
//!                     tiny size on the debug build, every promised figure checked
//!                     (target/bench/smoke-SERVER.json); `ci` runs it
//! cargo xtask bench-table
//!                     rewrites the README's Performance table from the summaries
//! cargo xtask bench-report [SUMMARY...]
//!                     target/bench/report.md: the summaries' figures side by side,
//!                     each compared to the first, and the targets checked
//! ```
//!
//! The test harness provisions the MongoDB server itself (`MONGODB_URI`, else a
//! testcontainers `mongo` where Docker runs, else a pinned SecantusDB it installs
//! into `target/` and stops when the tests exit).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::OnceLock;
use std::time::Instant;

mod bench;
mod browser;
mod chaos;
mod ci;
mod server;
mod tidy;
mod upstream;

const USAGE: &str =
    "usage: cargo xtask <ci | test [ARGS] | test-rs | demo [ARGS] | chaos [--minutes N] [--seed S] | bench [--quick | --smoke] [--server py|rs|URI] | bench-table | bench-report [SUMMARY...] | upstream>";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci::ci(),
        Some("test") => ci::test(&args[1..]),
        Some("test-rs") => ci::on_rs(),
        Some("bench") if args[1..].iter().any(|a| a == "--help" || a == "-h") => {
            eprintln!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some("bench") => match bench::parse_args(&args[1..]) {
            // Arguments refused are a usage error (2), as clap's are, told
            // apart from a run that failed (1).
            Err(e) => return usage_error(&e),
            Ok((mode, target)) => {
                bench::run(mode, &target, mode == bench::Mode::Smoke && std::env::var_os("CI").is_some())
            }
        },
        Some("bench-table") if args.len() > 1 => {
            return usage_error("bench-table takes no arguments: it reads target/bench/summary-{py,rs}.json")
        }
        Some("bench-table") => bench::table(),
        Some("bench-report") => bench::report(&args[1..]),
        Some("chaos") => chaos::run(&args[1..]),
        Some("upstream") => upstream::run(),
        Some("demo") => {
            cargo(&[&["run", "--release", "-p", "mongocoord", "--", "demo"], &str_refs(&args[1..])[..]].concat(), &[])
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Says what was refused, and the usage; exit status 2.
fn usage_error(what: &str) -> ExitCode {
    eprintln!("xtask: {what}\n{USAGE}");
    ExitCode::from(2)
}

fn str_refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Runs cargo with `args` and extra environment; an error unless it succeeds.
pub(crate) fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let started = Instant::now();
    eprintln!("$ cargo {}", args.join(" "));
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args);
    for (k, v) in env {
        add_flags(&mut cmd, k, v);
    }
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    eprintln!("  ({:.1} s)", started.elapsed().as_secs_f64());
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

/// Sets `key` to `value` for `cmd`, except that flags are added to the
/// user's own (`RUSTFLAGS=-Ctarget-cpu=native cargo xtask ci` keeps them),
/// and go into `CARGO_ENCODED_RUSTFLAGS` where the user set that (even to
/// nothing), since cargo then ignores `RUSTFLAGS`. Flags from cargo's config
/// files (`build.rustflags`) give way to `RUSTFLAGS`, as cargo has them do.
pub(crate) fn add_flags(cmd: &mut Command, key: &str, value: &str) {
    let (key, value) = flags_for(key, value, |name| std::env::var(name).ok());
    cmd.env(key, value);
}

/// The variable and value [`add_flags`] sets.
fn flags_for(key: &str, value: &str, var: impl Fn(&str) -> Option<String>) -> (String, String) {
    let has = |k: &str| var(k).filter(|v| !v.trim().is_empty());
    match key {
        "RUSTFLAGS" => match (var("CARGO_ENCODED_RUSTFLAGS"), has("RUSTFLAGS")) {
            (Some(enc), _) => {
                let ours = value.split_whitespace().collect::<Vec<_>>().join("\x1f");
                let all = if enc.is_empty() { ours } else { format!("{enc}\x1f{ours}") };
                ("CARGO_ENCODED_RUSTFLAGS".into(), all)
            }
            (None, Some(user)) => (key.into(), format!("{user} {value}")),
            (None, None) => (key.into(), value.into()),
        },
        "RUSTDOCFLAGS" => match has(key) {
            Some(user) => (key.into(), format!("{user} {value}")),
            None => (key.into(), value.into()),
        },
        _ => (key.into(), value.into()),
    }
}

/// Where cargo puts what it builds, as `cargo metadata` says (so
/// `CARGO_TARGET_DIR` and `build.target-dir` are followed), else `target/`.
/// What xtask writes itself (summaries, servers, logs) stays in `target/`.
pub(crate) fn build_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .current_dir(server::root())
            .output();
        out.ok()
            .filter(|o| o.status.success())
            .and_then(|o| target_directory(&String::from_utf8_lossy(&o.stdout)))
            .unwrap_or_else(|| server::root().join("target"))
    })
    .clone()
}

/// Where cargo puts the binaries of `profile` ("debug" or "release"): below
/// the target triple's folder when `CARGO_BUILD_TARGET` names one, as cargo
/// does for a cross build.
pub(crate) fn bin_dir(profile: &str) -> PathBuf {
    bin_dir_in(&build_dir(), std::env::var("CARGO_BUILD_TARGET").ok().as_deref(), profile)
}

fn bin_dir_in(build: &std::path::Path, triple: Option<&str>, profile: &str) -> PathBuf {
    match triple.map(str::trim).filter(|t| !t.is_empty()) {
        Some(t) => build.join(t).join(profile),
        None => build.join(profile),
    }
}

/// The `target_directory` of `cargo metadata`'s JSON (std only: no parser).
fn target_directory(json: &str) -> Option<PathBuf> {
    let rest = &json[json.find("\"target_directory\":\"")? + "\"target_directory\":\"".len()..];
    let (mut out, mut chars) = (String::new(), rest.chars());
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(PathBuf::from(out)),
            '\\' => out.push(chars.next()?),
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(set: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| set.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn our_flags_are_added_to_the_users() {
        let f = |set: &[(&str, &str)], k: &str| flags_for(k, "-Dwarnings", vars(set));
        assert_eq!(f(&[], "RUSTFLAGS"), ("RUSTFLAGS".into(), "-Dwarnings".into()));
        assert_eq!(
            f(&[("RUSTFLAGS", "-Ctarget-cpu=native")], "RUSTFLAGS"),
            ("RUSTFLAGS".into(), "-Ctarget-cpu=native -Dwarnings".into())
        );
        assert_eq!(
            f(&[("CARGO_ENCODED_RUSTFLAGS", "-C\x1fopt-level=1")], "RUSTFLAGS"),
            ("CARGO_ENCODED_RUSTFLAGS".into(), "-C\x1fopt-level=1\x1f-Dwarnings".into())
        );
        assert_eq!(
            f(&[("CARGO_ENCODED_RUSTFLAGS", "")], "RUSTFLAGS"),
            ("CARGO_ENCODED_RUSTFLAGS".into(), "-Dwarnings".into()),
            "set to nothing, it still wins over RUSTFLAGS"
        );
        assert_eq!(
            f(&[("RUSTDOCFLAGS", "--cfg x")], "RUSTDOCFLAGS"),
            ("RUSTDOCFLAGS".into(), "--cfg x -Dwarnings".into())
        );
        assert_eq!(f(&[("CI", "1")], "CI"), ("CI".into(), "-Dwarnings".into()));
    }

    #[test]
    fn binaries_are_below_the_target_triple_when_one_is_set() {
        let b = std::path::Path::new("/t");
        assert_eq!(bin_dir_in(b, None, "debug"), PathBuf::from("/t/debug"));
        assert_eq!(bin_dir_in(b, Some(""), "debug"), PathBuf::from("/t/debug"));
        let triple = Some("x86_64-unknown-linux-gnu");
        assert_eq!(bin_dir_in(b, triple, "release"), PathBuf::from("/t/x86_64-unknown-linux-gnu/release"));
    }

    #[test]
    fn the_target_directory_is_read_from_cargo_metadata() {
        let json = r#"{"packages":[],"target_directory":"/tmp/a \"b\"\\c","version":1}"#;
        assert_eq!(target_directory(json), Some(PathBuf::from("/tmp/a \"b\"\\c")));
        assert_eq!(target_directory("{}"), None);
    }
}
