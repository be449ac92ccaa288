//! The logs the chaos run's processes append to, and the checker reads.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

/// A line-oriented, append-only log; each line flushed at once, so a SIGKILL
/// loses at most the line being written.
#[derive(Clone)]
pub(super) struct Log(Arc<Mutex<std::fs::File>>);

impl Log {
    pub(super) fn open(path: &Path) -> std::io::Result<Log> {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Log(Arc::new(Mutex::new(f))))
    }

    pub(super) fn line(&self, s: String) {
        let mut f = self.0.lock();
        let _ = writeln!(f, "{s}");
    }
}
