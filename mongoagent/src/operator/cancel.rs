//! Cancelling and deleting tasks: operator actions on the queue, each task
//! changed by its own conditional write, so a cancel racing a claim or a
//! completion leaves exactly one final state.

use bson::{Bson, Document};
use store_trait::{Condition, DeleteOutcome, Key, Mutation, Record, Store, Write};

use crate::error::AgentError;
use crate::queue::Queue;
use crate::schema::{fields, not_complete, pending};

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
    /// The work of [`Queue::cancel`](crate::operator::Cancel), for one filter.
    pub(crate) async fn cancel_matching(&self, filter: Document, dry_run: bool) -> Result<Vec<Key>, AgentError> {
        let mut out = Vec::new();
        for r in self.readable_matches(filter, cancellable(), "cancel").await? {
            if dry_run || self.cancel_record(r.clone()).await? {
                out.push(r.key().clone());
            }
        }
        Ok(out)
    }

    /// Cancels one task, following its fence if it moves (a claim, a retry)
    /// until it ends or the cancel applies.
    async fn cancel_record(&self, mut r: Record) -> Result<bool, AgentError> {
        for _ in 0..CANCEL_TRIES {
            let running = r.get_bool(fields::CLAIMED) == Some(true);
            let group = r.get_str(fields::GROUP_KEY).zip(r.get_str(fields::AGENT_NAME));
            // A grouped task cancelled while it runs keeps its group's turn
            // until its handler has stopped: at the latest when the lease its
            // claim had ends (its agent stops it before then), exact because
            // the write is conditioned on the revision read (a renewal moves
            // it). Its agent frees the turn as soon as that run ends (the
            // mark names its claim's fence: no other run's end frees it).
            let busy_until = match (running, group, r.lease()) {
                (true, Some(_), Some(lease)) => Some(lease.until),
                _ => None,
            };
            let cond = cancellable().and(Condition::FenceIs(r.fence()));
            let cond = if busy_until.is_some() { cond.and(Condition::RevIs(r.rev())) } else { cond };
            let mutation = match busy_until {
                Some(t) => Mutation::new()
                    .set(fields::GROUP_BUSY_UNTIL, t.to_bson_datetime())
                    .set(fields::GROUP_BUSY_FENCE, i64::try_from(r.fence()).unwrap_or(i64::MAX)),
                None => Mutation::new(),
            };
            let w = Write::new(
                cond,
                mutation
                    .release()
                    .bump_fence()
                    .set(fields::COMPLETE, true)
                    .set(fields::CANCELLED, true)
                    .set(fields::ERROR_ENCOUNTERED, true)
                    .set(fields::LAST_ERROR, "cancelled")
                    .set(fields::READY, false)
                    .set(fields::CLAIMED, false)
                    // A held tick cancelled no longer waits its turn: the
                    // schedule lets the next one through, never this one.
                    .unset(fields::OVERLAP_HELD)
                    // Nor does a grouped task: its group's next goes first.
                    .unset(fields::GROUP_HELD)
                    .set_now(fields::COMPLETED_AT),
            );
            match self.store.write(&self.coll, r.key(), &w).await? {
                store_trait::WriteOutcome::Applied(_) => {
                    tracing::info!(queue = %self.coll, task = %r.key(), fence = r.fence(), running, "task cancelled");
                    crate::metrics::cancelled(&self.coll, r.get_str(fields::AGENT_NAME));
                    if r.fence() > 0 {
                        self.remove_pending_follow_ups(r.key(), r.fence()).await?;
                    }
                    // A task that was not running: its group's agents let the
                    // next through now, not at their sweep. A running one's
                    // agent does when its run has ended.
                    if let (Some((g, agent)), None) = (group, busy_until) {
                        self.groups()?.nudge(agent, g).await?;
                    }
                    return Ok(true);
                }
                // Ended (completed first, say), deleted, or in a fan-in step now.
                store_trait::WriteOutcome::Rejected(None) => return Ok(false),
                // Renewed in between (the revision moved): again, on what it is now.
                store_trait::WriteOutcome::Rejected(Some(now))
                    if busy_until.is_some() && now.fence() == r.fence() && now.rev() != r.rev() =>
                {
                    r = now
                }
                store_trait::WriteOutcome::Rejected(Some(now)) if now.fence() == r.fence() => return Ok(false),
                // Claimed or retried in between: try again on its new fence.
                store_trait::WriteOutcome::Rejected(Some(now)) => r = now,
            }
        }
        tracing::warn!(queue = %self.coll, task = %r.key(), "cancel gave up: the task kept changing");
        Ok(false)
    }

    /// Removes the follow-ups that claims of `parent` up to `fence` left
    /// pending (a run that crashed between enqueueing them and its outcome):
    /// once it is cancelled, nothing can activate them, and each would hold
    /// its dedupe key for ever. A stale run still under way removes its own
    /// when its outcome is rejected.
    async fn remove_pending_follow_ups(&self, parent: &Key, fence: u64) -> Result<(), AgentError> {
        let q = store_trait::Query::eq(bson::doc! { fields::PARENT: parent.as_bson().clone() })
            .when(Condition::Exists(pending::FENCE.into()));
        for c in self.store.find(&self.coll, &q).await? {
            let Some(f) = c.get_i64(pending::FENCE).filter(|&f| u64::try_from(f).is_ok_and(|f| f <= fence)) else {
                continue;
            };
            let still = Condition::FieldEq(pending::FENCE.into(), Bson::Int64(f));
            self.store.delete(&self.coll, c.key(), &still).await?;
            tracing::info!(queue = %self.coll, task = %c.key(), parent = %parent, "a cancelled task's pending follow-up removed");
        }
        Ok(())
    }

    /// The work of [`Queue::delete`](crate::operator::Delete).
    pub(crate) async fn delete_matching(
        &self,
        filter: Document,
        force: bool,
        dry_run: bool,
    ) -> Result<Vec<Key>, AgentError> {
        let which =
            if force { Condition::Always } else { Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true)) };
        let mut out = Vec::new();
        for r in self.readable_matches(filter, which.clone(), "delete").await? {
            if dry_run {
                out.push(r.key().clone());
                continue;
            }
            if let Some(k) = self.delete_record(r, &which, force).await? {
                out.push(k);
            }
        }
        Ok(out)
    }

    /// Deletes one task if `which` still holds. A grouped task whose run
    /// may go on keeps its group's turn past its deletion (recorded in its
    /// slot) until that run has ended: one running under a live lease, until
    /// the lease's end, and one cancelled while it ran, until its
    /// `group_busy_until`. A grouped task's delete is conditioned on the
    /// revision read, so a claim, a renewal or a cancel in between is seen,
    /// and the delete made again on what the task is now.
    async fn delete_record(&self, mut r: Record, which: &Condition, force: bool) -> Result<Option<Key>, AgentError> {
        for _ in 0..CANCEL_TRIES {
            let running = r.get_bool(fields::CLAIMED) == Some(true) && r.get_bool(fields::COMPLETE) != Some(true);
            let group = r.get_str(fields::GROUP_KEY).zip(r.get_str(fields::AGENT_NAME));
            let busy = match (running, r.lease(), r.get_time(fields::GROUP_BUSY_UNTIL)) {
                (true, Some(lease), _) => Some((lease.until, r.fence())),
                (false, _, Some(until)) if r.get_bool(fields::COMPLETE) == Some(true) => {
                    let fence = r.get_i64(fields::GROUP_BUSY_FENCE).and_then(|f| u64::try_from(f).ok());
                    Some((until, fence.unwrap_or(0)))
                }
                _ => None,
            };
            let cond = match (group, busy) {
                (Some((g, agent)), Some(busy)) => {
                    let seq = r.get_i64(fields::GROUP_SEQ);
                    self.groups()?.deleted_while_running(agent, g, r.key(), seq, busy).await?;
                    which.clone().and(Condition::RevIs(r.rev()))
                }
                (Some(_), None) => which.clone().and(Condition::RevIs(r.rev())),
                (None, _) => which.clone(),
            };
            // Conditional again: a task requeued since it was read stays.
            match self.store.delete(&self.coll, r.key(), &cond).await? {
                DeleteOutcome::Deleted(_) => {
                    tracing::info!(queue = %self.coll, task = %r.key(), force, "task deleted");
                    // A grouped task deleted while ready or held frees its
                    // group's turn now; a running one's, when its run ends.
                    if let (false, Some((g, agent))) = (running, group) {
                        if r.get_bool(fields::COMPLETE) != Some(true) {
                            self.groups()?.nudge(agent, g).await?;
                        }
                    }
                    return Ok(Some(r.key().clone()));
                }
                // Claimed, renewed or cancelled in between: again, on what it
                // is now (if `which` still holds).
                DeleteOutcome::Rejected(Some(now)) if group.is_some() && now.rev() != r.rev() => r = now,
                DeleteOutcome::Rejected(_) => return Ok(None),
            }
        }
        Ok(None)
    }
}
