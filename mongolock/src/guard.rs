//! One acquisition: the guard the caller holds, and the keeper task that renews
//! the lease and raises the lost-lock signal in time.
//!
//! The keeper follows the periodic-executor design: it sleeps until the next
//! renewal or until the lease could lapse, wakes early on demand (`renew_now`,
//! `touch`), stops promptly when the guard is released or dropped, and never
//! wakes in between.
//!
//! Two clock checks guard the lost signal's promise (see the crate docs,
//! "Clocks"): every confirmed grant compares how far the store clock advanced
//! with how far tokio's monotonic clock did (a store clock that jumped ahead ends
//! leases early), and every keeper wake-up compares the client's wall clock with
//! its monotonic companion (time the monotonic clock did not see, a host
//! suspend, moved the lease's end closer unnoticed). Either, beyond its
//! tolerance, is treated as a loss.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use store_trait::{Clock, Condition, Key, Mutation, Nonce, Record, Store, StoreTime, Write, WriteOutcome};
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
    /// The last confirmed grant: the reference of both clock checks.
    confirmed: Confirmed,
    /// The client clock, read for the unseen-time check.
    clock: Arc<dyn Clock>,
    /// How much unseen time since the last confirmed send is tolerated: half the
    /// safety margin, so the other half still covers scheduling delays.
    gap_limit: Duration,
}

impl TermState {
    /// Time that passed since the last confirmed send without the monotonic
    /// clock seeing it: how far the client's wall clock ran ahead of its
    /// monotonic companion. The deadline is late by that much.
    fn unseen(&self) -> Duration {
        let wall = self.clock.now().as_millis().saturating_sub(self.confirmed.wall.as_millis());
        let mono = self.clock.monotonic().saturating_duration_since(self.confirmed.wall_mono);
        Duration::from_millis(u64::try_from(wall).unwrap_or(0)).saturating_sub(mono)
    }

    /// Whether the holder must consider the lease gone without asking the store.
    fn lapsed_locally(&self, now: Instant) -> bool {
        now >= self.deadline || self.unseen() > self.gap_limit
    }
}

/// One confirmed grant (the acquisition or a renewal), as the clock checks see it.
#[derive(Debug, Clone, Copy)]
struct Confirmed {
    /// When the request was sent, on tokio's clock.
    sent: Instant,
    /// When its reply was taken in, on tokio's clock.
    replied: Instant,
    /// The store's time when it applied the grant: the new expiry minus the ttl.
    stamp: i64,
    /// The client's wall clock when the request was sent ...
    wall: StoreTime,
    /// ... and its monotonic companion at the same moment.
    wall_mono: Instant,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
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
        let expires = lease.map_or_else(StoreTime::default, |l| l.until);
        // The reply is in hand now; the wall clock pair is read now too (a
        // suspend during the acquire's round trip shows at the first renewal, as
        // a store clock that advanced more than ours).
        let confirmed = Confirmed {
            sent,
            replied: Instant::now(),
            stamp: expires.as_millis().saturating_sub(lock.ttl.as_millis()),
            wall: lock.clock.now(),
            wall_mono: lock.clock.monotonic(),
        };
        let term = Arc::new(Term {
            owner,
            token: record.fence(),
            since: lease.map_or_else(StoreTime::default, |l| l.since),
            state: Arc::new(Mutex::new(TermState {
                deadline: sent + lock.ttl.as_duration() - lock.margin,
                expires,
                confirmed,
                clock: lock.clock.clone(),
                gap_limit: lock.margin / 2,
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

    /// The unseen-time check (a host suspend, or a wall-clock step): when the
    /// client's wall clock ran ahead of its monotonic companion by more than half
    /// the margin since the last confirmed send, the lease may lapse before the
    /// deadline says, so it is treated as lost. Returns whether it was.
    fn time_passed_unseen(&self) -> bool {
        let st = self.state();
        let (unseen, limit) = (st.unseen(), st.gap_limit);
        drop(st);
        if unseen <= limit {
            return false;
        }
        if !self.lost.is_cancelled() && !self.released.load(Ordering::SeqCst) {
            Metrics::bump(&self.lock.metrics.local_clock_gaps);
            tracing::warn!(
                key = %self.lock.key,
                token = self.token,
                unseen_ms = millis(unseen),
                limit_ms = millis(limit),
                "the wall clock advanced beyond the monotonic clock: time passed unseen (host suspended, or the wall clock was stepped)"
            );
        }
        self.mark_lost("time passed that the monotonic clock did not see");
        true
    }

    /// How far the store clock may run ahead of the local monotonic clock over
    /// `interval` before it counts as a jump: the margin's share of the interval
    /// (a store clock running that much fast would end a whole lease a margin
    /// early; a step never gets past half the margin), plus 1 ms per second for
    /// the rates of two NTP-disciplined clocks and 2 ms for millisecond stamps.
    fn store_clock_tolerance(&self, interval: Duration) -> Duration {
        let (margin, ttl) = (self.lock.margin, self.lock.ttl.as_duration());
        let share = margin.as_nanos().saturating_mul(interval.as_nanos()) / ttl.as_nanos().max(1);
        let share = Duration::from_nanos(u64::try_from(share).unwrap_or(u64::MAX));
        Duration::from_millis(2) + interval / 1000 + share.min(margin / 2)
    }

    /// The store-clock check between two confirmed grants: the store applied them
    /// at its times `prev.stamp` and `next.stamp`, which in local time lie between
    /// `prev.sent` and `next.replied` at the widest. A store clock that advanced
    /// more than that (plus the tolerance) jumped ahead: the lease granted before
    /// may have ended early, and the clock may do it again. Returns whether it did.
    fn store_clock_jumped(&self, prev: &Confirmed, next: &Confirmed) -> bool {
        let store = next.stamp.saturating_sub(prev.stamp);
        let widest = next.replied.saturating_duration_since(prev.sent);
        let narrowest = next.sent.saturating_duration_since(prev.replied);
        let tolerance = self.store_clock_tolerance(widest);
        let ahead = store.saturating_sub(millis(widest));
        if ahead > millis(tolerance) {
            if !self.lost.is_cancelled() && !self.released.load(Ordering::SeqCst) {
                Metrics::bump(&self.lock.metrics.store_clock_jumps);
                tracing::warn!(
                    key = %self.lock.key,
                    token = self.token,
                    ahead_ms = ahead,
                    local_ms = millis(widest),
                    tolerance_ms = millis(tolerance),
                    "the store clock jumped ahead of the local clock between two renewals"
                );
            }
            return true;
        }
        let behind = millis(narrowest).saturating_sub(store);
        if behind > millis(tolerance) {
            // Harmless for this holder: leases last longer than it assumes.
            tracing::info!(key = %self.lock.key, token = self.token, behind_ms = behind, "the store clock stepped back");
        }
        false
    }

    fn clear_current(&self) {
        if self.lock.current_term().is_some_and(|t| std::ptr::eq(Arc::as_ptr(&t), self)) {
            self.lock.set_current(None);
        }
    }

    /// Renews the lease once; returns the new expiry. The call may not outlive the
    /// point where the lease could lapse: then the lock is reported lost.
    pub(crate) async fn renew(&self) -> Result<StoreTime, LockError> {
        if self.lost.is_cancelled() || self.released.load(Ordering::SeqCst) || self.time_passed_unseen() {
            return Err(self.lost_error(None));
        }
        let lock = &self.lock;
        let write = Write::new(
            Condition::HeldBy(self.owner.clone()).and(Condition::FenceIs(self.token)),
            Mutation::new().grant(self.owner.clone(), lock.ttl),
        );
        let sent = Instant::now();
        let (wall, wall_mono) = (lock.clock.now(), lock.clock.monotonic());
        let (store, coll, key) = (lock.store.clone(), lock.coll.clone(), lock.key.clone());
        let result = spawn_with_deadline(self.deadline(), async move { store.write(&coll, &key, &write).await });
        match result.await {
            None => {
                self.mark_lost("renewal not confirmed before the lease could lapse");
                Err(self.lost_error(None))
            }
            Some(Ok(WriteOutcome::Applied(r))) => {
                let until = r.lease().map_or_else(StoreTime::default, |l| l.until);
                let stamp = until.as_millis().saturating_sub(lock.ttl.as_millis());
                let next = Confirmed { sent, replied: Instant::now(), stamp, wall, wall_mono };
                let mut st = self.state();
                st.deadline = st.deadline.max(sent + lock.ttl.as_duration() - lock.margin);
                st.expires = until;
                // The reference stays the latest sent when renewals are answered
                // out of order (a touch racing the keeper); the comparison holds
                // either way, both grants being applied between the earlier send
                // and the later reply.
                let prev = st.confirmed;
                if sent >= prev.sent {
                    st.confirmed = next;
                }
                drop(st);
                if self.store_clock_jumped(&prev, &next) {
                    self.mark_lost("the store clock jumped ahead: the lease may have ended early");
                    return Err(self.lost_error(None));
                }
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
        // One nonce for every attempt: a retry recognises an earlier attempt that
        // was applied although it reported an error. "No lease and the same
        // fence" is no proof of that: a requeue or a forced release in between
        // leaves the same picture, and the outcome was then never written.
        let nonce = Nonce::generate();
        let write = Write::new(self.fenced(), changes.release()).with_nonce(nonce.clone());
        let mut attempt = 0;
        loop {
            attempt += 1;
            match lock.store.write(&lock.coll, &lock.key, &write).await {
                Ok(WriteOutcome::Applied(r)) => {
                    tracing::info!(key = %lock.key, owner = %self.owner, token = self.token, "lock released");
                    return Ok(r);
                }
                // An earlier attempt that reported an error was applied after all.
                Ok(WriteOutcome::Rejected(Some(r))) if attempt > 1 && r.last_nonce() == Some(nonce.as_str()) => {
                    tracing::info!(key = %lock.key, owner = %self.owner, token = self.token, "lock released by an earlier attempt");
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
    // Without auto-renew the keeper still wakes every interval, for the clock
    // check alone (no store operation).
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
            _ = tokio::time::sleep_until(next_renew) => {
                next_renew = Instant::now() + every;
                auto_renew
            }
            _ = term.wake.notified() => auto_renew,
        };
        if term.time_passed_unseen() {
            break;
        }
        if renew_due {
            renew_with_retries(&term).await;
            next_renew = Instant::now() + every;
        }
    }
    // Lost. The lease is not released here: work under it may still be
    // stopping (a process tree being killed, a write in flight), and a release
    // now would let the next holder in while it runs. It lapses on the store by
    // itself, at least a safety margin after the signal; the holder may release
    // it sooner, once its work has stopped (`LockGuard::release`).
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
    /// True once the lock was lost, released, or its safety deadline passed, or
    /// once the client's wall clock shows that time passed which the monotonic
    /// clock did not see (a host suspend).
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || self.state.lock().unwrap_or_else(|p| p.into_inner()).lapsed_locally(Instant::now())
    }

    fn deadline(&self) -> Instant {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).deadline
    }

    /// The confirmed time left on the lease: until its local deadline (the send
    /// time of the last confirmed renewal plus ttl minus the safety margin), the
    /// time [`Validity::expiring`] counts down. Zero once the lock is lost.
    pub fn remaining(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.deadline().saturating_duration_since(Instant::now())
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
/// Once its loss was signalled, the lease is never released behind the holder's
/// back, neither by the keeper nor by a drop: work under it may still be
/// stopping. It lapses on the store by itself, at least the safety margin after
/// the signal, unless the holder lets go sooner with [`LockGuard::release`].
///
/// Select on [`LockGuard::lost`] around the work the lock protects: it fires
/// *before* the lease can lapse on the server when renewal cannot be confirmed,
/// and when someone took the lock by force; it also fires when a clock check finds
/// the lease may have ended early (see the crate docs, "Clocks", for the bound).
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once: hold it while the protected work runs"]
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
    /// the lease's safety deadline has passed, or the wall clock shows time passed
    /// unseen by the monotonic clock (a host suspend), even before the keeper task
    /// has run (after the process was paused or the host resumed, say).
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

    /// Renews the lease now (the Python `MongoLocker`'s `touch`); returns the new expiry.
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
    ///
    /// `changes` may mark the document for garbage collection only on a lock
    /// built with [`LockBuilder::allow_gc`](crate::LockBuilder::allow_gc) (a task
    /// lease); on a lock it is [`LockError::GcOnLock`], nothing is written by
    /// this call, and the guard is dropped (which releases in the background).
    pub async fn release_with(self, changes: Mutation) -> Result<Record, LockError> {
        self.check_gc(&changes)?;
        self.term.release(changes).await
    }

    /// Lock documents never get a `gc_at`: a TTL index deleting one would reset
    /// its fence. Only task leases may be marked.
    fn check_gc(&self, changes: &Mutation) -> Result<(), LockError> {
        if changes.gc.is_some() && !self.term.lock.allow_gc {
            return Err(LockError::GcOnLock { key: self.term.lock.key_string() });
        }
        Ok(())
    }

    /// Applies `changes` to the lock's document while holding it, fenced by this
    /// acquisition's token and a live lease; `Err(Lost)` when no longer held. The
    /// lease part of `changes` is ignored (the lease is kept as it is).
    /// A mark for garbage collection is [`LockError::GcOnLock`] as for
    /// [`LockGuard::release_with`].
    pub async fn write(&self, mut changes: Mutation) -> Result<Record, LockError> {
        self.check_gc(&changes)?;
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
        // A guard dropped after its loss was signalled does not release either:
        // the lease lapses by itself (see the keeper).
        let lost = self.term.lost_marked.load(Ordering::SeqCst);
        if !self.term.released.swap(true, Ordering::SeqCst) && !lost {
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

    /// `remaining` counts down to the confirmed deadline, is moved on by a
    /// renewal, and is zero once the lock is lost.
    #[tokio::test(start_paused = true)]
    async fn remaining_is_the_confirmed_time_left() {
        let store = MemoryStore::new();
        let ttl = Duration::from_secs(3);
        let lock = Lock::builder(store.clone(), "k").ttl(ttl).build().unwrap();
        let guard = lock.acquire_with(Acquire::new().auto_renew()).await.unwrap();
        let validity = guard.validity();
        let first = validity.remaining();
        assert!(first < ttl && first > ttl / 2, "{first:?}");
        store.faults().set_unreachable(true);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(validity.remaining(), first - Duration::from_millis(500));
        guard.lost().await;
        assert_eq!(validity.remaining(), Duration::ZERO);
        // Renewed: more than before, once renewals are confirmed again.
        store.faults().set_unreachable(false);
        let again = lock.acquire_with(Acquire::new().auto_renew()).await.unwrap();
        let start = again.validity().remaining();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(again.validity().remaining() > start - Duration::from_secs(2), "a renewal moved the deadline on");
    }
}
