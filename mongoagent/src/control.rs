//! Pausing an agent name cluster-wide: one control document per agent name in
//! the queue's control collection (`<queue>_control`), which agents read when
//! they claim. A paused agent claims nothing; tasks it runs finish.

use std::time::Duration;

use bson::{doc, Bson};
use store_trait::{Collection, Condition, Key, Mutation, Query, Store, Write};

use crate::{AgentError, Queue};

/// How long an agent trusts what it last read of its control document before
/// it reads it again: a pause is seen within this long of being written, and
/// a busy agent reads it at most once per period, not once per claim.
pub const CONTROL_REFRESH: Duration = Duration::from_secs(1);

/// The field of a control document that says its agent name is paused.
const PAUSED: &str = "paused";

fn control_key(agent: &str) -> Result<Key, AgentError> {
    Key::new(format!("agent:{agent}")).map_err(|e| AgentError::Config(e.to_string()))
}

impl<S: Store + Clone> Queue<S> {
    /// The control collection: `<queue>_control`.
    pub fn control_collection(&self) -> Result<Collection, AgentError> {
        Collection::new(format!("{}_control", self.coll)).map_err(|e| AgentError::Config(e.to_string()))
    }

    /// Pauses (`true`) or resumes (`false`) every agent named `agent` on this
    /// queue, in every process: within [`CONTROL_REFRESH`] they stop claiming
    /// (tasks they run finish) or claim again.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped half-way, the change may or may not have been
    /// written; calling it again is idempotent.
    pub async fn set_paused(&self, agent: &str, paused: bool) -> Result<(), AgentError> {
        let w = Write::new(Condition::Always, Mutation::new().set(PAUSED, paused).set_now("changed_at")).upsert();
        self.store.write(&self.control_collection()?, &control_key(agent)?, &w).await?;
        tracing::info!(queue = %self.coll, agent, paused, "agent name paused or resumed");
        Ok(())
    }

    /// Whether agents named `agent` are paused on this queue.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read.
    pub async fn is_paused(&self, agent: &str) -> Result<bool, AgentError> {
        // A `find` (not `get`, whose `$$NOW` costs an `aggregate`): the
        // agents' one read of it per CONTROL_REFRESH stays cheap.
        let id = control_key(agent)?.as_bson().clone();
        let q = Query::eq(doc! { store_trait::fields::ID: id }).limit(1);
        let found = self.store.find(&self.control_collection()?, &q).await?;
        Ok(found.first().and_then(|r| r.get_bool(PAUSED)).unwrap_or(false))
    }

    /// The agent names paused on this queue.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read.
    pub async fn paused_agents(&self) -> Result<Vec<String>, AgentError> {
        let found =
            self.store.find(&self.control_collection()?, &Query::eq(doc! { PAUSED: Bson::Boolean(true) })).await?;
        Ok(found.iter().filter_map(|r| r.key().to_string().strip_prefix("agent:").map(str::to_owned)).collect())
    }
}
