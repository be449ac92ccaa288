//! An adversarial review of execution timeouts (#33), on the in-memory store
//! under paused time: what the feature promises, pushed at its edges.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, Document};
use mongoagent::{
    schedule::{Schedule, Schedules},
    Agent, NewTask, Outcome, Processed, Queue, Task,
};
use store_memory::MemoryStore;
use store_trait::{Collection, Key, Mutation, Store, Write};

const TTL: Duration = Duration::from_secs(2);

async fn doc_of(s: &MemoryStore, id: &str) -> Document {
    let coll = Collection::new("tasks").unwrap();
    s.get(&coll, &Key::new(id).unwrap()).await.unwrap().record.unwrap().into_data()
}

fn agent(s: &MemoryStore) -> mongoagent::AgentBuilder<MemoryStore> {
    Agent::builder(s.clone(), "t", "tasks")
        .ttl(TTL)
        .timeout(Duration::from_millis(200))
        .timeout_grace(Duration::from_millis(200))
        .backoff(Duration::from_millis(10), Duration::from_millis(10))
}

/// A handler that ignores its cancellation for ever (aborted at its grace).
async fn hang(runs: Arc<AtomicUsize>) -> Outcome {
    runs.fetch_add(1, Ordering::SeqCst);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A task whose every attempt hangs past its timeout and grace must still
/// end: with `max_attempts(1)` the abandoned attempt was its last, so it
/// fails for good ("timed out after …") when its claim lapses, and the
/// handler is not run a second time. Before the fix it ran again as attempt
/// 2 of 1, and again at every lapse, for ever (no outcome is ever written
/// by an abandoned attempt, so the limit was never checked).
#[tokio::test(start_paused = true)]
async fn an_abandoned_last_attempt_fails_for_good_without_running_again() {
    let s = MemoryStore::new();
    let q = Queue::new(s.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("t", doc! {}).id("hung").max_attempts(1)).await.unwrap();
    let a = agent(&s).build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        let r = runs.clone();
        match a.process(move |_t: Task| hang(r.clone())).await.unwrap() {
            Some(Processed::Abandoned(_)) | None => {}
            Some(Processed::Failed(k)) => {
                assert_eq!(k, id);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
        tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once: one attempt allowed");
    let d = doc_of(&s, "hung").await;
    assert_eq!(d.get_bool("complete").ok(), Some(true), "{d}");
    assert_eq!(d.get_bool("error_encountered").ok(), Some(true), "{d}");
    assert_eq!(d.get_str("last_error").ok(), Some("timed out after 200 ms"), "{d}");
}

/// With attempts left, an abandoned attempt is retried as the next one, and
/// its failure is visible while its claim lapses (`last_error`).
#[tokio::test(start_paused = true)]
async fn an_abandoned_attempt_with_attempts_left_runs_again() {
    let s = MemoryStore::new();
    let q = Queue::new(s.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("t", doc! {}).id("hung").max_attempts(2)).await.unwrap();
    let a = agent(&s).build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    assert_eq!(a.process(move |_t: Task| hang(r.clone())).await.unwrap(), Some(Processed::Abandoned(id.clone())));
    let d = doc_of(&s, "hung").await;
    assert_eq!(d.get_str("last_error").ok(), Some("timed out after 200 ms"), "told while it lapses: {d}");
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    let got = a.process(|t: Task| async move { t.attempt() == 2 }).await.unwrap();
    assert_eq!(got, Some(Processed::Completed(id)));
}

/// Under a global concurrency of 1, an abandoned task's permit lapses with
/// its claim: work the handler left running still counts against the limit.
/// Before the fix the permit went back at once, and another task of the
/// name started while the abandoned claim still held its task.
#[tokio::test(start_paused = true)]
async fn an_abandoned_tasks_permit_is_not_given_back_early() {
    let s = MemoryStore::new();
    let q = Queue::new(s.clone(), "tasks").unwrap();
    let (hung, _) = q.enqueue(NewTask::new("t", doc! {}).id("a").priority(9)).await.unwrap();
    let (next, _) = q.enqueue(NewTask::new("t", doc! {}).id("b")).await.unwrap();
    let a = agent(&s).global_concurrency(1).build().unwrap();
    let b = agent(&s).global_concurrency(1).build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    assert_eq!(a.process(move |_t: Task| hang(r.clone())).await.unwrap(), Some(Processed::Abandoned(hung)));
    // The abandoned claim has not lapsed: its permit must not be free.
    let early = b.process(|_t: Task| async { true }).await.unwrap();
    assert_eq!(early, None, "a second task started beside the abandoned one");
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    let mut done = Vec::new();
    for _ in 0..2 {
        match b.process(|_t: Task| async { true }).await.unwrap() {
            Some(Processed::Completed(k)) => done.push(k),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(done.contains(&next), "{done:?}");
}

/// `timeout_ms` written past the queue, of any type or value: never a panic
/// or a hang; a usable number is taken, anything else leaves the agent's.
#[tokio::test(start_paused = true)]
async fn foreign_timeout_values_are_read_or_ignored() {
    let s = MemoryStore::new();
    let q = Queue::new(s.clone(), "tasks").unwrap();
    let coll = Collection::new("tasks").unwrap();
    let cases: Vec<(Bson, Option<Duration>)> = vec![
        (Bson::Double(300.0), Some(Duration::from_millis(300))),
        (Bson::Int32(300), Some(Duration::from_millis(300))),
        (Bson::Double(f64::NAN), None),
        (Bson::Double(f64::INFINITY), None),
        (Bson::Double(-5.0), None),
        (Bson::Double(0.5), None),
        (Bson::Int64(i64::MAX), None),
        (Bson::Int64(i64::MIN), None),
        (Bson::Int64(0), None),
        (Bson::String("300".into()), None),
        (Bson::Null, None),
        (Bson::Document(doc! {"ms": 300}), None),
    ];
    let a = Agent::builder(s.clone(), "t", "tasks").ttl(TTL).build().unwrap();
    for (i, (v, want)) in cases.into_iter().enumerate() {
        let id = format!("f{i}");
        q.enqueue(NewTask::new("t", doc! {}).id(id.as_str())).await.unwrap();
        let w = Write::new(store_trait::Condition::Always, Mutation::new().set("timeout_ms", v.clone()));
        s.write(&coll, &Key::new(id.as_str()).unwrap(), &w).await.unwrap();
        let seen = Arc::new(parking_lot::Mutex::new(None));
        let got = seen.clone();
        let p = a.process(move |t: Task| {
            *got.lock() = Some(t.timeout());
            async { true }
        });
        assert!(matches!(p.await.unwrap(), Some(Processed::Completed(_))), "{v:?}");
        assert_eq!(*seen.lock(), Some(want), "timeout_ms {v:?}");
    }
}

/// A schedule's task template keeps its timeout: each tick's task carries
/// `timeout_ms`. Before the fix `Schedule::new` dropped it silently, so a
/// scheduled task ran without the limit its author set.
#[tokio::test(start_paused = true)]
async fn a_schedules_ticks_keep_the_tasks_timeout() {
    let s = MemoryStore::new();
    let schedules = Schedules::new(s.clone(), "tasks").unwrap();
    let task = NewTask::new("t", doc! {}).timeout(Duration::from_millis(1500));
    let sched = Schedule::every("sec", Duration::from_secs(1), task).unwrap();
    schedules.upsert(&sched).await.unwrap();
    let back = schedules.get("sec").await.unwrap().unwrap();
    assert_eq!(back.schedule, sched, "the definition round-trips");
    let h = schedules.scheduler().spawn();
    tokio::time::sleep(Duration::from_secs(3)).await;
    h.stop().await.unwrap();
    let ticks = schedules.queue().tasks(doc! { "schedule": "sec" }, None).await.unwrap();
    assert!(!ticks.is_empty());
    for r in ticks {
        assert_eq!(r.get_i64("timeout_ms"), Some(1500), "{:?}", r.data());
    }
}

/// Counters: an abandoned attempt counts as processed and as failed (its
/// attempt did fail), as a stopped one does.
#[tokio::test(start_paused = true)]
async fn an_abandoned_attempt_counts_as_a_failed_task() {
    let s = MemoryStore::new();
    let q = Queue::new(s.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("t", doc! {}).id("hung")).await.unwrap();
    let a = agent(&s).build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    assert!(matches!(a.process(move |_t: Task| hang(r.clone())).await.unwrap(), Some(Processed::Abandoned(_))));
    let c = a.counters();
    assert_eq!(c.tasks_processed, 1, "{c:?}");
    assert_eq!(c.failed_tasks, 1, "{c:?}");
}
