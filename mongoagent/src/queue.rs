//! The queue collection: enqueueing, listing, statistics, requeueing.

use std::time::Duration;

use bson::{doc, Bson, Document};
use mongolock::ConfigError;
use store_trait::{
    fields as reserved, Collection, Condition, FaultKind, IndexSpec, InsertOutcome, Key, Order, Query, Record, Store,
    StoreError, StoreTime,
};
use tokio::sync::OnceCell;

use crate::error::AgentError;
use crate::schema::{claim_order, fields, not_complete, pending};
use crate::shared::Shared;
use crate::task::NewTask;

/// A queue collection, shared by producers and agents.
#[derive(Debug, Clone)]
pub struct Queue<S> {
    pub(crate) store: S,
    pub(crate) coll: Collection,
    indexes: std::sync::Arc<OnceCell<()>>,
    /// What the agents built on this queue's clones share: their claim gate
    /// and their view of the pause state.
    pub(crate) shared: Shared,
}

/// Counts of one agent's tasks by state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueStats {
    /// The agent name.
    pub agent_name: String,
    /// Ready and due now.
    pub ready: u64,
    /// Ready but not before a later time (delayed, or waiting to be retried).
    pub delayed: u64,
    /// Held by a live agent.
    pub running: u64,
    /// Claimed by an agent whose lease lapsed (crashed or hung): claimable again
    /// (to run, or to finish the fan-in step of a task that ended).
    pub lapsed: u64,
    /// Waiting for their follow-ups to end (fan-in).
    pub waiting: u64,
    /// Completed successfully.
    pub completed: u64,
    /// Failed for good.
    pub failed: u64,
    /// Whose latest attempt to have ended timed out
    /// ([`TimedOutAttempt`](crate::TimedOutAttempt)): waiting to be retried,
    /// held by the abandoned claim until it lapses, claimed again, or failed
    /// for good by it; not cancelled. Each is counted in its state too.
    pub timed_out: u64,
    /// How long the oldest ready task has waited, when its enqueue time is known
    /// (`ObjectId` ids carry it).
    pub oldest_ready_age: Option<Duration>,
}

impl<S: Store + Clone> Queue<S> {
    /// The queue in collection `name`.
    pub fn new(store: S, name: &str) -> Result<Self, AgentError> {
        let coll = Collection::new(name).map_err(|e| AgentError::Config(ConfigError::caused_by(e)))?;
        Ok(Queue { store, coll, indexes: Default::default(), shared: Default::default() })
    }

    /// The collection.
    pub fn collection(&self) -> &Collection {
        &self.coll
    }

    /// The collection of the queue's group slots (`<queue>_groups`, see
    /// [`crate::group`]).
    pub fn group_collection(&self) -> Result<Collection, AgentError> {
        Collection::new(format!("{}_groups", self.coll)).map_err(|e| AgentError::Config(ConfigError::caused_by(e)))
    }

    /// The queue's groups.
    pub(crate) fn groups(&self) -> Result<crate::group::Groups<S>, AgentError> {
        Ok(crate::group::Groups::new(self.store.clone(), self.coll.clone(), self.group_collection()?))
    }

    /// Creates the queue's indexes once: the claim index (equality, then sort
    /// fields), the recovery index, the dedupe index, the parent and fan-in
    /// indexes, and the TTL index that
    /// garbage-collects finished tasks marked for it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: index creation is idempotent; a dropped call is tried again by
    /// the next caller.
    pub async fn ensure_indexes(&self) -> Result<(), AgentError> {
        self.indexes
            .get_or_try_init(|| async {
                let claim = IndexSpec::new(
                    "claim",
                    vec![
                        (fields::AGENT_NAME.into(), Order::Asc),
                        (fields::READY.into(), Order::Asc),
                        (fields::PRIORITY.into(), Order::Desc),
                        (fields::RUN_AT.into(), Order::Asc),
                        (reserved::ID.into(), Order::Asc),
                    ],
                );
                let recover = IndexSpec::new(
                    "recover",
                    vec![(fields::AGENT_NAME.into(), Order::Asc), (fields::CLAIMED.into(), Order::Asc)],
                );
                let dedupe = IndexSpec::new("dedupe", vec![(fields::DEDUPE_KEY.into(), Order::Asc)]).unique().sparse();
                let parent = IndexSpec::new("parent", vec![(fields::PARENT.into(), Order::Asc)]).sparse();
                let join = IndexSpec::new(
                    "join",
                    vec![(fields::JOIN.into(), Order::Asc), (fields::JOIN_ROUND.into(), Order::Asc)],
                )
                .sparse();
                // A group's held tasks in order (`group/`); sparse: only grouped tasks.
                let group = IndexSpec::new(
                    "group",
                    vec![
                        (fields::GROUP_KEY.into(), Order::Asc),
                        (fields::GROUP_HELD.into(), Order::Asc),
                        (fields::GROUP_SEQ.into(), Order::Asc),
                    ],
                )
                .sparse();
                let all = [claim, recover, dedupe, parent, join, group, IndexSpec::gc()];
                self.store.ensure_indexes(&self.coll, &all).await
            })
            .await?;
        Ok(())
    }

    /// Enqueues tasks idempotently: a task whose id or dedupe key exists is
    /// reported as [`InsertOutcome::Duplicate`] of the task holding it, and
    /// not changed, except by a debounce ([`NewTask::debounce`]), which
    /// gives a never-claimed debounced task its data.
    ///
    /// Every task is settled even when one fails: a debounce refused
    /// ([`AgentError::KeyHeldByAnother`]) or a store fault while settling one
    /// duplicate leaves the others' inserts and debounces made, and the call
    /// returns the first such error.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in effect: a dropped call may or may not have inserted some of
    /// the tasks; enqueuing the same tasks again (same ids or dedupe keys) is
    /// idempotent, so retry.
    pub async fn enqueue_all(&self, tasks: &[NewTask]) -> Result<Vec<InsertOutcome>, AgentError> {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "mongoagent.enqueue",
            otel.kind = "producer",
            messaging.system = "mongoagent",
            messaging.operation.type = "send",
            messaging.destination.name = %self.coll,
            messaging.batch.message_count = tasks.len(),
        );
        self.enqueue_traced(tasks).instrument(span).await
    }

    /// [`Queue::enqueue_all`], in its span (whose trace each task carries).
    async fn enqueue_traced(&self, tasks: &[NewTask]) -> Result<Vec<InsertOutcome>, AgentError> {
        let mut docs = self.documents(tasks).await?;
        // Grouped tasks are numbered in their group before the insert, and
        // their agents nudged after it.
        let grouped = self.number_grouped(tasks, &mut docs).await?;
        // A grouped task with a dedupe key may go in only after its
        // duplicate is settled (its key moved off an ended task): inserted
        // in one batch, a later task of its group could be let through
        // before it. Such a call inserts its tasks one at a time, in order.
        let one_by_one = grouped.is_some() && tasks.iter().any(|t| t.group.is_some() && t.dedupe_key.is_some());
        let batches: Vec<Vec<usize>> =
            if one_by_one { (0..docs.len()).map(|i| vec![i]).collect() } else { vec![(0..docs.len()).collect()] };
        let mut out = Vec::with_capacity(docs.len());
        let mut first_error = None;
        for batch in batches {
            let inserted =
                match self.store.insert_many(&self.coll, batch.iter().map(|&i| docs[i].clone()).collect()).await {
                    Ok(inserted) => inserted,
                    Err(e) => {
                        // Made or not, the numbered inserts are over: said so, a
                        // slot waits for nothing (an ambiguous insert that did land
                        // is let through by this very nudge).
                        if let Some(n) = grouped {
                            n.land().await;
                        }
                        return Err(e.into());
                    }
                };
            for (i, mut outcome) in batch.into_iter().zip(inserted) {
                if let InsertOutcome::Duplicate(key) = &outcome {
                    match self.settle_duplicate(docs[i].clone(), &tasks[i], key.clone()).await {
                        Ok(settled) => outcome = settled,
                        Err(e) => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
                out.push(outcome);
            }
        }
        // The tasks are in, and their slot stays in the sweep until this
        // lands: a failed nudge delays them, and is no reason to enqueue again.
        if let Some(n) = grouped {
            n.land().await;
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        tracing::debug!(queue = %self.coll, count = out.len(), "tasks enqueued");
        Ok(out)
    }

    /// Enqueues a claimed task's follow-ups **pending**: not claimable, not
    /// joined to any waiter, and marked with the parent's claim fence, until the
    /// parent's fenced outcome write has claimed them and they are activated
    /// ([`pending::activation`]). A stale run's follow-ups thus never run, and
    /// never stand in for the current holder's: a pending duplicate left by an
    /// older claim of the parent (a smaller fence) is replaced.
    ///
    /// A grouped follow-up is numbered in its group here, in the order the
    /// handler returned it: by the claim that made it, once, so that
    /// whichever process activates it (this claim, or the next after a
    /// crash) and however often, its place is the same.
    pub(crate) async fn enqueue_pending(&self, tasks: &[NewTask], fence: u64) -> Result<(), AgentError> {
        let fence = i64::try_from(fence).unwrap_or(i64::MAX);
        let mut docs = self.documents(tasks).await?;
        let grouped = self.number_grouped(tasks, &mut docs).await?;
        let docs: Vec<Document> = docs.into_iter().map(|d| pending::stash(d, fence)).collect();
        let placed = async {
            let out = self.store.insert_many(&self.coll, docs.clone()).await?;
            for (doc, outcome) in docs.into_iter().zip(out) {
                if let InsertOutcome::Duplicate(key) = outcome {
                    self.place_pending(&key, doc, fence).await?;
                }
            }
            Ok::<(), AgentError>(())
        }
        .await;
        // Pending, the follow-ups are no group's held tasks yet: their slots
        // wait for nothing (their activation announces itself).
        if let Some(n) = grouped {
            n.land().await;
        }
        placed
    }

    /// Numbers the grouped documents among `docs` (those of `tasks`) in
    /// their groups before their insert: what to land after it, if any.
    async fn number_grouped(
        &self,
        tasks: &[NewTask],
        docs: &mut [Document],
    ) -> Result<Option<crate::group::Announced<S>>, AgentError> {
        if !tasks.iter().any(|t| t.group.is_some()) {
            return Ok(None);
        }
        Ok(Some(self.groups()?.numbered(docs).await?))
    }

    /// Puts `doc`, a follow-up pending with `fence`, where its insert found a
    /// duplicate. At its id: an older claim's pending copy is replaced; a copy
    /// that is gone by the time it is read (its stale run removed it) is no
    /// reason to give up: ours goes in; ours, a newer claim's copy, or the
    /// follow-up already active settle it, and they are known by their
    /// `parent`: a task of another parent at that id (enqueued by hand with
    /// that id) is an error, never taken for ours. Nothing at its id: its
    /// dedupe key is another task's, which stands for it as any enqueue's
    /// duplicate does, unless something waits for this follow-up (it must be
    /// its own task) or that task is itself pending (it may yet be removed:
    /// try again later). A stale run may insert again between a removal and
    /// our insert; it inserts once, so a few rounds settle it. Unsettled, an
    /// error: the outcome that needs this follow-up is not written without it.
    async fn place_pending(&self, key: &Key, doc: Document, fence: i64) -> Result<(), AgentError> {
        let transient = |why: String| AgentError::Store(StoreError::backend(FaultKind::Transient, why));
        for _ in 0..4 {
            if let Some(current) = self.store.get(&self.coll, key).await?.record {
                // Fences count one parent's claims: only a copy of the same
                // parent is compared by fence (another parent's id can derive
                // the same follow-up id: `job` round 1 and `job@1` round 0).
                let same_parent = current.get(fields::PARENT) == doc.get(fields::PARENT);
                match current.get_i64(pending::FENCE) {
                    Some(theirs) if same_parent && theirs < fence => {
                        let cond = Condition::FieldEq(pending::FENCE.into(), Bson::Int64(theirs));
                        self.store.delete(&self.coll, key, &cond).await?;
                        tracing::info!(queue = %self.coll, task = %key, stale_fence = theirs, fence, "stale pending follow-up replaced");
                    }
                    _ if same_parent => return Ok(()),
                    _ => {
                        return Err(AgentError::InvalidTask(format!(
                            "follow-up {key}: its id is taken by a task of another parent in {}",
                            self.coll
                        )))
                    }
                }
            }
            if matches!(
                self.store.insert_many(&self.coll, vec![doc.clone()]).await?.first(),
                Some(InsertOutcome::Inserted(_))
            ) {
                return Ok(());
            }
            if self.store.get(&self.coll, key).await?.record.is_some() {
                continue;
            }
            // Nothing at its id, yet a duplicate: its dedupe key is taken.
            let Ok(dedupe) = doc.get_str(fields::DEDUPE_KEY) else { continue };
            let joined = doc.get_document(pending::FIELDS).is_ok_and(|f| f.contains_key(fields::JOIN));
            if joined {
                return Err(AgentError::InvalidTask(format!(
                    "follow-up {key}: its dedupe key {dedupe:?} is another task's, and a follow-up something waits for must be its own task"
                )));
            }
            let holder = self.store.find(&self.coll, &Query::eq(doc! { fields::DEDUPE_KEY: dedupe }).limit(1)).await?;
            let same_parent = |h: &Record| h.get(fields::PARENT) == doc.get(fields::PARENT);
            match holder.first() {
                // A sibling this claim returned before it, with the key: it
                // stands for this one, as the first of two enqueues of one
                // key does for the second.
                Some(h) if h.get_i64(pending::FENCE) == Some(fence) && same_parent(h) => {
                    tracing::info!(queue = %self.coll, task = %key, dedupe, existing = %h.key(), "follow-up deduplicated against its sibling");
                    return Ok(());
                }
                // An older claim's follow-up of the same parent: that claim
                // can no longer write its outcome, so it never runs.
                Some(h) if h.get_i64(pending::FENCE).is_some_and(|theirs| theirs < fence) && same_parent(h) => {
                    let theirs = h.get_i64(pending::FENCE).unwrap_or_default();
                    let cond = Condition::FieldEq(pending::FENCE.into(), Bson::Int64(theirs));
                    self.store.delete(&self.coll, h.key(), &cond).await?;
                    tracing::info!(queue = %self.coll, task = %h.key(), stale_fence = theirs, fence, "stale pending follow-up holding the key removed");
                }
                Some(h) if h.get_i64(pending::FENCE).is_some() => {
                    return Err(transient(format!(
                        "follow-up {key}: its dedupe key {dedupe:?} is held by a pending task; try again"
                    )))
                }
                // A task that still blocks the key stands for this one; one
                // whose scope no longer blocks (ended, its window passed)
                // gives the key up, and this one goes in.
                Some(_) => {
                    if let Some(existing) = self.free_key(dedupe).await? {
                        tracing::info!(queue = %self.coll, task = %key, dedupe, %existing, "follow-up deduplicated against an existing task");
                        return Ok(());
                    }
                }
                None => {}
            }
        }
        Err(transient(format!("follow-up {key} in {} kept being replaced by other runs; try again", self.coll)))
    }

    /// The documents to insert for `tasks`.
    pub(crate) async fn documents(&self, tasks: &[NewTask]) -> Result<Vec<Document>, AgentError> {
        self.ensure_indexes().await?;
        let windowed = |t: &NewTask| matches!(t.dedupe_scope, crate::task::DedupeScope::For(_));
        let now = if tasks.iter().any(|t| t.delay.is_some() || windowed(t) || t.dedupe_scope.debounce().is_some()) {
            Some(self.store.now().await?)
        } else {
            None
        };
        tasks
            .iter()
            .map(|t| {
                let mut d = t.to_document()?;
                if let (Some(after), Some(now)) = (t.starts_after(), now) {
                    let ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX / 2);
                    // With an absolute `run_at` too, the later of the two.
                    let at = now.as_millis().saturating_add(ms).max(t.run_at.map_or(i64::MIN, |a| a.as_millis()));
                    d.insert(fields::RUN_AT, bson::DateTime::from_millis(at));
                }
                if let (crate::task::DedupeScope::For(w), Some(now)) = (t.dedupe_scope, now) {
                    let ms = i64::try_from(w.as_millis()).unwrap_or(i64::MAX / 2);
                    d.insert(fields::DEDUPE_UNTIL, bson::DateTime::from_millis(now.as_millis().saturating_add(ms)));
                }
                // The enqueue's span (a follow-up's: its parent's run).
                crate::trace::inject(&tracing::Span::current(), &mut d);
                Ok(d)
            })
            .collect::<Result<Vec<_>, AgentError>>()
    }

    /// Enqueues one task; returns its id and whether it was new (for a
    /// duplicate, the id of the task holding its id or dedupe key; for a
    /// debounce, the pending task that took its data: see
    /// [`DedupeScope`](crate::DedupeScope)).
    ///
    /// # Cancel safety
    ///
    /// As [`Queue::enqueue_all`]: a dropped call may or may not have inserted the
    /// task; enqueuing it again with the same id or dedupe key is idempotent.
    pub async fn enqueue(&self, task: NewTask) -> Result<(Key, bool), AgentError> {
        match self.enqueue_all(std::slice::from_ref(&task)).await?.pop() {
            Some(InsertOutcome::Inserted(k)) => Ok((k, true)),
            Some(InsertOutcome::Duplicate(k)) => Ok((k, false)),
            _ => Err(AgentError::InvalidTask("enqueue returned no outcome".into())),
        }
    }

    /// Tasks matching an equality filter, in claim order (the Ruby `mongo_agent`'s `get_tasks`).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read.
    pub async fn tasks(&self, filter: Document, limit: Option<u32>) -> Result<Vec<Record>, AgentError> {
        let mut q = claim_order(Query::eq(filter));
        q.limit = limit;
        Ok(self.store.find(&self.coll, &q).await?)
    }

    /// As [`Queue::tasks`], each document read on its own: one the store cannot
    /// read (another program's, with a UUID `_id` or a string `fence`) is an
    /// `Err(`[`StoreError::Malformed`]`)` in its place, naming its raw `_id`, and
    /// the others are listed.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read.
    pub async fn tasks_each(
        &self,
        filter: Document,
        limit: Option<u32>,
    ) -> Result<Vec<Result<Record, StoreError>>, AgentError> {
        let mut q = claim_order(Query::eq(filter));
        q.limit = limit;
        Ok(self.store.find_each(&self.coll, &q).await?)
    }

    /// A page of [`Queue::tasks_each`]: the `skip` tasks before it are passed
    /// over by their ids alone (read with a projection where the store has
    /// one), and only the page's `limit` tasks are read whole, each as in
    /// [`Queue::tasks_each`]. A task that stops matching between the two
    /// reads is left out of the page.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: reads.
    pub async fn tasks_page(
        &self,
        filter: Document,
        skip: u32,
        limit: u32,
    ) -> Result<Vec<Result<Record, StoreError>>, AgentError> {
        if skip == 0 {
            return self.tasks_each(filter, Some(limit)).await;
        }
        let mut ids = claim_order(Query::eq(filter.clone()));
        ids.limit = Some(skip.saturating_add(limit));
        let page: Vec<Key> = self.store.find_keys(&self.coll, &ids).await?.into_iter().skip(skip as usize).collect();
        if page.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = claim_order(Query::eq(filter));
        q.keys = Some(page);
        Ok(self.store.find_each(&self.coll, &q).await?)
    }

    /// Per-state counts of one agent's tasks (each count an equality query the
    /// queue's indexes serve).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: reads only.
    pub async fn stats(&self, agent_name: &str) -> Result<QueueStats, AgentError> {
        let eq = |extra: Document| {
            let mut d = doc! { fields::AGENT_NAME: agent_name };
            d.extend(extra);
            Query::eq(d)
        };
        let due = Condition::DueBy(fields::RUN_AT.into());
        let count = |q: Query| async move { self.store.count(&self.coll, &q).await };
        let ready = || eq(doc! { fields::READY: true }).when(not_complete());
        let claimed = || eq(doc! { fields::CLAIMED: true }).when(not_complete());
        // Read per document: another program's unreadable task must not fail the stats.
        let oldest = self
            .store
            .find_each(&self.coll, &ready().when(due.clone()).sort(reserved::ID, Order::Asc).limit(1))
            .await?;
        let oldest_ready_age = match oldest.first().and_then(|r| r.as_ref().ok()).map(|r| r.key().as_bson().clone()) {
            Some(Bson::ObjectId(oid)) => {
                let now = self.store.now().await?;
                Some(StoreTime::from_millis(oid.timestamp().timestamp_millis()).until(now))
            }
            _ => None,
        };
        Ok(QueueStats {
            agent_name: agent_name.to_owned(),
            ready: count(ready().when(due.clone())).await?,
            delayed: count(ready().when(due.negate())).await?,
            running: count(claimed().when(Condition::Free.negate())).await?,
            // Including ended tasks whose agent died before the fan-in step.
            lapsed: count(eq(doc! { fields::CLAIMED: true }).when(Condition::Free)).await?,
            waiting: count(eq(doc! {}).when(Condition::Exists(fields::WAITING.into()))).await?,
            completed: count(eq(doc! { fields::COMPLETE: true, fields::ERROR_ENCOUNTERED: false })).await?,
            failed: count(eq(doc! { fields::COMPLETE: true, fields::ERROR_ENCOUNTERED: true })).await?,
            timed_out: count(
                eq(doc! {}).when(
                    Condition::Exists(fields::TIMED_OUT_FENCE.into())
                        .and(Condition::FieldEq(fields::CANCELLED.into(), Bson::Boolean(true)).negate()),
                ),
            )
            .await?,
            oldest_ready_age,
        })
    }
}
