//! [`Overlap::Queue`]: held ticks let through one at a time, and those left
//! held by a change to another policy.

use bson::{doc, Bson};
use store_trait::{Condition, Key, Mutation, Query, Store, Write};

use super::{fields, unchanged, Overlap, Schedules};
use crate::error::AgentError;
use crate::schema::fields as task_fields;
use crate::schema::not_complete;

/// How many tasks held under [`Overlap::Queue`] a pass lets through at once
/// after a change to [`Overlap::Allow`] (the rest, in the next passes).
const LET_ALL_BATCH: u32 = 100;

impl<S: Store + Clone> Schedules<S> {
    /// With [`Overlap::Queue`]: lets the oldest held task of the schedule
    /// through once the one let through before has ended. Returns whether
    /// held tasks remain.
    ///
    /// One at a time across processes: the schedule's `running` field moves
    /// from an ended task to the next by a compare-and-set, and only then is
    /// that task made ready (a process that dies between the two leaves it to
    /// the next pass, which finishes the step).
    ///
    /// Under another policy, the tasks held under Queue before a change: with
    /// [`Overlap::Skip`] still one at a time; with [`Overlap::Allow`] all at
    /// once, since Allow lets ticks overlap and waiting for one at a time
    /// would wait for Allow's own ticks, which need never all have ended at
    /// once. Once none is held, the schedule's `running` mark is removed.
    ///
    /// The policy is the definition's as read here, not as the pass read it
    /// (a pass that reached the schedule late, after a change from Allow to
    /// Queue, would let that Queue period's held ticks through at once).
    /// Nothing is let through while the schedule is paused.
    pub(crate) async fn let_through(&self, name: &str) -> Result<bool, AgentError> {
        let key = Self::key(name)?;
        let Some(sched) = self.store.get(&self.coll, &key).await?.record else { return Ok(false) };
        if sched.data().get_bool(fields::PAUSED).unwrap_or(false) {
            return self.has_held(name).await;
        }
        let overlap = super::parse_record(&sched)?.overlap;
        if overlap == Overlap::Allow {
            return self.let_all_through(name, &key).await;
        }
        let running = sched.data().get(fields::RUNNING).filter(|b| !matches!(b, Bson::Null)).cloned();
        if let Some(id) = &running {
            let task = self.store.get(&self.queue.coll, &Key::from_bson(id.clone())?).await?.record;
            if let Some(t) = task {
                if t.data().get_bool(task_fields::COMPLETE).ok() != Some(true) {
                    // Not ended: make sure it was let through (a process may have
                    // died between the two steps), and wait for it.
                    if t.data().get_bool(task_fields::OVERLAP_HELD).ok() == Some(true) {
                        self.release(id.clone()).await?;
                    }
                    return self.has_held(name).await;
                }
            }
        }
        let oldest = Query::eq(doc! { task_fields::SCHEDULE: name, task_fields::OVERLAP_HELD: true })
            .sort(task_fields::SCHEDULED_FOR, store_trait::Order::Asc)
            .limit(1);
        let Some(next) = self.store.find(&self.queue.coll, &oldest).await?.into_iter().next() else {
            return self.unmark_if_not_queued(&key, overlap).await;
        };
        // None let through by this policy: a tick enqueued under another
        // (before a change to Queue) may still run, and is waited for.
        if running.is_none() && self.has_unheld_unfinished(name).await? {
            // Under another policy, passes with no tick due look for held
            // ticks only where the definition carries the mark: set it
            // (emptied), so the first held tick goes as soon as that tick ends.
            if overlap != Overlap::Queue && !sched.data().contains_key(fields::RUNNING) {
                let unmarked = Condition::Exists(fields::RUNNING.into())
                    .negate()
                    .and(unchanged(&sched, fields::VERSION))
                    .and(unchanged(&sched, fields::SINCE));
                self.store
                    .write(&self.coll, &key, &Write::new(unmarked, Mutation::new().set(fields::RUNNING, Bson::Null)))
                    .await?;
            }
            return Ok(true);
        }
        let next_id = next.key().as_bson().clone();
        // For the definition read: a let-through that stalled across a change
        // to another policy and back must not mark a tick of the old period.
        let cond = match running {
            Some(id) => Condition::FieldEq(fields::RUNNING.into(), id),
            None => Condition::Exists(fields::RUNNING.into()).negate(),
        }
        .and(unchanged(&sched, fields::VERSION))
        .and(unchanged(&sched, fields::SINCE))
        .and(unchanged(&sched, fields::PAUSED));
        let w = Write::new(cond, Mutation::new().set(fields::RUNNING, next_id.clone()));
        if self.store.write(&self.coll, &key, &w).await?.is_applied() {
            self.release(next_id).await?;
            tracing::info!(schedule = %name, task = %next.key(), "held tick let through");
        }
        self.has_held(name).await
    }

    /// Makes a held task ready; whether it was held.
    async fn release(&self, id: Bson) -> Result<bool, AgentError> {
        let k = Key::from_bson(id)?;
        let w = Write::new(
            Condition::FieldEq(task_fields::OVERLAP_HELD.into(), Bson::Boolean(true)),
            Mutation::new().set(task_fields::READY, true).unset(task_fields::OVERLAP_HELD),
        );
        Ok(self.store.write(&self.queue.coll, &k, &w).await?.is_applied())
    }

    /// [`Schedules::let_through`] under [`Overlap::Allow`]: up to
    /// [`LET_ALL_BATCH`] held tasks a pass, oldest first.
    async fn let_all_through(&self, name: &str, key: &Key) -> Result<bool, AgentError> {
        let held = Query::eq(doc! { task_fields::SCHEDULE: name, task_fields::OVERLAP_HELD: true })
            .sort(task_fields::SCHEDULED_FOR, store_trait::Order::Asc)
            .limit(LET_ALL_BATCH);
        let found = self.store.find(&self.queue.coll, &held).await?;
        let mut released = 0_usize;
        for t in &found {
            released += usize::from(self.release(t.key().as_bson().clone()).await?);
        }
        if released > 0 {
            tracing::info!(schedule = %name, released, "held ticks let through: the schedule lets ticks overlap now");
        }
        if found.len() < usize::try_from(LET_ALL_BATCH).unwrap_or(usize::MAX) {
            return self.unmark_if_not_queued(key, Overlap::Allow).await;
        }
        Ok(true)
    }

    /// With no held task left under a policy other than Queue, removes the
    /// emptied `running` mark, so that passes stop looking for held tasks.
    /// Returns that none is held.
    async fn unmark_if_not_queued(&self, key: &Key, overlap: Overlap) -> Result<bool, AgentError> {
        if overlap != Overlap::Queue {
            let emptied = Condition::Exists(fields::RUNNING.into()).negate();
            self.store.write(&self.coll, key, &Write::new(emptied, Mutation::new().unset(fields::RUNNING))).await?;
        }
        Ok(false)
    }

    pub(crate) async fn has_held(&self, name: &str) -> Result<bool, AgentError> {
        let q = Query::eq(doc! { task_fields::SCHEDULE: name, task_fields::OVERLAP_HELD: true }).limit(1);
        Ok(self.store.count(&self.queue.coll, &q).await? > 0)
    }

    /// Whether a tick of the schedule that is not held has not ended: one
    /// enqueued under another policy, before a change to [`Overlap::Queue`].
    ///
    /// A find of one, not a count: a count reads every match, and with one
    /// found there is no need to read on.
    async fn has_unheld_unfinished(&self, name: &str) -> Result<bool, AgentError> {
        let held = Condition::FieldEq(task_fields::OVERLAP_HELD.into(), Bson::Boolean(true));
        let q = Query::eq(doc! { task_fields::SCHEDULE: name }).when(not_complete().and(held.negate())).limit(1);
        Ok(!self.store.find(&self.queue.coll, &q).await?.is_empty())
    }
}
