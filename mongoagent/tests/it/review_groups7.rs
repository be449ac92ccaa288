//! Seventh review of groups: grouped fan-in tasks (`Outcome::then` with
//! `NewTask::group`), the refusal of follow-ups behind a waiting chain's
//! turn, and grouped schedule ticks, every backend. Each test says what it
//! attacks; one that fails is a finding.
//!
//! One attack found a deadlock the queue does not detect: two waiting
//! tasks in two groups, each waiting (through a follow-up of another name)
//! for a task in the other's group, wait for each other for ever under a
//! cap of 1, as two locks taken in opposite orders do. The check in
//! `agent/turns.rs` follows one chain of waits, not the graph across
//! chains; it is a documented limit (docs/invariants.md, groups), and its
//! test is not kept here. Every other attack held.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson};
use mongoagent::schedule::{Missed, Overlap, Schedule, Schedules};
use mongoagent::{Agent, NewTask, Outcome, Processed, Queue, Task};
use store_test::Harness;
use store_trait::{Collection, Key, Mutation, Query, Store, Write};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::groups::{agent, grouped, Log};
use crate::review_groups::{slots, tasks, until, Boxed};

/// A handler for `w` that logs each run's start and end, and behaves as
/// its data says: `fail_first: n` fails its first `n` attempts (counted
/// from 1),
/// `fail_for_good: true` fails for good, `sleep: ms` sleeps that long.
fn behave(log: Log) -> impl Fn(Task) -> Boxed + Send + Sync + Clone {
    move |t: Task| {
        let log = log.clone();
        Box::pin(async move {
            let d = t.data().clone();
            let g = d.get_str("g").unwrap_or("-").to_owned();
            let i = d.get_i64("i").unwrap_or(-1);
            log.lock().unwrap().push((g.clone(), i, true));
            tokio::time::sleep(Duration::from_millis(d.get_i64("sleep").unwrap_or(40) as u64)).await;
            log.lock().unwrap().push((g, i, false));
            if let Ok(n) = d.get_i64("fail_first") {
                if (t.attempt() as i64) <= n {
                    return Outcome::failed("planned failure");
                }
            }
            if d.get_bool("fail_for_good").ok() == Some(true) {
                return Outcome::failed_permanently("planned failure for good");
            }
            Outcome::done()
        }) as Boxed
    }
}

/// A grouped task of `w` with extra data.
fn grouped_with(g: &str, i: i64, extra: bson::Document) -> NewTask {
    let mut d = doc! { "g": g, "i": i };
    d.extend(extra);
    NewTask::new("w", d).group(g)
}

/// The starts in the log, in order.
fn starts(log: &Log) -> Vec<i64> {
    log.lock().unwrap().iter().filter(|(_, _, s)| *s).map(|(_, i, _)| *i).collect()
}

/// The most runs of one group at once in the log.
fn most_at_once(log: &Log) -> usize {
    let mut per = std::collections::HashMap::<String, usize>::new();
    let mut most = 0;
    for (g, _, start) in log.lock().unwrap().iter() {
        let n = per.entry(g.clone()).or_default();
        if *start {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        most = most.max(*n);
    }
    most
}

/// The tasks of `order` by their first start.
fn firsts(order: &[i64]) -> Vec<i64> {
    let mut seen = Vec::new();
    for &i in order {
        if !seen.contains(&i) {
            seen.push(i);
        }
    }
    seen
}

/// Runs `agents` agents with `cap` running `handler` until the stats of
/// `w` are `done` (or `secs` passed).
async fn work_w<S: Store + Clone, F: mongoagent::Handler + Clone>(
    h: &impl Harness,
    s: &S,
    agents: usize,
    cap: usize,
    handler: F,
    secs: u64,
    done: impl Fn(&mongoagent::QueueStats) -> bool,
) {
    crate::groups::work_within(h, s, agents, cap, || handler.clone(), Duration::from_secs(secs), done).await;
}

/// The record of `key` in `tasks`, if any.
async fn record<S: Store>(s: &S, key: &str) -> Option<store_trait::Record> {
    s.get(&tasks(), &Key::new(key).unwrap()).await.unwrap().record
}

/// Every slot of the queue: (key, announced, landed).
async fn slot_counts<S: Store>(s: &S) -> Vec<(String, i64, i64)> {
    s.find(&slots(), &Query::all())
        .await
        .unwrap()
        .iter()
        .map(|r| (r.key().to_string(), r.get_i64("announced").unwrap_or(0), r.get_i64("landed").unwrap_or(0)))
        .collect()
}

/// An uncapped agent of `name`.
fn plain<S: Store + Clone>(s: &S, name: &str, ttl: Duration) -> Agent<S> {
    Agent::builder(s.clone(), name, "tasks")
        .ttl(ttl)
        .max_attempts(5)
        .backoff(Duration::from_millis(20), Duration::from_millis(40))
        .poll_interval(Duration::from_millis(200))
        .build()
        .unwrap()
}

/// Runs `a.process(handler)` until it processed a task (or 30 s passed).
async fn process_one<S: Store + Clone>(a: &Agent<S>, handler: impl mongoagent::Handler + Clone) -> Processed {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(p) = a.process(handler.clone()).await.unwrap() {
            return p;
        }
        assert!(Instant::now() < deadline, "nothing to process");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The suite (`review_groups7_suite`): each `pub(crate) async fn` over a
/// `Harness` here is one test on every backend, registered by being written.
#[store_test::suite(review_groups7_suite, crate::review_groups7::cases)]
pub(crate) mod cases {
    use super::*;

    /// A grouped fan-in task whose grouped follow-ups retry and fail for
    /// good runs once, after all of them (each of their retries before
    /// it), then the task enqueued after: one at a time under a cap of 1.
    pub(crate) async fn a_fan_in_after_retried_and_failed_follow_ups_runs_once_in_its_place<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_retry").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let p = plain(&s, "p", h.ttl());
        q.enqueue(NewTask::new("p", doc! {}).id("job")).await.unwrap();
        let out = p
            .process(|_t: Task| async {
                Outcome::done()
                    .follow_up(grouped_with("g", 10, doc! { "fail_first": 2_i64 }))
                    .follow_up(grouped_with("g", 11, doc! { "fail_for_good": true }).max_attempts(1))
                    .then(grouped("g", 12))
            })
            .await
            .unwrap();
        assert_eq!(out, Some(Processed::Completed(Key::new("job").unwrap())));
        q.enqueue(grouped("g", 20)).await.unwrap();
        let log = Log::default();
        work_w(h, &s, 2, 1, behave(log.clone()), 60, |st| st.completed + st.failed >= 4).await;
        assert_eq!(starts(&log), [10, 10, 10, 11, 12, 20], "retries before the next, the fan-in in its place");
        assert_eq!(most_at_once(&log), 1);
        let then = record(&s, "job/then").await.unwrap();
        assert_eq!(then.get_bool("complete"), Some(true), "{then:?}");
        for (k, a, l) in slot_counts(&s).await {
            assert!(a <= l, "slot {k}: every announcement landed ({a} > {l})");
        }
    }

    /// Two last follow-ups (of another agent name, ungrouped) that end at
    /// once both find every follow-up ended: the grouped fan-in task is
    /// made held once, runs once, and its slot owes no landing.
    pub(crate) async fn two_last_follow_ups_ending_at_once_hold_the_fan_in_once<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_two_last").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let p = plain(&s, "p", h.ttl());
        q.enqueue(NewTask::new("p", doc! {}).id("job")).await.unwrap();
        p.process(|_t: Task| async {
            Outcome::done()
                .follow_up(NewTask::new("x", doc! {}))
                .follow_up(NewTask::new("x", doc! {}))
                .then(grouped("g", 12))
        })
        .await
        .unwrap();
        // Both follow-ups' handlers end together (a barrier), in two agents.
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let x_handler = {
            let barrier = barrier.clone();
            move |_t: Task| {
                let barrier = barrier.clone();
                async move {
                    barrier.wait().await;
                    Outcome::done()
                }
            }
        };
        let (x1, x2) = (plain(&s, "x", h.ttl()), plain(&s, "x", h.ttl()));
        let (a, b) = tokio::join!(process_one(&x1, x_handler.clone()), process_one(&x2, x_handler.clone()));
        assert!(matches!(a, Processed::Completed(_)) && matches!(b, Processed::Completed(_)), "{a:?} {b:?}");
        let then = record(&s, "job/then").await.unwrap();
        assert_eq!(then.get_bool("group_held"), Some(true), "held in its group: {then:?}");
        assert_eq!(then.get_i64("round"), Some(1), "woken once: {then:?}");
        q.enqueue(grouped("g", 20)).await.unwrap();
        let log = Log::default();
        work_w(h, &s, 2, 1, behave(log.clone()), 30, |st| st.completed >= 2).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(starts(&log), [12, 20]);
        for (k, a, l) in slot_counts(&s).await {
            assert!(a <= l, "slot {k}: every announcement landed ({a} > {l})");
        }
        let slot = s.find(&slots(), &Query::all()).await.unwrap();
        assert!(slot.iter().all(|r| r.get_bool("active") == Some(false)), "the slot settles inactive: {slot:?}");
    }

    /// A parent whose claim lapses while its handler (which returns a
    /// grouped fan-in task with grouped follow-ups) still runs is run again
    /// by another agent; the stale run's outcome is rejected. The fan-in
    /// task and each follow-up run once, in order, one at a time; nothing
    /// pending is left behind.
    pub(crate) async fn a_parent_rerun_after_its_claim_lapsed_runs_its_grouped_fan_in_once<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_lapse").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("p", doc! {}).id("job")).await.unwrap();
        let ttl = h.ttl();
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = {
            let runs = runs.clone();
            move |_t: Task| {
                let n = runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        // Past its lease: the claim lapses (its agent is cut off
                        // from the store meanwhile, see below).
                        tokio::time::sleep(ttl * 3).await;
                    }
                    Outcome::done().follow_up(grouped("g", 10)).follow_up(grouped("g", 11)).then(grouped("g", 12))
                }
            }
        };
        // The first agent's lease renewals fail: a partitioned agent.
        let cut = store_test::Intercepted::with(s.clone(), CutRenewals::default());
        let p1 = plain(&cut, "p", ttl);
        let p2 = plain(&s, "p", ttl);
        let first = tokio::spawn({
            let handler = handler.clone();
            async move { p1.process(handler).await }
        });
        until("the first run starts", 10, || runs.load(Ordering::SeqCst) == 1).await;
        cut.cut.store(true, Ordering::SeqCst);
        let second = process_one(&p2, handler.clone()).await;
        assert_eq!(second, Processed::Completed(Key::new("job").unwrap()));
        // The first agent reaches the store again: its run ends, stale.
        cut.cut.store(false, Ordering::SeqCst);
        let stale = first.await.unwrap();
        assert!(matches!(stale, Ok(Some(Processed::Stale(_))) | Err(_)), "{stale:?}");
        q.enqueue(grouped("g", 20)).await.unwrap();
        let log = Log::default();
        work_w(h, &s, 2, 1, behave(log.clone()), 60, |st| st.completed >= 4).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(starts(&log), [10, 11, 12, 20]);
        let pending = s
            .find(&tasks(), &Query::all().when(store_trait::Condition::Exists("pending_parent_fence".into())))
            .await
            .unwrap();
        assert!(pending.is_empty(), "no pending copy left: {pending:?}");
    }

    /// A grouped fan-in task with a cap of 2: its grouped follow-ups take
    /// two turns, it takes none while they run, and never more than two of
    /// the group run at once; each task runs once.
    pub(crate) async fn a_fan_in_in_a_group_with_a_cap_of_two_keeps_the_cap<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_cap2").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let p = plain(&s, "p", h.ttl());
        for j in 0..3 {
            q.enqueue(NewTask::new("p", doc! { "j": j }).id(format!("job{j}"))).await.unwrap();
        }
        for _ in 0..3 {
            process_one(&p, |t: Task| async move {
                let j = t.data().get_i32("j").map(i64::from).or_else(|_| t.data().get_i64("j")).unwrap();
                Outcome::done()
                    .follow_up(grouped_with("g", 100 * j + 1, doc! { "sleep": 150_i64 }))
                    .follow_up(grouped_with("g", 100 * j + 2, doc! { "sleep": 150_i64, "fail_first": 1_i64 }))
                    .follow_up(grouped_with("g", 100 * j + 3, doc! { "sleep": 150_i64 }))
                    .then(grouped_with("g", 100 * j + 50, doc! { "sleep": 150_i64 }))
            })
            .await;
        }
        for i in 0..4 {
            q.enqueue(grouped_with("g", 1000 + i, doc! { "sleep": 150_i64 })).await.unwrap();
        }
        let log = Log::default();
        work_w(h, &s, 3, 2, behave(log.clone()), 60, |st| st.completed >= 16).await;
        let st = q.stats("w").await.unwrap();
        assert_eq!(st.completed, 16, "{st:?}");
        assert!(most_at_once(&log) <= 2, "a cap of 2: {:?}", log.lock().unwrap());
        let mut runs = starts(&log);
        let retried = runs.iter().filter(|&&i| i % 100 == 2 && i < 1000).count();
        assert_eq!(retried, 6, "each retried once: {runs:?}");
        runs.sort_unstable();
        runs.dedup();
        assert_eq!(runs.len(), 16, "{runs:?}");
        // Each fan-in task after its own follow-ups.
        let order = starts(&log);
        for j in 0..3_i64 {
            let then = order.iter().position(|&i| i == 100 * j + 50).unwrap();
            for k in 1..=3 {
                let last = order.iter().rposition(|&i| i == 100 * j + k).unwrap();
                assert!(last < then, "{order:?}");
            }
        }
    }

    /// Nested fan-ins in one group under a cap of 1: a grouped follow-up
    /// returns a grouped fan-in task of its own, which extends the outer
    /// fan-in task's wait (that one keeps no turn, so it is allowed). All
    /// run, once, inner before outer, then the task enqueued after.
    pub(crate) async fn nested_grouped_fan_ins_in_one_group_all_run_once<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_nested").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let p = plain(&s, "p", h.ttl());
        q.enqueue(NewTask::new("p", doc! {}).id("job")).await.unwrap();
        p.process(|_t: Task| async {
            Outcome::done().follow_up(grouped_with("g", 1, doc! { "nest": true })).then(grouped("g", 9))
        })
        .await
        .unwrap();
        q.enqueue(grouped("g", 20)).await.unwrap();
        let log = Log::default();
        let order_log = log.clone();
        let inner = behave(log.clone());
        let handler = move |t: Task| -> Boxed {
            if t.data().get_bool("nest").ok() == Some(true) {
                let log = log.clone();
                Box::pin(async move {
                    log.lock().unwrap().push(("g".into(), 1, true));
                    log.lock().unwrap().push(("g".into(), 1, false));
                    Outcome::done().follow_up(grouped("g", 2)).then(grouped("g", 3))
                })
            } else {
                inner(t)
            }
        };
        work_w(h, &s, 2, 1, handler, 60, |st| st.completed >= 5).await;
        let st = q.stats("w").await.unwrap();
        assert_eq!((st.completed, st.failed, st.waiting), (5, 0, 0), "{st:?}");
        // The inner follow-up and fan-in task are numbered when the outer
        // follow-up returns them, after task 20: causal order only.
        let order = starts(&order_log);
        let at = |i: i64| order.iter().position(|&x| x == i).unwrap();
        assert!(at(1) < at(2) && at(2) < at(3) && at(3) < at(9), "{order:?}");
        // Each ran (a run may start again on a loaded server, after a
        // lapsed claim or an outcome write that failed; the five
        // completions above are each task's once).
        assert_eq!(firsts(&order).len(), 5, "{order:?}");
    }

    /// The chain check reads foreign documents: a `join` to a missing task,
    /// a loop of joins, a `join` that is a number naming a waiting task of
    /// the group (refused, naming it), a `join` that is a document. None
    /// panics or hangs; each outcome is one of a waiting task or a refusal.
    pub(crate) async fn the_chain_check_survives_foreign_joins<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_chain").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let coll = tasks();
        // A loop of two waiting ungrouped tasks, and a waiting grouped task
        // with a number for an id.
        s.insert_many(
            &coll,
            vec![
                doc! { "_id": "l1", "agent_name": "z", "ready": false, "waiting": 0_i64, "join": "l2", "complete": false },
                doc! { "_id": "l2", "agent_name": "z", "ready": false, "waiting": 0_i64, "join": "l1", "complete": false },
                doc! { "_id": 7_i64, "agent_name": "w", "group_key": "g", "ready": false, "waiting": 0_i64, "complete": false },
            ],
        )
        .await
        .unwrap();
        let x = plain(&s, "x", h.ttl());
        let waits = |_t: Task| async { Outcome::done().follow_up(grouped("g", 1)).wait_for_follow_ups() };
        for (id, join, refused) in [
            ("missing", Bson::String("nowhere".into()), false),
            ("looped", Bson::String("l1".into()), false),
            ("numbered", Bson::Int64(7), true),
            ("document", Bson::Document(doc! { "a": 1 }), false),
        ] {
            q.enqueue(NewTask::new("x", doc! {}).id(id)).await.unwrap();
            let w =
                Write::new(store_trait::Condition::Always, Mutation::new().set("join", join).set("join_round", 0_i64));
            s.write(&coll, &Key::new(id).unwrap(), &w).await.unwrap();
            let out = tokio::time::timeout(Duration::from_secs(30), x.process(waits)).await;
            let out = out.expect("no hang").unwrap();
            let key = Key::new(id).unwrap();
            if refused {
                assert_eq!(out, Some(Processed::Failed(key)), "{id}");
                let error = record(&s, id).await.unwrap().get_str("last_error").unwrap().to_owned();
                assert!(error.contains("of task 7"), "{id}: {error}");
            } else {
                assert_eq!(out, Some(Processed::Waiting(key)), "{id}");
            }
        }
    }

    /// A requeue of a failed follow-up while its grouped fan-in task still
    /// waits for its sibling: the fan-in task waits for the requeued one
    /// too, and runs once, after both, in its place.
    pub(crate) async fn a_requeued_follow_up_holds_its_grouped_fan_in_back<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_requeue").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let p = plain(&s, "p", h.ttl());
        q.enqueue(NewTask::new("p", doc! {}).id("job")).await.unwrap();
        p.process(|_t: Task| async {
            Outcome::done()
                .follow_up(NewTask::new("x", doc! { "k": "fail" }).max_attempts(1))
                .follow_up(NewTask::new("x", doc! { "k": "slow" }))
                .then(grouped("g", 12))
        })
        .await
        .unwrap();
        let x = plain(&s, "x", h.ttl());
        let fails = Arc::new(AtomicUsize::new(0));
        let x_handler = {
            let fails = fails.clone();
            move |t: Task| {
                let fail = t.data().get_str("k").ok() == Some("fail") && fails.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    if fail {
                        Outcome::failed_permanently("first time")
                    } else {
                        Outcome::done()
                    }
                }
            }
        };
        // The failing one ends (for good) first.
        let first = process_one(&x, x_handler.clone()).await;
        assert_eq!(first, Processed::Failed(Key::new("job/0").unwrap()));
        let requeued = q.requeue_ids(&[Key::new("job/0").unwrap()]).await.unwrap();
        assert_eq!(requeued.len(), 1, "{requeued:?}");
        // The slow sibling ends: the fan-in task still waits for the requeued one.
        let mut ended = Vec::new();
        ended.push(process_one(&x, x_handler.clone()).await);
        let then = record(&s, "job/then").await.unwrap();
        let log = Log::default();
        q.enqueue(grouped("g", 20)).await.unwrap();
        if then.get_bool("group_held") == Some(true) || then.get_bool("ready") == Some(true) {
            panic!("woken with a follow-up live again: {then:?} after {ended:?}");
        }
        ended.push(process_one(&x, x_handler.clone()).await);
        work_w(h, &s, 1, 1, behave(log.clone()), 30, |st| st.completed >= 2).await;
        assert_eq!(starts(&log), [12, 20], "{ended:?}");
    }

    /// The write that makes a grouped fan-in task held, after its last
    /// follow-up ended, fails once: the follow-up's agent reports the
    /// error, and the follow-up's next claim finishes the step. The fan-in
    /// task runs once, in its place, and the slot owes no landing.
    pub(crate) async fn a_failed_wake_into_the_group_is_finished_by_the_next_claim<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_failed_wake").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let p = plain(&s, "p", h.ttl());
        q.enqueue(NewTask::new("p", doc! {}).id("job")).await.unwrap();
        p.process(|_t: Task| async { Outcome::done().follow_up(NewTask::new("x", doc! {})).then(grouped("g", 12)) })
            .await
            .unwrap();
        q.enqueue(grouped("g", 20)).await.unwrap();
        let failing = store_test::Intercepted::with(s.clone(), FailWriteOnce::new("job/then"));
        let x = plain(&failing, "x", h.ttl());
        let first = x.process(|_t: Task| async { Outcome::done() }).await;
        assert!(first.is_err(), "the wake's write failed: {first:?}");
        let then = record(&s, "job/then").await.unwrap();
        assert_eq!(then.get_i64("waiting"), Some(0), "not woken yet: {then:?}");
        let again = process_one(&x, |_t: Task| async { Outcome::done() }).await;
        assert_eq!(again, Processed::Recovered(Key::new("job/0").unwrap()));
        let log = Log::default();
        work_w(h, &s, 1, 1, behave(log.clone()), 30, |st| st.completed >= 2).await;
        assert_eq!(starts(&log), [12, 20]);
        for (k, a, l) in slot_counts(&s).await {
            assert!(a <= l, "slot {k}: every announcement landed ({a} > {l})");
        }
    }

    /// Grouped fan-in tasks with grouped follow-ups (one failing once) and
    /// an ungrouped one, beside plain grouped tasks, in two groups under a
    /// cap of 1, while agents of `w` crash (aborted, their claims lapse)
    /// and are replaced: every task ends, each group runs one at a time,
    /// and each fan-in task starts after its follow-ups' last start.
    pub(crate) async fn grouped_fan_ins_under_crashing_agents_keep_the_cap_and_end<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_crash").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        for j in 0..4_i64 {
            q.enqueue(NewTask::new("p", doc! { "j": j })).await.unwrap();
            q.enqueue(grouped(&format!("g{}", j % 2), 900 + j)).await.unwrap();
        }
        let stop = CancellationToken::new();
        let p = Agent::builder(s.clone(), "p", "tasks").ttl(h.ttl()).shutdown_on(&stop).build().unwrap();
        let ps = tokio::spawn(async move {
            p.work(|t: Task| async move {
                let j = t.data().get_i64("j").unwrap();
                let g = format!("g{}", j % 2);
                Outcome::done()
                    .follow_up(grouped_with(&g, 100 * j + 1, doc! { "sleep": 120_i64 }))
                    .follow_up(grouped_with(&g, 100 * j + 2, doc! { "sleep": 120_i64, "fail_first": 1_i64 }))
                    .follow_up(NewTask::new("x", doc! {}))
                    .then(grouped_with(&g, 100 * j + 50, doc! { "sleep": 120_i64 }))
            })
            .await
            .unwrap()
        });
        let x = Agent::builder(s.clone(), "x", "tasks").ttl(h.ttl()).shutdown_on(&stop).build().unwrap();
        let xs = tokio::spawn(async move {
            x.work(|_t: Task| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Outcome::done()
            })
            .await
            .unwrap()
        });
        let log = Log::default();
        let handler = {
            let log = log.clone();
            move |t: Task| -> Boxed {
                let log = log.clone();
                Box::pin(async move {
                    let d = t.data().clone();
                    let g = d.get_str("g").unwrap().to_owned();
                    let i = d.get_i64("i").unwrap();
                    log.lock().unwrap().push((g.clone(), i, true));
                    let _end = crate::review_groups::Ends(log.clone(), g, i);
                    tokio::time::sleep(Duration::from_millis(d.get_i64("sleep").unwrap_or(60) as u64)).await;
                    if d.get_i64("fail_first").is_ok_and(|n| t.attempt() as i64 <= n) {
                        return Outcome::failed("planned");
                    }
                    Outcome::done()
                })
            }
        };
        let spawn = |stop: &CancellationToken| {
            let a = agent(&s, h.ttl(), Some(1), stop);
            let handler = handler.clone();
            tokio::spawn(async move {
                let _ = a.work(handler).await;
            })
        };
        let mut workers: Vec<_> = (0..3).map(|_| spawn(&stop)).collect();
        for round in 0..10 {
            tokio::time::sleep(Duration::from_millis(450)).await;
            // A crash: the agent's task is gone, its claims lapse.
            workers[round % 3].abort();
            workers[round % 3] = spawn(&stop);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while q.stats("w").await.unwrap().completed < 16 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.cancel();
        for w in workers {
            let _ = w.await;
        }
        ps.await.unwrap();
        xs.await.unwrap();
        let st = q.stats("w").await.unwrap();
        assert_eq!((st.completed, st.failed, st.waiting), (16, 0, 0), "{st:?}");
        assert_eq!(most_at_once(&log), 1, "one at a time per group: {:?}", log.lock().unwrap());
        let order = starts(&log);
        for j in 0..4_i64 {
            let then = order.iter().position(|&i| i == 100 * j + 50).unwrap();
            for k in 1..=2 {
                let last = order.iter().rposition(|&i| i == 100 * j + k).unwrap();
                assert!(last < then, "{order:?}");
            }
        }
    }

    /// A grouped fan-in task made held while its group runs a long task
    /// waits in its place: after a task numbered before it (cancelled
    /// here: then not at all), ahead of the ones enqueued after its parent
    /// returned it, whatever their priority.
    pub(crate) async fn a_fan_in_held_behind_a_long_task_takes_its_place<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_place").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped_with("g", 0, doc! { "sleep": 2500_i64 })).await.unwrap();
        let (before, _) = q.enqueue(grouped("g", 1)).await.unwrap();
        q.enqueue(grouped("g", 2)).await.unwrap();
        let p = plain(&s, "p", h.ttl());
        q.enqueue(NewTask::new("p", doc! {}).id("job")).await.unwrap();
        p.process(|_t: Task| async { Outcome::done().follow_up(NewTask::new("x", doc! {})).then(grouped("g", 12)) })
            .await
            .unwrap();
        q.enqueue(grouped("g", 20).priority(100)).await.unwrap();
        q.enqueue(grouped("g", 21)).await.unwrap();
        let stop = CancellationToken::new();
        let log = Log::default();
        let a = agent(&s, h.ttl(), Some(1), &stop);
        let run = tokio::spawn({
            let handler = behave(log.clone());
            async move { a.work(handler).await.unwrap() }
        });
        until("the long task starts", 20, || starts(&log) == [0]).await;
        // Its follow-up ends while the long task runs: held in its place.
        let x = plain(&s, "x", h.ttl());
        assert!(matches!(process_one(&x, |_t: Task| async { Outcome::done() }).await, Processed::Completed(_)));
        let then = record(&s, "job/then").await.unwrap();
        assert_eq!(then.get_bool("group_held"), Some(true), "{then:?}");
        assert_eq!(q.cancel_ids(&[before]).await.unwrap().len(), 1);
        let deadline = Instant::now() + Duration::from_secs(60);
        while q.stats("w").await.unwrap().completed < 5 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.cancel();
        run.await.unwrap();
        // By first starts: a run may start again after its claim lapsed on
        // a loaded server.
        assert_eq!(firsts(&starts(&log)), [0, 2, 12, 20, 21]);
    }

    /// A wait extended twice through `then` (a waiting grouped task's
    /// follow-up returns a fan-in task, whose follow-up returns another):
    /// a follow-up three up the chain from the waiting task, in its group,
    /// is refused, naming it; one in another group is not.
    pub(crate) async fn a_follow_up_behind_a_twice_extended_wait_is_refused<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_extended").await;
        // Each step is one `process` call, in order: a claim that lapsed
        // under a loaded server (the real server's harness leases for
        // 600 ms) would be run again and shift the steps.
        let ttl = h.ttl().max(Duration::from_secs(10));
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (top, _) = q.enqueue(grouped("g", 0)).await.unwrap();
        let w = agent(&s, ttl, Some(1), &CancellationToken::new());
        let top_handler = |t: Task| async move {
            if t.round() > 0 {
                return Outcome::done();
            }
            Outcome::done().follow_up(NewTask::new("x", doc! { "step": "a" })).wait_for_follow_ups()
        };
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(process_one(&w, top_handler).await, Processed::Waiting(top.clone()));
        let x = plain(&s, "x", ttl);
        let step = |t: Task| async move {
            match t.data().get_str("step").unwrap() {
                "a" => Outcome::done()
                    .follow_up(NewTask::new("x", doc! { "step": "b" }))
                    .then(NewTask::new("x", doc! { "step": "t1" })),
                "b" => Outcome::done()
                    .follow_up(NewTask::new("x", doc! { "step": "c" }))
                    .then(NewTask::new("x", doc! { "step": "t2" })),
                "c" => {
                    if t.attempt() == 1 && t.data().get_bool("other").is_err() {
                        Outcome::done().follow_up(grouped("g", 5)).wait_for_follow_ups()
                    } else {
                        Outcome::done()
                    }
                }
                _ => Outcome::done(),
            }
        };
        assert!(matches!(process_one(&x, step).await, Processed::Completed(_)));
        assert!(matches!(process_one(&x, step).await, Processed::Completed(_)));
        let c = process_one(&x, step).await;
        let Processed::Failed(c_key) = c else { panic!("refused: {c:?}") };
        let error = record(&s, c_key.as_str().unwrap()).await.unwrap().get_str("last_error").unwrap().to_owned();
        assert!(error.contains(&format!("of task {top}")) && error.contains("3 up the chain"), "{error}");
        // The chain then ends: t2, t1, and the top task complete.
        for _ in 0..2 {
            assert!(matches!(process_one(&x, step).await, Processed::Completed(_)));
        }
        assert_eq!(process_one(&w, top_handler).await, Processed::Completed(top));
    }

    /// Under a cap of 2, a grouped fan-in task's two grouped follow-ups end
    /// at once (a barrier) in two agents: it is made held once, runs once,
    /// never a third run beside two, and the slot owes no landing.
    pub(crate) async fn two_grouped_last_follow_ups_ending_at_once_under_a_cap_of_two<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_two_cap2").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let p = plain(&s, "p", h.ttl());
        q.enqueue(NewTask::new("p", doc! {}).id("job")).await.unwrap();
        p.process(|_t: Task| async {
            Outcome::done()
                .follow_up(grouped_with("g", 10, doc! { "meet": true }))
                .follow_up(grouped_with("g", 11, doc! { "meet": true }))
                .then(grouped("g", 12))
        })
        .await
        .unwrap();
        for i in 20..23 {
            q.enqueue(grouped("g", i)).await.unwrap();
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let log = Log::default();
        let inner = behave(log.clone());
        let handler = {
            let log = log.clone();
            move |t: Task| -> Boxed {
                if t.data().get_bool("meet").is_ok() {
                    let (barrier, log) = (barrier.clone(), log.clone());
                    Box::pin(async move {
                        let i = t.data().get_i64("i").unwrap();
                        log.lock().unwrap().push(("g".into(), i, true));
                        barrier.wait().await;
                        log.lock().unwrap().push(("g".into(), i, false));
                        Outcome::done()
                    })
                } else {
                    inner(t)
                }
            }
        };
        work_w(h, &s, 2, 2, handler, 60, |st| st.completed >= 6).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let order = starts(&log);
        assert_eq!(order.iter().filter(|&&i| i == 12).count(), 1, "{order:?}");
        assert_eq!(order.len(), 6, "{order:?}");
        assert!(most_at_once(&log) <= 2, "{:?}", log.lock().unwrap());
        for (k, a, l) in slot_counts(&s).await {
            assert!(a <= l, "slot {k}: every announcement landed ({a} > {l})");
        }
    }

    /// The group's slot is collected (deleted, as `SLOT_RETAIN` does) while
    /// a grouped fan-in task waits: its wake makes the slot anew with its
    /// number, so a task enqueued after the wake runs after it.
    pub(crate) async fn a_fan_in_woken_after_its_slot_was_collected_keeps_its_number<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_collected").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        for i in 0..3 {
            q.enqueue(grouped("g", i)).await.unwrap();
        }
        let p = plain(&s, "p", h.ttl());
        q.enqueue(NewTask::new("p", doc! {}).id("job")).await.unwrap();
        p.process(|_t: Task| async { Outcome::done().follow_up(NewTask::new("x", doc! {})).then(grouped("g", 12)) })
            .await
            .unwrap();
        let log = Log::default();
        work_w(h, &s, 1, 1, behave(log.clone()), 30, |st| st.completed >= 3).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        for r in s.find(&slots(), &Query::all()).await.unwrap() {
            s.delete(&slots(), r.key(), &store_trait::Condition::Always).await.unwrap();
        }
        let x = plain(&s, "x", h.ttl());
        assert!(matches!(process_one(&x, |_t: Task| async { Outcome::done() }).await, Processed::Completed(_)));
        q.enqueue(grouped("g", 20)).await.unwrap();
        work_w(h, &s, 1, 1, behave(log.clone()), 30, |st| st.completed >= 5).await;
        assert_eq!(starts(&log), [0, 1, 2, 12, 20]);
    }

    /// A schedule with grouped ticks, `Missed::All`, and three schedulers
    /// passing at once over five missed ticks: each tick is enqueued once,
    /// they run in tick order, one at a time, before a task enqueued after.
    pub(crate) async fn racing_schedulers_enqueue_grouped_missed_ticks_in_tick_order<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_ticks").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let schedules = Schedules::with_collection(s.clone(), "tasks", "tasks_schedules").unwrap();
        let tick = NewTask::new("w", doc! { "g": "g", "i": 100_i64 }).group("g");
        let every = Schedule::every("tick", Duration::from_secs(1), tick)
            .unwrap()
            .overlap(Overlap::Allow)
            .missed(Missed::All(10))
            .starting_deadline(Duration::from_secs(3600));
        schedules.upsert(&every).await.unwrap();
        // Its ticks are missed since six seconds ago.
        let now = s.now().await.unwrap().as_millis();
        let back = Write::new(store_trait::Condition::Always, Mutation::new().set("since", now - 6_000));
        s.write(&Collection::new("tasks_schedules").unwrap(), &Key::new("tick").unwrap(), &back).await.unwrap();
        let passes = (0..3).map(|_| {
            let sched = schedules.scheduler();
            async move { sched.pass().await.unwrap().enqueued }
        });
        let enqueued: u64 = futures::future::join_all(passes).await.into_iter().sum();
        assert!(enqueued >= 5, "{enqueued}");
        q.enqueue(grouped("g", 1)).await.unwrap();
        let ticks = q.tasks(doc! { "schedule": "tick" }, None).await.unwrap();
        let n = ticks.len() as u64;
        // The tick's start order, by the handler's view of its id.
        let order = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let log = Log::default();
        let handler = {
            let order = order.clone();
            let inner = behave(log.clone());
            move |t: Task| {
                order.lock().unwrap().push(t.id().to_string());
                inner(t)
            }
        };
        work_w(h, &s, 2, 1, handler, 60, |st| st.completed > n).await;
        let order = order.lock().unwrap().clone();
        assert_eq!(order.len() as u64, n + 1, "each once: {order:?}");
        let ticks: Vec<i64> =
            order[..order.len() - 1].iter().map(|k| k.rsplit('/').next().unwrap().parse::<i64>().unwrap()).collect();
        let mut sorted = ticks.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(ticks, sorted, "tick order, each once: {order:?}");
        assert!(!order.last().unwrap().starts_with("sched/"), "the enqueued task last: {order:?}");
        assert_eq!(most_at_once(&log), 1);
    }

    /// A grouped schedule with `Overlap::Skip` whose tick waits (held)
    /// behind its group's long task: racing schedulers' later passes skip
    /// the ticks that fall meanwhile, and the held tick runs once.
    pub(crate) async fn grouped_skip_ticks_held_behind_a_long_task_run_once<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_skip").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped_with("g", 0, doc! { "sleep": 3000_i64 })).await.unwrap();
        let schedules = Schedules::with_collection(s.clone(), "tasks", "tasks_schedules").unwrap();
        let tick = NewTask::new("w", doc! { "g": "g", "i": 100_i64 }).group("g");
        schedules
            .upsert(&Schedule::every("tick", Duration::from_secs(1), tick).unwrap().overlap(Overlap::Skip))
            .await
            .unwrap();
        let stop = CancellationToken::new();
        let log = Log::default();
        let a = agent(&s, h.ttl(), Some(1), &stop);
        let run = tokio::spawn({
            let handler = behave(log.clone());
            async move { a.work(handler).await.unwrap() }
        });
        until("the long task starts", 20, || starts(&log) == [0]).await;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(2500) {
            let passes = (0..2).map(|_| {
                let sched = schedules.scheduler();
                async move { sched.pass().await.unwrap().enqueued }
            });
            futures::future::join_all(passes).await;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let ticks = q.tasks(doc! { "schedule": "tick" }, None).await.unwrap();
        assert_eq!(ticks.len(), 1, "one tick while the first waits: {ticks:?}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while q.stats("w").await.unwrap().completed < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.cancel();
        run.await.unwrap();
        assert_eq!(q.stats("w").await.unwrap().completed, 2);
        // On a loaded server a run may start again after its claim lapsed
        // (its outcome is fenced, and written once): order by first starts.
        assert_eq!(firsts(&starts(&log)), [0, 100]);
    }

    /// A schedule definition written by hand with `overlap: "queue"` and a
    /// `group_key` is skipped by the scheduler, which goes on ticking the
    /// other schedules; `list_each` reports it alone.
    pub(crate) async fn a_hand_written_grouped_queue_schedule_is_skipped_alone<H: Harness>(h: &H) {
        let s = h.store("ag_rg7_hand").await;
        let schedules = Schedules::with_collection(s.clone(), "tasks", "tasks_schedules").unwrap();
        let ok = Schedule::every("ok", Duration::from_secs(1), NewTask::new("w", doc! {})).unwrap();
        schedules.upsert(&ok).await.unwrap();
        let grouped_tick = NewTask::new("w", doc! {}).group("g");
        let allowed = Schedule::every("bad", Duration::from_secs(1), grouped_tick).unwrap().overlap(Overlap::Allow);
        schedules.upsert(&allowed).await.unwrap();
        let coll = Collection::new("tasks_schedules").unwrap();
        let r = s.get(&coll, &Key::new("bad").unwrap()).await.unwrap().record.unwrap();
        let mut def = r.data().get_document("def").unwrap().clone();
        def.insert("overlap", "queue");
        s.write(
            &coll,
            &Key::new("bad").unwrap(),
            &Write::new(store_trait::Condition::Always, Mutation::new().set("def", def)),
        )
        .await
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut total = 0;
        while total == 0 {
            assert!(Instant::now() < deadline, "no tick of the good schedule");
            total += schedules.scheduler().pass().await.expect("the pass goes on").enqueued;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        assert!(q.tasks(doc! { "schedule": "bad" }, None).await.unwrap().is_empty());
        let each = schedules.list_each().await.unwrap();
        assert_eq!(each.iter().filter(|r| r.is_err()).count(), 1, "{each:?}");
    }
}

/// Fails the first write to one task's document.
#[derive(Debug)]
struct FailWriteOnce {
    key: &'static str,
    done: std::sync::atomic::AtomicBool,
}

impl FailWriteOnce {
    fn new(key: &'static str) -> Self {
        FailWriteOnce { key, done: std::sync::atomic::AtomicBool::new(false) }
    }
}

#[async_trait::async_trait]
impl<S: Store> store_test::Intercept<S> for FailWriteOnce {
    async fn before(&self, coll: Option<&Collection>, call: store_test::Call<'_>) -> store_trait::StoreResult<()> {
        if let (Some(c), store_test::Call::Write(k, _)) = (coll, call) {
            if c.as_str() == "tasks" && k.as_str() == Some(self.key) && !self.done.swap(true, Ordering::SeqCst) {
                return Err(store_trait::StoreError::backend(
                    store_trait::FaultKind::Transient,
                    "failed once".to_owned(),
                ));
            }
        }
        Ok(())
    }
}

/// Fails every renewal (a lease write) of a task claim once `cut` is set:
/// an agent cut off from the store, whose claim lapses.
#[derive(Debug, Default)]
struct CutRenewals {
    cut: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl<S: Store> store_test::Intercept<S> for CutRenewals {
    async fn before(&self, coll: Option<&Collection>, _call: store_test::Call<'_>) -> store_trait::StoreResult<()> {
        if self.cut.load(Ordering::SeqCst) && coll.is_some() {
            return Err(store_trait::StoreError::backend(store_trait::FaultKind::Transient, "cut off".to_owned()));
        }
        Ok(())
    }
}
