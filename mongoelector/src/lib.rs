//! Leader election on a shared store: the Rust counterpart of the Python
//! `MongoElector`, built on [`mongolock`]'s leases.
//!
//! - **Handover in milliseconds**: `stop`, `release` and dropping the last handle
//!   release the lease at once, and a waiting follower is woken by a change
//!   notification (or polls every `poll_interval` where there are none).
//! - **Failover at the lease limit**: after a leader crashes, a follower takes over
//!   as soon as the lease expires on the store clock — it sleeps until the observed
//!   expiry, not a fixed poll interval.
//! - **Leader-scoped work stops in time**: each term has a cancellation token that
//!   fires *before* the lease can lapse when renewal cannot be confirmed. Run
//!   leader work with [`Elector::while_leader`], or in
//!   [`ElectorBuilder::on_leader_term`], which is handed it.
//! - **Callbacks cannot delay a loss**: callbacks run on blocking threads, never on
//!   the renewal path, in two lanes. `on_leader` and `on_leader_loss` strictly
//!   alternate, and a pending loss goes ahead of anything else; `on_loop` and
//!   `on_new_leader` run in a lane of their own and are coalesced, so a slow
//!   `on_loop` never holds back a loss. A panicking callback is logged.
//! - **Bounded stop**: [`Elector::stop`] returns within
//!   [`ElectorBuilder::stop_timeout`] (default the ttl), even when a callback blocks.
//! - **Status reports** ([`status`]): each node upserts a status document every
//!   round (its version, host, pid, role, last poll), garbage-collected by a TTL
//!   index some ten ttls after the node stopped reporting.
//!
//! ```
//! use mongoelector::Elector;
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), mongoelector::ElectorError> {
//! let store = store_memory::MemoryStore::new(); // or mongoelector::mongo::MongoStore::connect(uri, "coolproj")
//! let elector = Elector::builder(store, "CleverName")
//!     .ttl(Duration::from_secs(15))
//!     .on_leader(|| println!("Elected leader, starting task scheduler"))
//!     .on_leader_loss(|| println!("Leadership lost, shutting down task scheduler"))
//!     .build()?;
//! elector.start()?;
//! let mut changes = elector.leadership();
//! changes.wait_for(|l| l.is_me).await.expect("elector running");
//! assert!(elector.is_leader());
//! assert!(elector.leader_exists().await?);
//! elector.stop().await; // surrenders leadership at once
//! assert!(!elector.is_leader());
//! # Ok(()) }
//! ```
//!
//! | `MongoElector` | here |
//! |---|---|
//! | `MongoElector(key, dbconn, dbname, ttl, onmaster, onmasterloss, onloop, report_status)` | [`Elector::builder`] |
//! | `app_version` | [`ElectorBuilder::version`] |
//! | `start(blocking=False)` / `start(blocking=True)` | [`Elector::start`] / [`Elector::run`] |
//! | `stop()`, `release()`, `poll()` | [`Elector::stop`], [`Elector::release`], [`Elector::poll`] |
//! | `ismaster`, `leader_exists`, `running` | [`Elector::is_leader`], [`Elector::leader_exists`], [`Elector::running`] |
//! | `cluster_detail`, `node_status`, `report_status()` | [`Elector::cluster_detail`], [`Elector::node_status`], [`Elector::report_status`] |
//!
//! Each round of the background tasks is the Python `MongoElector`'s `poll()`: lease maintenance
//! first (the leader renews; a follower's campaign runs apart and wakes on change
//! notifications), then `on_loop`, then the status report.
//!
//! Code map: `builder.rs` (configuration), `elector.rs` (the handle, whose
//! methods delegate to the modules below), `inner.rs` (the state they share,
//! and how a term begins and ends), `term.rs` (a term and its snapshot),
//! `campaign.rs` (campaign and lead), `round.rs` (the rounds: renewal,
//! `on_loop`, status), `observer.rs` (who leads), `callbacks.rs` (the callback
//! lanes), `status.rs` (the status-document schema), `metrics.rs` (the figures
//! emitted through the `metrics` facade: `mongoelector_*`, see [`metrics`]),
//! `error.rs`.

mod builder;
mod callbacks;
mod campaign;
mod elector;
mod error;
mod inner;
mod leadership;
pub mod metrics;
mod observer;
mod round;
pub mod status;
mod term;

pub use builder::{ElectorBuilder, DEFAULT_COLLECTION, DEFAULT_STATUS_COLLECTION, DEFAULT_TTL};
pub use callbacks::Callback;
pub use elector::Elector;
pub use error::{ElectorError, MalformedReport};
pub use leadership::{Leadership, Role};
pub use mongolock;

/// The MongoDB backend, re-exported for convenience.
#[cfg(feature = "mongo")]
pub use store_mongo as mongo;
