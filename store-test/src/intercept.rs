//! One store wrapper for tests that watch, hold back or change some calls to
//! a store, in place of a hand-written forwarder per test: [`Intercepted`]
//! forwards every call, and an [`Intercept`] overrides what it needs.

use std::sync::Arc;

use async_trait::async_trait;
use bson::Document;
use store_trait::{
    BatchOutcome, ChangeFilter, ChangeStream, Claim, Collection, Condition, DeleteOutcome, IndexSpec, InsertOutcome,
    Key, Query, Record, Snapshot, Store, StoreResult, StoreTime, Write, WriteOutcome,
};

/// One call to the store, as [`Intercept::before`] sees it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Call<'a> {
    /// [`Store::now`].
    Now,
    /// [`Store::get`].
    Get(&'a Key),
    /// [`Store::write`].
    Write(&'a Key, &'a Write),
    /// [`Store::write_many`].
    WriteMany(&'a [(Key, Write)]),
    /// [`Store::delete`].
    Delete(&'a Key, &'a Condition),
    /// [`Store::claim`].
    Claim(&'a Claim),
    /// [`Store::claim_many`], with its limit.
    ClaimMany(&'a Claim, usize),
    /// [`Store::insert_many`].
    InsertMany(&'a [Document]),
    /// [`Store::find`].
    Find(&'a Query),
    /// [`Store::find_each`].
    FindEach(&'a Query),
    /// [`Store::find_keys`].
    FindKeys(&'a Query),
    /// [`Store::distinct_strings`], with its field.
    DistinctStrings(&'a str, &'a Query),
    /// [`Store::count`].
    Count(&'a Query),
    /// [`Store::watch`].
    Watch(Option<&'a Key>),
    /// [`Store::watch_filtered`].
    WatchFiltered(&'a ChangeFilter),
    /// [`Store::ensure_indexes`].
    EnsureIndexes(&'a [IndexSpec]),
}

/// What an [`Intercepted`] store does with each call. Every method has a
/// default, so an interceptor writes only what it changes: [`Intercept::before`]
/// runs before every call (to count, delay, hold back or fail it), and each
/// store method, given the wrapped store, can be replaced whole (to change
/// what the store answers). The defaults run `before`, then the wrapped
/// store's method.
///
/// # Cancel safety
///
/// As the wrapped store's, plus whatever `before` waits for: dropped
/// half-way, a call held in `before` never reached the store.
#[async_trait]
#[allow(missing_docs)] // The store methods are the `Store` trait's, documented there.
pub trait Intercept<S: Store>: Send + Sync + std::fmt::Debug + 'static {
    /// Runs before `call` reaches the store (the collection is `None` for
    /// [`Store::now`]); an error is returned in its place.
    ///
    /// # Cancel safety
    ///
    /// Dropped half-way, the call never reaches the store.
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        let _ = (coll, call);
        Ok(())
    }

    async fn now(&self, inner: &S) -> StoreResult<StoreTime> {
        self.before(None, Call::Now).await?;
        inner.now().await
    }
    async fn get(&self, inner: &S, c: &Collection, k: &Key) -> StoreResult<Snapshot> {
        self.before(Some(c), Call::Get(k)).await?;
        inner.get(c, k).await
    }
    async fn write(&self, inner: &S, c: &Collection, k: &Key, w: &Write) -> StoreResult<WriteOutcome> {
        self.before(Some(c), Call::Write(k, w)).await?;
        inner.write(c, k, w).await
    }
    async fn write_many(&self, inner: &S, c: &Collection, w: &[(Key, Write)]) -> StoreResult<Vec<BatchOutcome>> {
        self.before(Some(c), Call::WriteMany(w)).await?;
        inner.write_many(c, w).await
    }
    async fn delete(&self, inner: &S, c: &Collection, k: &Key, cond: &Condition) -> StoreResult<DeleteOutcome> {
        self.before(Some(c), Call::Delete(k, cond)).await?;
        inner.delete(c, k, cond).await
    }
    async fn claim(&self, inner: &S, c: &Collection, claim: &Claim) -> StoreResult<Option<Record>> {
        self.before(Some(c), Call::Claim(claim)).await?;
        inner.claim(c, claim).await
    }
    async fn claim_many(&self, inner: &S, c: &Collection, claim: &Claim, limit: usize) -> StoreResult<Vec<Record>> {
        self.before(Some(c), Call::ClaimMany(claim, limit)).await?;
        inner.claim_many(c, claim, limit).await
    }
    async fn insert_many(&self, inner: &S, c: &Collection, docs: Vec<Document>) -> StoreResult<Vec<InsertOutcome>> {
        self.before(Some(c), Call::InsertMany(&docs)).await?;
        inner.insert_many(c, docs).await
    }
    async fn find(&self, inner: &S, c: &Collection, q: &Query) -> StoreResult<Vec<Record>> {
        self.before(Some(c), Call::Find(q)).await?;
        inner.find(c, q).await
    }
    async fn find_each(&self, inner: &S, c: &Collection, q: &Query) -> StoreResult<Vec<StoreResult<Record>>> {
        self.before(Some(c), Call::FindEach(q)).await?;
        inner.find_each(c, q).await
    }
    async fn find_keys(&self, inner: &S, c: &Collection, q: &Query) -> StoreResult<Vec<Key>> {
        self.before(Some(c), Call::FindKeys(q)).await?;
        inner.find_keys(c, q).await
    }
    async fn distinct_strings(&self, inner: &S, c: &Collection, field: &str, q: &Query) -> StoreResult<Vec<String>> {
        self.before(Some(c), Call::DistinctStrings(field, q)).await?;
        inner.distinct_strings(c, field, q).await
    }
    async fn count(&self, inner: &S, c: &Collection, q: &Query) -> StoreResult<u64> {
        self.before(Some(c), Call::Count(q)).await?;
        inner.count(c, q).await
    }
    async fn watch(&self, inner: &S, c: &Collection, k: Option<&Key>) -> StoreResult<ChangeStream> {
        self.before(Some(c), Call::Watch(k)).await?;
        inner.watch(c, k).await
    }
    async fn watch_filtered(&self, inner: &S, c: &Collection, f: &ChangeFilter) -> StoreResult<ChangeStream> {
        self.before(Some(c), Call::WatchFiltered(f)).await?;
        inner.watch_filtered(c, f).await
    }
    async fn ensure_indexes(&self, inner: &S, c: &Collection, i: &[IndexSpec]) -> StoreResult<()> {
        self.before(Some(c), Call::EnsureIndexes(i)).await?;
        inner.ensure_indexes(c, i).await
    }
}

/// A store that sends every call through its [`Intercept`] `I` to the
/// wrapped store `S`. Clones share the interceptor; the store derefs to it,
/// so a test reads its counters or arms its holds on the store it hands out.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use store_test::{Call, Intercept, Intercepted};
/// use store_trait::{Collection, Key, Store, StoreResult};
///
/// /// Counts the reads of single documents.
/// #[derive(Debug, Default)]
/// struct Gets(AtomicUsize);
///
/// #[async_trait::async_trait]
/// impl<S: Store> Intercept<S> for Gets {
///     async fn before(&self, _coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
///         if matches!(call, Call::Get(_)) {
///             self.0.fetch_add(1, Ordering::SeqCst);
///         }
///         Ok(())
///     }
/// }
///
/// let store: Intercepted<_, Gets> = Intercepted::new(store_memory::MemoryStore::new());
/// store.get(&Collection::new("c").unwrap(), &Key::new("k").unwrap()).await.unwrap();
/// assert_eq!(store.0.load(Ordering::SeqCst), 1);
/// # }
/// ```
#[derive(Debug)]
pub struct Intercepted<S, I> {
    inner: S,
    intercept: Arc<I>,
}

impl<S: Clone, I> Clone for Intercepted<S, I> {
    fn clone(&self) -> Self {
        Intercepted { inner: self.inner.clone(), intercept: self.intercept.clone() }
    }
}

impl<S, I: Default> Intercepted<S, I> {
    /// Wraps `inner` with a fresh `I`.
    pub fn new(inner: S) -> Self {
        Self::with(inner, I::default())
    }
}

impl<S, I> Intercepted<S, I> {
    /// Wraps `inner` with `intercept`.
    pub fn with(inner: S, intercept: I) -> Self {
        Intercepted { inner, intercept: Arc::new(intercept) }
    }

    /// The wrapped store, whose calls go past the interceptor.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S, I> std::ops::Deref for Intercepted<S, I> {
    type Target = I;
    fn deref(&self) -> &I {
        &self.intercept
    }
}

/// # Cancel safety
///
/// As [`Intercept`]'s.
#[async_trait]
impl<S: Store, I: Intercept<S>> Store for Intercepted<S, I> {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    async fn now(&self) -> StoreResult<StoreTime> {
        self.intercept.now(&self.inner).await
    }
    async fn get(&self, c: &Collection, k: &Key) -> StoreResult<Snapshot> {
        self.intercept.get(&self.inner, c, k).await
    }
    async fn write(&self, c: &Collection, k: &Key, w: &Write) -> StoreResult<WriteOutcome> {
        self.intercept.write(&self.inner, c, k, w).await
    }
    async fn write_many(&self, c: &Collection, w: &[(Key, Write)]) -> StoreResult<Vec<BatchOutcome>> {
        self.intercept.write_many(&self.inner, c, w).await
    }
    async fn delete(&self, c: &Collection, k: &Key, cond: &Condition) -> StoreResult<DeleteOutcome> {
        self.intercept.delete(&self.inner, c, k, cond).await
    }
    async fn claim(&self, c: &Collection, claim: &Claim) -> StoreResult<Option<Record>> {
        self.intercept.claim(&self.inner, c, claim).await
    }
    async fn claim_many(&self, c: &Collection, claim: &Claim, limit: usize) -> StoreResult<Vec<Record>> {
        self.intercept.claim_many(&self.inner, c, claim, limit).await
    }
    async fn insert_many(&self, c: &Collection, docs: Vec<Document>) -> StoreResult<Vec<InsertOutcome>> {
        self.intercept.insert_many(&self.inner, c, docs).await
    }
    async fn find(&self, c: &Collection, q: &Query) -> StoreResult<Vec<Record>> {
        self.intercept.find(&self.inner, c, q).await
    }
    async fn find_each(&self, c: &Collection, q: &Query) -> StoreResult<Vec<StoreResult<Record>>> {
        self.intercept.find_each(&self.inner, c, q).await
    }
    async fn find_keys(&self, c: &Collection, q: &Query) -> StoreResult<Vec<Key>> {
        self.intercept.find_keys(&self.inner, c, q).await
    }
    async fn distinct_strings(&self, c: &Collection, field: &str, q: &Query) -> StoreResult<Vec<String>> {
        self.intercept.distinct_strings(&self.inner, c, field, q).await
    }
    async fn count(&self, c: &Collection, q: &Query) -> StoreResult<u64> {
        self.intercept.count(&self.inner, c, q).await
    }
    async fn watch(&self, c: &Collection, k: Option<&Key>) -> StoreResult<ChangeStream> {
        self.intercept.watch(&self.inner, c, k).await
    }
    async fn watch_filtered(&self, c: &Collection, f: &ChangeFilter) -> StoreResult<ChangeStream> {
        self.intercept.watch_filtered(&self.inner, c, f).await
    }
    async fn ensure_indexes(&self, c: &Collection, i: &[IndexSpec]) -> StoreResult<()> {
        self.intercept.ensure_indexes(&self.inner, c, i).await
    }
}
