//! `cargo xtask bench`: provisions what the benchmark needs and runs
//! `mongocoord bench` in a release build.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The pinned versions: the test server, and the seed's Python implementation.
const SECANTUS: &str = "SecantusDB==0.7.0b3";
const SEED: &str = "mongoelector==1.0.2";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub(crate) fn venv() -> Result<PathBuf, String> {
    let dir = root().join("target").join("bench").join("venv");
    let py = dir.join("bin").join("python");
    if !dir.join("bin").join("secantusd-py").exists() {
        eprintln!("installing {SECANTUS} and {SEED} into {}", dir.display());
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        run_cmd(Command::new(python).args(["-m", "venv"]).arg(&dir))?;
        run_cmd(Command::new(&py).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            SECANTUS,
            SEED,
        ]))?;
    }
    Ok(dir)
}

fn run_cmd(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({status})"))
    }
}

/// Stops the server when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server(venv: &Path) -> Result<(Server, String), String> {
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
    let child = Command::new(venv.join("bin").join("secantusd-py"))
        .args(["--port", &port.to_string(), "--storage-path", ":memory:", "--log-level", "WARNING"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start SecantusDB: {e}"))?;
    let server = Server(child);
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > Duration::from_secs(60) {
            return Err("SecantusDB did not start within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // retryWrites=false: with retryable writes, SecantusDB slows down after
    // ~10,000 writes (see shared/test-server.md); a fresh server per run as well.
    let uri =
        format!("mongodb://127.0.0.1:{port}/?directConnection=true&retryWrites=false&serverSelectionTimeoutMS=5000");
    Ok((server, uri))
}

pub(crate) fn run(quick: bool) -> Result<(), String> {
    crate::cargo(&["build", "--release", "-p", "mongocoord"], &[])?;
    let venv = venv()?;
    let (server, uri, label) = match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => (None, uri, "MONGODB_URI".to_owned()),
        _ => {
            let (s, u) = start_server(&venv)?;
            (Some(s), u, "SecantusDB 0.7.0b3 (fresh, in memory, retryWrites=false)".to_owned())
        }
    };
    let bin = root().join("target").join("release").join("mongocoord");
    let out = root().join("target").join("bench").join("summary.json");
    let mut cmd = Command::new(bin);
    cmd.args(["--uri", &uri, "--db", "mongocoord_bench", "bench", "--out"])
        .arg(&out)
        .arg("--python")
        .arg(venv.join("bin").join("python"))
        .arg("--seed-script")
        .arg(root().join("xtask").join("bench").join("seed_bench.py"))
        .env("MONGOCOORD_BENCH_SERVER", label);
    if quick {
        cmd.arg("--quick");
    }
    let result = run_cmd(&mut cmd);
    drop(server);
    result
}

/// `cargo xtask chaos [--minutes N] [--seed S]`: a debug build of `mongocoord`,
/// a SecantusDB it may kill and restart (on-disk storage), or `MONGODB_URI`.
pub(crate) fn chaos(args: &[String]) -> Result<(), String> {
    // The same flags as the test build, so inside `cargo xtask ci` nothing is rebuilt.
    crate::cargo(&["build", "-p", "mongocoord"], &[("RUSTFLAGS", "-Dwarnings")])?;
    let bin = root().join("target").join("debug").join("mongocoord");
    let mut cmd = Command::new(bin);
    match std::env::var("MONGODB_URI") {
        Ok(uri) if !uri.is_empty() => {
            cmd.args(["--uri", &uri]);
        }
        _ => {
            let venv = venv()?;
            cmd.arg("--db").arg("mongocoord_chaos");
            cmd.arg("chaos").arg("--server-bin").arg(venv.join("bin").join("secantusd-py"));
            cmd.arg("--dir").arg(root().join("target").join("chaos"));
            cmd.args(args);
            return run_cmd(&mut cmd);
        }
    }
    cmd.arg("chaos").arg("--dir").arg(root().join("target").join("chaos")).args(args);
    run_cmd(&mut cmd)
}
