//! The store contract of mongocoord: named collections of documents keyed by id,
//! changed by **atomic conditional writes measured on the store's own clock**.
//!
//! Locks, elections and task queues are all built from these few operations, and
//! each one is exactly one round trip on MongoDB:
//!
//! | operation | what it is for |
//! |---|---|
//! | [`Store::get`] | read a record and the store's current time |
//! | [`Store::write`] | "if absent, or its lease lapsed, or I own it: grant me the lease until now + ttl and bump the fence" — returns the new record, or the current one when the condition fails |
//! | [`Store::delete`] | conditional delete |
//! | [`Store::claim`] | find the first matching document in a given order and change it, atomically (a task queue's claim) |
//! | [`Store::insert_many`] | idempotent inserts, duplicates reported per document |
//! | [`Store::find`] / [`Store::find_each`] / [`Store::count`] | read-only queries |
//! | [`Store::watch`] / [`Store::watch_filtered`] | change notifications (all, or those a [`ChangeFilter`] admits, filtered on the server), or [`StoreError::Unsupported`] so callers poll |
//! | [`Store::ensure_indexes`] | indexes the caller needs |
//!
//! ```
//! use store_trait::{Collection, Condition, Key, Mutation, Store, StoreResult, Ttl, Write, WriteOutcome};
//! use std::time::Duration;
//!
//! /// Try once to take a lease; `Ok(Some(fence))` when we got it.
//! async fn try_lock(store: &impl Store, me: &str) -> StoreResult<Option<u64>> {
//!     let coll = Collection::new("locks")?;
//!     let key = Key::new("nightly-report")?;
//!     let ttl = Ttl::new(Duration::from_secs(15))?;
//!     let write = Write::new(
//!         Condition::Free.or(Condition::HeldBy(me.into())),
//!         Mutation::new().grant(me, ttl).bump_fence(),
//!     )
//!     .upsert();
//!     Ok(match store.write(&coll, &key, &write).await? {
//!         WriteOutcome::Applied(record) => Some(record.fence()),
//!         WriteOutcome::Rejected(_current_holder) => None,
//!     })
//! }
//! ```
//!
//! Backends: `store-memory` (deterministic under paused tokio time, fault
//! injection) and `store-mongo`. The crate root is the contract alone; beside it:
//!
//! - [`helpers`]: what is built on the contract for its users ([`helpers::Watcher`]),
//!   and the figures it emits through the `metrics` facade ([`helpers::metrics`]);
//! - `backend`: for implementors of [`Store`] (the reference semantics, shared
//!   input checks), **unstable** and hidden from these docs: it changes with
//!   the backends, and users of a store never need it.
//!
//! The conformance suite every backend runs in full, and the test clock, live
//! in the unpublished `store-test` crate.
//!
//! # Cancel safety
//!
//! Dropping a [`Store`] future half-way leaves a **read** without effect, but a
//! **write** (`write`, `delete`, `claim`, `insert_many`, `ensure_indexes`) in
//! doubt: it may or may not have been applied, as after an ambiguous error
//! ([`StoreError::is_ambiguous`]). Each method says which it is. Callers that
//! bound a write by a deadline therefore run it on its own task and keep its
//! late result, instead of dropping it (`mongolock`'s `on_own_task`).

#[doc(hidden)]
pub mod backend;
mod error;
pub mod helpers;
mod key;
mod ops;
mod record;
mod time;

use std::sync::Arc;

pub use bson;

pub use error::{FaultKind, StoreError, StoreResult};
pub use key::{check_field_name, Collection, Key};
pub use ops::{
    BatchOutcome, ChangeEvent, ChangeFilter, ChangeKind, ChangeStream, Claim, Condition, DeleteOutcome, IndexSpec,
    InsertOutcome, LeaseOp, Mutation, Nonce, Order, Query, UpdateClause, Write, WriteOutcome,
};
pub use record::{fields, render_raw_id, Lease, Record, Snapshot, MAX_COUNTER};
pub use time::{Clock, StoreTime, SystemClock, TokioClock, Ttl};

use bson::Document;

/// The contract every backend implements.
///
/// Every method is one atomic operation on the store. Conditions are evaluated and
/// leases stamped on the store's clock. Inputs are validated before anything is
/// sent and rejected with [`StoreError::InvalidInput`].
///
/// A transient error leaves the outcome unknown: the write may or may not have
/// been applied (see [`StoreError::is_ambiguous`]). Callers that must know send
/// the same write again with the same nonce ([`Write::with_nonce`]) and ask the
/// outcome whether an earlier attempt was applied ([`WriteOutcome::applied_with`]);
/// "the lease is gone and the fence is mine" is no proof, since someone else may
/// have released it in between.
#[async_trait::async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// A short name for logs and reports (`"memory"`, `"mongodb"`).
    fn backend_name(&self) -> &'static str;

    /// The store's current time.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read; dropping the future changes nothing.
    async fn now(&self) -> StoreResult<StoreTime>;

    /// Reads one record together with the store's current time.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read; dropping the future changes nothing.
    async fn get(&self, coll: &Collection, key: &Key) -> StoreResult<Snapshot>;

    /// Applies `write.mutation` if `write.condition` holds on the current document,
    /// creating it first when `write.upsert` is set and it does not exist.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped half-way, the write may or may not have been
    /// applied (a backend that sent it to a server cannot call it back), as
    /// after an ambiguous error. Send it again with the same nonce
    /// ([`Write::with_nonce`]) to learn which, or run the call on its own task
    /// and keep its result.
    async fn write(&self, coll: &Collection, key: &Key, write: &Write) -> StoreResult<WriteOutcome>;

    /// Deletes the document if `condition` holds.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped half-way, the document may or may not have
    /// been deleted, as after an ambiguous error; [`Store::get`] tells.
    async fn delete(&self, coll: &Collection, key: &Key, condition: &Condition) -> StoreResult<DeleteOutcome>;

    /// Applies `claim.mutation` to the first document matching `claim.query` (in its
    /// sort order); `None` when no document matches. A document that cannot be read
    /// as a [`Record`] (an `_id` that is no [`Key`], a reserved field of the wrong
    /// type: another program's) never matches, so a claim never hands out, nor
    /// changes, a document it cannot read ([`Record::from_document`] would fail;
    /// the reference rule is `backend::semantics::readable`).
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped half-way, a document may have been claimed
    /// without the caller learning which. It stays under the lease the claim
    /// granted, which lapses unless renewed, so a queue recovers it as it does
    /// a crashed claimer's.
    async fn claim(&self, coll: &Collection, claim: &Claim) -> StoreResult<Option<Record>>;

    /// Claims up to `limit` documents matching `claim.query`, in its order: each
    /// gets `claim.mutation` (its own fence bumped, if the mutation bumps it),
    /// the condition evaluated on each document as it is changed, so no document
    /// is claimed by two calls at once. Returns the records this call changed,
    /// in the query's order. Unreadable documents never match, as for
    /// [`Store::claim`].
    ///
    /// A batch, not one atomic operation: on MongoDB it is three commands, a
    /// `find` of candidates (four times `limit`, read as [`Store::find_keys`]
    /// reads them; none when the query names at most `limit` keys,
    /// [`Query::keys`]), one conditional `update` of
    /// the first `limit` of those still matching, and a read back of those this
    /// call changed (by its nonce), whatever `limit` is; plus one `update` of
    /// the next candidates each time concurrent callers took some first, so a
    /// batch comes back short only when fewer documents are claimable, not
    /// because it lost a race. If the call fails after an update (a lost reply, a crash),
    /// the documents it changed stay leased to the mutation's owner, whom no one
    /// holds: they lapse at the lease's end and are claimed again with a higher
    /// fence. So the mutation must grant a lease and bump the fence
    /// ([`StoreError::InvalidInput`] otherwise). The default claims one at a
    /// time with [`Store::claim`].
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped half-way, some documents may have been claimed
    /// without the caller learning which, as when the call fails after an
    /// update. They stay under the lease the mutation granted, which lapses
    /// unless renewed, and are claimed again with a higher fence.
    async fn claim_many(&self, coll: &Collection, claim: &Claim, limit: usize) -> StoreResult<Vec<Record>> {
        claim.validate_batch()?;
        let mut out = Vec::new();
        while out.len() < limit {
            match self.claim(coll, claim).await? {
                Some(r) => out.push(r),
                None => break,
            }
        }
        Ok(out)
    }

    /// Applies several conditional writes, each to its own document, as
    /// [`Store::write`] would one by one: each condition evaluated and each
    /// mutation applied atomically on its own document, and one outcome per
    /// write, in order. Upserts are allowed. On MongoDB it is one `update`
    /// command with one statement per write (each filtered by its own
    /// condition), plus one `find` reading the rejected ones back when fewer
    /// documents changed than were written: a group commit of fenced outcome
    /// writes. The default calls [`Store::write`] for each.
    ///
    /// A batch, not one atomic operation: an error leaves each write in doubt
    /// on its own. Retrying the same writes with the same nonces
    /// ([`Write::with_nonce`]) tells the earlier attempts apart: a write
    /// rejected now whose document's last nonce is its own was applied by an
    /// earlier attempt.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped half-way, any of the writes may or may not
    /// have been applied, as after an error.
    async fn write_many(&self, coll: &Collection, writes: &[(Key, Write)]) -> StoreResult<Vec<BatchOutcome>> {
        let mut out = Vec::with_capacity(writes.len());
        for (key, write) in writes {
            out.push(self.write(coll, key, write).await?.into());
        }
        Ok(out)
    }

    /// Inserts documents (each gets rev 1 and fence 0; a missing `_id` gets a fresh
    /// `ObjectId`). Duplicates are reported per document; the others are inserted.
    /// Documents must not carry reserved fields other than `_id`.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped half-way, some or all of the documents may have
    /// been inserted. Inserting the same documents (with their `_id`s) again
    /// reports those as duplicates and inserts the rest.
    async fn insert_many(&self, coll: &Collection, docs: Vec<Document>) -> StoreResult<Vec<InsertOutcome>>;

    /// Documents matching `query`, in its order. Fails with
    /// [`StoreError::Malformed`] (naming the document) when one of them cannot be
    /// read; [`Store::find_each`] reads the others.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read; dropping the future changes nothing.
    async fn find(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<Record>>;

    /// Documents matching `query`, in its order, each read on its own: one that
    /// cannot be read as a record is an `Err(`[`StoreError::Malformed`]`)` in its
    /// place, naming its raw `_id`, and the others are still returned. For views
    /// that list what they can and report what they skipped.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read; dropping the future changes nothing.
    async fn find_each(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<StoreResult<Record>>>;

    /// The keys of the readable documents matching `query`, in its order, up to
    /// its limit: how a claimer reads the candidates it then claims by key
    /// ([`Query::keys`]). Documents a claim would pass over as unreadable are
    /// left out. On MongoDB one `find` projected to the fields readability
    /// depends on, so large documents cost nothing to list (a second one only
    /// when more than a few unreadable documents stand before the limit). The
    /// default reads every matching record with
    /// [`Store::find_each`] (the limit counts readable documents, which only
    /// the records tell) and keeps their keys: right, but a backend whose
    /// queues grow long should override it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read; dropping the future changes nothing.
    async fn find_keys(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<Key>> {
        // The limit counts readable documents only.
        let all = Query { limit: None, ..query.clone() };
        let found = self.find_each(coll, &all).await?.into_iter().filter_map(Result::ok);
        let limit = query.limit.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        Ok(found.take(limit).map(|r| r.key().clone()).collect())
    }

    /// The distinct string values of the user field `field` over the
    /// readable documents matching `query` (sort and limit ignored), sorted:
    /// how an operator view lists a queue's agent names without reading its
    /// tasks. On MongoDB one `distinct` command, served by an index that
    /// leads with `field`. The default reads every matching record with
    /// [`Store::find_each`]: right, but a backend whose collections grow
    /// long should override it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read; dropping the future changes nothing.
    async fn distinct_strings(&self, coll: &Collection, field: &str, query: &Query) -> StoreResult<Vec<String>> {
        check_field_name(field)?;
        let found = self.find_each(coll, &Query { limit: None, sort: Vec::new(), ..query.clone() }).await?;
        let mut out: Vec<String> =
            found.into_iter().filter_map(Result::ok).filter_map(|r| r.get_str(field).map(str::to_owned)).collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// How many documents match `query` (sort and limit ignored).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read; dropping the future changes nothing.
    async fn count(&self, coll: &Collection, query: &Query) -> StoreResult<u64>;

    /// Change notifications for the collection, or for one key. Subscribe
    /// **before** reading the state you wait on, so no change falls between.
    /// [`StoreError::Unsupported`] when the backend cannot (a standalone `mongod`).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future drops the subscription being made.
    async fn watch(&self, coll: &Collection, key: Option<&Key>) -> StoreResult<ChangeStream>;

    /// Change notifications for the collection, only those `filter` delivers
    /// (and resyncs), decided on the backend's side: on MongoDB a `$match`
    /// stage, so the others never leave the server. Like [`Store::watch`]
    /// otherwise. Both backends filter, and the conformance suite checks it
    /// (`watch_filtered_delivers_what_it_admits`). The default implementation,
    /// for wrappers that do not forward it, delivers every change: the
    /// notifications are hints to re-read, so more of them costs wake-ups,
    /// never correctness.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future drops the subscription being made.
    async fn watch_filtered(&self, coll: &Collection, filter: &ChangeFilter) -> StoreResult<ChangeStream> {
        filter.validate()?;
        self.watch(coll, None).await
    }

    /// Creates the indexes if missing (idempotent).
    ///
    /// # Cancel safety
    ///
    /// Dropped half-way, the indexes may or may not have been created (or be
    /// still building on the server); calling again is harmless.
    async fn ensure_indexes(&self, coll: &Collection, indexes: &[IndexSpec]) -> StoreResult<()>;
}

macro_rules! forward_store {
    ($($ty:tt)*) => {
        #[async_trait::async_trait]
        impl<S: Store + ?Sized> Store for $($ty)*<S> {
            fn backend_name(&self) -> &'static str {
                (**self).backend_name()
            }
            async fn now(&self) -> StoreResult<StoreTime> {
                (**self).now().await
            }
            async fn get(&self, coll: &Collection, key: &Key) -> StoreResult<Snapshot> {
                (**self).get(coll, key).await
            }
            async fn write(&self, coll: &Collection, key: &Key, write: &Write) -> StoreResult<WriteOutcome> {
                (**self).write(coll, key, write).await
            }
            async fn delete(&self, coll: &Collection, key: &Key, condition: &Condition) -> StoreResult<DeleteOutcome> {
                (**self).delete(coll, key, condition).await
            }
            async fn claim(&self, coll: &Collection, claim: &Claim) -> StoreResult<Option<Record>> {
                (**self).claim(coll, claim).await
            }
            async fn claim_many(&self, coll: &Collection, claim: &Claim, limit: usize) -> StoreResult<Vec<Record>> {
                (**self).claim_many(coll, claim, limit).await
            }
            async fn write_many(&self, coll: &Collection, writes: &[(Key, Write)]) -> StoreResult<Vec<BatchOutcome>> {
                (**self).write_many(coll, writes).await
            }
            async fn insert_many(&self, coll: &Collection, docs: Vec<Document>) -> StoreResult<Vec<InsertOutcome>> {
                (**self).insert_many(coll, docs).await
            }
            async fn find(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<Record>> {
                (**self).find(coll, query).await
            }
            async fn find_each(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<StoreResult<Record>>> {
                (**self).find_each(coll, query).await
            }
            async fn find_keys(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<Key>> {
                (**self).find_keys(coll, query).await
            }
            async fn distinct_strings(&self, coll: &Collection, field: &str, query: &Query) -> StoreResult<Vec<String>> {
                (**self).distinct_strings(coll, field, query).await
            }
            async fn count(&self, coll: &Collection, query: &Query) -> StoreResult<u64> {
                (**self).count(coll, query).await
            }
            async fn watch(&self, coll: &Collection, key: Option<&Key>) -> StoreResult<ChangeStream> {
                (**self).watch(coll, key).await
            }
            async fn watch_filtered(&self, coll: &Collection, filter: &ChangeFilter) -> StoreResult<ChangeStream> {
                (**self).watch_filtered(coll, filter).await
            }
            async fn ensure_indexes(&self, coll: &Collection, indexes: &[IndexSpec]) -> StoreResult<()> {
                (**self).ensure_indexes(coll, indexes).await
            }
        }
    };
}

forward_store!(Arc);
forward_store!(Box);
