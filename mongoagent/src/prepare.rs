//! A task made ready for another writer to insert: the exact document
//! [`Queue::enqueue`] would insert, checked the same way, for a write the
//! queue does not make itself (the outbox pattern: inserted inside the
//! caller's MongoDB transaction with `store_mongo::MongoStore::insert_in_session`).

use bson::Document;
use store_trait::{Key, Store};

use crate::error::AgentError;
use crate::queue::Queue;
use crate::task::{DedupeScope, NewTask};

/// A task's document, ready to be inserted into its queue's collection by
/// the caller ([`Queue::prepare`]).
#[derive(Debug, Clone, PartialEq)]
#[must_use = "a prepared task is enqueued only once its document is inserted"]
pub struct PreparedTask {
    id: Key,
    document: Document,
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
        if task.group.is_some() {
            return Err(AgentError::InvalidTask(
                "a grouped task cannot be prepared yet: its agents learn of it from the enqueue, after the insert"
                    .into(),
            ));
        }
        let Some(doc) = self.documents(std::slice::from_ref(&task)).await?.pop() else {
            return Err(AgentError::InvalidTask("prepare made no document".into()));
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
        Ok(PreparedTask { id, document })
    }
}
