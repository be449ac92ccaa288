//! The tokio runtime of the process, the stores it connected, and the way
//! a Python thread waits for a future without holding the GIL.
//!
//! Both the runtime and the stores are per process ([`PerProcess`]): a child
//! forked after they were made makes its own. Their mutexes are taken only by
//! threads that hold the GIL (every caller here has a `Python` token), and
//! `os.fork()` holds it too, so no child inherits one of them locked.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::prelude::*;
use store_mongo::MongoStore;
use tokio::runtime::Runtime;

use crate::errors::{store_error, CoordinationError};
use crate::process::PerProcess;

/// The runtime every lock and elector of the process runs on. Two workers: the
/// work is waiting on the network, and the elector's callbacks run on the
/// runtime's blocking threads, not on these. Never dropped (a runtime's drop
/// waits for its threads, which a forked child does not have).
fn runtime() -> PyResult<&'static Runtime> {
    static RUNTIME: Mutex<Option<PerProcess<&'static Runtime>>> = parking_lot::const_mutex(None);
    let mut slot = RUNTIME.lock();
    if let Some(rt) = slot.as_ref().and_then(PerProcess::get) {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("mongoelector")
        .enable_all()
        .build()
        .map_err(|e| CoordinationError::new_err(format!("cannot start the tokio runtime: {e}")))?;
    let rt: &'static Runtime = Box::leak(Box::new(rt));
    *slot = Some(PerProcess::new(rt));
    Ok(rt)
}

/// Runs `fut` on the runtime and waits for it with the GIL released. The
/// future runs on a task of its own and the caller waits on a channel, so this
/// works from any thread, a callback's included (where `Runtime::block_on`
/// would panic: those threads are inside the runtime). Every wait is
/// interruptible (see [`wait_interruptible`]): a server that does not answer
/// holds a call up to its server selection timeout (30 s by default), a
/// `stop()` up to the ttl, and Ctrl-C must end those waits as it ends
/// `acquire()`'s. Every future waited on here is cancel-safe: reads, a
/// connection, a release or renewal (an aborted one completes or lapses on
/// its own, see `mongolock`), a stop once polled.
pub(crate) fn wait<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    wait_interruptible(py, fut)
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
    type Stores = HashMap<(String, String), MongoStore>;
    static STORES: OnceLock<Mutex<PerProcess<Stores>>> = OnceLock::new();
    let stores = STORES.get_or_init(|| Mutex::new(PerProcess::new(Stores::new())));
    let id = (uri.to_owned(), database.to_owned());
    if let Some(s) = stores.lock().get_or_insert_with(Stores::new).get(&id) {
        return Ok(s.clone());
    }
    let (u, d) = id.clone();
    let store = wait(py, async move { MongoStore::connect(&u, &d).await })?.map_err(store_error)?;
    // Two threads may connect at once; the first store kept wins, and the
    // other's client is dropped.
    Ok(stores.lock().get_or_insert_with(Stores::new).entry(id).or_insert(store).clone())
}
