//! Second review of groups: a group's turn against runs that go on after
//! their task changed under them (a stale claim's run ending, a delete
//! racing a claim, a cancel then a delete, a handler that ignores its
//! cancellation) and against a producer whose insert lands late and whose
//! nudge is lost; every backend. Each test was a finding; each now holds.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use mongoagent::{Processed, Queue, Task};
use store_test::{Harness, Intercepted};
use store_trait::{Condition, Key, Mutation, Query, Store, Write};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::groups::{agent, grouped, Log};
use crate::hold_back::{HoldBack, Op};
use crate::review_groups::{ended, slots, started, stubborn, tasks, until, Holds, Producer};

/// Whether task `id` is ready, claimed or ended (let through).
async fn let_through<S: Store>(s: &S, id: &str) -> bool {
    let r = s.get(&tasks(), &Key::new(id).unwrap()).await.unwrap().record.unwrap();
    r.get_bool("group_held") != Some(true)
}

/// The suite (`review_group_runs_suite`): each `pub(crate) async fn` over a
/// `Harness` here is one test on every backend.
#[store_test::suite(review_group_runs_suite, crate::review_group_runs::cases)]
pub(crate) mod cases {
    use super::*;

    /// A claim lapses under a run that goes on (agent X), another agent (Y)
    /// claims the task again, and the task is cancelled while Y runs it:
    /// its turn is busy until Y's run ends. X's stale run ending then says
    /// nothing of Y's: the group's next task stays held.
    pub(crate) async fn a_stale_runs_end_does_not_free_a_newer_cancelled_runs_turn<H: Harness>(h: &H) {
        let s = h.store("rv_group_runs_stale").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (a, _) = q.enqueue(grouped("g", 0).id("a")).await.unwrap();
        q.enqueue(grouped("g", 1).id("b")).await.unwrap();
        let (log_x, release_x) = (Log::default(), Arc::new(Notify::new()));
        // Long leases: neither run is aborted at its lease's end here.
        let x = agent(&s, Duration::from_secs(30), Some(1), &CancellationToken::new());
        let run_x = tokio::spawn({
            let handler = stubborn(log_x.clone(), release_x.clone(), Holds::EveryRun);
            async move { x.process(handler).await }
        });
        until("X to start task 0", 30, || started(&log_x, 0)).await;
        // X's claim lapses (as if X were paused past its lease).
        s.write(&tasks(), &a, &Write::new(Condition::Always, Mutation::new().release())).await.unwrap();
        let (log_y, release_y) = (Log::default(), Arc::new(Notify::new()));
        let y = agent(&s, Duration::from_secs(10), Some(1), &CancellationToken::new());
        let run_y = tokio::spawn({
            let handler = stubborn(log_y.clone(), release_y.clone(), Holds::EveryRun);
            async move { y.process(handler).await }
        });
        until("Y to start task 0 again", 30, || started(&log_y, 0)).await;
        assert_eq!(q.cancel_ids(std::slice::from_ref(&a)).await.unwrap(), vec![a.clone()]);
        // X's run ends: stale.
        release_x.notify_one();
        assert_eq!(run_x.await.unwrap().unwrap(), Some(Processed::Stale(a.clone())));
        assert!(!ended(&log_y, 0), "Y's run still goes on");
        assert!(!let_through(&s, "b").await, "task 1 was let through while Y's cancelled run of task 0 went on");
        // Y's run ends: now the turn frees.
        release_y.notify_one();
        assert_eq!(run_y.await.unwrap().unwrap(), Some(Processed::Stale(a)));
        assert!(let_through(&s, "b").await, "task 1 let through once the cancelled run ended");
    }

    /// A forced delete reads the task ready, an agent claims and starts it,
    /// then the delete lands: it must see the claim, and keep the group's
    /// turn taken until that run ends.
    pub(crate) async fn a_forced_delete_racing_a_claim_keeps_the_turn<H: Harness>(h: &H) {
        let s = h.store("rv_group_runs_delete_claim").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped("g", 0).id("a")).await.unwrap();
        q.enqueue(grouped("g", 1).id("b")).await.unwrap();
        let (log, release) = (Log::default(), Arc::new(Notify::new()));
        // X lets task 0 through, then its claim waits.
        let held_x = HoldBack::new(s.clone());
        held_x.hold_next(|c, op| c.as_str() == "tasks" && matches!(op, Op::Claim(_)));
        let x = agent(&held_x, Duration::from_secs(30), Some(1), &CancellationToken::new());
        let run_x = tokio::spawn({
            let handler = stubborn(log.clone(), release.clone(), Holds::EveryRun);
            async move { x.process(handler).await }
        });
        held_x.reached().await;
        assert!(let_through(&s, "a").await);
        // The delete reads task 0 ready; its delete waits.
        let held_op = HoldBack::new(s.clone());
        held_op.hold_next(|c, op| c.as_str() == "tasks" && matches!(op, Op::Delete(k) if k.as_str() == Some("a")));
        let op = Queue::new(held_op.clone(), "tasks").unwrap();
        let delete = tokio::spawn(async move { op.delete(doc! { "_id": "a" }).force(true).await });
        held_op.reached().await;
        held_x.open();
        until("X to start task 0", 30, || started(&log, 0)).await;
        held_op.open();
        assert_eq!(delete.await.unwrap().unwrap().len(), 1, "the task was deleted");
        let y = agent(&s, Duration::from_secs(30), Some(1), &CancellationToken::new());
        let other = y.process(stubborn(log.clone(), release.clone(), Holds::EveryRun)).await.unwrap();
        assert_eq!(other, None, "task 1 ran while the deleted task 0 still ran: {:?}", log.lock().unwrap());
        assert!(!let_through(&s, "b").await);
        release.notify_one();
        run_x.await.unwrap().unwrap();
        let next = y.process(stubborn(log.clone(), release.clone(), Holds::EveryRun)).await.unwrap();
        assert_eq!(next, Some(Processed::Completed(Key::new("b").unwrap())), "task 1 runs once task 0's run ended");
    }

    /// A running grouped task is cancelled (its turn busy until its run
    /// ends), then deleted as an ended task: the delete keeps the turn
    /// taken, as a forced delete of a running task does.
    pub(crate) async fn a_delete_after_a_cancel_keeps_the_runs_turn<H: Harness>(h: &H) {
        let s = h.store("rv_group_runs_cancel_delete").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (a, _) = q.enqueue(grouped("g", 0).id("a")).await.unwrap();
        q.enqueue(grouped("g", 1).id("b")).await.unwrap();
        let (log, release) = (Log::default(), Arc::new(Notify::new()));
        let x = agent(&s, Duration::from_secs(30), Some(1), &CancellationToken::new());
        let run_x = tokio::spawn({
            let handler = stubborn(log.clone(), release.clone(), Holds::EveryRun);
            async move { x.process(handler).await }
        });
        until("task 0 to start", 30, || started(&log, 0)).await;
        assert_eq!(q.cancel_ids(std::slice::from_ref(&a)).await.unwrap(), vec![a.clone()]);
        assert_eq!(q.delete(doc! { "_id": "a" }).await.unwrap(), vec![a.clone()], "an ended task is deleted");
        let y = agent(&s, Duration::from_secs(30), Some(1), &CancellationToken::new());
        let other = y.process(stubborn(log.clone(), release.clone(), Holds::EveryRun)).await.unwrap();
        assert_eq!(other, None, "task 1 ran while the cancelled, deleted task 0 still ran");
        release.notify_one();
        assert_eq!(run_x.await.unwrap().unwrap(), Some(Processed::Stale(a)));
        let next = y.process(stubborn(log.clone(), release.clone(), Holds::EveryRun)).await.unwrap();
        assert_eq!(next, Some(Processed::Completed(Key::new("b").unwrap())));
    }

    /// A handler that ignores its cancellation after its task was cancelled
    /// is aborted at its lease's end: the group's next task never starts
    /// beside it.
    pub(crate) async fn a_handler_ignoring_a_cancel_is_aborted_before_the_next_starts<H: Harness>(h: &H) {
        let s = h.store("rv_group_runs_stubborn").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (a, _) = q.enqueue(grouped("g", 0).id("a")).await.unwrap();
        q.enqueue(grouped("g", 1).id("b")).await.unwrap();
        let (log, never) = (Log::default(), Arc::new(Notify::new()));
        let stop = CancellationToken::new();
        let w = agent(&s, h.ttl(), Some(1), &stop);
        let worker = tokio::spawn({
            let handler = stubborn(log.clone(), never.clone(), Holds::EveryRun);
            async move { w.work(handler).await.unwrap() }
        });
        until("task 0 to start", 30, || started(&log, 0)).await;
        assert_eq!(q.cancel_ids(std::slice::from_ref(&a)).await.unwrap(), vec![a]);
        until("task 1 to run", 60, || ended(&log, 1)).await;
        stop.cancel();
        worker.await.unwrap();
        let log = log.lock().unwrap().clone();
        let at = |i: i64, start: bool| log.iter().position(|(_, j, s)| *j == i && *s == start);
        assert!(
            at(0, false).is_some_and(|end| at(1, true).is_some_and(|start| end < start)),
            "task 0's handler, which ignores its cancellation, was aborted before task 1 started: {log:?}"
        );
    }

    /// A producer numbers its task, every agent's sweep passes while its
    /// insert is slow, the insert lands and its nudge is lost (the producer
    /// died): the slot stayed in the sweep, and the task runs.
    pub(crate) async fn a_late_insert_whose_nudge_is_lost_still_runs<H: Harness>(h: &H) {
        let s = h.store("rv_group_runs_late").await;
        let prod = Intercepted::with(s.clone(), Producer::default());
        prod.hold_insert.store(true, Ordering::SeqCst);
        prod.fail_nudge.store(true, Ordering::SeqCst);
        let producer = tokio::spawn({
            let q = Queue::new(prod.clone(), "tasks").unwrap();
            async move { q.enqueue(grouped("g", 0)).await }
        });
        prod.reached.notified().await;
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        for _ in 0..3 {
            assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), None);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let slot = s.get(&slots(), &Key::new("1:w/g").unwrap()).await.unwrap().record.unwrap();
        assert_eq!(slot.get_bool("active"), Some(true), "the slot left the sweep with an insert announced: {slot:?}");
        prod.open.add_permits(1);
        assert!(producer.await.unwrap().is_ok());
        let stop = CancellationToken::new();
        let w = agent(&s, h.ttl(), Some(1), &stop);
        let worker = tokio::spawn(async move { w.work(|_t: Task| async { true }).await.unwrap() });
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while q.stats("w").await.unwrap().completed < 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.cancel();
        worker.await.unwrap();
        assert_eq!(q.stats("w").await.unwrap().completed, 1, "the late task ran");
    }

    /// A producer that dies between numbering and inserting leaves an
    /// announcement that never lands: the slot stays in the sweep until
    /// its `land_by`, then leaves it, and the group goes on as before.
    pub(crate) async fn an_announcement_that_never_lands_is_given_up<H: Harness>(h: &H) {
        let s = h.store("rv_group_runs_never").await;
        let prod = Intercepted::with(s.clone(), Producer::default());
        prod.hold_insert.store(true, Ordering::SeqCst);
        let producer = tokio::spawn({
            let q = Queue::new(prod.clone(), "tasks").unwrap();
            async move { q.enqueue(grouped("g", 0)).await }
        });
        prod.reached.notified().await;
        // The producer dies before its insert.
        producer.abort();
        let key = Key::new("1:w/g").unwrap();
        let a = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), None);
        let slot = s.get(&slots(), &key).await.unwrap().record.unwrap();
        assert_eq!(slot.get_bool("active"), Some(true), "announced: in the sweep");
        // An hour on.
        let past = Mutation::new().set("land_by", bson::DateTime::from_millis(0));
        s.write(&slots(), &key, &Write::new(Condition::Always, past)).await.unwrap();
        let b = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        assert_eq!(b.process(|_t: Task| async { true }).await.unwrap(), None);
        let slot = s.get(&slots(), &key).await.unwrap().record.unwrap();
        assert_eq!(slot.get_bool("active"), Some(false), "given up: out of the sweep");
        assert_eq!(slot.get_i64("landed"), slot.get_i64("announced"), "a later announcement counts from here");
        // The group goes on.
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(grouped("g", 1)).await.unwrap();
        let c = agent(&s, h.ttl(), Some(1), &CancellationToken::new());
        assert!(matches!(c.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
        assert_eq!(s.find(&tasks(), &Query::all()).await.unwrap().len(), 1, "the dead producer inserted nothing");
    }
}
