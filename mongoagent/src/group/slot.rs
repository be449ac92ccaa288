//! The slot document's encoding: its key, the entries of its `running` and
//! `gone_busy` lists, its `version`, and the announcement a producer's
//! write carries ([`super::slot_fields`]).

use bson::{doc, Bson};
use store_trait::{Condition, Key, Mutation, Record, StoreTime};

use super::{slot_fields, LAND_WITHIN};
use crate::error::AgentError;

/// The slot's key: the agent name's length first, so that no two (agent,
/// group) pairs share one.
pub(super) fn slot_key(agent: &str, group: &str) -> Result<Key, AgentError> {
    Key::new(format!("{}:{agent}/{group}", agent.len()))
        .map_err(|e| AgentError::InvalidTask(format!("agent name and group key too long together: {e}")))
}

/// The prefix of the slot keys of `agent`.
pub(super) fn slot_prefix(agent: &str) -> String {
    format!("{}:{agent}/", agent.len())
}

/// The entries of a slot's `running`: each task's id and the number it was
/// let through with (an entry of an id alone matches any number).
pub(super) fn listed(running: &[Bson]) -> Vec<(Key, Option<i64>)> {
    running
        .iter()
        .filter_map(|b| match b {
            Bson::Document(d) => Some((Key::from_bson(d.get("id")?.clone()).ok()?, d.get_i64("seq").ok())),
            other => Some((Key::from_bson(other.clone()).ok()?, None)),
        })
        .collect()
}

/// An entry of a slot's `running`.
pub(super) fn listed_entry(task: &Key, seq: Option<i64>) -> Bson {
    let mut e = doc! { "id": task.as_bson().clone() };
    if let Some(n) = seq {
        e.insert("seq", n);
    }
    Bson::Document(e)
}

/// A task deleted while it ran ([`slot_fields::GONE_BUSY`]): its turn
/// stays taken until `until`, unless the run of the claim with `fence` is
/// seen to end. `seq`, its number in the group, tells it from a task that
/// took its id since, whose first claims have the same fences.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Gone {
    pub(super) key: Key,
    pub(super) until: StoreTime,
    pub(super) fence: Option<i64>,
    pub(super) seq: Option<i64>,
}

impl Gone {
    /// Its entry in the slot.
    pub(super) fn entry(&self) -> Bson {
        let mut e = doc! { "id": self.key.as_bson().clone(), "until": self.until.to_bson_datetime() };
        if let Some(f) = self.fence {
            e.insert("fence", f);
        }
        if let Some(n) = self.seq {
            e.insert("seq", n);
        }
        Bson::Document(e)
    }
}

/// The slot's tasks deleted while they ran.
pub(super) fn gone_busy(slot: &Record) -> Vec<Gone> {
    let Some(Bson::Array(a)) = slot.get(slot_fields::GONE_BUSY) else { return Vec::new() };
    a.iter()
        .filter_map(|e| {
            let d = e.as_document()?;
            Some(Gone {
                key: Key::from_bson(d.get("id")?.clone()).ok()?,
                until: StoreTime::from_millis(d.get_datetime("until").ok()?.timestamp_millis()),
                fence: d.get_i64("fence").ok(),
                seq: d.get_i64("seq").ok(),
            })
        })
        .collect()
}

/// `m`, announcing a write that may add held tasks ([`slot_fields::ANNOUNCED`]).
pub(super) fn announcing(m: Mutation) -> Mutation {
    m.inc(slot_fields::ANNOUNCED, 1).set_time_after(slot_fields::LAND_BY, LAND_WITHIN)
}

/// The slot's `version` and the condition that no settle, delete or
/// requeue wrote the slot since it was read: a missing one reads as 0; one
/// another program made something other than a whole number is compared by
/// the slot's whole revision (the write makes it a number again), never
/// taken as 0, which would match nothing and hold the group for ever.
pub(super) fn version(slot: &Record) -> (i64, Condition) {
    let field = || slot_fields::VERSION.to_owned();
    match (slot.get(slot_fields::VERSION), slot.get_i64(slot_fields::VERSION)) {
        (None, _) | (_, Some(0)) => (0, Condition::AtMost(field(), 0)),
        (_, Some(v)) => (v, Condition::FieldEq(field(), Bson::Int64(v))),
        (Some(_), None) => (0, Condition::RevIs(slot.rev())),
    }
}

/// `m`, nudging the agents of the slot: the write they watch for
/// ([`slot_fields::ENQUEUED`]), and the slot due in the sweep now.
pub(super) fn nudging(m: Mutation) -> Mutation {
    m.inc(slot_fields::ENQUEUED, 1).set_now(slot_fields::SWEEP_AFTER)
}
