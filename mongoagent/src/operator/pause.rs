//! Pausing and resuming an agent name on a queue, in every process, and
//! reading which names are paused: the operator's side of `control.rs`,
//! which holds the control documents' machinery.

use bson::doc;
use store_trait::{Condition, Mutation, Query, Store, Write};

use crate::control::{control_key, paused_names, PAUSED};
use crate::error::AgentError;
use crate::queue::Queue;

impl<S: Store + Clone> Queue<S> {
    /// Pauses (`true`) or resumes (`false`) every agent named `agent` on this
    /// queue, in every process: they stop claiming (tasks they run finish) or
    /// claim again as soon as the change notification reaches them, and
    /// within [`CONTROL_REFRESH`](crate::control::CONTROL_REFRESH) when none does (a store without change
    /// notifications, a notification late or lost).
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
        // agents' timed read of it, without notifications, stays cheap.
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
        let mut names: Vec<String> =
            paused_names(&self.store, &self.control_collection()?).await?.into_iter().collect();
        names.sort();
        Ok(names)
    }
}
