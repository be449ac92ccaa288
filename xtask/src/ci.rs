//! `cargo xtask ci` (the README's test command) and `cargo xtask test`.

use std::time::Instant;

use crate::{cargo, str_refs};

/// The product crates whose core must build without the `mongodb` driver.
pub(crate) const PRODUCT_CRATES: [&str; 3] = ["mongolock", "mongoelector", "mongoagent"];

/// fmt, clippy, docs, builds without default features, every test against a
/// real server, the bench's smoke run, upstream mongoelector's own tests
/// against the Python package, and a short chaos run.
pub(crate) fn ci() -> Result<(), String> {
    let started = Instant::now();
    cargo(&["fmt", "--all", "--", "--check"], &[])?;
    // The Python package is not a workspace member (see the root Cargo.toml).
    let python_manifest = crate::server::root().join("python").join("Cargo.toml");
    cargo(&["fmt", "--manifest-path", &python_manifest.to_string_lossy(), "--", "--check"], &[])?;
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
    // The dashboard's browser test fails under CI without the browser.
    crate::browser::ensure()?;
    test(&[])?;
    // Every section of the bench at a tiny size, every figure it promises
    // checked (no thresholds), on the debug build the tests just made.
    let target = crate::server::Target::from_args(&[])?;
    crate::bench::run(crate::bench::Mode::Smoke, &target, true)?;
    // Upstream's 29 tests passed three runs in a row before this was added.
    crate::upstream::run()?;
    // A short chaos run: real processes, SIGKILL, SIGSTOP, server restarts.
    crate::chaos::run(&["--minutes".into(), "0.75".into()])?;
    eprintln!("xtask ci: all green in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The test suite with CI semantics: a test that needs a MongoDB server fails
/// instead of skipping.
pub(crate) fn test(extra: &[String]) -> Result<(), String> {
    let mut args = vec!["test", "--workspace", "--all-features"];
    args.extend(str_refs(extra));
    cargo(&args, &[("CI", "true"), ("RUSTFLAGS", "-Dwarnings")])
}
