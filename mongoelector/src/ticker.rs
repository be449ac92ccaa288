//! The rounds, as the Python `MongoElector`'s `poll()`: every renew interval, lease maintenance
//! first (the leader renews), then `on_loop`, then the status report.
//!
//! A follower's campaign does not wait for the rounds: it runs in the main loop
//! and wakes on change notifications (`campaign.rs`). The status report runs on a
//! task of its own (one at a time), so a slow status write never delays the next
//! renewal; `on_loop` only marks its lane due.

use std::sync::Arc;
use std::time::Duration;

use mongolock::{Backoff, LockError};
use store_trait::Store;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::elector::Inner;

/// Runs a round every renew interval until stopped.
pub(crate) async fn ticker<S: Store + Clone>(inner: Arc<Inner<S>>, stop: CancellationToken) {
    let mut report: Option<JoinHandle<()>> = None;
    let mut next = Instant::now();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            () = inner.maintain_lease(&stop) => {}
        }
        inner.callbacks.tick();
        if inner.report && report.as_ref().is_none_or(JoinHandle::is_finished) {
            let inner = inner.clone();
            report = Some(tokio::spawn(async move {
                if let Err(e) = inner.report_status().await {
                    tracing::debug!(key = %inner.key, error = %e, "status report failed");
                }
            }));
        }
        next = (next + inner.renew_every).max(Instant::now());
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(next) => {}
        }
    }
}

impl<S: Store + Clone> Inner<S> {
    /// Renews the lease if this node leads: retries transient failures while the
    /// term is live. A renewal that cannot be confirmed before the lease could
    /// lapse ends the term (the guard's keeper watches that deadline); one that
    /// fails for good ends it here.
    async fn maintain_lease(self: &Arc<Self>, stop: &CancellationToken) {
        let Some(term) = self.live_term() else { return };
        let mut backoff = Backoff::new((self.renew_every / 20).max(Duration::from_millis(5)), self.renew_every / 2);
        loop {
            let e = match self.lock.touch().await {
                Ok(expires) => {
                    tracing::trace!(key = %self.key, %expires, "leadership renewed");
                    return;
                }
                Err(e) => e,
            };
            match e {
                // The term ended: the main loop steps down.
                LockError::Lost { .. } | LockError::NotHeld { .. } => return,
                e if e.is_retryable() => {
                    tracing::warn!(key = %self.key, error = %e, "renewing leadership failed; retrying");
                    if !term.is_live() {
                        return;
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = term.cancel().cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
                e => {
                    tracing::warn!(key = %self.key, error = %e, "renewing leadership failed for good");
                    self.step_down("renewal failed", true).await;
                    return;
                }
            }
        }
    }
}
