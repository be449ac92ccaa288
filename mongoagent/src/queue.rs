//! The queue collection: enqueueing, listing, statistics, requeueing.

use std::time::Duration;

use bson::{doc, Bson, Document};
use store_trait::{
    fields as reserved, Collection, Condition, IndexSpec, InsertOutcome, Key, Mutation, Order, Query, Record, Store,
    StoreTime, Write,
};
use tokio::sync::OnceCell;

use crate::agent::claim_order;
use crate::task::fields;
use crate::{AgentError, NewTask};

/// A queue collection, shared by producers and agents.
#[derive(Debug, Clone)]
pub struct Queue<S> {
    pub(crate) store: S,
    pub(crate) coll: Collection,
    indexes: std::sync::Arc<OnceCell<()>>,
    /// Agents on clones of this queue claim one at a time.
    pub(crate) claim_gate: std::sync::Arc<tokio::sync::Mutex<()>>,
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
    pub stuck: u64,
    /// Waiting for their follow-ups to end (fan-in).
    pub waiting: u64,
    /// Completed successfully.
    pub completed: u64,
    /// Failed for good.
    pub failed: u64,
    /// How long the oldest ready task has waited, when its enqueue time is known
    /// (`ObjectId` ids carry it).
    pub oldest_ready_age: Option<Duration>,
}

pub(crate) fn not_complete() -> Condition {
    Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true)).negate()
}

impl<S: Store + Clone> Queue<S> {
    /// The queue in collection `name`.
    pub fn new(store: S, name: &str) -> Result<Self, AgentError> {
        let coll = Collection::new(name).map_err(|e| AgentError::Config(e.to_string()))?;
        Ok(Queue { store, coll, indexes: Default::default(), claim_gate: Default::default() })
    }

    /// The collection.
    pub fn collection(&self) -> &Collection {
        &self.coll
    }

    /// Creates the queue's indexes once: the claim index (equality, then sort
    /// fields), the recovery index, the dedupe index, the parent and fan-in
    /// indexes, and the TTL index that
    /// garbage-collects finished tasks marked for it.
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
                self.store.ensure_indexes(&self.coll, &[claim, recover, dedupe, parent, join, IndexSpec::gc()]).await
            })
            .await?;
        Ok(())
    }

    /// Enqueues tasks idempotently: a task whose id or dedupe key exists is
    /// reported as [`InsertOutcome::Duplicate`] and not changed.
    pub async fn enqueue_all(&self, tasks: &[NewTask]) -> Result<Vec<InsertOutcome>, AgentError> {
        self.ensure_indexes().await?;
        let now = if tasks.iter().any(|t| t.delay.is_some()) { Some(self.store.now().await?) } else { None };
        let docs = tasks
            .iter()
            .map(|t| {
                let mut d = t.to_document()?;
                if let (Some(delay), Some(now)) = (t.delay, now) {
                    let ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 2);
                    // With an absolute `run_at` too, the later of the two.
                    let at = now.as_millis().saturating_add(ms).max(t.run_at.map_or(i64::MIN, |a| a.as_millis()));
                    d.insert(fields::RUN_AT, bson::DateTime::from_millis(at));
                }
                Ok(d)
            })
            .collect::<Result<Vec<_>, AgentError>>()?;
        let out = self.store.insert_many(&self.coll, docs).await?;
        tracing::debug!(queue = %self.coll, count = out.len(), "tasks enqueued");
        Ok(out)
    }

    /// Enqueues one task; returns its id and whether it was new.
    pub async fn enqueue(&self, task: NewTask) -> Result<(Key, bool), AgentError> {
        match self.enqueue_all(std::slice::from_ref(&task)).await?.pop() {
            Some(InsertOutcome::Inserted(k)) => Ok((k, true)),
            Some(InsertOutcome::Duplicate(k)) => Ok((k, false)),
            _ => Err(AgentError::InvalidTask("enqueue returned no outcome".into())),
        }
    }

    /// Tasks matching an equality filter, in claim order (the seed's `get_tasks`).
    pub async fn tasks(&self, filter: Document, limit: Option<u32>) -> Result<Vec<Record>, AgentError> {
        let mut q = claim_order(Query::eq(filter));
        q.limit = limit;
        Ok(self.store.find(&self.coll, &q).await?)
    }

    /// Per-state counts of one agent's tasks (each count an equality query the
    /// queue's indexes serve).
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
        let oldest =
            self.store.find(&self.coll, &ready().when(due.clone()).sort(reserved::ID, Order::Asc).limit(1)).await?;
        let oldest_ready_age = match oldest.first().map(|r| r.key().as_bson().clone()) {
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
            stuck: count(eq(doc! { fields::CLAIMED: true }).when(Condition::Free)).await?,
            waiting: count(eq(doc! {}).when(Condition::Exists(fields::WAITING.into()))).await?,
            completed: count(eq(doc! { fields::COMPLETE: true, fields::ERROR_ENCOUNTERED: false })).await?,
            failed: count(eq(doc! { fields::COMPLETE: true, fields::ERROR_ENCOUNTERED: true })).await?,
            oldest_ready_age,
        })
    }

    /// Makes tasks matching `filter` that failed for good, or are stuck with a
    /// lapsed claim, ready again (attempt counts are kept). Returns their ids; with
    /// `dry_run`, only lists them.
    pub async fn requeue(&self, filter: Document, dry_run: bool) -> Result<Vec<Key>, AgentError> {
        let failed = Condition::FieldEq(fields::ERROR_ENCOUNTERED.into(), Bson::Boolean(true))
            .and(Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true)));
        let stuck = Condition::FieldEq(fields::CLAIMED.into(), Bson::Boolean(true))
            .and(Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true)).negate())
            .and(Condition::Free);
        let which = failed.or(stuck);
        let candidates = self.store.find(&self.coll, &Query::eq(filter).when(which.clone())).await?;
        let mut out = Vec::new();
        for r in candidates {
            if dry_run {
                out.push(r.key().clone());
                continue;
            }
            // Conditional on the same state, so a task that an agent picked up in
            // the meantime is left alone.
            let w = Write::new(
                which.clone(),
                Mutation::new()
                    .release()
                    .set(fields::READY, true)
                    .set(fields::COMPLETE, false)
                    .set(fields::ERROR_ENCOUNTERED, false)
                    .set(fields::CLAIMED, false)
                    .unset(fields::RUN_AT),
            );
            if self.store.write(&self.coll, r.key(), &w).await?.is_applied() {
                out.push(r.key().clone());
            }
        }
        Ok(out)
    }
}
