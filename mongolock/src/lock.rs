//! The lock handle: configuration, acquisition and the `MongoLocker` operations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use store_trait::{Clock, Collection, Condition, Key, Mutation, Record, Store, StoreError, StoreTime, Write};

use crate::error::{check_native, ConfigError, LockError};
use crate::identity::Identity;
use crate::info::{LockInfo, LockMetrics, LockStatus, Metrics};
use crate::kept::{Current, LeaseConfig};
use crate::lease::{Leases, LeasesBuilder};
use crate::timing::check_interval;

/// The collection locks live in unless configured otherwise (as in `MongoLocker`).
pub const DEFAULT_COLLECTION: &str = "mongolocker";
/// The poll interval of a waiter when change notifications are unavailable.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Configures a [`Lock`].
#[derive(Debug)]
pub struct LockBuilder<S> {
    leases: LeasesBuilder<S>,
    key: Result<Key, StoreError>,
    poll_interval: Duration,
}

impl<S: Store + Clone> LockBuilder<S> {
    /// The collection (default [`DEFAULT_COLLECTION`]).
    #[must_use]
    pub fn collection(mut self, name: impl Into<String>) -> Self {
        self.leases.collection = name.into();
        self
    }

    /// The lease length (default [`DEFAULT_TTL`](crate::DEFAULT_TTL)). If the holder neither renews nor
    /// releases within it, the lock is free for others.
    #[doc(alias = "lease")]
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.leases = self.leases.ttl(ttl);
        self
    }

    /// The lease length in seconds, as the Python original takes it.
    #[must_use]
    pub fn ttl_secs(self, secs: f64) -> Self {
        // An invalid value (negative, NaN) is reported by `build`.
        let d = if secs.is_finite() && secs > 0.0 {
            Duration::try_from_secs_f64(secs.min(1e12)).unwrap_or(Duration::ZERO)
        } else {
            Duration::ZERO
        };
        self.ttl(d)
    }

    /// How often a waiter re-checks when change notifications are unavailable
    /// (default [`DEFAULT_POLL_INTERVAL`]).
    #[doc(alias = "step")]
    #[must_use]
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// How often auto-renew renews (default a third of the ttl). Must leave room
    /// for the safety margin below the ttl.
    #[must_use]
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.leases = self.leases.renew_every(every);
        self
    }

    /// How long before the lease could lapse on the server the holder is told it
    /// lost the lock, when renewal could not be confirmed (default a tenth of the
    /// ttl, between 5 ms and 2 s).
    #[must_use]
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.leases = self.leases.safety_margin(margin);
        self
    }

    /// The identity recorded as holder (default [`Identity::current`]).
    #[must_use]
    pub fn identity(mut self, id: Identity) -> Self {
        self.leases = self.leases.identity(id);
        self
    }

    /// The client's wall clock (default [`SystemClock`](store_trait::SystemClock)).
    /// Leases never depend on it: it reports the offset to the store clock
    /// ([`Lock::clock_offset_ms`]), and a holder compares its advance with its
    /// monotonic companion ([`Clock::monotonic`]) to notice time that passed
    /// unseen (a host suspend), which it treats as a loss.
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.leases = self.leases.clock(clock);
        self
    }

    /// Validates the configuration.
    pub fn build(self) -> Result<Lock<S>, LockError> {
        let key = self.key.map_err(|e| LockError::Config(ConfigError::caused_by(e)))?;
        let leases = self.leases.build()?;
        check_interval("poll_interval", self.poll_interval)?;
        Ok(Lock {
            inner: Arc::new(LockInner {
                leases,
                key,
                poll_interval: self.poll_interval,
                seq: AtomicU64::new(1),
                current: Arc::new(Current::default()),
            }),
        })
    }
}

/// A distributed lock on one key: the Rust counterpart of the Python `MongoLocker`.
/// Cheap to clone; clones share identity, metrics and the current acquisition.
#[derive(Debug)]
pub struct Lock<S> {
    pub(crate) inner: Arc<LockInner<S>>,
}

impl<S> Clone for Lock<S> {
    fn clone(&self) -> Self {
        Lock { inner: self.inner.clone() }
    }
}

/// A lock: its key, and how its acquisitions are kept ([`Leases`]).
#[derive(Debug)]
pub(crate) struct LockInner<S> {
    pub(crate) leases: Leases<S>,
    pub(crate) key: Key,
    pub(crate) poll_interval: Duration,
    pub(crate) seq: AtomicU64,
    /// This instance's live acquisition, for `release`, `touch` and `owned`.
    pub(crate) current: Arc<Current<S>>,
}

impl<S> LockInner<S> {
    pub(crate) fn key_string(&self) -> String {
        self.key.to_string()
    }

    /// The configuration shared with the kept leases.
    pub(crate) fn config(&self) -> &LeaseConfig<S> {
        &self.leases.config
    }

    /// A fresh owner string for one acquisition attempt.
    pub(crate) fn next_owner(&self) -> String {
        self.config().identity.owner(self.seq.fetch_add(1, Ordering::Relaxed))
    }
}

impl<S: Store + Clone> Lock<S> {
    /// Configures a lock on `key` in `store`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), mongolock::LockError> {
    /// let store = store_memory::MemoryStore::new();
    /// let lock = mongolock::Lock::builder(store, "nightly-report")
    ///     .ttl(std::time::Duration::from_secs(60))
    ///     .build()?;
    /// let guard = lock.acquire().await?;
    /// assert!(lock.owned().await?);
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(store: S, key: impl Into<String>) -> LockBuilder<S> {
        Self::builder_for(store, Key::new(key))
    }

    fn builder_for(store: S, key: Result<Key, StoreError>) -> LockBuilder<S> {
        LockBuilder { leases: Leases::builder(store, DEFAULT_COLLECTION), key, poll_interval: DEFAULT_POLL_INTERVAL }
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.inner.key
    }

    /// The collection.
    pub fn collection(&self) -> &Collection {
        self.inner.leases.collection()
    }

    /// The lease length.
    #[doc(alias = "lease")]
    pub fn ttl(&self) -> Duration {
        self.inner.leases.ttl()
    }

    /// This instance's identity.
    pub fn identity(&self) -> &Identity {
        self.inner.leases.identity()
    }

    /// The store.
    pub fn store(&self) -> &S {
        self.inner.leases.store()
    }

    /// Releases this instance's current acquisition (the Python `MongoLocker`'s
    /// `release()`). [`LockError::NotHeld`] when this instance holds none.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped half-way, the acquisition is already let go (its
    /// lost signal fired) while the release write may or may not have been
    /// applied; an unapplied one leaves the lease to lapse at its expiry.
    pub async fn release(&self) -> Result<(), LockError> {
        match self.inner.current.get() {
            Some(kept) => kept.release(Mutation::new()).await.map(drop),
            None => Err(LockError::NotHeld { key: self.inner.key_string() }),
        }
    }

    /// CAUTION: releases the lock whoever holds it (the Python `MongoLocker`'s
    /// `release(force=True)`). Returns whether a lease was released.
    ///
    /// A forced release also bumps the fence, so the fence of the holder it
    /// dispossessed is stale at once: its late fenced writes (and writes to
    /// whatever it guards with [`Condition::AtMost`]) are rejected by the fence
    /// check, not only by the owner check. This instance's own acquisition, if
    /// any, is signalled lost.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in that it is one write: dropped before its reply, the lock
    /// may or may not have been released.
    #[doc(alias = "force")]
    pub async fn release_by_force(&self) -> Result<bool, LockError> {
        let cfg = self.inner.config();
        let w = Write::new(Condition::Free.negate(), Mutation::new().release().bump_fence());
        let out = cfg.store.write(&cfg.coll, &self.inner.key, &w).await?;
        if let Some(kept) = self.inner.current.get() {
            kept.mark_lost("released by force");
        }
        if out.is_applied() {
            Metrics::bump(&cfg.metrics.steals);
            tracing::warn!(key = %self.inner.key, "lock released by force");
        }
        Ok(out.is_applied())
    }

    /// Whether anyone holds the lock now (store clock). Look before you leap: this
    /// says nothing about whether a later acquire will succeed.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn locked(&self) -> Result<bool, LockError> {
        Ok(self.get_current().await?.is_some())
    }

    /// Whether this instance holds the lock now (store clock).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn owned(&self) -> Result<bool, LockError> {
        Ok(self.get_current().await?.is_some_and(|h| self.inner.config().identity.is_mine(&h.owner)))
    }

    /// The live holder, regardless of which instance it is.
    /// [`LockError::Foreign`] for another program's lock document.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn get_current(&self) -> Result<Option<LockInfo>, LockError> {
        let snap = self.inner.config().store.get(&self.inner.config().coll, &self.inner.key).await?;
        check_native(&self.inner.key, snap.record.as_ref())?;
        Ok(snap.record.as_ref().and_then(|r| LockInfo::from_record(r, Some(snap.now))))
    }

    /// Renews this instance's current acquisition; returns the new expiry.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`LockGuard::touch`](crate::LockGuard::touch).
    pub async fn touch(&self) -> Result<StoreTime, LockError> {
        match self.inner.current.get() {
            Some(kept) => kept.renew().await,
            None => Err(LockError::NotHeld { key: self.inner.key_string() }),
        }
    }

    /// Renews this instance's current acquisition as the keeper does
    /// ([`LockGuard::renew`](crate::LockGuard::renew): transient failures retried
    /// until confirmed or lost); returns the new expiry.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in effect, as [`LockGuard::renew`](crate::LockGuard::renew).
    pub async fn renew(&self) -> Result<StoreTime, LockError> {
        match self.inner.current.get() {
            Some(kept) => crate::keeper::renew_with_retries(&kept).await,
            None => Err(LockError::NotHeld { key: self.inner.key_string() }),
        }
    }

    /// A status report (one round trip).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn status(&self) -> Result<LockStatus, LockError> {
        let snap = self.inner.config().store.get(&self.inner.config().coll, &self.inner.key).await?;
        check_native(&self.inner.key, snap.record.as_ref())?;
        let holder = snap.record.as_ref().and_then(|r| LockInfo::from_record(r, Some(snap.now)));
        Ok(LockStatus {
            key: self.inner.key_string(),
            now: snap.now,
            owned: holder.as_ref().is_some_and(|h| self.inner.config().identity.is_mine(&h.owner)),
            holder,
            last_fence: snap.record.as_ref().map_or(0, Record::fence),
            metrics: self.metrics(),
        })
    }

    /// The client clock minus the store clock, in milliseconds: the Python `MongoLocker`'s
    /// `timeparanoid` check, for diagnostics only. Leases never depend on it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn clock_offset_ms(&self) -> Result<i64, LockError> {
        let before = self.inner.config().clock.now().as_millis();
        let server = self.inner.config().store.now().await?.as_millis();
        let after = self.inner.config().clock.now().as_millis();
        Ok(before + (after - before) / 2 - server)
    }

    /// The counters.
    pub fn metrics(&self) -> LockMetrics {
        self.inner.leases.metrics()
    }
}
