//! One acquisition: the guard the caller holds, and the keeper task that renews
//! the lease and raises the lost-lock signal in time.
//!
//! The keeper follows the periodic-executor design: it sleeps until the next
//! renewal or until the lease could lapse, wakes early on demand (`renew_now`,
//! `touch`), stops promptly when the guard is released or dropped, and never
//! wakes in between.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use store_trait::{Condition, Key, Mutation, Record, Store, StoreTime, Write, WriteOutcome};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lock::{spawn_with_deadline, LockInner, Metrics};
use crate::{LockError, LockInfo};

#[derive(Debug)]
struct TermState {
    /// The local instant by which the lease must be confirmed again: the send time
    /// of the last confirmed grant plus ttl minus the safety margin. The lease
    /// cannot lapse on the server before it (it was granted after we sent).
    deadline: Instant,
    /// The last confirmed expiry on the store clock.
    expires: StoreTime,
}

/// One acquisition of a lock.
#[derive(Debug)]
pub(crate) struct Term<S> {
    lock: Arc<LockInner<S>>,
    owner: String,
    token: u64,
    since: StoreTime,
    state: Arc<Mutex<TermState>>,
    lost: CancellationToken,
    stop: CancellationToken,
    wake: Notify,
    released: AtomicBool,
    /// Set once by the first report of loss.
    lost_marked: AtomicBool,
}

impl<S: Store + Clone> Term<S> {
    /// Starts the keeper for a fresh acquisition (`record` as granted, the request
    /// sent at `sent`) and returns its guard.
    pub(crate) fn start(
        lock: Arc<LockInner<S>>,
        owner: String,
        record: &Record,
        sent: Instant,
        auto_renew: bool,
    ) -> LockGuard<S> {
        let lease = record.lease();
        let term = Arc::new(Term {
            owner,
            token: record.fence(),
            since: lease.map_or_else(StoreTime::default, |l| l.since),
            state: Arc::new(Mutex::new(TermState {
                deadline: sent + lock.ttl.as_duration() - lock.margin,
                expires: lease.map_or_else(StoreTime::default, |l| l.until),
            })),
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
            wake: Notify::new(),
            released: AtomicBool::new(false),
            lost_marked: AtomicBool::new(false),
            lock,
        });
        Metrics::bump(&term.lock.metrics.acquisitions);
        tracing::info!(key = %term.lock.key, owner = %term.owner, token = term.token, auto_renew, "lock acquired");
        term.lock.set_current(Some(&term));
        tokio::spawn(keeper(term.clone(), auto_renew));
        LockGuard { term }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TermState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deadline(&self) -> Instant {
        self.state().deadline
    }

    fn lost_error(&self, current: Option<&Record>) -> LockError {
        LockError::Lost {
            key: self.lock.key_string(),
            token: self.token,
            current: current.and_then(|r| LockInfo::from_record(r, None)).map(Box::new),
        }
    }

    fn fenced(&self) -> Condition {
        Condition::OwnedBy(self.owner.clone()).and(Condition::FenceIs(self.token))
    }

    /// Marks the acquisition lost (once): fires the signal, counts, logs.
    pub(crate) fn mark_lost(&self, why: &str) {
        // Once, even when two paths find the loss at the same moment; counted and
        // logged before the signal fires, so whoever wakes on it sees the count.
        if self.lost.is_cancelled() || self.lost_marked.swap(true, Ordering::SeqCst) {
            return;
        }
        if !self.released.load(Ordering::SeqCst) {
            Metrics::bump(&self.lock.metrics.losses);
            tracing::warn!(key = %self.lock.key, owner = %self.owner, token = self.token, why, "lock lost");
        }
        self.lost.cancel();
        self.clear_current();
    }

    fn clear_current(&self) {
        if self.lock.current_term().is_some_and(|t| std::ptr::eq(Arc::as_ptr(&t), self)) {
            self.lock.set_current(None);
        }
    }

    /// Renews the lease once; returns the new expiry. The call may not outlive the
    /// point where the lease could lapse: then the lock is reported lost.
    pub(crate) async fn renew(&self) -> Result<StoreTime, LockError> {
        if self.lost.is_cancelled() || self.released.load(Ordering::SeqCst) {
            return Err(self.lost_error(None));
        }
        let lock = &self.lock;
        let write = Write::new(
            Condition::HeldBy(self.owner.clone()).and(Condition::FenceIs(self.token)),
            Mutation::new().grant(self.owner.clone(), lock.ttl),
        );
        let sent = Instant::now();
        let (store, coll, key) = (lock.store.clone(), lock.coll.clone(), lock.key.clone());
        let result = spawn_with_deadline(self.deadline(), async move { store.write(&coll, &key, &write).await });
        match result.await {
            None => {
                self.mark_lost("renewal not confirmed before the lease could lapse");
                Err(self.lost_error(None))
            }
            Some(Ok(WriteOutcome::Applied(r))) => {
                let until = r.lease().map_or_else(StoreTime::default, |l| l.until);
                let mut st = self.state();
                st.deadline = st.deadline.max(sent + lock.ttl.as_duration() - lock.margin);
                st.expires = until;
                drop(st);
                tracing::debug!(key = %lock.key, token = self.token, expires = %until, "lock renewed");
                Ok(until)
            }
            Some(Ok(WriteOutcome::Rejected(current))) => {
                self.mark_lost("renewal rejected: the lease lapsed or was taken");
                Err(self.lost_error(current.as_ref()))
            }
            Some(Err(e)) => Err(e.into()),
        }
    }

    /// Releases the lease if this acquisition still holds it.
    /// Releases the lease, applying `changes` in the same fenced write.
    pub(crate) async fn release(&self, changes: Mutation) -> Result<Record, LockError> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Err(LockError::NotHeld { key: self.lock.key_string() });
        }
        self.stop.cancel();
        // Work done under the lock stops: it is no longer held.
        self.lost.cancel();
        self.clear_current();
        let lock = &self.lock;
        let write = Write::new(self.fenced(), changes.release());
        let mut attempt = 0;
        loop {
            attempt += 1;
            match lock.store.write(&lock.coll, &lock.key, &write).await {
                Ok(WriteOutcome::Applied(r)) => {
                    tracing::info!(key = %lock.key, owner = %self.owner, token = self.token, "lock released");
                    return Ok(r);
                }
                // An earlier attempt that reported an error was applied after all.
                Ok(WriteOutcome::Rejected(Some(r)))
                    if r.lease().is_none() && r.fence() == self.token && attempt > 1 =>
                {
                    return Ok(r);
                }
                Ok(WriteOutcome::Rejected(current)) => {
                    self.lost.cancel();
                    return Err(self.lost_error(current.as_ref()));
                }
                Err(e) if e.is_retryable() && attempt < 4 => {
                    tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Best-effort release in the background (drop, or after a loss).
    fn release_in_background(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let lock = &self.lock;
        let (store, coll, key) = (lock.store.clone(), lock.coll.clone(), lock.key.clone());
        let write = Write::new(self.fenced(), Mutation::new().release());
        let (owner, token) = (self.owner.clone(), self.token);
        rt.spawn(async move {
            match store.write(&coll, &key, &write).await {
                Ok(o) if o.is_applied() => tracing::info!(%key, owner, token, "lock released in the background"),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(%key, owner, token, error = %e, "background release failed; the lease will lapse")
                }
            }
        });
    }
}

/// Renews until the guard goes away or the lease is lost.
async fn keeper<S: Store + Clone>(term: Arc<Term<S>>, auto_renew: bool) {
    let every = term.lock.renew_every;
    let mut next_renew = Instant::now() + every;
    loop {
        let deadline = term.deadline();
        let renew_due = tokio::select! {
            biased;
            _ = term.stop.cancelled() => return,
            _ = term.lost.cancelled() => break,
            _ = tokio::time::sleep_until(deadline) => {
                if term.deadline() <= Instant::now() {
                    term.mark_lost("lease not renewed before it could lapse");
                    break;
                }
                false
            }
            _ = tokio::time::sleep_until(next_renew), if auto_renew => true,
            _ = term.wake.notified() => auto_renew,
        };
        if renew_due {
            renew_with_retries(&term).await;
            next_renew = Instant::now() + every;
        }
    }
    // Lost: if the server still counts our lease, free it for others now rather
    // than at expiry.
    if !term.stop.is_cancelled() {
        term.release_in_background();
    }
}

async fn renew_with_retries<S: Store + Clone>(term: &Term<S>) {
    let lock = &term.lock;
    let mut backoff = (lock.renew_every / 20).max(Duration::from_millis(5));
    loop {
        match term.renew().await {
            Ok(_) | Err(LockError::Lost { .. }) => return,
            Err(e) => {
                Metrics::bump(&lock.metrics.renew_failures);
                tracing::warn!(key = %lock.key, token = term.token, error = %e, "lock renewal failed");
                if !e.is_retryable() {
                    term.mark_lost("renewal failed permanently");
                    return;
                }
                let now = Instant::now();
                let deadline = term.deadline();
                if now >= deadline {
                    term.mark_lost("lease not renewed before it could lapse");
                    return;
                }
                let jitter = Duration::from_millis(fastrand::u64(0..=backoff.as_millis().min(50) as u64));
                let pause = (backoff + jitter).min(deadline - now);
                tokio::select! {
                    _ = term.stop.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                backoff = (backoff * 2).min(lock.renew_every / 2);
            }
        }
    }
}

/// Whether an acquisition still holds its lock, readable without the guard.
#[derive(Debug, Clone)]
pub struct Validity {
    lost: CancellationToken,
    state: Arc<Mutex<TermState>>,
}

impl Validity {
    /// True once the lock was lost, released, or its safety deadline passed.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || Instant::now() >= self.deadline()
    }

    fn deadline(&self) -> Instant {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).deadline
    }

    /// Waits until at most `within` of confirmed time is left on the lease (the
    /// local deadline, the send time of the last confirmed renewal plus ttl minus
    /// the safety margin, is `within` away or closer), or until the lock is lost or
    /// released. A renewal confirmed meanwhile moves the deadline on: the wait then
    /// goes on. With `within` zero it returns when the lost signal would fire.
    ///
    /// Use it to stop work in time: start a graceful stop when this returns for a
    /// grace period, and stop hard on [`LockGuard::lost`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only sleeps and reads the deadline.
    pub async fn expiring(&self, within: Duration) {
        loop {
            let deadline = self.deadline();
            let Some(at) = deadline.checked_sub(within) else { return };
            tokio::select! {
                _ = self.lost.cancelled() => return,
                _ = tokio::time::sleep_until(at) => {}
            }
            // A renewal may have moved the deadline while this slept.
            if self.deadline().saturating_duration_since(Instant::now()) <= within {
                return;
            }
        }
    }
}

/// A held lock. Release it with [`LockGuard::release`]; dropping it without
/// releasing schedules a best-effort release in the background (it never blocks or
/// panics; the lease lapses at its expiry if that release cannot reach the store).
///
/// Select on [`LockGuard::lost`] around the work the lock protects: it fires
/// *before* the lease can lapse on the server when renewal cannot be confirmed,
/// and when someone took the lock by force.
#[derive(Debug)]
pub struct LockGuard<S: Store + Clone> {
    term: Arc<Term<S>>,
}

impl<S: Store + Clone> LockGuard<S> {
    /// The fencing token: strictly greater than every earlier token of this lock.
    /// Pass it to whatever the lock protects, which should reject smaller ones.
    pub fn token(&self) -> u64 {
        self.term.token
    }

    /// The lock's key.
    pub fn key(&self) -> &Key {
        &self.term.lock.key
    }

    /// The owner string recorded in the store for this acquisition.
    pub fn owner(&self) -> &str {
        &self.term.owner
    }

    /// When this acquisition took the lock (store clock).
    pub fn since(&self) -> StoreTime {
        self.term.since
    }

    /// The last confirmed expiry (store clock).
    pub fn expires(&self) -> StoreTime {
        self.term.state().expires
    }

    /// Whether the lock has been lost (or may have lapsed). Also true as soon as
    /// the lease's safety deadline has passed, even before the keeper task has run
    /// (after the process was paused, say).
    pub fn is_lost(&self) -> bool {
        self.validity().is_lost()
    }

    /// A cheap handle that answers [`LockGuard::is_lost`] from anywhere, without the
    /// guard.
    pub fn validity(&self) -> Validity {
        Validity { lost: self.term.lost.clone(), state: self.term.state.clone() }
    }

    /// Waits until the lock is lost. Cancel-safe; use it in `select!`.
    pub async fn lost(&self) {
        self.term.lost.cancelled().await;
    }

    /// A token that is cancelled when the lock is lost, for handing to other tasks.
    /// Cancelling it yourself does not affect the lock.
    pub fn lost_token(&self) -> CancellationToken {
        self.term.lost.child_token()
    }

    /// Renews the lease now (the seed's `touch`); returns the new expiry.
    pub async fn touch(&self) -> Result<StoreTime, LockError> {
        let out = self.term.renew().await;
        self.term.wake.notify_one();
        out
    }

    /// Asks the auto-renew task to renew at once instead of at its next interval.
    pub fn renew_now(&self) {
        self.term.wake.notify_one();
    }

    /// Releases the lock. `Err(Lost)` when it was no longer held by this
    /// acquisition (nothing was changed then). Either way the lost signal fires,
    /// so work still running under [`LockGuard::lost_token`] stops.
    pub async fn release(self) -> Result<(), LockError> {
        self.term.release(Mutation::new()).await.map(drop)
    }

    /// Releases the lock and applies `changes` to its document in the same
    /// atomic write, fenced by this acquisition's token: either both happen or
    /// neither (`Err(Lost)`). The lease part of `changes` is replaced by the
    /// release. Returns the document after the write.
    pub async fn release_with(self, changes: Mutation) -> Result<Record, LockError> {
        self.term.release(changes).await
    }

    /// Applies `changes` to the lock's document while holding it, fenced by this
    /// acquisition's token and a live lease; `Err(Lost)` when no longer held. The
    /// lease part of `changes` is ignored (the lease is kept as it is).
    pub async fn write(&self, mut changes: Mutation) -> Result<Record, LockError> {
        changes.lease = store_trait::LeaseOp::Keep;
        let lock = &self.term.lock;
        let w =
            Write::new(Condition::HeldBy(self.term.owner.clone()).and(Condition::FenceIs(self.term.token)), changes);
        match lock.store.write(&lock.coll, &lock.key, &w).await? {
            WriteOutcome::Applied(r) => Ok(r),
            WriteOutcome::Rejected(current) => {
                self.term.mark_lost("a fenced write was rejected");
                Err(self.term.lost_error(current.as_ref()))
            }
        }
    }
}

impl<S: Store + Clone> Drop for LockGuard<S> {
    fn drop(&mut self) {
        self.term.stop.cancel();
        // Whatever still runs under this guard's lost token must stop: the lock is
        // being let go.
        self.term.lost.cancel();
        if !self.term.released.swap(true, Ordering::SeqCst) {
            tracing::debug!(key = %self.term.lock.key, token = self.term.token, "lock guard dropped without release");
            self.term.clear_current();
            self.term.release_in_background();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use store_memory::MemoryStore;
    use tokio::time::Instant;

    use crate::{Acquire, Lock};

    /// `expiring` waits while renewals keep the deadline ahead, returns `within`
    /// before the deadline once renewals stop being confirmed, and at once after a
    /// loss.
    #[tokio::test(start_paused = true)]
    async fn expiring_follows_the_confirmed_deadline() {
        let store = MemoryStore::new();
        let ttl = Duration::from_secs(3);
        let lock = Lock::builder(store.clone(), "k").ttl(ttl).build().unwrap();
        let guard = lock.acquire_with(Acquire::new().auto_renew()).await.unwrap();
        let validity = guard.validity();
        let within = Duration::from_millis(500);
        // Renewals every second keep 1.8 s to 2.7 s of confirmed time: no wake.
        let early = tokio::time::timeout(Duration::from_secs(10), validity.expiring(within)).await;
        assert!(early.is_err(), "renewals move the deadline on");
        assert!(!guard.is_lost());
        // Renewals fail from now on: the deadline stays where the last one put it.
        store.faults().set_unreachable(true);
        let start = Instant::now();
        validity.expiring(within).await;
        let waited = start.elapsed();
        assert!(!guard.is_lost(), "it returns before the loss");
        assert!(waited <= ttl - Duration::from_millis(300) - within, "{waited:?}");
        tokio::time::timeout(within + Duration::from_millis(10), guard.lost()).await.unwrap();
        assert!(guard.is_lost());
        // Lost: it returns at once, whatever `within`.
        tokio::time::timeout(Duration::from_millis(1), validity.expiring(Duration::ZERO)).await.unwrap();
    }
}
