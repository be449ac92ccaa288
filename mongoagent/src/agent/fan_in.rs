//! Fan-in: a task waiting for its follow-ups, the last follow-up waking it with
//! one conditional write, the children a re-run task sees, and follow-up ids.

use bson::{Bson, Document};
use mongolock::{LockError, LockGuard};
use store_trait::{Condition, Key, Mutation, Query, Record, Store, StoreError};

use super::finish::Finisher;
use super::processed::Processed;
use crate::error::AgentError;
use crate::schema::pending::{self, Finish};
use crate::schema::{fields, not_complete, task_round};
use crate::task::{Child, DedupeScope, NewTask};

/// The follow-ups of `waiter`'s round `round`, in the order they were returned.
pub(crate) fn joined_to(waiter: &Bson, round: i64) -> Query {
    Query::eq(bson::doc! { fields::JOIN: waiter.clone(), fields::JOIN_ROUND: round })
}

impl<S: Store + Clone> Finisher<S> {
    /// Records a handler's outcome whose follow-ups were enqueued pending (with
    /// this claim's fence): one fenced write that keeps the claim and names the
    /// fence whose follow-ups are the task's, then [`Finisher::end_with_follow_ups`].
    /// A stale run's write is rejected, so its follow-ups are never activated.
    pub(super) async fn hand_over(
        &self,
        guard: LockGuard<S>,
        record: &Record,
        merge: Document,
        finish: Finish,
    ) -> Result<Processed, AgentError> {
        let key = record.key().clone();
        let fence = guard.fence();
        let mut changes = Mutation::new()
            .set_all(merge)
            .set(pending::PARENT_FENCE, i64::try_from(fence).unwrap_or(i64::MAX))
            .set(pending::PARENT_FINISH, finish.as_str());
        // A success: an earlier attempt's timeout is no longer the latest.
        changes = crate::schema::timed_out::clear(changes, record.data());
        if matches!(finish, Finish::Wait) {
            // The next round's attempts count from here: waiting is no failure.
            changes = changes.set(fields::ROUND_FENCE, i64::try_from(fence).unwrap_or(i64::MAX));
        }
        match guard.write(changes).await {
            Ok(_) => {}
            Err(LockError::Lost { current, .. }) => {
                self.discard_stale_follow_ups(&key, fence).await?;
                return Ok(self.stale(&key, fence, current));
            }
            Err(e) => return Err(e.into()),
        }
        let result = match finish {
            Finish::Complete | Finish::CompleteThen => {
                self.bump(|l| l.completed += 1);
                Processed::Completed(key.clone())
            }
            Finish::Wait => {
                self.bump(|l| l.waiting += 1);
                Processed::Waiting(key.clone())
            }
        };
        tracing::info!(agent = %self.name, task = %key, fence, outcome = ?result, "task finished; activating its follow-ups");
        crate::metrics::outcome(&self.queue.coll, &self.name, result.label());
        self.end_with_follow_ups(guard, &key, record, fence, finish).await?;
        Ok(result)
    }

    /// The steps after a fenced outcome write that named `fence` as the owner of
    /// the task's pending follow-ups: activate them, then end the task as
    /// `finish` says (completed, or waiting for them), still holding the claim.
    /// Every step is idempotent; if the agent dies in between, the claim lapses
    /// and the next claimer runs this again instead of the handler. A claim lost
    /// in between (`Lost`) leaves the rest to that claimer.
    pub(super) async fn end_with_follow_ups(
        &self,
        guard: LockGuard<S>,
        key: &Key,
        record: &Record,
        fence: u64,
        finish: Finish,
    ) -> Result<(), AgentError> {
        let round = task_round(record);
        self.activate(key, fence).await?;
        let end = Mutation::new().unset(pending::PARENT_FENCE).unset(pending::PARENT_FINISH);
        let ended = match finish {
            Finish::Wait => {
                let changes = end.set(fields::WAITING, round).set(fields::READY, false);
                match guard.write(changes).await {
                    Ok(_) => {}
                    Err(LockError::Lost { .. }) => return Ok(()),
                    Err(e) => return Err(e.into()),
                }
                tracing::info!(agent = %self.name, task = %key, round, "task waits for its follow-ups");
                self.settle_wait(guard, key, round).await.map(drop)
            }
            Finish::Complete | Finish::CompleteThen => {
                if finish == Finish::CompleteThen {
                    // A fan-in task whose follow-ups all ended before it was active.
                    let then = Key::new(format!("{}/then", child_prefix(key, round)))?;
                    self.wake_if_done(then.as_bson(), 0).await?;
                }
                let changes = self.finished(end, crate::task::attempt(record)).set(fields::ERROR_ENCOUNTERED, false);
                if record.get(fields::JOIN).is_some() {
                    match guard.write(changes).await {
                        Ok(_) => {}
                        Err(LockError::Lost { .. }) => return Ok(()),
                        Err(e) => return Err(e.into()),
                    }
                    self.notify_waiter(record).await?;
                    guard.release_with(self.close(Mutation::new(), record.data())).await.map(drop)
                } else {
                    guard.release_with(self.close(changes, record.data())).await.map(drop)
                }
            }
        };
        if ended.is_ok() && finish != Finish::Wait {
            // It ended for good: the follow-ups it waited for in earlier rounds
            // may be collected now.
            self.collect_children(key, record).await;
        }
        match ended {
            Ok(()) | Err(LockError::Lost { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Activates the follow-ups of `parent` still pending with `fence` (fan-in
    /// tasks last, after the follow-ups they wait for), and removes those an
    /// older claim left pending: that claim's outcome can no longer be written
    /// (the fence has moved past it), so they would never run. Idempotent; the
    /// same one query as the activation alone.
    pub(super) async fn activate(&self, parent: &Key, fence: u64) -> Result<(), AgentError> {
        let fence = i64::try_from(fence).unwrap_or(i64::MAX);
        let q = Query::eq(bson::doc! { fields::PARENT: parent.as_bson().clone() })
            .when(Condition::Exists(pending::FENCE.into()));
        let found = self.store.find(&self.queue.coll, &q).await?;
        let (mut ours, theirs): (Vec<_>, Vec<_>) =
            found.into_iter().partition(|r| r.get_i64(pending::FENCE) == Some(fence));
        ours.sort_by_key(|r| pending::is_fan_in(r.data()));
        // A grouped follow-up, numbered when it was enqueued pending, is
        // announced in its slot before it becomes held, so that the slot
        // stays in the sweep until the landing after (as a requeue's).
        let grouped = ours.iter().filter(|r| pending::is_grouped(r.data())).filter_map(|r| {
            let (agent, group) = (r.get_str(fields::AGENT_NAME)?, r.get_str(fields::GROUP_KEY)?);
            Some((agent.to_owned(), group.to_owned(), r.get_i64(fields::GROUP_SEQ)))
        });
        let grouped: Vec<_> = grouped.collect();
        let announced = match grouped.is_empty() {
            true => None,
            false => Some(self.queue.groups()?.announce_all(grouped).await?),
        };
        let written = async {
            for r in &ours {
                self.store.write(&self.queue.coll, r.key(), &pending::activation(r.data(), fence)).await?;
            }
            Ok::<(), StoreError>(())
        }
        .await;
        // Made or not, the writes are over: the slots wait for nothing,
        // and their agents look.
        if let Some(announced) = announced {
            announced.land().await;
        }
        written?;
        if !ours.is_empty() {
            tracing::debug!(agent = %self.name, task = %parent, count = ours.len(), "follow-ups activated");
        }
        self.discard_older(theirs, fence).await
    }

    /// Removes the follow-ups an older claim of `parent` left pending (a run
    /// that crashed or stalled before it could remove them), once this claim,
    /// with `fence`, has written its outcome: nothing can activate them any
    /// more. Only a task claimed before (in any round, or before a requeue)
    /// can have them, so a task's first claim costs nothing.
    pub(super) async fn collect_older_follow_ups(&self, parent: &Key, record: &Record, fence: u64) {
        if record.fence() <= 1 {
            return;
        }
        let fence = i64::try_from(fence).unwrap_or(i64::MAX);
        let q = Query::eq(bson::doc! { fields::PARENT: parent.as_bson().clone() })
            .when(Condition::Exists(pending::FENCE.into()));
        let found = match self.store.find(&self.queue.coll, &q).await {
            Ok(found) => found,
            Err(e) => {
                return tracing::warn!(agent = %self.name, task = %parent, error = %e, "could not look for stale pending follow-ups")
            }
        };
        if let Err(e) = self.discard_older(found, fence).await {
            tracing::warn!(agent = %self.name, task = %parent, error = %e, "could not remove stale pending follow-ups");
        }
    }

    /// Removes those of `found` pending with a fence below `fence`: only an
    /// older claim's, since a newer one's may still be activated by it.
    async fn discard_older(&self, found: Vec<Record>, fence: i64) -> Result<(), AgentError> {
        for r in found {
            if let Some(old) = r.get_i64(pending::FENCE).filter(|&f| f < fence) {
                self.discard_pending(r.key(), old).await?;
            }
        }
        Ok(())
    }

    /// Removes the follow-ups of `parent` that the stale claim `fence` left
    /// pending, once its outcome write was rejected. Unless that claim's outcome
    /// was written after all (an earlier attempt of the write applied before the
    /// claim lapsed: the task then names `fence` as its follow-ups' and the next
    /// claimer activates them), nothing can activate them any more: the fence
    /// has moved on.
    pub(super) async fn discard_stale_follow_ups(&self, parent: &Key, fence: u64) -> Result<(), AgentError> {
        let fence = i64::try_from(fence).unwrap_or(i64::MAX);
        let (store, coll) = (&self.store, &self.queue.coll);
        let current = store.get(coll, parent).await?.record;
        if current.as_ref().and_then(|r| r.get_i64(pending::PARENT_FENCE)) == Some(fence) {
            return Ok(());
        }
        let q = Query::eq(bson::doc! { fields::PARENT: parent.as_bson().clone(), pending::FENCE: fence });
        for r in store.find(coll, &q).await? {
            self.discard_pending(r.key(), fence).await?;
        }
        Ok(())
    }

    /// Deletes one follow-up while it is still pending with `fence`.
    async fn discard_pending(&self, key: &Key, fence: i64) -> Result<(), AgentError> {
        let still = Condition::FieldEq(pending::FENCE.into(), Bson::Int64(fence));
        self.store.delete(&self.queue.coll, key, &still).await?;
        tracing::info!(agent = %self.name, task = %key, stale_fence = fence, "a stale claim's pending follow-up removed");
        Ok(())
    }

    /// Lets go of a task that waits for its follow-ups of `round`: ready again at
    /// once if they have all ended (the last of them may have ended before the
    /// task was marked waiting, and found nothing to wake), otherwise left for
    /// the last one to wake.
    pub(super) async fn settle_wait(&self, guard: LockGuard<S>, key: &Key, round: i64) -> Result<Record, LockError> {
        let open = match self.open_children(key.as_bson(), round).await {
            Ok(n) => n,
            // Dropping the guard gives the claim back; the next claimer settles.
            Err(e) => return Err(LockError::Store(e)),
        };
        let changes = if open == 0 { wake(Mutation::new(), round) } else { Mutation::new() };
        let out = guard.release_with(changes.set(fields::CLAIMED, false)).await;
        if open == 0 && out.is_ok() {
            tracing::info!(agent = %self.name, task = %key, round, "follow-ups all ended: task ready again");
        }
        out
    }

    pub(super) async fn open_children(&self, waiter: &Bson, round: i64) -> Result<u64, StoreError> {
        let q = joined_to(waiter, round).when(not_complete());
        self.store.count(&self.queue.coll, &q).await
    }

    /// After a follow-up ended: if every follow-up of its waiter's round has
    /// ended, makes the waiter ready. Idempotent; several last follow-ups ending
    /// at once make it ready once (the write is conditional on the round).
    pub(super) async fn notify_waiter(&self, record: &Record) -> Result<(), AgentError> {
        let Some(waiter) = record.get(fields::JOIN) else { return Ok(()) };
        let round = record.get_i64(fields::JOIN_ROUND).unwrap_or(0);
        self.wake_if_done(waiter, round).await
    }

    pub(super) async fn wake_if_done(&self, waiter: &Bson, round: i64) -> Result<(), AgentError> {
        if self.open_children(waiter, round).await? > 0 {
            return Ok(());
        }
        let key = Key::from_bson(waiter.clone())?;
        let waits = Condition::FieldEq(fields::WAITING.into(), Bson::Int64(round));
        let ungrouped = waits.and(Condition::Exists(fields::GROUP_AFTER_WAIT.into()).negate());
        let w = store_trait::Write::new(ungrouped, wake(Mutation::new(), round));
        if self.store.write(&self.queue.coll, &key, &w).await?.is_applied() {
            tracing::info!(agent = %self.name, task = %key, round, "follow-ups all ended: task ready");
            return Ok(());
        }
        // Woken already (another last follow-up), or a grouped fan-in task.
        self.wake_into_group(&key, round).await
    }

    /// Makes a grouped fan-in task whose follow-ups of `round` have all
    /// ended held in its group, in the place it was numbered in when its
    /// parent returned it; its group's agents let it through in turn. The
    /// write is announced in its slot first and landed after (as an
    /// activation's), so that an agent dying in between strands nothing.
    async fn wake_into_group(&self, key: &Key, round: i64) -> Result<(), AgentError> {
        let Some(r) = self.store.get(&self.queue.coll, key).await?.record else { return Ok(()) };
        if r.get_i64(fields::WAITING) != Some(round) || r.get(fields::GROUP_AFTER_WAIT).is_none() {
            return Ok(());
        }
        let waits = Condition::FieldEq(fields::WAITING.into(), Bson::Int64(round))
            .and(Condition::Exists(fields::GROUP_AFTER_WAIT.into()));
        let (Some(agent), Some(group)) = (r.get_str(fields::AGENT_NAME), r.get_str(fields::GROUP_KEY)) else {
            // Another program took its group away: it runs as an ungrouped task.
            let m = wake(Mutation::new(), round).unset(fields::GROUP_AFTER_WAIT);
            self.store.write(&self.queue.coll, key, &store_trait::Write::new(waits, m)).await?;
            return Ok(());
        };
        let slot = [(agent.to_owned(), group.to_owned(), r.get_i64(fields::GROUP_SEQ))];
        let announced = self.queue.groups()?.announce_all(slot).await?;
        let held = Mutation::new()
            .unset(fields::WAITING)
            .unset(fields::GROUP_AFTER_WAIT)
            .set(fields::GROUP_HELD, true)
            .set(fields::ROUND, round.saturating_add(1))
            .clear_gc();
        let written = self.store.write(&self.queue.coll, key, &store_trait::Write::new(waits, held)).await;
        // Made or not, the write is over: the slot waits for nothing.
        announced.land().await;
        if written?.is_applied() {
            tracing::info!(agent = %self.name, task = %key, round, group, "follow-ups all ended: fan-in task waits for its group's turn");
        }
        Ok(())
    }

    /// After `key` ended for good: marks the follow-ups it waited for (every
    /// round) for garbage collection, which they were not given when they ended,
    /// because it still had to read them. Best effort: a failure is logged, and
    /// leaves them kept, never lost.
    pub(super) async fn collect_children(&self, key: &Key, record: &Record) {
        let Some(ttl) = self.retain else { return };
        if task_round(record) == 0 {
            return;
        }
        let (store, coll) = (&self.store, &self.queue.coll);
        let joined = Query::eq(bson::doc! { fields::JOIN: key.as_bson().clone() });
        let ended = Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true));
        let mark = store_trait::Write::new(ended, Mutation::new().gc_after(ttl));
        let result = async {
            for child in store.find_each(coll, &joined).await?.into_iter().flatten() {
                store.write(coll, child.key(), &mark).await?;
            }
            Ok::<(), StoreError>(())
        };
        if let Err(e) = result.await {
            tracing::warn!(agent = %self.name, task = %key, error = %e, "could not mark follow-ups for garbage collection; they are kept");
        }
    }

    /// The follow-ups `key` waited for in `round`, in the order they were returned.
    pub(super) async fn children(&self, key: &Key, round: i64) -> Result<Vec<Child>, AgentError> {
        let found = self.store.find(&self.queue.coll, &joined_to(key.as_bson(), round)).await?;
        let mut children: Vec<Child> =
            found.into_iter().map(|r| Child { key: r.key().clone(), data: r.into_data() }).collect();
        // Follow-ups in the order they were returned, then a fan-in task the wait
        // extended to.
        children.sort_by_key(|c| (position(&c.key).is_none(), position(&c.key), c.key.to_string()));
        Ok(children)
    }

    /// Enqueues a successful handler's follow-ups; with a fan-in task, the
    /// follow-ups joined to it first, then the task, waiting for them.
    pub(super) async fn enqueue_follow_ups(
        &self,
        record: &Record,
        round: i64,
        fence: u64,
        children: Vec<NewTask>,
        then: Option<NewTask>,
    ) -> Result<(), AgentError> {
        let key = record.key();
        let Some(mut waiter) = then else { return self.enqueue_children(key, round, fence, children, None).await };
        let waiter_key = Key::new(format!("{}/then", child_prefix(key, round)))?;
        // Every follow-up exists before the fan-in task does: one that ends early
        // finds no task to wake, and never wakes it before its siblings exist.
        self.enqueue_children(key, round, fence, children, Some((waiter_key.as_bson().clone(), 0))).await?;
        waiter.id = Some(waiter_key.as_bson().clone());
        waiter.parent = Some(key.as_bson().clone());
        // Its id, derived from this task's, is what keeps it once: a dedupe
        // key (and so its scope) has no part in it.
        waiter.dedupe_key = None;
        waiter.dedupe_scope = DedupeScope::Forever;
        waiter.fan_in = true;
        // A wait on this task extends to the fan-in task: it is enqueued before
        // this task ends, so the waiter always sees one of them open.
        waiter.join = record.get(fields::JOIN).map(|w| (w.clone(), record.get_i64(fields::JOIN_ROUND).unwrap_or(0)));
        self.queue.enqueue_pending(std::slice::from_ref(&waiter), fence).await
    }

    /// Enqueues follow-ups, pending with the parent's claim `fence`, with ids
    /// derived from the parent, its round and their position, so a retried
    /// handler never duplicates them.
    pub(super) async fn enqueue_children(
        &self,
        parent: &Key,
        round: i64,
        fence: u64,
        children: Vec<NewTask>,
        join: Option<(Bson, i64)>,
    ) -> Result<(), AgentError> {
        if children.is_empty() {
            return Ok(());
        }
        let prefix = child_prefix(parent, round);
        let tasks: Vec<NewTask> = children
            .into_iter()
            .enumerate()
            .map(|(i, mut t)| {
                t.id = Some(Bson::String(format!("{prefix}/{i}")));
                t.parent = Some(parent.as_bson().clone());
                t.join = join.clone();
                t
            })
            .collect();
        self.queue.enqueue_pending(&tasks, fence).await
    }
}

/// A follow-up's place among its siblings, from its id (`…/i`); none for
/// a fan-in task (`…/then`).
fn position(key: &Key) -> Option<u64> {
    key.to_string().rsplit('/').next().and_then(|i| i.parse::<u64>().ok())
}

/// Follow-up ids: `parent/i` on a first run, `parent@round/i` after `round` joins.
pub(super) fn child_prefix(parent: &Key, round: i64) -> String {
    if round == 0 {
        parent.to_string()
    } else {
        format!("{parent}@{round}")
    }
}

/// Makes a task that waited on `round` ready again.
pub(super) fn wake(m: Mutation, round: i64) -> Mutation {
    m.unset(fields::WAITING).set(fields::READY, true).set(fields::ROUND, round.saturating_add(1)).clear_gc()
}
