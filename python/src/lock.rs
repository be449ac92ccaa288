//! `NativeLock`: a `mongolock::Lock` and its current acquisition, for the
//! Python `MongoLocker`.

use std::time::Duration;

use mongolock::{Acquire, Lock, LockError, LockGuard, LockInfo};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use store_mongo::MongoStore;

use crate::errors::lock_error;
use crate::process::PerProcess;
use crate::runtime::{enter, store, wait, wait_interruptible};

/// One lock on one key, with this instance's current acquisition (whose guard
/// is kept here, so the lease lives on between calls until `release`, a
/// forced release elsewhere, or its ttl).
///
/// In a child forked after it was made, it is a new lock on the same key, with
/// an identity of its own and no acquisition: the parent's lease stays the
/// parent's (the child can neither renew nor release it).
#[pyclass(module = "mongoelector._native", frozen)]
#[derive(Debug)]
pub(crate) struct NativeLock {
    config: LockConfig,
    state: Mutex<PerProcess<Held>>,
}

/// What the lock is made from (again, in a forked child).
#[derive(Debug)]
struct LockConfig {
    uri: String,
    database: String,
    collection: String,
    key: String,
    ttl: f64,
    step: Duration,
}

impl LockConfig {
    fn build(&self, py: Python<'_>) -> PyResult<Lock<MongoStore>> {
        let store = store(py, &self.uri, &self.database)?;
        Lock::builder(store, &self.key)
            .collection(&self.collection)
            .ttl_secs(self.ttl)
            .poll_interval(self.step.max(Duration::from_millis(10)))
            .build()
            .map_err(lock_error)
    }
}

/// This process's lock and the guard of its current acquisition.
#[derive(Debug)]
struct Held {
    lock: Lock<MongoStore>,
    guard: Option<LockGuard<MongoStore>>,
}

/// A lock holder as a dict of plain values (times in epoch milliseconds, store
/// clock); the Python side turns them into datetimes.
pub(crate) fn holder_dict<'py>(py: Python<'py>, h: &LockInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("owner", &h.owner)?;
    d.set_item("host", h.host.as_deref())?;
    d.set_item("pid", h.pid)?;
    d.set_item("since_ms", h.since.as_millis())?;
    d.set_item("expires_ms", h.expires.as_millis())?;
    d.set_item("fence", h.fence)?;
    Ok(d)
}

impl NativeLock {
    /// This process's lock (made anew in a forked child).
    fn lock(&self, py: Python<'_>) -> PyResult<Lock<MongoStore>> {
        if let Some(held) = self.state.lock().get() {
            return Ok(held.lock.clone());
        }
        // Connecting waits with the GIL released: not under the mutex, which
        // another Python thread may be waiting for with the GIL held.
        let lock = self.config.build(py)?;
        Ok(self.state.lock().get_or_insert_with(|| Held { lock, guard: None }).lock.clone())
    }
}

#[pymethods]
impl NativeLock {
    /// Connects (once per process for a given `uri` and `database`) and
    /// configures the lock. `step` is the poll interval where the store has no
    /// change notifications.
    #[new]
    fn new(
        py: Python<'_>,
        uri: &str,
        database: &str,
        collection: &str,
        key: &str,
        ttl: f64,
        step: f64,
    ) -> PyResult<Self> {
        let step = Duration::try_from_secs_f64(step)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("step: {e}")))?;
        let config = LockConfig {
            uri: uri.to_owned(),
            database: database.to_owned(),
            collection: collection.to_owned(),
            key: key.to_owned(),
            ttl,
            step,
        };
        let lock = config.build(py)?;
        Ok(NativeLock { config, state: Mutex::new(PerProcess::new(Held { lock, guard: None })) })
    }

    /// This instance's id (the `uuid` of the seed).
    #[getter]
    fn instance(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.lock(py)?.identity().instance().to_owned())
    }

    /// This host's name, as recorded in the lock document.
    #[getter]
    fn host(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.lock(py)?.identity().host().to_owned())
    }

    /// This process's id.
    #[getter]
    fn pid(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(self.lock(py)?.identity().pid())
    }

    /// Acquires; returns the new holder's dict. `LockExists` when not blocking
    /// and held, `AcquireTimeout` after `timeout` seconds, `ForeignLock` for a
    /// document of another program's lock.
    #[pyo3(signature = (blocking, timeout, force))]
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        blocking: bool,
        timeout: Option<f64>,
        force: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut opts = if blocking { Acquire::new() } else { Acquire::try_once() };
        if let Some(t) = timeout.filter(|_| blocking) {
            let t = Duration::try_from_secs_f64(t.max(0.0))
                .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("timeout: {e}")))?;
            opts = opts.timeout(t);
        }
        if force {
            opts = opts.force();
        }
        let lock = self.lock(py)?;
        let acquiring = lock.clone();
        let guard = wait_interruptible(py, async move { acquiring.acquire_with(opts).await })?.map_err(lock_error)?;
        let info = LockInfo {
            owner: guard.owner().to_owned(),
            host: Some(lock.identity().host().to_owned()),
            pid: Some(lock.identity().pid()),
            since: guard.since(),
            expires: guard.expires(),
            fence: guard.fence(),
        };
        let replaced = self.state.lock().get_or_insert_with(|| Held { lock, guard: None }).guard.replace(guard);
        // A guard this replaces is let go by its drop, in the runtime's context:
        // its lease, if still its own, is released in the background.
        enter(|| drop(replaced))?;
        holder_dict(py, &info)
    }

    /// Releases: this instance's acquisition, or with `force` whoever holds
    /// the lock. Returns whether a lease was released.
    fn release(&self, py: Python<'_>, force: bool) -> PyResult<bool> {
        // None in a forked child: the parent's acquisition is the parent's.
        let guard = self.state.lock().get_mut().and_then(|held| held.guard.take());
        if force {
            let lock = self.lock(py)?;
            let released = wait(py, async move { lock.release_by_force().await })?.map_err(lock_error)?;
            drop(guard);
            return Ok(released);
        }
        let Some(guard) = guard else { return Ok(false) };
        match wait(py, async move { guard.release().await })? {
            Ok(()) => Ok(true),
            Err(LockError::Lost { .. } | LockError::NotHeld { .. }) => Ok(false),
            Err(e) => Err(lock_error(e)),
        }
    }

    /// Whether anyone holds the lock now (store clock).
    fn locked(&self, py: Python<'_>) -> PyResult<bool> {
        let lock = self.lock(py)?;
        wait(py, async move { lock.locked().await })?.map_err(lock_error)
    }

    /// Whether this instance holds the lock now (store clock).
    fn owned(&self, py: Python<'_>) -> PyResult<bool> {
        let lock = self.lock(py)?;
        wait(py, async move { lock.owned().await })?.map_err(lock_error)
    }

    /// Renews this instance's acquisition; the new expiry (epoch ms, store
    /// clock), or `None` when it holds none.
    fn touch(&self, py: Python<'_>) -> PyResult<Option<i64>> {
        let lock = self.lock(py)?;
        match wait(py, async move { lock.touch().await })? {
            Ok(t) => Ok(Some(t.as_millis())),
            Err(LockError::Lost { .. } | LockError::NotHeld { .. }) => Ok(None),
            Err(e) => Err(lock_error(e)),
        }
    }

    /// The live holder's dict, or `None`.
    fn get_current<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let lock = self.lock(py)?;
        let current = wait(py, async move { lock.get_current().await })?.map_err(lock_error)?;
        current.map(|h| holder_dict(py, &h)).transpose()
    }

    /// The status: `now_ms`, `holder` (a dict or `None`), `owned`, `last_fence`.
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let lock = self.lock(py)?;
        let s = wait(py, async move { lock.status().await })?.map_err(lock_error)?;
        let d = PyDict::new(py);
        d.set_item("now_ms", s.now.as_millis())?;
        d.set_item("holder", s.holder.as_ref().map(|h| holder_dict(py, h)).transpose()?)?;
        d.set_item("owned", s.owned)?;
        d.set_item("last_fence", s.last_fence)?;
        Ok(d)
    }

    /// The client clock minus the store clock, in milliseconds.
    fn clock_offset_ms(&self, py: Python<'_>) -> PyResult<i64> {
        let lock = self.lock(py)?;
        wait(py, async move { lock.clock_offset_ms().await })?.map_err(lock_error)
    }
}
