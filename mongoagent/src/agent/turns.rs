//! Follow-ups that would wait for ever behind a group's turn: a task that
//! waits for its follow-ups has not ended, so it keeps its group's turn
//! while it waits, and so does every task that waits for it, up the chain
//! of waits (`join`). A grouped follow-up that such a task waits for,
//! through the chain, and that is in the same agent name and group, would
//! wait behind it for ever under a cap of 1 (and use up a larger one). The
//! outcome that would enqueue it fails for good, saying which.

use bson::Bson;
use store_trait::{Key, Record, Store};

use super::finish::Finisher;
use crate::schema::fields;
use crate::task::NewTask;

/// How many waiting tasks up the chain are read, at most: a chain of waits
/// longer than this (or a loop in foreign documents) is checked no further.
const MAX_CHAIN: usize = 64;

impl<S: Store + Clone> Finisher<S> {
    /// Checks `follow_ups`, which the chain above `record` will wait for
    /// (and `record` itself, when it `waits` for them), against the groups
    /// whose turn that chain keeps. Reads the chain only when a follow-up
    /// is grouped and something waits for `record`; a read that fails ends
    /// the check (logged): it guards against a handler's mistake, and the
    /// outcome is not held up by it.
    pub(super) async fn check_not_behind_waiters(
        &self,
        record: &Record,
        waits: bool,
        follow_ups: &[&NewTask],
    ) -> Result<(), String> {
        if !follow_ups.iter().any(|t| t.group.is_some()) {
            return Ok(());
        }
        if waits {
            check_one(record, 0, follow_ups)?;
        }
        let mut next: Option<Bson> = record.get(fields::JOIN).cloned();
        for depth in 1..=MAX_CHAIN {
            let Some(waiter) = next.take() else { return Ok(()) };
            let Ok(key) = Key::from_bson(waiter) else { return Ok(()) };
            let found = match self.store.get(&self.queue.coll, &key).await {
                Ok(snap) => snap.record,
                Err(e) => {
                    tracing::warn!(agent = %self.name, task = %record.key(), waiter = %key, error = %e, "could not read a waiting task up the chain; its group is not checked");
                    return Ok(());
                }
            };
            // Gone, or ended: it keeps no turn, and waits for nothing.
            let Some(r) = found.filter(|r| r.get_bool(fields::COMPLETE) != Some(true)) else { return Ok(()) };
            check_one(&r, depth, follow_ups)?;
            next = r.get(fields::JOIN).cloned();
        }
        tracing::warn!(agent = %self.name, task = %record.key(), max = MAX_CHAIN, "the chain of waiting tasks is longer than is checked");
        Ok(())
    }
}

/// Whether one waiting task keeps a group's turn that a follow-up needs:
/// `depth` 0 is the task whose outcome it is, 1 the task that waits for it,
/// and so on.
fn check_one(waiter: &Record, depth: usize, follow_ups: &[&NewTask]) -> Result<(), String> {
    // A fan-in task whose follow-ups have not all ended is no group's yet
    // (`group_after_wait`), and a held one has no turn: neither keeps one.
    if waiter.get(fields::GROUP_AFTER_WAIT).is_some() || waiter.get(fields::GROUP_HELD).is_some() {
        return Ok(());
    }
    let (Some(agent), Some(group)) = (waiter.get_str(fields::AGENT_NAME), waiter.get_str(fields::GROUP_KEY)) else {
        return Ok(());
    };
    let Some(i) = follow_ups.iter().position(|t| t.agent_name == agent && t.group.as_deref() == Some(group)) else {
        return Ok(());
    };
    Err(match depth {
        0 => format!(
            "follow-up {i} is in its waiting parent's group {group:?}: it would wait behind its parent, which keeps the group's turn while it waits"
        ),
        _ => format!(
            "follow-up {i} is in group {group:?} of task {}, which waits for this task ({depth} up the chain of waits) and keeps the group's turn while it waits: it would wait behind it for ever",
            waiter.key()
        ),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use bson::doc;

    fn record(d: bson::Document) -> Record {
        Record::from_document("tasks", d).unwrap()
    }

    #[test]
    fn only_a_waiter_that_keeps_a_turn_refuses_a_follow_up_of_its_group() {
        let ours = NewTask::new("a", doc! {}).group("g");
        let other = NewTask::new("a", doc! {}).group("h");
        let let_through = record(doc! { "_id": "w", "agent_name": "a", "group_key": "g" });
        assert!(check_one(&let_through, 2, &[&other, &ours])
            .unwrap_err()
            .contains("follow-up 1 is in group \"g\" of task w"));
        assert!(check_one(&let_through, 0, &[&ours]).unwrap_err().contains("waiting parent's group"));
        assert!(check_one(&let_through, 1, &[&other]).is_ok());
        let fan_in = record(doc! { "_id": "t", "agent_name": "a", "group_key": "g", "group_after_wait": true });
        assert!(check_one(&fan_in, 1, &[&ours]).is_ok());
        let held = record(doc! { "_id": "h", "agent_name": "a", "group_key": "g", "group_held": true });
        assert!(check_one(&held, 1, &[&ours]).is_ok());
        let another_agent = record(doc! { "_id": "x", "agent_name": "b", "group_key": "g" });
        assert!(check_one(&another_agent, 1, &[&ours]).is_ok());
    }
}
