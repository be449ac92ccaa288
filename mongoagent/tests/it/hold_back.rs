//! A store that holds one chosen call back until the test lets it go: how a
//! test makes one process's read-then-write straddle other processes' work
//! (a scheduler pass that read the schedule, then wrote after another
//! scheduler's passes), an interleaving neither latency nor chance produces
//! reliably. It can also stall a collection's change notifications: the
//! subscription opens, then neither delivers nor ends.

use std::sync::{Arc, Mutex};

use bson::Document;
use store_trait::{
    BatchOutcome, ChangeFilter, ChangeStream, Claim, Collection, Condition, DeleteOutcome, IndexSpec, InsertOutcome,
    Key, Query, Record, Snapshot, Store, StoreResult, StoreTime, Write, WriteOutcome,
};
use tokio::sync::{Notify, Semaphore};

/// A call [`HoldBack::hold_next`] may hold.
pub(crate) enum Op<'a> {
    Get(&'a Key),
    Write(&'a Write),
    Find(&'a Query),
    Claim(&'a Claim),
}

type Matches = Box<dyn Fn(&Collection, Op<'_>) -> bool + Send + Sync>;

/// Wraps a store; [`HoldBack::hold_next`] arms it for one call.
#[derive(Clone)]
pub(crate) struct HoldBack<S> {
    inner: S,
    armed: Arc<Mutex<Option<Matches>>>,
    reached: Arc<Notify>,
    open: Arc<Semaphore>,
    stalled: Arc<Mutex<Vec<String>>>,
    /// Writes to this collection arrive this late (a process farther from
    /// the server).
    late: Arc<Mutex<Option<(String, std::time::Duration)>>>,
}

impl<S> HoldBack<S> {
    pub(crate) fn new(inner: S) -> Self {
        HoldBack {
            inner,
            armed: Arc::default(),
            reached: Arc::default(),
            open: Arc::new(Semaphore::new(0)),
            stalled: Arc::default(),
            late: Arc::default(),
        }
    }

    /// Writes to `coll` from now on arrive `delay` late.
    pub(crate) fn delay_writes(&self, coll: &str, delay: std::time::Duration) {
        *self.late.lock().unwrap() = Some((coll.to_owned(), delay));
    }

    async fn late(&self, c: &Collection) {
        let delay = self.late.lock().unwrap().as_ref().filter(|(coll, _)| coll == c.as_str()).map(|(_, d)| *d);
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
    }

    /// The next call for which `matches` holds waits for [`HoldBack::open`].
    pub(crate) fn hold_next(&self, matches: impl Fn(&Collection, Op<'_>) -> bool + Send + Sync + 'static) {
        *self.armed.lock().unwrap() = Some(Box::new(matches));
    }

    /// Subscriptions to `coll` from now on open, then stay silent.
    pub(crate) fn stall_watches(&self, coll: &str) {
        self.stalled.lock().unwrap().push(coll.to_owned());
    }

    async fn pass(&self, c: &Collection, op: Op<'_>) {
        let hold = {
            let mut armed = self.armed.lock().unwrap();
            let hold = armed.as_ref().is_some_and(|m| m(c, op));
            if hold {
                *armed = None;
            }
            hold
        };
        if hold {
            self.reached.notify_one();
            self.open.acquire().await.unwrap().forget();
        }
    }

    fn stalled(&self, c: &Collection) -> bool {
        self.stalled.lock().unwrap().iter().any(|s| s == c.as_str())
    }

    /// Returns once the held write has arrived (and waits).
    pub(crate) async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Lets the held write go to the store.
    pub(crate) fn open(&self) {
        self.open.add_permits(1);
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for HoldBack<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldBack").field("inner", &self.inner).finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<S: Store> Store for HoldBack<S> {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    async fn now(&self) -> StoreResult<StoreTime> {
        self.inner.now().await
    }
    async fn get(&self, c: &Collection, k: &Key) -> StoreResult<Snapshot> {
        self.pass(c, Op::Get(k)).await;
        self.inner.get(c, k).await
    }
    async fn write(&self, c: &Collection, k: &Key, w: &Write) -> StoreResult<WriteOutcome> {
        self.late(c).await;
        self.pass(c, Op::Write(w)).await;
        self.inner.write(c, k, w).await
    }
    async fn write_many(&self, c: &Collection, w: &[(Key, Write)]) -> StoreResult<Vec<BatchOutcome>> {
        self.late(c).await;
        self.inner.write_many(c, w).await
    }
    async fn delete(&self, c: &Collection, k: &Key, cond: &Condition) -> StoreResult<DeleteOutcome> {
        self.inner.delete(c, k, cond).await
    }
    async fn claim(&self, c: &Collection, claim: &Claim) -> StoreResult<Option<Record>> {
        self.pass(c, Op::Claim(claim)).await;
        self.inner.claim(c, claim).await
    }
    async fn claim_many(&self, c: &Collection, claim: &Claim, limit: usize) -> StoreResult<Vec<Record>> {
        self.pass(c, Op::Claim(claim)).await;
        self.inner.claim_many(c, claim, limit).await
    }
    async fn insert_many(&self, c: &Collection, docs: Vec<Document>) -> StoreResult<Vec<InsertOutcome>> {
        self.inner.insert_many(c, docs).await
    }
    async fn find(&self, c: &Collection, q: &Query) -> StoreResult<Vec<Record>> {
        self.pass(c, Op::Find(q)).await;
        self.inner.find(c, q).await
    }
    async fn find_each(&self, c: &Collection, q: &Query) -> StoreResult<Vec<StoreResult<Record>>> {
        self.pass(c, Op::Find(q)).await;
        self.inner.find_each(c, q).await
    }
    async fn find_keys(&self, c: &Collection, q: &Query) -> StoreResult<Vec<Key>> {
        self.inner.find_keys(c, q).await
    }
    async fn count(&self, c: &Collection, q: &Query) -> StoreResult<u64> {
        self.inner.count(c, q).await
    }
    async fn watch(&self, c: &Collection, k: Option<&Key>) -> StoreResult<ChangeStream> {
        let stream = self.inner.watch(c, k).await?;
        Ok(if self.stalled(c) { Box::pin(futures::stream::pending()) } else { stream })
    }
    async fn watch_filtered(&self, c: &Collection, f: &ChangeFilter) -> StoreResult<ChangeStream> {
        let stream = self.inner.watch_filtered(c, f).await?;
        Ok(if self.stalled(c) { Box::pin(futures::stream::pending()) } else { stream })
    }
    async fn ensure_indexes(&self, c: &Collection, i: &[IndexSpec]) -> StoreResult<()> {
        self.inner.ensure_indexes(c, i).await
    }
}
