//! Acquiring: the options, the wait (woken by change notifications and by the
//! observed expiry), and the one conditional write of each attempt.

use std::time::Duration;

use store_trait::helpers::Watcher;
use store_trait::{ChangeFilter, Condition, Mutation, Record, Store, StoreError, Write, WriteOutcome};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::bounded::on_own_task;
use crate::error::{check_native, LockError};
use crate::guard::LockGuard;
use crate::info::{data, LockInfo, Metrics, FOREIGN_LOCK_FIELDS};
use crate::lock::Lock;

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
    #[must_use]
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// CAUTION: take the lock even if someone holds it. The previous holder's fence
    /// becomes stale; its renewals and fenced writes are rejected from now on.
    #[must_use]
    pub fn force(mut self) -> Self {
        self.force = true;
        self
    }

    /// Renew the lease in the background until the guard is released or dropped.
    #[must_use]
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

/// [`on_own_task`] for the acquire path: `None` when the deadline passed first.
async fn within<T: Send + 'static>(
    deadline: Option<Instant>,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<T> {
    match on_own_task(deadline, fut).await? {
        Ok(v) => Some(v),
        // The task panicked or the runtime is shutting down: resume the panic,
        // as awaiting the future in place would have.
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => None,
    }
}

impl<S: Store + Clone> Lock<S> {
    /// Blocks until acquired.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the attempt runs on its own task and builds its guard there;
    /// a lease granted to an attempt whose caller stopped waiting is released
    /// again (its orphaned guard is dropped).
    pub async fn acquire(&self) -> Result<LockGuard<S>, LockError> {
        self.acquire_with(Acquire::new()).await
    }

    /// Tries once: `Ok(None)` when someone else holds it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`Lock::acquire`].
    pub async fn try_acquire(&self) -> Result<Option<LockGuard<S>>, LockError> {
        match self.acquire_with(Acquire::try_once()).await {
            Ok(g) => Ok(Some(g)),
            Err(LockError::Held { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Blocks for at most `timeout`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`Lock::acquire`].
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard<S>, LockError> {
        self.acquire_with(Acquire::new().timeout(timeout)).await
    }

    /// Acquires as `opts` says. A waiter subscribes to change notifications for
    /// the key first, then tries; it wakes when the holder releases (a change
    /// event) or when the observed lease expires on the store clock, and only polls
    /// every `poll_interval` when the store has no change notifications.
    ///
    /// With a timeout, no store call inside outlives it: each runs on its own task
    /// and is waited for until the deadline at most, so a store that does not
    /// answer (a black-holed primary) ends the wait with [`LockError::Timeout`]
    /// on time. An attempt still in flight then may still be granted; its guard is
    /// dropped, which releases it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`Lock::acquire`]: dropped at any point, it leaves no
    /// lease without a guard.
    #[tracing::instrument(level = "debug", skip(self), fields(key = %self.inner.key))]
    pub async fn acquire_with(&self, opts: Acquire) -> Result<LockGuard<S>, LockError> {
        let start = Instant::now();
        opts.check()?;
        // A timeout too large for the clock is no timeout at all.
        let deadline = opts.timeout.and_then(|t| start.checked_add(t));
        let inner = &self.inner;
        let cfg = inner.config();
        let timed_out = |holder: Option<Box<LockInfo>>| LockError::Timeout {
            key: inner.key_string(),
            waited: start.elapsed(),
            holder,
        };
        // Subscribed before the first try, so a release after it is not missed;
        // renewals of the holder's lease wake nobody: the server keeps them
        // back (an idle waiter's `getMore` stays unanswered while the holder
        // renews), and a backend that cannot is filtered here.
        let mut events = if opts.blocking {
            let open = Watcher::open_filtered(
                cfg.store.clone(),
                cfg.coll.clone(),
                ChangeFilter::lease_changes(),
                inner.poll_interval,
            );
            let Some(w) = within(deadline, open).await else { return Err(timed_out(None)) };
            let w = w.only(inner.key.clone());
            if !w.is_live() {
                tracing::debug!("no change notifications; waiters poll every poll interval");
            }
            Some(w.ignore_renewals())
        } else {
            None
        };
        let mut waited = false;
        let mut backoff = Backoff::new(Duration::from_millis(20), inner.poll_interval.max(Duration::from_millis(20)));
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
                        Metrics::bump(&cfg.metrics.contention_waits);
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
                    let store = cfg.store.clone();
                    let remaining = match within(deadline, async move { store.now().await }).await {
                        Some(Ok(now)) => now.until(h.expires),
                        Some(Err(_)) | None => inner.poll_interval,
                    };
                    let jitter = Duration::from_millis(fastrand::u64(0..=5));
                    if events.as_ref().is_some_and(Watcher::is_live) {
                        remaining + jitter
                    } else {
                        remaining.min(inner.poll_interval) + jitter
                    }
                }
                None => backoff.next_delay(),
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
                // Woken, a waiter tries at once: a handover's time is the
                // release, the notification and this one write. Waiters
                // woken together race in conditional writes the server
                // serialises, and the losers read `Held`; a pause to spread
                // them would add its length to every handover without
                // saving a write.
                Some(w) => tokio::select! {
                    _ = tokio::time::sleep_until(wait_until) => {}
                    _ = w.changed() => {}
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
        let cfg = inner.config();
        let owner = inner.next_owner();
        let condition = if opts.force { Condition::Always } else { Condition::Free };
        // Never over another program's lock document, not even by force: it has
        // no lease we can read, and that program may delete it (and our fence).
        let condition =
            FOREIGN_LOCK_FIELDS.iter().fold(condition, |c, f| c.and(Condition::Exists((*f).into()).negate()));
        let mutation = Mutation::new()
            .grant(owner.clone(), cfg.ttl)
            .bump_fence()
            .set(data::HOST, cfg.identity.host())
            .set(data::PID, i64::from(cfg.identity.pid()))
            .set(data::INSTANCE, cfg.identity.instance());
        let write = Write::new(condition, mutation).upsert();
        let sent = Instant::now();
        let record = match cfg.store.write(&cfg.coll, &inner.key, &write).await {
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
            Metrics::bump(&cfg.metrics.steals);
            tracing::warn!(key = %inner.key, owner, fence = record.fence(), "lock taken by force");
        }
        inner.leases.start(&record, sent, opts.auto_renew, Some(inner.current.clone()))
    }

    /// After an ambiguous failure, finds out whether attempt `owner` got the lock.
    /// If not, a late application of that attempt is released in the background.
    async fn read_back(&self, owner: &str) -> Option<Record> {
        let inner = &self.inner;
        let cfg = inner.config();
        let snap = cfg.store.get(&cfg.coll, &inner.key).await.ok();
        if let Some(r) = snap.and_then(|s| s.record) {
            if r.lease().is_some_and(|l| l.owner == owner) {
                tracing::info!(key = %inner.key, owner, "acquire reported an error but was applied");
                return Some(r);
            }
        }
        let (store, coll, key) = (cfg.store.clone(), cfg.coll.clone(), inner.key.clone());
        let release = Write::new(Condition::OwnedBy(owner.to_owned()), Mutation::new().release());
        tokio::spawn(async move { store.write(&coll, &key, &release).await });
        None
    }
}
