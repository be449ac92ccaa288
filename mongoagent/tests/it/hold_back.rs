//! A store that holds one chosen call back until the test lets it go: how a
//! test makes one process's read-then-write straddle other processes' work
//! (a scheduler pass that read the schedule, then wrote after another
//! scheduler's passes), an interleaving neither latency nor chance produces
//! reliably. It can also stall a collection's change notifications: the
//! subscription opens, then neither delivers nor ends. An interceptor
//! ([`Holds`]) on `store_test`'s one wrapper.

use std::sync::Mutex;

use store_test::{Call, Intercept, Intercepted};
use store_trait::{ChangeFilter, ChangeStream, Claim, Collection, Key, Query, Store, StoreResult, Write};
use tokio::sync::{Notify, Semaphore};

/// A call [`Holds::hold_next`] may hold.
pub(crate) enum Op<'a> {
    Get(&'a Key),
    Write(&'a Write),
    Find(&'a Query),
    Claim(&'a Claim),
    Delete(&'a Key),
}

type Matches = Box<dyn Fn(&Collection, Op<'_>) -> bool + Send + Sync>;

/// A store whose calls [`Holds`] may hold back; [`Holds::hold_next`] arms
/// it for one call.
pub(crate) type HoldBack<S> = Intercepted<S, Holds>;

/// What a [`HoldBack`] store holds, stalls and delays.
pub(crate) struct Holds {
    armed: Mutex<Option<Matches>>,
    reached: Notify,
    open: Semaphore,
    stalled: Mutex<Vec<String>>,
    /// Writes to this collection arrive this late (a process farther from
    /// the server).
    late: Mutex<Option<(String, std::time::Duration)>>,
}

impl Default for Holds {
    fn default() -> Self {
        Holds {
            armed: Mutex::default(),
            reached: Notify::new(),
            open: Semaphore::new(0),
            stalled: Mutex::default(),
            late: Mutex::default(),
        }
    }
}

impl std::fmt::Debug for Holds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holds").finish_non_exhaustive()
    }
}

impl Holds {
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

    /// The next call for which `matches` holds waits for [`Holds::open`].
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

    fn stall(&self, c: &Collection, stream: ChangeStream) -> ChangeStream {
        if self.stalled(c) {
            Box::pin(futures::stream::pending())
        } else {
            stream
        }
    }
}

#[async_trait::async_trait]
impl<S: Store> Intercept<S> for Holds {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        let Some(c) = coll else { return Ok(()) };
        if matches!(call, Call::Write(..) | Call::WriteMany(_)) {
            self.late(c).await;
        }
        let op = match call {
            Call::Get(k) => Op::Get(k),
            Call::Write(_, w) => Op::Write(w),
            Call::Find(q) | Call::FindEach(q) => Op::Find(q),
            Call::Claim(claim) | Call::ClaimMany(claim, _) => Op::Claim(claim),
            Call::Delete(k, _) => Op::Delete(k),
            _ => return Ok(()),
        };
        self.pass(c, op).await;
        Ok(())
    }
    async fn watch(&self, inner: &S, c: &Collection, k: Option<&Key>) -> StoreResult<ChangeStream> {
        Ok(self.stall(c, inner.watch(c, k).await?))
    }
    async fn watch_filtered(&self, inner: &S, c: &Collection, f: &ChangeFilter) -> StoreResult<ChangeStream> {
        Ok(self.stall(c, inner.watch_filtered(c, f).await?))
    }
}
