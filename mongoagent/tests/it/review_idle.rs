//! The idle agent without a poll, as an adversary sees it: a claimable
//! task that could wait far longer than promised (until the 10-minute
//! `recheck_interval`), a paused agent that could claim, work that could be
//! lost. `holds_…` tests pin tricky cases the design covers on its own;
//! `limit_…` a bound that is documented rather than removed.
//!
//! All run on the memory store with paused tokio time. `poll_interval` is
//! the default 5 s and `recheck_interval` the default 10 min throughout, so
//! "prompt" below means within a `poll_interval` (what the commit promises),
//! and a run at about 600 s means the task waited for the 10-minute check.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, AgentCounters, AgentError, NewTask, Outcome, Processed, Queue, Task, CONTROL_REFRESH};
use store_memory::MemoryStore;
use store_test::TestClock;
use store_trait::{Claim, Collection, Key, Mutation, Query, Store, Ttl};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::hold_back::{HoldBack, Op};
use store_test::Partitionable;

/// The default `poll_interval`: what "promptly" means when no notification comes.
const POLL: Duration = Duration::from_secs(5);

/// When each task's handler started (task id, time since the test's epoch), in order.
type Starts = Arc<Mutex<Vec<(String, Duration)>>>;

/// Runs `agent` on its own task with a handler that records when it starts
/// each task, then sleeps the task's `sleep_ms` (if any) and completes it.
fn work_recording<S: Store + Clone>(
    agent: &Agent<S>,
    epoch: Instant,
) -> (JoinHandle<Result<AgentCounters, AgentError>>, Starts) {
    let starts: Starts = Arc::default();
    let run = tokio::spawn({
        let (agent, starts) = (agent.clone(), starts.clone());
        async move {
            agent
                .work(move |t: Task| {
                    starts.lock().unwrap().push((t.id().to_string(), epoch.elapsed()));
                    let sleep = t.data().get_i64("sleep_ms").unwrap_or(0);
                    async move {
                        tokio::time::sleep(Duration::from_millis(u64::try_from(sleep).unwrap_or(0))).await;
                        true
                    }
                })
                .await
        }
    });
    (run, starts)
}

/// When task `id` started (since the epoch), waiting for it until `limit`
/// after the epoch (paused time: the wait costs nothing); `None` if it did
/// not start by then.
async fn start_of(starts: &Starts, id: &str, epoch: Instant, limit: Duration) -> Option<Duration> {
    loop {
        if let Some((_, at)) = starts.lock().unwrap().iter().find(|(t, _)| t == id) {
            return Some(*at);
        }
        if epoch.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A claim of task `id` by an agent that then dies holding it for `ttl`.
fn dead_claim(id: &str, ttl: Duration) -> Claim {
    Claim {
        query: Query::eq(doc! {"_id": id}),
        mutation: Mutation::new()
            .grant("dead-agent", Ttl::new(ttl).unwrap())
            .bump_fence()
            .set("ready", false)
            .set("claimed", true),
    }
}

async fn stop(agent: &Agent<impl Store + Clone>, run: JoinHandle<Result<AgentCounters, AgentError>>) -> AgentCounters {
    agent.shutdown();
    run.await.unwrap().unwrap()
}

/// A busy agent watches nothing, so a task delayed by 90 s and enqueued
/// while it runs a long task is in no idle deadline it read. Back to idle,
/// the agent reads its deadline again within a poll (`work.rs`: a
/// successful claim brings the kept deadline within `poll_interval`), so
/// the task runs within a poll of being due, not at the deadline of the
/// agent's first idle period, 10 minutes on.
#[tokio::test(start_paused = true)]
async fn a_delayed_task_enqueued_while_its_agent_is_busy_runs_within_a_poll_of_due() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let epoch = Instant::now();
    let (run, starts) = work_recording(&agent, epoch);
    // Idle first: an idle period with nothing due sets a 10-minute deadline.
    tokio::time::sleep(Duration::from_secs(1)).await;
    q.enqueue(NewTask::new("w", doc! {"sleep_ms": 60_000_i64}).id("long")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    q.enqueue(NewTask::new("w", doc! {}).id("later").delay(Duration::from_secs(90))).await.unwrap();
    let due = Duration::from_secs(92);
    let at = start_of(&starts, "later", epoch, Duration::from_secs(700)).await;
    assert!(
        at.is_some_and(|at| at <= due + POLL),
        "the delayed task, due at {due:?}, ran at {at:?} (the long task ended at 61 s)"
    );
    assert_eq!(stop(&agent, run).await.completed, 2);
}

/// As above, with a claim that lapses: while the agent runs a long task,
/// another agent claims a task and dies holding it (its lease lapses at
/// 122 s). No change announces a lapse; back to idle, the agent's fresh
/// deadline read finds the claim, and its timer takes the task at the lapse.
#[tokio::test(start_paused = true)]
async fn a_claim_that_lapses_after_its_agent_was_busy_runs_within_a_poll_of_the_lapse() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let coll = Collection::new("tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let epoch = Instant::now();
    let (run, starts) = work_recording(&agent, epoch);
    tokio::time::sleep(Duration::from_secs(1)).await;
    q.enqueue(NewTask::new("w", doc! {"sleep_ms": 60_000_i64}).id("long")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Another agent claims the next task and dies holding it (the agent here
    // is busy: it does not watch, and is not woken).
    q.enqueue(NewTask::new("w", doc! {}).id("orphan")).await.unwrap();
    assert!(store.claim(&coll, &dead_claim("orphan", Duration::from_secs(120))).await.unwrap().is_some());
    let lapse = Duration::from_secs(122);
    let at = start_of(&starts, "orphan", epoch, Duration::from_secs(700)).await;
    assert!(
        at.is_some_and(|at| at <= lapse + Duration::from_secs(1)),
        "the claim lapsed at {lapse:?}; the task ran at {at:?}"
    );
    assert_eq!(stop(&agent, run).await.completed, 2);
}

/// Under `global_concurrency(1)` the only permit is held by a process that
/// died (its lease, 10 s, lapses without a write). The agent's task is
/// ready, but it holds no permit and idles. Nothing announces a permit's
/// lapse, and the deadline read looks at tasks only: so an agent under a
/// global limit polls (`work.rs`, the idle cap), and finds the permit at its
/// next poll, not at its 10-minute check.
#[tokio::test(start_paused = true)]
async fn a_permit_that_lapses_is_found_within_a_poll() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let dead = store.client();
    let lock =
        mongolock::Lock::builder(dead.clone(), "permits:w").collection("tasks_control").ttl(Duration::from_secs(10));
    let permit = mongolock::Semaphore::new(lock, 1).unwrap().try_acquire().await.unwrap().unwrap();
    dead.set_partitioned(true);
    std::mem::forget(permit);
    q.enqueue(NewTask::new("w", doc! {}).id("t")).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").global_concurrency(1).build().unwrap();
    let epoch = Instant::now();
    let (run, starts) = work_recording(&agent, epoch);
    let lapse = Duration::from_secs(10);
    let at = start_of(&starts, "t", epoch, Duration::from_secs(700)).await;
    assert!(
        at.is_some_and(|at| at <= lapse + POLL + Duration::from_secs(1)),
        "the permit lapsed at 10 s; ran at {at:?}"
    );
    assert_eq!(stop(&agent, run).await.completed, 1);
}

/// Under `global_concurrency(1)` the permit's holder is 20 ms farther from
/// the server than the idle agent. The holder's outcome (a queue change)
/// wakes the idle agent, which asks for the permit before the holder's
/// release of it (a second round trip, after the outcome's) has landed,
/// finds none, and idles. The release is no queue change: the agent finds
/// the permit at its next poll (an agent under a global limit polls).
#[tokio::test(start_paused = true)]
async fn a_permit_released_just_after_the_outcome_is_found_within_a_poll() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("w", doc! {}).id("first").priority(1)).await.unwrap();
    q.enqueue(NewTask::new("w", doc! {}).id("second")).await.unwrap();
    // A process farther from the server: its permit writes arrive late.
    let far = HoldBack::new(store.clone());
    far.delay_writes("tasks_control", Duration::from_millis(20));
    let holder = Agent::builder(far, "w", "tasks").global_concurrency(1).build().unwrap();
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let held = tokio::spawn({
        let (holder, started, finish) = (holder.clone(), started.clone(), finish.clone());
        async move {
            holder
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
    started.notified().await;
    let idle = Agent::builder(store.clone(), "w", "tasks").global_concurrency(1).build().unwrap();
    let epoch = Instant::now();
    let (run, starts) = work_recording(&idle, epoch);
    // The idle agent finds no free permit, and idles.
    tokio::time::sleep(Duration::from_secs(1)).await;
    finish.notify_one();
    assert_eq!(held.await.unwrap().unwrap(), Some(Processed::Completed(Key::new("first").unwrap())));
    let at = start_of(&starts, "second", epoch, Duration::from_secs(700)).await;
    assert!(
        at.is_some_and(|at| at <= Duration::from_secs(1) + POLL + Duration::from_secs(1)),
        "the permit went back at about 1 s; the waiting task ran at {at:?}"
    );
    assert_eq!(stop(&idle, run).await.completed, 1);
}

/// A LIMIT, documented (`AgentBuilder::recheck_interval`): a store clock
/// step. The due-time read turns the store's due time into a local timer
/// once; the store's clock then steps forward 8 minutes (an NTP step, a
/// failover to a member whose clock is ahead). A task delayed by 9 minutes
/// becomes due at about 61 s of local time; the agent sleeps on its timer
/// until 541 s: late by the step, and never later than its check
/// (`recheck_interval`, 10 min). A poll every 5 s found it within 5 s; the
/// price of finding it sooner is a clock read per poll, which is what an
/// idle agent no longer sends.
#[tokio::test(start_paused = true)]
async fn limit_a_store_clock_step_forward_delays_a_timer_by_the_step_at_most_the_check() {
    let clock = TestClock::from_system_with_offset(0);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let epoch = Instant::now();
    let (run, starts) = work_recording(&agent, epoch);
    tokio::time::sleep(Duration::from_secs(1)).await;
    q.enqueue(NewTask::new("w", doc! {}).id("later").delay(Duration::from_secs(540))).await.unwrap();
    // The wake-up's keyed claim misses (not due); 5 s later the due-time
    // read sets the timer at 541 s.
    tokio::time::sleep(Duration::from_secs(9)).await;
    clock.jump(8 * 60 * 1000);
    let due = Duration::from_secs(541 - 8 * 60);
    let at = start_of(&starts, "later", epoch, Duration::from_secs(700)).await;
    let check = Duration::from_secs(600);
    assert!(at.is_some_and(|at| at > due && at <= check + Duration::from_secs(1)), "due at {due:?}; ran at {at:?}");
    assert_eq!(stop(&agent, run).await.completed, 1);
}

/// The pause of `w` is written 10 ms after the control task's reread, and
/// its notification stalls. 690 ms later two tasks arrive; the agent
/// (concurrency 1) claims the first on the shared view (read 0.7 s before:
/// fresh) and runs it for 0.99 s, then must not claim the second: 1.68 s
/// after the pause, its cached answer is from a read 2.4 s old. An answer
/// is stamped with when its read was sent (`claim.rs`, `Agent::paused`),
/// not when it was looked at, so it is trusted for `CONTROL_REFRESH` from
/// the read.
#[tokio::test(start_paused = true)]
async fn a_pause_whose_notification_stalls_is_obeyed_within_one_refresh() {
    let store = MemoryStore::new();
    let held = HoldBack::new(store.clone());
    held.stall_watches("tasks_control");
    // The times of the control task's reads (a find of the paused names).
    let reads: Arc<Mutex<Vec<Instant>>> = Arc::default();
    held.hold_next({
        let reads = reads.clone();
        move |c, op| {
            if c.as_str() == "tasks_control" && matches!(op, Op::Find(q) if q.filter.contains_key("paused")) {
                reads.lock().unwrap().push(Instant::now());
            }
            false
        }
    });
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(held.clone(), "w", "tasks").concurrency(1).build().unwrap();
    let epoch = Instant::now();
    let (run, starts) = work_recording(&agent, epoch);
    // Tasks flow: the control task rereads (every 750 ms for 30 s after a
    // claim that got a task).
    q.enqueue(NewTask::new("w", doc! {}).id("warm")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Just after a reread of the control task.
    let last = *reads.lock().unwrap().last().expect("the control task reads");
    tokio::time::sleep_until(last + Duration::from_millis(760)).await;
    let reread = *reads.lock().unwrap().last().unwrap();
    assert_eq!(reread, last + Duration::from_millis(750), "a reread 750 ms after the last");
    q.set_paused("w", true).await.unwrap();
    let paused_at = epoch.elapsed();
    tokio::time::sleep_until(reread + Duration::from_millis(700)).await;
    q.enqueue_all(&[NewTask::new("w", doc! {"sleep_ms": 990_i64}).id("t1"), NewTask::new("w", doc! {}).id("t2")])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let late: Vec<(String, Duration)> =
        starts.lock().unwrap().iter().filter(|(_, at)| *at > paused_at + CONTROL_REFRESH).cloned().collect();
    assert!(late.is_empty(), "paused at {paused_at:?}, claimed and started after the bound: {late:?}");
    stop(&agent, run).await;
}

/// HOLDS: a resume reaches a paused idle agent within the bound while both
/// its streams stall (the queue's and the control collection's), after the
/// queue was quiet for more than `QUIET` (30 s): the control task rereads
/// while a name is paused, whatever the last claim.
#[tokio::test(start_paused = true)]
async fn holds_a_resume_reaches_a_paused_idle_agent_whose_streams_stall() {
    let store = MemoryStore::new();
    let held = HoldBack::new(store.clone());
    held.stall_watches("tasks");
    held.stall_watches("tasks_control");
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.set_paused("w", true).await.unwrap();
    q.enqueue(NewTask::new("w", doc! {}).id("t")).await.unwrap();
    let agent = Agent::builder(held.clone(), "w", "tasks").build().unwrap();
    let epoch = Instant::now();
    let (run, starts) = work_recording(&agent, epoch);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(starts.lock().unwrap().is_empty(), "claimed while paused");
    q.set_paused("w", false).await.unwrap();
    let at = start_of(&starts, "t", epoch, Duration::from_secs(700)).await;
    assert!(at.is_some_and(|at| at <= Duration::from_secs(60) + CONTROL_REFRESH), "resumed at 60 s; ran at {at:?}");
    assert_eq!(stop(&agent, run).await.completed, 1);
}

/// HOLDS: an operator's requeue of a task that failed for good wakes the
/// idle agent at once (it sets `ready: true`, which `claimable_changes`
/// passes), long before its 10-minute check.
#[tokio::test(start_paused = true)]
async fn holds_a_requeue_wakes_an_idle_agent() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let fail = Arc::new(AtomicBool::new(true));
    let runs: Starts = Arc::default();
    let epoch = Instant::now();
    let run = tokio::spawn({
        let (agent, fail, runs) = (agent.clone(), fail.clone(), runs.clone());
        async move {
            agent
                .work(move |t: Task| {
                    runs.lock().unwrap().push((t.id().to_string(), epoch.elapsed()));
                    let ok = !fail.load(Ordering::SeqCst);
                    async move { ok }
                })
                .await
        }
    });
    q.enqueue(NewTask::new("w", doc! {}).id("t")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(q.failed_tasks(doc! {}, None).await.unwrap().len(), 1, "failed for good");
    fail.store(false, Ordering::SeqCst);
    assert_eq!(q.requeue(doc! {"agent_name": "w"}).await.unwrap().len(), 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(runs.lock().unwrap().len(), 2, "run again within a second of the requeue: {:?}", runs.lock().unwrap());
    let log = stop(&agent, run).await;
    assert_eq!((log.completed, log.failed_permanently), (1, 1));
}

/// HOLDS: agents of two names on one `Queue`, the waiter idle for long: the
/// last follow-up to end makes the waiting task ready, which wakes its idle
/// agent at once (not at its 10-minute check).
#[tokio::test(start_paused = true)]
async fn holds_a_fan_in_wakes_the_idle_waiter_on_a_shared_queue() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let split = Agent::on_queue(&q, "split").build().unwrap();
    let part = Agent::on_queue(&q, "part").concurrency(2).build().unwrap();
    let epoch = Instant::now();
    let rounds: Arc<Mutex<Vec<(u64, Duration)>>> = Arc::default();
    let split_run = tokio::spawn({
        let (split, rounds) = (split.clone(), rounds.clone());
        async move {
            split
                .work(move |t: Task| {
                    rounds.lock().unwrap().push((t.round(), epoch.elapsed()));
                    async move {
                        if t.round() == 0 {
                            Outcome::done()
                                .follow_up(NewTask::new("part", doc! {"sleep_ms": 30_000_i64}))
                                .follow_up(NewTask::new("part", doc! {"sleep_ms": 90_000_i64}))
                                .wait_for_follow_ups()
                        } else {
                            Outcome::done()
                        }
                    }
                })
                .await
        }
    });
    let (part_run, _) = work_recording(&part, epoch);
    tokio::time::sleep(Duration::from_secs(1)).await;
    q.enqueue(NewTask::new("split", doc! {}).id("job")).await.unwrap();
    for _ in 0..700 {
        if rounds.lock().unwrap().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let rounds = rounds.lock().unwrap().clone();
    assert_eq!(rounds.len(), 2, "{rounds:?}");
    assert!(rounds[1].1 <= Duration::from_secs(92), "the last part ended at about 91 s; the waiter ran at {rounds:?}");
    assert_eq!(stop(&part, part_run).await.completed, 2);
    assert_eq!(stop(&split, split_run).await.completed, 1);
}

/// HOLDS: the queue's stream ends (a server restart) and comes back: a task
/// inserted while it is down runs within a `poll_interval` (the watcher
/// reports the loss at once, the agent polls, and subscribes again).
#[tokio::test(start_paused = true)]
async fn holds_a_task_inserted_while_the_stream_is_down_runs_within_a_poll() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let epoch = Instant::now();
    let (run, starts) = work_recording(&agent, epoch);
    tokio::time::sleep(Duration::from_secs(60)).await;
    store.faults().end_change_streams();
    tokio::time::sleep(Duration::from_millis(500)).await;
    q.enqueue(NewTask::new("w", doc! {}).id("t")).await.unwrap();
    let at = start_of(&starts, "t", epoch, Duration::from_secs(700)).await;
    assert!(at.is_some_and(|at| at <= Duration::from_millis(60_500) + POLL), "inserted at 60.5 s; ran at {at:?}");
    // And the subscription is back: the next insert wakes it at once.
    tokio::time::sleep(Duration::from_secs(30)).await;
    q.enqueue(NewTask::new("w", doc! {}).id("u")).await.unwrap();
    let sent = epoch.elapsed();
    let at = start_of(&starts, "u", epoch, Duration::from_secs(700)).await;
    assert!(at.is_some_and(|at| at <= sent + Duration::from_millis(100)), "inserted at {sent:?}; ran at {at:?}");
    assert_eq!(stop(&agent, run).await.completed, 2);
}

/// HOLDS: on a store without change notifications the agent polls every
/// `poll_interval`, not every `recheck_interval`.
#[tokio::test(start_paused = true)]
async fn holds_without_notifications_an_idle_agent_polls() {
    let store = MemoryStore::builder().change_streams(false).build();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let epoch = Instant::now();
    let (run, starts) = work_recording(&agent, epoch);
    tokio::time::sleep(Duration::from_secs(60)).await;
    q.enqueue(NewTask::new("w", doc! {}).id("t")).await.unwrap();
    let at = start_of(&starts, "t", epoch, Duration::from_secs(700)).await;
    assert!(at.is_some_and(|at| at <= Duration::from_secs(60) + POLL), "inserted at 60 s; ran at {at:?}");
    assert_eq!(stop(&agent, run).await.completed, 1);
}

/// HOLDS: an agent asleep on its 10-minute deadline stops at once when shut
/// down.
#[tokio::test(start_paused = true)]
async fn holds_shutdown_while_idle_is_prompt() {
    let store = MemoryStore::new();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let (run, _) = work_recording(&agent, Instant::now());
    tokio::time::sleep(Duration::from_secs(120)).await;
    agent.shutdown();
    let stopped = tokio::time::timeout(Duration::from_millis(100), run).await;
    assert!(stopped.is_ok_and(|r| r.unwrap().is_ok()), "the idle agent did not stop at once");
}
