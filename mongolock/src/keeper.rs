//! The keeper: the task that renews a lease and raises the lost signal in time.
//! It follows the periodic-executor design: it sleeps until the next renewal or
//! until the lease could lapse, wakes early on demand (`renew_now`, `touch`),
//! stops promptly when the guard is released or dropped, and never wakes in
//! between.

use std::sync::Arc;
use std::time::Duration;

use store_trait::{Store, StoreTime};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::error::LockError;
use crate::info::Metrics;
use crate::kept::KeptLease;

/// Renews until the guard goes away or the lease is lost.
pub(crate) async fn keeper<S: Store + Clone>(kept: Arc<KeptLease<S>>, auto_renew: bool) {
    let every = kept.leases.renew_every;
    // Without auto-renew the keeper still wakes every interval, for the clock
    // check alone (no store operation).
    let mut next_renew = Instant::now() + every;
    loop {
        let deadline = kept.deadline();
        let renew_due = tokio::select! {
            biased;
            _ = kept.stop.cancelled() => return,
            _ = kept.lost.cancelled() => break,
            _ = tokio::time::sleep_until(deadline) => {
                if kept.deadline() <= Instant::now() {
                    kept.mark_lost("lease not renewed before it could lapse");
                    break;
                }
                false
            }
            _ = tokio::time::sleep_until(next_renew) => {
                next_renew = Instant::now() + every;
                auto_renew
            }
            _ = kept.wake.notified() => auto_renew,
        };
        if kept.time_passed_unseen() {
            break;
        }
        if renew_due {
            // Whatever the outcome, a loss has been marked on the kept lease.
            let _ = renew_with_retries(&kept).await;
            next_renew = Instant::now() + every;
        }
    }
    // Lost. The lease is not released here: work under it may still be
    // stopping (a process tree being killed, a write in flight), and a release
    // now would let the next holder in while it runs. It lapses on the store by
    // itself, at least a safety margin after the signal; the holder may release
    // it sooner, once its work has stopped (`LockGuard::release`).
}

/// Renews once, retrying transient store failures with the one [`Backoff`]
/// until the renewal is confirmed, the lease is lost, or it could lapse (then it
/// is lost). A permanent failure is reported as a loss too. The keeper's rounds
/// and [`LockGuard::renew`](crate::LockGuard::renew) (a leadership term's rounds)
/// both renew through it.
pub(crate) async fn renew_with_retries<S: Store + Clone>(kept: &KeptLease<S>) -> Result<StoreTime, LockError> {
    let lock = &kept.leases;
    let mut backoff = Backoff::new((lock.renew_every / 20).max(Duration::from_millis(5)), lock.renew_every / 2);
    loop {
        match kept.renew().await {
            Ok(t) => return Ok(t),
            Err(e @ LockError::Lost { .. }) => return Err(e),
            Err(e) => {
                Metrics::bump(&lock.metrics.renew_failures);
                tracing::warn!(key = %kept.key, fence = kept.fence, error = %e, "lock renewal failed");
                if !e.is_retryable() {
                    kept.mark_lost("renewal failed permanently");
                    return Err(e);
                }
                let now = Instant::now();
                let deadline = kept.deadline();
                if now >= deadline {
                    kept.mark_lost("lease not renewed before it could lapse");
                    return Err(kept.lost_error(None));
                }
                let base = backoff.next_delay();
                let jitter = Duration::from_millis(fastrand::u64(0..=base.as_millis().min(50) as u64));
                let pause = (base + jitter).min(deadline - now);
                tokio::select! {
                    _ = kept.stop.cancelled() => return Err(kept.lost_error(None)),
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}
