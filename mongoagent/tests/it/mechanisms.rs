//! One deterministic test per agent safety mechanism that the suite and the
//! simulation do not pin down on their own (see docs/testing.md): each fails
//! when its mechanism is removed. One file per mechanism; here, what they
//! share.

mod ahead;
mod claims;
mod fan_in;
mod pause;
mod permits;
mod requeue;
mod retries;
mod wake_ups;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, NewTask, Outcome, Processed, Queue, Task, CONTROL_REFRESH};
use store_memory::MemoryStore;
use store_test::{Intercept, Intercepted};
use store_trait::{Claim, Collection, Condition, Key, Mutation, Query, Record, Store, StoreResult, Ttl, Write};
use tokio::sync::Notify;

use crate::hold_back::{HoldBack, Op};

fn coll() -> Collection {
    Collection::new("tasks").unwrap()
}

async fn data(s: &MemoryStore, id: &Key) -> bson::Document {
    s.peek(&coll(), id).unwrap().record.unwrap().into_data()
}

/// Runs `agent` on its own task with a handler that signals each start on the
/// returned `Notify` and completes the task at once.
fn work_signalling<S: Store + Clone>(
    agent: &Agent<S>,
) -> (tokio::task::JoinHandle<Result<mongoagent::AgentCounters, mongoagent::AgentError>>, Arc<Notify>) {
    let ran = Arc::new(Notify::new());
    let run = tokio::spawn({
        let (agent, ran) = (agent.clone(), ran.clone());
        async move {
            agent
                .work(move |_t: Task| {
                    let ran = ran.clone();
                    async move {
                        ran.notify_one();
                        true
                    }
                })
                .await
        }
    });
    (run, ran)
}

/// A run started by [`a_held_run`], its start signal and its release.
type HeldRun = (tokio::task::JoinHandle<Result<Option<Processed>, mongoagent::AgentError>>, Arc<Notify>, Arc<Notify>);

/// Processes one task of `agent` on a task of its own, whose handler tells
/// the first `Notify` when it starts and holds its slot until the second is
/// told.
fn a_held_run<S: Store + Clone>(agent: &Agent<S>) -> HeldRun {
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let run = tokio::spawn({
        let (agent, started, finish) = (agent.clone(), started.clone(), finish.clone());
        async move {
            agent
                .process(move |_t: Task| {
                    let (started, finish) = (started.clone(), finish.clone());
                    async move {
                        started.notify_one();
                        finish.notified().await;
                        true
                    }
                })
                .await
        }
    });
    (run, started, finish)
}

/// A memory store whose calls take 5 ms, holding `n` tasks of agent `w`,
/// and a counting wrapper around it.
async fn busy_queue(n: i32) -> (MemoryStore, Counted) {
    let store = MemoryStore::new();
    store.faults().set_latency(Duration::from_millis(5));
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue_all(&(0..n).map(|n| NewTask::new("w", doc! { "n": n })).collect::<Vec<_>>()).await.unwrap();
    let calls = Counted::new(store.clone());
    (store, calls)
}

/// A store that counts claim calls (single or batch): in flight now, the most
/// in flight at once, and in all; and batches of writes.
type Counted = Intercepted<MemoryStore, Counts>;

/// The counters of a [`Counted`] store, and the races and empty claims it
/// stages.
#[derive(Debug, Default)]
struct Counts {
    now: AtomicUsize,
    max: AtomicUsize,
    claims: AtomicUsize,
    write_batches: AtomicUsize,
    /// Reads of candidates still to be raced: another claimer takes every
    /// key such a read returns before the reader can claim it.
    race: AtomicUsize,
    /// Claims that named their keys, and reads of candidates.
    keyed: AtomicUsize,
    reads: AtomicUsize,
    /// Claims of the head (by query, no keys) still to come back empty
    /// whatever the queue holds: a server that gives up on a write conflict.
    false_empty: AtomicUsize,
    /// The most tasks one claim asked for.
    asked_max: AtomicUsize,
}

impl Counts {
    async fn counting<T>(&self, claim: &Claim, run: impl std::future::Future<Output = T>) -> T {
        self.claims.fetch_add(1, Ordering::SeqCst);
        if claim.query.keys.is_some() {
            self.keyed.fetch_add(1, Ordering::SeqCst);
        }
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        let out = run.await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

#[async_trait::async_trait]
impl Intercept<MemoryStore> for Counts {
    async fn write_many(
        &self,
        inner: &MemoryStore,
        c: &Collection,
        w: &[(Key, Write)],
    ) -> StoreResult<Vec<store_trait::BatchOutcome>> {
        self.write_batches.fetch_add(1, Ordering::SeqCst);
        inner.write_many(c, w).await
    }
    async fn claim(&self, inner: &MemoryStore, c: &Collection, claim: &Claim) -> StoreResult<Option<Record>> {
        let head = claim.query.keys.is_none() && claim.query.filter.get_bool("ready").is_ok_and(|r| r);
        if head && self.false_empty.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Ok(None);
        }
        self.counting(claim, inner.claim(c, claim)).await
    }
    async fn claim_many(
        &self,
        inner: &MemoryStore,
        c: &Collection,
        claim: &Claim,
        limit: usize,
    ) -> StoreResult<Vec<Record>> {
        self.asked_max.fetch_max(limit, Ordering::SeqCst);
        self.counting(claim, inner.claim_many(c, claim, limit)).await
    }
    async fn find_keys(&self, inner: &MemoryStore, c: &Collection, q: &Query) -> StoreResult<Vec<Key>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let keys = inner.find_keys(c, q).await?;
        if self.race.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            let lease = store_trait::Ttl::new(Duration::from_secs(3600)).unwrap();
            let racer = store_trait::Mutation::new().grant("racer", lease).set("ready", false).set("claimed", true);
            for k in &keys {
                inner.write(c, k, &Write::new(Condition::Always, racer.clone())).await?;
            }
        }
        Ok(keys)
    }
}
