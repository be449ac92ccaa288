//! What the tests of schedules' overlap on the memory store share: a store
//! and a minute-by-minute schedule under paused time, readers of its ticks,
//! a task held while it runs, and interceptors that fail or hold the
//! scheduler's calls.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::doc;
use mongoagent::{
    schedule::{Overlap, Pass, Schedule, Schedules},
    Agent, AgentError, NewTask, Processed, Task,
};
use store_memory::MemoryStore;
use store_test::{Call, Intercept, Intercepted, TestClock};
use store_trait::{Collection, Store, StoreResult, StoreTime};
use tokio::sync::Notify;

/// 2026-05-04T10:00:00.500Z: half a second past a whole minute.
const START: i64 = 1_777_888_800_500;
pub(crate) const MINUTE: Duration = Duration::from_secs(60);

pub(crate) fn memory() -> MemoryStore {
    MemoryStore::builder().clock(TestClock::starting_at(StoreTime::from_millis(START))).build()
}

/// Every minute, on the schedules' queue, under `overlap`.
pub(crate) fn minutely(name: &str, overlap: Overlap) -> Schedule {
    Schedule::every(name, MINUTE, NewTask::new(name, doc! {})).unwrap().overlap(overlap)
}

/// The schedule's ticks (task ids), in order.
pub(crate) async fn ticks<S: Store + Clone>(s: &Schedules<S>, name: &str) -> Vec<String> {
    let mut v: Vec<String> =
        s.queue().tasks(doc! { "schedule": name }, None).await.unwrap().iter().map(|t| t.key().to_string()).collect();
    v.sort();
    v
}

/// The schedule's ticks not complete, in order.
pub(crate) async fn unfinished<S: Store + Clone>(s: &Schedules<S>, name: &str) -> Vec<String> {
    let all = s.queue().tasks(doc! { "schedule": name }, None).await.unwrap();
    let mut v: Vec<String> =
        all.iter().filter(|t| t.data().get_bool("complete").ok() != Some(true)).map(|t| t.key().to_string()).collect();
    v.sort();
    v
}

/// Whether `call` is a write to the definitions that records ticks (sets
/// `last_tick`).
fn records(coll: Option<&Collection>, call: &Call<'_>) -> bool {
    matches!((coll, call), (Some(c), Call::Write(_, w))
        if c.as_str() == "cron_schedules" && w.mutation.set.contains_key("last_tick"))
}

/// Fails every write that records ticks, unapplied, while on.
#[derive(Debug, Default)]
pub(crate) struct FailRecord(pub(crate) Mutex<bool>);

#[async_trait::async_trait]
impl<S: Store> Intercept<S> for FailRecord {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        if *self.0.lock().unwrap() && records(coll, &call) {
            return Err(store_trait::StoreError::backend(store_trait::FaultKind::Unreachable, "connection reset"));
        }
        Ok(())
    }
}

/// Holds the first call of one kind on one collection, once armed, until
/// `release` is notified; `reached` is notified when it holds. The kinds:
/// `"get"`, `"insert"` (many) and `"record"` (a write that sets `last_tick`).
#[derive(Debug, Default)]
pub(crate) struct HoldFirst {
    pub(crate) armed: Mutex<Option<(&'static str, &'static str)>>,
    pub(crate) reached: Notify,
    pub(crate) release: Notify,
}

#[async_trait::async_trait]
impl<S: Store> Intercept<S> for HoldFirst {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        let kind = match call {
            Call::Get(_) => "get",
            Call::InsertMany(_) => "insert",
            _ if records(coll, &call) => "record",
            _ => return Ok(()),
        };
        let hold = {
            let mut armed = self.armed.lock().unwrap();
            let hit = *armed == Some((coll.map_or("", Collection::as_str), kind));
            if hit {
                *armed = None;
            }
            hit
        };
        if hold {
            self.reached.notify_one();
            self.release.notified().await;
        }
        Ok(())
    }
}

pub(crate) type Running = tokio::task::JoinHandle<Result<Option<Processed>, AgentError>>;

/// Starts the next task and holds it until the returned `Notify` is
/// notified; the join handle gives what `process` returned.
pub(crate) async fn start_held(agent: &Agent<MemoryStore>) -> (Arc<Notify>, Running) {
    let (started, hold) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let running = {
        let (agent, started, hold) = (agent.clone(), started.clone(), hold.clone());
        tokio::spawn(async move {
            agent
                .process(move |_: Task| {
                    let (started, hold) = (started.clone(), hold.clone());
                    async move {
                        started.notify_one();
                        hold.notified().await;
                        true
                    }
                })
                .await
        })
    };
    started.notified().await;
    (hold, running)
}

/// Runs the next task to completion.
pub(crate) async fn complete_one(agent: &Agent<MemoryStore>) {
    assert!(matches!(agent.process(|_: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
}

/// What a held task's schedule has not ended while it runs; the task is then
/// let end.
pub(crate) async fn unfinished_while_held<S: Store + Clone>(
    s: &Schedules<S>,
    name: &str,
    (hold, running): (Arc<Notify>, Running),
) -> Vec<String> {
    let open = unfinished(s, name).await;
    hold.notify_one();
    running.await.unwrap().unwrap();
    open
}

/// A schedule with two schedulers, one whose calls `late` can hold, one
/// unhindered, and an agent of its ticks.
pub(crate) struct Race {
    pub(crate) late: Intercepted<MemoryStore, HoldFirst>,
    pub(crate) on_time: Schedules<MemoryStore>,
    pub(crate) agent: Agent<MemoryStore>,
    held: Schedules<Intercepted<MemoryStore, HoldFirst>>,
}

/// A settled Skip schedule: its first tick has run and ended.
pub(crate) async fn settled(name: &str) -> Race {
    let r = Race::new(name, Overlap::Skip).await;
    tokio::time::sleep(MINUTE).await;
    r.on_time.scheduler().pass().await.unwrap();
    complete_one(&r.agent).await;
    r
}

impl Race {
    /// Every minute under `overlap`; no tick has come yet.
    pub(crate) async fn new(name: &str, overlap: Overlap) -> Self {
        let store = memory();
        let late: Intercepted<MemoryStore, HoldFirst> = Intercepted::new(store.clone());
        let held = Schedules::new(late.clone(), "cron").unwrap();
        let on_time = Schedules::new(store.clone(), "cron").unwrap();
        on_time.upsert(&minutely(name, overlap)).await.unwrap();
        let agent = Agent::builder(store, name, "cron").ttl(Duration::from_secs(3600)).build().unwrap();
        Race { late, on_time, agent, held }
    }

    /// Starts a pass of the held scheduler and returns once it holds at its
    /// first call of `kind` on `coll` (see [`HoldFirst`]); `release` lets it
    /// go on.
    pub(crate) async fn held_pass(
        &self,
        coll: &'static str,
        kind: &'static str,
    ) -> tokio::task::JoinHandle<Result<Pass, AgentError>> {
        *self.late.armed.lock().unwrap() = Some((coll, kind));
        let held = self.held.clone();
        let pass = tokio::spawn(async move { held.scheduler().pass().await });
        tokio::time::timeout(Duration::from_secs(30), self.late.reached.notified())
            .await
            .unwrap_or_else(|_| panic!("the pass makes a {kind} call on {coll}"));
        pass
    }

    pub(crate) fn release(&self) {
        self.late.release.notify_one();
    }
}
