//! The lock handle: configuration, acquisition and the `MongoLocker` operations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use store_trait::{
    Clock, Collection, Condition, Key, Mutation, Record, Store, StoreError, StoreTime, SystemClock, Ttl, Write,
};
use tokio::time::Instant;

use crate::guard::LockGuard;
use crate::info::{check_native, LockInfo, LockMetrics, LockStatus, Metrics};
use crate::term::Term;
use crate::timing::check_interval;
use crate::{Identity, LeaseTiming, LockError};

/// The collection locks live in unless configured otherwise (as in `MongoLocker`).
pub const DEFAULT_COLLECTION: &str = "mongolocker";
/// The lease length unless configured otherwise (as in `MongoLocker`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
/// The poll interval of a waiter when change notifications are unavailable.
pub const DEFAULT_STEP: Duration = Duration::from_millis(250);

/// Configures a [`Lock`].
#[derive(Debug)]
pub struct LockBuilder<S> {
    store: S,
    key: Result<Key, StoreError>,
    collection: String,
    ttl: Duration,
    step: Duration,
    renew_every: Option<Duration>,
    margin: Option<Duration>,
    identity: Option<Identity>,
    clock: Arc<dyn Clock>,
    allow_gc: bool,
}

impl<S: Store + Clone> LockBuilder<S> {
    /// Lets writes through this lock's guards mark its document for garbage
    /// collection ([`Mutation::gc_after`]): for a task lease (a queue's claim,
    /// adopted with [`Lock::adopt`]), whose document ends with the task. Without
    /// it such a write fails with [`LockError::GcOnLock`]: a lock document
    /// never gets a `gc_at`, so no TTL index can delete it and reset its fence.
    pub fn allow_gc(mut self) -> Self {
        self.allow_gc = true;
        self
    }

    /// The collection (default [`DEFAULT_COLLECTION`]).
    pub fn collection(mut self, name: impl Into<String>) -> Self {
        self.collection = name.into();
        self
    }

    /// The lease length (default [`DEFAULT_TTL`]). If the holder neither renews nor
    /// releases within it, the lock is free for others.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The lease length in seconds, as the Python original takes it.
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
    /// (default [`DEFAULT_STEP`]).
    pub fn step(mut self, step: Duration) -> Self {
        self.step = step;
        self
    }

    /// How often auto-renew renews (default a third of the ttl). Must leave room
    /// for the safety margin below the ttl.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// How long before the lease could lapse on the server the holder is told it
    /// lost the lock, when renewal could not be confirmed (default a tenth of the
    /// ttl, between 5 ms and 2 s).
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }

    /// The identity recorded as holder (default [`Identity::current`]).
    pub fn identity(mut self, id: Identity) -> Self {
        self.identity = Some(id);
        self
    }

    /// The client's wall clock (default [`SystemClock`]). Leases never depend on
    /// it: it reports the offset to the store clock ([`Lock::clock_offset_ms`]),
    /// and a holder compares its advance with its monotonic companion
    /// ([`Clock::monotonic`]) to notice time that passed unseen (a host suspend),
    /// which it treats as a loss.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Validates the configuration.
    pub fn build(self) -> Result<Lock<S>, LockError> {
        let key = self.key.map_err(|e| LockError::Config(e.to_string()))?;
        let coll = Collection::new(self.collection).map_err(|e| LockError::Config(e.to_string()))?;
        let timing = LeaseTiming::new(self.ttl, self.renew_every, self.margin)?;
        let (ttl, renew_every, margin) = (timing.ttl(), timing.renew_every(), timing.safety_margin());
        check_interval("step", self.step)?;
        Ok(Lock {
            inner: Arc::new(LockInner {
                store: self.store,
                coll,
                key,
                ttl,
                step: self.step,
                renew_every,
                margin,
                identity: self.identity.unwrap_or_else(Identity::current),
                clock: self.clock,
                allow_gc: self.allow_gc,
                seq: AtomicU64::new(1),
                current: Mutex::new(None),
                metrics: Metrics::default(),
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

#[derive(Debug)]
pub(crate) struct LockInner<S> {
    pub(crate) store: S,
    pub(crate) coll: Collection,
    pub(crate) key: Key,
    pub(crate) ttl: Ttl,
    pub(crate) step: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) margin: Duration,
    pub(crate) identity: Identity,
    pub(crate) clock: Arc<dyn Clock>,
    /// Whether guards may mark the document for garbage collection (task leases).
    pub(crate) allow_gc: bool,
    pub(crate) seq: AtomicU64,
    /// This instance's live acquisition, for `release`, `touch` and `owned`.
    pub(crate) current: Mutex<Option<Weak<Term<S>>>>,
    pub(crate) metrics: Metrics,
}

impl<S> LockInner<S> {
    pub(crate) fn key_string(&self) -> String {
        self.key.to_string()
    }

    pub(crate) fn current_term(&self) -> Option<Arc<Term<S>>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).as_ref().and_then(Weak::upgrade)
    }

    pub(crate) fn set_current(&self, term: Option<&Arc<Term<S>>>) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = term.map(Arc::downgrade);
    }
}

/// Runs a store call on its own task, so a deadline never drops a driver future
/// half-way (the driver's own advice); the call may still complete after the
/// deadline and its result is then ignored.
pub(crate) async fn spawn_with_deadline<T: Send + 'static>(
    deadline: Instant,
    fut: impl std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Option<Result<T, StoreError>> {
    Some(on_own_task(Some(deadline), fut).await?.unwrap_or_else(|e| {
        Err(StoreError::backend(store_trait::FaultKind::Transient, format!("store call task failed: {e}")))
    }))
}

/// The one way a store call is bounded by a deadline: it runs on its own task,
/// waited for until `deadline` (when there is one); `None` when the deadline
/// passed first. The task is not cancelled, so a driver call is never dropped
/// half-way (the driver's own advice); its late result is ignored. A task that
/// failed (a panic, a runtime shutting down) is the `Err`.
pub(crate) async fn on_own_task<T: Send + 'static>(
    deadline: Option<Instant>,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<Result<T, tokio::task::JoinError>> {
    let task = tokio::spawn(fut);
    Some(match deadline {
        Some(d) => tokio::time::timeout_at(d, task).await.ok()?,
        None => task.await,
    })
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

    /// Configures a lock on a document with any key (an `ObjectId` `_id`, say).
    pub fn builder_with_key(store: S, key: Key) -> LockBuilder<S> {
        Self::builder_for(store, Ok(key))
    }

    fn builder_for(store: S, key: Result<Key, StoreError>) -> LockBuilder<S> {
        LockBuilder {
            store,
            key,
            collection: DEFAULT_COLLECTION.into(),
            ttl: DEFAULT_TTL,
            step: DEFAULT_STEP,
            renew_every: None,
            margin: None,
            identity: None,
            clock: Arc::new(SystemClock),
            allow_gc: false,
        }
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.inner.key
    }

    /// The collection.
    pub fn collection(&self) -> &Collection {
        &self.inner.coll
    }

    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl.as_duration()
    }

    /// This instance's identity.
    pub fn identity(&self) -> &Identity {
        &self.inner.identity
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// Releases this instance's current acquisition (the Python `MongoLocker`'s `release()`), or,
    /// with `force`, whoever holds the lock. Returns whether a lease was released.
    ///
    /// A forced release also bumps the fence, so the token of the holder it
    /// dispossessed is stale at once: its late fenced writes (and writes to
    /// whatever it guards with [`Condition::AtMost`]) are rejected by the fence
    /// check, not only by the owner check.
    pub async fn release(&self, force: bool) -> Result<bool, LockError> {
        if force {
            let w = Write::new(Condition::Free.negate(), Mutation::new().release().bump_fence());
            let out = self.inner.store.write(&self.inner.coll, &self.inner.key, &w).await?;
            if let Some(term) = self.inner.current_term() {
                term.mark_lost("released by force");
            }
            if out.is_applied() {
                Metrics::bump(&self.inner.metrics.steals);
                tracing::warn!(key = %self.inner.key, "lock released by force");
            }
            return Ok(out.is_applied());
        }
        match self.inner.current_term() {
            Some(term) => term.release(Mutation::new()).await.map(|_| true),
            None => Err(LockError::NotHeld { key: self.inner.key_string() }),
        }
    }

    /// Takes charge of a lease on this lock's document that was granted by another
    /// operation (a queue's claim, say): the guard renews it (with `auto_renew`),
    /// signals its loss and fences writes exactly as for an acquisition. `sent` is
    /// when the granting request was sent, on tokio's clock.
    pub fn adopt(&self, record: &Record, sent: Instant, auto_renew: bool) -> Result<LockGuard<S>, LockError> {
        if record.key() != &self.inner.key {
            return Err(LockError::Config(format!("record {} is not lock {}", record.key(), self.inner.key)));
        }
        let Some(lease) = record.lease() else {
            return Err(LockError::NotHeld { key: self.inner.key_string() });
        };
        Ok(Term::start(self.inner.clone(), lease.owner.clone(), record, sent, auto_renew))
    }

    /// Whether anyone holds the lock now (store clock). Look before you leap: this
    /// says nothing about whether a later acquire will succeed.
    pub async fn locked(&self) -> Result<bool, LockError> {
        Ok(self.get_current().await?.is_some())
    }

    /// Whether this instance holds the lock now (store clock).
    pub async fn owned(&self) -> Result<bool, LockError> {
        Ok(self.get_current().await?.is_some_and(|h| self.inner.identity.is_mine(&h.owner)))
    }

    /// The live holder, regardless of which instance it is.
    /// [`LockError::Foreign`] for another program's lock document.
    pub async fn get_current(&self) -> Result<Option<LockInfo>, LockError> {
        let snap = self.inner.store.get(&self.inner.coll, &self.inner.key).await?;
        check_native(&self.inner.key, snap.record.as_ref())?;
        Ok(snap.record.as_ref().and_then(|r| LockInfo::from_record(r, Some(snap.now))))
    }

    /// Renews this instance's current acquisition; returns the new expiry.
    pub async fn touch(&self) -> Result<StoreTime, LockError> {
        match self.inner.current_term() {
            Some(term) => term.renew().await,
            None => Err(LockError::NotHeld { key: self.inner.key_string() }),
        }
    }

    /// A status report (one round trip).
    pub async fn status(&self) -> Result<LockStatus, LockError> {
        let snap = self.inner.store.get(&self.inner.coll, &self.inner.key).await?;
        check_native(&self.inner.key, snap.record.as_ref())?;
        let holder = snap.record.as_ref().and_then(|r| LockInfo::from_record(r, Some(snap.now)));
        Ok(LockStatus {
            key: self.inner.key_string(),
            now: snap.now,
            owned: holder.as_ref().is_some_and(|h| self.inner.identity.is_mine(&h.owner)),
            holder,
            last_token: snap.record.as_ref().map_or(0, Record::fence),
            metrics: self.metrics(),
        })
    }

    /// The client clock minus the store clock, in milliseconds: the Python `MongoLocker`'s
    /// `timeparanoid` check, for diagnostics only. Leases never depend on it.
    pub async fn clock_offset_ms(&self) -> Result<i64, LockError> {
        let before = self.inner.clock.now().as_millis();
        let server = self.inner.store.now().await?.as_millis();
        let after = self.inner.clock.now().as_millis();
        Ok(before + (after - before) / 2 - server)
    }

    /// The counters.
    pub fn metrics(&self) -> LockMetrics {
        let m = &self.inner.metrics;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LockMetrics {
            acquisitions: get(&m.acquisitions),
            contention_waits: get(&m.contention_waits),
            renew_failures: get(&m.renew_failures),
            losses: get(&m.losses),
            steals: get(&m.steals),
            store_clock_jumps: get(&m.store_clock_jumps),
            local_clock_gaps: get(&m.local_clock_gaps),
        }
    }
}
