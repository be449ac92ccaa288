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
//! `version` (which producers' numbering and nudges leave alone, so they
//! never starve a settle), and a task is made ready only after a write of
//! the slot made after the task was read. An id leaves `running` only once its task is seen
//! ended (and, if it was cancelled or deleted while it ran, its run too:
//! `group_busy_until`, [`slot_fields::GONE_BUSY`]), gone, or another
//! group's; a task that is made live again (a requeue) is held again first.
//! So at most the cap of a group's tasks are ever ready, claimed or running
//! at once, whatever crashes, lapsed claims and retries do: a retry keeps
//! its place (it has not ended), so with a cap of 1 it runs before the next
//! task.
//!
//! Letting through (`Groups::let_through`) is idempotent, and it also
//! finishes what a crash left half done: a task in `running` still held
//! (its agent died between the two writes) is made ready. It runs:
//! - in the agent whose run of a task of the group ended, right after it
//!   (an agent without a cap nudges instead);
//! - in agents woken by a producer's **nudge**: after inserting, a producer
//!   bumps the slot's `enqueued` counter, and agents watch those writes
//!   (without change notifications, they poll);
//! - in every agent's **sweep** of its name's active slots: all of them at
//!   its start, then every [`SWEEP`] those not settled for as long, for what a
//!   crash or a lost notification left. A periodic sweep that finds a slot
//!   as its tasks say (a task running long) marks it settled, so the other agents'
//!   sweeps pass it over until the next [`SWEEP`].
//!
//! A **prepared** task (`Queue::prepare`, the outbox) is numbered and
//! announced at `prepare`; the caller inserts it in its transaction, and
//! its `Queue::after_insert` is the landing.
//!
//! A **follow-up** is numbered as it is enqueued pending its parent's
//! fenced outcome write (`schema::pending`), by the claim that made it, in
//! the order returned, so whichever process activates it has the same
//! number to give. Pending, its `group_held` is stashed: no agent of its
//! group sees it, so a stale run's follow-up never takes a turn nor holds
//! one up. Its activation is announced in its slot first and landed after
//! (as a requeue's), so it is made held while the slot is in the sweep.
//! Tasks of its group let through before its activation run before it.
//! A parent that waits for its follow-ups has not ended, so it keeps its
//! turn, and so does every task that waits for it, up the chain of waits:
//! a follow-up that such a chain waits for, in one of those groups, is
//! refused (`agent/turns.rs`).
//!
//! A **fan-in** task (`Outcome::then`) is numbered with its parent's other
//! follow-ups, but is no group's while it waits for them
//! (`group_after_wait`): it takes no turn, and they may be in its group.
//! The follow-up that ends last makes it held, in its place, announced and
//! landed as an activation is.
//!
//! A schedule's **ticks** are enqueued as any task, in tick order; a
//! grouped schedule takes no `Overlap::Queue` (its group already orders it).
//!
//! A slot with nothing running and nothing held is marked inactive, out of
//! the sweep, and collected after [`SLOT_RETAIN`] unless used again; but
//! not while a write that may add held tasks is **announced** and has not
//! **landed**. A producer announces in the write that numbers its tasks (a
//! requeue, in a touch before it), and says its write landed in the nudge
//! after it: a slot whose announcements outnumber its landings stays in the
//! sweep, so that a producer that dies between its insert and its nudge,
//! however late the insert lands, strands nothing. A producer that died
//! before its insert leaves an announcement that never lands: it is given
//! up [`LAND_WITHIN`] after the slot's last announcement.
//!
//! # Cost
//!
//! Producer: two writes on the slot per enqueue call and group (numbering,
//! nudge), besides the insert. Agent: per task ended, one read of the slot,
//! one of the held tasks (and one of the running ones when the cap is above
//! 1 or another agent's task is listed), one compare-and-set and one write
//! per task let through. Nothing scans the groups per claim; the sweep reads
//! the active slots of the agent's name not settled for [`SWEEP`]
//! (a group whose tasks end more often than that is never swept), and
//! settles each about once per [`SWEEP`] across the cluster, however many
//! agents sweep: the first marks it settled.

use std::time::Duration;

use bson::{doc, Bson};
use store_trait::{
    Collection, Condition, FaultKind, IndexSpec, Key, Mutation, Order, Query, Record, Store, StoreError, StoreTime,
    Write, WriteOutcome,
};

use crate::error::AgentError;
use crate::schema::fields;

mod settle;
mod slot;
use settle::Settled;
use slot::{announcing, gone_busy, nudging, slot_key, slot_prefix, version, Gone};

/// The longest group key, in bytes.
pub const MAX_GROUP_LEN: usize = 256;

/// How often an agent with a cap sweeps its name's active slots, while it
/// has change notifications (without them it sweeps every poll interval).
pub const SWEEP: Duration = Duration::from_secs(30);

/// How long after a slot's last announcement ([`slot_fields::ANNOUNCED`])
/// it stays in the sweep for announced writes that have not landed: longer
/// than any write takes to land, so that only a producer that died before
/// its write leaves the slot waiting this long.
pub const LAND_WITHIN: Duration = Duration::from_secs(3600);

/// How long an inactive slot (nothing running, nothing held) is kept: its
/// numbering goes on if the group is used again within this time.
pub const SLOT_RETAIN: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most held documents one settle reads to pass over unreadable ones.
const MAX_HELD_READ: usize = 10_000;

/// A run of a task of a group that the caller saw end: the task's id, the
/// fence of the run's claim, and the task's number in its group. The
/// number tells the task from one that took its id in the group since (its
/// first claims have the same fences), so that its end frees no turn but
/// its own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunEnded<'a> {
    pub(crate) task: &'a Key,
    pub(crate) fence: u64,
    pub(crate) seq: Option<i64>,
}

impl RunEnded<'_> {
    /// Whether this is the run of `task`'s claim `fence`, of the task with
    /// number `seq` (an unknown number on either side matches any).
    fn is(&self, task: &Key, fence: Option<i64>, seq: Option<i64>) -> bool {
        self.task == task
            && fence.and_then(|f| u64::try_from(f).ok()) == Some(self.fence)
            && (self.seq.is_none() || seq.is_none() || self.seq == seq)
    }
}

/// Compare-and-set rounds of one [`Groups::let_through`] before it leaves
/// the rest to the next trigger (another agent is settling the same slot).
const ROUNDS: usize = 4;

/// Fields of a slot document.
pub mod slot_fields {
    /// The agent name whose cap applies (named as on a task).
    pub const AGENT_NAME: &str = crate::schema::fields::AGENT_NAME;
    /// The group key.
    pub const GROUP: &str = "group";
    /// The last number given to a task of the group.
    pub const SEQ: &str = "seq";
    /// The ids of the tasks let through and not yet seen ended.
    pub const RUNNING: &str = "running";
    /// Tasks deleted while they ran (`{id, until, fence, seq}`): their turn
    /// stays taken until their lease's end, or until their agent's run of
    /// that claim (`fence`) of that task (`seq`: not one that took its id
    /// since) ended.
    pub const GONE_BUSY: &str = "gone_busy";
    /// Bumped by producers after inserting held tasks: what wakes agents.
    pub const ENQUEUED: &str = "enqueued";
    /// Whether tasks are running or held (what the sweep reads).
    pub const ACTIVE: &str = "active";
    /// How many writes that may add held tasks producers announced (an
    /// enqueue's numbering, a requeue's touch before it).
    pub const ANNOUNCED: &str = "announced";
    /// How many announced writes landed (their producer's nudge after
    /// them): while fewer than [`ANNOUNCED`], the slot stays active.
    pub const LANDED: &str = "landed";
    /// [`LAND_WITHIN`](super::LAND_WITHIN) after the last announcement
    /// (store clock): announcements not landed by then are given up.
    pub const LAND_BY: &str = "land_by";
    /// Bumped by every write of [`RUNNING`] or [`GONE_BUSY`], and by a
    /// requeue's announcement: what a settle's compare-and-set is on. A
    /// producer's numbering and nudges leave it, so that producers writing
    /// a hot group's slot never starve its settles (a settle that would
    /// mark the slot inactive is on the whole revision: a producer's write
    /// in between keeps it active).
    pub const VERSION: &str = "version";
    /// [`SWEEP`](super::SWEEP) after the slot's last settle (or a periodic
    /// sweep's deferral): a periodic sweep passes over a slot settled since
    /// (store clock). A producer's nudge makes it due now, never later
    /// (nudges that no agent hears would then keep a busy group out of the
    /// sweep for ever), so a busy `Agent::process` loop, which hears none,
    /// finds the group in its next sweep.
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

/// Announcements in group slots ([`Groups::numbered`],
/// [`Groups::announce_all`]), owed a landing once the write they announce
/// (an insert, an activation, a wake) is over, made or not.
#[derive(Debug)]
pub(crate) struct Announced<S> {
    groups: Groups<S>,
    pairs: Vec<(String, String)>,
}

impl<S: Store + Clone> Announced<S> {
    /// Lands each slot's announcement, which nudges its agents. A failure
    /// is logged: the slot stays in the sweep a while longer, and its
    /// agents' sweep lets the tasks through; it is no reason to write again.
    pub(crate) async fn land(self) {
        for (agent, group) in &self.pairs {
            if let Err(e) = self.groups.landed(agent, group).await {
                tracing::warn!(queue = %self.groups.tasks, agent, group, error = %e, "landing a group's write failed; its agents' sweep lets the tasks through");
            }
        }
    }
}

/// A queue's groups: its tasks, and the slot documents beside them.
#[derive(Debug, Clone)]
pub(crate) struct Groups<S> {
    store: S,
    tasks: Collection,
    slots: Collection,
}

impl<S: Store + Clone> Groups<S> {
    /// The groups of the queue whose tasks are in `tasks`; their slots in
    /// `slots` (`Queue::group_collection`).
    pub(crate) fn new(store: S, tasks: Collection, slots: Collection) -> Self {
        Groups { store, tasks, slots }
    }

    /// The slot collection.
    /// The store the slots and tasks are in.
    pub(crate) fn store(&self) -> &S {
        &self.store
    }

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

    /// [`Groups::number`], kept with what to land after the insert.
    pub(crate) async fn numbered(self, docs: &mut [bson::Document]) -> Result<Announced<S>, AgentError> {
        let pairs = self.number(docs).await?;
        Ok(Announced { groups: self, pairs })
    }

    /// [`Groups::announce`] in the slot of each (agent, group) of `tasks`,
    /// once per pair, with the highest of its numbers, before a write that
    /// makes already numbered tasks held (an activation, a fan-in task's
    /// wake); kept with what to land after it. A failure lands those
    /// announced before it, and the write is not to be made.
    pub(crate) async fn announce_all(
        self,
        tasks: impl IntoIterator<Item = (String, String, Option<i64>)>,
    ) -> Result<Announced<S>, AgentError> {
        let mut pairs: Vec<((String, String), Option<i64>)> = Vec::new();
        for (agent, group, n) in tasks {
            match pairs.iter_mut().find(|(p, _)| p.0 == agent && p.1 == group) {
                Some((_, m)) => *m = (*m).max(n),
                None => pairs.push(((agent, group), n)),
            }
        }
        let mut announced = Announced { groups: self, pairs: Vec::with_capacity(pairs.len()) };
        for ((agent, group), n) in pairs {
            if let Err(e) = announced.groups.announce(&agent, &group, n).await {
                announced.land().await;
                return Err(e);
            }
            announced.pairs.push((agent, group));
        }
        Ok(announced)
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
        for i in 0..pairs.len() {
            let ((agent, group), n) = &pairs[i];
            let m = announcing(Mutation::new().inc(slot_fields::SEQ, *n));
            let slot = match self.touch(agent, group, m).await {
                Ok(slot) => slot,
                Err(e) => {
                    self.never_to_land(&pairs[..i]).await;
                    return Err(e);
                }
            };
            let last = slot.as_ref().and_then(|r| r.get_i64(slot_fields::SEQ));
            // The first of this call's numbers; each document takes the next.
            let first = match last {
                Some(last) => {
                    last.checked_sub(*n - 1).filter(|first| first.checked_add(*n).is_some()).ok_or_else(|| {
                        AgentError::InvalidTask(format!("group {group:?}: its slot's number {last} is out of range"))
                    })
                }
                // Another program made it something other than a whole
                // number: no retry mends that.
                None if slot.is_some() => Err(AgentError::InvalidTask(format!(
                    "group {group:?}: its slot's number is not a whole number (another program wrote it)"
                ))),
                None => Err(transient(format!("group {group:?}: its slot has no number"))),
            };
            match first {
                Ok(first) => pairs[i].1 = first,
                Err(e) => {
                    self.never_to_land(&pairs[..=i]).await;
                    return Err(e);
                }
            }
        }
        for d in docs.iter_mut() {
            let (Ok(agent), Ok(group)) = (d.get_str(fields::AGENT_NAME), d.get_str(fields::GROUP_KEY)) else {
                continue;
            };
            if let Some((_, n)) = pairs.iter_mut().find(|(p, _)| p.0 == agent && p.1 == group) {
                let seq = *n;
                *n = n.saturating_add(1);
                d.insert(fields::GROUP_SEQ, seq);
            }
        }
        Ok(pairs.into_iter().map(|(p, _)| p).collect())
    }

    /// The announcements of `pairs`, made for inserts that will not be
    /// tried: landed now, so their slots wait for nothing.
    async fn never_to_land(&self, pairs: &[((String, String), i64)]) {
        for ((agent, group), _) in pairs {
            let _ = self.landed(agent, group).await;
        }
    }

    /// Before a write that may make tasks of `group` held (a requeue): keeps
    /// the slot in the sweep until [`Groups::landed`] says it is made.
    ///
    /// `number`: the task's number in its group. The slot's numbering is
    /// raised to it at least, so that a slot collected while the group sat
    /// idle (and made anew, numbering from 1) does not number later tasks
    /// ahead of it.
    pub(crate) async fn announce(&self, agent: &str, group: &str, number: Option<i64>) -> Result<(), AgentError> {
        // A settle under way reads again: it may have read the task ended.
        let slot = self.touch(agent, group, announcing(Mutation::new()).inc(slot_fields::VERSION, 1)).await?;
        if let (Some(slot), Some(n)) = (slot, number) {
            if slot.get_i64(slot_fields::SEQ).is_none_or(|seq| seq < n) {
                let below = Condition::AtMost(slot_fields::SEQ.into(), n.saturating_sub(1));
                self.store
                    .write(&self.slots, slot.key(), &Write::new(below, Mutation::new().set(slot_fields::SEQ, n)))
                    .await?;
            }
        }
        Ok(())
    }

    /// Tells the agents of `agent` that tasks of `group` may be let through
    /// (a task was held or freed its turn): after the write, so that the
    /// agent it wakes finds it.
    pub(crate) async fn nudge(&self, agent: &str, group: &str) -> Result<(), AgentError> {
        let mut tries = 0;
        loop {
            match self.touch(agent, group, nudging(Mutation::new())).await {
                Err(e) if e.is_retryable() && tries < 2 => tries += 1,
                other => return other.map(drop),
            }
        }
    }

    /// [`Groups::nudge`] after a write announced by [`Groups::number`] or
    /// [`Groups::announce`], made or failed: it has landed. Counted once at
    /// most (an ambiguous failure is not tried again as a landing, only as
    /// a nudge): a landing counted twice could hide a later producer's
    /// announcement, one missed only keeps the slot in the sweep longer.
    pub(crate) async fn landed(&self, agent: &str, group: &str) -> Result<(), AgentError> {
        let m = nudging(Mutation::new()).inc(slot_fields::LANDED, 1);
        match self.touch(agent, group, m).await {
            Err(e) if e.is_retryable() => self.nudge(agent, group).await,
            other => other.map(drop),
        }
    }

    /// Applies `m` to the slot, creating it if need be, and marks it active.
    async fn touch(&self, agent: &str, group: &str, m: Mutation) -> Result<Option<Record>, AgentError> {
        let key = slot_key(agent, group)?;
        let m = m
            .set(slot_fields::AGENT_NAME, agent)
            .set(slot_fields::GROUP, group)
            .set(slot_fields::ACTIVE, true)
            .clear_gc();
        match self.store.write(&self.slots, &key, &Write::new(Condition::Always, m).upsert()).await? {
            WriteOutcome::Applied(r) => Ok(Some(r)),
            WriteOutcome::Rejected(_) => Ok(None),
        }
    }

    /// Before `task` (number `seq` in its group) is deleted while its claim
    /// of fence `fence` may still run (under a lease that ends at `until`;
    /// or it was cancelled while it ran, and its `group_busy_until` is
    /// `until`): its turn stays taken until then, or until the run of that
    /// claim ended, as a cancelled running task's does.
    pub(crate) async fn deleted_while_running(
        &self,
        agent: &str,
        group: &str,
        task: &Key,
        seq: Option<i64>,
        (until, fence): (StoreTime, u64),
    ) -> Result<(), AgentError> {
        let key = slot_key(agent, group)?;
        let this = Gone { key: task.clone(), until, fence: Some(i64::try_from(fence).unwrap_or(i64::MAX)), seq };
        for _ in 0..ROUNDS {
            let Some(slot) = self.store.get(&self.slots, &key).await?.record else { return Ok(()) };
            // One entry per task: a delete tried again replaces its own
            // (a task that took its id since is another).
            let mut gone: Vec<Bson> =
                gone_busy(&slot).iter().filter(|g| g.key != this.key || g.seq != this.seq).map(Gone::entry).collect();
            gone.push(this.entry());
            // On `version`, as a settle's: producers' numbering and nudges
            // leave it (and `gone_busy`) alone, so they never starve it.
            let (v, unchanged) = version(&slot);
            let m = Mutation::new().set(slot_fields::GONE_BUSY, gone).set(slot_fields::VERSION, v.saturating_add(1));
            let w = Write::new(unchanged, m);
            if self.store.write(&self.slots, &key, &w).await?.is_applied() {
                return Ok(());
            }
        }
        Err(transient(format!("group {group:?}: its slot kept changing; try again")))
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
    /// `ended`: a run of a task of the group that the caller saw end (its
    /// own).
    pub(crate) async fn let_through(
        &self,
        agent: &str,
        group: &str,
        cap: usize,
        ended: Option<RunEnded<'_>>,
    ) -> Result<(), AgentError> {
        let key = slot_key(agent, group)?;
        for _ in 0..ROUNDS {
            let Some(slot) = self.store.get(&self.slots, &key).await?.record else { return Ok(()) };
            if self.settle(&slot, agent, group, cap, ended).await? != Settled::Raced {
                return Ok(());
            }
        }
        tracing::debug!(queue = %self.tasks, agent, group, "group slot kept changing; the next trigger settles it");
        Ok(())
    }

    /// Settles the active slots of `agent` (the sweep): with `all`, every
    /// one (an agent starting knows nothing yet); else those not settled for
    /// [`SWEEP`] (the others are being settled as their tasks end). Returns
    /// how many it read.
    pub(crate) async fn sweep(&self, agent: &str, cap: usize, all: bool) -> Result<usize, AgentError> {
        let q = Query::eq(doc! { slot_fields::AGENT_NAME: agent, slot_fields::ACTIVE: true });
        let q = if all { q } else { q.when(Condition::DueBy(slot_fields::SWEEP_AFTER.into())) };
        let slots = self.store.find_each(&self.slots, &q).await?;
        let n = slots.len();
        let unreadable = slots.iter().filter(|r| r.is_err()).count();
        if unreadable > 0 {
            tracing::warn!(queue = %self.tasks, agent, unreadable, "group slots that cannot be read (another program wrote them) hold their groups");
        }
        // One slot that fails stops no other's sweep: the first error is
        // returned once every slot was tried.
        let mut first_error = None;
        for slot in slots.into_iter().flatten() {
            let Some(group) = slot.get_str(slot_fields::GROUP).map(str::to_owned) else { continue };
            if slot.key().as_str().is_none_or(|k| k != slot_prefix(agent) + &group) {
                continue;
            }
            if let Err(e) = self.sweep_one(&slot, agent, &group, cap, all).await {
                tracing::warn!(queue = %self.tasks, agent, group, error = %e, "sweeping a group slot failed");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(n), Err)
    }

    async fn sweep_one(
        &self,
        slot: &Record,
        agent: &str,
        group: &str,
        cap: usize,
        all: bool,
    ) -> Result<(), AgentError> {
        match self.settle(slot, agent, group, cap, None).await? {
            Settled::Raced => self.let_through(agent, group, cap, None).await,
            Settled::Wrote => Ok(()),
            // Only a periodic sweep defers: a sweep of every slot (at an
            // agent's start, or an idle `Agent::process`'s each poll
            // interval) would write each unchanged slot each time.
            Settled::Unchanged if !all => self.defer_sweep(slot).await,
            Settled::Unchanged => Ok(()),
        }
    }

    /// Passes the sweep of `slot`, which a sweep found as its tasks say
    /// (a group whose task runs long), to whichever agent sweeps after
    /// [`SWEEP`]: the other agents' sweeps until then pass it over, so a
    /// long-running group costs one settle per [`SWEEP`] across the
    /// cluster, not one per agent. Only if no settle wrote the slot since
    /// it was read (its `version`), so what a settle found is what is
    /// deferred; a producer's numbering or nudge since is not lost: its
    /// agents settle the slot on the nudge, and the sweep after [`SWEEP`]
    /// in any case.
    async fn defer_sweep(&self, slot: &Record) -> Result<(), AgentError> {
        let (_, unchanged) = version(slot);
        let w = Write::new(unchanged, Mutation::new().set_time_after(slot_fields::SWEEP_AFTER, SWEEP));
        self.store.write(&self.slots, slot.key(), &w).await?;
        Ok(())
    }

    /// The group of `key`, a slot key of `agent`, if it is one.
    pub(crate) fn group_of<'k>(agent: &str, key: &'k Key) -> Option<&'k str> {
        key.as_str()?.strip_prefix(&slot_prefix(agent))
    }
}

fn transient(why: String) -> AgentError {
    AgentError::Store(StoreError::backend(FaultKind::Transient, why))
}

#[cfg(test)]
mod tests;
