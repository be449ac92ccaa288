//! The exceptions, and how the crates' errors map onto them.

use mongoelector::ElectorError;
use mongolock::LockError;
use pyo3::exceptions::PyException;
use pyo3::PyErr;

pyo3::create_exception!(
    _native,
    CoordinationError,
    PyException,
    "The store failed, or the lock or election was misconfigured."
);
pyo3::create_exception!(_native, LockExists, PyException, "A non-blocking acquire found the lock held.");
pyo3::create_exception!(_native, AcquireTimeout, PyException, "A blocking acquire gave up after its timeout.");
pyo3::create_exception!(
    _native,
    ForeignLock,
    LockExists,
    "The lock's document was written by another program (the pure-Python MongoLocker); it is never taken."
);

/// The Python exception for a lock error.
pub(crate) fn lock_error(e: LockError) -> PyErr {
    match e {
        LockError::Held { .. } => LockExists::new_err(e.to_string()),
        LockError::Timeout { .. } => AcquireTimeout::new_err(e.to_string()),
        LockError::Foreign { .. } => ForeignLock::new_err(e.to_string()),
        LockError::Config(_) => pyo3::exceptions::PyValueError::new_err(e.to_string()),
        other => CoordinationError::new_err(other.to_string()),
    }
}

/// The Python exception for an elector error.
pub(crate) fn elector_error(e: ElectorError) -> PyErr {
    match e {
        ElectorError::Lock(l) => lock_error(l),
        ElectorError::Config(_) => pyo3::exceptions::PyValueError::new_err(e.to_string()),
        other => CoordinationError::new_err(other.to_string()),
    }
}

/// The Python exception for a store error (connecting).
pub(crate) fn store_error(e: store_trait::StoreError) -> PyErr {
    CoordinationError::new_err(e.to_string())
}
