//! Dedupe scopes ([`DedupeScope`](crate::DedupeScope)): when an enqueue's
//! dedupe key is taken, whether the task holding it still blocks it, and if
//! not, the move of the key off that task so the new one goes in; and the
//! debounce, which replaces a never-claimed holder's data instead.
//!
//! The unique `dedupe` index is what keeps one task per key, for every scope:
//! a key that no longer blocks is moved to `dedupe_key_retired` by a write
//! conditioned on the key still being there, then the insert is tried again.
//! Racing producers may each move it (one applies) and each insert (the
//! index lets one in); the others find the new holder, which blocks.
//!
//! A debounced enqueue that finds the key on a debounced task of its agent
//! name that was never claimed (fence 0) replaces that task's data in one
//! write conditioned on the revision it read, so the task's data is always
//! one enqueue's, whole. A claim moves the fence, so a replace either lands
//! before the claim (which then reads it) or is rejected, and the enqueue
//! goes on as for a key that no longer blocks: a new task, so no enqueue's
//! data is lost.

use std::time::Duration;

use bson::{doc, Bson, Document};
use store_trait::{
    Condition, FaultKind, InsertOutcome, Key, Mutation, Query, Record, Store, StoreError, Write, WriteOutcome,
};

use crate::error::AgentError;
use crate::queue::Queue;
use crate::schema::{fields, pending};
use crate::task::NewTask;
use crate::task::DEBOUNCE;

/// How many times a duplicate is settled again before it is an error: each
/// round is lost only to another producer that moved the key or inserted, or
/// (debounced) to an agent that claimed the task judged, so a burst of
/// producers against agents that claim at once must not run out of them.
const ROUNDS: usize = 16;

/// A pause before round `round` (from 1) that spreads racing producers apart,
/// so that they do not meet again in lockstep: up to `round` milliseconds.
async fn spread(round: usize) {
    let ms = fastrand::u64(0..=u64::try_from(round).unwrap_or(u64::MAX));
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}

impl<S: Store + Clone> Queue<S> {
    /// `doc`'s insert (of `task`) found `dup` taken: by its id (a duplicate,
    /// as ever), or by its dedupe key, whose holder either still blocks it (a
    /// duplicate standing for the holder, whose id is returned), takes its
    /// data (a debounce: the holder's id is returned), or no longer blocks
    /// (its key is moved off it, and `doc` inserted).
    pub(crate) async fn settle_duplicate(
        &self,
        doc: Document,
        task: &NewTask,
        dup: Key,
    ) -> Result<InsertOutcome, AgentError> {
        let Ok(dedupe) = doc.get_str(fields::DEDUPE_KEY) else { return Ok(InsertOutcome::Duplicate(dup)) };
        if let Some(after) = task.dedupe_scope.debounce() {
            // A debounced task has no id of its own (`NewTask::to_document`).
            return self.settle_debounced(dedupe, &doc, task.starts_after().unwrap_or(after)).await;
        }
        for round in 0..ROUNDS {
            if round > 0 {
                spread(round).await;
            }
            if doc.contains_key(store_trait::fields::ID) && self.store.get(&self.coll, &dup).await?.record.is_some() {
                return Ok(InsertOutcome::Duplicate(dup));
            }
            if let Some(holder) = self.free_key(dedupe).await? {
                return Ok(InsertOutcome::Duplicate(holder));
            }
            match self.store.insert_many(&self.coll, vec![doc.clone()]).await?.pop() {
                Some(InsertOutcome::Inserted(k)) => return Ok(InsertOutcome::Inserted(k)),
                _ => continue,
            }
        }
        Err(self.unsettled(dedupe))
    }

    /// A debounced enqueue of `doc` whose key `dedupe` is taken. A debounced
    /// task of the same agent name that was never claimed takes `doc`'s data
    /// and options and starts `after` from now (store clock): its id is
    /// returned. A holder of another kind is settled by its scope: while it
    /// blocks, [`AgentError::KeyHeldByAnother`]; else its key is moved off it
    /// and `doc` inserted.
    ///
    /// Two races end an enqueue without a write of its own, and both leave
    /// the state it would have led to, had it come just before the other
    /// producer's write (which came after its read, so within its call): a
    /// replace rejected because another replace came first, and an insert
    /// lost to another debounced enqueue's insert. Either way the task it
    /// would have written is replaced, whole, by the other's, and never
    /// claimed in between. A replace rejected because the task was claimed
    /// is no such race: its data must run, so a new task is inserted.
    async fn settle_debounced(
        &self,
        dedupe: &str,
        doc: &Document,
        after: Duration,
    ) -> Result<InsertOutcome, AgentError> {
        let agent = doc.get_str(fields::AGENT_NAME).unwrap_or_default();
        // The holder as a rejected replace returned it: judged without a read.
        let mut known: Option<Record> = None;
        for round in 0..ROUNDS {
            let judged = match known.take() {
                Some(h) => Some(h),
                None => {
                    if round > 0 {
                        spread(round).await;
                    }
                    self.holder_of(dedupe).await?
                }
            };
            match &judged {
                Some(h) if debounce_pending(h, doc) => {
                    match self.debounce_into(h, dedupe, doc, after).await? {
                        Replaced::Yes => return Ok(InsertOutcome::Duplicate(h.key().clone())),
                        // Claimed since the read, most often: its key is moved
                        // off it and this enqueue's task inserted next round.
                        Replaced::No(now) => {
                            known =
                                now.map(|n| *n).filter(|n| n.data().get_str(fields::DEDUPE_KEY).ok() == Some(dedupe))
                        }
                    }
                    continue;
                }
                // A holder this enqueue cannot give its data to: a duplicate
                // would say the data was taken, and it was not.
                Some(h) if self.blocks(h).await? => {
                    return Err(AgentError::KeyHeldByAnother {
                        dedupe_key: dedupe.to_owned(),
                        holder: h.key().to_string(),
                    })
                }
                Some(h) => self.retire(h, dedupe).await?,
                None => {}
            }
            if let Some(InsertOutcome::Inserted(k)) = self.store.insert_many(&self.coll, vec![doc.clone()]).await?.pop()
            {
                return Ok(InsertOutcome::Inserted(k));
            }
            // A holder other than the one judged took the key after that
            // read: inserted then, unless a requeue gave it back its key (a
            // requeue always sets the round's fence; an insert never does).
            if let Some(winner) = self.holder_of(dedupe).await? {
                let newer = judged.as_ref().map(Record::key) != Some(winner.key());
                let inserted = !winner.data().contains_key(fields::ROUND_FENCE);
                let same_group = winner.get_str(fields::GROUP_KEY) == doc.get_str(fields::GROUP_KEY).ok();
                if newer && inserted && debounced_for(&winner, agent) && same_group {
                    tracing::debug!(queue = %self.coll, dedupe, task = %winner.key(), "debounced: superseded by a racing enqueue's new task");
                    return Ok(InsertOutcome::Duplicate(winner.key().clone()));
                }
            }
        }
        Err(self.unsettled(dedupe))
    }

    /// The error of a duplicate not settled in [`ROUNDS`] rounds.
    fn unsettled(&self, dedupe: &str) -> AgentError {
        AgentError::Store(StoreError::backend(
            FaultKind::Transient,
            format!("dedupe key {dedupe:?} in {} kept changing hands; try again", self.coll),
        ))
    }

    /// The task holding dedupe key `dedupe`, if any.
    async fn holder_of(&self, dedupe: &str) -> Result<Option<Record>, AgentError> {
        let found = self.store.find(&self.coll, &Query::eq(doc! { fields::DEDUPE_KEY: dedupe }).limit(1)).await?;
        Ok(found.into_iter().next())
    }

    /// Replaces the data and options of `holder`, a debounced task never
    /// claimed, with `doc`'s, and moves its start to `after` from now (store
    /// clock). [`Replaced::Yes`] when done, or superseded by another replace;
    /// [`Replaced::No`] when the task was claimed, cancelled or deleted since
    /// it was read.
    async fn debounce_into(
        &self,
        holder: &Record,
        dedupe: &str,
        doc: &Document,
        after: Duration,
    ) -> Result<Replaced, AgentError> {
        // On the revision read: the fields to remove are the holder's as read,
        // so the task's data is this enqueue's alone, never a mix of two.
        let write = Write::new(
            Condition::RevIs(holder.rev()).and(Condition::FieldEq(fields::DEDUPE_KEY.into(), dedupe.into())),
            replacement(holder, doc, after),
        );
        match self.store.write(&self.coll, holder.key(), &write).await? {
            WriteOutcome::Applied(_) => {
                let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
                // Debug, not info: a debounce exists for bursts.
                tracing::debug!(queue = %self.coll, dedupe, task = %holder.key(), after_ms, "debounced: the pending task takes the latest data");
                Ok(Replaced::Yes)
            }
            // Another debounced enqueue replaced it after our read (its
            // `debounced_at` moved). A write that left it pending otherwise
            // (its group letting it through) took no data: read again.
            WriteOutcome::Rejected(Some(now))
                if debounce_pending(&now, doc)
                    && now.get_str(fields::DEDUPE_KEY) == Some(dedupe)
                    && now.get(fields::DEBOUNCED_AT) != holder.get(fields::DEBOUNCED_AT) =>
            {
                tracing::debug!(queue = %self.coll, dedupe, task = %holder.key(), "debounced: superseded by a racing replace");
                Ok(Replaced::Yes)
            }
            WriteOutcome::Rejected(now) => Ok(Replaced::No(now.map(Box::new))),
        }
    }

    /// The task holding dedupe key `dedupe`, if it still blocks; if it no
    /// longer does, its key is moved off it (`None`: the key is free, unless
    /// another producer took it meanwhile). The move is conditioned on the
    /// state judged free, so a holder requeued in between keeps its key.
    pub(crate) async fn free_key(&self, dedupe: &str) -> Result<Option<Key>, AgentError> {
        let Some(holder) = self.holder_of(dedupe).await? else { return Ok(None) };
        if self.blocks(&holder).await? {
            return Ok(Some(holder.key().clone()));
        }
        self.retire(&holder, dedupe).await?;
        Ok(None)
    }

    /// Moves key `dedupe` off `holder`, judged no longer to block it, on
    /// condition that it still holds the key in the state judged.
    async fn retire(&self, holder: &Record, dedupe: &str) -> Result<(), AgentError> {
        let retire = Write::new(
            Condition::FieldEq(fields::DEDUPE_KEY.into(), Bson::String(dedupe.to_owned())).and(still_free(holder)),
            Mutation::new().unset(fields::DEDUPE_KEY).set(fields::DEDUPE_RETIRED, dedupe),
        );
        // Applied, or another producer moved it first, or the holder blocks
        // again (requeued): the next round reads it again.
        if self.store.write(&self.coll, holder.key(), &retire).await?.is_applied() {
            tracing::info!(queue = %self.coll, dedupe, task = %holder.key(), "dedupe key retired: it no longer blocks");
        }
        Ok(())
    }

    /// Whether `holder`'s dedupe key still blocks another task with it.
    async fn blocks(&self, holder: &Record) -> Result<bool, AgentError> {
        let d = holder.data();
        Ok(match d.get_str(fields::DEDUPE_SCOPE) {
            Ok("until_ended") => {
                d.get_bool(fields::COMPLETE).ok() != Some(true) || d.contains_key(pending::PARENT_FENCE)
            }
            Ok("window") => match holder.get_time(fields::DEDUPE_UNTIL) {
                Some(until) => self.store.now().await? < until,
                None => true,
            },
            Ok(DEBOUNCE) => holder.fence() == 0,
            // For ever, or a scope this version does not know: it blocks.
            _ => true,
        })
    }
}

/// What became of a debounced enqueue's replace of a pending task's data.
enum Replaced {
    /// Replaced, or superseded by a racing replace.
    Yes,
    /// The task was claimed, cancelled or deleted since it was read: as it
    /// is now, when it still exists.
    No(Option<Box<Record>>),
}

/// The state of `holder` in which [`Queue::blocks`] found its key free, as a
/// write condition: ended (until-ended), or still windowed (a window only
/// passes).
fn still_free(holder: &Record) -> Condition {
    let scope = |s: &str| Condition::FieldEq(fields::DEDUPE_SCOPE.into(), Bson::String(s.into()));
    match holder.data().get_str(fields::DEDUPE_SCOPE) {
        Ok("until_ended") => scope("until_ended")
            .and(Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true)))
            .and(Condition::Exists(pending::PARENT_FENCE.into()).negate()),
        Ok("window") => scope("window"),
        // A fence never goes back to 0: claimed once, free for good.
        Ok(DEBOUNCE) => scope(DEBOUNCE).and(Condition::FenceIs(0).negate()),
        _ => Condition::Any(Vec::new()),
    }
}

/// Whether `holder` is a debounced task of the agent name and group of
/// `doc` (a debounced enqueue's document) that no agent ever claimed
/// (fence 0) and that has not ended: one whose data that enqueue replaces.
/// Waiting for its turn in its group (held) or not: its place stays.
fn debounce_pending(holder: &Record, doc: &Document) -> bool {
    let d = holder.data();
    let agent = doc.get_str(fields::AGENT_NAME).unwrap_or_default();
    let waiting = d.get_bool(fields::READY).ok() == Some(true) || d.get_bool(fields::GROUP_HELD).ok() == Some(true);
    debounced_for(holder, agent)
        && d.get_str(fields::GROUP_KEY).ok() == doc.get_str(fields::GROUP_KEY).ok()
        && holder.fence() == 0
        && waiting
        && d.get_bool(fields::COMPLETE).ok() != Some(true)
        && !d.contains_key(pending::FENCE)
}

/// Whether `task` was enqueued debounced, for `agent`.
fn debounced_for(task: &Record, agent: &str) -> bool {
    let d = task.data();
    d.get_str(fields::DEDUPE_SCOPE).ok() == Some(DEBOUNCE) && d.get_str(fields::AGENT_NAME).ok() == Some(agent)
}

/// The changes that make `holder` the task `doc` describes: `doc`'s fields
/// set (its id and start aside), the holder's fields that `doc` lacks
/// removed (user data and the options a task may leave out), and its start
/// `after` from now on the store clock.
fn replacement(holder: &Record, doc: &Document, after: Duration) -> Mutation {
    let mut set = doc.clone();
    set.remove(store_trait::fields::ID);
    set.remove(fields::RUN_AT);
    // A grouped task keeps its place and state in its group (its number,
    // held or let through): the group is the same (`debounce_pending`).
    for f in [fields::READY, fields::GROUP_HELD, fields::GROUP_SEQ, fields::GROUP_KEY] {
        if holder.data().contains_key(fields::GROUP_KEY) {
            set.remove(f);
        }
    }
    // Reserved fields an enqueue may or may not write: one this enqueue did
    // not is removed (its trace context too: the task runs in the trace of
    // the enqueue whose data it has, or in none).
    let optional = [fields::MAX_ATTEMPTS, fields::TIMEOUT_MS, fields::TRACE_CONTEXT];
    let gone: Vec<String> = holder
        .data()
        .keys()
        .filter(|k| !set.contains_key(k.as_str()))
        .filter(|k| !fields::is_reserved(k) || optional.contains(&k.as_str()))
        .cloned()
        .collect();
    // As far as an enqueue's delay goes (`Queue::documents`): a start the
    // server's date arithmetic cannot overflow.
    let after = after.min(Duration::from_millis((i64::MAX / 2).unsigned_abs()));
    let mut m = Mutation::new().set_all(set).set_time_after(fields::RUN_AT, after).set_now(fields::DEBOUNCED_AT);
    for k in gone {
        m = m.unset(k);
    }
    m
}
