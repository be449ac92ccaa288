//! Elector callbacks as Python callables.
//!
//! The elector calls its callbacks on the runtime's blocking threads (never on
//! the renewal path) and waits for each to return (`on_leader_loss` after its
//! `on_leader`, and `stop()` after `on_leader_loss`). User code must not run on
//! those threads: they are not Python's, and CPython ends a foreign thread that
//! is inside Python while the interpreter finalizes by unwinding it, which
//! aborts the process when Rust frames are on its stack. So the blocking thread
//! only starts a Python daemon thread (the Python side's `start(done)`, see
//! `elector.py`) and waits, detached from the interpreter, until that thread
//! calls `done()`. The user's code runs on a thread like any other Python
//! thread; at exit, daemon threads end as CPython ends them.

use std::sync::mpsc;

use pyo3::prelude::*;
use pyo3::types::PyCFunction;

use crate::exit;

/// The elector callback for `start`, a Python callable `start(done)` that runs
/// the user's callback on a Python thread of its own and then calls `done()`.
/// Once the interpreter began to exit, no callback starts.
pub(crate) fn callback(start: Py<PyAny>) -> impl Fn() + Send + Sync + 'static {
    move || {
        let (tx, rx) = mpsc::sync_channel::<()>(1);
        let started = exit::attach(|py| {
            let done = PyCFunction::new_closure(py, Some(c"done"), None, move |_, _| -> PyResult<()> {
                let _ = tx.try_send(());
                Ok(())
            });
            match done.and_then(|done| start.call1(py, (done,))) {
                Ok(_) => true,
                Err(e) => {
                    e.print(py);
                    false
                }
            }
        });
        if started == Some(true) {
            // Also returns when `done` is freed without being called.
            let _ = rx.recv();
        }
    }
}
