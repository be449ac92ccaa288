//! A task made ready for another writer to insert: the exact document
//! [`Queue::enqueue`] would insert, checked the same way, for a write the
//! queue does not make itself (the outbox pattern: inserted inside the
//! caller's MongoDB transaction with `store_mongo::MongoStore::insert_in_session`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bson::Document;
use store_trait::{Key, Store};

use crate::error::AgentError;
use crate::queue::Queue;
use crate::task::{DedupeScope, NewTask};

/// A task's document, ready to be inserted into its queue's collection by
/// the caller ([`Queue::prepare`]).
#[derive(Debug, Clone)]
#[must_use = "a prepared task is enqueued only once its document is inserted"]
pub struct PreparedTask {
    id: Key,
    document: Document,
    /// A grouped task's agent name and group: its slot was told of the
    /// insert to come ([`Queue::after_insert`] says it is over).
    group: Option<(String, String)>,
    /// Whether [`Queue::after_insert`] landed it already (shared by its
    /// clones): a landing counted twice would hide a later producer's
    /// announcement, and strand its task.
    landed: Arc<AtomicBool>,
}

impl PartialEq for PreparedTask {
    fn eq(&self, other: &Self) -> bool {
        (&self.id, &self.document, &self.group) == (&other.id, &other.document, &other.group)
    }
}

impl PreparedTask {
    /// The task's id, the one [`Queue::enqueue`] would have returned.
    pub fn id(&self) -> &Key {
        &self.id
    }

    /// The document to insert: the task's fields and its `_id`; the store
    /// adds its own (fence, revision) as it inserts.
    pub fn document(&self) -> &Document {
        &self.document
    }

    /// The document to insert, taken.
    pub fn into_document(self) -> Document {
        self.document
    }
}

impl<S: Store + Clone> Queue<S> {
    /// Makes `task` ready to be inserted by the caller rather than enqueued:
    /// the document [`Queue::enqueue`] would insert, with its id, checked the
    /// same way (reserved fields, names, depth, options) and timed on the
    /// store clock (its delay counts from this call). For the outbox
    /// pattern on MongoDB, where a task must exist if and only if the
    /// caller's transaction commits: insert the document with
    /// `store_mongo::MongoStore::insert_in_session` in that transaction.
    /// Nothing is enqueued until then, and a prepared task inserted twice is
    /// a duplicate of itself.
    ///
    /// Its dedupe key is kept by the unique index alone, as any enqueue's: a
    /// task holding the key when the transaction inserts makes that insert a
    /// [`StoreError::DuplicateKey`](store_trait::StoreError::DuplicateKey),
    /// on which MongoDB aborts the transaction. A key held by a task whose
    /// scope no longer lets it block (an ended task's, with
    /// [`DedupeScope::UntilEnded`]; a passed window) is moved off that task
    /// here, as [`Queue::enqueue`] would, so only a blocking holder makes the
    /// duplicate. A debounced task cannot be prepared
    /// ([`AgentError::InvalidTask`]): a debounce rewrites the waiting task
    /// in place of inserting one.
    ///
    /// A grouped task ([`NewTask::group`]) is numbered in its group here:
    /// its place is this call's, though its agents see it only once the
    /// transaction commits (tasks of its group let through before then run
    /// before it). Call [`Queue::after_insert`] once the transaction has
    /// committed or aborted, so that its agents look at once.
    ///
    /// Call it **before** the transaction starts: it creates the queue's
    /// indexes and may free the dedupe key, and a transaction works on a
    /// snapshot taken at its start (on MongoDB, a collection or index created
    /// after it makes the insert a `WriteConflict`; a key freed after it is
    /// still held in it, a duplicate).
    ///
    /// ```
    /// use mongoagent::{NewTask, Queue};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), mongoagent::AgentError> {
    /// let queue = Queue::new(store_memory::MemoryStore::new(), "mail")?;
    /// let task = queue.prepare(NewTask::new("welcome", bson::doc! { "user": 7 })).await?;
    /// assert_eq!(task.document().get_str("agent_name").ok(), Some("welcome"));
    /// // On MongoDB, inside the caller's transaction:
    /// // store.insert_in_session(&mut session, queue.collection(), task.into_document()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it creates the queue's indexes (idempotent) and may move
    /// a dedupe key off a task that no longer holds it, which any later
    /// enqueue would do too.
    pub async fn prepare(&self, task: NewTask) -> Result<PreparedTask, AgentError> {
        if matches!(task.dedupe_scope, DedupeScope::Debounce(_)) {
            return Err(AgentError::InvalidTask(
                "a debounced task cannot be prepared: a debounce rewrites the waiting task rather than insert one"
                    .into(),
            ));
        }
        let Some(mut doc) = self.documents(std::slice::from_ref(&task)).await?.pop() else {
            return Err(AgentError::InvalidTask("prepare made no document".into()));
        };
        // Numbered in its group now, as an enqueue numbers before its insert;
        // the slot stays in its agents' sweep until `after_insert` (or for
        // `LAND_WITHIN`), so a committed insert nobody reports still runs.
        let group = match &task.group {
            Some(_) => self.groups()?.number(std::slice::from_mut(&mut doc)).await?.pop(),
            None => None,
        };
        if let Some(k) = &task.dedupe_key {
            // As an enqueue's duplicate, by the holder's scope; a holder that
            // still blocks is left, and makes the insert a duplicate.
            let _ = self.free_key(k).await?;
        }
        let mut document = doc;
        // Its id now, so the caller knows it before the insert; the store
        // adds its own fields (fence, revision) when it inserts.
        let id = match document.get(store_trait::fields::ID) {
            Some(id) => Key::from_bson(id.clone())?,
            None => {
                let id = Key::generate();
                document.insert(store_trait::fields::ID, id.as_bson().clone());
                id
            }
        };
        tracing::debug!(queue = %self.coll, task = %id, "task prepared for the caller's insert");
        Ok(PreparedTask { id, document, group, landed: Arc::default() })
    }

    /// Says that the caller's insert of `task` is over, committed or not:
    /// for a grouped task, its group's agents look at once (they let it
    /// through when its turn comes), and its slot no longer waits for the
    /// insert. Nothing for an ungrouped task, which its agents' change
    /// notifications find.
    ///
    /// Without this call a committed grouped task still runs: its agents'
    /// sweep finds it within [`group::SWEEP`](crate::group::SWEEP). Called
    /// again (on `task` or a clone of it), it only wakes the agents.
    ///
    /// ```
    /// use mongoagent::{NewTask, Queue};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), mongoagent::AgentError> {
    /// let queue = Queue::new(store_memory::MemoryStore::new(), "mail")?;
    /// let task = queue.prepare(NewTask::new("welcome", bson::doc! { "user": 7 }).group("user-7")).await?;
    /// // On MongoDB, inside the caller's transaction, then its commit:
    /// // store.insert_in_session(&mut session, queue.collection(), task.document().clone()).await?;
    /// // session.commit_transaction().await?;
    /// queue.after_insert(&task).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped, it leaves the task to the sweep.
    pub async fn after_insert(&self, task: &PreparedTask) -> Result<(), AgentError> {
        let Some((agent, group)) = &task.group else { return Ok(()) };
        let groups = self.groups()?;
        // Landed once (or tried: its error may hide a landing made): a call
        // again only nudges.
        if task.landed.swap(true, Ordering::SeqCst) {
            return groups.nudge(agent, group).await;
        }
        groups.landed(agent, group).await
    }
}
