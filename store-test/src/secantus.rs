//! The pinned SecantusDB (PyPI `SecantusDB`): the server the Mongo harness
//! starts when it finds none ([`crate::mongo`]), installed into a venv under
//! `target/` on first use.
//!
//! The pin is the one of the whole workspace: `store-test/SECANTUS_VERSION`,
//! which `xtask` (std only, no dependency on this crate) reads with
//! `include_str!` too, for the lab's venv.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::machine::{free_port, target_dir, wait_for_port};

/// The SecantusDB release the tests are pinned to (`0.7.0b3`).
pub fn version() -> &'static str {
    include_str!("../SECANTUS_VERSION").trim()
}

/// Where the pinned SecantusDB is installed.
pub fn venv() -> PathBuf {
    target_dir().join("secantus").join(format!("venv-{}", version()))
}

/// Installs the pinned SecantusDB into [`venv`] unless it is there.
/// Safe to call from several processes at once.
pub fn install() -> Result<PathBuf, String> {
    let venv = venv();
    let bin = venv.join("bin").join("secantusd-py");
    if bin.exists() {
        return Ok(bin);
    }
    let parent = venv.parent().ok_or("bad venv path")?;
    std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    let lock = parent.join("install.lock");
    let started = Instant::now();
    while std::fs::create_dir(&lock).is_err() {
        if bin.exists() {
            return Ok(bin);
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err(format!("timed out waiting for another install ({})", lock.display()));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let result = (|| {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        run(Command::new(&python).args(["-m", "venv"]).arg(&venv))?;
        run(Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("SecantusDB=={}", version())))?;
        if bin.exists() {
            Ok(bin.clone())
        } else {
            Err(format!("{} missing after install", bin.display()))
        }
    })();
    let _ = std::fs::remove_dir(&lock);
    result
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// Starts an in-memory SecantusDB for this process, and returns its port on
/// 127.0.0.1. A small shell watchdog stops the server when this process
/// exits, however it exits (SIGTERM, then SIGKILL after 5 s: a server busy
/// in a long request may not heed the first), and removes the server's log if it is empty
/// (one is made per server, and test runs start hundreds).
pub(crate) fn start() -> Result<u16, String> {
    let bin = install()?;
    let port = free_port()?;
    let log = target_dir().join("secantus").join(format!("server-{port}.log"));
    let script = format!(
        "'{bin}' --port {port} --storage-path :memory: --enable-test-commands --log-level WARNING >'{log}' 2>&1 & s=$!; \
         while kill -0 {parent} 2>/dev/null && kill -0 $s 2>/dev/null; do sleep 1; done; kill $s 2>/dev/null; \
         n=0; while kill -0 $s 2>/dev/null && [ $n -lt 5 ]; do sleep 1; n=$((n+1)); done; kill -0 $s 2>/dev/null && kill -9 $s 2>/dev/null; \
         wait $s 2>/dev/null; [ -s '{log}' ] || rm -f '{log}'",
        bin = bin.display(),
        log = log.display(),
        parent = std::process::id()
    );
    // In a process group of its own, so that a signal to the tests' group
    // (a CI runner stopping them) does not take the watchdog with them and
    // leave the server running: the watchdog sees them gone and stops it.
    Command::new("sh")
        .process_group(0)
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start SecantusDB: {e}"))?;
    wait_for_port(port, Duration::from_secs(60))?;
    Ok(port)
}
