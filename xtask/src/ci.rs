//! `cargo xtask ci` (the README's test command) and `cargo xtask test`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use crate::{cargo, str_refs};

/// The product crates whose core must build without the `mongodb` driver.
pub(crate) const PRODUCT_CRATES: [&str; 3] = ["mongolock", "mongoelector", "mongoagent"];

/// fmt, clippy, docs, builds without default features, every test against a
/// real server, the Mongo tests again on `secantusd-rs` ([`on_rs`]), the
/// bench's smoke run, upstream mongoelector's own tests
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
    // The conformance suite, then the other Mongo tests, on a second server.
    on_rs()?;
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
    cargo(&args, &TEST_FLAGS)
}

/// The test flags of [`test()`]: the same build, so nothing is compiled again.
const TEST_FLAGS: [(&str, &str); 2] = [("CI", "true"), ("RUSTFLAGS", "-Dwarnings")];

/// What `secantusd-rs` is known to lack (docs/test-servers.md): the tests
/// that need it skip there, naming the servers they run on.
const RS_LACKS: &str = "failpoints,idle-cursors,unique-key-release,streams-past-open-transactions";

/// What runs on `secantusd-rs`, in this order: (package, test target as
/// `kind:name`, name filter). The conformance suite (store-mongo's
/// integration tests) first; the other crates' Mongo tests only once it
/// passed (mongocoord's unit tests: the dashboard's).
const ON_RS: [(&str, &str, Option<&str>); 6] = [
    ("store-mongo", "test:it", None),
    ("mongolock", "test:it", Some("mongo")),
    ("mongoelector", "test:it", Some("mongo")),
    ("mongoagent", "test:it", Some("mongo")),
    ("mongocoord", "bin:mongocoord", Some("mongo")),
    ("mongocoord", "test:it", None),
];

/// The Mongo tests on SecantusDB's Rust server (`secantusd-rs`, built once
/// into `target/`: 13 to 20 minutes on a clean clone), a fresh one in a fresh
/// directory, with the test binaries [`test()`] built: the conformance suite,
/// then (if it passed) mongolock's, mongoelector's, mongoagent's and
/// mongocoord's. Each step says which server ran it, and how long it took.
pub(crate) fn on_rs() -> Result<(), String> {
    let started = Instant::now();
    crate::server::rs_binary()?;
    eprintln!("  (secantusd-rs ready after {:.0} s)", started.elapsed().as_secs_f64());
    let binaries = test_binaries()?;
    let (server, uri) = crate::server::start_rs()?;
    // As the harness's own servers: poll the server's state (test-server.md).
    let uri = format!("{uri}&serverMonitoringMode=poll");
    let version = crate::server::SECANTUS_RS;
    let mut result = Ok(());
    for (i, (package, target, filter)) in ON_RS.iter().enumerate() {
        let step = match i {
            0 => format!("conformance on secantusd-rs {version}"),
            _ => format!("{package} {target} Mongo tests on secantusd-rs {version}"),
        };
        let Some((exe, dir)) =
            binaries.iter().find(|b| b.package == *package && b.target == *target).map(|b| (&b.exe, &b.dir))
        else {
            result = Err(format!("{step}: no test binary {package}/{target} in cargo's list"));
            break;
        };
        eprintln!("== {step} (MONGODB_LACKS={RS_LACKS}) ==");
        let step_started = Instant::now();
        let mut cmd = Command::new(exe);
        cmd.args(filter.iter()).current_dir(dir).env("CARGO_MANIFEST_DIR", dir);
        cmd.env("MONGODB_URI", &uri).env("MONGODB_LACKS", RS_LACKS).env("CI", "true");
        let status = cmd.status().map_err(|e| format!("{step}: cannot run {}: {e}", exe.display()))?;
        eprintln!("  ({step}: {:.1} s)", step_started.elapsed().as_secs_f64());
        if !status.success() {
            result = Err(format!("{step} failed ({status})"));
            break;
        }
    }
    drop(server);
    eprintln!("  (on secantusd-rs: {:.0} s in all)", started.elapsed().as_secs_f64());
    result
}

/// A test executable cargo built.
#[derive(Debug)]
struct TestBinary {
    package: String,
    /// `kind:name`, as `test:it` or `bin:mongocoord`.
    target: String,
    exe: PathBuf,
    dir: PathBuf,
}

/// The test executables of the workspace, as [`test()`] builds them (built
/// already in `cargo xtask ci`: cargo only lists them), read from cargo's
/// JSON messages.
fn test_binaries() -> Result<Vec<TestBinary>, String> {
    let args = ["test", "--workspace", "--all-features", "--tests", "--no-run", "--message-format=json"];
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args);
    for (k, v) in TEST_FLAGS {
        crate::add_flags(&mut cmd, k, v);
    }
    let out = cmd.output().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("`cargo {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().filter_map(test_binary).collect())
}

/// One compiler-artifact message of a test executable, read without a JSON
/// parser (xtask keeps to std): cargo writes each message on one line, its
/// keys in a fixed order, and our paths hold no quotes.
fn test_binary(line: &str) -> Option<TestBinary> {
    let string = |from: &str, key: &str| -> Option<String> {
        let start = from.find(&format!("\"{key}\":\""))? + key.len() + 4;
        Some(from[start..].split('"').next()?.to_owned())
    };
    if !line.contains("\"reason\":\"compiler-artifact\"") {
        return None;
    }
    let target = &line[line.find("\"target\":{")?..];
    let kind = target.strip_prefix("\"target\":{\"kind\":[\"")?.split('"').next()?;
    let profile = &line[line.find("\"profile\":{")?..];
    if !profile[..profile.find('}')?].contains("\"test\":true") {
        return None;
    }
    let manifest = PathBuf::from(string(line, "manifest_path")?);
    let dir = manifest.parent()?.to_path_buf();
    Some(TestBinary {
        package: dir.file_name()?.to_string_lossy().into_owned(),
        target: format!("{kind}:{}", string(target, "name")?),
        exe: PathBuf::from(string(line, "executable")?),
        dir,
    })
}

#[cfg(test)]
mod tests {
    use super::test_binary;

    #[test]
    fn test_binaries_are_read_from_cargo_messages() {
        let it = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/store-mongo#0.1.0","manifest_path":"/w/store-mongo/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"it","src_path":"/w/store-mongo/tests/it/main.rs","test":true},"profile":{"opt_level":"0","test":true},"features":["testing"],"filenames":["/w/target/debug/deps/it-1"],"executable":"/w/target/debug/deps/it-1","fresh":true}"#;
        let b = test_binary(it).unwrap();
        assert_eq!((b.package.as_str(), b.target.as_str()), ("store-mongo", "test:it"));
        assert_eq!(b.exe.to_str(), Some("/w/target/debug/deps/it-1"));
        assert_eq!(b.dir.to_str(), Some("/w/store-mongo"));
        // The binary itself, built for the tests to run: not a test executable.
        let bin =
            it.replace(r#""profile":{"opt_level":"0","test":true}"#, r#""profile":{"opt_level":"0","test":false}"#);
        assert!(test_binary(&bin).is_none());
        let unit =
            it.replace(r#""kind":["test"]"#, r#""kind":["bin"]"#).replace(r#""name":"it""#, r#""name":"mongocoord""#);
        assert_eq!(test_binary(&unit).unwrap().target, "bin:mongocoord");
        assert!(test_binary(r#"{"reason":"build-finished","success":true}"#).is_none());
    }
}
