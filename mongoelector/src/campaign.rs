//! The campaign: campaign as follower, lead until the term ends, again, until
//! stopped. The lease is renewed by the rounds (`round.rs`); its guard's keeper
//! ends the term before the lease can lapse when a renewal is not confirmed.

use std::sync::Arc;
use std::time::Duration;

use mongolock::unstable::Backoff;
use mongolock::Acquire;
use store_trait::Store;
use tokio_util::sync::CancellationToken;

use crate::inner::Inner;

/// Campaigns as follower, leads until the term ends, again, until stopped.
pub(crate) async fn run<S: Store + Clone>(inner: Arc<Inner<S>>, stop: CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_millis(50), inner.renew_every);
    while !stop.is_cancelled() {
        // Campaign: the blocking acquire wakes on a change notification (release)
        // or at the observed expiry (crash), and polls only without notifications.
        let acquired = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            r = inner.lock.acquire_with(Acquire::new()) => r,
        };
        let guard = match acquired {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(key = %inner.key, error = %e, "campaign failed; retrying");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
                continue;
            }
        };
        backoff.reset();
        let cancel = {
            let mut slot = inner.term.lock().await;
            inner.become_leader(&mut slot, guard);
            slot.as_ref().map(|t| t.cancel.clone())
        };
        let Some(cancel) = cancel else { continue };
        tokio::select! {
            biased;
            _ = stop.cancelled() => {
                inner.step_down("stopped", true).await;
                break;
            }
            _ = cancel.cancelled() => {
                // Lost (the lease could not be confirmed) or released by `release()`.
                let released = !inner.step_down("lost", false).await;
                if released {
                    // Let another node take over before campaigning again.
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(inner.renew_every) => {}
                    }
                }
            }
        }
    }
}
