//! Integration tests of the lock: one behavioural suite run on the in-memory
//! store (paused time, with and without change notifications) and on a real
//! server; a property-based model test; fault injection on both backends.
#![allow(clippy::unwrap_used, missing_docs)]

mod clocks;
mod faults;
mod input;
mod lease;
mod model;
mod suite;

store_test::on_all_backends!(crate::suite::lock_suite, std::time::Duration::from_secs(2));
