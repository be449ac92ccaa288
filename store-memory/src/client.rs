//! One client's view of a shared store, with its own partition switch.

use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;

use async_trait::async_trait;
use bson::Document;
use store_trait::{
    ChangeFilter, ChangeStream, Claim, Collection, Condition, DeleteOutcome, FaultKind, IndexSpec, InsertOutcome, Key,
    Query, Record, Snapshot, Store, StoreError, StoreResult, StoreTime, Write, WriteOutcome,
};

use crate::MemoryStore;

/// One client's connection to a shared [`MemoryStore`], which a test can cut off
/// (a network partition, or a paused or dead process) while other clients go on.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use store_trait::Store;
/// let store = store_memory::MemoryStore::new();
/// let a = store.client();
/// a.set_partitioned(true);
/// assert!(a.now().await.unwrap_err().is_retryable());
/// assert!(store.now().await.is_ok(), "others still reach the store");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    store: MemoryStore,
    cut: Arc<std::sync::atomic::AtomicBool>,
}

impl MemoryStore {
    /// A new client view of this store, with its own partition switch.
    pub fn client(&self) -> Client {
        Client { store: self.clone(), cut: Arc::default() }
    }
}

impl Client {
    /// Cuts this client off from the store (every operation fails as
    /// [`FaultKind::Unreachable`]) or reconnects it.
    pub fn set_partitioned(&self, cut: bool) {
        self.cut.store(cut, AtomicOrdering::SeqCst);
    }

    /// The shared store.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    fn check(&self) -> StoreResult<()> {
        if self.cut.load(AtomicOrdering::SeqCst) {
            return Err(StoreError::backend(FaultKind::Unreachable, "injected: client partitioned"));
        }
        Ok(())
    }
}

/// # Cancel safety
///
/// As the [`MemoryStore`](crate::MemoryStore)'s: each call checks the
/// partition switch without waiting, then runs the store's operation.
#[async_trait]
impl Store for Client {
    fn backend_name(&self) -> &'static str {
        "memory"
    }
    async fn now(&self) -> StoreResult<StoreTime> {
        self.check()?;
        self.store.now().await
    }
    async fn get(&self, c: &Collection, k: &Key) -> StoreResult<Snapshot> {
        self.check()?;
        self.store.get(c, k).await
    }
    async fn write(&self, c: &Collection, k: &Key, w: &Write) -> StoreResult<WriteOutcome> {
        self.check()?;
        self.store.write(c, k, w).await
    }
    async fn delete(&self, c: &Collection, k: &Key, cond: &Condition) -> StoreResult<DeleteOutcome> {
        self.check()?;
        self.store.delete(c, k, cond).await
    }
    async fn claim(&self, c: &Collection, claim: &Claim) -> StoreResult<Option<Record>> {
        self.check()?;
        self.store.claim(c, claim).await
    }
    async fn claim_many(&self, c: &Collection, claim: &Claim, limit: usize) -> StoreResult<Vec<Record>> {
        self.check()?;
        self.store.claim_many(c, claim, limit).await
    }
    async fn insert_many(&self, c: &Collection, docs: Vec<Document>) -> StoreResult<Vec<InsertOutcome>> {
        self.check()?;
        self.store.insert_many(c, docs).await
    }
    async fn find(&self, c: &Collection, q: &Query) -> StoreResult<Vec<Record>> {
        self.check()?;
        self.store.find(c, q).await
    }
    async fn find_each(&self, c: &Collection, q: &Query) -> StoreResult<Vec<StoreResult<Record>>> {
        self.check()?;
        self.store.find_each(c, q).await
    }
    async fn find_keys(&self, c: &Collection, q: &Query) -> StoreResult<Vec<Key>> {
        self.check()?;
        self.store.find_keys(c, q).await
    }
    async fn count(&self, c: &Collection, q: &Query) -> StoreResult<u64> {
        self.check()?;
        self.store.count(c, q).await
    }
    async fn watch(&self, c: &Collection, k: Option<&Key>) -> StoreResult<ChangeStream> {
        self.check()?;
        self.store.watch(c, k).await
    }
    async fn watch_filtered(&self, c: &Collection, f: &ChangeFilter) -> StoreResult<ChangeStream> {
        self.check()?;
        self.store.watch_filtered(c, f).await
    }
    async fn ensure_indexes(&self, c: &Collection, i: &[IndexSpec]) -> StoreResult<()> {
        self.check()?;
        self.store.ensure_indexes(c, i).await
    }
}
