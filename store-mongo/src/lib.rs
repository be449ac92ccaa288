//! The MongoDB [`Store`]: every contract operation is **one command** to the
//! server, and every lease is stamped and checked on the server's clock (`$$NOW`).
//!
//! | operation | command |
//! |---|---|
//! | `write` (acquire, renew, release, CAS) | one `findAndModify` with a pipeline update (upsert when asked) |
//! | `claim` | one `findAndModify` with filter, sort and pipeline update |
//! | `get` | one `aggregate` (`$documents` + `$lookup`) returning the record and `$$NOW` |
//! | `now` | one `hello` (its `localTime`) |
//! | `delete` | one `findAndModify` (remove); a rejected delete reads the current record with a second |
//! | `insert_many` | one unordered `insert` |
//! | `watch` | a change stream; `Unsupported` on a standalone server |
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
//! [`Consistency::Local`] trades that away for latency on a single server.
//!
//! # Retries
//!
//! The driver retries a retryable write once by itself (`retryWrites=true`, the
//! default). Any error it still returns is classified ([`FaultKind`]); transient
//! ones leave the outcome ambiguous, and the crates above read back before they
//! assume either way.

mod compile;
#[cfg(feature = "testing")]
pub mod testing;
mod watch;

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use mongodb::error::{Error as MongoError, ErrorKind, WriteFailure};
use mongodb::options::{
    Acknowledgment, ClientOptions, CollectionOptions, IndexOptions, ReadConcern, ReturnDocument, WriteConcern,
};
use mongodb::{Client, Database, IndexModel};
use store_trait::{
    fields, prepare_inserts, ChangeStream, Claim, Collection, Condition, DeleteOutcome, FaultKind, IndexSpec,
    InsertOutcome, Key, Query, Record, Snapshot, Store, StoreError, StoreResult, StoreTime, Write, WriteOutcome,
};

pub use mongodb;

/// Read and write concerns for the operations that grant or check ownership.
///
/// A lease or fencing counter that a server crash can roll back is as bad as one a
/// failover can: after the restart the counter is lower than a token already
/// handed out. So the default asks for journaled majority writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Consistency {
    /// `w: "majority", j: true` writes and `readConcern: "majority"` reads: a lease
    /// survives a replica-set failover and a server crash. The default.
    #[default]
    Majority,
    /// The server's defaults (`w: 1`, local reads). Correct on a single server;
    /// on a replica set a failover can lose an acknowledged lease.
    Local,
}

/// A [`Store`] on a MongoDB database. Cheap to clone (the client is shared).
#[derive(Debug, Clone)]
pub struct MongoStore {
    db: Database,
    consistency: Consistency,
    nonce_prefix: Arc<str>,
    nonce: Arc<AtomicU64>,
    hub: Arc<watch::Hub>,
}

impl MongoStore {
    /// Connects to `uri` and uses database `db`. Sets an app name and a 10 s server
    /// selection timeout unless the URI says otherwise. Fails with
    /// [`FaultKind::Unreachable`] when no server answers.
    pub async fn connect(uri: &str, db: &str) -> StoreResult<MongoStore> {
        let mut opts = ClientOptions::parse(uri)
            .await
            .map_err(|e| StoreError::InvalidInput { what: "MongoDB URI", reason: redact_error(&e.to_string(), uri) })?;
        if opts.app_name.is_none() {
            opts.app_name = Some("mongocoord".into());
        }
        if opts.server_selection_timeout.is_none() {
            opts.server_selection_timeout = Some(Duration::from_secs(10));
        }
        let client = Client::with_options(opts).map_err(map_err)?;
        let store = MongoStore::new(client.database(check_db_name(db)?));
        // One round trip now, so a wrong address fails here with a clear error.
        store.now().await?;
        Ok(store)
    }

    /// Uses an existing database handle (its client's options apply).
    pub fn new(db: Database) -> MongoStore {
        let prefix = bson::oid::ObjectId::new().to_hex();
        MongoStore {
            db,
            consistency: Consistency::default(),
            nonce_prefix: prefix.into(),
            nonce: Arc::new(AtomicU64::new(0)),
            hub: Arc::new(watch::Hub::new()),
        }
    }

    /// Sets the consistency level (default [`Consistency::Majority`]).
    pub fn with_consistency(mut self, c: Consistency) -> Self {
        self.consistency = c;
        self
    }

    /// The database handle.
    pub fn database(&self) -> &Database {
        &self.db
    }

    fn coll(&self, c: &Collection) -> mongodb::Collection<Document> {
        let opts = match self.consistency {
            Consistency::Majority => CollectionOptions::builder()
                .write_concern(WriteConcern::builder().w(Acknowledgment::Majority).journal(true).build())
                .read_concern(ReadConcern::majority())
                .build(),
            Consistency::Local => CollectionOptions::default(),
        };
        self.db.collection_with_options(c.as_str(), opts)
    }

    fn next_nonce(&self) -> String {
        format!("{}-{}", self.nonce_prefix, self.nonce.fetch_add(1, AtomicOrdering::Relaxed))
    }

    /// One `findAndModify`. `Ok(None)` means "lost a creation race, try again".
    async fn write_once(
        &self,
        coll: &Collection,
        key: &Key,
        write: &Write,
        nonce: &str,
    ) -> Result<Option<WriteOutcome>, StoreError> {
        let pipeline = compile::update(Some(&write.condition), &write.mutation, nonce);
        let result = self
            .coll(coll)
            .find_one_and_update(doc! { fields::ID: key.as_bson().clone() }, pipeline)
            .upsert(write.upsert)
            .return_document(ReturnDocument::After)
            .await
            .map_err(map_err);
        let doc = match result {
            // Concurrent upserts of a missing document race on the `_id` index:
            // exactly one inserts, the others fail with a duplicate key (or, on some
            // servers, come back empty). The document then exists, so another
            // attempt evaluates the condition normally.
            Err(StoreError::DuplicateKey { .. }) if write.upsert => return Ok(None),
            Ok(None) if write.upsert => return Ok(None),
            Ok(None) => return Ok(Some(WriteOutcome::Rejected(None))),
            Ok(Some(doc)) => doc,
            Err(e) => return Err(e),
        };
        let applied = doc.get_str(fields::LAST_OP).is_ok_and(|n| n == nonce);
        let record = Record::from_document(coll.as_str(), doc)?;
        Ok(Some(if applied { WriteOutcome::Applied(record) } else { WriteOutcome::Rejected(Some(record)) }))
    }
}

fn check_db_name(db: &str) -> StoreResult<&str> {
    if db.is_empty() || db.len() > 63 || db.contains(['/', '\\', '.', ' ', '"', '$', '\0']) {
        return Err(StoreError::invalid("database name", format!("{db:?} is not a valid MongoDB database name")));
    }
    Ok(db)
}

/// Removes the password of `uri` from a message.
fn redact_error(msg: &str, uri: &str) -> String {
    match redact_password(uri) {
        Some((secret, _)) if !secret.is_empty() => msg.replace(&secret, "***"),
        _ => msg.to_owned(),
    }
}

/// The password in a URI, and the URI with it replaced by `***`.
pub fn redact_password(uri: &str) -> Option<(String, String)> {
    let scheme_end = uri.find("://")? + 3;
    let rest = &uri[scheme_end..];
    let at = rest.find('@')?;
    let creds = &rest[..at];
    let colon = creds.find(':')?;
    let secret = creds[colon + 1..].to_owned();
    let redacted = format!("{}{}:***{}", &uri[..scheme_end], &creds[..colon], &rest[at..]);
    Some((secret, redacted))
}

/// Server error codes after which trying again may succeed.
const TRANSIENT_CODES: &[i32] = &[6, 7, 89, 91, 112, 189, 251, 9001, 10107, 11600, 11602, 13435, 13436, 262];
/// Server error codes meaning a deadline passed.
const TIMEOUT_CODES: &[i32] = &[50, 64];

fn classify_code(code: i32, e: &MongoError) -> FaultKind {
    if TIMEOUT_CODES.contains(&code) {
        FaultKind::Timeout
    } else if TRANSIENT_CODES.contains(&code)
        || e.contains_label("RetryableWriteError")
        || e.contains_label("TransientTransactionError")
    {
        FaultKind::Transient
    } else {
        FaultKind::Permanent
    }
}

fn duplicate(message: &str) -> StoreError {
    StoreError::DuplicateKey { collection: String::new(), key: message.to_owned() }
}

/// Maps a driver error to the contract's classification (by kind and code, never
/// by message).
pub(crate) fn map_err(e: MongoError) -> StoreError {
    let (kind, code, message) = match &*e.kind {
        ErrorKind::Command(c) if c.code == 11000 => return duplicate(&c.message),
        ErrorKind::Write(WriteFailure::WriteError(w)) if w.code == 11000 => return duplicate(&w.message),
        ErrorKind::Command(c) => (classify_code(c.code, &e), Some(c.code), c.message.clone()),
        ErrorKind::Write(WriteFailure::WriteError(w)) => (classify_code(w.code, &e), Some(w.code), w.message.clone()),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => {
            // The write was applied on the primary but not confirmed as asked.
            let kind = if TIMEOUT_CODES.contains(&w.code) { FaultKind::Timeout } else { FaultKind::Transient };
            (kind, Some(w.code), w.message.clone())
        }
        ErrorKind::ServerSelection { message, .. } => (FaultKind::Unreachable, None, message.clone()),
        ErrorKind::DnsResolve { message, .. } => (FaultKind::Unreachable, None, message.clone()),
        ErrorKind::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => (FaultKind::Timeout, None, io.to_string()),
        ErrorKind::Io(io) => (FaultKind::Transient, None, io.to_string()),
        ErrorKind::ConnectionPoolCleared { message, .. } => (FaultKind::Transient, None, message.clone()),
        ErrorKind::Shutdown => (FaultKind::Unreachable, None, "the client was shut down".into()),
        _ if e.contains_label("RetryableWriteError") => (FaultKind::Transient, None, e.to_string()),
        _ => (FaultKind::Permanent, None, e.to_string()),
    };
    StoreError::Backend { kind, code, message, source: Some(Box::new(e)) }
}

/// Adds the collection name to a duplicate-key error.
fn in_coll(coll: &Collection) -> impl Fn(StoreError) -> StoreError + '_ {
    move |e| match e {
        StoreError::DuplicateKey { key, .. } => StoreError::DuplicateKey { collection: coll.to_string(), key },
        other => other,
    }
}

pub(crate) fn is_change_streams_unsupported(e: &MongoError) -> bool {
    matches!(&*e.kind, ErrorKind::Command(c) if c.code == 40573 || c.code == 40324 || c.code == 136)
}

#[async_trait]
impl Store for MongoStore {
    fn backend_name(&self) -> &'static str {
        "mongodb"
    }

    async fn now(&self) -> StoreResult<StoreTime> {
        let reply = self.db.run_command(doc! { "hello": 1 }).await.map_err(map_err)?;
        match reply.get("localTime") {
            Some(Bson::DateTime(d)) => Ok(StoreTime::from_millis(d.timestamp_millis())),
            _ => Err(StoreError::backend(FaultKind::Permanent, "the server's hello reply has no localTime")),
        }
    }

    async fn get(&self, coll: &Collection, key: &Key) -> StoreResult<Snapshot> {
        let pipeline = vec![
            doc! { "$documents": [{ "now": { "$toLong": "$$NOW" } }] },
            doc! { "$lookup": { "from": coll.as_str(), "pipeline": [{ "$match": { fields::ID: key.as_bson().clone() } }], "as": "doc" } },
        ];
        let mut agg = self.db.aggregate(pipeline);
        if self.consistency == Consistency::Majority {
            agg = agg.read_concern(ReadConcern::majority());
        }
        let rows: Vec<Document> = agg.await.map_err(map_err)?.try_collect().await.map_err(map_err)?;
        let row = rows
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::backend(FaultKind::Permanent, "empty $documents result"))?;
        let now =
            row.get_i64("now").map_err(|_| StoreError::backend(FaultKind::Permanent, "no server time in reply"))?;
        let record = match row.get_array("doc").ok().and_then(|a| a.first()) {
            Some(Bson::Document(d)) => Some(Record::from_document(coll.as_str(), d.clone())?),
            _ => None,
        };
        Ok(Snapshot { record, now: StoreTime::from_millis(now) })
    }

    async fn write(&self, coll: &Collection, key: &Key, write: &Write) -> StoreResult<WriteOutcome> {
        write.validate()?;
        let nonce = write.stamp(&self.next_nonce());
        for _ in 0..4 {
            if let Some(outcome) = self.write_once(coll, key, write, &nonce).await.map_err(in_coll(coll))? {
                return Ok(outcome);
            }
        }
        // Still racing after four attempts: the document is being created and
        // deleted concurrently. Report it as a transient conflict.
        Err(StoreError::backend(FaultKind::Transient, format!("upsert of {key} in {coll} kept racing; try again")))
    }

    async fn delete(&self, coll: &Collection, key: &Key, condition: &Condition) -> StoreResult<DeleteOutcome> {
        condition.validate()?;
        let mut filter = doc! { fields::ID: key.as_bson().clone() };
        if *condition != Condition::Always {
            filter.insert("$expr", compile::condition(condition));
        }
        match self.coll(coll).find_one_and_delete(filter).await.map_err(map_err)? {
            Some(doc) => Ok(DeleteOutcome::Deleted(Record::from_document(coll.as_str(), doc)?)),
            None => Ok(DeleteOutcome::Rejected(self.get(coll, key).await?.record)),
        }
    }

    async fn claim(&self, coll: &Collection, claim: &Claim) -> StoreResult<Option<Record>> {
        claim.validate()?;
        let nonce = self.next_nonce();
        let collection = self.coll(coll);
        let mut op = collection
            .find_one_and_update(compile::filter(&claim.query), compile::update(None, &claim.mutation, &nonce))
            .return_document(ReturnDocument::After);
        if let Some(sort) = compile::sort(&claim.query) {
            op = op.sort(sort);
        }
        match op.await.map_err(map_err).map_err(in_coll(coll))? {
            Some(doc) => Ok(Some(Record::from_document(coll.as_str(), doc)?)),
            None => Ok(None),
        }
    }

    async fn insert_many(&self, coll: &Collection, docs: Vec<Document>) -> StoreResult<Vec<InsertOutcome>> {
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
                        return Err(map_err(e));
                    }
                    errs.iter().map(|w| w.index).collect()
                }
                _ => return Err(map_err(e)),
            },
        };
        Ok(keys
            .into_iter()
            .enumerate()
            .map(|(i, k)| if dups.contains(&i) { InsertOutcome::Duplicate(k) } else { InsertOutcome::Inserted(k) })
            .collect())
    }

    async fn find(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<Record>> {
        query.validate()?;
        let collection = self.coll(coll);
        let mut op = collection.find(compile::filter(query));
        if let Some(sort) = compile::sort(query) {
            op = op.sort(sort);
        }
        if let Some(n) = query.limit {
            op = op.limit(i64::from(n));
        }
        let docs: Vec<Document> = op.await.map_err(map_err)?.try_collect().await.map_err(map_err)?;
        docs.into_iter().map(|d| Record::from_document(coll.as_str(), d)).collect()
    }

    async fn count(&self, coll: &Collection, query: &Query) -> StoreResult<u64> {
        query.validate()?;
        self.coll(coll).count_documents(compile::filter(query)).await.map_err(map_err)
    }

    async fn watch(&self, coll: &Collection, key: Option<&Key>) -> StoreResult<ChangeStream> {
        let collection = self.db.collection::<Document>(coll.as_str());
        self.hub.subscribe(collection, key.cloned()).await
    }

    async fn ensure_indexes(&self, coll: &Collection, indexes: &[IndexSpec]) -> StoreResult<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        let (secret, shown) = redact_password("mongodb://user:s3cr%40t@host:27017/db").unwrap();
        assert_eq!(secret, "s3cr%40t");
        assert_eq!(shown, "mongodb://user:***@host:27017/db");
        assert!(redact_password("mongodb://host").is_none());
        assert_eq!(redact_error("bad uri mongodb://u:pw@h", "mongodb://u:pw@h"), "bad uri mongodb://u:***@h");
    }

    #[test]
    fn db_names() {
        assert!(check_db_name("coolproj").is_ok());
        for bad in ["", "a.b", "a b", "x".repeat(64).as_str()] {
            assert!(check_db_name(bad).is_err(), "{bad}");
        }
    }
}
