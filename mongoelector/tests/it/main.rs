//! Integration tests of the elector: one behavioural suite on the in-memory store
//! (paused time, with and without change notifications) and on a real server; a
//! deterministic one-hour simulation; crash failover on the real server.
#![allow(clippy::unwrap_used, missing_docs)]

mod callbacks;
mod crash;
mod executor;
mod rounds;
mod simulation;
mod suite;

store_test::on_all_backends!(crate::suite::elector_suite, std::time::Duration::from_secs(3));
