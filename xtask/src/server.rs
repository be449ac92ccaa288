//! The Python side of the lab: a venv under `target/bench` with the pinned
//! SecantusDB and the Python `mongoelector`, and a fresh server on a free port.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The pinned versions: the test server, and the Python `mongoelector`.
pub(crate) const SECANTUS: &str = "SecantusDB==0.7.0b3";
const MONGOELECTOR: &str = "mongoelector==1.0.2";

/// The workspace root.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The venv, installed on first use.
pub(crate) fn venv() -> Result<PathBuf, String> {
    let dir = root().join("target").join("bench").join("venv");
    let py = dir.join("bin").join("python");
    if !dir.join("bin").join("secantusd-py").exists() {
        eprintln!("installing {SECANTUS} and {MONGOELECTOR} into {}", dir.display());
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        run_cmd(Command::new(python).args(["-m", "venv"]).arg(&dir))?;
        run_cmd(Command::new(&py).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            SECANTUS,
            MONGOELECTOR,
        ]))?;
    }
    Ok(dir)
}

/// Runs a command to completion; an error unless it succeeds.
pub(crate) fn run_cmd(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({status})"))
    }
}

/// A server that is stopped when dropped.
pub(crate) struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a fresh in-memory SecantusDB; returns it and its URI.
pub(crate) fn start(venv: &Path) -> Result<(Server, String), String> {
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
