//! Groups: per-key concurrency across the cluster, and enqueue order within
//! a key ([`NewTask::group`](crate::NewTask::group),
//! [`AgentBuilder::group_concurrency`](crate::AgentBuilder::group_concurrency)).
//!
//! # Design
//!
//! A grouped task is inserted **held**: `ready: false`, `group_held: true`,
//! numbered in its group (`group_seq`). The agents of its name let it
//! through (`ready: true`, `group_held` removed) when its turn comes, and
//! from then on it is claimed, run, retried and recovered like any task.
//!
//! One **slot document** per agent name and group, in `<queue>_groups`,
//! decides whose turn it is. Its `running` array lists the tasks let through
//! that were not yet seen ended. It changes only by compare-and-set on its
//! rev, and a task is made ready only after the write that put it in
//! `running` applied. An id leaves `running` only once its task is seen
//! ended (or gone), and a task that is made live again (a requeue) is held
//! again first. So at most the cap of a group's tasks are ever ready,
//! claimed or running at once, whatever crashes, lapsed claims and retries
//! do: a retry keeps its place (it has not ended), so with a cap of 1 it
//! runs before the next task.
//!
//! Letting through (`Groups::let_through`) is idempotent, and it also
//! finishes what a crash left half done: a task in `running` still held
//! (its agent died between the two writes) is made ready. It runs:
//! - in the agent that ended a task of the group, right after its outcome;
//! - in agents woken by a producer's **nudge**: after inserting, a producer
//!   bumps the slot's `enqueued` counter, and agents watch those writes
//!   (without change notifications, they poll);
//! - in every agent's **sweep** of its name's active slots: all of them at
//!   its start, then every [`SWEEP`] those unchanged for as long, for what a
//!   crash or a lost notification left.
//!
//! A slot with nothing running and nothing held is marked inactive, out of
//! the sweep, and collected after [`SLOT_RETAIN`] unless used again.
//!
//! # Cost
//!
//! Producer: two writes on the slot per enqueue call and group (numbering,
//! nudge), besides the insert. Agent: per task ended, one read of the slot,
//! one of the held tasks (and one of the running ones when the cap is above
//! 1 or another agent's task is listed), one compare-and-set and one write
//! per task let through. Nothing scans the groups per claim; the sweep reads
//! the active slots of the agent's name that did not change for [`SWEEP`]
//! (a group whose tasks end more often than that is never swept).

use std::time::Duration;

use bson::{doc, Bson};
use mongolock::ConfigError;
use store_trait::{
    fields as reserved, Collection, Condition, FaultKind, IndexSpec, Key, Mutation, Order, Query, Record, Store,
    StoreError, Ttl, Write, WriteOutcome,
};

use crate::error::AgentError;
use crate::queue::Queue;
use crate::schema::{fields, not_complete};

/// The longest group key, in bytes.
pub const MAX_GROUP_LEN: usize = 256;

/// How often an agent with a cap sweeps its name's active slots, while it
/// has change notifications (without them it sweeps every poll interval).
pub const SWEEP: Duration = Duration::from_secs(30);

/// How long an inactive slot (nothing running, nothing held) is kept: its
/// numbering goes on if the group is used again within this time.
pub const SLOT_RETAIN: Duration = Duration::from_secs(7 * 24 * 3600);

/// Compare-and-set rounds of one [`Groups::let_through`] before it leaves
/// the rest to the next trigger (another agent is settling the same slot).
const ROUNDS: usize = 4;

/// Fields of a slot document.
pub mod slot_fields {
    /// The agent name whose cap applies.
    pub const AGENT_NAME: &str = "agent_name";
    /// The group key.
    pub const GROUP: &str = "group";
    /// The last number given to a task of the group.
    pub const SEQ: &str = "seq";
    /// The ids of the tasks let through and not yet seen ended.
    pub const RUNNING: &str = "running";
    /// Bumped by producers after inserting held tasks: what wakes agents.
    pub const ENQUEUED: &str = "enqueued";
    /// Whether tasks are running or held (what the sweep reads).
    pub const ACTIVE: &str = "active";
    /// [`SWEEP`](super::SWEEP) after the slot's last change: a periodic
    /// sweep passes over a slot that changed since (store clock).
    pub const SWEEP_AFTER: &str = "sweep_after";
}

/// Checks a group key for `agent`: 1 to [`MAX_GROUP_LEN`] bytes, no NUL, and
/// a slot key that fits.
pub(crate) fn check(agent: &str, group: &str) -> Result<(), AgentError> {
    if group.is_empty() || group.len() > MAX_GROUP_LEN || group.contains('\0') {
        return Err(AgentError::InvalidTask(format!(
            "a group key must be 1 to {MAX_GROUP_LEN} bytes without NUL, not {} bytes",
            group.len()
        )));
    }
    slot_key(agent, group).map(drop)
}

/// The slot's key: the agent name's length first, so that no two (agent,
/// group) pairs share one.
fn slot_key(agent: &str, group: &str) -> Result<Key, AgentError> {
    Key::new(format!("{}:{agent}/{group}", agent.len()))
        .map_err(|e| AgentError::InvalidTask(format!("agent name and group key too long together: {e}")))
}

/// The prefix of the slot keys of `agent`.
fn slot_prefix(agent: &str) -> String {
    format!("{}:{agent}/", agent.len())
}

/// A queue's groups: its tasks, and the slot documents beside them.
#[derive(Debug, Clone)]
pub(crate) struct Groups<S> {
    store: S,
    tasks: Collection,
    slots: Collection,
}

impl<S: Store + Clone> Groups<S> {
    /// The groups of `queue`.
    pub(crate) fn of(queue: &Queue<S>) -> Result<Self, AgentError> {
        Ok(Groups { store: queue.store.clone(), tasks: queue.coll.clone(), slots: queue.group_collection()? })
    }

    /// The slot collection.
    pub(crate) fn slots(&self) -> &Collection {
        &self.slots
    }

    /// The index the sweep reads by, and the one that collects inactive slots.
    pub(crate) async fn ensure_indexes(&self) -> Result<(), AgentError> {
        let active = IndexSpec::new(
            "active",
            vec![(slot_fields::AGENT_NAME.into(), Order::Asc), (slot_fields::ACTIVE.into(), Order::Asc)],
        );
        Ok(self.store.ensure_indexes(&self.slots, &[active, IndexSpec::gc()]).await?)
    }

    /// Numbers the grouped documents among `docs` in their order, one write
    /// per (agent, group); returns those pairs, for [`Groups::nudge`].
    pub(crate) async fn number(&self, docs: &mut [bson::Document]) -> Result<Vec<(String, String)>, AgentError> {
        let mut pairs: Vec<((String, String), i64)> = Vec::new();
        for d in docs.iter() {
            if let (Ok(agent), Ok(group)) = (d.get_str(fields::AGENT_NAME), d.get_str(fields::GROUP_KEY)) {
                match pairs.iter_mut().find(|(p, _)| p.0 == agent && p.1 == group) {
                    Some((_, n)) => *n += 1,
                    None => pairs.push(((agent.to_owned(), group.to_owned()), 1)),
                }
            }
        }
        for ((agent, group), n) in &mut pairs {
            let m = Mutation::new().inc(slot_fields::SEQ, *n);
            let last = match self.touch(agent, group, m).await? {
                Some(r) => r.get_i64(slot_fields::SEQ),
                None => None,
            };
            let last = last.ok_or_else(|| transient(format!("group {group:?}: its slot has no number")))?;
            // The first of this call's numbers; each document takes the next.
            *n = last - *n + 1;
        }
        for d in docs.iter_mut() {
            let (Ok(agent), Ok(group)) = (d.get_str(fields::AGENT_NAME), d.get_str(fields::GROUP_KEY)) else {
                continue;
            };
            if let Some((_, n)) = pairs.iter_mut().find(|(p, _)| p.0 == agent && p.1 == group) {
                let seq = *n;
                *n += 1;
                d.insert(fields::GROUP_SEQ, seq);
            }
        }
        Ok(pairs.into_iter().map(|(p, _)| p).collect())
    }

    /// Tells the agents of `agent` that held tasks of `group` were inserted:
    /// after the insert, so that the agent it wakes finds them.
    pub(crate) async fn nudge(&self, agent: &str, group: &str) -> Result<(), AgentError> {
        self.touch(agent, group, Mutation::new().inc(slot_fields::ENQUEUED, 1)).await.map(drop)
    }

    /// Applies `m` to the slot, creating it if need be, and marks it active.
    async fn touch(&self, agent: &str, group: &str, m: Mutation) -> Result<Option<Record>, AgentError> {
        let key = slot_key(agent, group)?;
        let m = m
            .set(slot_fields::AGENT_NAME, agent)
            .set(slot_fields::GROUP, group)
            .set(slot_fields::ACTIVE, true)
            .set_time_after(slot_fields::SWEEP_AFTER, SWEEP)
            .clear_gc();
        match self.store.write(&self.slots, &key, &Write::new(Condition::Always, m).upsert()).await? {
            WriteOutcome::Applied(r) => Ok(Some(r)),
            WriteOutcome::Rejected(_) => Ok(None),
        }
    }

    /// Lets the oldest held tasks of `group` through while fewer than `cap`
    /// of its tasks let through have not ended, and makes ready any task
    /// listed in the slot but still held (a crash between the two writes).
    /// Idempotent; safe to run in many agents at once.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in effect: dropped between its writes, it leaves a task
    /// listed and held, which the next run makes ready.
    ///
    /// `ended`: a task of the group the caller saw end (its own), which
    /// needs no read.
    pub(crate) async fn let_through(
        &self,
        agent: &str,
        group: &str,
        cap: usize,
        ended: Option<&Key>,
    ) -> Result<(), AgentError> {
        let key = slot_key(agent, group)?;
        for _ in 0..ROUNDS {
            let Some(slot) = self.store.get(&self.slots, &key).await?.record else { return Ok(()) };
            if self.settle(&slot, agent, group, cap, ended).await? {
                return Ok(());
            }
        }
        tracing::debug!(queue = %self.tasks, agent, group, "group slot kept changing; the next trigger settles it");
        Ok(())
    }

    /// Settles the active slots of `agent` (the sweep): with `all`, every
    /// one (an agent starting knows nothing yet); else those unchanged for
    /// [`SWEEP`] (the others are being settled as their tasks end). Returns
    /// how many it read.
    pub(crate) async fn sweep(&self, agent: &str, cap: usize, all: bool) -> Result<usize, AgentError> {
        let q = Query::eq(doc! { slot_fields::AGENT_NAME: agent, slot_fields::ACTIVE: true });
        let q = if all { q } else { q.when(Condition::DueBy(slot_fields::SWEEP_AFTER.into())) };
        let slots = self.store.find_each(&self.slots, &q).await?;
        let n = slots.len();
        for slot in slots.into_iter().flatten() {
            let Some(group) = slot.get_str(slot_fields::GROUP).map(str::to_owned) else { continue };
            if slot.key().as_str().is_none_or(|k| k != slot_prefix(agent) + &group) {
                continue;
            }
            if !self.settle(&slot, agent, &group, cap, None).await? {
                self.let_through(agent, &group, cap, None).await?;
            }
        }
        Ok(n)
    }

    /// The group of `key`, a slot key of `agent`, if it is one.
    pub(crate) fn group_of<'k>(agent: &str, key: &'k Key) -> Option<&'k str> {
        key.as_str()?.strip_prefix(&slot_prefix(agent))
    }

    /// One round on `slot`: false when another writer changed it first.
    async fn settle(
        &self,
        slot: &Record,
        agent: &str,
        group: &str,
        cap: usize,
        ended: Option<&Key>,
    ) -> Result<bool, AgentError> {
        let running: Vec<Bson> = match slot.get(slot_fields::RUNNING) {
            Some(Bson::Array(a)) => a.clone(),
            _ => Vec::new(),
        };
        // Listed and not ended; of those, still held.
        let mut kept: Vec<Key> = Vec::new();
        let mut held: Vec<Key> = Vec::new();
        let only_ended = running.iter().all(|id| ended.is_some_and(|e| e.as_bson() == id));
        if !only_ended {
            let keys: Vec<Key> = running.iter().filter_map(|b| Key::from_bson(b.clone()).ok()).collect();
            let found = self.store.find_each(&self.tasks, &Query::all().keys(keys.clone())).await?;
            for task in found.into_iter().flatten() {
                if task.get_bool(fields::COMPLETE) == Some(true) {
                    continue;
                }
                if task.get_bool(fields::GROUP_HELD) == Some(true) {
                    held.push(task.key().clone());
                }
                kept.push(task.key().clone());
            }
            // In the slot's order.
            kept.sort_by_key(|k| keys.iter().position(|x| x == k));
        }
        let free = cap.saturating_sub(kept.len());
        let mut next: Vec<Key> = Vec::new();
        if free > 0 {
            let limit = u32::try_from(free + held.len()).unwrap_or(u32::MAX);
            let q = Query::eq(doc! { fields::AGENT_NAME: agent, fields::GROUP_KEY: group, fields::GROUP_HELD: true })
                .when(not_complete())
                .sort(fields::GROUP_SEQ, Order::Asc)
                .sort(reserved::ID, Order::Asc)
                .limit(limit);
            for task in self.store.find_each(&self.tasks, &q).await?.into_iter().flatten() {
                if next.len() < free && !kept.contains(task.key()) {
                    next.push(task.key().clone());
                }
            }
        }
        let listed: Vec<Bson> = kept.iter().chain(&next).map(|k| k.as_bson().clone()).collect();
        let active = !listed.is_empty();
        if listed != running || slot.get_bool(slot_fields::ACTIVE) != Some(active) {
            let m = Mutation::new()
                .set(slot_fields::RUNNING, listed)
                .set(slot_fields::ACTIVE, active)
                .set_time_after(slot_fields::SWEEP_AFTER, SWEEP);
            let m = match (active, Ttl::new(SLOT_RETAIN)) {
                (true, _) => m.clear_gc(),
                (false, Ok(ttl)) => m.gc_after(ttl),
                (false, Err(_)) => m,
            };
            let w = Write::new(Condition::RevIs(slot.rev()), m);
            if !self.store.write(&self.slots, slot.key(), &w).await?.is_applied() {
                return Ok(false);
            }
        }
        for key in held.iter().chain(&next) {
            let w = Write::new(
                Condition::FieldEq(fields::GROUP_HELD.into(), Bson::Boolean(true)),
                Mutation::new().set(fields::READY, true).unset(fields::GROUP_HELD),
            );
            if self.store.write(&self.tasks, key, &w).await?.is_applied() {
                tracing::info!(queue = %self.tasks, agent, group, task = %key, "group task let through");
            }
        }
        Ok(true)
    }
}

fn transient(why: String) -> AgentError {
    AgentError::Store(StoreError::backend(FaultKind::Transient, why))
}

impl<S: Store + Clone> Queue<S> {
    /// The collection of the queue's group slots (`<queue>_groups`).
    pub fn group_collection(&self) -> Result<Collection, AgentError> {
        Collection::new(format!("{}_groups", self.coll)).map_err(|e| AgentError::Config(ConfigError::caused_by(e)))
    }
}
