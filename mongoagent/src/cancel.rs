//! Cancelling and deleting tasks: operator actions on the queue, each task
//! changed by its own conditional write, so a cancel racing a claim or a
//! completion leaves exactly one final state.

use bson::{doc, Bson, Document};
use store_trait::{fields as reserved, Condition, DeleteOutcome, Key, Mutation, Record, Store, Write};

use crate::queue::{not_complete, pending};
use crate::task::fields;
use crate::{AgentError, Queue};

/// What a task's state must be for [`Queue::cancel`] to cancel it: not ended,
/// and not part of a fan-in step (a task waiting for its follow-ups, a
/// follow-up something waits for, a follow-up not yet activated, a parent
/// whose follow-ups are being activated): those end through their agents.
fn cancellable() -> Condition {
    not_complete()
        .and(Condition::Exists(fields::WAITING.into()).negate())
        .and(Condition::Exists(fields::JOIN.into()).negate())
        .and(Condition::Exists(pending::FENCE.into()).negate())
        .and(Condition::Exists(pending::PARENT_FENCE.into()).negate())
}

/// How many times one task's cancel is tried again after its fence moved
/// under it (it was claimed or retried in between).
const CANCEL_TRIES: usize = 4;

impl<S: Store + Clone> Queue<S> {
    /// Cancels the tasks matching an equality `filter` that have not ended: a
    /// pending task ends at once; a running one ends too, and its run loses
    /// its claim. Each becomes final with `complete: true, cancelled: true,
    /// error_encountered: true, last_error: "cancelled"` (so
    /// [`Queue::requeue`] leaves it alone). Returns the ids cancelled; with
    /// `dry_run`, those it would cancel.
    ///
    /// Each cancel is one write conditional on the task's fence and on its not
    /// having ended; it releases the lease and bumps the fence. So **the fence
    /// decides** between a cancel and a completion: whichever writes first
    /// wins, the other is rejected; exactly one final state. The running
    /// holder's next renewal fails, its [`Task::cancellation`](crate::Task::cancellation)
    /// fires, and its late outcome or progress is rejected (counted as stale).
    ///
    /// Tasks in a fan-in step (waiting for follow-ups, or a follow-up something
    /// waits for) are not cancelled: they are left to their agents.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in effect: each task is cancelled by its own conditional
    /// write; a dropped call has cancelled some, and calling it again cancels
    /// the rest.
    pub async fn cancel(&self, filter: Document, dry_run: bool) -> Result<Vec<Key>, AgentError> {
        let mut out = Vec::new();
        for r in self.readable_matches(filter, cancellable(), "cancel").await? {
            if dry_run || self.cancel_record(r.clone()).await? {
                out.push(r.key().clone());
            }
        }
        Ok(out)
    }

    /// As [`Queue::cancel`], for the tasks with these ids (missing or ended
    /// ones are passed over).
    ///
    /// # Cancel safety
    ///
    /// As [`Queue::cancel`].
    pub async fn cancel_ids(&self, ids: &[Key], dry_run: bool) -> Result<Vec<Key>, AgentError> {
        let mut out = Vec::new();
        for id in ids {
            out.extend(self.cancel(doc! { reserved::ID: id.as_bson().clone() }, dry_run).await?);
        }
        Ok(out)
    }

    /// Cancels one task, following its fence if it moves (a claim, a retry)
    /// until it ends or the cancel applies.
    async fn cancel_record(&self, mut r: Record) -> Result<bool, AgentError> {
        for _ in 0..CANCEL_TRIES {
            let running = r.get_bool(fields::CLAIMED) == Some(true);
            let w = Write::new(
                cancellable().and(Condition::FenceIs(r.fence())),
                Mutation::new()
                    .release()
                    .bump_fence()
                    .set(fields::COMPLETE, true)
                    .set(fields::CANCELLED, true)
                    .set(fields::ERROR_ENCOUNTERED, true)
                    .set(fields::LAST_ERROR, "cancelled")
                    .set(fields::READY, false)
                    .set(fields::CLAIMED, false)
                    .set_now(fields::COMPLETED_AT),
            );
            match self.store.write(&self.coll, r.key(), &w).await? {
                store_trait::WriteOutcome::Applied(_) => {
                    tracing::info!(queue = %self.coll, task = %r.key(), fence = r.fence(), running, "task cancelled");
                    crate::metrics::cancelled(&self.coll, r.get_str(fields::AGENT_NAME));
                    return Ok(true);
                }
                // Ended (completed first, say), deleted, or in a fan-in step now.
                store_trait::WriteOutcome::Rejected(None) => return Ok(false),
                store_trait::WriteOutcome::Rejected(Some(now)) if now.fence() == r.fence() => return Ok(false),
                // Claimed or retried in between: try again on its new fence.
                store_trait::WriteOutcome::Rejected(Some(now)) => r = now,
            }
        }
        tracing::warn!(queue = %self.coll, task = %r.key(), "cancel gave up: the task kept changing");
        Ok(false)
    }

    /// Deletes the tasks matching an equality `filter` that have ended
    /// (`complete: true`); with `force`, any of them, running or not (a
    /// running task's holder then finds its outcome rejected: the document is
    /// gone). Returns the ids deleted; with `dry_run`, those it would delete.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in effect: each task is deleted by its own conditional
    /// delete; calling it again deletes the rest.
    pub async fn delete(&self, filter: Document, force: bool, dry_run: bool) -> Result<Vec<Key>, AgentError> {
        let which =
            if force { Condition::Always } else { Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true)) };
        let mut out = Vec::new();
        for r in self.readable_matches(filter, which.clone(), "delete").await? {
            if dry_run {
                out.push(r.key().clone());
                continue;
            }
            // Conditional again: a task requeued since it was read stays.
            if let DeleteOutcome::Deleted(_) = self.store.delete(&self.coll, r.key(), &which).await? {
                tracing::info!(queue = %self.coll, task = %r.key(), force, "task deleted");
                out.push(r.key().clone());
            }
        }
        Ok(out)
    }
}
