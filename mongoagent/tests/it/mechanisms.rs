//! One deterministic test per agent safety mechanism that the suite and the
//! simulation do not pin down on their own (see docs/testing.md):
//! each fails when its mechanism is removed.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, NewTask, Outcome, Processed, Queue, Task, CONTROL_REFRESH};
use store_memory::MemoryStore;
use store_trait::{
    ChangeStream, Claim, Collection, Condition, DeleteOutcome, IndexSpec, InsertOutcome, Key, Mutation, Query, Record,
    Snapshot, Store, StoreResult, StoreTime, Ttl, Write, WriteOutcome,
};
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

/// Fence check: an agent cut off for longer than its lease finishes its handler
/// after another agent took the task over and completed it. Its late outcome is
/// rejected, whatever order the two finish in.
#[tokio::test(start_paused = true)]
async fn a_late_outcome_of_a_lapsed_claim_is_rejected() {
    for newer_finishes_first in [true, false] {
        let store = MemoryStore::new();
        let (id, _) = Queue::new(store.clone(), "tasks").unwrap().enqueue(NewTask::new("w", doc! {})).await.unwrap();
        let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let slow = store.client();
        let old = Agent::builder(slow.clone(), "w", "tasks").ttl(Duration::from_secs(3)).build().unwrap();
        let old_run = tokio::spawn({
            let (started, finish) = (started.clone(), finish.clone());
            async move {
                let handler = move |_t: Task| {
                    let (started, finish) = (started.clone(), finish.clone());
                    async move {
                        started.notify_one();
                        finish.notified().await;
                        Outcome::done_with(doc! {"by": "old"})
                    }
                };
                old.process(handler).await.map(|p| (p, old.counters()))
            }
        });
        started.notified().await;
        // Cut off past the lease: the claim lapses on the store.
        slow.set_partitioned(true);
        tokio::time::sleep(Duration::from_secs(4)).await;

        let new = Agent::builder(store.client(), "w", "tasks").ttl(Duration::from_secs(3)).build().unwrap();
        let new_started = Arc::new(Notify::new());
        let new_run = tokio::spawn({
            let (new, new_started) = (new.clone(), new_started.clone());
            let release = if newer_finishes_first { None } else { Some(finish.clone()) };
            async move {
                let handler = move |t: Task| {
                    let (new_started, release) = (new_started.clone(), release.clone());
                    async move {
                        assert_eq!(t.attempt(), 2);
                        new_started.notify_one();
                        if let Some(r) = release {
                            // The old agent finishes while this one still runs.
                            r.notify_one();
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        Outcome::done_with(doc! {"by": "new"})
                    }
                };
                new.process(handler).await
            }
        });
        new_started.notified().await;
        slow.set_partitioned(false);
        if newer_finishes_first {
            assert_eq!(new_run.await.unwrap().unwrap(), Some(Processed::Completed(id.clone())));
            finish.notify_one();
            let (old_processed, old_log) = old_run.await.unwrap().unwrap();
            assert_eq!(old_processed, Some(Processed::Stale(id.clone())), "the late outcome is rejected");
            assert_eq!((old_log.completed, old_log.stale_rejected), (0, 1));
        } else {
            let (old_processed, old_log) = old_run.await.unwrap().unwrap();
            assert_eq!(old_processed, Some(Processed::Stale(id.clone())), "the late outcome is rejected");
            assert_eq!((old_log.completed, old_log.stale_rejected), (0, 1));
            assert_eq!(new_run.await.unwrap().unwrap(), Some(Processed::Completed(id.clone())));
        }
        let d = data(&store, &id).await;
        assert_eq!((d.get_str("by").unwrap(), d.get_bool("complete").unwrap()), ("new", true), "{d}");
    }
}

/// Fan-in conditional wake: the wake-up is conditional on the round the task
/// waits on. A follow-up of round 0 whose agent died after recording its outcome
/// and before telling the waiter is finished later by whoever claims it; by
/// then the waiter woke itself (it counts too), ran round 1 and waits on a new
/// follow-up. That late wake-up for round 0 must not wake it.
#[tokio::test(start_paused = true)]
async fn a_late_wake_up_for_an_earlier_round_wakes_nobody() {
    let store = MemoryStore::new();
    store
        .insert_many(
            &coll(),
            vec![
                doc! {"_id": "job", "agent_name": "split", "ready": false, "round": 1_i64, "waiting": 1_i64},
                doc! {"_id": "job/0", "agent_name": "count", "ready": true, "join": "job", "join_round": 0_i64},
                doc! {"_id": "job@1/0", "agent_name": "count", "ready": false, "join": "job", "join_round": 1_i64},
            ],
        )
        .await
        .unwrap();
    // The dead agent's claim on job/0, with its outcome recorded.
    let dead = store_trait::Claim {
        query: store_trait::Query::eq(doc! {"_id": "job/0"}),
        mutation: store_trait::Mutation::new()
            .grant("dead-agent", store_trait::Ttl::new(Duration::from_secs(2)).unwrap())
            .bump_fence()
            .set("ready", false)
            .set("claimed", true)
            .set("complete", true)
            .set("error_encountered", false),
    };
    assert!(store.claim(&coll(), &dead).await.unwrap().is_some());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let recover = Agent::builder(store.client(), "count", "tasks")
        .poll_interval(Duration::from_secs(3600))
        .process_while(|l| l.recovered < 1)
        .build()
        .unwrap();
    let log = tokio::time::timeout(Duration::from_secs(60), recover.work(|_t: Task| async { true }))
        .await
        .expect("the dead agent's step is finished")
        .unwrap();
    assert_eq!((log.recovered, log.tasks_processed), (1, 0));
    let d = data(&store, &Key::new("job").unwrap()).await;
    assert_eq!((d.get_i64("waiting").ok(), d.get_bool("ready").unwrap()), (Some(1), false), "still waits: {d}");
    let split = Agent::builder(store.client(), "split", "tasks").build().unwrap();
    assert!(split.process(|_t: Task| async { true }).await.unwrap().is_none(), "not ready while round 1 is open");
}

/// Claim (ready tasks): a task can be ready and still held, for a moment: the
/// last follow-up wakes a waiting task while the waiter's own agent still holds
/// it. Nobody claims it until that agent lets go.
#[tokio::test(start_paused = true)]
async fn a_ready_task_still_held_is_not_claimed() {
    let store = MemoryStore::new();
    store.insert_many(&coll(), vec![doc! {"_id": "t", "agent_name": "w", "ready": true}]).await.unwrap();
    let ttl = store_trait::Ttl::new(Duration::from_secs(60)).unwrap();
    let hold =
        store_trait::Write::new(store_trait::Condition::Always, store_trait::Mutation::new().grant("other", ttl));
    assert!(store.write(&coll(), &Key::new("t").unwrap(), &hold).await.unwrap().is_applied());
    let a = Agent::builder(store.client(), "w", "tasks").build().unwrap();
    assert!(a.process(|_t: Task| async { true }).await.unwrap().is_none(), "a held task is not claimed");
    let release = store_trait::Write::new(store_trait::Condition::Always, store_trait::Mutation::new().release());
    assert!(store.write(&coll(), &Key::new("t").unwrap(), &release).await.unwrap().is_applied());
    assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(Key::new("t").unwrap())));
}

/// Claim gate: agents built on one `Queue` take turns claiming instead of racing
/// for the head of the queue; counted on a store that records claims in flight.
#[tokio::test(start_paused = true)]
async fn agents_on_one_queue_claim_in_turn() {
    let store = MemoryStore::new();
    store.faults().set_latency(Duration::from_millis(20));
    let counted = Counted::new(store.clone());
    let queue = Queue::new(counted.clone(), "tasks").unwrap();
    let tasks: Vec<_> = (0..24_i64).map(|i| NewTask::new("w", doc! {"i": i})).collect();
    queue.enqueue_all(&tasks).await.unwrap();
    let agents: Vec<_> = (0..4).map(|_| Agent::on_queue(&queue, "w").concurrency(2).build().unwrap()).collect();
    let workers: Vec<_> = agents
        .iter()
        .map(|a| {
            let a = a.clone();
            tokio::spawn(async move { a.work(|_t: Task| async { true }).await.unwrap() })
        })
        .collect();
    let done = Query::eq(doc! {"complete": true});
    // Bounded (simulated time), so that a broken agent fails the test instead of
    // hanging it.
    for _ in 0..3_000 {
        if store.count(&coll(), &done).await.unwrap() >= 24 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agents.iter().for_each(Agent::shutdown);
    let mut completed = 0;
    for w in workers {
        completed += w.await.unwrap().completed;
    }
    assert_eq!(completed, 24);
    assert!(agents.iter().filter(|a| a.counters().completed > 0).count() > 1, "the agents shared the work");
    assert_eq!(counted.max.load(Ordering::SeqCst), 1, "one claim in flight at a time");
}

/// A store that counts claim calls (single or batch): in flight now, the most
/// in flight at once, and in all; and batches of writes.
#[derive(Debug, Clone)]
struct Counted {
    inner: MemoryStore,
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
    claims: Arc<AtomicUsize>,
    write_batches: Arc<AtomicUsize>,
    /// Reads of candidates still to be raced: another claimer takes every
    /// key such a read returns before the reader can claim it.
    race: Arc<AtomicUsize>,
    /// Claims that named their keys, and reads of candidates.
    keyed: Arc<AtomicUsize>,
    reads: Arc<AtomicUsize>,
    /// Claims of the head (by query, no keys) still to come back empty
    /// whatever the queue holds: a server that gives up on a write conflict.
    false_empty: Arc<AtomicUsize>,
    /// The most tasks one claim asked for.
    asked_max: Arc<AtomicUsize>,
}

impl Counted {
    fn new(inner: MemoryStore) -> Self {
        Counted {
            inner,
            now: Arc::default(),
            max: Arc::default(),
            claims: Arc::default(),
            write_batches: Arc::default(),
            race: Arc::default(),
            keyed: Arc::default(),
            reads: Arc::default(),
            false_empty: Arc::default(),
            asked_max: Arc::default(),
        }
    }

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
impl Store for Counted {
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    async fn now(&self) -> StoreResult<StoreTime> {
        self.inner.now().await
    }
    async fn get(&self, c: &Collection, k: &Key) -> StoreResult<Snapshot> {
        self.inner.get(c, k).await
    }
    async fn write(&self, c: &Collection, k: &Key, w: &Write) -> StoreResult<WriteOutcome> {
        self.inner.write(c, k, w).await
    }
    async fn write_many(&self, c: &Collection, w: &[(Key, Write)]) -> StoreResult<Vec<store_trait::BatchOutcome>> {
        self.write_batches.fetch_add(1, Ordering::SeqCst);
        self.inner.write_many(c, w).await
    }
    async fn delete(&self, c: &Collection, k: &Key, cond: &Condition) -> StoreResult<DeleteOutcome> {
        self.inner.delete(c, k, cond).await
    }
    async fn claim(&self, c: &Collection, claim: &Claim) -> StoreResult<Option<Record>> {
        let head = claim.query.keys.is_none() && claim.query.filter.get_bool("ready").is_ok_and(|r| r);
        if head && self.false_empty.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Ok(None);
        }
        self.counting(claim, self.inner.claim(c, claim)).await
    }
    async fn claim_many(&self, c: &Collection, claim: &Claim, limit: usize) -> StoreResult<Vec<Record>> {
        self.asked_max.fetch_max(limit, Ordering::SeqCst);
        self.counting(claim, self.inner.claim_many(c, claim, limit)).await
    }
    async fn insert_many(&self, c: &Collection, docs: Vec<bson::Document>) -> StoreResult<Vec<InsertOutcome>> {
        self.inner.insert_many(c, docs).await
    }
    async fn find(&self, c: &Collection, q: &Query) -> StoreResult<Vec<Record>> {
        self.inner.find(c, q).await
    }
    async fn find_each(&self, c: &Collection, q: &Query) -> StoreResult<Vec<StoreResult<Record>>> {
        self.inner.find_each(c, q).await
    }
    async fn find_keys(&self, c: &Collection, q: &Query) -> StoreResult<Vec<Key>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let keys = self.inner.find_keys(c, q).await?;
        if self.race.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            let lease = store_trait::Ttl::new(Duration::from_secs(3600)).unwrap();
            let racer = store_trait::Mutation::new().grant("racer", lease).set("ready", false).set("claimed", true);
            for k in &keys {
                self.inner.write(c, k, &Write::new(Condition::Always, racer.clone())).await?;
            }
        }
        Ok(keys)
    }
    async fn count(&self, c: &Collection, q: &Query) -> StoreResult<u64> {
        self.inner.count(c, q).await
    }
    async fn watch(&self, c: &Collection, k: Option<&Key>) -> StoreResult<ChangeStream> {
        self.inner.watch(c, k).await
    }
    async fn watch_filtered(&self, c: &Collection, f: &store_trait::ChangeFilter) -> StoreResult<ChangeStream> {
        self.inner.watch_filtered(c, f).await
    }
    async fn ensure_indexes(&self, c: &Collection, i: &[IndexSpec]) -> StoreResult<()> {
        self.inner.ensure_indexes(c, i).await
    }
}

/// Wake-ups filtered where the changes happen (`claim::claimable_changes`,
/// `Store::watch_filtered`): an idle agent sleeps through another agent's
/// claims and completions of its own tasks, and still wakes at once for a task
/// of its own. Without the filter every claim and completion wakes it into a
/// claim that finds nothing (about 40 here).
#[tokio::test(start_paused = true)]
async fn an_idle_agent_sleeps_through_other_agents_work() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let tasks: Vec<_> = (0..20_i64).map(|i| NewTask::new("busy", doc! {"i": i})).collect();
    queue.enqueue_all(&tasks).await.unwrap();
    let counted = Counted::new(store.clone());
    let idle =
        Agent::builder(counted.clone(), "idle", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let (idle_run, ran) = work_signalling(&idle);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = counted.claims.load(Ordering::SeqCst);
    let busy = Agent::builder(store.clone(), "busy", "tasks").build().unwrap();
    let busy_run = tokio::spawn({
        let busy = busy.clone();
        async move {
            busy.work(|_t: Task| async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                true
            })
            .await
        }
    });
    for _ in 0..600 {
        if busy.counters().completed >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    busy.shutdown();
    assert_eq!(busy_run.await.unwrap().unwrap().completed, 20);
    let woken = counted.claims.load(Ordering::SeqCst) - before;
    assert_eq!(woken, 0, "claims by the idle agent while another agent worked");
    // A task of its own wakes it at once, long before its 600 s poll.
    let sent = tokio::time::Instant::now();
    queue.enqueue(NewTask::new("idle", doc! {})).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), ran.notified()).await.expect("woken by the insert");
    assert!(sent.elapsed() < Duration::from_secs(1));
    idle.shutdown();
    assert_eq!(idle_run.await.unwrap().unwrap().completed, 1);
}

/// An idle agent of `w` (600 s poll) on `store`; a second later `write` is
/// applied to task `key` by another writer, and the agent must run that
/// task within five seconds: the write's change woke it (`what`).
async fn a_write_wakes_the_idle_agent(store: MemoryStore, key: &Key, write: Write, what: &str) {
    let agent = Agent::builder(store.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let (run, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(store.write(&coll(), key, &write).await.unwrap().is_applied());
    tokio::time::timeout(Duration::from_secs(5), ran.notified())
        .await
        .unwrap_or_else(|_| panic!("not woken by {what}"));
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1);
}

/// A task made ready by a write that sets `ready: true` and nothing of its
/// lease (as a schedule lets its held task go, `schedule/mod.rs`) wakes its
/// idle agent at once: `claim::claimable_changes` admits it. Without that
/// clause the task waits for the idle agent's 600 s poll.
#[tokio::test(start_paused = true)]
async fn a_task_made_ready_wakes_its_idle_agent() {
    let store = MemoryStore::new();
    let held = doc! {"_id": "t", "agent_name": "w", "ready": false, "overlap_held": true};
    store.insert_many(&coll(), vec![held]).await.unwrap();
    let let_go = Write::new(
        Condition::FieldEq("overlap_held".into(), true.into()),
        store_trait::Mutation::new().set("ready", true).unset("overlap_held"),
    );
    a_write_wakes_the_idle_agent(store, &Key::new("t").unwrap(), let_go, "the task made ready").await;
}

/// A claim given back (a drain that timed out) wakes an idle agent of the
/// same name at once: the give-back lets the lease go without finishing the
/// task, which `claim::claimable_changes` admits. Without that clause the task
/// waits for the idle agent's poll or the lease's 60 s.
#[tokio::test(start_paused = true)]
async fn a_claim_given_back_wakes_an_idle_peer() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    queue.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let started = Arc::new(Notify::new());
    let holder = Agent::builder(store.clone(), "w", "tasks")
        .ttl(Duration::from_secs(60))
        .drain_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let holder_run = tokio::spawn({
        let (holder, started) = (holder.clone(), started.clone());
        async move {
            holder
                .work(move |_t: Task| {
                    let started = started.clone();
                    async move {
                        started.notify_one();
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        true
                    }
                })
                .await
        }
    });
    started.notified().await;
    let idle = Agent::builder(store.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let (idle_run, ran) = work_signalling(&idle);
    tokio::time::sleep(Duration::from_secs(1)).await;
    holder.shutdown();
    assert_eq!(holder_run.await.unwrap().unwrap().completed, 0);
    tokio::time::timeout(Duration::from_secs(5), ran.notified())
        .await
        .expect("the idle peer takes the task given back");
    idle.shutdown();
    assert_eq!(idle_run.await.unwrap().unwrap().completed, 1);
}

/// A retry moves the idle deadline (`work.rs`: `idle_until` cleared when
/// `reap` sees a retried task): a task this agent retried for a second later
/// runs a second later, not at the end of the idle period before it (the
/// 600 s poll); its own retry write is no change it sees (it watches only
/// while idle).
#[tokio::test(start_paused = true)]
async fn a_retry_due_soon_runs_when_due_after_an_earlier_idle_period() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let epoch = tokio::time::Instant::now();
    let run = tokio::spawn({
        let (agent, attempts) = (agent.clone(), attempts.clone());
        async move {
            agent
                .work(move |t: Task| {
                    let attempts = attempts.clone();
                    async move {
                        attempts.lock().unwrap().push(epoch.elapsed());
                        if t.attempt() == 1 {
                            Outcome::retry_after("once more", Duration::from_secs(1))
                        } else {
                            Outcome::done()
                        }
                    }
                })
                .await
        }
    });
    // Idle first (a 600 s idle period begins), then a task arrives.
    tokio::time::sleep(Duration::from_secs(1)).await;
    queue.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1, "the retry ran within 10 s: {:?}", attempts.lock().unwrap());
}

/// An idle agent woken by inserts claims the inserted tasks by key
/// (`claim::Woken`): one light claim each, none by the queue's filter and
/// sort, and nothing more when the insert was another agent's task (it was
/// idle: nothing else is claimable). Without that, each wake-up claims the
/// head by query.
#[tokio::test(start_paused = true)]
async fn a_woken_agent_claims_the_inserted_task_by_key() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let counted = Counted::new(store.clone());
    let agent = Agent::builder(counted.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let (run, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let count = || {
        (
            counted.claims.load(Ordering::SeqCst),
            counted.keyed.load(Ordering::SeqCst),
            counted.reads.load(Ordering::SeqCst),
        )
    };
    let before = count();
    for _ in 0..3 {
        queue.enqueue(NewTask::new("other", doc! {})).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    queue.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), ran.notified()).await.expect("woken by the insert");
    let after = count();
    // Four wake-ups, four keyed claims (three misses, one hit), no list read.
    assert_eq!((after.0 - before.0, after.1 - before.1, after.2 - before.2), (4, 4, 0));
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1);
}

/// A claim of the head that finds nothing right after a list read found
/// some (here the server gave up on it, as SecantusDB does on a write
/// conflict) is tried again after a backoff (`Candidates::head_claimed`,
/// `Claims::outrun`), not taken for an empty queue: without that the agent idles
/// until its 600 s poll with tasks left (no change wakes it).
#[tokio::test(start_paused = true)]
async fn an_empty_head_claim_after_a_list_with_tasks_is_tried_again() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let tasks: Vec<_> = (0..10_i64).map(|i| NewTask::new("w", doc! {"i": i})).collect();
    queue.enqueue_all(&tasks).await.unwrap();
    let counted = Counted::new(store.clone());
    let agent = Agent::builder(counted.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let run = tokio::spawn({
        let agent = agent.clone();
        async move {
            agent
                .work(|_t: Task| async {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    true
                })
                .await
        }
    });
    // The first claim takes the head, the second reads a short list (nine):
    // from then on the head again whenever the list is old or spent.
    while counted.reads.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Three in a row: the work loop claims again when it opens its idle
    // watch and before it sleeps; those come back empty too.
    counted.false_empty.store(3, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    agent.shutdown();
    assert_eq!(counted.false_empty.load(Ordering::SeqCst), 0, "a claim of the head came back empty");
    assert_eq!(run.await.unwrap().unwrap().completed, 10, "every task within 30 s");
}

/// The pause view wakes an idle agent only when its own name's pause state
/// changed (`work.rs`), not at the view's first read (the control task
/// starts when the agent goes idle alone) or for another name's pause: each
/// of those was a claim that found nothing.
#[tokio::test(start_paused = true)]
async fn the_pause_view_wakes_an_idle_agent_only_for_its_own_pause() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let counted = Counted::new(store.clone());
    let agent = Agent::builder(counted.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let (run, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The claims before sleeping: the first, once the idle watch is open,
    // once the idle deadline is read; each of ready tasks, then of lapsed ones.
    assert_eq!(counted.claims.load(Ordering::SeqCst), 6);
    queue.set_paused("other", true).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(counted.claims.load(Ordering::SeqCst), 6, "another name's pause woke it");
    queue.set_paused("w", true).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    queue.set_paused("w", false).await.unwrap();
    queue.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), ran.notified()).await.expect("runs after the resume");
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1);
}

/// A pause is seen within `CONTROL_REFRESH` of being written, whatever the
/// control collection's notifications do (`control.rs`). Here they stall:
/// the subscription opens, then says nothing. The control task reads the
/// paused names again when no notification made it read for a while, so an
/// idle agent learns of a resume; and an agent trusts the task's view only
/// while its read is younger than `CONTROL_REFRESH`, so one woken for a new
/// task while that read hangs reads its own document, and claims nothing
/// while paused; and each read is published, changed or not, so an agent
/// that learned of the pause by its own read wakes at the resume. Without the
/// rereads, or without publishing an unchanged read, the resumed agent sleeps
/// through its 600 s poll; without the age check it claims while paused.
#[tokio::test(start_paused = true)]
async fn a_pause_is_seen_though_its_notifications_stall() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let held = HoldBack::new(store.clone());
    held.stall_watches("tasks_control");
    let agent = Agent::builder(held.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let (run, ran) = work_signalling(&agent);
    let runs = |within: u64| tokio::time::timeout(Duration::from_secs(within), ran.notified());
    tokio::time::sleep(Duration::from_secs(5)).await;
    queue.set_paused("w", true).await.unwrap();
    tokio::time::sleep(CONTROL_REFRESH).await;
    queue.enqueue(NewTask::new("w", doc! {"n": 1})).await.unwrap();
    assert!(runs(5).await.is_err(), "claimed while paused");
    queue.set_paused("w", false).await.unwrap();
    runs(5).await.expect("runs after the resume");
    // Idle again (a new control task has read), then paused while the
    // task's next read hangs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    held.hold_next(|c, op| {
        c.as_str() == "tasks_control" && matches!(op, Op::Find(q) if q.filter.contains_key("paused"))
    });
    held.reached().await;
    queue.set_paused("w", true).await.unwrap();
    tokio::time::sleep(CONTROL_REFRESH).await;
    queue.enqueue(NewTask::new("w", doc! {"n": 2})).await.unwrap();
    assert!(runs(5).await.is_err(), "claimed while paused, on a view too old to trust");
    queue.set_paused("w", false).await.unwrap();
    held.open();
    runs(5).await.expect("runs after the resume");
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 2);
}

/// Agents sharing a `Queue` take turns claiming; each reads the pause state
/// once it is its turn (`claim.rs`), not before waiting for it. Here agent A's
/// claim is held back two seconds while B waits its turn, and the name is
/// paused meanwhile: B, whose read before waiting said "not paused", claims
/// nothing. Checked before the wait, B claims a task two seconds after the
/// pause.
#[tokio::test(start_paused = true)]
async fn a_claim_that_waited_its_turn_sees_a_pause_written_meanwhile() {
    let store = MemoryStore::new();
    let held = HoldBack::new(store.clone());
    let queue = Queue::new(held.clone(), "tasks").unwrap();
    queue.enqueue_all(&[NewTask::new("w", doc! {"n": 1}), NewTask::new("w", doc! {"n": 2})]).await.unwrap();
    let a = Agent::on_queue(&queue, "w").build().unwrap();
    let b = Agent::on_queue(&queue, "w").build().unwrap();
    held.hold_next(|_, op| matches!(op, Op::Claim(c) if c.query.filter.get_bool("ready").is_ok_and(|r| r)));
    let first = tokio::spawn(async move { a.process(|_: Task| async { true }).await });
    held.reached().await;
    let second = tokio::spawn(async move { b.process(|_: Task| async { true }).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    queue.set_paused("w", true).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    held.open();
    assert!(first.await.unwrap().unwrap().is_some(), "A's claim was sent before the pause");
    assert_eq!(second.await.unwrap().unwrap(), None, "B claimed two seconds after the pause");
}

/// Outrun: a claimer whose candidates others took, read after read, gives up
/// with ready tasks left, and no change will come to say so (the idle watch
/// passes over other claimers' claims). It tries again after a backoff
/// (`Claims::outrun` in `claim.rs`, read in `work.rs`) and takes the rest at once; without
/// that it sleeps until its 600 s poll.
#[tokio::test(start_paused = true)]
async fn an_outrun_claimer_tries_again_soon() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let tasks: Vec<_> = (0..1000_i64).map(|i| NewTask::new("w", doc! {"i": i})).collect();
    queue.enqueue_all(&tasks).await.unwrap();
    let counted = Counted::new(store.clone());
    // Every list read of the first four claims (two each) is raced: 8 × 64 keys.
    counted.race.store(8, Ordering::SeqCst);
    let agent = Agent::builder(counted.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let run = tokio::spawn({
        let agent = agent.clone();
        async move { agent.work(|_t: Task| async { true }).await }
    });
    let remaining = 1000 - 1 - 8 * 64;
    tokio::time::sleep(Duration::from_secs(30)).await;
    agent.shutdown();
    let done = run.await.unwrap().unwrap().completed;
    assert_eq!(counted.race.load(Ordering::SeqCst), 0, "every raced read happened");
    assert_eq!(done, 1 + remaining, "the head, then every task the racer left, within 30 s");
}

/// A claim is kept through mongolock's one lease seam (`Leases`), like a lock's
/// acquisition: renewed while the handler runs longer than the lease; cut off, the
/// handler's cancellation fires while the claim is still live on the store; and
/// the claim is not released behind the handler's back.
#[tokio::test(start_paused = true)]
async fn a_claim_is_kept_like_a_lock() {
    let store = MemoryStore::new();
    let (id, _) = Queue::new(store.clone(), "tasks").unwrap().enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let lease = Duration::from_secs(3);
    let agent = Agent::builder(store.clone(), "w", "tasks").ttl(lease).build().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = {
        let (store, id, seen) = (store.clone(), id.clone(), seen.clone());
        move |t: Task| {
            let (store, id, seen) = (store.clone(), id.clone(), seen.clone());
            async move {
                let holder = |what: &str| {
                    let snap = store.peek(&coll(), &id).unwrap();
                    let live = snap.record.unwrap().holder_at(snap.now).map(|l| l.owner.clone());
                    seen.lock().unwrap().push((what.to_owned(), live));
                };
                tokio::time::sleep(lease * 2).await;
                assert!(!t.cancellation().is_cancelled(), "the claim is renewed while the handler runs");
                holder("renewed");
                store.faults().set_unreachable(true);
                tokio::time::timeout(lease, t.cancellation().cancelled()).await.expect("the claim's loss is signalled");
                holder("signalled");
                store.faults().set_unreachable(false);
                tokio::time::sleep(Duration::from_millis(50)).await;
                holder("after");
                Outcome::done_with(doc! {"late": true})
            }
        }
    };
    // The outcome's write is fenced, not refused for the signal: the claim was
    // still this agent's, so it applies.
    let out = agent.process(handler).await.unwrap();
    assert_eq!(out, Some(Processed::Completed(id.clone())));
    let seen = seen.lock().unwrap().clone();
    let owners: Vec<_> = seen.iter().map(|(_, o)| o.clone()).collect();
    assert!(owners.iter().all(Option::is_some), "held at every step: {seen:?}");
    assert!(owners.windows(2).all(|w| w[0] == w[1]), "by the same claim: {seen:?}");
}

/// Batch claims: an agent with four free slots claims four tasks in one batch,
/// each under its own bumped fence; tasks a lost batch stamped (its caller
/// never learned them) lapse and are run under the next fence.
#[tokio::test(start_paused = true)]
async fn batch_claims_fence_each_task_and_lost_batches_lapse() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let tasks: Vec<_> = (0..8_i64).map(|i| NewTask::new("w", doc! {"i": i})).collect();
    queue.enqueue_all(&tasks).await.unwrap();
    // A batch whose caller died before it read back what it claimed: four tasks.
    let lease = store_trait::Ttl::new(Duration::from_secs(3)).unwrap();
    let lost = Claim {
        query: Query::eq(doc! {"agent_name": "w", "ready": true}).sort("i", store_trait::Order::Asc),
        mutation: store_trait::Mutation::new()
            .grant("lost", lease)
            .bump_fence()
            .set("ready", false)
            .set("claimed", true),
    };
    assert_eq!(store.claim_many(&coll(), &lost, 4).await.unwrap().len(), 4);
    let agent = Agent::builder(store.clone(), "w", "tasks").concurrency(4).build().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let worker = tokio::spawn({
        let (agent, seen) = (agent.clone(), seen.clone());
        async move {
            agent
                .work(move |t: Task| {
                    let seen = seen.clone();
                    async move {
                        seen.lock().unwrap().push((t.data().get_i64("i").unwrap(), t.fence()));
                        true
                    }
                })
                .await
                .unwrap()
        }
    });
    for _ in 0..600 {
        if seen.lock().unwrap().len() >= 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agent.shutdown();
    assert_eq!(worker.await.unwrap().completed, 8);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    let want: Vec<(i64, u64)> = (0..8).map(|i| (i, if i < 4 { 2 } else { 1 })).collect();
    assert_eq!(seen, want, "each task ran once, under its own next fence");
}

/// Attempts count the claims of a round: waiting for follow-ups is no failure,
/// so a new round has its full `max_attempts`; a requeued task starts over too.
#[tokio::test(start_paused = true)]
async fn attempts_count_per_round_and_start_over_on_requeue() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("job", doc! {}).id("j")).await.unwrap();
    let job = Agent::builder(store.clone(), "job", "tasks").max_attempts(2).build().unwrap();
    let part = Agent::builder(store.clone(), "part", "tasks").build().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = {
        let seen = seen.clone();
        move |t: Task| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push((t.round(), t.attempt()));
                if t.round() == 0 {
                    Outcome::done().follow_up(NewTask::new("part", doc! {})).wait_for_follow_ups()
                } else {
                    Outcome::failed("once more")
                }
            }
        }
    };
    assert!(matches!(job.process(handler.clone()).await.unwrap(), Some(Processed::Waiting(_))));
    assert!(matches!(part.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
    // The first claim of round 1 is its attempt 1 of 2: retried, not failed for good.
    assert!(matches!(job.process(handler.clone()).await.unwrap(), Some(Processed::Retried(_))));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(matches!(job.process(handler.clone()).await.unwrap(), Some(Processed::Failed(_))));
    assert_eq!(q.requeue(doc! {"agent_name": "job"}).await.unwrap().len(), 1);
    assert!(matches!(job.process(handler.clone()).await.unwrap(), Some(Processed::Retried(_))));
    assert_eq!(*seen.lock().unwrap(), [(0, 1), (1, 1), (1, 2), (1, 1)]);
}

/// Cancel against completion: the cancel's write is conditional on the task
/// not having ended, and it releases the lease and bumps the fence, so the
/// holder's completion is rejected after it. Every interleaving (the cancel
/// started at each millisecond of a run whose store takes a millisecond per
/// call) gives exactly one final state: cancelled, or completed.
#[tokio::test(start_paused = true)]
async fn a_cancel_racing_a_completion_leaves_one_final_state() {
    let (mut cancels_won, mut completions_won) = (0, 0);
    for offset_ms in 0..40_u64 {
        let store = MemoryStore::new();
        store.faults().set_latency(Duration::from_millis(1));
        let q = Queue::new(store.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
        let a = Agent::builder(store.clone(), "w", "tasks").ttl(Duration::from_secs(3)).build().unwrap();
        let run = tokio::spawn(async move {
            a.process(|_t: Task| async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                true
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        let cancelled = q.cancel_ids(std::slice::from_ref(&id)).await.unwrap();
        let processed = run.await.unwrap().unwrap();
        let d = data(&store, &id).await;
        assert_eq!(d.get_bool("complete").ok(), Some(true), "offset {offset_ms}: the task ended: {d}");
        let is_cancelled = d.get_bool("cancelled").ok() == Some(true);
        match processed {
            Some(Processed::Completed(_)) => {
                assert!(cancelled.is_empty() && !is_cancelled, "offset {offset_ms}: completed and cancelled: {d}");
                assert_eq!(d.get_bool("error_encountered").ok(), Some(false), "offset {offset_ms}: {d}");
                completions_won += 1;
            }
            Some(Processed::Stale(_)) | None => {
                assert!(cancelled == [id.clone()] && is_cancelled, "offset {offset_ms}: the cancel lost: {d}");
                cancels_won += 1;
            }
            other => panic!("offset {offset_ms}: {other:?}"),
        }
    }
    assert!(cancels_won > 0 && completions_won > 0, "both orders happened: {cancels_won} / {completions_won}");
}

/// The store operations of plain tasks, once the agent is warm: a claim and
/// an outcome each, nothing else (no query for follow-ups a first run cannot
/// have); the agent's list of candidates, read by the second claim (the
/// first takes the head), serves the next claims without another read (this fails if a list were read per
/// claim; claims without lists at all would pass it too).
#[tokio::test(start_paused = true)]
async fn a_plain_task_costs_a_claim_and_an_outcome() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    q.enqueue_all(&(0..9).map(|n| NewTask::new("w", doc! {"n": n})).collect::<Vec<_>>()).await.unwrap();
    // The first claim takes the head by query, the second reads the list.
    for _ in 0..2 {
        assert!(matches!(agent.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
    }
    let before = store.operation_count();
    for _ in 2..9 {
        assert!(matches!(agent.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
    }
    assert_eq!(store.operation_count() - before, 2 * 7, "one claim, one outcome write per task");
}

/// The control collection also holds permits and rate limits, written at
/// every task start: those writes cost an idle agent's subscription no read
/// and wake nobody (a wake-up would make an idle agent probe for a permit,
/// which writes to the control collection again: a loop). A pause still is
/// read.
#[tokio::test(start_paused = true)]
async fn control_writes_not_about_a_pause_cost_an_idle_agent_nothing() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").poll_interval(Duration::from_secs(60)).build().unwrap();
    let worker = tokio::spawn({
        let agent = agent.clone();
        async move { agent.work(|_t: Task| async { true }).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let control = q.control_collection().unwrap();
    let before = store.operation_count();
    for i in 0..20 {
        let w = Write::new(Condition::Always, store_trait::Mutation::new().set("n", i)).upsert();
        let key = Key::new(format!("permits:w:{}", i % 3)).unwrap();
        assert!(store.write(&control, &key, &w).await.unwrap().is_applied());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.operation_count() - before, 20, "only the writes themselves");
    // A pause document written without changing the paused names is read,
    // and wakes nobody.
    let before = store.operation_count();
    for _ in 0..5 {
        q.set_paused("other", false).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.operation_count() - before, 10, "each write and one read after it");
    q.set_paused("w", true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(store.operation_count() - before >= 12, "a change of the paused names is read");
    agent.shutdown();
    worker.await.unwrap().unwrap();
}

/// Pause delivery by change notification: an idle agent, which has read "not
/// paused" a moment ago, sees a pause as soon as the queue's control task has
/// read it after the notification (well within `CONTROL_REFRESH`), so a task
/// arriving then is not claimed; the resume wakes it at once (its poll interval
/// is a minute) and it claims the task.
#[tokio::test(start_paused = true)]
async fn a_pause_arrives_by_notification_and_a_resume_wakes_the_agent() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").poll_interval(Duration::from_secs(60)).build().unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let worker = tokio::spawn({
        let (agent, done) = (agent.clone(), done.clone());
        async move {
            agent
                .work(move |_t: Task| {
                    let done = done.clone();
                    async move {
                        done.fetch_add(1, Ordering::SeqCst);
                        true
                    }
                })
                .await
        }
    });
    let settle = || tokio::time::sleep(Duration::from_millis(20));
    settle().await;
    q.set_paused("w", true).await.unwrap();
    settle().await;
    q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    settle().await;
    assert_eq!(done.load(Ordering::SeqCst), 0, "the pause was seen before the task arrived");
    q.set_paused("w", false).await.unwrap();
    settle().await;
    assert_eq!(done.load(Ordering::SeqCst), 1, "the resume woke the idle agent");
    agent.shutdown();
    assert_eq!(worker.await.unwrap().unwrap().completed, 1);
}

/// Claims by key from a list of candidates keep the whole claim filter: an
/// agent whose list was read before another agent (on its own `Queue`, as in
/// another process) took and finished those tasks passes them over; every
/// task runs exactly once.
#[tokio::test(start_paused = true)]
async fn a_candidate_taken_by_another_claimer_is_passed_over() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue_all(&(0..10).map(|n| NewTask::new("w", doc! {}).id(format!("t{n}"))).collect::<Vec<_>>()).await.unwrap();
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = |runs: Arc<std::sync::Mutex<Vec<String>>>| {
        move |t: Task| {
            let runs = runs.clone();
            async move {
                runs.lock().unwrap().push(t.id().to_string());
                true
            }
        }
    };
    let first = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let second = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    // The first agent takes the head, then reads its list (t1..t9) and
    // claims t1 from it: its list now holds the other eight.
    for _ in 0..2 {
        assert!(first.process(handler(runs.clone())).await.unwrap().is_some());
    }
    for _ in 0..8 {
        assert!(second.process(handler(runs.clone())).await.unwrap().is_some());
    }
    assert_eq!(first.process(handler(runs.clone())).await.unwrap(), None, "a finished task was claimed again");
    let mut ran = runs.lock().unwrap().clone();
    ran.sort_unstable();
    assert_eq!(ran, (0..10).map(|n| format!("t{n}")).collect::<Vec<_>>());
}

/// A list of candidates is read again once it is `MAX_AGE` (1 s) old: a
/// task enqueued ahead of the list (a higher priority) is claimed next after
/// that, not after the list is spent.
#[tokio::test(start_paused = true)]
async fn an_old_candidate_list_is_read_again() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue_all(&(0..8).map(|n| NewTask::new("w", doc! {}).id(format!("low-{n}"))).collect::<Vec<_>>())
        .await
        .unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let next = || async {
        match agent.process(|_t: Task| async { true }).await.unwrap() {
            Some(Processed::Completed(k)) => k.to_string(),
            other => panic!("{other:?}"),
        }
    };
    // The head by query, then a list read.
    assert_eq!(next().await, "low-0");
    assert_eq!(next().await, "low-1");
    q.enqueue(NewTask::new("w", doc! {}).id("high").priority(9)).await.unwrap();
    assert_eq!(next().await, "low-2", "a fresh list is claimed from");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(next().await, "high");
}

/// Slots freed together are claimed together: tasks claimed in one batch end
/// a moment apart (here 0 to 3 ms, against a 5 ms round trip), so the first
/// one's outcome is written alone and the others' in the next group commit.
/// The work loop claims for the slot the first one freed once that second
/// write has landed, with the other three, in one batch claim: one claim and
/// two outcome writes per four tasks. Fails without the wait for the landing
/// (the freed slot is claimed alone, the four slots drift apart, and claims
/// and outcome writes go one or two at a time).
#[tokio::test(start_paused = true)]
async fn slots_freed_together_are_claimed_together() {
    let (_, calls) = busy_queue(32).await;
    let agent = Agent::builder(calls.clone(), "w", "tasks")
        .concurrency(4)
        .poll_interval(Duration::from_secs(60))
        .process_while(|l| l.completed < 32)
        .build()
        .unwrap();
    let log = agent
        .work(|t: Task| async move {
            let n = t.data().get_i32("n").unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(u64::from(n.unsigned_abs() % 4))).await;
            true
        })
        .await
        .unwrap();
    assert_eq!(log.completed, 32);
    let (claims, writes) = (calls.claims.load(Ordering::SeqCst), calls.write_batches.load(Ordering::SeqCst));
    // 8 rounds of 4 tasks: a claim each (the last finds nothing more), two
    // outcome writes each.
    assert!(claims <= 9, "{claims} claims for 32 tasks, four slots");
    assert!(writes <= 16, "{writes} outcome writes for 32 tasks, four slots");
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

/// Claims ahead of free slots (`ahead.rs`): a busy agent with short tasks
/// and a backlog (more ready than its list's window of 64) claims more than
/// its free slots and starts them as slots free, so it claims at most two
/// thirds as often as with `prefetch(0)`; every task runs once.
#[tokio::test(start_paused = true)]
async fn a_busy_agent_with_short_tasks_claims_ahead() {
    let mut claims = Vec::new();
    for prefetch in [None, Some(0)] {
        let (_, calls) = busy_queue(256).await;
        let mut b = Agent::builder(calls.clone(), "w", "tasks")
            .concurrency(4)
            .poll_interval(Duration::from_secs(60))
            .process_while(|l| l.completed < 256);
        if let Some(n) = prefetch {
            b = b.prefetch(n);
        }
        let log = b.build().unwrap().work(|_t: Task| async { true }).await.unwrap();
        assert_eq!((log.completed, log.tasks_processed), (256, 256), "prefetch {prefetch:?}");
        let asked = calls.asked_max.load(Ordering::SeqCst);
        assert_eq!(asked > 4, prefetch.is_none(), "prefetch {prefetch:?}: a claim asked for {asked}");
        claims.push(calls.claims.load(Ordering::SeqCst));
    }
    assert!(claims[0] * 3 <= claims[1] * 2, "claims with prefetch and without: {claims:?}");
}

/// Nothing is claimed ahead of tasks that run long (`ahead::SHORT_RUN`): a
/// task claimed ahead would wait a long run, while an idle peer could run it.
#[tokio::test(start_paused = true)]
async fn long_tasks_are_not_claimed_ahead() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue_all(&(0..24).map(|n| NewTask::new("w", doc! { "n": n })).collect::<Vec<_>>()).await.unwrap();
    let calls = Counted::new(store.clone());
    let log = Agent::builder(calls.clone(), "w", "tasks")
        .concurrency(4)
        .poll_interval(Duration::from_secs(60))
        .process_while(|l| l.completed < 24)
        .build()
        .unwrap()
        .work(|_t: Task| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            true
        })
        .await
        .unwrap();
    assert_eq!(log.completed, 24);
    assert_eq!(calls.asked_max.load(Ordering::SeqCst), 4, "no claim asked for more than the free slots");
}

/// A stopping agent runs the tasks it claimed ahead in its drain, as slots
/// free: none is left claimed, and each ran once.
#[tokio::test(start_paused = true)]
async fn a_stopping_agent_runs_the_tasks_it_claimed_ahead() {
    let (store, calls) = busy_queue(200).await;
    let agent = Agent::builder(calls.clone(), "w", "tasks")
        .concurrency(4)
        .poll_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let run = tokio::spawn({
        let agent = agent.clone();
        async move {
            agent
                .work(|_t: Task| async {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    true
                })
                .await
        }
    });
    // Stop once claims ahead happen (a claim asked for more than four).
    let ahead = async {
        while calls.asked_max.load(Ordering::SeqCst) <= 4 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), ahead).await.expect("no claim ahead within 10 s");
    tokio::time::sleep(Duration::from_millis(7)).await;
    agent.shutdown();
    let log = run.await.unwrap().unwrap();
    let c = Collection::new("tasks").unwrap();
    let all = store.find(&c, &Query::all()).await.unwrap();
    let done = all.iter().filter(|r| r.data().get_bool("complete").unwrap_or(false)).count();
    let held = all
        .iter()
        .filter(|r| r.data().get_bool("claimed").unwrap_or(false) && !r.data().get_bool("complete").unwrap_or(false))
        .count();
    assert_eq!(held, 0, "a task claimed and not run");
    assert_eq!(u64::try_from(done).unwrap(), log.completed);
    assert_eq!(log.tasks_processed, log.completed);
    assert!(done > 8 && done < 200, "{done} done");
}

/// Nothing is claimed ahead without a backlog (fewer ready tasks than a list's
/// window of 64, as at the end of a burst): idle peers share the last tasks.
#[tokio::test(start_paused = true)]
async fn without_a_backlog_nothing_is_claimed_ahead() {
    let (_, calls) = busy_queue(40).await;
    let log = Agent::builder(calls.clone(), "w", "tasks")
        .concurrency(4)
        .poll_interval(Duration::from_secs(60))
        .process_while(|l| l.completed < 40)
        .build()
        .unwrap()
        .work(|_t: Task| async { true })
        .await
        .unwrap();
    assert_eq!(log.completed, 40);
    assert_eq!(calls.asked_max.load(Ordering::SeqCst), 4, "no claim asked for more than the free slots");
}

/// An agent stopped by `process_while` gives back the tasks it claimed ahead,
/// unstarted, instead of running them past what it was asked for; another
/// agent then runs every task left, each once.
#[tokio::test(start_paused = true)]
async fn process_while_gives_back_the_tasks_claimed_ahead() {
    for stop_at in [100_u64, 101, 102, 103] {
        let (store, calls) = busy_queue(256).await;
        let first = Agent::builder(calls.clone(), "w", "tasks")
            .concurrency(4)
            .poll_interval(Duration::from_secs(60))
            .process_while(move |l| l.completed < stop_at)
            .build()
            .unwrap()
            .work(|_t: Task| async { true })
            .await
            .unwrap();
        assert!(calls.asked_max.load(Ordering::SeqCst) > 4, "claims ahead happened");
        // At the stop, at most the four tasks in flight finish.
        assert!(first.tasks_processed < stop_at + 4, "stop at {stop_at}: {} run", first.tasks_processed);
        let rest = 256 - first.completed;
        // A task given back unstarted was not tried: its next run is its first attempt.
        let retried = Arc::new(AtomicU64::new(0));
        let second = Agent::builder(store.clone(), "w", "tasks")
            .concurrency(4)
            .poll_interval(Duration::from_secs(60))
            .process_while(move |l| l.completed < rest)
            .build()
            .unwrap()
            .work({
                let retried = retried.clone();
                move |t: Task| {
                    if t.attempt() != 1 {
                        retried.fetch_add(1, Ordering::SeqCst);
                    }
                    async { true }
                }
            })
            .await
            .unwrap();
        assert_eq!((first.tasks_processed + second.tasks_processed, first.completed + second.completed), (256, 256));
        assert_eq!(retried.load(Ordering::SeqCst), 0, "stop at {stop_at}: tasks given back ran as later attempts");
    }
}

/// A stop while a claimed task waits for its start under the rate limit gives
/// the claim back unspent: the handler never ran, so the task's next run is
/// still its first attempt (a give-back must not use up its retries).
#[tokio::test(start_paused = true)]
async fn a_claim_given_back_before_its_rate_start_is_not_an_attempt() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue_all(&(0..3).map(|i| NewTask::new("r", doc! { "i": i })).collect::<Vec<_>>()).await.unwrap();
    let limited = Agent::builder(store.clone(), "r", "tasks")
        .concurrency(3)
        .rate_limit(1, Duration::from_secs(3600))
        .poll_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let worker = tokio::spawn({
        let a = limited.clone();
        async move { a.work(|_t: Task| async { true }).await.unwrap() }
    });
    // One task starts; the other two are claimed and wait for a start.
    tokio::time::sleep(Duration::from_secs(5)).await;
    limited.shutdown();
    let first = worker.await.unwrap();
    assert_eq!(first.tasks_processed, 1, "the limit lets one task start in the hour");
    // Given back unstarted, they are ready and unclaimed, not shown as lapsed.
    let stats = q.stats("r").await.unwrap();
    assert_eq!((stats.ready, stats.lapsed, stats.completed), (2, 0, 1), "{stats:?}");
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let rest = Agent::builder(store.clone(), "r", "tasks")
        .poll_interval(Duration::from_secs(60))
        .process_while(|l| l.completed < 2)
        .build()
        .unwrap()
        .work({
            let attempts = attempts.clone();
            move |t: Task| {
                attempts.lock().unwrap().push(t.attempt());
                async { true }
            }
        })
        .await
        .unwrap();
    assert_eq!(rest.completed, 2);
    assert_eq!(*attempts.lock().unwrap(), [1, 1], "the claims given back were counted as attempts");
}

/// After a pause, an insert's keyed claim that misses does not send the agent
/// back to sleep (`Woken`, `was_paused` in `claim.rs`): the claims while
/// paused saw nothing, so the tasks enqueued meanwhile are claimed at the
/// resume, whichever reaches the agent first, the resume or an insert. Here
/// the insert is of a task not yet due (its keyed claim misses); without
/// the rule, when the insert comes first, the task enqueued during the pause
/// waits for the 600 s poll. Repeated, since which comes first is the
/// runtime's choice.
#[tokio::test(start_paused = true)]
async fn tasks_enqueued_during_a_pause_run_at_the_resume() {
    for round in 0..12 {
        let store = MemoryStore::new();
        let queue = Queue::new(store.clone(), "tasks").unwrap();
        let agent =
            Agent::builder(store.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
        let (run, ran) = work_signalling(&agent);
        tokio::time::sleep(Duration::from_secs(1)).await;
        queue.set_paused("w", true).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        queue.enqueue(NewTask::new("w", doc! {"during": true})).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        queue.set_paused("w", false).await.unwrap();
        queue.enqueue(NewTask::new("w", doc! {}).delay(Duration::from_secs(3600))).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), ran.notified())
            .await
            .unwrap_or_else(|_| panic!("round {round}: the task enqueued during the pause waits"));
        agent.shutdown();
        assert_eq!(run.await.unwrap().unwrap().completed, 1);
    }
}

/// An idle agent wakes when another program moves a task's due time
/// forward (`claimable_changes`: the clause on `run_at`), not at the due
/// time it read when it went idle: without the clause, the task below waits
/// the hour it was first delayed by.
#[tokio::test(start_paused = true)]
async fn a_due_time_moved_forward_wakes_an_idle_agent() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = queue.enqueue(NewTask::new("w", doc! {}).delay(Duration::from_secs(3600))).await.unwrap();
    // Another program (an operator in a shell) makes the task due now.
    let now = Write::new(Condition::Always, store_trait::Mutation::new().set_now("run_at"));
    a_write_wakes_the_idle_agent(store, &id, now, "the due time moved").await;
}

/// A claim makes its task live again, whatever marked it for collection
/// before (an operator's write, an older version's): the handler runs with no
/// `gc_at` on its task, so a TTL pass never deletes a running task.
#[tokio::test(start_paused = true)]
async fn a_claim_clears_an_earlier_mark_for_collection() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let ttl = store_trait::Ttl::new(Duration::from_millis(1)).unwrap();
    let mark = Write::new(Condition::Always, store_trait::Mutation::new().gc_after(ttl));
    assert!(store.write(&coll(), &id, &mark).await.unwrap().is_applied());
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let handler = {
        let store = store.clone();
        move |t: Task| {
            let store = store.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                store.prune_ttl();
                store.peek(&coll(), t.id()).unwrap().record.is_some()
            }
        }
    };
    assert_eq!(agent.process(handler).await.unwrap(), Some(Processed::Completed(id)), "collected while it ran");
}

/// A task that ended is never claimed again, whatever another program
/// writes of its readiness: an operator's `ready: true` on a completed task
/// (the claim filter's `not_complete` clause; `Queue::requeue` is the way to
/// run it again). Without the clause it runs twice.
#[tokio::test(start_paused = true)]
async fn an_ended_task_marked_ready_by_another_program_is_not_run_again() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        move |_t: Task| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { true }
        }
    };
    assert_eq!(agent.process(handler.clone()).await.unwrap(), Some(Processed::Completed(id.clone())));
    let ready = Write::new(Condition::Always, store_trait::Mutation::new().set("ready", true));
    assert!(store.write(&coll(), &id, &ready).await.unwrap().is_applied());
    assert_eq!(agent.process(handler).await.unwrap(), None, "an ended task was claimed");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A task runs under a permit of its name's global concurrency: when the
/// permit's lease is lost (here taken away by a write), the handler's
/// cancellation fires, as for the loss of its claim, before another process
/// could take the permit and start a task beyond the limit.
#[tokio::test(start_paused = true)]
async fn a_lost_permit_cancels_its_task() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent =
        Agent::builder(store.clone(), "w", "tasks").ttl(Duration::from_secs(6)).global_concurrency(1).build().unwrap();
    let started = Arc::new(Notify::new());
    let run = tokio::spawn({
        let (agent, started) = (agent.clone(), started.clone());
        async move {
            // Completes when it saw the cancellation, fails for good when not.
            agent
                .process(move |t: Task| {
                    let started = started.clone();
                    async move {
                        started.notify_one();
                        tokio::time::timeout(Duration::from_secs(30), t.cancellation().cancelled()).await.is_ok()
                    }
                })
                .await
        }
    });
    started.notified().await;
    take_the_permit_away(&store).await;
    assert_eq!(run.await.unwrap().unwrap(), Some(Processed::Completed(id)), "the handler saw its permit's loss");
}

/// Takes the only permit of agent name `w` (global concurrency 1) away from
/// its holder, as another process would find it after a lapse: released, its
/// fence bumped. The holder's next renewal is rejected: the permit is lost.
async fn take_the_permit_away(store: &MemoryStore) {
    let taken = Write::new(Condition::Always, store_trait::Mutation::new().release().bump_fence());
    let permits = Collection::new("tasks_control").unwrap();
    assert!(store.write(&permits, &Key::new("permits:w#0").unwrap(), &taken).await.unwrap().is_applied());
}

/// A permit lost while its task ran is not used again: the agent's next task
/// runs under a fresh permit, its cancellation quiet. Two checks, each enough
/// alone: a task's lost permit is not kept for the next claim
/// (`return_permit`), and a claim takes no lost permit from those kept.
#[tokio::test(start_paused = true)]
async fn a_lost_permit_is_not_used_for_the_next_task() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("w", doc! {}).id("first").priority(1)).await.unwrap();
    q.enqueue(NewTask::new("w", doc! {}).id("second")).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks")
        .ttl(Duration::from_secs(6))
        .global_concurrency(1)
        .process_while(|l| l.tasks_processed < 2)
        .build()
        .unwrap();
    let (started, second_quiet) = (Arc::new(Notify::new()), Arc::new(AtomicUsize::new(0)));
    let handler = {
        let (started, second_quiet) = (started.clone(), second_quiet.clone());
        move |t: Task| {
            let (started, second_quiet) = (started.clone(), second_quiet.clone());
            async move {
                if t.id().to_string() == "first" {
                    started.notify_one();
                    tokio::time::timeout(Duration::from_secs(30), t.cancellation().cancelled()).await.unwrap();
                } else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if !t.cancellation().is_cancelled() {
                        second_quiet.fetch_add(1, Ordering::SeqCst);
                    }
                }
                true
            }
        }
    };
    let work = tokio::spawn({
        let agent = agent.clone();
        async move { agent.work(handler).await }
    });
    started.notified().await;
    take_the_permit_away(&store).await;
    assert_eq!(work.await.unwrap().unwrap().completed, 2);
    assert_eq!(second_quiet.load(Ordering::SeqCst), 1, "the second task ran under the lost permit");
}

/// A task's own attempt limit overrides the agent's: a task enqueued with
/// `max_attempts(2)` fails for good at its second failed attempt under an
/// agent that allows five.
#[tokio::test(start_paused = true)]
async fn a_tasks_own_attempt_limit_overrides_the_agents() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {}).max_attempts(2)).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").max_attempts(5).build().unwrap();
    let fail = |_t: Task| async { Outcome::failed("boom") };
    assert_eq!(agent.process(fail).await.unwrap(), Some(Processed::Retried(id.clone())));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(agent.process(fail).await.unwrap(), Some(Processed::Failed(id)));
}

/// Retries back off exponentially from the base up to the maximum, each delay
/// jittered by ±50%: with a base of 1 s and a maximum of 8 s, the fourth
/// retry waits at least 4 s (8 s − 50%), the sixth less than 12 s (8 s + 50%).
#[tokio::test(start_paused = true)]
async fn retry_delays_double_up_to_the_maximum() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks")
        .max_attempts(10)
        .backoff(Duration::from_secs(1), Duration::from_secs(8))
        .build()
        .unwrap();
    let mut delays = Vec::new();
    for _ in 0..6 {
        let fail = |_t: Task| async { Outcome::failed("boom") };
        assert_eq!(agent.process(fail).await.unwrap(), Some(Processed::Retried(id.clone())));
        let run_at = data(&store, &id).await.get_datetime("run_at").unwrap().timestamp_millis();
        let delay = Duration::from_millis(u64::try_from(run_at - store.now().await.unwrap().as_millis()).unwrap());
        delays.push(delay);
        tokio::time::sleep(delay + Duration::from_millis(1)).await;
    }
    assert!(delays[3] >= Duration::from_secs(4), "the fourth retry waits 8 s ± 50%: {delays:?}");
    assert!(delays[5] < Duration::from_secs(12), "capped at 8 s ± 50%: {delays:?}");
}

/// A task claimed ahead whose claim was lost before a slot freed is let go,
/// never started: another agent may hold it by then. The agent is cut off
/// from the store past its lease while its four slots are busy; the running
/// handlers see the loss and return, and none of the tasks it had claimed
/// ahead starts under its lost claim.
#[tokio::test(start_paused = true)]
async fn a_task_claimed_ahead_whose_claim_was_lost_never_starts() {
    let store = MemoryStore::new();
    store.faults().set_latency(Duration::from_millis(5));
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue_all(&(0..200).map(|n| NewTask::new("w", doc! { "n": n })).collect::<Vec<_>>()).await.unwrap();
    let client = store.client();
    let agent = Agent::builder(client.clone(), "w", "tasks")
        .concurrency(4)
        .ttl(Duration::from_secs(3))
        .poll_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let (runs, lost_at_start) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let handler = {
        let (runs, lost_at_start) = (runs.clone(), lost_at_start.clone());
        move |t: Task| {
            let (runs, lost_at_start) = (runs.clone(), lost_at_start.clone());
            async move {
                if t.cancellation().is_cancelled() {
                    lost_at_start.fetch_add(1, Ordering::SeqCst);
                }
                // From the 21st run on, each holds its slot until its claim is lost.
                if runs.fetch_add(1, Ordering::SeqCst) >= 20 {
                    t.cancellation().cancelled().await;
                }
                true
            }
        }
    };
    let work = tokio::spawn({
        let agent = agent.clone();
        async move { agent.work(handler).await }
    });
    while runs.load(Ordering::SeqCst) < 24 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let claimed = Query::eq(doc! { "claimed": true }).when(Condition::FieldEq("complete".into(), true.into()).negate());
    let held = store.count(&coll(), &claimed).await.unwrap();
    assert!(held > 4, "{held} claimed: none claimed ahead of the four running");
    client.set_partitioned(true);
    tokio::time::sleep(Duration::from_secs(10)).await;
    agent.shutdown();
    work.await.unwrap().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 24, "a task claimed ahead started under a lost claim");
    assert_eq!(lost_at_start.load(Ordering::SeqCst), 0);
}

/// Cancel leaves a fan-in step to its agents: neither a task waiting for its
/// follow-ups nor a follow-up something waits for is cancelled. A cancelled
/// last follow-up would end without telling its waiter, which would wait for
/// ever; a cancelled waiter would still be woken by its follow-ups.
#[tokio::test(start_paused = true)]
async fn a_fan_in_step_is_not_cancelled() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("split", doc! {}).id("job")).await.unwrap();
    let split = Agent::builder(store.clone(), "split", "tasks").build().unwrap();
    let part = Agent::builder(store.clone(), "part", "tasks").build().unwrap();
    let split_job = |t: Task| async move {
        match t.round() {
            0 => Outcome::done().follow_up(NewTask::new("part", doc! {})).wait_for_follow_ups(),
            _ => Outcome::done(),
        }
    };
    let job = Key::new("job").unwrap();
    assert_eq!(split.process(split_job).await.unwrap(), Some(Processed::Waiting(job.clone())));
    assert!(q.cancel(doc! {}).dry_run(true).await.unwrap().is_empty(), "nothing to cancel");
    assert!(q.cancel(doc! {}).await.unwrap().is_empty());
    assert!(part.process(|_t: Task| async { true }).await.unwrap().is_some());
    assert_eq!(split.process(split_job).await.unwrap(), Some(Processed::Completed(job)));
}

/// Requeue takes tasks failed for good and lapsed ones (claimed by an agent
/// whose lease lapsed), never a running one: its holder's claim is live, and
/// a requeue would take it away and run the task a second time.
#[tokio::test(start_paused = true)]
async fn requeue_leaves_a_running_task_alone() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let (run, started, finish) = a_held_run(&agent);
    started.notified().await;
    assert!(q.requeue(doc! {}).await.unwrap().is_empty(), "a running task is not requeued");
    finish.notify_one();
    assert_eq!(run.await.unwrap().unwrap(), Some(Processed::Completed(id)));
}

/// A requeue writes only over the state it read (`queue.rs`: `FenceIs` the
/// fence read): its attempts start over from that fence. Here operator X read
/// a failed task and its write is held back while operator Y requeues the
/// task, and an agent runs it and it fails again. X's write then finds a task
/// it did not read, and leaves it alone. Without the fence in the condition
/// X revives it, and its next run counts attempts from the fence X read: it
/// starts at attempt 3 of 1.
#[tokio::test(start_paused = true)]
async fn a_requeue_over_a_task_changed_since_it_was_read_is_not_applied() {
    let store = MemoryStore::new();
    let held = HoldBack::new(store.clone());
    let y = Queue::new(store.clone(), "tasks").unwrap();
    let x = Queue::new(held.clone(), "tasks").unwrap();
    let (id, _) = y.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").max_attempts(1).build().unwrap();
    let attempts: Arc<std::sync::Mutex<Vec<u64>>> = Arc::default();
    let failing = || {
        let attempts = attempts.clone();
        move |t: Task| {
            attempts.lock().unwrap().push(t.attempt());
            async { false }
        }
    };
    assert_eq!(agent.process(failing()).await.unwrap(), Some(Processed::Failed(id.clone())));
    held.hold_next(|_, op| matches!(op, Op::Write(w) if w.mutation.set.contains_key("round_fence")));
    let stale = tokio::spawn(async move { x.requeue(doc! {}).await });
    held.reached().await;
    assert_eq!(y.requeue(doc! {}).await.unwrap(), vec![id.clone()]);
    assert_eq!(agent.process(failing()).await.unwrap(), Some(Processed::Failed(id.clone())));
    held.open();
    assert!(stale.await.unwrap().unwrap().is_empty(), "a requeue written over a task it did not read");
    assert_eq!(agent.process(failing()).await.unwrap(), None, "nothing was requeued");
    assert_eq!(*attempts.lock().unwrap(), vec![1, 1], "each round starts at attempt 1");
}

/// Under a global concurrency limit an idle agent wakes at every change of
/// its queue, a completion included: a task ending anywhere frees a permit.
/// The only permit is held by another agent's run while a second task waits;
/// when that run ends, the idle agent takes the task at once, not at the
/// claim's lapse (a minute) or its next poll (ten minutes).
#[tokio::test(start_paused = true)]
async fn a_permit_freed_elsewhere_wakes_an_idle_limited_agent() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (first, _) = q.enqueue(NewTask::new("w", doc! {}).priority(1)).await.unwrap();
    q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let limited = || {
        Agent::builder(store.clone(), "w", "tasks")
            .global_concurrency(1)
            .poll_interval(Duration::from_secs(600))
            .build()
            .unwrap()
    };
    let (holder, idle) = (limited(), limited());
    let (held, started, finish) = a_held_run(&holder);
    started.notified().await;
    let (work, ran) = work_signalling(&idle);
    // The idle agent finds no free permit, and idles.
    tokio::time::sleep(Duration::from_secs(1)).await;
    finish.notify_one();
    assert_eq!(held.await.unwrap().unwrap(), Some(Processed::Completed(first)));
    tokio::time::timeout(Duration::from_secs(5), ran.notified()).await.expect("the freed permit is taken at once");
    idle.shutdown();
    assert_eq!(work.await.unwrap().unwrap().completed, 1);
}

/// Under a global limit an idle agent woken by an insert claims as usual after
/// the keyed claim of what was inserted (`Woken::then_claim_as_usual` in
/// `limits.rs`): its last claim may have found no free permit rather than no
/// task. Here the only permit is held by a process that died, so the agent
/// idles with a task of its own ready; the permit lapses (which writes
/// nothing), and a task of another name is inserted: without the usual
/// claim the agent claims nothing and its task waits for the 600 s poll.
#[tokio::test(start_paused = true)]
async fn a_limited_agent_woken_by_another_names_insert_claims_its_own_task() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    // A process takes the permit (10 s lease) and dies: cut off, it never
    // renews nor releases it.
    let dead = store.client();
    let lock =
        mongolock::Lock::builder(dead.clone(), "permits:w").collection("tasks_control").ttl(Duration::from_secs(10));
    let permit = mongolock::Semaphore::new(lock, 1).unwrap().try_acquire().await.unwrap().unwrap();
    dead.set_partitioned(true);
    std::mem::forget(permit);
    q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks")
        .global_concurrency(1)
        .poll_interval(Duration::from_secs(600))
        .build()
        .unwrap();
    let (work, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(11)).await;
    q.enqueue(NewTask::new("other", doc! {})).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), ran.notified()).await.expect("its own task runs at the wake-up");
    agent.shutdown();
    assert_eq!(work.await.unwrap().unwrap().completed, 1);
}

/// Recovery never starves under load: every sixteenth claim looks for lapsed
/// claims first. A crashed agent's task runs again while 40 ready tasks still
/// wait; without that turn it would wait until no task is ready (on a queue
/// that never empties, for ever).
#[tokio::test(start_paused = true)]
async fn a_lapsed_claim_is_recovered_while_ready_tasks_wait() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("w", doc! {}).id("crashed")).await.unwrap();
    let dead = Claim {
        query: Query::eq(doc! {"_id": "crashed"}),
        mutation: store_trait::Mutation::new()
            .grant("dead-agent", store_trait::Ttl::new(Duration::from_secs(2)).unwrap())
            .bump_fence()
            .set("ready", false)
            .set("claimed", true),
    };
    assert!(store.claim(&coll(), &dead).await.unwrap().is_some());
    tokio::time::sleep(Duration::from_secs(3)).await;
    q.enqueue_all(&(0..40).map(|i| NewTask::new("w", doc! {}).id(format!("t{i:02}"))).collect::<Vec<_>>())
        .await
        .unwrap();
    let order: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    // One task per claim (nothing claimed ahead): run n is claim n.
    let agent = Agent::builder(store.clone(), "w", "tasks")
        .prefetch(0)
        .process_while(|l| l.tasks_processed < 41)
        .build()
        .unwrap();
    let log = agent
        .work({
            let order = order.clone();
            move |t: Task| {
                order.lock().unwrap().push(t.id().to_string());
                async { true }
            }
        })
        .await
        .unwrap();
    assert_eq!(log.completed, 41);
    let order = order.lock().unwrap();
    let at = order.iter().position(|id| id == "crashed").unwrap();
    assert!(at < 16, "the lapsed claim ran as run {} of 41: {order:?}", at + 1);
}

/// A wake-up by an update reads the idle deadline afresh: the update may
/// have moved a due time sooner. Agent B's run fails and is retried in about
/// a second; idle agent A, woken by that write, finds it not yet due and
/// sleeps until it is, not until the deadline it had before (the lapse of
/// B's claim, a minute later).
#[tokio::test(start_paused = true)]
async fn a_retry_written_by_another_agent_runs_when_due() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent = || {
        Agent::builder(store.clone(), "w", "tasks")
            .poll_interval(Duration::from_secs(600))
            .backoff(Duration::from_secs(1), Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let (b, a) = (agent(), agent());
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let failing = tokio::spawn({
        let (started, finish) = (started.clone(), finish.clone());
        async move {
            b.process(move |_t: Task| {
                let (started, finish) = (started.clone(), finish.clone());
                async move {
                    started.notify_one();
                    finish.notified().await;
                    Outcome::failed("try again")
                }
            })
            .await
        }
    });
    started.notified().await;
    let (work, ran) = work_signalling(&a);
    // A finds the task held, and idles until B's claim could lapse.
    tokio::time::sleep(Duration::from_secs(1)).await;
    finish.notify_one();
    assert_eq!(failing.await.unwrap().unwrap(), Some(Processed::Retried(id)));
    tokio::time::timeout(Duration::from_secs(5), ran.notified()).await.expect("the retry runs when due");
    a.shutdown();
    assert_eq!(work.await.unwrap().unwrap().completed, 1);
}

/// An idle agent with change notifications sends nothing on a timer: no
/// poll (notifications and its due-time timer cover what a poll would find),
/// and no reread of the pause state once its queue has been quiet for half a
/// minute (`control.rs`). Over nine quiet minutes it makes no call at all;
/// its `recheck_interval` (10 min by default) brings one check, which finds
/// nothing and so starts no rereads of the pause state. Without
/// that, it claimed every 5 s (its `poll_interval`) and the pause state was
/// read every 750 ms: about 100 calls a minute.
#[tokio::test(start_paused = true)]
async fn an_idle_agent_makes_no_call_between_its_checks() {
    let store = MemoryStore::new();
    let held = HoldBack::new(store.clone());
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    // A matcher that never holds: it sees every get, write, find and claim.
    held.hold_next(move |_, _| {
        c.fetch_add(1, Ordering::SeqCst);
        false
    });
    let agent = Agent::builder(held.clone(), "w", "tasks").build().unwrap();
    let (run, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(40)).await;
    let before = calls.load(Ordering::SeqCst);
    assert!(before > 0, "the agent's first claims went through the counting store");
    tokio::time::sleep(Duration::from_secs(9 * 60)).await;
    assert_eq!(calls.load(Ordering::SeqCst) - before, 0, "calls in nine quiet minutes");
    tokio::time::sleep(Duration::from_secs(90)).await;
    let check = calls.load(Ordering::SeqCst) - before;
    assert!(check > 0, "no check at ten minutes");
    // The check found nothing, so it started no rereads of the pause state
    // (with them: 40 more calls, 30 s of one every 750 ms).
    assert!(check <= 8, "the check at ten minutes cost {check} calls");
    // Still woken at once by a task of its own.
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    queue.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), ran.notified()).await.expect("woken by the insert");
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1);
}

/// With no poll, nothing announces a claim that lapses: an idle agent woken
/// by an insert that another agent claimed first, and which that agent then
/// held as it died, takes the task when that claim lapses (`work.rs`: woken
/// by a change and claiming nothing, it reads its idle deadline again within
/// `poll_interval`), not at its 10-minute check.
#[tokio::test(start_paused = true)]
async fn a_task_lost_to_an_agent_that_died_runs_when_its_claim_lapses() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let coll = Collection::new("tasks").unwrap();
    let ttl = Duration::from_secs(10);
    let agent = Agent::builder(store.clone(), "w", "tasks").ttl(ttl).build().unwrap();
    let (run, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let dead = Claim {
        query: Query::eq(doc! {"agent_name": "w", "ready": true}),
        mutation: Mutation::new()
            .grant("dead-agent", Ttl::new(ttl).unwrap())
            .bump_fence()
            .set("ready", false)
            .set("claimed", true),
    };
    // The other agent claims the task before ours, woken by the insert,
    // takes its turn (it waits a few milliseconds to coalesce a burst).
    queue.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    assert!(store.claim(&coll, &dead).await.unwrap().is_some(), "the other agent claimed first");
    let sent = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(60), ran.notified()).await.expect("taken after the dead claim lapsed");
    let after = sent.elapsed();
    assert!(after >= ttl && after < ttl + Duration::from_secs(1), "run {after:?} after the insert");
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1);
}

/// A task inserted for later while its agent idles wakes the agent, which
/// cannot claim it yet: it runs when due, by the timer that the read of the
/// idle deadline a `poll_interval` after the wake-up set, not at the
/// 10-minute check.
#[tokio::test(start_paused = true)]
async fn a_delayed_task_inserted_while_idle_runs_when_due() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let (run, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let sent = tokio::time::Instant::now();
    queue.enqueue(NewTask::new("w", doc! {}).delay(Duration::from_secs(20))).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), ran.notified()).await.expect("ran when due");
    let after = sent.elapsed();
    assert!(after >= Duration::from_secs(20) && after < Duration::from_secs(21), "run {after:?} after the insert");
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1);
}
