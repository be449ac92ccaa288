//! Groups, every backend: with a cap per group, agents run at most that
//! many of a group's tasks at once across processes, in enqueue order, and
//! other groups beside them; a retry keeps its group's turn; a grouped task
//! waits for an agent with a cap; what a crash leaves half done (a task
//! listed in its slot but still held, a nudge no agent saw) is finished by
//! the sweep; a requeued task waits for its turn again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, AgentError, NewTask, Outcome, Processed, Queue, Task};
use store_test::Harness;
use store_trait::{Collection, Condition, Mutation, Query, Store, Write};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Starts and ends of handler runs: (group, task number, started).
pub(crate) type Log = Arc<Mutex<Vec<(String, i64, bool)>>>;

/// An agent of name `w` with a cap of `cap` per group (none without).
pub(crate) fn agent<S: Store + Clone>(s: &S, ttl: Duration, cap: Option<usize>, stop: &CancellationToken) -> Agent<S> {
    let b = Agent::builder(s.clone(), "w", "tasks")
        .ttl(ttl)
        .concurrency(4)
        .max_attempts(5)
        .backoff(Duration::from_millis(20), Duration::from_millis(40))
        .poll_interval(Duration::from_millis(200))
        .shutdown_on(stop);
    match cap {
        Some(n) => b.group_concurrency(n).build().unwrap(),
        None => b.build().unwrap(),
    }
}

/// A handler that logs its run's start and end around a short sleep.
fn logging(log: Log) -> impl Fn(Task) -> crate::review_groups::Boxed + Send + Sync + Clone {
    // Long enough that, on a loaded server too, a second task let through
    // with it is claimed before it ends (else nothing overlaps).
    logging_for(log, Duration::from_millis(250))
}

/// A handler that logs each run's start and end, `pause` apart; a task
/// without `g` or `i` logs as group "-", number -1.
pub(crate) fn logging_for(
    log: Log,
    pause: Duration,
) -> impl Fn(Task) -> crate::review_groups::Boxed + Send + Sync + Clone {
    move |t: Task| {
        let log = log.clone();
        Box::pin(async move {
            let g = t.data().get_str("g").unwrap_or("-").to_owned();
            let i = t.data().get_i64("i").unwrap_or(-1);
            log.lock().unwrap().push((g.clone(), i, true));
            tokio::time::sleep(pause).await;
            log.lock().unwrap().push((g, i, false));
            Outcome::done()
        })
    }
}

/// Runs `agents` agents with `cap` until `n` tasks of `w` completed (or a
/// minute passed), then stops them.
async fn run_until<S: Store + Clone>(h: &impl Harness, s: &S, agents: usize, cap: usize, n: u64, log: &Log) {
    let log = log.clone();
    work_until(h, s, agents, cap, move || logging(log.clone()), |st| st.completed >= n).await;
    let q = Queue::new(s.clone(), "tasks").unwrap();
    assert_eq!(q.stats("w").await.unwrap().completed, n, "every task completed");
}

/// Runs `agents` agents with `cap` and handlers from `handler` until the
/// stats of `w` are `done` (or a minute passed), then stops them.
async fn work_until<S: Store + Clone, F: mongoagent::Handler>(
    h: &impl Harness,
    s: &S,
    agents: usize,
    cap: usize,
    handler: impl Fn() -> F,
    done: impl Fn(&mongoagent::QueueStats) -> bool,
) {
    work_within(h, s, agents, cap, handler, Duration::from_secs(60), done).await;
}

/// As [`work_until`], giving up after `limit`.
pub(crate) async fn work_within<S: Store + Clone, F: mongoagent::Handler>(
    h: &impl Harness,
    s: &S,
    agents: usize,
    cap: usize,
    handler: impl Fn() -> F,
    limit: Duration,
    done: impl Fn(&mongoagent::QueueStats) -> bool,
) {
    let q = Queue::new(s.clone(), "tasks").unwrap();
    let stop = CancellationToken::new();
    let mut workers = Vec::new();
    for _ in 0..agents {
        let a = agent(s, h.ttl(), Some(cap), &stop);
        let handler = handler();
        workers.push(tokio::spawn(async move { a.work(handler).await.unwrap() }));
    }
    let deadline = Instant::now() + limit;
    while !done(&q.stats("w").await.unwrap()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    for w in workers {
        w.await.unwrap();
    }
}

/// The most runs of one group at once, and of all groups at once.
fn overlaps(log: &[(String, i64, bool)]) -> (usize, usize) {
    let (mut per, mut all, mut most_one, mut most_all) = (HashMap::<&str, usize>::new(), 0_usize, 0, 0);
    for (g, _, start) in log {
        let n = per.entry(g.as_str()).or_default();
        if *start {
            *n += 1;
            all += 1;
        } else {
            *n -= 1;
            all -= 1;
        }
        most_one = most_one.max(*n);
        most_all = most_all.max(all);
    }
    (most_one, most_all)
}

pub(crate) fn grouped(g: &str, i: i64) -> NewTask {
    NewTask::new("w", doc! { "g": g, "i": i }).group(g)
}

/// The suite (`groups_suite`): each `pub(crate) async fn` over a `Harness`
/// here is one test on every backend, registered by being written.
#[store_test::suite(groups_suite, crate::groups::cases)]
pub(crate) mod cases {
    use super::*;

    /// Three groups of six tasks, half enqueued in one call and half one by
    /// one, run by three agents of four slots with a cap of 1: each group's
    /// tasks run one at a time, in enqueue order, each once; and groups run
    /// beside each other. Each task is let through as the one before it
    /// ends, not at a sweep: the whole run takes less than one sweep period.
    pub(crate) async fn a_cap_of_one_runs_a_group_one_at_a_time_in_enqueue_order<H: Harness>(h: &H) {
        let s = h.store("ag_groups_order").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        // Ids that sort against enqueue order: the order is the group's numbers'.
        let tasks: Vec<NewTask> =
            (0..18).map(|i| grouped(&format!("g{}", i % 3), i).id(format!("t{:02}", 17 - i))).collect();
        q.enqueue_all(&tasks[..9]).await.unwrap();
        for t in &tasks[9..] {
            q.enqueue(t.clone()).await.unwrap();
        }
        let log = Log::default();
        let t0 = Instant::now();
        run_until(h, &s, 3, 1, 18, &log).await;
        assert!(t0.elapsed() < mongoagent::group::SWEEP, "let through as tasks end: {:?}", t0.elapsed());
        let log = log.lock().unwrap().clone();
        let (one, all) = overlaps(&log);
        assert_eq!(one, 1, "a group's tasks ran one at a time: {log:?}");
        assert!(all > 1, "groups ran beside each other (else this checks little): {log:?}");
        for g in ["g0", "g1", "g2"] {
            let started: Vec<i64> = log.iter().filter(|(x, _, s)| x == g && *s).map(|(_, i, _)| *i).collect();
            let enqueued: Vec<i64> = (0..18).filter(|i| format!("g{}", i % 3) == g).collect();
            assert_eq!(started, enqueued, "group {g} ran once each, in enqueue order");
        }
    }

    /// With a cap of 2, two tasks of one group run at once, and never three.
    pub(crate) async fn a_cap_of_two_runs_two_of_a_group_at_once<H: Harness>(h: &H) {
        let s = h.store("ag_groups_two").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let tasks: Vec<NewTask> = (0..10).map(|i| grouped("g", i)).collect();
        q.enqueue_all(&tasks).await.unwrap();
        let log = Log::default();
        run_until(h, &s, 2, 2, 10, &log).await;
        let (one, _) = overlaps(&log.lock().unwrap());
        assert_eq!(one, 2, "two at once, never more: {:?}", log.lock().unwrap());
    }

    /// A failed attempt keeps its group's turn: the retry runs before the
    /// group's next task starts.
    pub(crate) async fn a_retry_keeps_its_groups_turn<H: Harness>(h: &H) {
        let s = h.store("ag_groups_retry").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue_all(&[grouped("g", 0), grouped("g", 1)]).await.unwrap();
        let log = Log::default();
        let stop = CancellationToken::new();
        let a = agent(&s, h.ttl(), Some(1), &stop);
        let l = log.clone();
        let worker = tokio::spawn(async move {
            a.work(move |t: Task| {
                let l = l.clone();
                async move {
                    let i = t.data().get_i64("i").unwrap();
                    l.lock().unwrap().push((format!("{i}@{}", t.attempt()), i, true));
                    if i == 0 && t.attempt() == 1 {
                        return Outcome::retry_after("not yet", Duration::from_millis(100));
                    }
                    Outcome::done()
                }
            })
            .await
            .unwrap()
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while q.stats("w").await.unwrap().completed < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.cancel();
        worker.await.unwrap();
        let runs: Vec<String> = log.lock().unwrap().iter().map(|(r, _, _)| r.clone()).collect();
        assert_eq!(runs, ["0@1", "0@2", "1@1"], "the retry ran before the next task");
    }

    /// A grouped task waits for an agent with a cap: one without runs
    /// nothing of it, and one with a cap, started later, finds it (its
    /// sweep at start, since no agent saw the producer's nudge).
    pub(crate) async fn a_grouped_task_waits_for_an_agent_with_a_cap<H: Harness>(h: &H) {
        let s = h.store("ag_groups_uncapped").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(grouped("g", 0)).await.unwrap();
        let stop = CancellationToken::new();
        let plain = agent(&s, h.ttl(), None, &stop);
        assert_eq!(plain.process(|_t: Task| async { true }).await.unwrap(), None, "held: not claimable");
        let log = Log::default();
        let t0 = Instant::now();
        run_until(h, &s, 1, 1, 1, &log).await;
        // At the agent's first sweep, which reads every active slot, not a
        // sweep period later.
        assert!(t0.elapsed() < mongoagent::group::SWEEP, "found at the first sweep: {:?}", t0.elapsed());
        let t = s.get(&Collection::new("tasks").unwrap(), &id).await.unwrap().record.unwrap();
        assert_eq!(t.get_bool("complete"), Some(true));
        assert_eq!(t.get_bool("group_held"), None, "let through, then run");
    }

    /// An idle agent runs a grouped task enqueued while it waits at once:
    /// the producer's nudge wakes it (or, without notifications, its poll),
    /// not its periodic sweep. The group's slot exists already (a task of
    /// the group ran before), so the nudge is the only write that says so.
    pub(crate) async fn an_idle_agent_runs_a_grouped_task_at_once<H: Harness>(h: &H) {
        let s = h.store("ag_groups_idle").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let log = Log::default();
        let producer = {
            let q = q.clone();
            async move {
                q.enqueue(grouped("g", 0)).await.unwrap();
                while q.stats("w").await.unwrap().completed < 1 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // Once the agent is idle again.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let t0 = Instant::now();
                q.enqueue(grouped("g", 1)).await.unwrap();
                t0
            }
        };
        let (t0, ()) = tokio::join!(producer, run_until(h, &s, 1, 1, 2, &log));
        assert!(t0.elapsed() < mongoagent::group::SWEEP, "run at once: {:?}", t0.elapsed());
    }

    /// `Agent::process`, with no loop beside it, lets a held task through
    /// itself when it finds nothing ready (a sweep), and runs it.
    pub(crate) async fn process_lets_a_held_task_through<H: Harness>(h: &H) {
        let s = h.store("ag_groups_process").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(grouped("g", 0)).await.unwrap();
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(id)));
    }

    /// A crash between the slot's write and the task's release leaves the
    /// task listed in the slot and still held: the sweep makes it ready,
    /// and it runs; the group's next task waits its turn meanwhile.
    pub(crate) async fn a_task_listed_but_still_held_is_released_by_the_sweep<H: Harness>(h: &H) {
        let s = h.store("ag_groups_repair").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (first, _) = q.enqueue(grouped("g", 0)).await.unwrap();
        q.enqueue(grouped("g", 1)).await.unwrap();
        // What an agent that died after its compare-and-set leaves.
        let slots = Collection::new("tasks_groups").unwrap();
        let slot = s.find(&slots, &Query::eq(doc! { "agent_name": "w", "group": "g" })).await.unwrap();
        assert_eq!(slot.len(), 1, "one slot for the group: {slot:?}");
        let w = Write::new(Condition::Always, Mutation::new().set("running", vec![first.as_bson().clone()]));
        assert!(s.write(&slots, slot[0].key(), &w).await.unwrap().is_applied());
        let log = Log::default();
        run_until(h, &s, 1, 1, 2, &log).await;
        let started: Vec<i64> = log.lock().unwrap().iter().filter(|(_, _, st)| *st).map(|(_, i, _)| *i).collect();
        assert_eq!(started, [0, 1], "the listed task first, then the next");
    }

    /// A grouped task that failed for good and is requeued waits for its
    /// turn again (held), and runs once an agent with a cap lets it through.
    pub(crate) async fn a_requeued_grouped_task_waits_for_its_turn<H: Harness>(h: &H) {
        let s = h.store("ag_groups_requeue").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(grouped("g", 0).max_attempts(1)).await.unwrap();
        work_until(h, &s, 1, 1, || |_t: Task| async { false }, |st| st.failed >= 1).await;
        let tasks = Collection::new("tasks").unwrap();
        let t = s.get(&tasks, &id).await.unwrap().record.unwrap();
        assert_eq!(t.get_bool("error_encountered"), Some(true), "failed for good: {t:?}");
        assert_eq!(q.requeue_ids(std::slice::from_ref(&id)).await.unwrap().len(), 1);
        let t = s.get(&tasks, &id).await.unwrap().record.unwrap();
        assert_eq!((t.get_bool("ready"), t.get_bool("group_held")), (Some(false), Some(true)), "held again");
        let log = Log::default();
        q.enqueue(grouped("g", 1)).await.unwrap();
        run_until(h, &s, 1, 1, 2, &log).await;
        let started: Vec<i64> = log.lock().unwrap().iter().filter(|(_, _, st)| *st).map(|(_, i, _)| *i).collect();
        assert_eq!(started, [0, 1], "the requeued task kept its place");
    }

    /// Bad groups are refused before anything is written: empty, too long,
    /// with a NUL; a cap of 0.
    pub(crate) async fn bad_groups_are_refused<H: Harness>(h: &H) {
        let s = h.store("ag_groups_input").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let long = "x".repeat(mongoagent::group::MAX_GROUP_LEN + 1);
        for g in ["", long.as_str(), "a\0b"] {
            let e = q.enqueue(grouped(g, 0)).await.unwrap_err();
            assert!(matches!(e, AgentError::InvalidTask(_)), "{g:?}: {e}");
        }
        assert_eq!(s.count(&Collection::new("tasks").unwrap(), &Query::all()).await.unwrap(), 0, "nothing enqueued");
        let e = Agent::builder(s.clone(), "w", "tasks").group_concurrency(0).build().unwrap_err();
        assert!(matches!(e, AgentError::Config(_)), "{e}");
        // A follow-up with a bad group fails its parent's outcome for good, saying why.
        let (parent, _) = q.enqueue(NewTask::new("p", doc! {})).await.unwrap();
        let a = Agent::builder(s.clone(), "p", "tasks").ttl(h.ttl()).build().unwrap();
        let p = a.process(|_t: Task| async { Outcome::done().follow_up(grouped("", 0)) }).await.unwrap();
        assert_eq!(p, Some(Processed::Failed(parent.clone())));
        let r = s.get(&Collection::new("tasks").unwrap(), &parent).await.unwrap().record.unwrap();
        assert!(r.get_str("last_error").unwrap().contains("group key"), "{r:?}");
    }

    /// Debounced and grouped: a burst of enqueues with one key runs once,
    /// with the last data, in the place of the burst's first enqueue in
    /// its group. A debounced enqueue with that key in another group is
    /// refused: the key is held by a task it cannot give its data to.
    pub(crate) async fn a_debounced_grouped_task_runs_once_in_its_first_place<H: Harness>(h: &H) {
        let s = h.store("ag_groups_debounce").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let debounced = |g: &str, i: i64| grouped(g, i).dedupe_key("k").debounce(Duration::from_millis(100));
        q.enqueue(grouped("g", 0)).await.unwrap();
        let (first, new) = q.enqueue(debounced("g", 1)).await.unwrap();
        assert!(new);
        q.enqueue(grouped("g", 2)).await.unwrap();
        let (again, new) = q.enqueue(debounced("g", 3)).await.unwrap();
        assert_eq!((&again, new), (&first, false), "the burst's second enqueue gave the first's task its data");
        let e = q.enqueue(debounced("h", 4)).await.unwrap_err();
        assert!(matches!(e, AgentError::KeyHeldByAnother { .. }), "{e}");
        let log = Log::default();
        run_until(h, &s, 2, 1, 3, &log).await;
        let started: Vec<i64> = log.lock().unwrap().iter().filter(|(_, _, st)| *st).map(|(_, i, _)| *i).collect();
        assert_eq!(started, [0, 3, 2], "once, with the last data, in the first enqueue's place");
    }

    /// Racing debounced enqueues of one key in one group: one task, run
    /// once, with one producer's data, and the group's slot left with
    /// nothing owed (every numbering landed).
    pub(crate) async fn racing_debounced_grouped_enqueues_make_one_task<H: Harness>(h: &H) {
        let s = h.store("ag_groups_debounce_race").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let producers: Vec<_> = (0..6_i64)
            .map(|p| {
                let q = q.clone();
                tokio::spawn(async move {
                    for i in 0..4 {
                        let t = grouped("g", p * 10 + i).dedupe_key("k").debounce(Duration::from_millis(200));
                        q.enqueue(t).await.unwrap();
                    }
                })
            })
            .collect();
        for p in producers {
            p.await.unwrap();
        }
        let tasks = Collection::new("tasks").unwrap();
        assert_eq!(s.count(&tasks, &Query::eq(doc! { "group_key": "g" })).await.unwrap(), 1, "one task");
        let slot = s.find(&Collection::new("tasks_groups").unwrap(), &Query::all()).await.unwrap();
        let (announced, landed) = (slot[0].get_i64("announced"), slot[0].get_i64("landed"));
        if s.backend_name() == "mongodb" {
            // SecantusDB's Python server may apply an upsert that loses the
            // race to create the slot yet answer it with no document; the
            // retry counts its announcement again (docs/test-servers.md).
            assert!(announced >= landed, "every numbering landed: {slot:?}");
        } else {
            assert_eq!(announced, landed, "every numbering landed: {slot:?}");
        }
        let log = Log::default();
        run_until(h, &s, 1, 1, 1, &log).await;
        assert_eq!(log.lock().unwrap().iter().filter(|(_, _, st)| *st).count(), 1, "run once");
    }

    /// A prepared grouped task (the outbox pattern) takes its place in its
    /// group when it is prepared, not when the caller's insert lands.
    pub(crate) async fn a_prepared_grouped_task_takes_its_place_at_prepare<H: Harness>(h: &H) {
        let s = h.store("ag_groups_prepare").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped("g", 0)).await.unwrap();
        let prepared = q.prepare(grouped("g", 1)).await.unwrap();
        q.enqueue(grouped("g", 2)).await.unwrap();
        // The caller's insert (on MongoDB, in its transaction).
        s.insert_many(&Collection::new("tasks").unwrap(), vec![prepared.document().clone()]).await.unwrap();
        q.after_insert(&prepared).await.unwrap();
        let log = Log::default();
        run_until(h, &s, 2, 1, 3, &log).await;
        let started: Vec<i64> = log.lock().unwrap().iter().filter(|(_, _, st)| *st).map(|(_, i, _)| *i).collect();
        assert_eq!(started, [0, 1, 2], "in the order prepared and enqueued");
    }

    /// An idle agent runs a prepared grouped task at once once the caller
    /// says its insert is over (`Queue::after_insert`), not at its sweep.
    pub(crate) async fn an_idle_agent_runs_a_prepared_grouped_task_at_once<H: Harness>(h: &H) {
        let s = h.store("ag_groups_prepare_idle").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let log = Log::default();
        let producer = {
            let (q, s) = (q.clone(), s.clone());
            async move {
                q.enqueue(grouped("g", 0)).await.unwrap();
                while q.stats("w").await.unwrap().completed < 1 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                let t0 = Instant::now();
                let prepared = q.prepare(grouped("g", 1)).await.unwrap();
                s.insert_many(&Collection::new("tasks").unwrap(), vec![prepared.document().clone()]).await.unwrap();
                q.after_insert(&prepared).await.unwrap();
                t0
            }
        };
        let (t0, ()) = tokio::join!(producer, run_until(h, &s, 1, 1, 2, &log));
        assert!(t0.elapsed() < mongoagent::group::SWEEP, "run at once: {:?}", t0.elapsed());
    }

    /// A grouped follow-up takes its place in its group when its parent's
    /// outcome is written: behind the tasks enqueued before, ahead of those
    /// enqueued after, and beside its siblings in the order the handler
    /// returned them; an ungrouped sibling runs as any task.
    pub(crate) async fn grouped_follow_ups_take_their_place_when_their_parent_completes<H: Harness>(h: &H) {
        let s = h.store("ag_groups_follow_ups").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue_all(&[grouped("g", 0), grouped("g", 1)]).await.unwrap();
        let (parent, _) = q.enqueue(NewTask::new("p", doc! {})).await.unwrap();
        let p = Agent::builder(s.clone(), "p", "tasks").ttl(h.ttl()).build().unwrap();
        let done = p
            .process(|_t: Task| async {
                Outcome::done()
                    .follow_up(grouped("g", 10))
                    .follow_up(grouped("h", 20))
                    .follow_up(grouped("g", 11))
                    .follow_up(NewTask::new("w", doc! { "g": "none", "i": 30_i64 }))
            })
            .await
            .unwrap();
        assert_eq!(done, Some(Processed::Completed(parent)));
        q.enqueue(grouped("g", 2)).await.unwrap();
        let log = Log::default();
        run_until(h, &s, 2, 1, 7, &log).await;
        let log = log.lock().unwrap().clone();
        let started =
            |g: &str| -> Vec<i64> { log.iter().filter(|(x, _, st)| x == g && *st).map(|(_, i, _)| *i).collect() };
        assert_eq!(started("g"), [0, 1, 10, 11, 2], "in their group's order: {log:?}");
        assert_eq!(started("h"), [20]);
        assert_eq!(started("none"), [30]);
        assert_eq!(overlaps(&log).0, 1, "one at a time per group: {log:?}");
    }

    /// A grouped task that waits for its follow-ups keeps its group's turn
    /// while it waits: a follow-up in its own group would wait behind it
    /// for ever, and fails its outcome for good, saying why. Follow-ups in
    /// another group run, and wake it.
    pub(crate) async fn a_waiting_task_cannot_wait_for_its_own_group<H: Harness>(h: &H) {
        let s = h.store("ag_groups_wait").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (own, _) = q.enqueue(grouped("g", 0)).await.unwrap();
        let (other, _) = q.enqueue(grouped("g", 1)).await.unwrap();
        let w = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        let wait_in = |g: &'static str| {
            move |t: Task| async move {
                // The follow-up itself, and its parent woken.
                if t.data().get_i64("i").ok() == Some(2) || t.round() > 0 {
                    return Outcome::done();
                }
                Outcome::done().follow_up(grouped(g, 2)).wait_for_follow_ups()
            }
        };
        assert_eq!(w.process(wait_in("g")).await.unwrap(), Some(Processed::Failed(own.clone())));
        let r = s.get(&Collection::new("tasks").unwrap(), &own).await.unwrap().record.unwrap();
        assert!(r.get_str("last_error").unwrap().contains("waiting parent's group"), "{r:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let p = w.process(wait_in("h")).await.unwrap();
        let r = s.get(&Collection::new("tasks").unwrap(), &other).await.unwrap().record.unwrap();
        assert_eq!(p, Some(Processed::Waiting(other.clone())), "{r:?}");
        let stop = CancellationToken::new();
        let worker = agent(&s, h.ttl(), Some(1), &stop);
        let run = tokio::spawn(async move { worker.work(wait_in("h")).await.unwrap() });
        let deadline = Instant::now() + Duration::from_secs(60);
        while q.stats("w").await.unwrap().completed < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.cancel();
        run.await.unwrap();
        let r = s.get(&Collection::new("tasks").unwrap(), &other).await.unwrap().record.unwrap();
        assert_eq!(r.get_bool("complete"), Some(true), "woken by its follow-up in another group, and ended: {r:?}");
    }

    /// A grouped follow-up pending its parent's outcome is no task of its
    /// group yet: while that write waits, its group's agents run the task
    /// before it and then find nothing (it is neither let through nor
    /// run); once the write lands, they run it.
    pub(crate) async fn a_pending_grouped_follow_up_waits_for_its_parents_outcome<H: Harness>(h: &H) {
        use crate::hold_back::{HoldBack, Op};
        let s = h.store("ag_groups_pending").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (before, _) = q.enqueue(grouped("g", 0)).await.unwrap();
        q.enqueue(NewTask::new("p", doc! {})).await.unwrap();
        let held = HoldBack::new(s.clone());
        held.hold_next(|_, op| matches!(op, Op::Write(w) if w.mutation.set.contains_key("follow_ups_fence")));
        let p = Agent::builder(held.clone(), "p", "tasks").ttl(h.ttl()).build().unwrap();
        let parent =
            tokio::spawn(
                async move { p.process(|_t: Task| async { Outcome::done().follow_up(grouped("g", 1)) }).await },
            );
        held.reached().await;
        let w = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        assert_eq!(w.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(before.clone())));
        assert_eq!(w.process(|_t: Task| async { true }).await.unwrap(), None, "pending: not let through");
        let tasks = Collection::new("tasks").unwrap();
        let mut pending = s.find(&tasks, &Query::eq(doc! { "agent_name": "w" })).await.unwrap();
        pending.retain(|r| r.key() != &before);
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert_eq!((pending[0].get_bool("ready"), pending[0].get_bool("group_held")), (Some(false), None));
        held.open();
        assert!(matches!(parent.await.unwrap().unwrap(), Some(Processed::Completed(_))));
        let follow_up = pending[0].key().clone();
        // `process` sweeps at most once per poll interval.
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(w.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(follow_up)));
    }
}
