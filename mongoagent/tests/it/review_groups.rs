//! Adversarial review of groups (`NewTask::group`,
//! `AgentBuilder::group_concurrency`): attacks on the cap, the order and
//! "nothing lost", every backend. A test here that fails is a finding; one
//! that passes is an attack that held (each says which it is meant to be).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, AgentError, NewTask, Outcome, Processed, Queue, Task};
use store_test::{Call, Harness, Intercept, Intercepted};
use store_trait::{Collection, Condition, FaultKind, Key, Mutation, Query, Store, StoreError, StoreResult, Write};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::groups::{agent, grouped, Log};
use crate::hold_back::{HoldBack, Op};

pub(crate) fn tasks() -> Collection {
    Collection::new("tasks").unwrap()
}

pub(crate) fn slots() -> Collection {
    Collection::new("tasks_groups").unwrap()
}

/// Logs a run's end when dropped: a handler aborted ends too.
pub(crate) struct Ends(pub(crate) Log, pub(crate) String, pub(crate) i64);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.lock().unwrap().push((self.1.clone(), self.2, false));
    }
}

pub(crate) type Boxed = std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>>;

/// Which runs of task 0 a [`stubborn`] handler holds.
#[derive(Clone, Copy)]
pub(crate) enum Holds {
    /// Every run of it: a second run, after a takeover, holds too.
    EveryRun,
    /// Its first attempt only: a retry runs through.
    FirstAttempt,
}

/// A handler that logs its run's start and end as (`a<attempt>`, i); task 0
/// waits for `release` (or for ever) in the runs `holds` names, ignoring its
/// cancellation.
pub(crate) fn stubborn(log: Log, release: Arc<Notify>, holds: Holds) -> impl Fn(Task) -> Boxed + Send + Sync + Clone {
    move |t: Task| {
        let (log, release) = (log.clone(), release.clone());
        Box::pin(async move {
            let i = t.data().get_i64("i").unwrap_or(-1);
            let run = format!("a{}", t.attempt());
            log.lock().unwrap().push((run.clone(), i, true));
            let _ends = Ends(log.clone(), run, i);
            let held = match holds {
                Holds::EveryRun => true,
                Holds::FirstAttempt => t.attempt() == 1,
            };
            if i == 0 && held {
                release.notified().await;
            }
            Outcome::done()
        })
    }
}

/// The most runs of one group at once.
fn most_at_once(log: &[(String, i64, bool)]) -> usize {
    let (mut per, mut most) = (HashMap::<&str, usize>::new(), 0);
    for (g, _, start) in log {
        let n = per.entry(g.as_str()).or_default();
        if *start {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        most = most.max(*n);
    }
    most
}

pub(crate) fn started(log: &Log, i: i64) -> bool {
    log.lock().unwrap().iter().any(|(_, j, s)| *j == i && *s)
}

pub(crate) fn ended(log: &Log, i: i64) -> bool {
    log.lock().unwrap().iter().any(|(_, j, s)| *j == i && !*s)
}

pub(crate) async fn until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Live (ready, claimed) and not ended tasks of group `g`.
async fn live_in<S: Store>(s: &S, g: &str) -> Vec<String> {
    let all = s.find(&tasks(), &Query::eq(doc! { "group_key": g })).await.unwrap();
    all.iter()
        .filter(|r| r.get_bool("complete") != Some(true))
        .filter(|r| r.get_bool("ready") == Some(true) || r.get_bool("claimed") == Some(true))
        .map(|r| r.key().to_string())
        .collect()
}

/// A producer's store: holds its next insert into `tasks` until opened,
/// and fails its nudges (what a producer that dies between its insert and
/// its nudge leaves: the insert made, the nudge not).
pub(crate) struct Producer {
    pub(crate) hold_insert: AtomicBool,
    pub(crate) fail_nudge: AtomicBool,
    pub(crate) reached: Notify,
    pub(crate) open: Semaphore,
}

impl Default for Producer {
    fn default() -> Self {
        Producer {
            hold_insert: AtomicBool::new(false),
            fail_nudge: AtomicBool::new(false),
            reached: Notify::new(),
            open: Semaphore::new(0),
        }
    }
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<S: Store> Intercept<S> for Producer {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        let Some(c) = coll else { return Ok(()) };
        match call {
            Call::InsertMany(_) if c.as_str() == "tasks" && self.hold_insert.swap(false, Ordering::SeqCst) => {
                self.reached.notify_one();
                self.open.acquire().await.unwrap().forget();
            }
            Call::Write(_, w)
                if c.as_str() == "tasks_groups"
                    && self.fail_nudge.load(Ordering::SeqCst)
                    && format!("{:?}", w.mutation).contains("enqueued") =>
            {
                return Err(StoreError::backend(FaultKind::Transient, "the producer died before its nudge"));
            }
            _ => {}
        }
        Ok(())
    }
}

/// A handler that logs start and end; task 0 runs until `release` is notified.
fn blocking(
    log: Log,
    release: Arc<Notify>,
) -> impl Fn(Task) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>> + Send + Sync + Clone {
    move |t: Task| {
        let (log, release) = (log.clone(), release.clone());
        Box::pin(async move {
            let g = t.data().get_str("g").unwrap_or("-").to_owned();
            let i = t.data().get_i64("i").unwrap_or(-1);
            log.lock().unwrap().push((g.clone(), i, true));
            if i == 0 {
                release.notified().await;
            }
            log.lock().unwrap().push((g, i, false));
            Outcome::done()
        })
    }
}

/// The suite (`review_groups_suite`): each `pub(crate) async fn` over a
/// `Harness` here is one test on every backend.
#[store_test::suite(review_groups_suite, crate::review_groups::cases)]
pub(crate) mod cases {
    use super::*;

    /// FINDING (nothing lost). The producer numbers the task (the slot's
    /// upsert marks it active), an agent's sweep settles the slot before the
    /// producer's insert lands (nothing held yet: the slot is marked
    /// inactive), the insert lands, and the nudge does not (the producer
    /// dies, or the write fails: `enqueue_all` logs it and returns Ok,
    /// saying "their sweep lets the tasks through"). The sweep reads only
    /// active slots: the task stays held for ever, though capped agents run.
    pub(crate) async fn a_task_whose_nudge_is_lost_after_a_sweep_runs<H: Harness>(h: &H) {
        let s = h.store("rv_groups_strand").await;
        let prod = Intercepted::with(s.clone(), Producer::default());
        prod.hold_insert.store(true, Ordering::SeqCst);
        prod.fail_nudge.store(true, Ordering::SeqCst);
        let producer = tokio::spawn({
            let q = Queue::new(prod.clone(), "tasks").unwrap();
            async move { q.enqueue(grouped("g", 0)).await }
        });
        prod.reached.notified().await;
        // Numbered, not inserted yet: an agent's sweep passes (here
        // `Agent::process`'s; a work loop's at start, or on the slot's
        // insert notification, is the same settle).
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), None);
        prod.open.add_permits(1);
        let enqueued = producer.await.unwrap();
        assert!(enqueued.is_ok(), "the enqueue says it worked: {enqueued:?}");
        // Capped agents run for longer than a sweep period.
        let stop = CancellationToken::new();
        let w = agent(&s, h.ttl(), Some(1), &stop);
        let worker = tokio::spawn(async move { w.work(|_t: Task| async { true }).await.unwrap() });
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let deadline = Instant::now() + mongoagent::group::SWEEP + Duration::from_secs(5);
        while q.stats("w").await.unwrap().completed < 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.cancel();
        worker.await.unwrap();
        let t = s.find(&tasks(), &Query::all()).await.unwrap();
        assert_eq!(
            q.stats("w").await.unwrap().completed,
            1,
            "the grouped task never ran; its slot: {:?}; the task: {:?}",
            s.find(&slots(), &Query::all()).await.unwrap(),
            t
        );
    }

    /// FINDING (cap). A cancel of a running grouped task frees its group's
    /// turn at once (it nudges), while the handler still runs until the
    /// agent's next renewal notices the lost claim: with a cap of 1 the
    /// group's next task starts beside it, even with a handler that honours
    /// its cancellation.
    pub(crate) async fn a_cancel_of_a_running_task_lets_the_next_start_beside_it<H: Harness>(h: &H) {
        let s = h.store("rv_groups_cancel").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (a, _) = q.enqueue(grouped("g", 0)).await.unwrap();
        q.enqueue(grouped("g", 1)).await.unwrap();
        let log = Log::default();
        let stop = CancellationToken::new();
        let w = agent(&s, h.ttl(), Some(1), &stop);
        let l = log.clone();
        let worker = tokio::spawn(async move {
            w.work(move |t: Task| {
                let l = l.clone();
                async move {
                    let i = t.data().get_i64("i").unwrap();
                    l.lock().unwrap().push(("g".into(), i, true));
                    if i == 0 {
                        // Honours its cancellation.
                        t.cancellation().cancelled().await;
                    }
                    l.lock().unwrap().push(("g".into(), i, false));
                    Outcome::done()
                }
            })
            .await
            .unwrap()
        });
        until("task 0 to start", 30, || started(&log, 0)).await;
        assert_eq!(q.cancel_ids(std::slice::from_ref(&a)).await.unwrap(), vec![a]);
        until("task 0's handler to end", 30, || ended(&log, 0)).await;
        until("task 1 to run", 60, || ended(&log, 1)).await;
        stop.cancel();
        worker.await.unwrap();
        let log = log.lock().unwrap().clone();
        assert_eq!(most_at_once(&log), 1, "two handlers of one group ran at once with a cap of 1: {log:?}");
    }

    /// FINDING (cap). The agent that failed task A for good lets the group
    /// through with `ended = A`, which skips reading A (`only_ended`) in
    /// every round. A requeue of A between its outcome and that settle
    /// holds A again, and another agent's settle makes it ready (it is
    /// still listed) and runs it; then the first agent's settle drops A
    /// from the slot unread and lets B through: A and B run at once.
    pub(crate) async fn a_requeue_racing_the_failing_agents_settle_breaks_the_cap<H: Harness>(h: &H) {
        let s = h.store("rv_groups_requeue_race").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (a, _) = q.enqueue(grouped("g", 0).max_attempts(1)).await.unwrap();
        let (b, _) = q.enqueue(grouped("g", 1)).await.unwrap();
        let held = HoldBack::new(s.clone());
        let e = agent(&held, h.ttl(), Some(1), &CancellationToken::new());
        let failing = tokio::spawn({
            let held = held.clone();
            async move {
                e.process(move |_t: Task| {
                    // Its group's settle, after this outcome, waits.
                    held.hold_next(|c, op| c.as_str() == "tasks_groups" && matches!(op, Op::Get(_)));
                    async { Outcome::failed("no") }
                })
                .await
            }
        });
        held.reached().await;
        assert_eq!(q.requeue_ids(std::slice::from_ref(&a)).await.unwrap(), vec![a.clone()]);
        let log = Log::default();
        let release = Arc::new(Notify::new());
        let f = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        let running_a = tokio::spawn({
            let handler = blocking(log.clone(), release.clone());
            async move { f.process(handler).await }
        });
        until("the requeued task to start", 30, || started(&log, 0)).await;
        held.open();
        assert_eq!(failing.await.unwrap().unwrap(), Some(Processed::Failed(a.clone())));
        let live = live_in(&s, "g").await;
        let g = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        let other = g.process(blocking(log.clone(), release.clone())).await.unwrap();
        release.notify_one();
        running_a.await.unwrap().unwrap();
        let log = log.lock().unwrap().clone();
        assert!(
            live.len() <= 1 && most_at_once(&log) == 1,
            "cap 1: live at once {live:?}; another agent then ran {other:?} (b = {b}) beside the requeued one: {log:?}"
        );
    }

    /// As the requeue race above, with the failing agent held back at its
    /// slot's compare-and-set instead of its read: it read the requeued task
    /// ended, and another agent made it ready again meanwhile. That agent's
    /// release follows a write of the slot, so the held-back compare-and-set
    /// fails and is made again on what the slot and the task are now.
    pub(crate) async fn a_requeue_racing_the_failing_agents_compare_and_set_keeps_the_cap<H: Harness>(h: &H) {
        let s = h.store("rv_groups_requeue_cas").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (a, _) = q.enqueue(grouped("g", 0).max_attempts(1)).await.unwrap();
        q.enqueue(grouped("g", 1)).await.unwrap();
        let held = HoldBack::new(s.clone());
        let e = agent(&held, h.ttl(), Some(1), &CancellationToken::new());
        let failing = tokio::spawn({
            let held = held.clone();
            async move {
                e.process(move |_t: Task| {
                    held.hold_next(|c, op| c.as_str() == "tasks_groups" && matches!(op, Op::Write(_)));
                    async { Outcome::failed("no") }
                })
                .await
            }
        });
        held.reached().await;
        assert_eq!(q.requeue_ids(std::slice::from_ref(&a)).await.unwrap(), vec![a.clone()]);
        let log = Log::default();
        let release = Arc::new(Notify::new());
        let f = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        let running_a = tokio::spawn({
            let handler = blocking(log.clone(), release.clone());
            async move { f.process(handler).await }
        });
        until("the requeued task to start", 30, || started(&log, 0)).await;
        held.open();
        assert_eq!(failing.await.unwrap().unwrap(), Some(Processed::Failed(a.clone())));
        let live = live_in(&s, "g").await;
        release.notify_one();
        running_a.await.unwrap().unwrap();
        assert!(live.len() <= 1, "cap 1: live at once {live:?}");
    }

    /// FINDING (nothing lost / order). `Agent::process` lets held tasks
    /// through only when it finds nothing ready; producers' nudges do not
    /// reach it. While ungrouped work is always ready (here a task whose
    /// handler returns a follow-up of itself), a grouped task enqueued
    /// first never runs.
    pub(crate) async fn process_starves_a_grouped_task_while_other_work_is_ready<H: Harness>(h: &H) {
        let s = h.store("rv_groups_starve").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped("g", 0)).await.unwrap();
        q.enqueue(NewTask::new("w", doc! { "ping": 0_i64 })).await.unwrap();
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        let ran = Arc::new(AtomicBool::new(false));
        for _ in 0..30 {
            let ran = ran.clone();
            a.process(move |t: Task| {
                let ran = ran.clone();
                async move {
                    if t.data().contains_key("g") {
                        ran.store(true, Ordering::SeqCst);
                        return Outcome::done();
                    }
                    let n = t.data().get_i64("ping").unwrap_or(0);
                    Outcome::done().follow_up(NewTask::new("w", doc! { "ping": n + 1 }))
                }
            })
            .await
            .unwrap();
            // Longer than the poll interval: a sweep is due at every call.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(ran.load(Ordering::SeqCst), "the grouped task (enqueued first) never ran in 30 process calls");
    }

    /// FOUND, then fixed (an agent without a cap now nudges the capped ones
    /// when it ends a grouped task; the README no longer says such agents
    /// leave grouped tasks alone). An agent of the name
    /// without a cap claims a grouped task once a capped agent let it
    /// through, and, having no cap, settles nothing when it ends it: the
    /// group's next task then waits for a capped agent's sweep though the
    /// capped agent is idle: about 60 s, two sweep periods, since the
    /// periodic sweep passes over a slot written less than `SWEEP` before
    /// it (with notifications; without them, a poll interval).
    pub(crate) async fn an_uncapped_agent_runs_grouped_tasks_and_stalls_the_group<H: Harness>(h: &H) {
        let s = h.store("rv_groups_uncapped").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        // The capped agent is busy (one slot) with an ungrouped task.
        q.enqueue(NewTask::new("w", doc! { "i": 0_i64 })).await.unwrap();
        let log = Log::default();
        let release = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let c = Agent::builder(s.clone(), "w", "tasks")
            .ttl(h.ttl())
            .concurrency(1)
            .prefetch(0)
            .poll_interval(Duration::from_millis(200))
            .group_concurrency(1)
            .shutdown_on(&stop)
            .build()
            .unwrap();
        let worker = tokio::spawn({
            let handler = blocking(log.clone(), release.clone());
            async move { c.work(handler).await.unwrap() }
        });
        until("the ungrouped task to start", 30, || started(&log, 0)).await;
        let (g1, _) = q.enqueue(grouped("g", 1)).await.unwrap();
        let (g2, _) = q.enqueue(grouped("g", 2)).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while s.get(&tasks(), &g1).await.unwrap().record.unwrap().get_bool("ready") != Some(true) {
            assert!(Instant::now() < deadline, "g1 never let through");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let u = agent(&s, h.ttl(), None, &CancellationToken::new());
        let u_ran = u.process(|_t: Task| async { true }).await.unwrap();
        release.notify_one();
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(90);
        while s.get(&tasks(), &g2).await.unwrap().record.unwrap().get_bool("complete") != Some(true)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let waited = t0.elapsed();
        stop.cancel();
        worker.await.unwrap();
        // An agent without a cap may run a task already let through; it
        // nudges the capped agents when it ends one.
        assert!(
            waited < Duration::from_secs(5),
            "the agent without a cap ran {u_ran:?}; the group's next task then waited {waited:?} with the capped agent idle"
        );
    }

    /// FINDING (cap, a delete racing nothing). A settle reads the tasks its
    /// slot lists by id alone, not by group: a task force-deleted while let
    /// through, then enqueued again with its id in another group, is made
    /// ready by the old group's slot, beside the new group's own task.
    pub(crate) async fn a_reused_id_is_let_through_by_its_old_groups_slot<H: Harness>(h: &H) {
        let s = h.store("rv_groups_reused_id").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.set_paused("w", true).await.unwrap();
        q.enqueue(grouped("g1", 0).id("x")).await.unwrap();
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        // Paused: nothing is claimed, but the sweep lets "x" through.
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), None);
        let x = s.get(&tasks(), &Key::new("x").unwrap()).await.unwrap().record.unwrap();
        assert_eq!(x.get_bool("ready"), Some(true), "let through: {x:?}");
        let deleted = q.delete(doc! { "_id": "x" }).force(true).await.unwrap();
        assert_eq!(deleted.len(), 1);
        q.enqueue(grouped("g2", 1).id("z")).await.unwrap();
        q.enqueue(grouped("g2", 2).id("x")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), None);
        let live = live_in(&s, "g2").await;
        assert!(live.len() <= 1, "cap 1, group g2 has {} live tasks: {live:?}", live.len());
    }

    /// FINDING (bad input: a panic). A slot's `seq` written past the queue
    /// near `i64::MAX`: numbering the next task overflows (`*n += 1` after
    /// the last number), a panic in debug builds, instead of a typed error.
    pub(crate) async fn a_slot_numbered_near_i64_max_is_no_panic<H: Harness>(h: &H) {
        let s = h.store("rv_groups_seq_max").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let m = Mutation::new().set("seq", i64::MAX - 1).set("agent_name", "w").set("group", "g");
        s.write(&slots(), &Key::new("1:w/g").unwrap(), &Write::new(Condition::Always, m).upsert()).await.unwrap();
        let got = tokio::spawn(async move { q.enqueue(grouped("g", 0)).await }).await;
        assert!(got.is_ok(), "enqueue panicked: {got:?}");
    }

    /// HELD (data). Agent names and group keys with '/' and ':' that would
    /// share a slot key without the length prefix get their own slots, and
    /// each runs; a foreign slot with a string `seq` is a typed error; keys
    /// of 256 bytes of 4-byte characters pass, 260 are refused, as is an
    /// agent name too long to fit a slot key beside its group.
    pub(crate) async fn odd_names_and_keys_get_their_own_slots_or_typed_errors<H: Harness>(h: &H) {
        let s = h.store("rv_groups_names").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        for (agent_name, g) in [("a", "b/c"), ("a/b", "c"), ("3:a", "b/c"), ("a", "3:a/b/c")] {
            q.enqueue(NewTask::new(agent_name, doc! {}).group(g)).await.unwrap();
        }
        let mut n = 0;
        for agent_name in ["a", "a/b", "3:a"] {
            let a = Agent::builder(s.clone(), agent_name, "tasks").ttl(h.ttl()).group_concurrency(1).build().unwrap();
            while a.process(|_t: Task| async { true }).await.unwrap().is_some() {
                n += 1;
            }
        }
        assert_eq!(n, 4, "every task ran once");
        assert_eq!(s.count(&slots(), &Query::all()).await.unwrap(), 4, "one slot per (agent, group)");
        let emoji = "\u{1F600}".repeat(64);
        q.enqueue(NewTask::new("a", doc! {}).group(emoji.as_str())).await.unwrap();
        let too_long = "\u{1F600}".repeat(65);
        let e = q.enqueue(NewTask::new("a", doc! {}).group(too_long.as_str())).await.unwrap_err();
        assert!(matches!(e, AgentError::InvalidTask(_)), "{e}");
        let long_agent = "n".repeat(Key::MAX_LEN);
        let e = q.enqueue(NewTask::new(long_agent.as_str(), doc! {}).group("g")).await.unwrap_err();
        assert!(matches!(e, AgentError::InvalidTask(_)), "{e}");
        let m = Mutation::new().set("seq", "many").set("agent_name", "w").set("group", "s");
        s.write(&slots(), &Key::new("1:w/s").unwrap(), &Write::new(Condition::Always, m).upsert()).await.unwrap();
        let e = q.enqueue(grouped("s", 0)).await.unwrap_err();
        assert!(matches!(e, AgentError::Store(_)), "{e}");
    }

    /// HELD (dedupe with groups). A duplicate by dedupe key consumes a
    /// number and inserts nothing; the group's tasks still run, in order,
    /// each once; a duplicate naming another group returns the holder.
    pub(crate) async fn dedupe_duplicates_in_a_group_leave_no_gap_that_stalls<H: Harness>(h: &H) {
        let s = h.store("rv_groups_dedupe").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (a, new) = q.enqueue(grouped("g", 0).dedupe_key("k")).await.unwrap();
        assert!(new);
        assert_eq!(q.enqueue(grouped("g", 9).dedupe_key("k")).await.unwrap(), (a.clone(), false));
        assert_eq!(q.enqueue(grouped("h", 9).dedupe_key("k")).await.unwrap(), (a.clone(), false));
        q.enqueue(grouped("g", 1)).await.unwrap();
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        let order = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..10 {
            let order = order.clone();
            let p = a
                .process(move |t: Task| {
                    order.lock().unwrap().push(t.data().get_i64("i").unwrap());
                    async { true }
                })
                .await
                .unwrap();
            if p.is_none() {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        assert_eq!(*order.lock().unwrap(), [0, 1]);
    }
    /// FINDING (order within one call). `enqueue_all([A, B])`, both of one
    /// group, A with a dedupe key an ended task holds (`UntilEnded`): A is
    /// numbered first, but inserted only after its key is moved off the
    /// ended holder (`settle_duplicate`), while B is already in. A settle
    /// in between (here `Agent::process`'s sweep) lets B through, and B
    /// runs before A: the group's tasks do not start in enqueue order.
    pub(crate) async fn a_dedupe_retire_inside_enqueue_all_lets_the_later_task_run_first<H: Harness>(h: &H) {
        let s = h.store("rv_groups_dedupe_order").await;
        // A key moved off an ended task, then taken: what secantusd-rs's
        // unique index does not let go of (docs/test-servers.md).
        if !h
            .has(
                "a_dedupe_retire_inside_enqueue_all_lets_the_later_task_run_first",
                store_test::Needs::UniqueKeyRelease,
            )
            .await
        {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let until_ended = |t: NewTask| t.dedupe_key("k").dedupe_scope(mongoagent::DedupeScope::UntilEnded);
        q.enqueue(until_ended(NewTask::new("d", doc! {}))).await.unwrap();
        let d = Agent::builder(s.clone(), "d", "tasks").ttl(h.ttl()).build().unwrap();
        assert!(matches!(d.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
        let held = HoldBack::new(s.clone());
        held.hold_next(
            |_, op| matches!(op, Op::Write(w) if format!("{:?}", w.mutation).contains("dedupe_key_retired")),
        );
        let producer = tokio::spawn({
            let q = Queue::new(held.clone(), "tasks").unwrap();
            async move { q.enqueue_all(&[until_ended(grouped("g", 0)), grouped("g", 1)]).await }
        });
        held.reached().await;
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        let order = Arc::new(Mutex::new(Vec::new()));
        let handler = {
            let order = order.clone();
            move |t: Task| {
                order.lock().unwrap().push(t.data().get_i64("i").unwrap());
                async { true }
            }
        };
        a.process(handler.clone()).await.unwrap();
        held.open();
        producer.await.unwrap().unwrap();
        for _ in 0..10 {
            if a.process(handler.clone()).await.unwrap().is_none() {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        assert_eq!(*order.lock().unwrap(), [0, 1], "one enqueue_all call's tasks of one group, in its order");
    }
    /// FINDING (cap), as the cancel: a forced delete of a running grouped
    /// task nudges its group's agents at once, and the next task starts
    /// while the deleted task's handler still runs (until the renewal
    /// finds the claim gone).
    pub(crate) async fn a_forced_delete_of_a_running_task_lets_the_next_start_beside_it<H: Harness>(h: &H) {
        let s = h.store("rv_groups_delete").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped("g", 0).id("a")).await.unwrap();
        q.enqueue(grouped("g", 1)).await.unwrap();
        let log = Log::default();
        let stop = CancellationToken::new();
        let w = agent(&s, h.ttl(), Some(1), &stop);
        let l = log.clone();
        let worker = tokio::spawn(async move {
            w.work(move |t: Task| {
                let l = l.clone();
                async move {
                    let i = t.data().get_i64("i").unwrap();
                    l.lock().unwrap().push(("g".into(), i, true));
                    if i == 0 {
                        t.cancellation().cancelled().await;
                    }
                    l.lock().unwrap().push(("g".into(), i, false));
                    Outcome::done()
                }
            })
            .await
            .unwrap()
        });
        until("task 0 to start", 30, || started(&log, 0)).await;
        assert_eq!(q.delete(doc! { "_id": "a" }).force(true).await.unwrap().len(), 1);
        until("task 0's handler to end", 30, || ended(&log, 0)).await;
        until("task 1 to run", 60, || ended(&log, 1)).await;
        stop.cancel();
        worker.await.unwrap();
        let log = log.lock().unwrap().clone();
        assert_eq!(most_at_once(&log), 1, "two handlers of one group ran at once with a cap of 1: {log:?}");
    }

    /// FOUND in the docs, which said tasks "start in the order of their
    /// numbers": two enqueue calls that overlap have no order, and the docs
    /// now say so; what is kept is that each runs once. A
    /// task is numbered before its insert: producer P1 takes number 1, its
    /// insert is slow; P2 takes number 2, is inserted, let through and run;
    /// then P1's task runs. With a cap of 1, number 2 started before 1.
    pub(crate) async fn a_slow_insert_lets_a_later_number_start_first<H: Harness>(h: &H) {
        let s = h.store("rv_groups_slow_insert").await;
        let slow = Intercepted::with(s.clone(), Producer::default());
        slow.hold_insert.store(true, Ordering::SeqCst);
        let p1 = tokio::spawn({
            let q = Queue::new(slow.clone(), "tasks").unwrap();
            async move { q.enqueue(grouped("g", 1)).await }
        });
        slow.reached.notified().await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped("g", 2)).await.unwrap();
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        let order = Arc::new(Mutex::new(Vec::new()));
        let handler = {
            let order = order.clone();
            move |t: Task| {
                order.lock().unwrap().push(t.data().get_i64("i").unwrap());
                async { true }
            }
        };
        a.process(handler.clone()).await.unwrap();
        slow.open.add_permits(1);
        p1.await.unwrap().unwrap();
        for _ in 0..10 {
            if a.process(handler.clone()).await.unwrap().is_none() {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        let seqs: Vec<(i64, i64)> = s
            .find(&tasks(), &Query::all())
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get_i64("i").unwrap(), r.get_i64("group_seq").unwrap()))
            .collect();
        // Decided: enqueue calls that overlap have no order between them
        // (docs/invariants.md, "Groups"); each of the two runs once.
        let mut ran = order.lock().unwrap().clone();
        ran.sort_unstable();
        assert_eq!(ran, [1, 2], "each ran once (i, group_seq): {seqs:?}");
    }
}
