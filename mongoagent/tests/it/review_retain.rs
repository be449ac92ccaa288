//! Review of `mongocoord cron --retain` at the library level (the CLI's cron
//! is a `Scheduler::only` plus an agent built with `retain_finished`): on the
//! memory store under paused time, with `MemoryStore::prune_ttl` standing in
//! for the server's TTL monitor. Retention deletes ended ticks after their
//! time and nothing else; a tick whose task is kept is never enqueued twice.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use mongoagent::{
    schedule::{Missed, Overlap, Schedule, Schedules},
    Agent, NewTask, Outcome, Processed, Queue, Task,
};
use store_memory::MemoryStore;
use store_test::{Call, Intercept, Intercepted, TestClock};
use store_trait::{Collection, Store, StoreResult, StoreTime};
use tokio::sync::{Notify, Semaphore};

fn memory_at(ms: i64) -> MemoryStore {
    MemoryStore::builder().clock(TestClock::starting_at(StoreTime::from_millis(ms))).build()
}

/// The shortest retention `mongocoord cron --retain` takes.
const RETAIN: Duration = Duration::from_secs(3600);

/// 2026-05-04T10:00:00.500Z: half a second past a whole minute.
const START: i64 = 1_777_888_800_500;

async fn ids<S: Store + Clone>(q: &Queue<S>, filter: bson::Document) -> Vec<String> {
    let mut v: Vec<String> = q.tasks(filter, None).await.unwrap().iter().map(|t| t.key().to_string()).collect();
    v.sort();
    v
}

/// A cron-like agent: the schedule's name as agent name, `retain` as `cron --retain`.
fn cron_agent(store: &MemoryStore, name: &str, retain: Option<Duration>) -> Agent<MemoryStore> {
    let mut b = Agent::builder(store.clone(), name, "cron").max_attempts(1);
    if let Some(d) = retain {
        b = b.retain_finished(d);
    }
    b.build().unwrap()
}

/// An ended tick is deleted once its retention has passed (not before), and
/// nothing else is: not a held tick (`Overlap::Queue`), not a tick running,
/// not a tick failed with attempts left, not the tasks of another queue, not
/// the tasks of another schedule run without retention.
#[tokio::test(start_paused = true)]
async fn retention_deletes_ended_ticks_only_after_their_time_and_nothing_else() {
    let store = memory_at(START);
    let s = Schedules::new(store.clone(), "cron").unwrap();
    let q = s.queue().clone();
    // "keep": every 10 s, one at a time (Queue: later ticks are held).
    let keep = Schedule::every("keep", Duration::from_secs(10), NewTask::new("keep", doc! {}))
        .unwrap()
        .overlap(Overlap::Queue);
    s.upsert(&keep).await.unwrap();
    // "other": another schedule on the queue whose line keeps ticks for ever.
    let other = Schedule::every("other", Duration::from_secs(10), NewTask::new("other", doc! {}))
        .unwrap()
        .overlap(Overlap::Allow);
    s.upsert(&other).await.unwrap();
    // Another queue's task of the same agent name, ended by an agent without retention.
    let elsewhere = Queue::new(store.clone(), "elsewhere").unwrap();
    elsewhere.enqueue(NewTask::new("keep", doc! {}).id("elsewhere-1")).await.unwrap();
    let elsewhere_agent = Agent::builder(store.clone(), "keep", "elsewhere").build().unwrap();
    assert!(matches!(elsewhere_agent.process(|_: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));

    let retain = Duration::from_secs(60);
    let agent = cron_agent(&store, "keep", Some(retain));
    let other_agent = cron_agent(&store, "other", None);

    // Tick 1: runs and completes.
    tokio::time::sleep(Duration::from_secs(10)).await;
    s.scheduler().pass().await.unwrap();
    assert!(matches!(agent.process(|_: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
    assert!(matches!(other_agent.process(|_: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
    let ended_1 = ids(&q, doc! { "schedule": "keep", "complete": true }).await;
    assert_eq!(ended_1.len(), 1);

    // Tick 2: let through and left running (its handler waits).
    tokio::time::sleep(Duration::from_secs(10)).await;
    s.scheduler().pass().await.unwrap();
    let go = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let running = {
        let (agent, go, started) = (agent.clone(), go.clone(), started.clone());
        tokio::spawn(async move {
            agent
                .process(move |_: Task| {
                    let (go, started) = (go.clone(), started.clone());
                    async move {
                        started.notify_one();
                        go.notified().await;
                        true
                    }
                })
                .await
                .unwrap()
        })
    };
    started.notified().await;
    // Ticks 3 and 4 are held behind it.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        s.scheduler().pass().await.unwrap();
    }
    let held = ids(&q, doc! { "schedule": "keep", "overlap_held": true }).await;
    assert_eq!(held.len(), 2, "two held ticks");

    // 59 s after tick 1 ended: nothing deleted yet.
    let since_end_1 = Duration::from_secs(30);
    tokio::time::sleep(retain - since_end_1 - Duration::from_secs(1)).await;
    store.prune_ttl();
    assert_eq!(ids(&q, doc! { "schedule": "keep", "complete": true }).await, ended_1, "deleted before its time");
    // Past its retention: tick 1 goes; the running and held ticks stay.
    tokio::time::sleep(Duration::from_secs(2)).await;
    store.prune_ttl();
    assert!(ids(&q, doc! { "schedule": "keep", "complete": true }).await.is_empty(), "tick 1 kept past its time");
    assert_eq!(ids(&q, doc! { "schedule": "keep", "overlap_held": true }).await, held, "held ticks deleted");
    let not_ended = ids(&q, doc! { "schedule": "keep" }).await;
    assert_eq!(not_ended.len(), 3, "the running tick and the held ones stay: {not_ended:?}");
    assert_eq!(ids(&q, doc! { "schedule": "other" }).await.len(), 4, "another schedule's ticks were deleted");
    assert_eq!(ids(&elsewhere, doc! {}).await, vec!["elsewhere-1".to_owned()], "another queue's task was deleted");

    // Even far past the retention, the running tick is not deleted.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    store.prune_ttl();
    let not_ended_now = ids(&q, doc! { "schedule": "keep" }).await;
    assert_eq!(not_ended_now, not_ended);
    go.notify_one();
    assert!(matches!(running.await.unwrap(), Some(Processed::Completed(_))));
}

/// A tick that failed with attempts left waits for its retry: it is not
/// ended, and retention leaves it alone; requeued after failing for good,
/// it is live again and kept.
#[tokio::test(start_paused = true)]
async fn a_tick_failed_with_attempts_left_or_requeued_is_not_deleted() {
    let store = memory_at(START);
    let s = Schedules::new(store.clone(), "cron").unwrap();
    let q = s.queue().clone();
    let sched =
        Schedule::every("f", Duration::from_secs(3600), NewTask::new("f", doc! {})).unwrap().overlap(Overlap::Allow);
    s.upsert(&sched).await.unwrap();
    let agent = Agent::builder(store.clone(), "f", "cron")
        .max_attempts(2)
        .backoff(Duration::from_secs(600), Duration::from_secs(600))
        .retain_finished(Duration::from_secs(1))
        .build()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    s.scheduler().pass().await.unwrap();
    let first = agent.process(|_: Task| async { Outcome::failed("exit 1") }).await.unwrap();
    assert!(matches!(first, Some(Processed::Retried(_))), "{first:?}");
    tokio::time::sleep(Duration::from_secs(60)).await;
    store.prune_ttl();
    assert_eq!(ids(&q, doc! { "schedule": "f" }).await.len(), 1, "a tick waiting for its retry was deleted");
    // The retry's backoff is 600 s with jitter (at most 1.5 times).
    tokio::time::sleep(Duration::from_secs(900)).await;
    let second = agent.process(|_: Task| async { Outcome::failed("exit 1") }).await.unwrap();
    assert!(matches!(second, Some(Processed::Failed(_))), "{second:?}");
    let revived = q.requeue(doc! { "schedule": "f" }).await.unwrap();
    assert_eq!(revived.len(), 1);
    tokio::time::sleep(Duration::from_secs(60)).await;
    store.prune_ttl();
    assert_eq!(ids(&q, doc! { "schedule": "f" }).await.len(), 1, "a requeued tick was deleted");
}

/// A schedule `name` ticking every minute with `cron`'s defaults (Skip,
/// Skip), its line's agent keeping ended ticks for [`RETAIN`], and the
/// store's clock at its first tick.
async fn minutely(store: &MemoryStore, name: &str) -> (Schedules<MemoryStore>, Agent<MemoryStore>) {
    let s = Schedules::new(store.clone(), "cron").unwrap();
    let sched = Schedule::every(name, Duration::from_secs(60), NewTask::new(name, doc! {}))
        .unwrap()
        .overlap(Overlap::Skip)
        .missed(Missed::Skip);
    s.upsert(&sched).await.unwrap();
    let agent = cron_agent(store, name, Some(RETAIN));
    tokio::time::sleep(Duration::from_secs(60)).await;
    (s, agent)
}

/// One `process` of `agent` whose handler counts its runs in `runs`.
async fn counting(
    agent: &Agent<MemoryStore>,
    runs: &Arc<AtomicUsize>,
) -> Result<Option<Processed>, mongoagent::AgentError> {
    let runs = runs.clone();
    agent
        .process(move |_: Task| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                true
            }
        })
        .await
}

/// Holds the first insert into the `cron` queue collection until opened.
#[derive(Debug)]
struct HoldInsert {
    armed: std::sync::atomic::AtomicBool,
    reached: Notify,
    open: Semaphore,
}

impl Default for HoldInsert {
    fn default() -> Self {
        HoldInsert { armed: true.into(), reached: Notify::new(), open: Semaphore::new(0) }
    }
}

#[async_trait::async_trait]
impl<S: Store> Intercept<S> for HoldInsert {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        if coll.is_some_and(|c| c.as_str() == "cron")
            && matches!(call, Call::InsertMany(_))
            && self.armed.swap(false, Ordering::SeqCst)
        {
            self.reached.notify_one();
            self.open.acquire().await.unwrap().forget();
        }
        Ok(())
    }
}

/// Exactly one run per tick rests on the tick's task id: "any number of
/// schedulers enqueue it idempotently" (docs/invariants.md, "Schedules"),
/// while the tick's task exists. Two `cron` processes of one schedule, with
/// the defaults (`Overlap::Skip`, `Missed::Skip`, a 60 s starting deadline)
/// and the shortest retention `cron` takes, an hour: process B's pass read
/// the schedule at the tick and is held (a SIGSTOP, a slow network) just
/// before its insert, while process A enqueues the tick and runs it. B's
/// insert then lands on the ended tick's task, still kept: a duplicate, and
/// the tick runs once. (Held past the retention and the deletion, B would
/// enqueue it again: the limit `cron`'s floor on `--retain` bounds.)
#[tokio::test(start_paused = true)]
async fn a_scheduler_held_for_less_than_the_retention_enqueues_no_tick_twice() {
    let store = memory_at(START);
    let (a, agent) = minutely(&store, "t").await;
    let runs = Arc::new(AtomicUsize::new(0));
    let run = || counting(&agent, &runs);

    // Process B: its pass reads the schedule, then waits at its insert.
    let held: Intercepted<MemoryStore, HoldInsert> = Intercepted::new(store.clone());
    let b = Schedules::new(held.clone(), "cron").unwrap().scheduler();
    let b_pass = tokio::spawn(async move { b.pass().await.unwrap().enqueued });
    held.reached.notified().await;

    // Process A: enqueues the tick, records it, runs it.
    assert_eq!(a.scheduler().pass().await.unwrap().enqueued, 1);
    assert!(matches!(run().await.unwrap(), Some(Processed::Completed(_))));
    // B is held for a while, less than the retention: the TTL monitor
    // deletes nothing.
    tokio::time::sleep(RETAIN - Duration::from_secs(60)).await;
    assert_eq!(store.prune_ttl(), 0, "the ended tick is kept for its retention");

    // B's insert lands, well within the starting deadline.
    held.open.add_permits(1);
    let b_inserted = b_pass.await.unwrap();
    let again = run().await.unwrap();
    let total = runs.load(Ordering::SeqCst);
    assert_eq!(
        total, 1,
        "tick ran {total} times: B's pass inserted {b_inserted} task(s) under the tick's id, and the agent then processed {again:?}"
    );
    assert_eq!(b_inserted, 0, "B's insert was a duplicate");
}

/// The same with one process: a pass whose record of `last_tick` failed
/// (a transient error after its insert; the pass is tried again) while the
/// tick ran re-enqueues the tick on its next pass, a duplicate while the
/// ended task is kept (the scheduler's cancel-safety note: "enqueues again
/// as duplicates and records"), so it does not run again.
#[tokio::test(start_paused = true)]
async fn a_pass_that_failed_to_record_its_tick_does_not_run_it_again() {
    let store = memory_at(START);
    let (s, agent) = minutely(&store, "u").await;
    let runs = Arc::new(AtomicUsize::new(0));
    let run = || counting(&agent, &runs);
    // The pass: find, now, the Skip check, insert, then the record
    // of last_tick, which fails here without being applied.
    let failing: Intercepted<MemoryStore, FailScheduleWrite> = Intercepted::new(store.clone());
    let first = Schedules::new(failing.clone(), "cron").unwrap().scheduler().pass().await;
    assert!(first.is_err(), "the record of last_tick failed");
    assert_eq!(s.queue().tasks(doc! { "schedule": "u" }, None).await.unwrap().len(), 1, "the tick was enqueued");
    assert!(matches!(run().await.unwrap(), Some(Processed::Completed(_))));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(store.prune_ttl(), 0, "kept for its retention");
    // The pass is tried again (the scheduler's backoff is at most 5 s).
    s.scheduler().pass().await.unwrap();
    let _ = run().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the tick ran twice");
}

/// Fails every write to `cron_schedules` that sets `last_tick`, unapplied.
#[derive(Debug, Default)]
struct FailScheduleWrite;

#[async_trait::async_trait]
impl<S: Store> Intercept<S> for FailScheduleWrite {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        if let (Some(c), Call::Write(_, w)) = (coll, call) {
            if c.as_str() == "cron_schedules" && w.mutation.set.contains_key("last_tick") {
                return Err(store_trait::StoreError::backend(store_trait::FaultKind::Unreachable, "connection reset"));
            }
        }
        Ok(())
    }
}
