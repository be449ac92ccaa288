//! A leadership term held by this node: how it begins (an election won) and ends
//! (lost, released or stopped), and the snapshot read without awaiting.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mongolock::{LockGuard, Validity};
use store_trait::Store;
use tokio_util::sync::CancellationToken;

use crate::elector::Inner;

/// A term held by this node: the lease's guard and the term's cancellation token
/// (a child of the guard's lost signal, cancelled when the term ends).
pub(crate) struct Term<S: Store + Clone> {
    pub(crate) guard: LockGuard<S>,
    pub(crate) cancel: CancellationToken,
}

/// What callers need to know about the current term without awaiting the term
/// mutex: whether it is live, its fence, its cancellation token.
#[derive(Debug, Clone)]
pub(crate) struct TermSnapshot {
    cancel: CancellationToken,
    fence: u64,
    validity: Validity,
}

impl TermSnapshot {
    /// Whether the term still holds: not ended, and its lease confirmed recently
    /// enough that it cannot have lapsed on the store.
    pub(crate) fn is_live(&self) -> bool {
        !self.cancel.is_cancelled() && !self.validity.is_lost()
    }

    /// The term's fence.
    pub(crate) fn fence(&self) -> u64 {
        self.fence
    }

    /// The term's cancellation token.
    pub(crate) fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// How long the term's lease is confirmed.
    pub(crate) fn validity(&self) -> &Validity {
        &self.validity
    }
}

impl<S: Store + Clone> Inner<S> {
    /// The current term, if live.
    pub(crate) fn live_term(&self) -> Option<TermSnapshot> {
        self.snapshot.lock().as_ref().filter(|t| t.is_live()).cloned()
    }

    /// Whether this node leads now (a live term).
    pub(crate) fn is_leader(&self) -> bool {
        self.live_term().is_some()
    }

    /// Records a won election (the caller holds the term mutex).
    pub(crate) fn become_leader(&self, slot: &mut Option<Term<S>>, guard: LockGuard<S>) {
        let cancel = guard.cancellation();
        let fence = guard.fence();
        *self.snapshot.lock() = Some(TermSnapshot { cancel: cancel.clone(), fence, validity: guard.validity() });
        self.terms_won.fetch_add(1, Ordering::Relaxed);
        tracing::info!(key = %self.key, node = %self.identity, fence, "elected leader");
        crate::metrics::term(&self.key, true);
        // The callback gets a child: cancelling it does not end the term.
        self.callbacks.leader(cancel.child_token());
        *slot = Some(Term { guard, cancel });
        self.changed.notify_one();
    }

    /// Ends this node's term, if any: cancels the term's cancellation token first (leader-only
    /// work stops), reports the loss, then releases the lease when `release` is
    /// set. Returns whether there was a term.
    ///
    /// Dropped half-way, the term has still ended and its loss is reported; the
    /// guard's drop releases the lease in the background.
    pub(crate) async fn step_down(self: &Arc<Self>, why: &str, release: bool) -> bool {
        let Some(term) = self.term.lock().await.take() else { return false };
        term.cancel.cancel();
        *self.snapshot.lock() = None;
        let fence = term.guard.fence();
        tracing::info!(key = %self.key, node = %self.identity, fence, why, "leadership ended");
        crate::metrics::term(&self.key, false);
        self.callbacks.loss();
        self.changed.notify_one();
        if release && !term.guard.is_lost() {
            if let Err(e) = term.guard.release().await {
                tracing::warn!(key = %self.key, fence, error = %e, "releasing leadership failed; it lapses at expiry");
            }
            // The observer publishes the free lease at once, also without change
            // notifications.
            self.changed.notify_one();
        }
        true
    }
}
