//! The MongoDB [`Store`]: every contract operation is **one command** to the
//! server, and every lease is stamped and checked on the server's clock (`$$NOW`).
//!
//! | operation | command |
//! |---|---|
//! | `write` (acquire, renew, release, CAS) | one `findAndModify` with a pipeline update (upsert when asked) |
//! | `claim` | one `findAndModify` with filter, sort and pipeline update |
//! | `get` | one `aggregate` returning the record and `$$NOW` (`$documents` + `$lookup`; before MongoDB 5.1, `$match` + `$facet`) |
//! | `now` | one `hello` (its `localTime`) |
//! | `delete` | one `findAndModify` (remove); a rejected delete reads the current record with a second |
//! | `insert_many` | one unordered `insert` |
//! | `watch` | a change stream; `Unsupported` on a standalone server |
//! | [`MongoStore::insert_in_session`] (not the contract's: MongoDB only) | one `insert` in the caller's transaction |
//!
//! ```no_run
//! use store_mongo::MongoStore;
//! use store_trait::{Collection, Key, Store};
//!
//! # async fn demo() -> Result<(), store_trait::StoreError> {
//! let store = MongoStore::connect("mongodb://localhost:27017", "coolproj").await?;
//! let snapshot = store.get(&Collection::new("mongolocker")?, &Key::new("scheduler")?).await?;
//! println!("server time {}, lock {:?}", snapshot.now, snapshot.record);
//! # Ok(()) }
//! ```
//!
//! # Consistency
//!
//! By default writes use `w: "majority"` and reads `readConcern: "majority"`, so a
//! lease granted on a replica set survives a primary failover (a lease acknowledged
//! with `w: 1` can vanish when the primary steps down, leaving two holders).
//! [`Consistency::Local`] trades that away for latency: `w: 1` and local reads.
//! Writes are journaled (`j: true`) at both levels: a write acknowledged before it
//! reached the journal is lost when the server crashes, and a fencing counter
//! then goes back below a fence already handed out.
//!
//! # Deadlines
//!
//! Every call has one, so a primary that stops answering (black-holed, paused)
//! cannot hang a caller. The Rust driver does not support `socketTimeoutMS`, so
//! the bound is the store's own: each operation runs on its own task and is
//! given up after the operation timeout ([`DEFAULT_OPERATION_TIMEOUT`], or
//! `socketTimeoutMS` from the URI, or [`MongoStore::with_operation_timeout`])
//! with a [`FaultKind::Timeout`] error, which is ambiguous like any transient
//! one. The server is asked to stop at the same bound (`maxTimeMS` on
//! `findAndModify`, `find`, `count` and `aggregate`; `wtimeout` on majority
//! writes). [`MongoStore::connect`] also sets `connectTimeoutMS` and
//! `serverSelectionTimeoutMS` to 10 s unless the URI gives them. Callers with a
//! tighter deadline (an acquire timeout, a lease) wait less on their own.
//!
//! # Server versions
//!
//! MongoDB [`MIN_SERVER_VERSION`] (4.4) or newer, as a replica set for change
//! notifications (a standalone server works; watchers then poll). Older
//! servers are refused by the driver itself when it selects a server, with an
//! error naming its minimum. `get` reads a record and the server time in one
//! command whatever the version: MongoDB 5.1 and newer get `$documents` +
//! `$lookup`; 4.4 and 5.0 get `$match` + `$facet` on the collection (`$facet`
//! always outputs one row, so the time comes back for a missing document
//! too). Which one is decided once per store from the `maxWireVersion` of
//! the first `hello` (the one [`MongoStore::connect`] sends, or one more
//! command before the first `get` of a store made with [`MongoStore::new`]).
//!
//! # Cancel safety
//!
//! Every [`Store`] operation runs on its own task (see "Deadlines"), so
//! dropping its future does not stop the command: a write the server
//! received is applied or not whether or not anyone waits for the reply.
//! Dropped half-way, a write's outcome is unknown to the caller, as after a
//! [`FaultKind::Timeout`]; reads and `watch` are cancel-safe. The crates above
//! run writes they bound by a deadline on their own task for the same reason.
//!
//! # Retries
//!
//! The driver retries a retryable write once by itself (`retryWrites=true`, the
//! default). Any error it still returns is classified ([`FaultKind`]); transient
//! ones leave the outcome ambiguous, and the crates above read back before they
//! assume either way.

mod claim_many;
mod compile;
mod connect;
mod distinct;
mod errors;
mod filter;
mod find_keys;
mod server;
mod session;
mod shutdown;
mod watch;
mod write;
mod write_many;

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use mongodb::error::ErrorKind;
use mongodb::options::{Acknowledgment, CollectionOptions, IndexOptions, ReadConcern, ReturnDocument, WriteConcern};
use mongodb::{Client, Database, IndexModel};
use store_trait::{
    backend::prepare_inserts, fields, BatchOutcome, ChangeFilter, ChangeStream, Claim, Collection, Condition,
    DeleteOutcome, FaultKind, IndexSpec, InsertOutcome, Key, Query, Record, Snapshot, Store, StoreError, StoreResult,
    StoreTime, Write, WriteOutcome,
};

use connect::{check_db_name, client_options, redact_error};
pub use connect::{redact_uri, ConnectionConfig, DEFAULT_DATABASE};
pub(crate) use errors::{in_coll, is_change_streams_unsupported, map_err};
pub use mongodb;
pub use server::MIN_SERVER_VERSION;
pub use shutdown::{Clients, SHUTDOWN_LIMIT};

/// Read and write concerns for the operations that grant or check ownership.
///
/// A lease or fencing counter that a server crash can roll back is as bad as one a
/// failover can: after the restart the counter is lower than a fence already
/// handed out. So the default asks for journaled majority writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Consistency {
    /// `w: "majority", j: true` writes and `readConcern: "majority"` reads: a lease
    /// survives a replica-set failover and a server crash. The default.
    #[default]
    Majority,
    /// `w: 1, j: true` writes and local reads: a lease survives a crash of the
    /// server that granted it (the journal), but on a replica set a failover can
    /// roll back an acknowledged lease, and two holders become possible until it
    /// expires. Without `j: true`, `w: 1` would not survive even a single
    /// server's crash, so it is always asked for.
    Local,
}

/// How long one operation may take unless configured otherwise (see the crate
/// docs, "Deadlines").
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(30);
/// `connectTimeoutMS` and `serverSelectionTimeoutMS` unless the URI gives them.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// What the client-side bound adds to `maxTimeMS`, so that a server that is
/// answering reports its own time-out first.
const CLIENT_GRACE: Duration = Duration::from_secs(1);

/// A [`Store`] on a MongoDB database. Cheap to clone (the client is shared).
#[derive(Debug, Clone)]
pub struct MongoStore {
    db: Database,
    consistency: Consistency,
    operation_timeout: Duration,
    nonce_prefix: Arc<str>,
    nonce: Arc<AtomicU64>,
    hub: Arc<watch::Hub>,
    /// How `get` reads, learned from the first `hello` (see "Server versions").
    read_form: Arc<OnceLock<server::ReadForm>>,
}

impl MongoStore {
    /// Connects to `uri` and uses database `db`. Sets an app name, a 10 s
    /// connect and server selection timeout ([`DEFAULT_CONNECT_TIMEOUT`]) and the
    /// operation timeout ([`DEFAULT_OPERATION_TIMEOUT`]) unless the URI says
    /// otherwise (`appName`, `connectTimeoutMS`, `serverSelectionTimeoutMS`,
    /// `socketTimeoutMS`, which this store applies to every operation since the
    /// driver does not). Fails with [`FaultKind::Unreachable`] when no server
    /// answers, and with [`FaultKind::Permanent`] when it is older than
    /// [`MIN_SERVER_VERSION`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: nothing is written; dropping the future drops the client.
    pub async fn connect(uri: &str, db: &str) -> StoreResult<MongoStore> {
        let (opts, operation_timeout) = client_options(uri).await?;
        // The driver's messages may quote the URI: none that quotes one of
        // its secrets is passed on.
        let client = Client::with_options(opts).map_err(|e| redact_error(map_err(e), uri))?;
        let store = MongoStore::new(client.database(check_db_name(db)?)).with_operation_timeout(operation_timeout);
        // One round trip now, so a wrong address fails here with a clear error.
        store.now().await.map_err(|e| redact_error(e, uri))?;
        Ok(store)
    }

    /// Uses an existing database handle (its client's options apply).
    pub fn new(db: Database) -> MongoStore {
        let prefix = bson::oid::ObjectId::new().to_hex();
        MongoStore {
            db,
            consistency: Consistency::default(),
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            nonce_prefix: prefix.into(),
            nonce: Arc::new(AtomicU64::new(0)),
            hub: Arc::new(watch::Hub::new()),
            read_form: Arc::new(OnceLock::new()),
        }
    }

    /// Sets the consistency level (default [`Consistency::Majority`]).
    #[must_use]
    pub fn with_consistency(mut self, c: Consistency) -> Self {
        self.consistency = c;
        self
    }

    /// Sets how long one operation may take (default
    /// [`DEFAULT_OPERATION_TIMEOUT`]): `maxTimeMS` on the server, and the time
    /// after which the call gives up with [`FaultKind::Timeout`] (a little later).
    /// A zero duration is taken as one millisecond.
    #[must_use]
    pub fn with_operation_timeout(mut self, d: Duration) -> Self {
        self.operation_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// The operation timeout.
    pub fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// This store reading as it does on a server of wire version `wire`: how
    /// tests try the forms older servers get on a newer one (`store-test`'s
    /// `mongo::assuming_wire_version`). Not part of the API.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn assuming_wire_version(mut self, wire: i32) -> StoreResult<Self> {
        self.read_form = Arc::new(OnceLock::from(server::ReadForm::for_wire_version(wire)?));
        Ok(self)
    }

    /// Runs one operation on its own task (a driver future is never dropped
    /// half-way) and gives up on it after the operation timeout.
    async fn bounded<T: Send + 'static>(
        &self,
        what: &'static str,
        fut: impl std::future::Future<Output = StoreResult<T>> + Send + 'static,
    ) -> StoreResult<T> {
        let limit = self.operation_timeout + CLIENT_GRACE;
        match tokio::time::timeout(limit, tokio::spawn(fut)).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => Err(StoreError::backend(FaultKind::Transient, format!("{what}: task failed: {e}"))),
            Err(_) => {
                tracing::warn!(what, ?limit, "no reply from the server in time");
                Err(StoreError::backend(
                    FaultKind::Timeout,
                    format!("{what}: no reply from the server within {limit:?}"),
                ))
            }
        }
    }

    /// The database handle.
    pub fn database(&self) -> &Database {
        &self.db
    }

    fn coll(&self, c: &Collection) -> mongodb::Collection<Document> {
        let opts = match self.consistency {
            Consistency::Majority => CollectionOptions::builder()
                .write_concern(
                    WriteConcern::builder()
                        .w(Acknowledgment::Majority)
                        .journal(true)
                        .w_timeout(self.operation_timeout)
                        .build(),
                )
                .read_concern(ReadConcern::majority())
                .build(),
            Consistency::Local => CollectionOptions::builder()
                .write_concern(WriteConcern::builder().w(Acknowledgment::Nodes(1)).journal(true).build())
                .build(),
        };
        self.db.collection_with_options(c.as_str(), opts)
    }

    fn next_nonce(&self) -> String {
        format!("{}-{}", self.nonce_prefix, self.nonce.fetch_add(1, AtomicOrdering::Relaxed))
    }
}

/// The operations, unbounded; [`Store`] runs each through [`MongoStore::bounded`].
impl MongoStore {
    async fn delete_op(&self, coll: &Collection, key: &Key, condition: &Condition) -> StoreResult<DeleteOutcome> {
        condition.validate()?;
        let mut filter = doc! { fields::ID: key.as_bson().clone() };
        filter::select(&mut filter, condition, None);
        match self.coll(coll).find_one_and_delete(filter).max_time(self.operation_timeout).await.map_err(map_err)? {
            Some(doc) => Ok(DeleteOutcome::Deleted(Record::from_document(coll.as_str(), doc)?)),
            None => Ok(DeleteOutcome::Rejected(self.get_op(coll, key).await?.record)),
        }
    }

    async fn claim_op(&self, coll: &Collection, claim: &Claim) -> StoreResult<Option<Record>> {
        claim.validate()?;
        let nonce = self.next_nonce();
        let collection = self.coll(coll);
        let mut op = collection
            .find_one_and_update(
                filter::claim(&claim.query),
                compile::update(compile::Applies::Matched(&claim.query.condition), &claim.mutation, &nonce),
            )
            .return_document(ReturnDocument::After)
            .max_time(self.operation_timeout);
        if let Some(sort) = filter::sort(&claim.query) {
            op = op.sort(sort);
        }
        match op.await.map_err(map_err).map_err(in_coll(coll))? {
            Some(doc) => Ok(Some(Record::from_document(coll.as_str(), doc)?)),
            None => Ok(None),
        }
    }

    async fn insert_many_op(&self, coll: &Collection, docs: Vec<Document>) -> StoreResult<Vec<InsertOutcome>> {
        let prepared = prepare_inserts(docs)?;
        if prepared.is_empty() {
            return Ok(Vec::new());
        }
        let (keys, docs): (Vec<Key>, Vec<Document>) = prepared.into_iter().unzip();
        let dups: Vec<usize> = match self.coll(coll).insert_many(docs).ordered(false).await {
            Ok(_) => Vec::new(),
            Err(e) => match &*e.kind {
                ErrorKind::InsertMany(im) if im.write_concern_error.is_none() => {
                    let errs = im.write_errors.as_deref().unwrap_or_default();
                    if errs.iter().any(|w| w.code != 11000) {
                        return Err(in_coll(coll)(map_err(e)));
                    }
                    errs.iter().map(|w| w.index).collect()
                }
                _ => return Err(in_coll(coll)(map_err(e))),
            },
        };
        Ok(keys
            .into_iter()
            .enumerate()
            .map(|(i, k)| if dups.contains(&i) { InsertOutcome::Duplicate(k) } else { InsertOutcome::Inserted(k) })
            .collect())
    }

    async fn find_each_op(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<StoreResult<Record>>> {
        let docs = self.find_docs(coll, query, filter::query(query), None, query.limit.map(i64::from)).await?;
        Ok(docs.into_iter().map(|d| Record::from_document(coll.as_str(), d)).collect())
    }

    /// One `find` of `filter` in `query`'s order, up to `limit`.
    pub(crate) async fn find_docs(
        &self,
        coll: &Collection,
        query: &Query,
        filter: Document,
        projection: Option<Document>,
        limit: Option<i64>,
    ) -> StoreResult<Vec<Document>> {
        query.validate()?;
        // The server reads a limit of 0 as none; the contract, as nothing.
        if limit == Some(0) {
            return Ok(Vec::new());
        }
        let collection = self.coll(coll);
        let mut op = collection.find(filter).max_time(self.operation_timeout);
        if let Some(p) = projection {
            op = op.projection(p);
        }
        if let Some(sort) = filter::sort(query) {
            op = op.sort(sort);
        }
        if let Some(n) = limit {
            op = op.limit(n);
        }
        op.await.map_err(map_err)?.try_collect().await.map_err(map_err)
    }

    async fn count_op(&self, coll: &Collection, query: &Query) -> StoreResult<u64> {
        query.validate()?;
        self.coll(coll).count_documents(filter::query(query)).max_time(self.operation_timeout).await.map_err(map_err)
    }

    async fn watch_op(
        &self,
        coll: &Collection,
        key: Option<&Key>,
        filter: Option<&ChangeFilter>,
    ) -> StoreResult<ChangeStream> {
        let collection = self.db.collection::<Document>(coll.as_str());
        let stage = match filter {
            Some(f) => {
                f.validate()?;
                Some(compile::change_match(f))
            }
            None => None,
        };
        self.hub.subscribe(collection, key.cloned(), stage).await
    }

    async fn ensure_indexes_op(&self, coll: &Collection, indexes: &[IndexSpec]) -> StoreResult<()> {
        let mut models = Vec::with_capacity(indexes.len());
        for i in indexes {
            i.validate()?;
            let keys: Document = i.keys.iter().map(|(f, o)| (f.clone(), Bson::Int32(o.as_i32()))).collect();
            let opts = IndexOptions::builder()
                .name(i.name.clone())
                .unique(i.unique.then_some(true))
                .sparse(i.sparse.then_some(true))
                .expire_after(i.expire_after)
                .build();
            models.push(IndexModel::builder().keys(keys).options(opts).build());
        }
        match self.coll(coll).create_indexes(models).await {
            Ok(_) => Ok(()),
            // IndexOptionsConflict / IndexKeySpecsConflict: a different index of that name exists.
            Err(e) if matches!(&*e.kind, ErrorKind::Command(c) if c.code == 85 || c.code == 86) => {
                Err(StoreError::invalid("index", e.to_string()))
            }
            Err(e) => Err(map_err(e)),
        }
    }
}

/// Each operation is one command (see the crate docs), run on its own task.
///
/// # Cancel safety
///
/// Dropping an operation's future leaves its task running to the end: a write
/// is applied or not as the server decides, and the caller does not learn
/// which (as after a [`FaultKind::Timeout`]). Reads and `watch` are
/// cancel-safe.
#[async_trait]
impl Store for MongoStore {
    fn backend_name(&self) -> &'static str {
        "mongodb"
    }

    async fn now(&self) -> StoreResult<StoreTime> {
        let this = self.clone();
        self.bounded("now", async move { this.hello_op().await.map(|(now, _)| now) }).await
    }

    async fn get(&self, coll: &Collection, key: &Key) -> StoreResult<Snapshot> {
        let (this, coll, key) = (self.clone(), coll.clone(), key.clone());
        self.bounded("get", async move { this.get_op(&coll, &key).await }).await
    }

    async fn write(&self, coll: &Collection, key: &Key, write: &Write) -> StoreResult<WriteOutcome> {
        let (this, coll, key, write) = (self.clone(), coll.clone(), key.clone(), write.clone());
        self.bounded("write", async move { this.write_op(&coll, &key, &write).await }).await
    }

    async fn delete(&self, coll: &Collection, key: &Key, condition: &Condition) -> StoreResult<DeleteOutcome> {
        let (this, coll, key, condition) = (self.clone(), coll.clone(), key.clone(), condition.clone());
        self.bounded("delete", async move { this.delete_op(&coll, &key, &condition).await }).await
    }

    async fn claim(&self, coll: &Collection, claim: &Claim) -> StoreResult<Option<Record>> {
        let (this, coll, claim) = (self.clone(), coll.clone(), claim.clone());
        self.bounded("claim", async move { this.claim_op(&coll, &claim).await }).await
    }

    async fn claim_many(&self, coll: &Collection, claim: &Claim, limit: usize) -> StoreResult<Vec<Record>> {
        let (this, coll, claim) = (self.clone(), coll.clone(), claim.clone());
        self.bounded("claim_many", async move { this.claim_many_op(&coll, &claim, limit).await }).await
    }

    async fn write_many(&self, coll: &Collection, writes: &[(Key, Write)]) -> StoreResult<Vec<BatchOutcome>> {
        let (this, coll, writes) = (self.clone(), coll.clone(), writes.to_vec());
        self.bounded("write_many", async move { this.write_many_op(&coll, &writes).await }).await
    }

    async fn insert_many(&self, coll: &Collection, docs: Vec<Document>) -> StoreResult<Vec<InsertOutcome>> {
        let (this, coll) = (self.clone(), coll.clone());
        self.bounded("insert_many", async move { this.insert_many_op(&coll, docs).await }).await
    }

    async fn find(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<Record>> {
        self.find_each(coll, query).await?.into_iter().collect()
    }

    async fn find_each(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<StoreResult<Record>>> {
        let (this, coll, query) = (self.clone(), coll.clone(), query.clone());
        self.bounded("find", async move { this.find_each_op(&coll, &query).await }).await
    }

    async fn find_keys(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<Key>> {
        let (this, coll, query) = (self.clone(), coll.clone(), query.clone());
        self.bounded("find_keys", async move { this.find_keys_op(&coll, &query).await }).await
    }

    async fn distinct_strings(&self, coll: &Collection, field: &str, query: &Query) -> StoreResult<Vec<String>> {
        let (this, coll, field, query) = (self.clone(), coll.clone(), field.to_owned(), query.clone());
        self.bounded("distinct", async move { this.distinct_strings_op(&coll, &field, &query).await }).await
    }

    async fn count(&self, coll: &Collection, query: &Query) -> StoreResult<u64> {
        let (this, coll, query) = (self.clone(), coll.clone(), query.clone());
        self.bounded("count", async move { this.count_op(&coll, &query).await }).await
    }

    async fn watch(&self, coll: &Collection, key: Option<&Key>) -> StoreResult<ChangeStream> {
        let (this, coll, key) = (self.clone(), coll.clone(), key.cloned());
        self.bounded("watch", async move { this.watch_op(&coll, key.as_ref(), None).await }).await
    }

    async fn watch_filtered(&self, coll: &Collection, filter: &ChangeFilter) -> StoreResult<ChangeStream> {
        let (this, coll, filter) = (self.clone(), coll.clone(), filter.clone());
        self.bounded("watch", async move { this.watch_op(&coll, None, Some(&filter)).await }).await
    }

    async fn ensure_indexes(&self, coll: &Collection, indexes: &[IndexSpec]) -> StoreResult<()> {
        let (this, coll, indexes) = (self.clone(), coll.clone(), indexes.to_vec());
        self.bounded("ensure_indexes", async move { this.ensure_indexes_op(&coll, &indexes).await }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes are journaled at every consistency level: `w: 1` without the
    /// journal loses grants when the server crashes.
    #[tokio::test]
    async fn every_consistency_journals_writes() {
        let (opts, _) = client_options("mongodb://h:1/").await.unwrap();
        let client = Client::with_options(opts).unwrap();
        for c in [Consistency::Majority, Consistency::Local] {
            let store = MongoStore::new(client.database("x")).with_consistency(c);
            let wc = store.coll(&Collection::new("c").unwrap()).write_concern().cloned();
            assert_eq!(wc.and_then(|w| w.journal), Some(true), "{c:?}");
        }
    }

    /// A server that accepts connections and never answers: every call ends with
    /// a timeout error after the operation timeout, instead of hanging (here it
    /// would wait for the 60 s server selection timeout).
    #[tokio::test]
    async fn a_silent_server_times_out_every_call() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                open.push(sock);
            }
        });
        let uri = format!("mongodb://127.0.0.1:{port}/?directConnection=true&serverSelectionTimeoutMS=60000");
        let (opts, _) = client_options(&uri).await.unwrap();
        let store = MongoStore::new(Client::with_options(opts).unwrap().database("x"))
            .with_operation_timeout(Duration::from_millis(200));
        let start = std::time::Instant::now();
        let e = store.get(&Collection::new("c").unwrap(), &Key::new("k").unwrap()).await.unwrap_err();
        assert_eq!(e.fault_kind(), Some(FaultKind::Timeout), "{e}");
        assert!(e.is_ambiguous());
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        hold.abort();
    }
}
