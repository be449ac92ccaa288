//! Writes inside the caller's own MongoDB transaction: the outbox pattern,
//! where a document (a task) exists if and only if the caller's other writes
//! in the same transaction commit. MongoDB only: the [`Store`](store_trait::Store)
//! contract has no transactions, and the crates above it need none.

use bson::Document;
use mongodb::ClientSession;
use store_trait::backend::prepare_inserts;
use store_trait::{Collection, Key, StoreError, StoreResult};

use crate::errors::{in_coll, map_err};
use crate::MongoStore;

impl MongoStore {
    /// Inserts `doc` into `coll` inside `session`'s transaction: the document
    /// exists for everyone else once the transaction commits, and never if it
    /// aborts or its process dies first. The document is given the contract's
    /// shape as [`Store::insert_many`](store_trait::Store::insert_many) gives
    /// it (an `_id` if it has none, fence 0, revision 1; field names
    /// checked), so the store's other operations read and claim it as any
    /// other. Returns its key.
    ///
    /// This is for a document made ready by the crate that owns its schema,
    /// such as a task from `mongoagent::Queue::prepare`; writing a raw
    /// document this way skips that crate's checks.
    ///
    /// `session` must be a session of this store's client
    /// ([`database`](MongoStore::database)`().client()`) with a transaction
    /// started ([`ClientSession::start_transaction`]); the driver refuses a
    /// transaction where the deployment has none (a standalone server: a
    /// replica set or a sharded cluster is needed). Outside a transaction the
    /// insert is an ordinary one, committed at once. The transaction's write
    /// concern applies, not the store's [`Consistency`](crate::Consistency).
    ///
    /// # Errors
    ///
    /// A document that holds an existing `_id` or a value a unique index
    /// already holds (a task's dedupe key) is [`StoreError::DuplicateKey`];
    /// the server then aborts the transaction, so nothing of it commits.
    /// Errors of the transaction itself (a write conflict with another
    /// transaction: [`FaultKind::Transient`](store_trait::FaultKind::Transient),
    /// label `TransientTransactionError`) are classified as the store's
    /// others; the caller retries the whole transaction.
    ///
    /// ```no_run
    /// use store_mongo::{mongodb, MongoStore};
    /// use store_trait::Collection;
    ///
    /// # async fn outbox(store: MongoStore) -> Result<(), Box<dyn std::error::Error>> {
    /// let client = store.database().client();
    /// let mut session = client.start_session().await?;
    /// session.start_transaction().await?;
    /// let orders = store.database().collection::<bson::Document>("orders");
    /// orders.insert_one(bson::doc! { "_id": 17, "total": 40 }).session(&mut session).await?;
    /// let event = bson::doc! { "kind": "order placed", "order": 17 };
    /// store.insert_in_session(&mut session, &Collection::new("outbox")?, event).await?;
    /// session.commit_transaction().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe, and not bounded by the store's operation timeout:
    /// the command runs on the caller's borrowed session, so it cannot move
    /// to a task of its own. A dropped call leaves the transaction with or
    /// without the document: abort it. The transaction's own limit on the
    /// server (`transactionLifetimeLimitSeconds`, 60 s by default) bounds it.
    pub async fn insert_in_session(
        &self,
        session: &mut ClientSession,
        coll: &Collection,
        doc: Document,
    ) -> StoreResult<Key> {
        let Some((key, doc)) = prepare_inserts(vec![doc])?.pop() else {
            return Err(StoreError::invalid("document", "nothing to insert"));
        };
        // The collection's write concern is the store's; inside a transaction
        // the driver leaves it out, and the transaction's applies.
        self.coll(coll).insert_one(doc).session(&mut *session).await.map_err(map_err).map_err(in_coll(coll))?;
        tracing::debug!(collection = %coll, key = %key, "inserted in the caller's transaction");
        Ok(key)
    }
}
