//! The lab's servers: a venv under `target/bench` with the pinned SecantusDB
//! (`secantusd-py`) and the Python `mongoelector`; the pinned Rust server
//! `secantusd-rs` (crate `secantus-mdb`, GPL-2.0: run as a process of its
//! own, never linked), built once into `target/secantus`; and a fresh server
//! of either on a free port.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The test server's version: the workspace's one pin, which `store-test`
/// keeps (its harness installs that server) and xtask reads from the same
/// file, as it depends on nothing.
const SECANTUS_VERSION: &str = include_str!("../../store-test/SECANTUS_VERSION");

/// The pinned test server, as pip names it (`SecantusDB==VERSION`).
pub(crate) fn secantus() -> String {
    format!("SecantusDB=={}", SECANTUS_VERSION.trim())
}

/// The pinned Python `mongoelector`.
const MONGOELECTOR: &str = "mongoelector==1.0.2";

/// The pinned Rust server: `cargo install secantus-mdb --version` this. The
/// crate declares rust-version 1.98, yet this version builds on our 1.95
/// (hence `--ignore-rust-version`, and the exact pin). Pinned once, beside
/// the Python server's pin, in `store-test/SECANTUS_RS_VERSION`.
pub(crate) const SECANTUS_RS: &str = include_str!("../../store-test/SECANTUS_RS_VERSION").trim_ascii();

/// The workspace root.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The venv, installed on first use.
pub(crate) fn venv() -> Result<PathBuf, String> {
    let dir = root().join("target").join("bench").join("venv");
    let py = dir.join("bin").join("python");
    if !dir.join("bin").join("secantusd-py").exists() {
        let secantus = secantus();
        eprintln!("installing {secantus} and {MONGOELECTOR} into {}", dir.display());
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        run_cmd(Command::new(python).args(["-m", "venv"]).arg(&dir))?;
        run_cmd(Command::new(&py).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            secantus.as_str(),
            MONGOELECTOR,
        ]))?;
    }
    Ok(dir)
}

/// Runs a command to completion; an error unless it succeeds.
pub(crate) fn run_cmd(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{}: {e}", describe(cmd)))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} failed ({status})", describe(cmd)))
    }
}

/// A command as an error message shows it: its program and arguments, a
/// URI among them masked (it may hold a password), and not its
/// environment (which `{:?}` of a `Command` would print, values and all).
fn describe(cmd: &Command) -> String {
    use std::fmt::Write;
    let mut out = format!("{:?}", cmd.get_program());
    for a in cmd.get_args() {
        let a = a.to_string_lossy();
        if a.contains("://") {
            out.push_str(" \"***\"");
        } else {
            let _ = write!(out, " {a:?}");
        }
    }
    out
}

/// Stops `server` (a process this one started) once this process has
/// gone, however it went (a signal, a panic): a small shell watchdog,
/// which ends by itself when the server does. SIGTERM first, SIGKILL 5 s
/// later (a server that does not stop on SIGTERM).
fn stop_with_this_process(server: u32) {
    let script = format!(
        "while kill -0 {parent} 2>/dev/null && kill -0 {server} 2>/dev/null; do sleep 1; done; \
         kill {server} 2>/dev/null && sleep 5 && kill -0 {server} 2>/dev/null && kill -9 {server} 2>/dev/null",
        parent = std::process::id()
    );
    // Its own process group: a signal to xtask's group reaches the server
    // but not the watchdog, which still sends the SIGKILL.
    let _ = Command::new("sh")
        .process_group(0)
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// A server that is stopped when dropped (and its data directory removed).
pub(crate) struct Server {
    child: Child,
    data: Option<PathBuf>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.data {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Which server a run uses (`--server py|rs|URI`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A fresh `secantusd-py`, in memory.
    Py,
    /// A fresh `secantusd-rs`, in a fresh directory.
    Rs,
    /// A server of the user's.
    Uri(String),
}

impl Target {
    /// `--server VALUE` if given, else `MONGODB_URI` if set, else `py`.
    pub(crate) fn from_args(args: &[String]) -> Result<Target, String> {
        let given = match args.iter().position(|a| a == "--server") {
            Some(i) => Some(args.get(i + 1).ok_or("--server needs a value: py, rs or a mongodb:// URI")?.clone()),
            None => args.iter().find_map(|a| a.strip_prefix("--server=").map(str::to_owned)),
        };
        Ok(match given.as_deref() {
            Some("py") => Target::Py,
            Some("rs") => Target::Rs,
            Some(u) if u.starts_with("mongodb://") || u.starts_with("mongodb+srv://") => Target::Uri(u.to_owned()),
            Some(other) => return Err(format!("--server {other:?}: give py, rs or a mongodb:// URI")),
            None => match std::env::var("MONGODB_URI") {
                Ok(u) if !u.is_empty() => Target::Uri(u),
                _ => Target::Py,
            },
        })
    }

    /// The short name used in file names and the README's table.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Target::Py => "py",
            Target::Rs => "rs",
            Target::Uri(_) => "uri",
        }
    }

    /// `lab bench`'s arguments for the fresh servers it starts for a peer's
    /// settings: the same server as the run's (none for a URI, whose server
    /// we cannot start).
    pub(crate) fn fresh_server_args(&self, venv: &Path) -> Result<Vec<std::ffi::OsString>, String> {
        Ok(match self {
            Target::Py => vec![
                "--fresh-server-bin".into(),
                venv.join("bin").join("secantusd-py").into(),
                "--fresh-server-in-memory".into(),
            ],
            Target::Rs => vec!["--fresh-server-bin".into(), rs_binary()?.into()],
            Target::Uri(_) => Vec::new(),
        })
    }

    /// Starts the server (none for a URI); returns it, its URI and a label.
    pub(crate) fn start(&self, venv: &Path) -> Result<(Option<Server>, String, String), String> {
        match self {
            Target::Py => {
                let (s, u) = start(venv)?;
                Ok((Some(s), u, format!("{} (fresh, in memory, retryWrites=false)", secantus().replace("==", " "))))
            }
            Target::Rs => {
                let (s, u) = start_rs()?;
                Ok((Some(s), u, format!("secantusd-rs {SECANTUS_RS} (fresh, on disk, retryWrites=false)")))
            }
            Target::Uri(u) => Ok((None, u.clone(), "MONGODB_URI".to_owned())),
        }
    }
}

/// `secantusd-rs`, built into `target/secantus/rs-VERSION` on first use (it
/// needs `cmake`; about 20 minutes on 2 cores) and kept across runs.
pub(crate) fn rs_binary() -> Result<PathBuf, String> {
    let dir = root().join("target").join("secantus").join(format!("rs-{SECANTUS_RS}"));
    let bin = dir.join("bin").join("secantusd-rs");
    if bin.exists() {
        return Ok(bin);
    }
    if Command::new("cmake").arg("--version").stdout(Stdio::null()).status().is_err() {
        return Err("secantusd-rs needs cmake to build its WiredTiger (Debian: apt-get install cmake)".into());
    }
    eprintln!("building secantus-mdb {SECANTUS_RS} into {} (once; about 20 minutes on 2 cores)", dir.display());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run_cmd(
        Command::new(cargo)
            .args(["install", "--quiet", "--locked", "secantus-mdb", "--version", SECANTUS_RS, "--ignore-rust-version"])
            .arg("--root")
            .arg(&dir)
            // Its own build directory: the workspace's lock stays free meanwhile.
            .env("CARGO_TARGET_DIR", root().join("target").join("secantus").join("rs-build")),
    )?;
    let _ = std::fs::remove_dir_all(root().join("target").join("secantus").join("rs-build"));
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!("cargo install secantus-mdb left no {}", bin.display()))
    }
}

/// Removes the data directories of servers whose run was killed before it
/// could clean up (`rs-data-<pid>-<port>` under `target/secantus`, and
/// lab's `fresh-<pid>-<port>` under `target/bench`): those whose pid is not
/// running any more.
pub(crate) fn remove_stale_data() {
    let dirs = [root().join("target").join("secantus"), root().join("target").join("bench")];
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("rs-data-").or_else(|| name.strip_prefix("fresh-")) else { continue };
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
            if !Path::new("/proc").join(pid.to_string()).exists() {
                eprintln!("removing {} (left by a run that was killed)", e.path().display());
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// Starts a fresh `secantusd-rs` on a free port, in a fresh directory.
pub(crate) fn start_rs() -> Result<(Server, String), String> {
    let bin = rs_binary()?;
    let port = free_port()?;
    let data = root().join("target").join("secantus").join(format!("rs-data-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()))?;
    let child = Command::new(bin)
        .args(["--port", &port.to_string(), "--log-level", "WARNING", "--storage-path"])
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start secantusd-rs: {e}"))?;
    stop_with_this_process(child.id());
    let server = Server { child, data: Some(data) };
    wait_for(port, "secantusd-rs")?;
    Ok((server, uri(port)))
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).map_err(|e| e.to_string())
}

fn wait_for(port: u16, what: &str) -> Result<(), String> {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("{what} did not start within 60 s"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The URI of a local test server: retryWrites=false, since with retryable
/// writes SecantusDB slows down after ~10,000 writes (see shared/test-server.md).
fn uri(port: u16) -> String {
    format!("mongodb://127.0.0.1:{port}/?directConnection=true&retryWrites=false&serverSelectionTimeoutMS=5000")
}

/// Starts a fresh in-memory SecantusDB; returns it and its URI.
pub(crate) fn start(venv: &Path) -> Result<(Server, String), String> {
    let port = free_port()?;
    let child = Command::new(venv.join("bin").join("secantusd-py"))
        .args(["--port", &port.to_string(), "--storage-path", ":memory:", "--log-level", "WARNING"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start SecantusDB: {e}"))?;
    stop_with_this_process(child.id());
    let server = Server { child, data: None };
    wait_for(port, "SecantusDB")?;
    Ok((server, uri(port)))
}
