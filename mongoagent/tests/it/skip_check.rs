//! The `Overlap::Skip` check on the memory store under paused time: once a
//! pass has checked every tick, later passes read only the tick it named
//! and those from `last_tick` on, by `_id`, however many ended ticks are
//! kept; and that shortcut never lets a tick start beside an unfinished one
//! it could miss (a tick whose record failed, a tick enqueued under
//! `Overlap::Allow` before a change to `Skip`). More attacks on it, from an
//! outside review, are in `review_skip.rs`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use bson::doc;
use mongoagent::{
    schedule::{Overlap, Schedule, Schedules},
    Agent, NewTask, Processed, Task,
};
use store_memory::MemoryStore;
use store_test::{Call, Intercept, Intercepted, TestClock};
use store_trait::{Collection, StoreResult, StoreTime};

/// 2026-05-04T10:00:00.500Z: half a second past a whole minute.
const START: i64 = 1_777_888_800_500;
const MINUTE: Duration = Duration::from_secs(60);

fn memory() -> MemoryStore {
    MemoryStore::builder().clock(TestClock::starting_at(StoreTime::from_millis(START))).build()
}

/// Every minute, on queue "cron", under `overlap`.
fn minutely(name: &str, overlap: Overlap) -> Schedule {
    Schedule::every(name, MINUTE, NewTask::new(name, doc! {})).unwrap().overlap(overlap)
}

/// The schedule's ticks (task ids), in order.
async fn ticks<S: store_trait::Store + Clone>(s: &Schedules<S>, name: &str) -> Vec<String> {
    let mut v: Vec<String> =
        s.queue().tasks(doc! { "schedule": name }, None).await.unwrap().iter().map(|t| t.key().to_string()).collect();
    v.sort();
    v
}

/// Records the schedule's checks on the queue: how many ticks each read by
/// `_id` (`None`: every tick of the schedule).
#[derive(Debug, Default)]
struct Checks(Mutex<Vec<Option<usize>>>);

#[async_trait::async_trait]
impl<S: store_trait::Store> Intercept<S> for Checks {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        if let (Some("cron"), Call::Find(q)) = (coll.map(Collection::as_str), call) {
            if q.filter.contains_key("schedule") {
                self.0.lock().unwrap().push(q.keys.as_ref().map(Vec::len));
            }
        }
        Ok(())
    }
}

/// Fails every write to `cron_schedules` that sets `last_tick`, unapplied,
/// while `on` is set.
#[derive(Debug, Default)]
struct FailRecord(Mutex<bool>);

#[async_trait::async_trait]
impl<S: store_trait::Store> Intercept<S> for FailRecord {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        if let (Some(c), Call::Write(_, w)) = (coll, call) {
            if *self.0.lock().unwrap() && c.as_str() == "cron_schedules" && w.mutation.set.contains_key("last_tick") {
                return Err(store_trait::StoreError::backend(store_trait::FaultKind::Unreachable, "connection reset"));
            }
        }
        Ok(())
    }
}

/// Starts the next task and holds it until the returned `Notify` is
/// notified; the join handle gives what `process` returned.
async fn start_held(
    agent: &Agent<MemoryStore>,
) -> (Arc<Notify>, tokio::task::JoinHandle<Result<Option<Processed>, mongoagent::AgentError>>) {
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

async fn complete_one(agent: &Agent<MemoryStore>) {
    assert!(matches!(agent.process(|_: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
}

/// A minute-by-minute Skip schedule whose ticks all end: its first check
/// reads the schedule's unfinished ticks, every later one a few ids, while the
/// ended ticks kept grow to a hundred; and each tick is still enqueued.
#[tokio::test(start_paused = true)]
async fn a_settled_schedule_reads_a_few_ticks_by_id() {
    let store = memory();
    let counting: Intercepted<MemoryStore, Checks> = Intercepted::new(store.clone());
    let s = Schedules::new(counting.clone(), "cron").unwrap();
    s.upsert(&minutely("m", Overlap::Skip)).await.unwrap();
    let agent = Agent::builder(store.clone(), "m", "cron").build().unwrap();
    for _ in 0..100 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
        complete_one(&agent).await;
    }
    let checks = counting.0.lock().unwrap().clone();
    assert_eq!(ticks(&s, "m").await.len(), 100, "every tick ran");
    assert_eq!(checks.len(), 100, "one check a pass: {checks:?}");
    assert_eq!(checks[0], None, "the first check reads the schedule's ticks");
    assert!(checks[1..].iter().all(|k| matches!(k, Some(n) if *n <= 2)), "later ones a few ids: {checks:?}");
}

/// A tick enqueued by a pass whose record of it failed, and still running,
/// is waited for: the next tick, a minute later, is skipped.
#[tokio::test(start_paused = true)]
async fn an_unrecorded_running_tick_is_waited_for() {
    let store = memory();
    let failing: Intercepted<MemoryStore, FailRecord> = Intercepted::new(store.clone());
    let s = Schedules::new(failing.clone(), "cron").unwrap();
    s.upsert(&minutely("u", Overlap::Skip)).await.unwrap();
    let agent = Agent::builder(store.clone(), "u", "cron").ttl(Duration::from_secs(600)).build().unwrap();
    // Tick 1 runs and ends: the schedule is settled.
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    complete_one(&agent).await;
    // Tick 2 is enqueued, its record fails, and it starts (and keeps running).
    tokio::time::sleep(MINUTE).await;
    *failing.0.lock().unwrap() = true;
    assert!(s.scheduler().pass().await.is_err(), "the record failed");
    *failing.0.lock().unwrap() = false;
    let (hold, running) = start_held(&agent).await;
    assert_eq!(ticks(&s, "u").await.len(), 2);
    // A minute later: tick 3 is due, and tick 2 has not ended.
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    assert_eq!(ticks(&s, "u").await.len(), 2, "tick 3 was skipped while tick 2 runs");
    hold.notify_one();
    assert!(matches!(running.await.unwrap().unwrap(), Some(Processed::Completed(_))));
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    assert_eq!(ticks(&s, "u").await.len(), 3, "tick 4 runs once tick 2 ended");
}

/// A tick enqueued under `Overlap::Allow` and still running when the
/// schedule changes to `Skip` is waited for, though the schedule had been
/// settled under `Skip` before and the last tick enqueued has ended.
#[tokio::test(start_paused = true)]
async fn a_change_to_skip_waits_for_the_ticks_allow_enqueued() {
    let store = memory();
    let s = Schedules::new(store.clone(), "cron").unwrap();
    s.upsert(&minutely("a", Overlap::Skip)).await.unwrap();
    let agent = Agent::builder(store.clone(), "a", "cron").build().unwrap();
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    complete_one(&agent).await;
    // Under Allow, two ticks are enqueued and not run.
    s.upsert(&minutely("a", Overlap::Allow)).await.unwrap();
    for _ in 0..2 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
    }
    assert_eq!(ticks(&s, "a").await.len(), 3);
    // The first of them runs on; the second (the last enqueued) ends.
    let (hold, running) = start_held(&agent).await;
    complete_one(&agent).await;
    // Back to Skip: nothing starts while the first runs.
    s.upsert(&minutely("a", Overlap::Skip)).await.unwrap();
    for _ in 0..3 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
    }
    assert_eq!(ticks(&s, "a").await.len(), 3, "no tick while an Allow tick runs");
    hold.notify_one();
    assert!(matches!(running.await.unwrap().unwrap(), Some(Processed::Completed(_))));
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    assert_eq!(ticks(&s, "a").await.len(), 4, "the next tick once it ended");
}

/// Holds the first call of one kind on one collection (once armed) until
/// `release` is notified; `reached` is notified when it holds.
#[derive(Debug, Default)]
struct HoldFirst {
    armed: Mutex<Option<(&'static str, &'static str)>>,
    reached: Notify,
    release: Notify,
}

#[async_trait::async_trait]
impl<S: store_trait::Store> Intercept<S> for HoldFirst {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        let kind = match call {
            Call::Get(_) => "get",
            Call::InsertMany(_) => "insert",
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

/// A pass that reached the schedule late (held before its check) while
/// another, later, enqueued and recorded a newer tick, reads the schedule
/// again before its check, and enqueues nothing beside that tick.
#[tokio::test(start_paused = true)]
async fn a_pass_that_reaches_the_schedule_late_reads_it_again() {
    let store = memory();
    let late: Intercepted<MemoryStore, HoldFirst> = Intercepted::new(store.clone());
    let b = Schedules::new(late.clone(), "cron").unwrap();
    let c = Schedules::new(store.clone(), "cron").unwrap();
    c.upsert(&minutely("x", Overlap::Skip)).await.unwrap();
    let agent = Agent::builder(store.clone(), "x", "cron").ttl(Duration::from_secs(3600)).build().unwrap();
    tokio::time::sleep(MINUTE).await;
    c.scheduler().pass().await.unwrap();
    complete_one(&agent).await;
    // B's pass at tick 2 is held before it reads the schedule again.
    tokio::time::sleep(MINUTE).await;
    *late.armed.lock().unwrap() = Some(("cron_schedules", "get"));
    let pass_b = tokio::spawn(async move { b.scheduler().pass().await });
    tokio::time::timeout(Duration::from_secs(30), late.reached.notified())
        .await
        .expect("the pass reads the schedule again before its check");
    // C, a minute later, enqueues tick 3, which starts.
    tokio::time::sleep(MINUTE).await;
    c.scheduler().pass().await.unwrap();
    let (hold, running) = start_held(&agent).await;
    late.release.notify_one();
    pass_b.await.unwrap().unwrap();
    let open = unfinished(&c, "x").await;
    hold.notify_one();
    running.await.unwrap().unwrap();
    assert_eq!(open.len(), 1, "nothing enqueued beside tick 3: {open:?}");
}

/// A pass held between its check and its insert (a stall the check cannot
/// see) inserts tick 2 after another pass enqueued and recorded tick 3: its
/// record is refused, and it withdraws the schedule's `only_open`, so that
/// while tick 2 runs, later passes (which would read only tick 3 and what
/// follows) read every unfinished tick and skip.
#[tokio::test(start_paused = true)]
async fn a_tick_inserted_late_is_not_hidden_from_later_passes() {
    let store = memory();
    let late: Intercepted<MemoryStore, HoldFirst> = Intercepted::new(store.clone());
    let b = Schedules::new(late.clone(), "cron").unwrap();
    let c = Schedules::new(store.clone(), "cron").unwrap();
    c.upsert(&minutely("y", Overlap::Skip)).await.unwrap();
    let agent = Agent::builder(store.clone(), "y", "cron").ttl(Duration::from_secs(3600)).build().unwrap();
    tokio::time::sleep(MINUTE).await;
    c.scheduler().pass().await.unwrap();
    complete_one(&agent).await;
    tokio::time::sleep(MINUTE).await;
    *late.armed.lock().unwrap() = Some(("cron", "insert"));
    let pass_b = tokio::spawn(async move { b.scheduler().pass().await });
    late.reached.notified().await;
    // C enqueues tick 3, which runs and ends.
    tokio::time::sleep(MINUTE).await;
    c.scheduler().pass().await.unwrap();
    complete_one(&agent).await;
    // B's insert of tick 2 lands; tick 2 starts.
    late.release.notify_one();
    pass_b.await.unwrap().unwrap();
    let (hold, running) = start_held(&agent).await;
    for _ in 0..2 {
        tokio::time::sleep(MINUTE).await;
        c.scheduler().pass().await.unwrap();
    }
    let open = unfinished(&c, "y").await;
    hold.notify_one();
    running.await.unwrap().unwrap();
    assert_eq!(open.len(), 1, "nothing enqueued while tick 2 runs: {open:?}");
}

/// The schedule's tasks not ended.
async fn unfinished<S: store_trait::Store + Clone>(s: &Schedules<S>, name: &str) -> Vec<String> {
    let all = s.queue().tasks(doc! { "schedule": name }, None).await.unwrap();
    all.iter().filter(|t| t.data().get_bool("complete").ok() != Some(true)).map(|t| t.key().to_string()).collect()
}
