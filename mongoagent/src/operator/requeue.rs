//! Requeueing: tasks that failed for good, or whose claim lapsed, made
//! ready again ([`Queue::requeue`], [`Queue::requeue_ids`]), and the list of
//! those that failed for good ([`Queue::failed_tasks`]).

use bson::{Bson, Document};
use store_trait::{Condition, Key, Mutation, Order, Query, Record, Store, StoreError, Write};

use crate::error::AgentError;
use crate::queue::Queue;
use crate::schema::fields;

/// Tasks that failed for good; not those cancelled (an operator ended them
/// on purpose, so a requeue leaves them alone).
fn failed_for_good() -> Condition {
    Condition::FieldEq(fields::ERROR_ENCOUNTERED.into(), Bson::Boolean(true))
        .and(Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true)))
        .and(Condition::FieldEq(fields::CANCELLED.into(), Bson::Boolean(true)).negate())
}

impl<S: Store + Clone> Queue<S> {
    /// The tasks matching an equality `filter` that failed for good (not
    /// those [cancelled](Queue::cancel)), the latest to end first, each read
    /// on its own as in [`Queue::tasks_each`]; `last_error` holds why.
    /// [`Queue::requeue`] revives them.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read.
    pub async fn failed_tasks(
        &self,
        filter: Document,
        limit: Option<u32>,
    ) -> Result<Vec<Result<Record, StoreError>>, AgentError> {
        let mut q = Query::eq(filter).when(failed_for_good()).sort(fields::COMPLETED_AT, Order::Desc);
        q.limit = limit;
        Ok(self.store.find_each(&self.coll, &q).await?)
    }

    /// The work of [`Queue::requeue`](crate::operator::Requeue).
    pub(crate) async fn requeue_matching(&self, filter: Document, dry_run: bool) -> Result<Vec<Key>, AgentError> {
        // A cancelled task stays cancelled: an operator ended it on purpose.
        let failed = failed_for_good();
        let lapsed = Condition::FieldEq(fields::CLAIMED.into(), Bson::Boolean(true))
            .and(Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true)).negate())
            .and(Condition::Free);
        let which = failed.or(lapsed);
        let mut out = Vec::new();
        for r in self.readable_matches(filter, which.clone(), "requeue").await? {
            if dry_run {
                out.push(r.key().clone());
                continue;
            }
            // Conditional on the same state, so a task that an agent picked up in
            // the meantime is left alone. The fence grows, so a late outcome of
            // the agent whose claim lapsed is rejected by its fence check.
            // Attempts start over: they count from the fence this write gives.
            let fresh = i64::try_from(r.fence().saturating_add(1)).unwrap_or(i64::MAX);
            let revive = Mutation::new()
                .release()
                .bump_fence()
                .set(fields::ROUND_FENCE, fresh)
                .set(fields::READY, true)
                .set(fields::COMPLETE, false)
                .set(fields::ERROR_ENCOUNTERED, false)
                .set(fields::CLAIMED, false)
                .unset(fields::RUN_AT)
                // Live again: the TTL index must not delete it.
                .clear_gc();
            // Its attempts start over: a timeout of the old ones is history.
            let revive = crate::schema::timed_out::clear(revive, r.data());
            // A key moved off it when it ended (a later task took it) is taken
            // back, or the task is live beside another task with its key: the
            // unique index refuses the write while another task holds it, and
            // a holder that still blocks stands for this one, which stays ended.
            let retired = match r.get_str(fields::DEDUPE_KEY) {
                None => r.get_str(fields::DEDUPE_RETIRED).map(str::to_owned),
                Some(_) => None,
            };
            let revive = match &retired {
                Some(k) => revive.set(fields::DEDUPE_KEY, k.as_str()).unset(fields::DEDUPE_RETIRED),
                None => revive,
            };
            // A grouped task that had ended left its group's slot: it waits
            // for its turn again (its number keeps its place), and its
            // group's agents are nudged below. A lapsed one kept its slot.
            let group = match (r.get_str(fields::GROUP_KEY), r.get_bool(fields::COMPLETE)) {
                (Some(g), Some(true)) => Some(g.to_owned()),
                _ => None,
            };
            let revive = match &group {
                Some(_) => revive.set(fields::READY, false).set(fields::GROUP_HELD, true),
                None => revive,
            };
            // Announced in its slot first (which stays in the sweep until
            // the landing below), so a requeue that dies before it loses
            // nothing.
            if let (Some(g), Some(agent)) = (&group, r.get_str(fields::AGENT_NAME)) {
                self.groups()?.announce(agent, g, r.get_i64(fields::GROUP_SEQ)).await?;
            }
            let w = Write::new(which.clone().and(Condition::FenceIs(r.fence())), revive);
            let applied: Result<bool, AgentError> = async {
                for _ in 0..4 {
                    match self.store.write(&self.coll, r.key(), &w).await {
                        Ok(o) => return Ok(o.is_applied()),
                        Err(StoreError::DuplicateKey { .. }) if retired.is_some() => {
                            let k = retired.as_deref().unwrap_or_default();
                            if let Some(holder) = self.free_key(k).await? {
                                tracing::info!(queue = %self.coll, task = %r.key(), dedupe = k, %holder, "not requeued: its dedupe key is held by a live task");
                                return Ok(false);
                            }
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(false)
            }
            .await;
            // Made or not, the announced write is over (and a task held
            // again is let through by this nudge).
            if let (Some(g), Some(agent)) = (&group, r.get_str(fields::AGENT_NAME)) {
                self.groups()?.landed(agent, g).await?;
            }
            if applied? {
                out.push(r.key().clone());
            }
        }
        Ok(out)
    }
}
