//! `cargo xtask upstream`: the Python `mongoelector`'s own tests, unedited,
//! against our package (`python/`, the Rust core under PyO3).
//!
//! 1. A fresh venv under `target/upstream/venv` with maturin, pymongo, pytest
//!    and the pinned SecantusDB (never PyPI's `mongoelector`).
//! 2. The wheel, built by maturin in the workspace's target dir (a debug
//!    build), installed into it.
//! 3. The sdists of `mongoelector` 0.5.0 and 1.0.2 from PyPI; only their
//!    `tests/` are copied to a scratch dir each, with our
//!    `python/tests/upstream_conftest.py` as `conftest.py` (the default
//!    `MongoClient()` on the test server, a fresh database per test, the `db`
//!    fixture, and a check that our native module is the one imported).
//! 4. A fresh SecantusDB (or `MONGODB_URI`), then pytest on each: 10 + 19
//!    tests, no skip, no xfail.
//! 5. Then our own tests of the package, `python/tests/test_*.py` (threads
//!    and the GIL, Ctrl-C, fork, interpreter exit, callbacks, and exclusion
//!    against the CLI's `lock`), in the same venv on the same server, with the
//!    `mongocoord` binary built as the bench and chaos runs build it; with
//!    `CI` set, so a test that lacks its server or binary fails. None may
//!    fail or skip.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::server::{self, root, run_cmd};

/// The upstream releases whose tests we run, and how many tests each has.
const RELEASES: [(&str, usize); 2] = [("0.5.0", 10), ("1.0.2", 19)];

pub(crate) fn run() -> Result<(), String> {
    let work = root().join("target").join("upstream");
    let venv = work.join("venv");
    let py = venv.join("bin").join("python");
    if venv.exists() {
        std::fs::remove_dir_all(&venv).map_err(|e| format!("{}: {e}", venv.display()))?;
    }
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run_cmd(Command::new(python).args(["-m", "venv"]).arg(&venv))?;
    pip(&py, &["install", "maturin>=1.5,<2", "pymongo", "pytest", server::secantus().as_str()])?;

    let wheels = work.join("wheels");
    let _ = std::fs::remove_dir_all(&wheels);
    let target_dir = crate::build_dir();
    run_cmd(
        Command::new(venv.join("bin").join("maturin"))
            .args(["build", "--manifest-path"])
            .arg(root().join("python").join("Cargo.toml"))
            .arg("--out")
            .arg(&wheels)
            .arg("--interpreter")
            .arg(&py)
            .env("CARGO_TARGET_DIR", &target_dir),
    )?;
    let wheel = only_file(&wheels, ".whl")?;
    run_cmd(Command::new(&py).args(["-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall"]).arg(&wheel))?;
    // For our own tests: the CLI, built as `bench --smoke` and `chaos` build
    // it (in CI, that build is already there).
    crate::cargo(&["build", "-p", "lab", "-p", "mongocoord"], &[("RUSTFLAGS", "-Dwarnings")])?;
    let mongocoord = crate::bin_dir("debug").join("mongocoord");

    let (server, uri) = match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => (None, uri),
        _ => {
            let (s, u) = server::start(&venv)?;
            (Some(s), u)
        }
    };
    let mut failures = Vec::new();
    for (version, expected) in RELEASES {
        let dir = scratch(&py, &work, version)?;
        eprintln!("upstream mongoelector {version}: {expected} tests in {}", dir.display());
        let report = pytest(&py, &dir.join("tests"), &dir, &[("MONGOELECTOR_TEST_URI", OsStr::new(&uri))])?;
        eprintln!("upstream mongoelector {version}: {}", report.summary(expected));
        if !report.ok || report.tests != expected || report.passed() != expected {
            failures.push(format!("mongoelector {version}: {} of {expected} passed", report.passed()));
        }
    }

    // The control: upstream 1.0.2's own code on the same harness and server.
    // Its result is reported, not required: it says whether a failure above
    // is ours or the harness's.
    match control(&work, &uri) {
        Ok(summary) => eprintln!("control, PyPI's mongoelector 1.0.2 on its own tests: {summary}"),
        Err(e) => eprintln!("control, PyPI's mongoelector 1.0.2: could not run: {e}"),
    }

    let dir = work.join("ours");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    eprintln!("our tests of the package (python/tests)");
    let report = pytest(
        &py,
        &root().join("python").join("tests"),
        &dir,
        &[
            ("MONGOELECTOR_TEST_URI", OsStr::new(&uri)),
            ("MONGOCOORD_BIN", mongocoord.as_os_str()),
            ("CI", OsStr::new("true")),
        ],
    )?;
    eprintln!("our tests of the package: {}", report.summary(report.tests));
    if !report.ok || report.tests == 0 || report.passed() != report.tests {
        failures.push(format!("python/tests: {} of {} passed", report.passed(), report.tests));
    }
    drop(server);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// Upstream 1.0.2's own package from PyPI, in a venv of its own, on its own
/// tests with our conftest in control mode; returns pytest's summary.
fn control(work: &Path, uri: &str) -> Result<String, String> {
    let venv = work.join("control-venv");
    let py = venv.join("bin").join("python");
    if !py.exists() {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        run_cmd(Command::new(python).args(["-m", "venv"]).arg(&venv))?;
        pip(&py, &["install", "mongoelector==1.0.2", "pymongo", "pytest"])?;
    }
    let (version, expected) = RELEASES[1];
    let dir = scratch(&py, &work.join("control"), version)?;
    let env = [("MONGOELECTOR_TEST_URI", OsStr::new(uri)), ("MONGOELECTOR_CONTROL", OsStr::new("1"))];
    Ok(pytest(&py, &dir.join("tests"), &dir, &env)?.summary(expected))
}

/// What a pytest run reported.
struct Report {
    /// pytest exited 0.
    ok: bool,
    tests: usize,
    failed: usize,
    errors: usize,
    skipped: usize,
}

impl Report {
    fn passed(&self) -> usize {
        self.tests.saturating_sub(self.failed + self.errors + self.skipped)
    }

    fn summary(&self, expected: usize) -> String {
        format!(
            "{} of {expected} passed ({} run, {} failed, {} errors, {} skipped)",
            self.passed(),
            self.tests,
            self.failed,
            self.errors,
            self.skipped
        )
    }
}

/// pytest on `tests`, run from `dir` (never from `python/`, where `import
/// mongoelector` would find the sources instead of the installed wheel), its
/// JUnit report and temporary files in `dir`, nothing written beside the
/// tests, without `MONGODB_URI` (the tests get the server from `env`).
fn pytest(py: &Path, tests: &Path, dir: &Path, env: &[(&str, &OsStr)]) -> Result<Report, String> {
    let xml = dir.join("report.xml");
    let _ = std::fs::remove_file(&xml);
    let status = Command::new(py)
        .args(["-m", "pytest", "-v", "-p", "no:cacheprovider", "--rootdir"])
        .arg(tests.parent().unwrap_or(tests))
        .arg(format!("--basetemp={}", dir.join("tmp").display()))
        .arg(format!("--junitxml={}", xml.display()))
        .arg(tests)
        .current_dir(dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("MONGODB_URI")
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("cannot run pytest: {e}"))?;
    let report = std::fs::read_to_string(&xml).unwrap_or_default();
    let [tests, failed, errors, skipped] = ["tests", "failures", "errors", "skipped"].map(|a| count(&report, a));
    Ok(Report { ok: status.success(), tests, failed, errors, skipped })
}

/// The number in attribute `name="N"` of the first `<testsuite` of a JUnit
/// report (0 when absent).
fn count(report: &str, name: &str) -> usize {
    let Some(suite) = report.find("<testsuite ") else { return 0 };
    let needle = format!(" {name}=\"");
    report[suite..]
        .find(&needle)
        .map(|i| &report[suite + i + needle.len()..])
        .and_then(|rest| rest.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// `python -m pip ARGS` quietly.
fn pip(py: &Path, args: &[&str]) -> Result<(), String> {
    run_cmd(Command::new(py).args(["-m", "pip", "--quiet", "--disable-pip-version-check"]).args(args))
}

/// The one file in `dir` whose name ends with `suffix`.
fn only_file(dir: &Path, suffix: &str) -> Result<PathBuf, String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.to_string_lossy().ends_with(suffix) {
            found.push(path);
        }
    }
    match <[PathBuf; 1]>::try_from(found) {
        Ok([one]) => Ok(one),
        Err(found) => Err(format!("expected one {suffix} in {}, found {found:?}", dir.display())),
    }
}

/// Downloads the sdist of `mongoelector==version`, unpacks it, and makes a
/// scratch dir holding only its `tests/` and our `conftest.py`.
fn scratch(py: &Path, work: &Path, version: &str) -> Result<PathBuf, String> {
    let sdists = work.join("sdists").join(version);
    let _ = std::fs::remove_dir_all(&sdists);
    std::fs::create_dir_all(&sdists).map_err(|e| e.to_string())?;
    let spec = format!("mongoelector=={version}");
    run_cmd(
        Command::new(py)
            .args(["-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", &spec, "-d"])
            .arg(&sdists),
    )?;
    let sdist = only_file(&sdists, ".tar.gz")?;
    run_cmd(Command::new("tar").arg("-xzf").arg(&sdist).arg("-C").arg(&sdists))?;
    let unpacked = sdists.join(format!("mongoelector-{version}"));
    let dir = work.join(format!("run-{version}"));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&unpacked.join("tests"), &dir.join("tests"))?;
    std::fs::copy(root().join("python").join("tests").join("upstream_conftest.py"), dir.join("conftest.py"))
        .map_err(|e| format!("conftest.py: {e}"))?;
    Ok(dir)
}

/// Copies the files of `from` (recursively) to `to`.
fn copy_dir(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(entry.file_name()))?;
        } else {
            std::fs::copy(&path, to.join(entry.file_name())).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}
