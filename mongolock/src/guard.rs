//! What the caller holds: the guard of one acquisition, and its validity,
//! readable without the guard.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use store_trait::{Condition, Key, Mutation, Record, Store, StoreTime, Write, WriteOutcome};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::LockError;
use crate::kept::{KeptLease, KeptState};

/// Whether an acquisition still holds its lock, readable without the guard.
#[derive(Debug, Clone)]
pub struct Validity {
    lost: CancellationToken,
    state: Arc<Mutex<KeptState>>,
}

impl Validity {
    /// True once the lock was lost, released, or its safety deadline passed, or
    /// once the client's wall clock shows that time passed which the monotonic
    /// clock did not see (a host suspend).
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || self.state.lock().lapsed_locally(Instant::now())
    }

    fn deadline(&self) -> Instant {
        self.state.lock().deadline
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

impl Validity {
    /// Waits until the local deadline has passed (the send time of the last
    /// confirmed renewal plus ttl minus the safety margin), lost or not: the
    /// last instant the holder may count on its lease, and the one by which
    /// work under a lost lock must have stopped, since another holder may
    /// begin once the lease ends on the store, the margin later. A renewal
    /// confirmed meanwhile moves the deadline on: the wait then goes on.
    ///
    /// ```
    /// # async fn demo(v: mongolock::Validity, work: impl std::future::Future<Output = ()>) {
    /// // Work that must never outlive the lease: dropped at its deadline.
    /// tokio::select! {
    ///     _ = work => {}
    ///     _ = v.lapsed() => {}
    /// }
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only sleeps and reads the deadline.
    pub async fn lapsed(&self) {
        loop {
            tokio::time::sleep_until(self.deadline()).await;
            // A renewal may have moved the deadline while this slept.
            if self.deadline() <= Instant::now() {
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
    pub(crate) kept: Arc<KeptLease<S>>,
}

impl<S: Store + Clone> LockGuard<S> {
    /// The fence: strictly greater than every earlier fence of this lock.
    /// Pass it to whatever the lock protects, which should reject smaller ones.
    #[doc(alias = "token")]
    pub fn fence(&self) -> u64 {
        self.kept.fence
    }

    /// The lock's key.
    pub fn key(&self) -> &Key {
        &self.kept.key
    }

    /// The owner string recorded in the store for this acquisition.
    pub fn owner(&self) -> &str {
        &self.kept.owner
    }

    /// When this acquisition took the lock (store clock).
    pub fn since(&self) -> StoreTime {
        self.kept.since
    }

    /// The last confirmed expiry (store clock).
    pub fn expires(&self) -> StoreTime {
        self.kept.state().expires
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
        Validity { lost: self.kept.lost.clone(), state: self.kept.state.clone() }
    }

    /// Waits until the lock is lost; use it in `select!`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only waits for the signal.
    pub async fn lost(&self) {
        self.kept.lost.cancelled().await;
    }

    /// A cancellation token that is cancelled when the lock is lost, for handing
    /// to other tasks. Cancelling it yourself does not affect the lock.
    pub fn cancellation(&self) -> CancellationToken {
        self.kept.lost.child_token()
    }

    /// Renews the lease now (the Python `MongoLocker`'s `touch`); returns the new expiry.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in effect: the renewal runs on its own task, so dropping this
    /// future never drops a store call half-way; the renewal may still be
    /// applied, which extends the lease as a renewal should, and the keeper keeps
    /// the lease either way.
    pub async fn touch(&self) -> Result<StoreTime, LockError> {
        let out = self.kept.renew().await;
        self.kept.wake.notify_one();
        out
    }

    /// Renews the lease now as the keeper does: transient store failures are
    /// retried with the keeper's backoff until the renewal is confirmed, or until
    /// the lease could lapse, which is a loss (`Err(Lost)`, the lost signal fires);
    /// so is a permanent failure (that error, the lost signal fires). For a holder
    /// that renews on its own schedule (a leadership term's rounds) instead of
    /// [`Acquire::auto_renew`](crate::Acquire::auto_renew). Returns the new expiry.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in effect, as [`LockGuard::touch`]: dropped between retries,
    /// the lease is kept as it was (or as a renewal still in flight left it).
    pub async fn renew(&self) -> Result<StoreTime, LockError> {
        let out = crate::keeper::renew_with_retries(&self.kept).await;
        self.kept.wake.notify_one();
        out
    }

    /// Asks the auto-renew task to renew at once instead of at its next interval.
    pub fn renew_now(&self) {
        self.kept.wake.notify_one();
    }

    /// Stops keeping the lock without releasing it: no more renewals, and the
    /// lease lapses at its expiry on the store's clock, when the lock can be
    /// granted again. For work under the lock that may still be running and
    /// cannot be stopped (a handler that ignored its cancellation): a release
    /// would let the next holder start beside it at once, a lapse gives it
    /// until the lease's end, and its writes after that are fenced out. The
    /// guard's cancellation fires.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use mongolock::Lock;
    /// use std::time::Duration;
    /// use store_memory::MemoryStore;
    ///
    /// let lock = Lock::builder(MemoryStore::new(), "k").ttl(Duration::from_secs(30)).build().unwrap();
    /// let guard = lock.acquire().await.unwrap();
    /// guard.abandon();
    /// // Held until the lease lapses, by nobody.
    /// assert!(lock.try_acquire().await.unwrap().is_none());
    /// # }
    /// ```
    pub fn abandon(self) {
        tracing::info!(key = %self.kept.key, fence = self.kept.fence, "lock abandoned: its lease lapses at its expiry");
        self.kept.lost_marked.store(true, Ordering::SeqCst);
        self.kept.clear_current();
        // The drop stops the renewals and fires the cancellation, and, the
        // loss being marked, releases nothing.
    }

    /// Releases the lock. `Err(Lost)` when it was no longer held by this
    /// acquisition (nothing was changed then). Either way the lost signal fires,
    /// so work still running under [`LockGuard::cancellation`] stops.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: the guard is consumed, so dropped half-way the lock is
    /// already let go (its lost signal fired) while the release write may or may
    /// not have been applied; an unapplied one leaves the lease to lapse at its
    /// expiry.
    pub async fn release(self) -> Result<(), LockError> {
        self.kept.release(Mutation::new()).await.map(drop)
    }

    /// Releases the lock and applies `changes` to its document in the same
    /// atomic write, fenced by this acquisition's fence: either both happen or
    /// neither (`Err(Lost)`). The lease part of `changes` is replaced by the
    /// release. Returns the document after the write.
    ///
    /// `changes` may mark the document for garbage collection only on a lock
    /// kept through [`Leases`](crate::unstable::Leases) built with
    /// [`LeasesBuilder::allow_gc`](crate::unstable::LeasesBuilder::allow_gc) (task leases);
    /// on a lock it is [`LockError::GcOnLock`], nothing is written by
    /// this call, and the guard is dropped (which releases in the background).
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe, as [`LockGuard::release`]: dropped half-way, `changes` may
    /// or may not have been applied, together with the release or not at all.
    pub async fn release_with(self, changes: Mutation) -> Result<Record, LockError> {
        self.check_gc(&changes)?;
        self.kept.release(changes).await
    }

    /// Lock documents never get a `gc_at`: a TTL index deleting one would reset
    /// its fence. Only task leases may be marked.
    pub(crate) fn check_gc(&self, changes: &Mutation) -> Result<(), LockError> {
        if changes.gc.is_some() && !self.kept.leases.allow_gc {
            return Err(LockError::GcOnLock { key: self.kept.key.to_string() });
        }
        Ok(())
    }

    /// Applies `changes` to the lock's document while holding it, fenced by this
    /// acquisition's fence and a live lease; `Err(Lost)` when no longer held. The
    /// lease part of `changes` is ignored (the lease is kept as it is).
    /// A mark for garbage collection is [`LockError::GcOnLock`] as for
    /// [`LockGuard::release_with`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in that it is one write: dropped before its reply, `changes`
    /// may or may not have been applied (fenced either way). The guard keeps the
    /// lease.
    pub async fn write(&self, mut changes: Mutation) -> Result<Record, LockError> {
        self.check_gc(&changes)?;
        changes.lease = store_trait::LeaseOp::Keep;
        let leases = &self.kept.leases;
        let w =
            Write::new(Condition::HeldBy(self.kept.owner.clone()).and(Condition::FenceIs(self.kept.fence)), changes);
        match leases.store.write(&leases.coll, &self.kept.key, &w).await? {
            WriteOutcome::Applied(r) => Ok(r),
            WriteOutcome::Rejected(current) => {
                self.kept.mark_lost("a fenced write was rejected");
                Err(self.kept.lost_error(current.as_ref()))
            }
        }
    }
}

impl<S: Store + Clone> Drop for LockGuard<S> {
    fn drop(&mut self) {
        self.kept.stop.cancel();
        // Whatever still runs under this guard's cancellation must stop: the lock is
        // being let go.
        self.kept.lost.cancel();
        // A guard dropped after its loss was signalled does not release either:
        // the lease lapses by itself (see the keeper).
        let lost = self.kept.lost_marked.load(Ordering::SeqCst);
        if !self.kept.released.swap(true, Ordering::SeqCst) && !lost {
            tracing::debug!(key = %self.kept.key, fence = self.kept.fence, "lock guard dropped without release");
            self.kept.clear_current();
            self.kept.release_in_background();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use store_memory::MemoryStore;
    use tokio::time::Instant;

    use crate::acquire::Acquire;

    use crate::lock::Lock;

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
