//! The group commit of outcome writes: tasks that finish while an outcome
//! write is in flight queue theirs, and the next batch sends them together
//! ([`LockGuard::release_many`]: one `update` command on MongoDB, whatever
//! the batch's size). An idle agent's single outcome goes at once, so the
//! batching adds no latency; under load it saves one command per task batched.
//!
//! Architecture Invariant: each outcome in a batch is its own fenced release
//! (its task's owner and fence, its own nonce): a stale claim's outcome is
//! rejected and reported to its task alone (`Lost`, the task counts as stale),
//! the others apply. A crash at any point loses nothing: an outcome not
//! written leaves its claim to lapse, and the task runs again.

use mongolock::{LockError, LockGuard};
use store_trait::{Mutation, Store};
use tokio::sync::{mpsc, oneshot};

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
}

impl<S: Store + Clone> Committer<S> {
    /// Starts the committing task on the current runtime.
    pub(super) fn start() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(commit_loop(rx));
        Committer { tx }
    }

    /// Releases `guard` with `changes` (its task's outcome), batched with the
    /// outcomes of other tasks finishing at the same time.
    pub(super) async fn release_with(&self, guard: LockGuard<S>, changes: Mutation) -> Result<(), LockError> {
        let key = guard.key().to_string();
        let (reply, rx) = oneshot::channel();
        if let Err(mpsc::error::SendError(p)) = self.tx.send(Pending { guard, changes, reply }) {
            // The committing task is gone (its runtime ended): write it alone.
            return p.guard.release_with(p.changes).await.map(drop);
        }
        // The committing task dropped the batch (its runtime is shutting
        // down): the guard's drop gave the claim back, the task runs again.
        rx.await.unwrap_or(Err(LockError::NotHeld { key }))
    }
}

async fn commit_loop<S: Store + Clone>(mut rx: mpsc::UnboundedReceiver<Pending<S>>) {
    while let Some(first) = rx.recv().await {
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
        let results = LockGuard::release_many(items).await;
        for (reply, result) in replies.into_iter().zip(results) {
            // A task that stopped waiting (its agent was dropped) needs no answer.
            let _ = reply.send(result);
        }
    }
}
