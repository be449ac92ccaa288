//! The one tokio runtime of the process, the stores it connected, and the way
//! a Python thread waits for a future without holding the GIL.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::prelude::*;
use store_mongo::MongoStore;
use tokio::runtime::Runtime;

use crate::errors::{store_error, CoordinationError};

/// The runtime every lock and elector of the process runs on. Two workers: the
/// work is waiting on the network, and the elector's callbacks run on the
/// runtime's blocking threads, not on these.
fn runtime() -> PyResult<&'static Runtime> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("mongoelector")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| CoordinationError::new_err(format!("cannot start the tokio runtime: {e}")))
}

/// Runs `fut` on the runtime and waits for it with the GIL released. The
/// future runs on a task of its own and the caller waits on a channel, so this
/// works from any thread, a callback's included (where `Runtime::block_on`
/// would panic: those threads are inside the runtime).
pub(crate) fn wait<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let rt = runtime()?;
    let (tx, rx) = mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    py.detach(move || rx.recv()).map_err(|_| CoordinationError::new_err("the runtime stopped before the call finished"))
}

/// As [`wait`], for a cancel-safe future that may wait long (a blocking
/// acquire): Python signals are checked ten times a second, and on one (Ctrl-C)
/// the task is aborted and the signal's exception raised.
pub(crate) fn wait_interruptible<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let rt = runtime()?;
    let (tx, rx) = mpsc::sync_channel(1);
    let task = rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    let mut rx = rx;
    loop {
        // The receiver moves into the detached closure and back out (a
        // `Receiver` is `Send` but not `Sync`).
        let (got, back) = py.detach(move || (rx.recv_timeout(Duration::from_millis(100)), rx));
        rx = back;
        match got {
            Ok(out) => return Ok(out),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Err(signal) = py.check_signals() {
                    task.abort();
                    return Err(signal);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(CoordinationError::new_err("the runtime stopped before the call finished"))
            }
        }
    }
}

/// Enters the runtime's context on this thread for `f` (for calls that spawn
/// tasks without awaiting, as `Elector::start`).
pub(crate) fn enter<T>(f: impl FnOnce() -> T) -> PyResult<T> {
    let _guard = runtime()?.enter();
    Ok(f())
}

/// The store for `uri` and `database`, connected once per process and shared
/// (one connection pool, one watcher per collection).
pub(crate) fn store(py: Python<'_>, uri: &str, database: &str) -> PyResult<MongoStore> {
    static STORES: OnceLock<Mutex<HashMap<(String, String), MongoStore>>> = OnceLock::new();
    let stores = STORES.get_or_init(Default::default);
    let id = (uri.to_owned(), database.to_owned());
    if let Some(s) = stores.lock().get(&id) {
        return Ok(s.clone());
    }
    let (u, d) = id.clone();
    let store = wait(py, async move { MongoStore::connect(&u, &d).await })?.map_err(store_error)?;
    // Two threads may connect at once; the first store kept wins, and the
    // other's client is dropped.
    Ok(stores.lock().entry(id).or_insert(store).clone())
}
