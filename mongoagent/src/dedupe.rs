//! Dedupe scopes ([`DedupeScope`](crate::DedupeScope)): when an enqueue's
//! dedupe key is taken, whether the task holding it still blocks it, and if
//! not, the move of the key off that task so the new one goes in.
//!
//! The unique `dedupe` index is what keeps one task per key, for every scope:
//! a key that no longer blocks is moved to `dedupe_key_retired` by a write
//! conditioned on the key still being there, then the insert is tried again.
//! Racing producers may each move it (one applies) and each insert (the
//! index lets one in); the others find the new holder, which blocks.

use bson::{doc, Bson, Document};
use store_trait::{Condition, FaultKind, InsertOutcome, Key, Mutation, Query, Record, Store, StoreError, Write};

use crate::schema::{fields, pending};
use crate::{AgentError, Queue};

/// How many times a duplicate is settled again before it is an error: each
/// round is lost only to another producer that moved the key or inserted.
const ROUNDS: usize = 4;

impl<S: Store + Clone> Queue<S> {
    /// `doc`'s insert found `dup` taken: by its id (a duplicate, as ever), or
    /// by its dedupe key, whose holder either still blocks it (a duplicate
    /// standing for the holder, whose id is returned) or no longer does (its
    /// key is moved off it, and `doc` inserted).
    pub(crate) async fn settle_duplicate(&self, doc: Document, dup: Key) -> Result<InsertOutcome, AgentError> {
        let Ok(dedupe) = doc.get_str(fields::DEDUPE_KEY) else { return Ok(InsertOutcome::Duplicate(dup)) };
        for _ in 0..ROUNDS {
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
        Err(AgentError::Store(StoreError::backend(
            FaultKind::Transient,
            format!("dedupe key {dedupe:?} in {} kept changing hands; try again", self.coll),
        )))
    }

    /// The task holding dedupe key `dedupe`, if it still blocks; if it no
    /// longer does, its key is moved off it (`None`: the key is free, unless
    /// another producer took it meanwhile). The move is conditioned on the
    /// state judged free, so a holder requeued in between keeps its key.
    pub(crate) async fn free_key(&self, dedupe: &str) -> Result<Option<Key>, AgentError> {
        let found = self.store.find(&self.coll, &Query::eq(doc! { fields::DEDUPE_KEY: dedupe }).limit(1)).await?;
        let Some(holder) = found.first() else { return Ok(None) };
        if self.blocks(holder).await? {
            return Ok(Some(holder.key().clone()));
        }
        let retire = Write::new(
            Condition::FieldEq(fields::DEDUPE_KEY.into(), Bson::String(dedupe.to_owned())).and(still_free(holder)),
            Mutation::new().unset(fields::DEDUPE_KEY).set(fields::DEDUPE_RETIRED, dedupe),
        );
        // Applied, or another producer moved it first, or the holder blocks
        // again (requeued): the next round reads it again.
        if self.store.write(&self.coll, holder.key(), &retire).await?.is_applied() {
            tracing::info!(queue = %self.coll, dedupe, task = %holder.key(), "dedupe key retired: it no longer blocks");
        }
        Ok(None)
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
            // For ever, or a scope this version does not know: it blocks.
            _ => true,
        })
    }
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
        _ => Condition::Any(Vec::new()),
    }
}
