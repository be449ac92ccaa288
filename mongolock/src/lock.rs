//! The lock handle: configuration, acquisition and the `MongoLocker` operations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use store_trait::{
    Clock, Collection, Condition, Key, Mutation, Record, Store, StoreError, StoreTime, SystemClock, Ttl, Watcher,
    Write, WriteOutcome,
};
use tokio::time::Instant;

use crate::guard::{LockGuard, Term};
use crate::timing::check_interval;
use crate::{Identity, LeaseTiming, LockError};

/// The collection locks live in unless configured otherwise (as in `MongoLocker`).
pub const DEFAULT_COLLECTION: &str = "mongolocker";
/// The lease length unless configured otherwise (as in `MongoLocker`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
/// The poll interval of a waiter when change notifications are unavailable.
pub const DEFAULT_STEP: Duration = Duration::from_millis(250);

/// Data fields the lock writes beside the lease, for operators.
pub(crate) mod data {
    pub(crate) const HOST: &str = "holder_host";
    pub(crate) const PID: &str = "holder_pid";
    pub(crate) const INSTANCE: &str = "holder_instance";
}

/// The fields of a document written by the Python `MongoLocker`: a lock in
/// another program's format, never taken nor reported free
/// ([`LockError::Foreign`]).
pub const FOREIGN_LOCK_FIELDS: [&str; 3] = ["uuid", "locked", "ts_expire"];

/// The foreign lock fields `data` has (present and not null).
fn foreign_fields(data: &bson::Document) -> Vec<&'static str> {
    FOREIGN_LOCK_FIELDS.into_iter().filter(|f| data.get(f).is_some_and(|v| !matches!(v, bson::Bson::Null))).collect()
}

/// `Err(Foreign)` when `record` is another program's lock document.
fn check_native(key: &Key, record: Option<&Record>) -> Result<(), LockError> {
    match record.map(|r| foreign_fields(r.data())) {
        Some(fields) if !fields.is_empty() => Err(LockError::Foreign { key: key.to_string(), fields }),
        _ => Ok(()),
    }
}

/// Who holds a lock, since and until when (store clock), with which token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// The holder's owner string (`host/pid/instance/seq`).
    pub owner: String,
    /// The holder's host, when recorded.
    pub host: Option<String>,
    /// The holder's process id, when recorded.
    pub pid: Option<u32>,
    /// When this holder took the lock.
    pub since: StoreTime,
    /// When the lease lapses unless renewed.
    pub expires: StoreTime,
    /// The fencing token of this acquisition.
    pub token: u64,
}

impl LockInfo {
    /// The holder of `record` at store time `now`, if its lease is live; with `now`
    /// `None`, the last lease recorded, live or not.
    pub fn from_record(record: &Record, now: Option<StoreTime>) -> Option<LockInfo> {
        let lease = match now {
            Some(now) => record.holder_at(now)?,
            None => record.lease()?,
        };
        let d = record.data();
        Some(LockInfo {
            owner: lease.owner.clone(),
            host: d.get_str(data::HOST).ok().map(str::to_owned),
            pid: d.get(data::PID).and_then(store_trait::semantics::as_i64).and_then(|p| u32::try_from(p).ok()),
            since: lease.since,
            expires: lease.until,
            token: record.fence(),
        })
    }
}

/// How to acquire: blocking or not, with a timeout, by force, with auto-renew.
///
/// ```
/// use mongolock::Acquire;
/// use std::time::Duration;
///
/// let opts = Acquire::new().timeout(Duration::from_secs(30)).auto_renew();
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquire {
    pub(crate) blocking: bool,
    pub(crate) timeout: Option<Duration>,
    pub(crate) force: bool,
    pub(crate) auto_renew: bool,
}

impl Default for Acquire {
    fn default() -> Self {
        Acquire { blocking: true, timeout: None, force: false, auto_renew: false }
    }
}

impl Acquire {
    /// Block until acquired (the default).
    pub fn new() -> Self {
        Self::default()
    }

    /// Try once; fail with [`LockError::Held`] when held.
    pub fn try_once() -> Self {
        Acquire { blocking: false, ..Self::default() }
    }

    /// Give up after `d` with [`LockError::Timeout`].
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// CAUTION: take the lock even if someone holds it. The previous holder's token
    /// becomes stale; its renewals and fenced writes are rejected from now on.
    pub fn force(mut self) -> Self {
        self.force = true;
        self
    }

    /// Renew the lease in the background until the guard is released or dropped.
    pub fn auto_renew(mut self) -> Self {
        self.auto_renew = true;
        self
    }

    /// A timeout on a single try means nothing: reject it rather than ignore it.
    pub(crate) fn check(&self) -> Result<(), LockError> {
        if !self.blocking && self.timeout.is_some() {
            return Err(LockError::Config("a single try (`Acquire::try_once`) takes no timeout".into()));
        }
        Ok(())
    }
}

/// Counters a user can read, shared by all clones of a [`Lock`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockMetrics {
    /// Successful acquisitions.
    pub acquisitions: u64,
    /// Acquisitions that had to wait for another holder.
    pub contention_waits: u64,
    /// Renewals that failed with a store error (and were retried).
    pub renew_failures: u64,
    /// Acquisitions that ended lost instead of released.
    pub losses: u64,
    /// Forced acquisitions and releases.
    pub steals: u64,
    /// Losses reported because the store clock jumped ahead of the local
    /// monotonic clock between two confirmed grants (an NTP step on the server, a
    /// failover to a member whose clock is ahead, a clock running fast).
    pub store_clock_jumps: u64,
    /// Losses reported because the client's wall clock advanced beyond its
    /// monotonic companion: time passed unseen (a host suspend), or the wall clock
    /// was stepped forward.
    pub local_clock_gaps: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) acquisitions: AtomicU64,
    pub(crate) contention_waits: AtomicU64,
    pub(crate) renew_failures: AtomicU64,
    pub(crate) losses: AtomicU64,
    pub(crate) steals: AtomicU64,
    pub(crate) store_clock_jumps: AtomicU64,
    pub(crate) local_clock_gaps: AtomicU64,
}

impl Metrics {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A status report: the Python `MongoLocker`'s `status`, plus diagnostics.
#[derive(Debug, Clone, PartialEq)]
pub struct LockStatus {
    /// The lock's key.
    pub key: String,
    /// The store's time when read.
    pub now: StoreTime,
    /// The live holder, if any.
    pub holder: Option<LockInfo>,
    /// Whether this instance holds it.
    pub owned: bool,
    /// The largest token granted so far.
    pub last_token: u64,
    /// Counters.
    pub metrics: LockMetrics,
}

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
        let d = if secs.is_finite() && secs > 0.0 { Duration::from_secs_f64(secs.min(1e12)) } else { Duration::ZERO };
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
    let joined = tokio::time::timeout_at(deadline, tokio::spawn(fut)).await.ok()?;
    Some(joined.unwrap_or_else(|e| {
        Err(StoreError::backend(store_trait::FaultKind::Transient, format!("store call task failed: {e}")))
    }))
}

/// Runs `fut` on its own task and waits for it until `deadline` (when there is
/// one): `None` when the deadline passed first. The task is not cancelled, so a
/// store call is never dropped half-way; its late result is ignored.
async fn within<T: Send + 'static>(
    deadline: Option<Instant>,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<T> {
    let task = tokio::spawn(fut);
    let joined = match deadline {
        Some(d) => tokio::time::timeout_at(d, task).await.ok()?,
        None => task.await,
    };
    match joined {
        Ok(v) => Some(v),
        // The task panicked or the runtime is shutting down: resume the panic,
        // as awaiting the future in place would have.
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => None,
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

    /// Blocks until acquired.
    pub async fn acquire(&self) -> Result<LockGuard<S>, LockError> {
        self.acquire_with(Acquire::new()).await
    }

    /// Tries once: `Ok(None)` when someone else holds it.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard<S>>, LockError> {
        match self.acquire_with(Acquire::try_once()).await {
            Ok(g) => Ok(Some(g)),
            Err(LockError::Held { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Blocks for at most `timeout`.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard<S>, LockError> {
        self.acquire_with(Acquire::new().timeout(timeout)).await
    }

    /// Acquires as `opts` says. A waiter subscribes to change notifications for
    /// the key first, then tries; it wakes when the holder releases (a change
    /// event) or when the observed lease expires on the store clock, and only polls
    /// every `step` when the store has no change notifications.
    ///
    /// With a timeout, no store call inside outlives it: each runs on its own task
    /// and is waited for until the deadline at most, so a store that does not
    /// answer (a black-holed primary) ends the wait with [`LockError::Timeout`]
    /// on time. An attempt still in flight then may still be granted; its guard is
    /// dropped, which releases it.
    #[tracing::instrument(level = "debug", skip(self), fields(key = %self.inner.key))]
    pub async fn acquire_with(&self, opts: Acquire) -> Result<LockGuard<S>, LockError> {
        let start = Instant::now();
        opts.check()?;
        // A timeout too large for the clock is no timeout at all.
        let deadline = opts.timeout.and_then(|t| start.checked_add(t));
        let inner = &self.inner;
        let timed_out = |holder: Option<Box<LockInfo>>| LockError::Timeout {
            key: inner.key_string(),
            waited: start.elapsed(),
            holder,
        };
        // Subscribed before the first try, so a release after it is not missed;
        // renewals of the holder's lease wake nobody.
        let mut events = if opts.blocking {
            let open = Watcher::open(inner.store.clone(), inner.coll.clone(), Some(inner.key.clone()), inner.step);
            let Some(w) = within(deadline, open).await else { return Err(timed_out(None)) };
            if !w.is_live() {
                tracing::debug!("no change notifications; waiters poll every step");
            }
            Some(w.ignore_renewals())
        } else {
            None
        };
        let mut waited = false;
        let mut backoff = Duration::from_millis(10);
        // The holder last seen, for the timeout error.
        let mut seen: Option<Box<LockInfo>> = None;
        loop {
            // An attempt started past the deadline could only be abandoned (and a
            // grant it got released again).
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timed_out(seen));
            }
            let Some(attempt) = within(deadline, self.try_once(&opts)).await else { return Err(timed_out(seen)) };
            let err = match attempt {
                Ok(guard) => {
                    if waited {
                        Metrics::bump(&inner.metrics.contention_waits);
                    }
                    return Ok(guard);
                }
                Err(e) => e,
            };
            if !opts.blocking {
                return Err(err);
            }
            let holder = match &err {
                LockError::Held { holder, .. } => Some(holder.clone()),
                LockError::Store(e) if e.is_retryable() => None,
                _ => return Err(err),
            };
            if holder.is_some() {
                seen.clone_from(&holder);
            }
            let wait = match &holder {
                Some(h) => {
                    // Sleep until the observed lease expires on the store clock (a
                    // crashed holder), unless a change notification comes first.
                    let store = inner.store.clone();
                    let remaining = match within(deadline, async move { store.now().await }).await {
                        Some(Ok(now)) => now.until(h.expires),
                        Some(Err(_)) | None => inner.step,
                    };
                    let jitter = Duration::from_millis(fastrand::u64(0..=5));
                    if events.as_ref().is_some_and(Watcher::is_live) {
                        remaining + jitter
                    } else {
                        remaining.min(inner.step) + jitter
                    }
                }
                None => {
                    backoff = (backoff * 2).min(inner.step.max(Duration::from_millis(20)));
                    backoff
                }
            };
            let mut wait_until = Instant::now() + wait.max(Duration::from_millis(1));
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Err(timed_out(holder.or(seen)));
                }
                wait_until = wait_until.min(d);
            }
            waited = true;
            match events.as_mut() {
                Some(w) => tokio::select! {
                    _ = tokio::time::sleep_until(wait_until) => {}
                    _ = w.changed() => {
                        // Spread a herd of woken waiters a little.
                        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..=3))).await;
                    }
                },
                None => tokio::time::sleep_until(wait_until).await,
            }
        }
    }

    /// One acquisition attempt: one conditional write. The attempt runs on its own
    /// task and builds its guard there, so a caller that stops waiting (a dropped
    /// `acquire` future, a `select!`, a deadline) never leaves a granted lease
    /// without a guard: an orphaned guard is dropped, which releases it.
    fn try_once(&self, opts: &Acquire) -> impl std::future::Future<Output = Result<LockGuard<S>, LockError>> + 'static {
        let this = self.clone();
        let opts = opts.clone();
        let task = tokio::spawn(async move { this.attempt(&opts).await });
        async move {
            task.await.unwrap_or_else(|e| {
                Err(LockError::Store(StoreError::backend(
                    store_trait::FaultKind::Transient,
                    format!("acquire task failed: {e}"),
                )))
            })
        }
    }

    async fn attempt(&self, opts: &Acquire) -> Result<LockGuard<S>, LockError> {
        let inner = &self.inner;
        let owner = inner.identity.owner(inner.seq.fetch_add(1, Ordering::Relaxed));
        let condition = if opts.force { Condition::Always } else { Condition::Free };
        // Never over another program's lock document, not even by force: it has
        // no lease we can read, and that program may delete it (and our fence).
        let condition =
            FOREIGN_LOCK_FIELDS.iter().fold(condition, |c, f| c.and(Condition::Exists((*f).into()).negate()));
        let mutation = Mutation::new()
            .grant(owner.clone(), inner.ttl)
            .bump_fence()
            .set(data::HOST, inner.identity.host())
            .set(data::PID, i64::from(inner.identity.pid()))
            .set(data::INSTANCE, inner.identity.instance());
        let write = Write::new(condition, mutation).upsert();
        let sent = Instant::now();
        let record = match inner.store.write(&inner.coll, &inner.key, &write).await {
            Ok(WriteOutcome::Applied(r)) => r,
            Ok(WriteOutcome::Rejected(current)) => {
                check_native(&inner.key, current.as_ref())?;
                let holder = current.as_ref().and_then(|r| LockInfo::from_record(r, None));
                return Err(match holder {
                    Some(h) => LockError::Held { key: inner.key_string(), holder: Box::new(h) },
                    // Rejected with no holder only happens in a race with a release or
                    // a delete: the caller simply tries again.
                    None => LockError::Store(StoreError::backend(
                        store_trait::FaultKind::Transient,
                        "lock changed during acquire",
                    )),
                });
            }
            Err(e) if e.is_ambiguous() => match self.read_back(&owner).await {
                Some(r) => r,
                None => return Err(e.into()),
            },
            Err(e) => return Err(e.into()),
        };
        if opts.force {
            Metrics::bump(&inner.metrics.steals);
            tracing::warn!(key = %inner.key, owner, token = record.fence(), "lock taken by force");
        }
        Ok(Term::start(self.inner.clone(), owner, &record, sent, opts.auto_renew))
    }

    /// After an ambiguous failure, finds out whether attempt `owner` got the lock.
    /// If not, a late application of that attempt is released in the background.
    async fn read_back(&self, owner: &str) -> Option<Record> {
        let inner = &self.inner;
        let snap = inner.store.get(&inner.coll, &inner.key).await.ok();
        if let Some(r) = snap.and_then(|s| s.record) {
            if r.lease().is_some_and(|l| l.owner == owner) {
                tracing::info!(key = %inner.key, owner, "acquire reported an error but was applied");
                return Some(r);
            }
        }
        let (store, coll, key) = (inner.store.clone(), inner.coll.clone(), inner.key.clone());
        let release = Write::new(Condition::OwnedBy(owner.to_owned()), Mutation::new().release());
        tokio::spawn(async move { store.write(&coll, &key, &release).await });
        None
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
