//! Fifth review of groups: grouped follow-ups (pending until their
//! parent's fenced outcome, then numbered and activated in the order the
//! handler returned them) and a reused id beside its deleted run (cap 2);
//! every backend. Each test says FOUND (it fails: what broke) or HELD.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use mongoagent::{NewTask, Outcome, Queue, Task};
use store_test::{Call, Harness, Intercept, Intercepted};
use store_trait::{Collection, FaultKind, Key, Query, Store, StoreError, StoreResult, Write};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::groups::{agent, grouped, Log};
use crate::hold_back::{Holds as HoldCalls, Op};
use crate::review_groups::{started, stubborn, tasks, until, Holds};

/// Whether `w` is a grouped pending follow-up's activation
/// (`pending::activation`, which makes it held).
fn is_grouped_activation(w: &Write) -> bool {
    let m = format!("{:?}", w.mutation);
    m.contains("pending_parent_fence") && m.contains("group_held")
}

/// A process frozen at its first grouped activation write: that write
/// waits for [`Freeze::open`], and every other call of the process fails
/// meanwhile (its renewals too: its claim lapses, as a paused process's).
struct Freeze {
    armed: AtomicBool,
    frozen: AtomicBool,
    reached: Notify,
    open: Semaphore,
}

impl Default for Freeze {
    fn default() -> Self {
        Freeze {
            armed: AtomicBool::new(true),
            frozen: AtomicBool::new(false),
            reached: Notify::new(),
            open: Semaphore::new(0),
        }
    }
}

impl std::fmt::Debug for Freeze {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Freeze").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<S: Store> Intercept<S> for Freeze {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        if let (Some(c), Call::Write(_, w)) = (coll, &call) {
            if c.as_str() == "tasks" && is_grouped_activation(w) && self.armed.swap(false, Ordering::SeqCst) {
                self.frozen.store(true, Ordering::SeqCst);
                self.reached.notify_one();
                self.open.acquire().await.unwrap().forget();
                self.frozen.store(false, Ordering::SeqCst);
                return Ok(());
            }
        }
        if self.frozen.load(Ordering::SeqCst) {
            return Err(StoreError::backend(FaultKind::Transient, "the process is paused"));
        }
        Ok(())
    }
}

/// Fails the `n`th grouped activation write (from 0) once, with a
/// transient error (not applied): a connection lost, or a process killed,
/// between two activation writes.
struct FailActivation {
    n: usize,
    seen: AtomicUsize,
}

impl std::fmt::Debug for FailActivation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailActivation").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl<S: Store> Intercept<S> for FailActivation {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        if let (Some(c), Call::Write(_, w)) = (coll, call) {
            if c.as_str() == "tasks" && is_grouped_activation(w) && self.seen.fetch_add(1, Ordering::SeqCst) == self.n {
                return Err(StoreError::backend(FaultKind::Transient, "the connection dropped"));
            }
        }
        Ok(())
    }
}

/// A handler: the parent (`g` = "p") returns `children` as follow-ups;
/// every run of a grouped task is logged as (g, i, started).
fn parent_of(children: Vec<NewTask>, log: Log) -> impl Fn(Task) -> crate::review_groups::Boxed + Send + Sync + Clone {
    move |t: Task| {
        let (children, log) = (children.clone(), log.clone());
        Box::pin(async move {
            let g = t.data().get_str("g").unwrap_or("-").to_owned();
            let i = t.data().get_i64("i").unwrap_or(-1);
            if g == "p" {
                return children.into_iter().fold(Outcome::done(), Outcome::follow_up);
            }
            log.lock().unwrap().push((g.clone(), i, true));
            log.lock().unwrap().push((g, i, false));
            Outcome::done()
        })
    }
}

/// Runs `process` with a cap of 1 until `want` runs are logged (or the
/// rounds run out), a poll interval apart when it finds nothing.
async fn drain<S: Store + Clone>(
    s: &S,
    ttl: Duration,
    log: &Log,
    want: usize,
    handler: impl mongoagent::Handler + Clone,
) {
    let a = agent(s, ttl, Some(1), &CancellationToken::new());
    for _ in 0..80 {
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

fn run_order(log: &Log) -> Vec<i64> {
    log.lock().unwrap().iter().filter(|(_, _, s)| *s).map(|(_, i, _)| *i).collect()
}

async fn seqs<S: Store>(s: &S) -> Vec<String> {
    let mut all: Vec<String> = s
        .find(&tasks(), &Query::eq(doc! { "group_key": "g" }))
        .await
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{}(i {:?})#{:?} held {:?} ready {:?} complete {:?}",
                r.key(),
                r.get_i64("i"),
                r.get_i64("group_seq"),
                r.get_bool("group_held"),
                r.get_bool("ready"),
                r.get_bool("complete")
            )
        })
        .collect();
    all.sort();
    all
}

/// The suite (`review_groups5_suite`): each `pub(crate) async fn` over a
/// `Harness` here is one test on every backend.
#[store_test::suite(review_groups5_suite, crate::review_groups5::cases)]
pub(crate) mod cases {
    use super::*;

    /// Promise 2 (a reused id must not free, nor take, its deleted run's
    /// turn; cap 2). Task "a" (i 0) runs in X and is force-deleted (its
    /// turn stays taken in `gone_busy` until its lease ends); a new task
    /// takes the id "a" (i 2) and is let through in the other turn, and
    /// runs in Y. Both turns are taken. A producer then enqueues "c"
    /// (i 3), and an agent settles the slot while both runs go on: "c"
    /// must stay held. (The attack: the settle keeps the deleted run's
    /// entry `a#1` from `gone_busy`, then passes over the found new "a"
    /// because an entry with its *id* is kept already, and counts one
    /// turn free.)
    pub(crate) async fn a_settle_while_a_reused_id_runs_beside_its_deleted_run_keeps_the_cap<H: Harness>(h: &H) {
        let s = h.store("rv5_groups_reuse_settle").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped("g", 0).id("a")).await.unwrap();
        let (log, release) = (Log::default(), Arc::new(Notify::new()));
        let x = agent(&s, Duration::from_secs(30), Some(2), &CancellationToken::new());
        let run_x = tokio::spawn({
            let handler = stubborn(log.clone(), release.clone(), Holds::FirstAttempt);
            async move { x.process(handler).await }
        });
        until("X to start task 0", 30, || started(&log, 0)).await;
        assert_eq!(q.delete(doc! { "_id": "a" }).force(true).await.unwrap().len(), 1);
        assert!(q.enqueue(grouped("g", 2).id("a")).await.unwrap().1, "the id is free again");
        // Y runs the new "a", which holds until released.
        let release_y = Arc::new(Notify::new());
        let y = agent(&s, Duration::from_secs(30), Some(2), &CancellationToken::new());
        let run_y = tokio::spawn({
            let (log, release_y) = (log.clone(), release_y.clone());
            async move {
                for _ in 0..40 {
                    let (log, release_y) = (log.clone(), release_y.clone());
                    let p = y
                        .process(move |t: Task| {
                            let (log, release_y) = (log.clone(), release_y.clone());
                            async move {
                                let i = t.data().get_i64("i").unwrap();
                                log.lock().unwrap().push(("y".into(), i, true));
                                if i == 2 {
                                    release_y.notified().await;
                                }
                                log.lock().unwrap().push(("y".into(), i, false));
                                true
                            }
                        })
                        .await
                        .unwrap();
                    if p.is_some() {
                        return p;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                None
            }
        });
        until("Y to start the new \"a\"", 30, || started(&log, 2)).await;
        // Both turns taken: the deleted run of "a", the new "a".
        q.enqueue(grouped("g", 3).id("c")).await.unwrap();
        let before = seqs(&s).await;
        let z = agent(&s, Duration::from_secs(30), Some(2), &CancellationToken::new());
        let mut ran = None;
        for _ in 0..4 {
            if let Some(p) = z.process(|_t: Task| async { true }).await.unwrap() {
                ran = Some(p);
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let after = seqs(&s).await;
        let slot = s.find(&crate::review_groups::slots(), &Query::all()).await.unwrap();
        release.notify_one();
        release_y.notify_one();
        let _ = run_x.await.unwrap();
        let _ = run_y.await.unwrap();
        assert_eq!(
            ran, None,
            "\"c\" ran while the deleted \"a\" and the new \"a\" both still ran (3 > cap 2); tasks before: {before:?}; after: {after:?}; slot: {slot:?}"
        );
    }

    /// Promise 1 (order of a parent's grouped follow-ups, under a stale
    /// run). Parent "p" returns follow-ups i 1 then i 2, both in group g.
    /// Its agent X writes the outcome, numbers them (1, 2) and is paused at
    /// its first activation write; its claim lapses. Y claims "p" and
    /// finishes the step: it numbers them again (3, 4), activates i 1 with
    /// 3, and is held before i 2's write. X resumes: its write of i 1 is
    /// rejected (active already), its write of i 2 applies, with 2. Then Y's
    /// of i 2 is rejected. With a cap of 1, i 2 (number 2) must still not
    /// run before i 1 (number 3): the promise is the order the handler
    /// returned them.
    pub(crate) async fn racing_activations_of_a_lapsed_parent_keep_its_follow_ups_in_order<H: Harness>(h: &H) {
        let s = h.store("rv5_groups_fu_race").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! { "g": "p", "i": -1_i64 }).id("p")).await.unwrap();
        let log = Log::default();
        let handler = parent_of(vec![grouped("g", 1), grouped("g", 2)], log.clone());
        let xs = Intercepted::with(s.clone(), Freeze::default());
        let x = agent(&xs, h.ttl(), Some(1), &CancellationToken::new());
        let run_x = tokio::spawn({
            let handler = handler.clone();
            async move { x.process(handler).await }
        });
        xs.reached.notified().await;
        // Y: its second activation write waits.
        let ys = Intercepted::with(s.clone(), HoldCalls::default());
        let n = Arc::new(AtomicUsize::new(0));
        ys.hold_next({
            let n = n.clone();
            move |c, op| {
                c.as_str() == "tasks"
                    && matches!(op, Op::Write(w) if is_grouped_activation(w))
                    && n.fetch_add(1, Ordering::SeqCst) == 1
            }
        });
        let y = agent(&ys, h.ttl(), Some(1), &CancellationToken::new());
        let run_y = tokio::spawn({
            let handler = handler.clone();
            async move {
                for _ in 0..200 {
                    match y.process(handler.clone()).await {
                        Ok(Some(p)) => return Some(p),
                        Ok(None) => tokio::time::sleep(Duration::from_millis(100)).await,
                        Err(e) => panic!("Y: {e}"),
                    }
                }
                None
            }
        });
        tokio::select! {
            () = ys.reached() => {}
            p = run_y => panic!("Y never reached its second activation write: {p:?}; {:?}", seqs(&s).await),
        };
        xs.open.add_permits(1);
        let px = run_x.await.unwrap();
        ys.open();
        let mid = seqs(&s).await;
        drain(&s, h.ttl(), &log, 2, handler.clone()).await;
        let order = run_order(&log);
        assert_eq!(
            order,
            [1, 2],
            "the follow-ups run in the order the parent returned them; X: {px:?}; tasks after both activations: {mid:?}"
        );
    }

    /// Promise 1 (a follow-up enters its group when its parent's outcome
    /// is written, in the order returned). Parent "p" returns i 1 and i 2
    /// in group g; its outcome is written, i 1 activated, and the
    /// activation write of i 2 fails (a dropped connection: the agent gives
    /// the step up, and a later claim finishes it). A producer enqueues
    /// "c" (i 5) in group g after the parent's outcome was written.
    ///
    /// FOUND ("c" ran before i 2), decided: a limit. Numbers are now given
    /// when the follow-ups are enqueued pending (i 2 keeps 2, ahead of
    /// "c"'s 3), but i 2 is held only from its activation, which the
    /// parent's next claim makes after its lease: "c", let through in that
    /// window, runs first. Siblings keep their order, and each runs once.
    pub(crate) async fn a_follow_up_whose_activation_failed_keeps_its_place_before_later_enqueues<H: Harness>(h: &H) {
        let s = h.store("rv5_groups_fu_fail").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! { "g": "p", "i": -1_i64 }).id("p")).await.unwrap();
        let log = Log::default();
        let handler = parent_of(vec![grouped("g", 1), grouped("g", 2)], log.clone());
        let xs = Intercepted::with(s.clone(), FailActivation { n: 1, seen: AtomicUsize::new(0) });
        let x = agent(&xs, h.ttl(), Some(1), &CancellationToken::new());
        let px = x.process(handler.clone()).await;
        let p = s.get(&tasks(), &Key::new("p").unwrap()).await.unwrap().record.unwrap();
        assert!(p.data().contains_key("follow_ups_fence"), "the parent's outcome was written: {px:?} {p:?}");
        q.enqueue(grouped("g", 5).id("c")).await.unwrap();
        let mid = seqs(&s).await;
        drain(&s, h.ttl(), &log, 3, handler.clone()).await;
        let order = run_order(&log);
        let at = |i: i64| order.iter().position(|x| *x == i);
        assert_eq!(order.len(), 3, "each once: {order:?}");
        assert!(at(1) < at(2), "the siblings in the order returned: {order:?}");
        assert!(
            [[1, 2, 5], [1, 5, 2]].contains(&[order[0], order[1], order[2]]),
            "X: {px:?}; tasks after the enqueue of \"c\": {mid:?}; after: {:?}",
            seqs(&s).await
        );
    }

    /// Promise 1 (dedupe keys on grouped follow-ups; exactly once, none
    /// lost). Parent "p" returns two follow-ups of group g with one dedupe
    /// key "k" (i 1 and i 2): as two enqueues of one key, the second is a
    /// duplicate of the first, which runs once; the parent completes. (The
    /// attack: the second's pending insert finds the key on its pending
    /// sibling, which `place_pending` calls "held by a pending task; try
    /// again", a transient error: every attempt of the parent fails so.)
    pub(crate) async fn sibling_follow_ups_with_one_dedupe_key_run_once<H: Harness>(h: &H) {
        let s = h.store("rv5_groups_fu_sibling_key").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! { "g": "p", "i": -1_i64 }).id("p")).await.unwrap();
        let log = Log::default();
        let handler = parent_of(vec![grouped("g", 1).dedupe_key("k"), grouped("g", 2).dedupe_key("k")], log.clone());
        drain(&s, h.ttl(), &log, 1, handler.clone()).await;
        // A little longer, for a duplicate run.
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        for _ in 0..8 {
            let _ = a.process(handler.clone()).await;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let p = s.get(&tasks(), &Key::new("p").unwrap()).await.unwrap().record.unwrap();
        assert_eq!(
            (run_order(&log), p.get_bool("complete"), p.get_bool("error_encountered")),
            (vec![1], Some(true), Some(false)),
            "the first follow-up runs once and the parent completes: parent {p:?}; tasks {:?}",
            seqs(&s).await
        );
    }

    /// FOUND with the test above (its second half), fixed: a parent whose
    /// follow-ups fail for good after some went in pending left those
    /// pending for ever, holding their dedupe keys: a later enqueue of the
    /// key was a duplicate of a task that never runs. Here the second
    /// follow-up's id is taken by a task of no parent (an `InvalidTask`),
    /// after the first, with key "z", went in.
    pub(crate) async fn a_claim_whose_follow_ups_failed_leaves_none_pending<H: Harness>(h: &H) {
        let s = h.store("rv5_fu_failed_pending").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("other", doc! {}).id("p/1")).await.unwrap();
        q.enqueue(NewTask::new("w", doc! { "g": "p", "i": -1_i64 }).id("p")).await.unwrap();
        let log = Log::default();
        let handler = parent_of(vec![grouped("g", 1).dedupe_key("z"), grouped("g", 2)], log.clone());
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        let p = a.process(handler).await.unwrap();
        assert_eq!(p, Some(mongoagent::Processed::Failed(Key::new("p").unwrap())), "failed for good");
        let left = s.find(&tasks(), &Query::eq(doc! { "parent": "p" })).await.unwrap();
        assert!(left.is_empty(), "no follow-up left pending: {left:?}");
        let (_, new) = q.enqueue(NewTask::new("w", doc! { "g": "z", "i": 3_i64 }).dedupe_key("z")).await.unwrap();
        assert!(new, "the key is free");
    }

    /// Promise 1 (dedupe keys on grouped follow-ups). Task "e" of group g
    /// with dedupe key "k", scope until-ended, has completed: the key no
    /// longer blocks (an enqueue of it now inserts a new task). A parent
    /// then returns a grouped follow-up with that key and scope: it must
    /// run. (The attack: `place_pending` takes any task holding the key as
    /// standing for the follow-up, without asking whether it still blocks.)
    pub(crate) async fn a_follow_up_whose_key_an_ended_until_ended_task_held_runs<H: Harness>(h: &H) {
        let s = h.store("rv5_groups_fu_until_ended").await;
        // A key moved off its task must be free again (not on secantusd-rs).
        if !h
            .has("a_follow_up_whose_key_an_ended_until_ended_task_held_runs", store_test::Needs::UniqueKeyRelease)
            .await
        {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let k = || grouped("g", 1).dedupe_key("k").dedupe_scope(mongoagent::DedupeScope::UntilEnded);
        q.enqueue(grouped("g", 0).id("e").dedupe_key("k").dedupe_scope(mongoagent::DedupeScope::UntilEnded))
            .await
            .unwrap();
        let log = Log::default();
        let handler = parent_of(vec![k()], log.clone());
        drain(&s, h.ttl(), &log, 1, handler.clone()).await;
        assert_eq!(run_order(&log), [0]);
        q.enqueue(NewTask::new("w", doc! { "g": "p", "i": -1_i64 }).id("p")).await.unwrap();
        drain(&s, h.ttl(), &log, 2, handler.clone()).await;
        let p = s.get(&tasks(), &Key::new("p").unwrap()).await.unwrap().record.unwrap();
        assert_eq!(
            run_order(&log),
            [0, 1],
            "the follow-up runs: its key no longer blocked; parent {p:?}; tasks {:?}",
            seqs(&s).await
        );
    }

    /// Promise 1 (the refusal). A grouped parent that waits for a
    /// follow-up in its own agent name and group fails for good, leaves
    /// no follow-up behind (pending or not), and frees its group: the
    /// group's next task runs.
    pub(crate) async fn a_waiting_parents_follow_up_in_its_own_group_is_refused_and_frees_the_group<H: Harness>(h: &H) {
        let s = h.store("rv5_groups_fu_refused").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped("g", 0).id("p")).await.unwrap();
        q.enqueue(grouped("g", 1).id("e")).await.unwrap();
        let log = Log::default();
        let handler = {
            let log = log.clone();
            move |t: Task| {
                let log = log.clone();
                async move {
                    let i = t.data().get_i64("i").unwrap();
                    log.lock().unwrap().push(("g".into(), i, true));
                    if i == 0 {
                        // Another group first, then its own: refused all the same.
                        return Outcome::done()
                            .follow_up(grouped("h", 4))
                            .follow_up(grouped("g", 5))
                            .wait_for_follow_ups();
                    }
                    Outcome::done()
                }
            }
        };
        drain(&s, h.ttl(), &log, 2, handler.clone()).await;
        let p = s.get(&tasks(), &Key::new("p").unwrap()).await.unwrap().record.unwrap();
        let children = s.find(&tasks(), &Query::eq(doc! { "parent": "p" })).await.unwrap();
        assert_eq!(run_order(&log), [0, 1], "p once, then e; tasks {:?}", seqs(&s).await);
        assert_eq!((p.get_bool("complete"), p.get_bool("error_encountered")), (Some(true), Some(true)), "{p:?}");
        assert!(children.is_empty(), "no follow-up left behind: {children:?}");
    }

    /// Promise 1 (crash). Grouped parent "p" (i 0) runs under a cap of 1;
    /// "e" (i 1) is enqueued in its group behind it. "p" returns a
    /// follow-up (i 9) in the same group; its agent writes the outcome and
    /// dies as it announces the follow-up's activation. After the claim lapses, the next
    /// agent finishes the step: "p" once, then "e", then the follow-up,
    /// each once.
    pub(crate) async fn a_crash_while_numbering_a_follow_up_in_the_parents_group_runs_each_once_in_order<H: Harness>(
        h: &H,
    ) {
        let s = h.store("rv5_groups_fu_crash").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped("g", 0).id("p")).await.unwrap();
        q.enqueue(grouped("g", 1).id("e")).await.unwrap();
        let log = Log::default();
        let handler = {
            let log = log.clone();
            move |t: Task| {
                let log = log.clone();
                async move {
                    let i = t.data().get_i64("i").unwrap();
                    log.lock().unwrap().push(("g".into(), i, true));
                    if i == 0 {
                        return Outcome::done().follow_up(grouped("g", 9));
                    }
                    Outcome::done()
                }
            }
        };
        let xs = Intercepted::with(s.clone(), HoldCalls::default());
        // The second announcement: the activation's, after the outcome (the
        // first is the numbering, before the outcome, where a crash re-runs
        // the handler as any crash before an outcome does).
        let n = Arc::new(AtomicUsize::new(0));
        xs.hold_next(move |c, op| {
            c.as_str() == "tasks_groups"
                && matches!(op, Op::Write(w) if format!("{:?}", w.mutation).contains("announced"))
                && n.fetch_add(1, Ordering::SeqCst) == 1
        });
        let x = agent(&xs, h.ttl(), Some(1), &CancellationToken::new());
        let run_x = tokio::spawn({
            let handler = handler.clone();
            async move { x.process(handler).await }
        });
        xs.reached().await;
        run_x.abort();
        let _ = run_x.await;
        drain(&s, h.ttl(), &log, 3, handler.clone()).await;
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        for _ in 0..8 {
            let _ = a.process(handler.clone()).await;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert_eq!(run_order(&log), [0, 1, 9], "tasks {:?}", seqs(&s).await);
    }
}
