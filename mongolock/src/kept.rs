//! One kept lease (`KeptLease`): an acquisition, a permit or a claim: its confirmed deadline, renewal, the lost signal,
//! release, and the two clock checks that guard the lost signal's promise (see
//! the crate docs, "Clocks"): every confirmed grant compares how far the store
//! clock advanced with how far tokio's monotonic clock did (a store clock that
//! jumped ahead ends leases early), and every keeper wake-up compares the
//! client's wall clock with its monotonic companion (time the monotonic clock
//! did not see, a host suspend, moved the lease's end closer unnoticed).
//! Either, beyond its tolerance, is treated as a loss.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use std::time::Duration;

use store_trait::{
    Clock, Collection, Condition, Key, Mutation, Nonce, Record, Store, StoreTime, Ttl, Write, WriteOutcome,
};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::bounded::spawn_with_deadline;
use crate::error::LockError;
use crate::identity::Identity;
use crate::info::LockInfo;
use crate::info::Metrics;

/// What every kept lease of one [`Leases`](crate::unstable::Leases) shares.
#[derive(Debug)]
pub(crate) struct LeaseConfig<S> {
    pub(crate) store: S,
    pub(crate) coll: Collection,
    pub(crate) ttl: Ttl,
    pub(crate) renew_every: Duration,
    pub(crate) safety_margin: Duration,
    pub(crate) identity: Identity,
    pub(crate) clock: Arc<dyn Clock>,
    /// Whether guards may mark their documents for garbage collection (task leases).
    pub(crate) allow_gc: bool,
    pub(crate) metrics: Metrics,
}

/// The live acquisition of one lock instance, for `Lock::release`, `touch` and
/// `owned`: a kept lease clears it when it ends.
#[derive(Debug)]
pub(crate) struct Current<S>(Mutex<Option<Weak<KeptLease<S>>>>);

impl<S> Default for Current<S> {
    fn default() -> Self {
        Current(Mutex::new(None))
    }
}

impl<S> Current<S> {
    pub(crate) fn get(&self) -> Option<Arc<KeptLease<S>>> {
        self.0.lock().as_ref().and_then(Weak::upgrade)
    }

    pub(crate) fn set(&self, kept: Option<&Arc<KeptLease<S>>>) {
        *self.0.lock() = kept.map(Arc::downgrade);
    }

    /// Forgets the kept lease `kept` if it is the current one.
    pub(crate) fn clear(&self, kept: &KeptLease<S>) {
        let mut slot = self.0.lock();
        if slot.as_ref().is_some_and(|w| std::ptr::eq(w.as_ptr(), kept)) {
            *slot = None;
        }
    }
}

#[derive(Debug)]
pub(crate) struct KeptState {
    /// The local instant by which the lease must be confirmed again: the send time
    /// of the last confirmed grant plus ttl minus the safety margin. The lease
    /// cannot lapse on the server before it (it was granted after we sent).
    pub(crate) deadline: Instant,
    /// The last confirmed expiry on the store clock.
    pub(crate) expires: StoreTime,
    /// The last confirmed grant: the reference of both clock checks.
    pub(crate) confirmed: Confirmed,
    /// The client clock, read for the unseen-time check.
    pub(crate) clock: Arc<dyn Clock>,
    /// How much unseen time since the last confirmed send is tolerated: half the
    /// safety margin, so the other half still covers scheduling delays.
    pub(crate) gap_limit: Duration,
}

impl KeptState {
    /// Time that passed since the last confirmed send without the monotonic
    /// clock seeing it: how far the client's wall clock ran ahead of its
    /// monotonic companion. The deadline is late by that much.
    pub(crate) fn unseen(&self) -> Duration {
        let wall = self.clock.now().as_millis().saturating_sub(self.confirmed.wall.as_millis());
        let mono = self.clock.monotonic().saturating_duration_since(self.confirmed.wall_mono);
        Duration::from_millis(u64::try_from(wall).unwrap_or(0)).saturating_sub(mono)
    }

    /// Whether the holder must consider the lease gone without asking the store.
    pub(crate) fn lapsed_locally(&self, now: Instant) -> bool {
        now >= self.deadline || self.unseen() > self.gap_limit
    }
}

/// One confirmed grant (the acquisition or a renewal), as the clock checks see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Confirmed {
    /// When the request was sent, on tokio's clock.
    pub(crate) sent: Instant,
    /// When its reply was taken in, on tokio's clock.
    pub(crate) replied: Instant,
    /// The store's time when it applied the grant: the new expiry minus the ttl.
    pub(crate) stamp: i64,
    /// The client's wall clock when the request was sent ...
    pub(crate) wall: StoreTime,
    /// ... and its monotonic companion at the same moment.
    pub(crate) wall_mono: Instant,
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// One kept lease: a lock's acquisition, a semaphore's permit, a task claim.
#[derive(Debug)]
pub(crate) struct KeptLease<S> {
    /// The configuration shared by every lease of its [`Leases`](crate::unstable::Leases).
    pub(crate) leases: Arc<LeaseConfig<S>>,
    /// The leased document.
    pub(crate) key: Key,
    /// The lock instance whose live acquisition this is, if any.
    pub(crate) current: Option<Arc<Current<S>>>,
    pub(crate) owner: String,
    /// The fence of this acquisition.
    pub(crate) fence: u64,
    pub(crate) since: StoreTime,
    pub(crate) state: Arc<Mutex<KeptState>>,
    pub(crate) lost: CancellationToken,
    pub(crate) stop: CancellationToken,
    pub(crate) wake: Notify,
    pub(crate) released: AtomicBool,
    /// Set once by the first report of loss.
    pub(crate) lost_marked: AtomicBool,
}

impl<S: Store + Clone> KeptLease<S> {
    pub(crate) fn state(&self) -> parking_lot::MutexGuard<'_, KeptState> {
        self.state.lock()
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.state().deadline
    }

    pub(crate) fn lost_error(&self, current: Option<&Record>) -> LockError {
        LockError::Lost {
            key: self.key.to_string(),
            fence: self.fence,
            current: current.and_then(|r| LockInfo::from_record(r, None)).map(Box::new),
        }
    }

    pub(crate) fn fenced(&self) -> Condition {
        Condition::OwnedBy(self.owner.clone()).and(Condition::FenceIs(self.fence))
    }

    /// Marks the acquisition lost (once): fires the signal, counts, logs.
    pub(crate) fn mark_lost(&self, why: &str) {
        // Once, even when two paths find the loss at the same moment; counted and
        // logged before the signal fires, so whoever wakes on it sees the count.
        if self.lost.is_cancelled() || self.lost_marked.swap(true, Ordering::SeqCst) {
            return;
        }
        if !self.released.load(Ordering::SeqCst) {
            Metrics::bump(&self.leases.metrics.losses);
            crate::metrics::lost(&self.leases.coll);
            tracing::warn!(key = %self.key, owner = %self.owner, fence = self.fence, why, "lock lost");
        }
        self.lost.cancel();
        self.clear_current();
    }

    /// The unseen-time check (a host suspend, or a wall-clock step): when the
    /// client's wall clock ran ahead of its monotonic companion by more than half
    /// the margin since the last confirmed send, the lease may lapse before the
    /// deadline says, so it is treated as lost. Returns whether it was.
    pub(crate) fn time_passed_unseen(&self) -> bool {
        let st = self.state();
        let (unseen, limit) = (st.unseen(), st.gap_limit);
        drop(st);
        if unseen <= limit {
            return false;
        }
        if !self.lost.is_cancelled() && !self.released.load(Ordering::SeqCst) {
            Metrics::bump(&self.leases.metrics.local_clock_gaps);
            tracing::warn!(
                key = %self.key,
                fence = self.fence,
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
    pub(crate) fn store_clock_tolerance(&self, interval: Duration) -> Duration {
        let (margin, ttl) = (self.leases.safety_margin, self.leases.ttl.as_duration());
        let share = margin.as_nanos().saturating_mul(interval.as_nanos()) / ttl.as_nanos().max(1);
        let share = Duration::from_nanos(u64::try_from(share).unwrap_or(u64::MAX));
        Duration::from_millis(2) + interval / 1000 + share.min(margin / 2)
    }

    /// The store-clock check between two confirmed grants: the store applied them
    /// at its times `prev.stamp` and `next.stamp`, which in local time lie between
    /// `prev.sent` and `next.replied` at the widest. A store clock that advanced
    /// more than that (plus the tolerance) jumped ahead: the lease granted before
    /// may have ended early, and the clock may do it again. Returns whether it did.
    pub(crate) fn store_clock_jumped(&self, prev: &Confirmed, next: &Confirmed) -> bool {
        let store = next.stamp.saturating_sub(prev.stamp);
        let widest = next.replied.saturating_duration_since(prev.sent);
        let narrowest = next.sent.saturating_duration_since(prev.replied);
        let tolerance = self.store_clock_tolerance(widest);
        let ahead = store.saturating_sub(millis(widest));
        if ahead > millis(tolerance) {
            if !self.lost.is_cancelled() && !self.released.load(Ordering::SeqCst) {
                Metrics::bump(&self.leases.metrics.store_clock_jumps);
                tracing::warn!(
                    key = %self.key,
                    fence = self.fence,
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
            tracing::info!(key = %self.key, fence = self.fence, behind_ms = behind, "the store clock stepped back");
        }
        false
    }

    pub(crate) fn clear_current(&self) {
        if let Some(c) = &self.current {
            c.clear(self);
        }
    }

    /// Renews the lease once; returns the new expiry. The call may not outlive the
    /// point where the lease could lapse: then the lock is reported lost.
    pub(crate) async fn renew(&self) -> Result<StoreTime, LockError> {
        if self.lost.is_cancelled() || self.released.load(Ordering::SeqCst) || self.time_passed_unseen() {
            return Err(self.lost_error(None));
        }
        let lock = &self.leases;
        let write = Write::new(
            Condition::HeldBy(self.owner.clone()).and(Condition::FenceIs(self.fence)),
            Mutation::new().grant(self.owner.clone(), lock.ttl),
        );
        let sent = Instant::now();
        let (wall, wall_mono) = (lock.clock.now(), lock.clock.monotonic());
        let (store, coll, key) = (lock.store.clone(), lock.coll.clone(), self.key.clone());
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
                st.deadline = st.deadline.max(sent + lock.ttl.as_duration() - lock.safety_margin);
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
                tracing::debug!(key = %self.key, fence = self.fence, expires = %until, "lock renewed");
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
            return Err(LockError::NotHeld { key: self.key.to_string() });
        }
        self.stop.cancel();
        // Work done under the lock stops: it is no longer held.
        self.lost.cancel();
        self.clear_current();
        let lock = &self.leases;
        // One nonce for every attempt: a retry recognises an earlier attempt that
        // was applied although it reported an error. "No lease and the same
        // fence" is no proof of that: a requeue or a forced release in between
        // leaves the same picture, and the outcome was then never written.
        let nonce = Nonce::generate();
        let write = Write::new(self.fenced(), changes.release()).with_nonce(nonce.clone());
        let mut attempt = 0;
        loop {
            attempt += 1;
            match lock.store.write(&lock.coll, &self.key, &write).await {
                Ok(WriteOutcome::Applied(r)) => {
                    tracing::info!(key = %self.key, owner = %self.owner, fence = self.fence, "lock released");
                    return Ok(r);
                }
                // An earlier attempt that reported an error was applied after all.
                Ok(WriteOutcome::Rejected(Some(r))) if attempt > 1 && r.last_nonce() == Some(nonce.as_str()) => {
                    tracing::info!(key = %self.key, owner = %self.owner, fence = self.fence, "lock released by an earlier attempt");
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
    pub(crate) fn release_in_background(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let lock = &self.leases;
        let (store, coll, key) = (lock.store.clone(), lock.coll.clone(), self.key.clone());
        let write = Write::new(self.fenced(), Mutation::new().release());
        let (owner, fence) = (self.owner.clone(), self.fence);
        rt.spawn(async move {
            match store.write(&coll, &key, &write).await {
                Ok(o) if o.is_applied() => tracing::info!(%key, owner, fence, "lock released in the background"),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(%key, owner, fence, error = %e, "background release failed; the lease will lapse")
                }
            }
        });
    }
}
