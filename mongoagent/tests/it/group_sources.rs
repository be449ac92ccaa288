//! Groups for tasks that no producer enqueues, every backend: a fan-in task
//! (`Outcome::then`) takes no turn while it waits for its follow-ups, which
//! may be in its group, then runs in its place; a follow-up that a chain
//! of waiting tasks waits for, in the group whose turn one of them keeps,
//! is refused; a schedule's ticks take their turns with enqueued tasks.

use std::time::Duration;

use bson::doc;
use mongoagent::schedule::{Overlap, Schedule, Schedules};
use mongoagent::{Agent, AgentError, NewTask, Outcome, Processed, Queue, Task};
use store_test::Harness;
use store_trait::{Collection, Store};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::groups::{agent, grouped, logging_for, Log};

/// A handler that logs each run's start and end.
fn logging(log: Log) -> impl Fn(Task) -> crate::review_groups::Boxed + Send + Sync + Clone {
    logging_for(log, Duration::from_millis(100))
}

/// Runs one agent of `w` with a cap of 1 until `n` tasks of `w` completed
/// (or a minute passed); returns the tasks started, in order.
async fn run_until<S: Store + Clone>(h: &impl Harness, s: &S, n: u64) -> Vec<i64> {
    let q = Queue::new(s.clone(), "tasks").unwrap();
    let log = Log::default();
    let stop = CancellationToken::new();
    let a = agent(s, h.ttl(), Some(1), &stop);
    let handler = logging(log.clone());
    let run = tokio::spawn(async move { a.work(handler).await.unwrap() });
    let deadline = Instant::now() + Duration::from_secs(60);
    while q.stats("w").await.unwrap().completed < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    run.await.unwrap();
    assert_eq!(q.stats("w").await.unwrap().completed, n, "every task completed");
    let log = log.lock().unwrap().clone();
    let mut running = 0_i32;
    for (_, _, start) in &log {
        running += if *start { 1 } else { -1 };
        assert!(running <= 1, "one at a time: {log:?}");
    }
    log.iter().filter(|(_, _, st)| *st).map(|(_, i, _)| *i).collect()
}

/// The record of `key` in `tasks`.
async fn record<S: Store>(s: &S, key: &store_trait::Key) -> store_trait::Record {
    s.get(&Collection::new("tasks").unwrap(), key).await.unwrap().record.unwrap()
}

/// The suite (`group_sources_suite`): each `pub(crate) async fn` over a
/// `Harness` here is one test on every backend, registered by being written.
#[store_test::suite(group_sources_suite, crate::group_sources::cases)]
pub(crate) mod cases {
    use super::*;

    /// A grouped fan-in task waits for its follow-ups in its own group
    /// without a turn (under a cap of 1 it would otherwise wait for ever),
    /// then runs in the place it was enqueued in: after its follow-ups,
    /// ahead of a task enqueued while they ran.
    pub(crate) async fn a_grouped_fan_in_task_takes_no_turn_while_it_waits<H: Harness>(h: &H) {
        let s = h.store("ag_group_fan_in").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped("g", 0)).await.unwrap();
        let (parent, _) = q.enqueue(NewTask::new("p", doc! {})).await.unwrap();
        let p = Agent::builder(s.clone(), "p", "tasks").ttl(h.ttl()).build().unwrap();
        let done = p
            .process(|_t: Task| async {
                Outcome::done().follow_up(grouped("g", 10)).follow_up(grouped("g", 11)).then(grouped("g", 12))
            })
            .await
            .unwrap();
        assert_eq!(done, Some(Processed::Completed(parent.clone())));
        let then = store_trait::Key::new(format!("{parent}/then")).unwrap();
        let waiting = record(&s, &then).await;
        assert_eq!(waiting.get_bool("group_after_wait"), Some(true), "no group's while it waits: {waiting:?}");
        assert_eq!(waiting.get("group_held"), None, "{waiting:?}");
        q.enqueue(grouped("g", 1)).await.unwrap();
        assert_eq!(run_until(h, &s, 5).await, [0, 10, 11, 12, 1], "the fan-in task in its place");
        let ran = record(&s, &then).await;
        assert_eq!((ran.get_bool("complete"), ran.get("group_after_wait")), (Some(true), None), "{ran:?}");
    }

    /// A follow-up that a chain of waiting tasks waits for, in the group
    /// whose turn one of them keeps, would wait behind it for ever: the
    /// outcome that returns it fails for good, saying which task keeps the
    /// turn, and the chain above is woken as for any ended follow-up.
    pub(crate) async fn a_follow_up_in_a_group_kept_up_the_chain_is_refused<H: Harness>(h: &H) {
        let s = h.store("ag_group_chain").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (top, _) = q.enqueue(grouped("g", 0)).await.unwrap();
        let w = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        let top_handler = |t: Task| async move {
            if t.round() > 0 {
                return Outcome::done();
            }
            Outcome::done().follow_up(NewTask::new("x", doc! { "step": "wait" })).wait_for_follow_ups()
        };
        assert_eq!(w.process(top_handler).await.unwrap(), Some(Processed::Waiting(top.clone())));
        // Its follow-up waits in turn, for a task in the top task's group;
        // then one completes with a fan-in task there.
        let x = Agent::builder(s.clone(), "x", "tasks").ttl(h.ttl()).build().unwrap();
        let middle = store_trait::Key::new(format!("{top}/0")).unwrap();
        let out = x
            .process(|_t: Task| async { Outcome::done().follow_up(grouped("g", 2)).wait_for_follow_ups() })
            .await
            .unwrap();
        assert_eq!(out, Some(Processed::Failed(middle.clone())));
        let r = record(&s, &middle).await;
        let error = r.get_str("last_error").unwrap();
        assert!(error.contains(&format!("of task {top}")) && error.contains("1 up the chain"), "{error}");
        // Ended, it woke the top task, which completes.
        assert_eq!(w.process(top_handler).await.unwrap(), Some(Processed::Completed(top.clone())));

        let (top, _) = q.enqueue(grouped("g", 3)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(w.process(top_handler).await.unwrap(), Some(Processed::Waiting(top.clone())));
        let middle = store_trait::Key::new(format!("{top}/0")).unwrap();
        let out = x
            .process(|_t: Task| async { Outcome::done().follow_up(NewTask::new("y", doc! {})).then(grouped("g", 4)) })
            .await
            .unwrap();
        assert_eq!(out, Some(Processed::Failed(middle.clone())), "the fan-in task extends the wait to itself");
        let error = record(&s, &middle).await.get_str("last_error").unwrap().to_owned();
        assert!(error.contains(&format!("of task {top}")), "{error}");
        assert_eq!(w.process(top_handler).await.unwrap(), Some(Processed::Completed(top)));
    }

    /// A schedule's grouped ticks wait for their group's turn behind the
    /// tasks enqueued before them, and ahead of those enqueued after; a
    /// grouped schedule with `Overlap::Queue` is refused.
    pub(crate) async fn a_schedules_grouped_ticks_take_their_turns<H: Harness>(h: &H) {
        let s = h.store("ag_group_ticks").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let schedules = Schedules::with_collection(s.clone(), "tasks", "tasks_schedules").unwrap();
        let tick = NewTask::new("w", doc! { "g": "g", "i": 100_i64 }).group("g");
        let every = Schedule::every("tick", Duration::from_secs(1), tick).unwrap();
        let queued = every.clone().overlap(Overlap::Queue);
        assert!(matches!(schedules.upsert(&queued).await, Err(AgentError::Config(_))));
        schedules.upsert(&every.overlap(Overlap::Allow)).await.unwrap();
        q.enqueue(grouped("g", 0)).await.unwrap();
        // The next whole second is the first tick.
        let deadline = Instant::now() + Duration::from_secs(30);
        while schedules.scheduler().pass().await.unwrap().enqueued == 0 {
            assert!(Instant::now() < deadline, "no tick enqueued");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        q.enqueue(grouped("g", 1)).await.unwrap();
        assert_eq!(run_until(h, &s, 3).await, [0, 100, 1], "the tick in its place");
    }
}
