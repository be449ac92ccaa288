//! The rounds, as the Python `MongoElector`'s `poll()`: every renew interval, lease maintenance
//! first (the leader renews, through mongolock's one retrying renewal), then `on_loop`, then
//! the status report.
//!
//! A follower's campaign does not wait for the rounds: it runs on a task of its
//! own and wakes on change notifications (`campaign.rs`). The status report runs on a
//! task of its own (one at a time), so a slow status write never delays the next
//! renewal; `on_loop` only marks its lane due.

use std::sync::Arc;

use store_trait::Store;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::inner::Inner;

/// Runs a round every renew interval until stopped.
pub(crate) async fn rounds<S: Store + Clone>(inner: Arc<Inner<S>>, stop: CancellationToken) {
    let mut report: Option<JoinHandle<()>> = None;
    let mut next = Instant::now();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            () = inner.maintain_lease(&stop) => {}
        }
        inner.callbacks.round_passed();
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
    /// Renews the lease if this node leads, as mongolock's keeper renews
    /// ([`mongolock::Lock::renew`]: transient failures retried with its backoff
    /// while the lease cannot have lapsed). A renewal that is not confirmed in
    /// time, or fails for good, is a loss: the term is cancelled and the
    /// campaign steps down without releasing (a lost lease is never released
    /// behind the leader's back; it lapses by itself).
    async fn maintain_lease(self: &Arc<Self>, stop: &CancellationToken) {
        let Some(term) = self.live_term() else { return };
        tokio::select! {
            biased;
            _ = stop.cancelled() => {}
            _ = term.cancel().cancelled() => {}
            r = self.lock.renew() => match r {
                Ok(expires) => tracing::trace!(key = %self.key, %expires, "leadership renewed"),
                // The term ended (or was never this instance's): the campaign steps down.
                Err(e) => tracing::debug!(key = %self.key, error = %e, "renewing leadership ended the term"),
            },
        }
    }
}
