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

use std::process::{Command, ExitCode};
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
        cmd.env(k, v);
    }
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    eprintln!("  ({:.1} s)", started.elapsed().as_secs_f64());
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}
