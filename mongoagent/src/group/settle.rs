//! A settle: one round on a group's slot document, which reads the tasks it
//! lists and the group's oldest held ones, decides which stay, which end
//! and which are let through, and writes that by one compare-and-set (the
//! design: [`super`]).

use bson::{doc, Bson};
use store_trait::{Condition, Key, Mutation, Order, Query, Record, Store, Ttl, Write, WriteOutcome};

use super::slot::{gone_busy, listed, listed_entry, version, Gone};
use super::{slot_fields, Groups, RunEnded, MAX_HELD_READ, SLOT_RETAIN, SWEEP};
use crate::error::AgentError;
use crate::schema::{fields, not_complete};

/// What one settle of a slot did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settled {
    /// Another writer changed the slot first: read it again.
    Raced,
    /// It wrote the slot (and let tasks through, if any).
    Wrote,
    /// Nothing to change: the slot is as its tasks say.
    Unchanged,
}

impl<S: Store + Clone> Groups<S> {
    /// The `free` oldest held tasks of the group (by number), with their
    /// numbers, but none whose id is `kept`'s. A document the store cannot
    /// read (another program's) is passed over: the query is made again,
    /// larger, so that it never takes a readable task's place.
    async fn oldest_held(
        &self,
        agent: &str,
        group: &str,
        free: usize,
        kept: &[(Key, Option<i64>)],
    ) -> Result<Vec<(Key, Option<i64>)>, AgentError> {
        let mut limit = free + kept.len();
        loop {
            // Sorted by number alone, which the `group` index (`group_key`,
            // `group_held`, `group_seq`) gives in order, so the server stops
            // at the limit. A tie on `_id` too would make MongoDB sort the
            // whole group's held tasks in memory on every settle; an index
            // with `_id` (or `agent_name`) in it would index every task,
            // sparse or not. Tasks share a number only when a requeue
            // met a slot numbered anew; either may go first.
            let q = Query::eq(doc! { fields::AGENT_NAME: agent, fields::GROUP_KEY: group, fields::GROUP_HELD: true })
                .when(not_complete())
                .sort(fields::GROUP_SEQ, Order::Asc)
                .limit(u32::try_from(limit).unwrap_or(u32::MAX));
            let found = self.store.find_each(&self.tasks, &q).await?;
            let (all, unreadable) = (found.len(), found.iter().filter(|r| r.is_err()).count());
            let next: Vec<(Key, Option<i64>)> = found
                .into_iter()
                .flatten()
                // A kept task is passed over by its number too: its id
                // used again by a newer held task of the group is that task.
                .filter(|t| {
                    !kept
                        .iter()
                        .any(|(k, seq)| k == t.key() && seq.is_none_or(|n| t.get_i64(fields::GROUP_SEQ) == Some(n)))
                })
                .map(|t| (t.key().clone(), t.get_i64(fields::GROUP_SEQ)))
                .take(free)
                .collect();
            if next.len() == free || unreadable == 0 || all < limit || limit >= MAX_HELD_READ {
                if unreadable > 0 {
                    tracing::warn!(queue = %self.tasks, agent, group, unreadable, "held documents of the group that cannot be read are passed over");
                }
                return Ok(next);
            }
            limit = (limit + unreadable).saturating_mul(2).min(MAX_HELD_READ);
        }
    }

    /// One round on `slot`.
    ///
    /// A listed task keeps its place unless it is gone, another group's or
    /// agent name's (its id reused), or ended; an ended task cancelled (or
    /// deleted) while it ran keeps it until its `group_busy_until`, unless
    /// the run cancelled is `ended`, the run the caller saw end (same task,
    /// same number, same claim fence). Every release follows a compare-and-set of the
    /// slot made after the read of the released task, so a settle that read
    /// an older state cannot apply after it.
    pub(super) async fn settle(
        &self,
        slot: &Record,
        agent: &str,
        group: &str,
        cap: usize,
        ended: Option<RunEnded<'_>>,
    ) -> Result<Settled, AgentError> {
        let running: Vec<Bson> = match slot.get(slot_fields::RUNNING) {
            Some(Bson::Array(a)) => a.clone(),
            _ => Vec::new(),
        };
        let entries = listed(&running);
        // A found task is the one listed only with the number it was let
        // through with: an id used again (in the group or elsewhere) is
        // another task.
        let same = |t: &Record| {
            entries.iter().any(|(k, seq)| k == t.key() && seq.is_none_or(|s| t.get_i64(fields::GROUP_SEQ) == Some(s)))
        };
        // Listed and not ended; of those, still held (with their numbers).
        let mut kept: Vec<(Key, Option<i64>)> = Vec::new();
        let mut held: Vec<(Key, Option<i64>)> = Vec::new();
        if !entries.is_empty() {
            let keys: Vec<Key> = entries.iter().map(|(k, _)| k.clone()).collect();
            let found: Vec<Record> = self
                .store
                .find_each(&self.tasks, &Query::all().keys(keys.clone()))
                .await?
                .into_iter()
                .flatten()
                .collect();
            let run_ended = |k: &Key, fence: Option<i64>, seq: Option<i64>| ended.is_some_and(|e| e.is(k, fence, seq));
            let busy = |t: &Record| {
                t.get_time(fields::GROUP_BUSY_UNTIL)
                    .filter(|_| !run_ended(t.key(), t.get_i64(fields::GROUP_BUSY_FENCE), t.get_i64(fields::GROUP_SEQ)))
            };
            // Listed, deleted while running (`Groups::deleted_while_running`),
            // and maybe still running: until when, unless its run ended, or
            // it is there after all (its delete failed; a task that took
            // its id since has another number).
            let here = |g: &Gone, t: &Record| {
                t.key() == &g.key && same(t) && g.seq.is_none_or(|n| t.get_i64(fields::GROUP_SEQ) == Some(n))
            };
            let gone: Vec<Gone> = gone_busy(slot)
                .into_iter()
                .filter(|g| !run_ended(&g.key, g.fence, g.seq) && !found.iter().any(|t| here(g, t)))
                .collect();
            let now = if found.iter().any(|t| busy(t).is_some()) || !gone.is_empty() {
                Some(self.store.now().await?)
            } else {
                None
            };
            for g in &gone {
                // Its own entry: not one of a task that took its id since.
                let entry = entries.iter().find(|e| is(e, &g.key, g.seq));
                if let (true, Some((k, seq))) = (now.is_some_and(|n| n < g.until), entry) {
                    if !kept.iter().any(|e| is(e, k, *seq)) {
                        kept.push((k.clone(), *seq));
                    }
                }
            }
            for task in found {
                let ours = task.get_str(fields::AGENT_NAME) == Some(agent)
                    && task.get_str(fields::GROUP_KEY) == Some(group)
                    && same(&task);
                let done = task.get_bool(fields::COMPLETE) == Some(true)
                    && busy(&task).is_none_or(|until| now.is_some_and(|n| n >= until));
                // Kept already as a deleted run (by number: the task that
                // took its id since runs too, and takes a turn of its own).
                if !ours || done || kept.iter().any(|e| is(e, task.key(), task.get_i64(fields::GROUP_SEQ))) {
                    continue;
                }
                let entry = (task.key().clone(), task.get_i64(fields::GROUP_SEQ));
                if task.get_bool(fields::GROUP_HELD) == Some(true) {
                    held.push(entry.clone());
                }
                kept.push(entry);
            }
            // In the slot's order.
            kept.sort_by_key(|(k, _)| keys.iter().position(|x| x == k));
        }
        let free = cap.saturating_sub(kept.len());
        let next = if free > 0 { self.oldest_held(agent, group, free, &kept).await? } else { Vec::new() };
        let listed: Vec<Bson> = kept.iter().chain(&next).map(|(k, seq)| listed_entry(k, *seq)).collect();
        let active = !listed.is_empty();
        let releases = !held.is_empty() || !next.is_empty();
        if releases || listed != running || slot.get_bool(slot_fields::ACTIVE) != Some(active) {
            let still_gone: Vec<Bson> =
                gone_busy(slot).iter().filter(|g| kept.iter().any(|e| is(e, &g.key, g.seq))).map(Gone::entry).collect();
            // Announced writes not landed: the slot stays in the sweep until
            // they land, or until `LAND_BY` gives them up.
            let (announced, landed) = (slot.get_i64(slot_fields::ANNOUNCED), slot.get_i64(slot_fields::LANDED));
            let owed = announced.unwrap_or(0) > landed.unwrap_or(0);
            // No other settle, delete or requeue wrote the slot since it was
            // read (`cas`).
            let (version, cas) = version(slot);
            let write = |active: bool, cond: Condition| {
                let m = Mutation::new()
                    .set(slot_fields::VERSION, version.saturating_add(1))
                    .set(slot_fields::RUNNING, listed.clone())
                    .set(slot_fields::GONE_BUSY, still_gone.clone())
                    .set(slot_fields::ACTIVE, active)
                    .set_time_after(slot_fields::SWEEP_AFTER, SWEEP);
                let m = match (active, Ttl::new(SLOT_RETAIN)) {
                    (true, _) => m.clear_gc(),
                    (false, Ok(ttl)) => m.gc_after(ttl),
                    (false, Err(_)) => m,
                };
                // Given up: a later announcement counts from here.
                let m = match (active, announced) {
                    (false, Some(n)) if owed => m.set(slot_fields::LANDED, n),
                    _ => m,
                };
                Write::new(cond, m)
            };
            let mut applied = false;
            if !active {
                // Out of the sweep only once every announced write landed, or
                // was given up: a producer may have numbered a task whose
                // insert has not landed yet. On the whole revision: a
                // producer's write since the read keeps it active.
                let whole = Condition::RevIs(slot.rev());
                let cond = if owed { whole.and(Condition::DueBy(slot_fields::LAND_BY.into())) } else { whole };
                match self.store.write(&self.slots, slot.key(), &write(false, cond)).await? {
                    WriteOutcome::Applied(_) => applied = true,
                    // Still owed: it stays active (below).
                    WriteOutcome::Rejected(Some(now)) if now.rev() == slot.rev() => {}
                    WriteOutcome::Rejected(_) => return Ok(Settled::Raced),
                }
            }
            if !applied && !self.store.write(&self.slots, slot.key(), &write(true, cas)).await?.is_applied() {
                return Ok(Settled::Raced);
            }
        } else {
            return Ok(Settled::Unchanged);
        }
        for (key, seq) in held.iter().chain(&next) {
            // That task, not one that took its id since.
            let this = match seq {
                Some(n) => Condition::FieldEq(fields::GROUP_SEQ.into(), Bson::Int64(*n)),
                None => Condition::Always,
            };
            let w = Write::new(
                Condition::FieldEq(fields::GROUP_HELD.into(), Bson::Boolean(true)).and(this),
                Mutation::new().set(fields::READY, true).unset(fields::GROUP_HELD),
            );
            if self.store.write(&self.tasks, key, &w).await?.is_applied() {
                tracing::info!(queue = %self.tasks, agent, group, task = %key, "group task let through");
            }
        }
        Ok(Settled::Wrote)
    }
}

/// Whether `entry` (an id and the number it was listed with) is the task
/// `key` numbered `seq`: an id used again in the group is another task,
/// told by its number (an unknown number on either side matches any).
fn is(entry: &(Key, Option<i64>), key: &Key, seq: Option<i64>) -> bool {
    &entry.0 == key && (entry.1.is_none() || seq.is_none() || entry.1 == seq)
}
