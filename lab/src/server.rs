//! A test server this process owns: `secantusd-py` or `secantusd-rs`, which
//! take the same flags, started on a free port and killed when dropped.
//! The chaos run kills and restarts it on its data; the bench starts a fresh
//! one for each peer setting, so no peer runs on a server another left busy.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::error::LabError;

/// Where the server keeps its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Storage {
    /// In memory (`secantusd-py` only): gone with the process.
    Memory,
    /// On disk in this directory, kept across restarts by the same `Server`.
    Dir(PathBuf),
}

/// How to start a server: its binary and its storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerSpec {
    pub(crate) bin: PathBuf,
    pub(crate) storage: Storage,
}

/// A running (or, between a kill and a start, stopped) server.
#[derive(Debug)]
pub(crate) struct Server {
    spec: ServerSpec,
    port: u16,
    child: Option<tokio::process::Child>,
    /// Whether dropping removes the data directory (a fresh server's own).
    owns_dir: bool,
}

impl Server {
    /// A server on a free port; not started yet.
    pub(crate) fn new(spec: ServerSpec) -> Result<Server, LabError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| LabError::io("no free port", e))?
            .port();
        Ok(Server { spec, port, child: None, owns_dir: false })
    }

    /// A fresh server: on a free port, on empty storage (a new directory
    /// named after the port under `spec`'s directory, removed on drop).
    pub(crate) async fn fresh(spec: &ServerSpec) -> Result<Server, LabError> {
        let mut s = Server::new(spec.clone())?;
        if let Storage::Dir(parent) = &spec.storage {
            let dir = parent.join(format!("fresh-{}-{}", std::process::id(), s.port));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).map_err(|e| LabError::io(format!("cannot create {}", dir.display()), e))?;
            s.spec.storage = Storage::Dir(dir);
            s.owns_dir = true;
        }
        s.start().await?;
        Ok(s)
    }

    /// Starts it (again, on the same port and data) and waits until it
    /// accepts connections, at most 60 s.
    pub(crate) async fn start(&mut self) -> Result<(), LabError> {
        let storage = match &self.spec.storage {
            Storage::Memory => ":memory:".into(),
            Storage::Dir(d) => d.clone().into_os_string(),
        };
        let child = tokio::process::Command::new(&self.spec.bin)
            .args(["--port", &self.port.to_string(), "--storage-path"])
            .arg(storage)
            .args(["--log-level", "WARNING"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| LabError::io(format!("cannot start {}", self.spec.bin.display()), e))?;
        self.child = Some(child);
        let start = Instant::now();
        let limit = Duration::from_secs(60);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_err() {
            if start.elapsed() > limit {
                let what = format!("{} did not accept connections", self.spec.bin.display());
                return Err(LabError::timed_out(what, limit));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Kills it (SIGKILL) and waits for it to go.
    pub(crate) async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    /// Its URI, with `params` (`key=value&…`) after the ones every local
    /// test server needs: a direct connection, and `retryWrites=false`, since
    /// SecantusDB keeps a record of every retryable write and slows down
    /// twentyfold after some 10,000 of them (`test-server.md`).
    pub(crate) fn uri(&self, params: &str) -> String {
        let sep = if params.is_empty() { "" } else { "&" };
        format!("mongodb://127.0.0.1:{}/?directConnection=true&retryWrites=false{sep}{params}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
        if let (true, Storage::Dir(d)) = (self.owns_dir, &self.spec.storage) {
            // The killed server may still hold files open for a moment; a
            // directory left behind is only disk, under target/.
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
