//! A distributed lock that never has two holders: the Rust counterpart of the
//! Python `MongoLocker`, built only on the [`store_trait::Store`] contract.
//!
//! - **Leases on the store clock**: expiry is the server's `$$NOW` + ttl; a client
//!   whose clock is off by an hour behaves like the rest.
//! - **Fencing tokens**: every acquisition gets a token greater than every earlier
//!   one for the key, across release, expiry, force and server restarts.
//! - **One round trip** per acquire, renew and release.
//! - **A lost-lock signal** that fires *before* the lease can lapse on the server
//!   when renewal cannot be confirmed.
//! - **Waiters woken by change notifications** (release) and by the observed
//!   expiry (crash), not by polling every `step`.
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
//!     _ = async { /* write the report, passing guard.token() as a fencing token */ } => {}
//! }
//! guard.release().await?;
//! assert!(!lock.locked().await?);
//! # Ok(()) }
//! ```
//!
//! | `MongoLocker` | here |
//! |---|---|
//! | `MongoLocker(key, dbconn, dbname, dbcollection, ttl)` | [`Lock::builder`]`(store, key).collection(..).ttl(..)` |
//! | `acquire(blocking, timeout, step, force)` | [`Lock::acquire`], [`Lock::try_acquire`], [`Lock::acquire_timeout`], [`Lock::acquire_with`]`(`[`Acquire`]`)`; `step` is [`LockBuilder::step`] |
//! | `release(force)` | [`LockGuard::release`], [`Lock::release`]`(force)` |
//! | `locked()`, `owned()`, `get_current()` | [`Lock::locked`], [`Lock::owned`], [`Lock::get_current`] |
//! | `touch()` | [`LockGuard::touch`], [`Lock::touch`] |
//! | `status` | [`Lock::status`] |
//! | `timeparanoid` | unnecessary (server clock); [`Lock::clock_offset_ms`] reports the offset |

mod error;
mod guard;
mod identity;
mod lock;
mod semaphore;

pub use error::LockError;
pub use guard::{LockGuard, Validity};
pub use identity::Identity;
pub use lock::{
    Acquire, Lock, LockBuilder, LockInfo, LockMetrics, LockStatus, DEFAULT_COLLECTION, DEFAULT_STEP, DEFAULT_TTL,
    FOREIGN_LOCK_FIELDS,
};
pub use semaphore::Semaphore;
pub use store_trait;

/// The MongoDB backend, re-exported for convenience.
#[cfg(feature = "mongo")]
pub use store_mongo as mongo;
