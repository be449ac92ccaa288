//! A leadership term held by this node, and the snapshot of it read without
//! awaiting. How a term begins and ends is in `inner.rs`, beside the state it
//! changes.

use mongolock::{LockGuard, Validity};
use store_trait::Store;
use tokio_util::sync::CancellationToken;

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

impl<S: Store + Clone> Term<S> {
    /// The term an election won with `guard` begins.
    pub(crate) fn new(guard: LockGuard<S>) -> Self {
        Term { cancel: guard.cancellation(), guard }
    }
}

impl TermSnapshot {
    /// What can be read of `term` without awaiting its mutex.
    pub(crate) fn of<S: Store + Clone>(term: &Term<S>) -> Self {
        TermSnapshot { cancel: term.cancel.clone(), fence: term.guard.fence(), validity: term.guard.validity() }
    }

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
