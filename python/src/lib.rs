//! The native half of the Python package `mongoelector`: the lock and the
//! election run here, on `mongolock::Lock` and `mongoelector::Elector` over
//! `store_mongo::MongoStore`; the Python half (`mongoelector/*.py`) only checks
//! arguments and shapes the seed's API around these classes.
//!
//! Every call that waits on the store releases the GIL: the futures run on one
//! shared tokio runtime ([`runtime`]), and the calling thread waits on a
//! channel, detached from the interpreter, so Python threads (and the
//! elector's callbacks, which run on Python threads of their own, see
//! [`callbacks`]) keep going meanwhile. The runtime, the stores and each
//! object's lock or elector belong to one process ([`process`]: a forked
//! child makes its own), and no callback starts once the interpreter began to
//! exit ([`exit`]).

mod callbacks;
mod elector;
mod errors;
mod exit;
mod lock;
mod process;
mod runtime;

use pyo3::prelude::*;

/// The module `mongoelector._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<lock::NativeLock>()?;
    m.add_class::<elector::NativeElector>()?;
    m.add_function(wrap_pyfunction!(exit::at_exit, m)?)?;
    m.add_function(wrap_pyfunction!(exit::after_fork_in_child, m)?)?;
    m.add("LockExists", py.get_type::<errors::LockExists>())?;
    m.add("AcquireTimeout", py.get_type::<errors::AcquireTimeout>())?;
    m.add("ForeignLock", py.get_type::<errors::ForeignLock>())?;
    m.add("CoordinationError", py.get_type::<errors::CoordinationError>())?;
    Ok(())
}
