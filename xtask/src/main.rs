//! Project automation, in the rust-analyzer style: one small binary, std only.
//!
//! ```text
//! cargo xtask ci      fmt, clippy, docs, no-default-features builds, the whole test
//!                     suite against a real server (the README's test command)
//! cargo xtask test    the test suite only (CI semantics: a Mongo test never skips)
//! cargo xtask demo    runs the demo (`mongocoord demo`)
//! cargo xtask chaos [--minutes N] [--seed S]
//!                     worker processes killed, paused and restarted, the server
//!                     killed and restarted; a history checker; target/chaos/summary.json
//! cargo xtask bench [--quick]
//!                     release build; a fresh SecantusDB (or MONGODB_URI) and the
//!                     Python `mongoelector` in a venv under target/bench; writes
//!                     target/bench/summary.json
//! ```
//!
//! The test harness provisions the MongoDB server itself (`MONGODB_URI`, else a
//! testcontainers `mongo` where Docker runs, else a pinned SecantusDB it installs
//! into `target/` and stops when the tests exit), so `xtask` needs no server logic.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::{Command, ExitCode};
use std::time::Instant;

mod bench;
mod tidy;

/// The product crates whose core must build without the `mongodb` driver.
const PRODUCT_CRATES: [&str; 3] = ["mongolock", "mongoelector", "mongoagent"];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("test") => test(&args[1..]),
        Some("bench") => bench::run(args.iter().any(|a| a == "--quick")),
        Some("chaos") => bench::chaos(&args[1..]),
        Some("demo") => {
            cargo(&[&["run", "--release", "-p", "mongocoord", "--", "demo"], &str_refs(&args[1..])[..]].concat(), &[])
        }
        _ => {
            eprintln!("usage: cargo xtask <ci|test|demo|bench> [args]");
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

fn str_refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

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

fn ci() -> Result<(), String> {
    let started = Instant::now();
    cargo(&["fmt", "--all", "--", "--check"], &[])?;
    let deny = [("RUSTFLAGS", "-Dwarnings"), ("RUSTDOCFLAGS", "-Dwarnings")];
    cargo(&["clippy", "--workspace", "--all-targets", "--all-features", "--", "-D", "warnings"], &deny)?;
    // The core of every product crate must build without the MongoDB driver.
    let mut no_default = vec!["clippy", "--no-default-features"];
    for c in PRODUCT_CRATES {
        no_default.extend(["-p", c]);
    }
    no_default.extend(["--", "-D", "warnings"]);
    cargo(&no_default, &deny)?;
    cargo(&["doc", "--workspace", "--no-deps", "--all-features"], &deny)?;
    test(&[])?;
    // A short chaos run: real processes, SIGKILL, SIGSTOP, server restarts.
    bench::chaos(&["--minutes".into(), "0.75".into()])?;
    eprintln!("xtask ci: all green in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn test(extra: &[String]) -> Result<(), String> {
    // CI semantics: a test that needs a MongoDB server fails instead of skipping.
    let mut args = vec!["test", "--workspace", "--all-features"];
    args.extend(str_refs(extra));
    cargo(&args, &[("CI", "true"), ("RUSTFLAGS", "-Dwarnings")])
}
