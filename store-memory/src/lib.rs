//! An in-memory [`Store`]: the same semantics as the MongoDB backend (it runs the
//! reference evaluator in [`store_trait::backend::semantics`]), deterministic under a paused
//! tokio runtime, cheap enough for property tests with tens of thousands of steps,
//! and with fault injection so upper crates can test their error paths.
//!
//! ```
//! use store_memory::MemoryStore;
//! use store_trait::{Collection, Condition, Key, Mutation, Store, Ttl, Write};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), store_trait::StoreError> {
//! let store = MemoryStore::new();
//! let (locks, key) = (Collection::new("locks")?, Key::new("job")?);
//! let ttl = Ttl::new(Duration::from_secs(5))?;
//! let take = |who: &str| Write::new(Condition::Free, Mutation::new().grant(who, ttl).bump_fence()).upsert();
//! assert!(store.write(&locks, &key, &take("a")).await?.is_applied());
//! assert!(!store.write(&locks, &key, &take("b")).await?.is_applied());
//!
//! // Make the next operation fail with a transient error, without applying it.
//! store.faults().fail_next(1);
//! assert!(store.write(&locks, &key, &take("a")).await.unwrap_err().is_retryable());
//! # Ok(()) }
//! ```
//!
//! # Cancel safety
//!
//! An operation applies its change in one step, with no await point in it,
//! after its injected latency ([`Faults::set_latency`]) if any. Dropped
//! before that step, it has no effect; otherwise it has completed. So a
//! dropped write was applied entirely or not at all, and its caller cannot
//! tell which: the same doubt as on MongoDB, where it is also applied or not
//! on the server after the caller stopped waiting.

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bson::{Bson, Document};
use futures::StreamExt;
use store_trait::{
    backend::{prepare_inserts, semantics, ChangeDetail},
    fields, ChangeEvent, ChangeFilter, ChangeKind, ChangeStream, Claim, Clock, Collection, Condition, DeleteOutcome,
    FaultKind, IndexSpec, InsertOutcome, Key, Query, Record, Snapshot, Store, StoreError, StoreResult, StoreTime,
    TokioClock, Write, WriteOutcome,
};

mod batch;
mod faults;
mod state;

use state::{diff, map_key, to_record, Entry, State};

pub use faults::Faults;

/// The in-memory store. Clones share the same data.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    clock: Arc<dyn Clock>,
    change_streams: bool,
    state: Mutex<State>,
    faults: Faults,
    ops: AtomicU64,
    nonce: AtomicU64,
}

/// Builds a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryStoreBuilder {
    clock: Option<Arc<dyn Clock>>,
    change_streams: bool,
}

impl MemoryStoreBuilder {
    /// The store's clock (default: a [`TokioClock`] starting at the system time).
    ///
    /// Give it a test clock (`store_test::TestClock`, keeping a clone) to step the store
    /// clock forward or back, or run it fast or slow, as a server's clock can:
    /// leases are granted and checked on this clock, so they lapse early, late or
    /// come back with it, while tokio time (the clients' monotonic clock) goes on
    /// as before.
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Whether [`Store::watch`] works (default `true`). Turn it off to test the
    /// polling fallback of the crates above, as on a standalone `mongod`.
    #[must_use]
    pub fn change_streams(mut self, on: bool) -> Self {
        self.change_streams = on;
        self
    }

    /// Builds the store. Call it inside a tokio runtime when using the default clock.
    pub fn build(self) -> MemoryStore {
        let clock = self.clock.unwrap_or_else(|| Arc::new(TokioClock::from_system_with_offset(0)));
        MemoryStore {
            inner: Arc::new(Inner {
                clock,
                change_streams: self.change_streams,
                state: Mutex::new(State::default()),
                faults: Faults::default(),
                ops: AtomicU64::new(0),
                nonce: AtomicU64::new(0),
            }),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A stream of the collection's changes that `wanted` keeps (resyncs always).
    async fn subscribe(
        &self,
        coll: &Collection,
        wanted: impl Fn(&ChangeEvent, &ChangeDetail) -> bool + Send + 'static,
    ) -> StoreResult<ChangeStream> {
        if !self.inner.change_streams {
            return Err(StoreError::Unsupported {
                feature: "change streams",
                reason: "disabled on this memory store".into(),
            });
        }
        // Subscribe before returning, so no change after this call is missed.
        let rx = self.op(|state, _| Ok(state.coll(coll).events.subscribe())).await?;
        let mut reset = self.inner.faults.streams.subscribe();
        let stream = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(move |item| {
            let out = match item {
                Ok((ev, detail)) if wanted(&ev, &detail) => Some(Ok(ev)),
                Ok(_) => None,
                Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(_)) => {
                    Some(Ok(ChangeEvent { key: None, kind: ChangeKind::Resync }))
                }
            };
            futures::future::ready(out)
        });
        Ok(Box::pin(stream.take_until(async move {
            let _ = reset.changed().await;
        })))
    }
    /// A store with the default clock and change notifications. Call it inside a
    /// tokio runtime.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder { clock: None, change_streams: true }
    }

    /// Fault injection.
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// How many operations were attempted (including failed ones).
    pub fn operation_count(&self) -> u64 {
        self.inner.ops.load(AtomicOrdering::SeqCst)
    }

    /// Deletes documents whose TTL-indexed date is past, as MongoDB's TTL monitor
    /// does (about once a minute there). Returns how many were deleted.
    pub fn prune_ttl(&self) -> usize {
        let now = self.inner.clock.now().as_millis();
        let mut state = self.lock();
        let mut removed = 0;
        for coll in state.collections.values_mut() {
            let ttl: Vec<(String, i64)> = coll
                .indexes
                .iter()
                .filter_map(|i| {
                    i.expire_after.map(|d| (i.keys[0].0.clone(), i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
                })
                .collect();
            let expired: Vec<String> = coll
                .docs
                .iter()
                .filter(|(_, e)| {
                    ttl.iter().any(|(f, after)| {
                        matches!(e.doc.get(f), Some(Bson::DateTime(d)) if d.timestamp_millis().saturating_add(*after) <= now)
                    })
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in expired {
                if let Some(e) = coll.docs.remove(&k) {
                    removed += 1;
                    let key = e.doc.get(fields::ID).cloned().and_then(|b| Key::from_bson(b).ok());
                    coll.notify(key, ChangeDetail::Delete);
                }
            }
        }
        removed
    }

    /// Inserts `doc` exactly as given, past every check of the contract, as
    /// another program can on MongoDB (a UUID `_id`, a string `fence`): what the
    /// conformance suite needs to show that such documents never stop a claim.
    /// Replaces a document with the same `_id`. Not counted as an operation.
    pub fn insert_raw(&self, coll: &Collection, doc: Document) {
        let mk = match doc.get(fields::ID) {
            Some(id) => match Key::from_bson(id.clone()) {
                Ok(k) => map_key(&k),
                Err(_) => format!("r:{id:?}"),
            },
            None => format!("r:none:{}", self.next_nonce()),
        };
        let mut state = self.lock();
        state.seq += 1;
        let seq = state.seq;
        state.coll(coll).docs.insert(mk, Entry { seq, doc });
    }

    /// Reads a record without fault injection or counting, for test invariants.
    pub fn peek(&self, coll: &Collection, key: &Key) -> StoreResult<Snapshot> {
        let now = self.inner.clock.now();
        let state = self.lock();
        let record = match state.collections.get(coll.as_str()).and_then(|c| c.docs.get(&map_key(key))) {
            Some(e) => Some(to_record(coll.as_str(), &e.doc)?),
            None => None,
        };
        Ok(Snapshot { record, now })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied write: every
        // operation computes its result before mutating. So a poisoned lock is safe
        // to keep using.
        self.inner.state.lock()
    }

    fn next_nonce(&self) -> String {
        format!("mem-{}", self.inner.nonce.fetch_add(1, AtomicOrdering::SeqCst))
    }

    /// Runs one operation with fault injection around it.
    async fn op<T>(&self, f: impl FnOnce(&mut State, StoreTime) -> StoreResult<T>) -> StoreResult<T> {
        self.inner.ops.fetch_add(1, AtomicOrdering::SeqCst);
        let faults = &self.inner.faults;
        let latency = faults.latency_ms.load(AtomicOrdering::SeqCst);
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        if faults.unreachable.load(AtomicOrdering::SeqCst) {
            return Err(StoreError::backend(FaultKind::Unreachable, "injected: store unreachable"));
        }
        if Faults::take(&faults.fail_before) {
            return Err(StoreError::backend(FaultKind::Transient, "injected: failed before apply"));
        }
        let now = self.inner.clock.now();
        let out = {
            let mut state = self.lock();
            f(&mut state, now)?
        };
        if Faults::take(&faults.fail_after) {
            return Err(StoreError::backend(FaultKind::Transient, "injected: failed after apply"));
        }
        Ok(out)
    }
}

/// # Cancel safety
///
/// Reads and `watch` are cancel-safe. A write dropped half-way was applied
/// entirely or not at all (see the crate docs).
#[async_trait]
impl Store for MemoryStore {
    fn backend_name(&self) -> &'static str {
        "memory"
    }

    async fn now(&self) -> StoreResult<StoreTime> {
        self.op(|_, now| Ok(now)).await
    }

    async fn get(&self, coll: &Collection, key: &Key) -> StoreResult<Snapshot> {
        self.op(|_, _| Ok(())).await?;
        self.peek(coll, key)
    }

    async fn write(&self, coll: &Collection, key: &Key, write: &Write) -> StoreResult<WriteOutcome> {
        write.validate()?;
        let nonce = self.next_nonce();
        self.op(|state, now| {
            state.seq += 1;
            let seq = state.seq;
            let c = state.coll(coll);
            let mk = map_key(key);
            let existing = c.docs.get(&mk);
            let current = existing.map(|e| e.doc.clone());
            if !semantics::eval(&write.condition, current.as_ref(), now) || (existing.is_none() && !write.upsert) {
                let rec = match &current {
                    Some(d) => Some(to_record(coll.as_str(), d)?),
                    None => None,
                };
                return Ok(WriteOutcome::Rejected(rec));
            }
            let doc = semantics::apply(current.as_ref(), key, &write.mutation, now, &write.stamp(&nonce))?;
            c.check_unique(coll.as_str(), &mk, &doc)?;
            let record = to_record(coll.as_str(), &doc)?;
            let seq = existing.map_or(seq, |e| e.seq);
            let detail = match &current {
                Some(before) => diff(before, &doc),
                None => ChangeDetail::Insert,
            };
            c.docs.insert(mk, Entry { seq, doc });
            c.notify(Some(key.clone()), detail);
            Ok(WriteOutcome::Applied(record))
        })
        .await
    }

    async fn delete(&self, coll: &Collection, key: &Key, condition: &Condition) -> StoreResult<DeleteOutcome> {
        condition.validate()?;
        self.op(|state, now| {
            let c = state.coll(coll);
            let mk = map_key(key);
            let Some(e) = c.docs.get(&mk) else { return Ok(DeleteOutcome::Rejected(None)) };
            let record = to_record(coll.as_str(), &e.doc)?;
            if !semantics::eval(condition, Some(&e.doc), now) {
                return Ok(DeleteOutcome::Rejected(Some(record)));
            }
            c.docs.remove(&mk);
            c.notify(Some(key.clone()), ChangeDetail::Delete);
            Ok(DeleteOutcome::Deleted(record))
        })
        .await
    }

    async fn claim(&self, coll: &Collection, claim: &Claim) -> StoreResult<Option<Record>> {
        claim.validate()?;
        let nonce = self.next_nonce();
        self.op(|state, now| {
            let c = state.coll(coll);
            let q = Query { limit: None, ..claim.query.clone() };
            // A document the store cannot read (another program's) never matches a
            // claim: it would be handed out and then fail to parse.
            let found = c.select(&q, now).into_iter().find(|e| semantics::readable(&e.doc)).cloned();
            let Some(entry) = found else { return Ok(None) };
            let key = to_record(coll.as_str(), &entry.doc)?.key().clone();
            let doc = semantics::apply(Some(&entry.doc), &key, &claim.mutation, now, &nonce)?;
            let mk = map_key(&key);
            c.check_unique(coll.as_str(), &mk, &doc)?;
            let record = to_record(coll.as_str(), &doc)?;
            let detail = diff(&entry.doc, &doc);
            c.docs.insert(mk, Entry { seq: entry.seq, doc });
            c.notify(Some(key), detail);
            Ok(Some(record))
        })
        .await
    }

    async fn claim_many(&self, coll: &Collection, claim: &Claim, limit: usize) -> StoreResult<Vec<Record>> {
        self.claim_many_op(coll, claim, limit).await
    }

    async fn insert_many(&self, coll: &Collection, docs: Vec<Document>) -> StoreResult<Vec<InsertOutcome>> {
        let prepared = prepare_inserts(docs)?;
        self.op(|state, _| {
            let mut out = Vec::with_capacity(prepared.len());
            for (key, doc) in prepared {
                state.seq += 1;
                let seq = state.seq;
                let c = state.coll(coll);
                let mk = map_key(&key);
                if c.docs.contains_key(&mk) || c.check_unique(coll.as_str(), &mk, &doc).is_err() {
                    out.push(InsertOutcome::Duplicate(key));
                    continue;
                }
                c.docs.insert(mk, Entry { seq, doc });
                c.notify(Some(key.clone()), ChangeDetail::Insert);
                out.push(InsertOutcome::Inserted(key));
            }
            Ok(out)
        })
        .await
    }

    async fn find(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<Record>> {
        query.validate()?;
        self.op(|state, now| match state.collections.get(coll.as_str()) {
            Some(c) => c.select(query, now).into_iter().map(|e| to_record(coll.as_str(), &e.doc)).collect(),
            None => Ok(Vec::new()),
        })
        .await
    }

    async fn find_each(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<StoreResult<Record>>> {
        query.validate()?;
        self.op(|state, now| match state.collections.get(coll.as_str()) {
            Some(c) => Ok(c.select(query, now).into_iter().map(|e| to_record(coll.as_str(), &e.doc)).collect()),
            None => Ok(Vec::new()),
        })
        .await
    }

    async fn count(&self, coll: &Collection, query: &Query) -> StoreResult<u64> {
        query.validate()?;
        let q = Query { limit: None, sort: Vec::new(), ..query.clone() };
        self.op(|state, now| Ok(state.collections.get(coll.as_str()).map_or(0, |c| c.select(&q, now).len() as u64)))
            .await
    }

    async fn watch(&self, coll: &Collection, key: Option<&Key>) -> StoreResult<ChangeStream> {
        let want = key.cloned();
        self.subscribe(coll, move |ev, _| want.is_none() || ev.key == want).await
    }

    async fn watch_filtered(&self, coll: &Collection, filter: &ChangeFilter) -> StoreResult<ChangeStream> {
        filter.validate()?;
        let filter = filter.clone();
        self.subscribe(coll, move |_, detail| semantics::change_admitted(&filter, detail)).await
    }

    async fn ensure_indexes(&self, coll: &Collection, indexes: &[IndexSpec]) -> StoreResult<()> {
        for i in indexes {
            i.validate()?;
        }
        self.op(|state, _| {
            let c = state.coll(coll);
            for idx in indexes {
                match c.indexes.iter().find(|i| i.name == idx.name) {
                    Some(existing) if existing != idx => {
                        return Err(StoreError::invalid("index", format!("{} exists with other options", idx.name)))
                    }
                    Some(_) => {}
                    None => c.indexes.push(idx.clone()),
                }
            }
            Ok(())
        })
        .await
    }
}
