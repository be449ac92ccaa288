//! Waiting for a task to end ([`Queue::wait_for`]): woken by the store's
//! change notifications on the task's document, with a read now and then in
//! case one is missed, or every second where the store has none.

use std::time::Duration;

use bson::Document;
use futures::StreamExt;
use store_trait::{Key, Record, Store, StoreError};

use crate::error::AgentError;
use crate::queue::Queue;
use crate::schema::{fields, pending};

/// How often a waiter reads the task without a notification: where the
/// store has none, and as a safety net where it has.
const RECHECK: Duration = Duration::from_secs(1);
const RECHECK_WATCHED: Duration = Duration::from_secs(30);

/// How a task ended, as [`Queue::wait_for`] found it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    key: Key,
    data: Document,
}

impl Ended {
    /// The task's id.
    pub fn id(&self) -> &Key {
        &self.key
    }

    /// Whether it completed (rather than failed for good, or was cancelled).
    pub fn completed(&self) -> bool {
        self.data.get_bool(fields::ERROR_ENCOUNTERED).ok() != Some(true)
    }

    /// Whether an operator cancelled it ([`Queue::cancel`]).
    pub fn cancelled(&self) -> bool {
        self.data.get_bool(fields::CANCELLED).ok() == Some(true)
    }

    /// Its last failure's message, when it did not complete.
    pub fn error(&self) -> Option<&str> {
        if self.completed() {
            None
        } else {
            self.data.get_str(fields::LAST_ERROR).ok()
        }
    }

    /// The task's document as it ended: its data, what its handler merged
    /// in (the result), and the queue's fields.
    pub fn data(&self) -> &Document {
        &self.data
    }
}

/// Whether `record` has ended: its outcome is written (`complete: true`) and
/// its follow-ups, if it had any, are no longer pending on it.
fn ended(record: &Record) -> bool {
    let d = record.data();
    d.get_bool(fields::COMPLETE).ok() == Some(true) && !d.contains_key(pending::PARENT_FENCE)
}

impl<S: Store + Clone> Queue<S> {
    /// Waits until task `id` has ended, completed or failed for good (or
    /// cancelled), and returns how ([`Ended`]): at once if it already has.
    /// Woken by change notifications on the task's document, not by polling
    /// (without notifications, as on a standalone `mongod`, it reads the task
    /// every second). A task that does not exist, or is deleted while waited
    /// for, is [`AgentError::NotFound`]. It waits for as long as it takes:
    /// bound it with `tokio::time::timeout`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), mongoagent::AgentError> {
    /// use mongoagent::{Agent, NewTask, Queue, Task};
    /// use store_memory::MemoryStore;
    ///
    /// let store = MemoryStore::new();
    /// let queue = Queue::new(store.clone(), "tasks")?;
    /// let (id, _) = queue.enqueue(NewTask::new("double", bson::doc! { "n": 21 })).await?;
    /// let agent = Agent::builder(store, "double", "tasks").build()?;
    /// agent
    ///     .process(|t: Task| async move {
    ///         let n = t.data().get_i32("n").unwrap_or(0);
    ///         mongoagent::Outcome::done_with(bson::doc! { "result": n * 2 })
    ///     })
    ///     .await?;
    /// let ended = queue.wait_for(&id).await?;
    /// assert!(ended.completed());
    /// assert_eq!(ended.data().get_i32("result").unwrap(), 42);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn wait_for(&self, id: &Key) -> Result<Ended, AgentError> {
        // Subscribed before the first read, so no change falls between.
        let mut changes = match self.store.watch(&self.coll, Some(id)).await {
            Ok(s) => Some(s),
            Err(StoreError::Unsupported { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        loop {
            match self.store.get(&self.coll, id).await?.record {
                None => return Err(AgentError::NotFound { task: id.to_string() }),
                Some(r) if ended(&r) => {
                    tracing::debug!(queue = %self.coll, task = %id, "waited-for task ended");
                    return Ok(Ended { key: id.clone(), data: r.into_data() });
                }
                Some(_) => {}
            }
            match &mut changes {
                Some(s) => match tokio::time::timeout(RECHECK_WATCHED, s.next()).await {
                    // A change (or a resync), or time for a safety read.
                    Ok(Some(Ok(_))) | Err(_) => {}
                    // The notifications ended: read on a timer from now on.
                    Ok(Some(Err(_)) | None) => changes = None,
                },
                None => tokio::time::sleep(RECHECK).await,
            }
        }
    }
}
