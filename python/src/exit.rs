//! The interpreter's exit: from the moment it begins (the `atexit` hook the
//! package registers on import) the runtime's threads never attach to the
//! interpreter again, so no callback starts while Python shuts down.
//!
//! A thread that is not Python's own and attaches while the interpreter
//! finalizes is ended by CPython with `pthread_exit` (before 3.14), whose
//! unwinding through Rust frames aborts the process ("Fatal Python error:
//! PyGILState_Release"). So the runtime's threads attach only through
//! [`attach`], and only briefly (to start a callback's Python thread, see
//! `callbacks.rs`); [`at_exit`] closes the door and waits for those already
//! inside to leave.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// Set once the interpreter began to exit.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Threads inside [`attach`] (attached, or waiting for the GIL).
static INSIDE: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` attached to the interpreter, unless it began to exit (`None`).
pub(crate) fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            INSIDE.fetch_sub(1, Ordering::SeqCst);
        }
    }
    // Counted first, checked second (and `at_exit` sets first, counts second):
    // either `at_exit` sees this thread inside and waits, or this thread sees
    // the flag and stays out.
    INSIDE.fetch_add(1, Ordering::SeqCst);
    let _leave = Leave;
    if EXITING.load(Ordering::SeqCst) {
        return None;
    }
    Python::try_attach(f)
}

/// The package's `os.register_at_fork(after_in_child=...)` hook: the threads
/// that were inside [`attach`] at the fork are the parent's, not the child's.
#[pyfunction]
#[pyo3(name = "_after_fork_in_child")]
pub(crate) fn after_fork_in_child() {
    INSIDE.store(0, Ordering::SeqCst);
}

/// The package's `atexit` hook: no callback starts from now on; returns once
/// the runtime's threads that were attaching have let go of the interpreter
/// (they only start a thread), or after two seconds.
#[pyfunction]
#[pyo3(name = "_at_exit")]
pub(crate) fn at_exit(py: Python<'_>) {
    EXITING.store(true, Ordering::SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + Duration::from_secs(2);
        while INSIDE.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}
