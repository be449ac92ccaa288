//! A distributed lock that never has two holders: the Rust counterpart of the
//! Python `MongoLocker`, built only on the [`store_trait::Store`] contract.
//!
//! - **Leases on the store clock**: expiry is the server's `$$NOW` + ttl; a client
//!   whose clock is off by an hour behaves like the rest.
//! - **Fences**: every acquisition gets a fence, a number greater than every earlier
//!   one for the key, across release, expiry, force and server restarts.
//! - **One round trip** per acquire, renew and release.
//! - **A lost-lock signal** that fires *before* the lease can lapse on the server
//!   when renewal cannot be confirmed, and when a clock check finds the lease may
//!   have ended early (see [Clocks](#clocks) for the bound).
//! - **Waiters woken by change notifications** (release) and by the observed
//!   expiry (crash), not by polling every `poll_interval`.
//!
//! ```
//! use mongolock::{Acquire, Lock};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), mongolock::LockError> {
//! let store = store_memory::MemoryStore::new(); // or mongolock::mongo::MongoStore::connect(uri, "coolproj")
//! let lock = Lock::builder(store, "nightly-report").ttl(Duration::from_secs(60)).build()?;
//!
//! let guard = lock.acquire_with(Acquire::new().timeout(Duration::from_secs(30)).auto_renew()).await?;
//! tokio::select! {
//!     _ = guard.lost() => eprintln!("lost the lock; stop writing"),
//!     _ = async { /* write the report, passing guard.fence() along */ } => {}
//! }
//! guard.release().await?;
//! assert!(!lock.locked().await?);
//! # Ok(()) }
//! ```
//!
//! | `MongoLocker` | here |
//! |---|---|
//! | `MongoLocker(key, dbconn, dbname, dbcollection, ttl)` | [`Lock::builder`]`(store, key).collection(..).ttl(..)` |
//! | `acquire(blocking, timeout, step, force)` | [`Lock::acquire`], [`Lock::try_acquire`], [`Lock::acquire_timeout`], [`Lock::acquire_with`]`(`[`Acquire`]`)`; `step` is [`LockBuilder::poll_interval`] |
//! | `release(force)` | [`LockGuard::release`], [`Lock::release`], [`Lock::release_by_force`] |
//! | `locked()`, `owned()`, `get_current()` | [`Lock::locked`], [`Lock::owned`], [`Lock::get_current`] |
//! | `touch()` | [`LockGuard::touch`], [`Lock::touch`] |
//! | `status` | [`Lock::status`] |
//! | `timeparanoid` | unnecessary (server clock); [`Lock::clock_offset_ms`] reports the offset |
//!
//! # Metrics
//!
//! Lease acquisitions and losses are also emitted through the `metrics` facade,
//! as `mongolock_*` counters: see [`metrics`] for the names and labels.
//!
//! # Clocks
//!
//! A lease ends at the store's time of the grant plus the ttl, on the **store
//! clock**. The holder keeps a local deadline on its **monotonic clock** (tokio's
//! `Instant`): the send time of the last confirmed grant plus the ttl minus the
//! safety margin `m` ([`LockBuilder::safety_margin`], default a tenth of the ttl).
//! The grant happened after the send, so that deadline comes at least `m` before
//! the lease can lapse, as long as both clocks measure real time.
//!
//! **What the lost signal guarantees.** [`LockGuard::lost`] fires, and
//! [`LockGuard::is_lost`] is true, before the lease can lapse on the store, if
//! since the holder's last confirmed grant (its acquisition or latest renewal):
//! 1. the store clock has not run ahead of real time by `m` or more (a step
//!    forward, or a clock running fast),
//! 2. the holder's monotonic clock has missed no more than `m / 2` (a host
//!    suspend stops it; see below), and
//! 3. the holder's process got CPU within what is left of the margin.
//!
//! The client's wall clock plays no part in it: a client whose clock is off by an
//! hour holds and loses leases exactly like the rest.
//!
//! **Outside those assumptions**, the holder may believe it holds a lease that has
//! lapsed; the lock detects it as early as it can, and fences (rejected
//! once stale) cover the window:
//! - *Store clock jumped ahead* (an NTP step on the server, a failover to a member
//!   whose clock is ahead, a clock running fast). Every confirmed grant returns the
//!   store's time when it was applied (its new expiry minus the ttl). The holder
//!   compares how far that advanced since its previous confirmed grant with the
//!   widest local interval the two grants fit in (the earlier send to the later
//!   reply). An excess beyond the tolerance — 2 ms for millisecond stamps, 0.1 %
//!   of the interval for the rates of NTP-disciplined clocks, and the margin's
//!   share of the interval (`m × interval / ttl`, at most `m / 2`: a clock running
//!   that much fast would end a whole lease a margin early) — is reported as a
//!   loss (counted in [`LockMetrics::store_clock_jumps`]). That renewal itself
//!   succeeded, and its unchanged fence proves nobody else held the lock in
//!   between; the holder still gives up, because the clock that jumped may do it
//!   again, and a fast clock shows the same excess at every renewal (at rate `r` a
//!   lease lasts `ttl / r`). So a jump is found at the next renewal, at most one
//!   renew interval later with auto-renew. A jump of `m` or more between the last
//!   renewal and the deadline of a holder that cannot reach the store (cut off
//!   right after it) goes unseen, and one longer than the rest of the lease ends
//!   it at once: in both cases the lease can lapse up to the jump minus `m` before
//!   the holder is told.
//! - *Store clock stepped back.* Leases last longer in real time than the holder
//!   assumes, so it is told early: safe. Others wait longer for a crashed holder's
//!   lease, and a lapsed lease can become live again for its former owner, which
//!   was told it lost it and renews no more. Logged, not a loss.
//! - *Host suspend.* The monotonic clock (Linux `CLOCK_MONOTONIC`) and with it the
//!   keeper's timers stop; the wall clock does not, and the server's clock neither.
//!   Every keeper wake-up (every renew interval, with or without auto-renew) and
//!   every [`LockGuard::is_lost`] compare the advance of the client's wall clock
//!   ([`LockBuilder::clock`]) since the last confirmed send with that of its
//!   monotonic companion ([`store_trait::Clock::monotonic`]); more than `m / 2` of
//!   unseen time is a loss (counted in [`LockMetrics::local_clock_gaps`]).
//!   `is_lost` knows at once on resume; the signal fires when the keeper next
//!   wakes, at most one renew interval after resume. A suspend longer than the
//!   rest of the lease ended it while the holder was not running: it learns on
//!   resume, not before. A wall-clock step forward without a suspend (NTP) looks
//!   the same and is treated the same: conservative, a lease given up early, never
//!   kept too long. A wall-clock step back hides as much suspended time; the next
//!   renewal still sees the server's clock advance too far and reports it.

mod acquire;
mod backoff;
mod bounded;
mod error;
mod guard;
mod identity;
mod info;
mod keeper;
mod kept;
mod lease;
mod lock;
pub mod metrics;
mod release_many;
mod semaphore;
mod timing;

pub use acquire::Acquire;
pub use error::{ConfigError, LockError};
pub use guard::{LockGuard, Validity};
pub use identity::Identity;
pub use info::{LockInfo, LockMetrics, LockStatus, FOREIGN_LOCK_FIELDS};
pub use lock::{Lock, LockBuilder, DEFAULT_COLLECTION, DEFAULT_POLL_INTERVAL};
pub use semaphore::Semaphore;
pub use store_trait;
pub use timing::{DEFAULT_TTL, MAX_INTERVAL};

/// The building blocks the sibling crates (`mongoelector`, `mongoagent`)
/// share with the lock: a task claim is kept through [`unstable::Leases`]
/// like a lock's grant, and every periodic loop backs off with
/// [`unstable::Backoff`]. Not part of the stable API: they change with their
/// callers, in any release.
pub mod unstable {
    pub use crate::backoff::Backoff;
    pub use crate::lease::{Leases, LeasesBuilder};
    pub use crate::timing::{check_interval, LeaseTiming};
}

/// The MongoDB backend, re-exported for convenience.
#[cfg(feature = "mongo")]
pub use store_mongo as mongo;
