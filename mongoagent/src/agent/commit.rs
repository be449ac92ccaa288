//! The group commit of outcome writes: tasks that finish while an outcome
//! write is in flight queue theirs, and the next batch sends them together
//! ([`LockGuard::release_many`]: one `update` command on MongoDB, whatever
//! the batch's size). A batch goes once the tasks ready to run have had their
//! turn (one yield to the scheduler), so tasks claimed together and finishing
//! together share one write: an idle agent's single outcome goes at once, and
//! under load the batching saves one command per task batched.
//!
//! The work loop claims for the slots these tasks free once their batch has
//! landed ([`Committer::landing`]), so slots freed together are claimed
//! together, in one batch claim, instead of one claim per slot.
//!
//! Architecture Invariant: each outcome in a batch is its own fenced release
//! (its task's owner and fence, its own nonce): a stale claim's outcome is
//! rejected and reported to its task alone (`Lost`, the task counts as stale),
//! the others apply. A crash at any point loses nothing: an outcome not
//! written leaves its claim to lapse, and the task runs again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mongolock::{LockError, LockGuard};
use store_trait::{Mutation, Store};
use tokio::sync::{mpsc, oneshot, Notify};

/// The most outcomes written in one command.
const MAX_BATCH: usize = 64;

struct Pending<S: Store + Clone> {
    guard: LockGuard<S>,
    changes: Mutation,
    reply: oneshot::Sender<Result<(), LockError>>,
}

/// The sending side of an agent's group commit; its task ends when the agent
/// (the last sender) is dropped.
pub(super) struct Committer<S: Store + Clone> {
    tx: mpsc::UnboundedSender<Pending<S>>,
    landed: Arc<Landed>,
}

/// Outcomes sent and not yet answered, and the signal that a batch landed.
#[derive(Default)]
struct Landed {
    in_flight: AtomicUsize,
    notify: Notify,
}

impl<S: Store + Clone> Committer<S> {
    /// Starts the committing task on the current runtime.
    pub(super) fn start() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let landed = Arc::new(Landed::default());
        tokio::spawn(commit_loop(rx, landed.clone()));
        Committer { tx, landed }
    }

    /// Resolves when the next batch of outcomes has landed, if any outcome
    /// is in flight now; `None` when none is.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future only stops waiting.
    pub(super) fn landing(&self) -> Option<impl std::future::Future<Output = ()> + '_> {
        if self.landed.in_flight.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut notified = Box::pin(self.landed.notify.notified());
        // Registered before the count is read, so a batch landing in between
        // is not missed.
        notified.as_mut().enable();
        (self.landed.in_flight.load(Ordering::Acquire) > 0).then_some(notified)
    }

    /// Releases `guard` with `changes` (its task's outcome), batched with the
    /// outcomes of other tasks finishing at the same time.
    pub(super) async fn release_with(&self, guard: LockGuard<S>, changes: Mutation) -> Result<(), LockError> {
        let key = guard.key().to_string();
        let (reply, rx) = oneshot::channel();
        self.landed.in_flight.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(p)) = self.tx.send(Pending { guard, changes, reply }) {
            self.landed.in_flight.fetch_sub(1, Ordering::AcqRel);
            // The committing task is gone (its runtime ended): write it alone.
            return p.guard.release_with(p.changes).await.map(drop);
        }
        // The committing task dropped the batch (its runtime is shutting
        // down): the guard's drop gave the claim back, the task runs again.
        rx.await.unwrap_or(Err(LockError::NotHeld { key }))
    }
}

async fn commit_loop<S: Store + Clone>(mut rx: mpsc::UnboundedReceiver<Pending<S>>, landed: Arc<Landed>) {
    while let Some(first) = rx.recv().await {
        // Tasks that finished with this one and are ready to run send theirs
        // in this turn of the scheduler.
        tokio::task::yield_now().await;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let mut replies = Vec::with_capacity(batch.len());
        let items = batch
            .into_iter()
            .map(|p| {
                replies.push(p.reply);
                (p.guard, p.changes)
            })
            .collect();
        let sent = replies.len();
        let results = LockGuard::release_many(items).await;
        for (reply, result) in replies.into_iter().zip(results) {
            // A task that stopped waiting (its agent was dropped) needs no answer.
            let _ = reply.send(result);
        }
        landed.in_flight.fetch_sub(sent, Ordering::AcqRel);
        landed.notify.notify_waiters();
    }
}
