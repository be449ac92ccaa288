//! The state the elector handle and its background tasks share (`Inner`), and
//! how a term begins (an election won) and ends (lost, released or stopped),
//! since both change that state as one. The tasks' own machinery (campaign,
//! rounds, observer, status reports) is in the sibling modules, each an
//! `impl Inner` of its own; this module imports none of them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use mongolock::{Identity, Lock, LockGuard};
use store_trait::{Collection, Store, StoreTime};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::callbacks::Dispatcher;
use crate::leadership::Leadership;
use crate::term::{Term, TermSnapshot};

pub(crate) struct RunState {
    pub(crate) stop: CancellationToken,
    pub(crate) main: JoinHandle<()>,
}

/// What the handle and the background tasks share.
pub(crate) struct Inner<S: Store + Clone> {
    pub(crate) key: String,
    pub(crate) lock: Lock<S>,
    pub(crate) store: S,
    pub(crate) status_coll: Collection,
    pub(crate) renew_every: Duration,
    pub(crate) report: bool,
    pub(crate) version: String,
    pub(crate) identity: Identity,
    pub(crate) stop_timeout: Duration,
    pub(crate) callbacks: Dispatcher,
    /// Cancelled when the last handle is dropped.
    pub(crate) lifetime: CancellationToken,
    pub(crate) run: Mutex<Option<RunState>>,
    pub(crate) running: AtomicBool,
    /// Set by [`Elector::stop`], cleared by [`Elector::start`]: a stopped
    /// elector's [`Elector::poll`] never campaigns (the seed's shutdown flag).
    /// Apart from `running`, which is also false for an elector never started
    /// and driven by `poll` alone.
    pub(crate) stopped: AtomicBool,
    /// The current term; held across a renewal or release.
    pub(crate) term: tokio::sync::Mutex<Option<Term<S>>>,
    /// The current term, readable without awaiting (`is_leader`).
    pub(crate) snapshot: Mutex<Option<TermSnapshot>>,
    pub(crate) leadership: watch::Sender<Leadership>,
    /// Wakes the observer after a local transition.
    pub(crate) changed: Notify,
    pub(crate) terms_won: AtomicU64,
    /// Held while a status report is written; true once the status collection's
    /// TTL index was ensured.
    pub(crate) reporting: tokio::sync::Mutex<bool>,
    /// When this node last reported its status (store clock).
    pub(crate) last_round: Mutex<Option<StoreTime>>,
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
        let term = Term::new(guard);
        let fence = term.guard.fence();
        *self.snapshot.lock() = Some(TermSnapshot::of(&term));
        self.terms_won.fetch_add(1, Ordering::Relaxed);
        tracing::info!(key = %self.key, node = %self.identity, fence, "elected leader");
        crate::metrics::term(&self.key, true);
        // The callback gets a child: cancelling it does not end the term.
        self.callbacks.leader(term.cancel.child_token());
        *slot = Some(term);
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
