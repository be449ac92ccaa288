//! Sixth review of groups: debounced, prepared (outbox) and follow-up
//! tasks in groups, every backend. Each test says what it attacks; one
//! that fails is a finding.
//!
//! FOUND, each fixed (they failed on memory, memory_polling and mongo
//! before their fixes):
//! `a_debounce_racing_the_let_through_keeps_the_last_data` (a replace
//! rejected by a settle's let-through is taken for a racing replace:
//! `dedupe.rs`, `debounce_into`), `racing_debounced_inserts_in_two_groups_refuse_the_loser`
//! (a lost insert is "superseded" by a winner in another group:
//! `settle_debounced`, no group check beside `debounced_for`),
//! `a_prepared_task_after_a_doubled_after_insert_is_not_stranded` (each
//! `after_insert` counts a landing). The others HELD.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use mongoagent::{AgentError, DedupeScope, NewTask, Outcome, Queue, Task};
use store_test::{Call, Harness, Intercept, Intercepted};
use store_trait::{Collection, Key, Query, Store, StoreResult};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::groups::{agent, grouped, Log};
use crate::hold_back::{Holds as HoldCalls, Op};
use crate::review_groups::{slots, tasks, until};

/// Holds the `n`th (from 0) insert into `tasks` until opened.
struct HoldInsert {
    n: usize,
    seen: AtomicUsize,
    reached: Notify,
    open: Semaphore,
}

impl HoldInsert {
    fn nth(n: usize) -> Self {
        HoldInsert { n, seen: AtomicUsize::new(0), reached: Notify::new(), open: Semaphore::new(0) }
    }
}

impl std::fmt::Debug for HoldInsert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldInsert").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<S: Store> Intercept<S> for HoldInsert {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        if let (Some(c), Call::InsertMany(_)) = (coll, call) {
            if c.as_str() == "tasks" && self.seen.fetch_add(1, Ordering::SeqCst) == self.n {
                self.reached.notify_one();
                self.open.acquire().await.unwrap().forget();
            }
        }
        Ok(())
    }
}

/// A debounced task of group `g` with dedupe key `k`, data version `v`.
fn debounced(g: &str, k: &str, v: i64, after: Duration) -> NewTask {
    NewTask::new("w", doc! { "g": g, "i": v, "v": v }).group(g).dedupe_key(k).debounce(after)
}

/// A handler that logs every run (g, i) start and end and completes.
fn logging(log: Log) -> impl Fn(Task) -> crate::review_groups::Boxed + Send + Sync + Clone {
    crate::groups::logging_for(log, Duration::from_millis(20))
}

/// Runs `process` (cap 1) until `want` runs are logged or `rounds` run out.
async fn drain<S: Store + Clone>(
    s: &S,
    ttl: Duration,
    log: &Log,
    want: usize,
    rounds: usize,
    handler: impl mongoagent::Handler + Clone,
) {
    let a = agent(s, ttl, Some(1), &CancellationToken::new());
    for _ in 0..rounds {
        if log.lock().unwrap().iter().filter(|(_, _, s)| *s).count() >= want {
            return;
        }
        match a.process(handler.clone()).await {
            Ok(Some(_)) => {}
            Ok(None) => tokio::time::sleep(Duration::from_millis(250)).await,
            Err(e) => panic!("a typed error: {e}"),
        }
    }
}

fn runs(log: &Log) -> Vec<i64> {
    log.lock().unwrap().iter().filter(|(_, _, s)| *s).map(|(_, i, _)| *i).collect()
}

fn most_at_once(log: &Log) -> usize {
    let (mut n, mut most) = (0_usize, 0_usize);
    for (_, _, start) in log.lock().unwrap().iter() {
        if *start {
            n += 1;
        } else {
            n = n.saturating_sub(1);
        }
        most = most.max(n);
    }
    most
}

async fn state<S: Store>(s: &S) -> String {
    let t = s.find(&tasks(), &Query::all()).await.unwrap();
    let sl = s.find(&slots(), &Query::all()).await.unwrap();
    format!(
        "tasks {:?}\nslots {:?}",
        t.iter().map(|r| r.data().clone()).collect::<Vec<_>>(),
        sl.iter().map(|r| r.data().clone()).collect::<Vec<_>>()
    )
}

/// The suite (`review_groups6_suite`).
#[store_test::suite(review_groups6_suite, crate::review_groups6::cases)]
pub(crate) mod cases {
    use super::*;

    /// Promise 1 (a burst runs once with the last data). D1 (v 1) is
    /// enqueued debounced in group g, held (no agent yet). D2 (v 2) reads
    /// it and is held just before its replace; an agent's sweep lets D1
    /// through meanwhile (it is not due for an hour, so nobody claims it).
    /// D2's replace, on the revision it read, is rejected: D2 must then
    /// replace again (the task is still never claimed) or insert, never
    /// report its data taken while the task keeps v 1.
    pub(crate) async fn a_debounce_racing_the_let_through_keeps_the_last_data<H: Harness>(h: &H) {
        let s = h.store("rv6_debounce_let_through").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let hour = Duration::from_secs(3600);
        let (d1, new) = q.enqueue(debounced("g", "k", 1, hour)).await.unwrap();
        assert!(new);
        let ps = Intercepted::with(s.clone(), HoldCalls::default());
        ps.hold_next(|c, op| {
            c.as_str() == "tasks" && matches!(op, Op::Write(w) if format!("{:?}", w.mutation).contains("debounced_at"))
        });
        let pq = Queue::new(ps.clone(), "tasks").unwrap();
        let d2 = tokio::spawn(async move { pq.enqueue(debounced("g", "k", 2, hour)).await });
        ps.reached().await;
        // An agent lets D1 through (its sweep), and finds nothing due.
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        let ready = || async { s.get(&tasks(), &d1).await.unwrap().record.unwrap().get_bool("ready") == Some(true) };
        for _ in 0..20 {
            if ready().await {
                break;
            }
            assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), None, "not due");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(ready().await, "D1 let through: {}", state(&s).await);
        ps.open();
        let out = d2.await.unwrap();
        let all = s.find(&tasks(), &Query::eq(doc! { "agent_name": "w" })).await.unwrap();
        let vs: Vec<(String, Option<i64>)> = all
            .iter()
            .filter(|r| r.get_bool("complete") != Some(true))
            .map(|r| (r.key().to_string(), r.get_i64("v")))
            .collect();
        assert!(
            vs.iter().any(|(_, v)| *v == Some(2)),
            "D2's data is nowhere, yet its enqueue said {out:?}: live tasks {vs:?}; {}",
            state(&s).await
        );
    }

    /// Promise 1 (a debounced enqueue of the key in another group gets
    /// `KeyHeldByAnother`). Task X holds key "k" and has ended (until-ended:
    /// it no longer blocks). E2 (group b, debounced) retires the key off X
    /// and is held before its insert; E1 (group a, debounced) inserts with
    /// the key meanwhile. E2's insert then fails on the key: the holder is
    /// E1, in another group, which cannot take E2's data: E2 must be told
    /// `KeyHeldByAnother`, not that its data was taken.
    pub(crate) async fn racing_debounced_inserts_in_two_groups_refuse_the_loser<H: Harness>(h: &H) {
        let s = h.store("rv6_debounce_two_groups").await;
        // A key moved off its task must be free again (not on secantusd-rs).
        if !h.has("racing_debounced_inserts_in_two_groups_refuse_the_loser", store_test::Needs::UniqueKeyRelease).await
        {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(
            NewTask::new("w", doc! { "g": "x", "i": 0_i64 })
                .id("x")
                .dedupe_key("k")
                .dedupe_scope(DedupeScope::UntilEnded),
        )
        .await
        .unwrap();
        let log = Log::default();
        drain(&s, h.ttl(), &log, 1, 40, logging(log.clone())).await;
        assert_eq!(runs(&log), [0], "X ran");
        let ps = Intercepted::with(s.clone(), HoldInsert::nth(1));
        let pq = Queue::new(ps.clone(), "tasks").unwrap();
        let hour = Duration::from_secs(3600);
        let e2 = tokio::spawn(async move { pq.enqueue(debounced("b", "k", 2, hour)).await });
        ps.reached.notified().await;
        let (e1, new) = q.enqueue(debounced("a", "k", 1, hour)).await.unwrap();
        assert!(new, "E1 inserted");
        ps.open.add_permits(1);
        let out = e2.await.unwrap();
        assert!(
            matches!(out, Err(AgentError::KeyHeldByAnother { .. })),
            "E2 (group b) must be refused, the key is E1's ({e1}) in group a; it got {out:?}; {}",
            state(&s).await
        );
    }

    /// Promise 1 (after let-through, before start). D (v 1) is let through
    /// and waits for its start; E (i 10) is enqueued in g behind it; D is
    /// debounced again (v 2): D keeps its turn and runs once with v 2,
    /// then E.
    pub(crate) async fn a_debounce_after_let_through_runs_once_with_the_last_data_before_later_tasks<H: Harness>(
        h: &H,
    ) {
        let s = h.store("rv6_debounce_ready").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let d = Duration::from_secs(2);
        let (id, _) = q.enqueue(debounced("g", "k", 1, d)).await.unwrap();
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), None);
        let r = s.get(&tasks(), &id).await.unwrap().record.unwrap();
        assert_eq!(r.get_bool("ready"), Some(true), "let through: {r:?}");
        q.enqueue(grouped("g", 10).id("e")).await.unwrap();
        let (again, new) = q.enqueue(debounced("g", "k", 2, d)).await.unwrap();
        assert_eq!((again, new), (id.clone(), false));
        let log = Log::default();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handler = {
            let (log, seen) = (log.clone(), seen.clone());
            move |t: Task| {
                let (log, seen) = (log.clone(), seen.clone());
                Box::pin(async move {
                    seen.lock().unwrap().push(t.data().get_i64("v").ok());
                    logging(log)(t).await
                }) as crate::review_groups::Boxed
            }
        };
        drain(&s, h.ttl(), &log, 2, 80, handler.clone()).await;
        drain(&s, h.ttl(), &log, 3, 8, handler).await;
        assert_eq!(runs(&log), [2, 10], "D once (v 2), then E; {}", state(&s).await);
        assert_eq!(*seen.lock().unwrap(), [Some(2), None]);
    }

    /// Promise 1 (another agent name, same key). A debounced task of "w"
    /// in g holds "k"; a debounced enqueue of "k" for agent "v" in g is
    /// `KeyHeldByAnother`, and the "w" task keeps its data and runs.
    pub(crate) async fn a_debounce_of_the_key_for_another_agent_name_is_refused<H: Harness>(h: &H) {
        let s = h.store("rv6_debounce_agent").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let d = Duration::from_millis(500);
        let (id, _) = q.enqueue(debounced("g", "k", 1, d)).await.unwrap();
        let other = NewTask::new("v", doc! { "g": "g", "i": 2_i64, "v": 2_i64 }).group("g").dedupe_key("k").debounce(d);
        let out = q.enqueue(other).await;
        assert!(matches!(out, Err(AgentError::KeyHeldByAnother { .. })), "{out:?}");
        let log = Log::default();
        drain(&s, h.ttl(), &log, 1, 40, logging(log.clone())).await;
        assert_eq!(runs(&log), [1], "{}", state(&s).await);
        let r = s.get(&tasks(), &id).await.unwrap().record.unwrap();
        assert_eq!(r.get_bool("complete"), Some(true));
    }

    /// Promise 1 (cancel of a debounced grouped task let through, not yet
    /// started): the group's next task runs; a later debounce of the key
    /// makes a new task that runs once, after it.
    pub(crate) async fn a_cancelled_debounced_task_frees_its_group_and_its_key<H: Harness>(h: &H) {
        let s = h.store("rv6_debounce_cancel").await;
        // A key moved off its task must be free again (not on secantusd-rs).
        if !h.has("a_cancelled_debounced_task_frees_its_group_and_its_key", store_test::Needs::UniqueKeyRelease).await {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(debounced("g", "k", 1, Duration::from_secs(3600))).await.unwrap();
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), None);
        q.enqueue(grouped("g", 10).id("e")).await.unwrap();
        assert_eq!(q.cancel(doc! { "_id": id.as_bson().clone() }).await.unwrap().len(), 1);
        let (d2, new) = q.enqueue(debounced("g", "k", 3, Duration::from_millis(100))).await.unwrap();
        assert!(new && d2 != id, "a new task: {d2}");
        let log = Log::default();
        drain(&s, h.ttl(), &log, 2, 80, logging(log.clone())).await;
        assert_eq!(runs(&log), [10, 3], "{}", state(&s).await);
    }

    /// Promise 2 (`after_insert` called twice: a retry after an error the
    /// caller could not judge). P is prepared, inserted and reported twice.
    /// Q is prepared (numbered, announced); an agent's sweep runs before
    /// Q's insert commits; the caller of Q then dies before its
    /// `after_insert`. The slot must stay in the sweep until Q lands (or
    /// `LAND_WITHIN`): Q runs without any later enqueue of its group.
    pub(crate) async fn a_prepared_task_after_a_doubled_after_insert_is_not_stranded<H: Harness>(h: &H) {
        let s = h.store("rv6_prepare_twice").await;
        stranded(h, &s, true).await;
    }

    /// The control of the test above: the same, `after_insert` once.
    pub(crate) async fn a_prepared_task_whose_caller_died_before_after_insert_runs<H: Harness>(h: &H) {
        let s = h.store("rv6_prepare_once").await;
        stranded(h, &s, false).await;
    }

    /// Promise 2 (a prepared task never inserted must not hold its group):
    /// P is prepared and its transaction aborts (never inserted), with and
    /// without `after_insert`; E, enqueued after, runs at once.
    pub(crate) async fn an_aborted_prepared_task_holds_nothing<H: Harness>(h: &H) {
        let s = h.store("rv6_prepare_abort").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let p = q.prepare(grouped("g", 0)).await.unwrap();
        let _never = q.prepare(grouped("g", 1)).await.unwrap();
        q.after_insert(&p).await.unwrap();
        q.enqueue(grouped("g", 2)).await.unwrap();
        let log = Log::default();
        drain(&s, h.ttl(), &log, 1, 20, logging(log.clone())).await;
        assert_eq!(runs(&log), [2], "{}", state(&s).await);
    }

    /// Promise 2 (inserted twice): the second insert is a duplicate of the
    /// first; it runs once; `after_insert` twice after a duplicate is no
    /// second run.
    pub(crate) async fn a_prepared_task_inserted_twice_runs_once<H: Harness>(h: &H) {
        let s = h.store("rv6_prepare_dup").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let p = q.prepare(grouped("g", 0)).await.unwrap();
        let first = s.insert_many(&tasks(), vec![p.document().clone()]).await.unwrap();
        let second = s.insert_many(&tasks(), vec![p.document().clone()]).await;
        assert!(matches!(first[0], store_trait::InsertOutcome::Inserted(_)));
        assert!(!matches!(second.as_deref(), Ok([store_trait::InsertOutcome::Inserted(_)])), "{second:?}");
        q.after_insert(&p).await.unwrap();
        q.enqueue(grouped("g", 1)).await.unwrap();
        let log = Log::default();
        drain(&s, h.ttl(), &log, 3, 20, logging(log.clone())).await;
        assert_eq!(runs(&log), [0, 1], "{}", state(&s).await);
    }

    /// Promise 3 (fan-in with grouped children). An ungrouped parent waits
    /// for three follow-ups in group g; tasks of g are enqueued before and
    /// after; agents with a cap of 1 run them: one at a time, each once,
    /// the children in the order returned, and the parent's second run
    /// sees all three.
    pub(crate) async fn a_parent_waiting_for_grouped_children_runs_them_one_at_a_time<H: Harness>(h: &H) {
        let s = h.store("rv6_fu_wait").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped("g", 0)).await.unwrap();
        q.enqueue(NewTask::new("w", doc! { "g": "p", "i": -1_i64 }).id("p")).await.unwrap();
        let log = Log::default();
        let second = Arc::new(std::sync::Mutex::new(None));
        let handler = {
            let (log, second) = (log.clone(), second.clone());
            move |t: Task| {
                let (log, second) = (log.clone(), second.clone());
                Box::pin(async move {
                    if t.data().get_str("g").ok() == Some("p") {
                        if t.children().is_empty() {
                            return Outcome::done()
                                .follow_up(grouped("g", 1))
                                .follow_up(grouped("g", 2))
                                .follow_up(grouped("g", 3))
                                .wait_for_follow_ups();
                        }
                        *second.lock().unwrap() = Some(t.children().len());
                        return Outcome::done();
                    }
                    logging(log)(t).await
                }) as crate::review_groups::Boxed
            }
        };
        let stop = CancellationToken::new();
        let mut ws = Vec::new();
        for _ in 0..2 {
            let a = agent(&s, h.ttl(), Some(1), &stop);
            let handler = handler.clone();
            ws.push(tokio::spawn(async move { a.work(handler).await.unwrap() }));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        q.enqueue(grouped("g", 9)).await.unwrap();
        let done = || second.lock().unwrap().is_some() && runs(&log).len() >= 5;
        let r = tokio::time::timeout(Duration::from_secs(60), until("the parent's second run", 60, done)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.cancel();
        for w in ws {
            w.await.unwrap();
        }
        let order = runs(&log);
        assert!(r.is_ok(), "{order:?} {}", state(&s).await);
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, [0, 1, 2, 3, 9], "each once: {order:?}");
        let at = |i: i64| order.iter().position(|x| *x == i).unwrap();
        assert!(at(1) < at(2) && at(2) < at(3), "children in order: {order:?}");
        assert_eq!(most_at_once(&log), 1, "one at a time: {:?}", log.lock().unwrap());
        assert_eq!(*second.lock().unwrap(), Some(3));
    }

    /// Promise 3 (follow-ups with dedupe keys across claims). Parent "p"
    /// returns a grouped follow-up with key "k" on its first attempt and
    /// fails (retry): its follow-ups were never activated. Its second
    /// attempt returns it again and completes: it runs once.
    pub(crate) async fn a_retried_parents_keyed_grouped_follow_up_runs_once<H: Harness>(h: &H) {
        let s = h.store("rv6_fu_retry_key").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! { "g": "p", "i": -1_i64 }).id("p")).await.unwrap();
        let log = Log::default();
        let handler = {
            let log = log.clone();
            move |t: Task| {
                let log = log.clone();
                Box::pin(async move {
                    if t.data().get_str("g").ok() == Some("p") {
                        if t.attempt() == 1 {
                            return Outcome::failed("first attempt fails");
                        }
                        return Outcome::done().follow_up(grouped("g", 1).dedupe_key("k"));
                    }
                    logging(log)(t).await
                }) as crate::review_groups::Boxed
            }
        };
        drain(&s, h.ttl(), &log, 1, 60, handler.clone()).await;
        drain(&s, h.ttl(), &log, 2, 8, handler).await;
        assert_eq!(runs(&log), [1], "{}", state(&s).await);
    }
}

/// Promise 2's stranding scenario; `twice`: `after_insert` of P called twice.
async fn stranded<S: Store + Clone>(h: &impl Harness, s: &S, twice: bool) {
    let q = Queue::new(s.clone(), "tasks").unwrap();
    let p = q.prepare(grouped("g", 0)).await.unwrap();
    s.insert_many(&tasks(), vec![p.document().clone()]).await.unwrap();
    q.after_insert(&p).await.unwrap();
    if twice {
        q.after_insert(&p).await.unwrap();
    }
    let log = Log::default();
    drain(s, h.ttl(), &log, 1, 40, logging(log.clone())).await;
    assert_eq!(runs(&log), [0]);
    // Q: numbered; a sweep before its commit; its caller dies after it.
    let qd = q.prepare(grouped("g", 1)).await.unwrap();
    let b = agent(s, h.ttl(), Some(1), &CancellationToken::new());
    assert_eq!(b.process(logging(log.clone())).await.unwrap(), None);
    let before = state(s).await;
    s.insert_many(&tasks(), vec![qd.document().clone()]).await.unwrap();
    // Fresh agents, idle, sweep every poll interval.
    drain(s, h.ttl(), &log, 2, 40, logging(log.clone())).await;
    let key: &Key = qd.id();
    assert_eq!(
        runs(&log),
        [0, 1],
        "Q ({key}) committed, never run: before its insert {before}\nnow {}",
        state(s).await
    );
}
