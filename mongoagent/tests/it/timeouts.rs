//! Execution timeouts, every backend: at its timeout (the task's own, else
//! the agent's) a handler's cancellation fires and the attempt fails with
//! "timed out after …", retried by the usual policy; a handler that ignores
//! its cancellation past the grace is aborted and its claim left to lapse,
//! so nobody else runs the task before the lease's end, and what it still
//! writes after that is fenced out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Document};
use mongoagent::{Agent, AgentError, NewTask, Outcome, Processed, Queue, Task, TimedOutAttempt};
use store_test::Harness;
use store_trait::{Collection, Key, Store};

async fn doc_of<S: Store>(s: &S, id: &str) -> Document {
    let coll = Collection::new("tasks").unwrap();
    s.get(&coll, &Key::new(id).unwrap()).await.unwrap().record.unwrap().into_data()
}

/// Completes a second attempt; fails a task run any other time for good.
fn second_attempt(t: &Task) -> Outcome {
    if t.attempt() == 2 {
        Outcome::done()
    } else {
        Outcome::failed_permanently(format!("attempt {}, not the second", t.attempt()))
    }
}

/// The task's fields tell that the attempt of the claim with `fence` timed
/// out after `ms` (`TimedOutAttempt`, which the events and the views read).
fn assert_marked(d: &Document, fence: u64, attempt: u64, ms: u64) {
    let t = TimedOutAttempt::of(d).unwrap_or_else(|| panic!("no timed-out attempt in {d}"));
    assert_eq!((t.fence, t.attempt, t.after), (fence, attempt, Duration::from_millis(ms)), "{d}");
}

/// The suite (`timeouts_suite`): each `pub(crate) async fn` over a `Harness` here
/// is one test on every backend, registered by being written.
#[store_test::suite(timeouts_suite, crate::timeouts::cases)]
pub(crate) mod cases {
    use super::*;

    /// The agent's timeout fires the handler's cancellation, with
    /// `Task::timed_out` set; whatever the handler then returns, the attempt
    /// failed ("timed out after 300 ms") and the task is retried, and its next
    /// run, within the limit, completes it.
    pub(crate) async fn a_timed_out_handler_is_cancelled_and_its_attempt_retried<H: Harness>(h: &H) {
        let s = h.store("ag_timeout_retried").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(NewTask::new("t", doc! {}).id("slow")).await.unwrap();
        let a = Agent::builder(s.clone(), "t", "tasks")
            .ttl(h.ttl())
            .timeout(Duration::from_millis(300))
            .backoff(Duration::from_millis(10), Duration::from_millis(10))
            .build()
            .unwrap();
        let saw_timeout = Arc::new(AtomicBool::new(false));
        let seen = saw_timeout.clone();
        let got = a
            .process(move |t: Task| {
                let seen = seen.clone();
                async move {
                    assert_eq!(t.timeout(), Some(Duration::from_millis(300)));
                    t.cancellation().cancelled().await;
                    seen.store(t.timed_out(), Ordering::SeqCst);
                    // Claims success: a timed-out attempt failed all the same.
                    Outcome::done()
                }
            })
            .await
            .unwrap();
        assert_eq!(got, Some(Processed::Retried(id.clone())));
        assert!(saw_timeout.load(Ordering::SeqCst), "the handler could tell a timeout from a lost claim");
        let d = doc_of(&s, "slow").await;
        assert_eq!(d.get_str("last_error").unwrap(), "timed out after 300 ms", "{d}");
        assert_ne!(d.get_bool("complete").ok(), Some(true), "{d}");
        assert_marked(&d, 1, 1, 300);
        assert_eq!(q.stats("t").await.unwrap().timed_out, 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let quick = a.process(|t: Task| async move { second_attempt(&t) });
        assert_eq!(quick.await.unwrap(), Some(Processed::Completed(id)));
        // The latest attempt no longer timed out.
        let d = doc_of(&s, "slow").await;
        assert_eq!(TimedOutAttempt::of(&d), None, "{d}");
        assert_eq!(q.stats("t").await.unwrap().timed_out, 0);
    }

    /// A task's own timeout wins over the agent's (none here, or a long one),
    /// and with one attempt the timed-out task fails for good.
    pub(crate) async fn a_timed_out_task_with_one_attempt_fails_for_good<H: Harness>(h: &H) {
        let s = h.store("ag_timeout_for_good").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let task = NewTask::new("t", doc! {}).id("once").timeout(Duration::from_millis(200)).max_attempts(1);
        let (id, _) = q.enqueue(task).await.unwrap();
        assert_eq!(doc_of(&s, "once").await.get_i64("timeout_ms").unwrap(), 200);
        let a =
            Agent::builder(s.clone(), "t", "tasks").ttl(h.ttl()).timeout(Duration::from_secs(3600)).build().unwrap();
        let got = a
            .process(|t: Task| async move {
                assert_eq!(t.timeout(), Some(Duration::from_millis(200)), "the task's own timeout");
                t.cancellation().cancelled().await;
                Outcome::failed("stopped")
            })
            .await
            .unwrap();
        assert_eq!(got, Some(Processed::Failed(id)));
        let d = doc_of(&s, "once").await;
        assert!(d.get_bool("complete").unwrap(), "{d}");
        assert!(d.get_bool("error_encountered").unwrap(), "{d}");
        assert_eq!(d.get_str("last_error").unwrap(), "timed out after 200 ms", "{d}");
        assert_marked(&d, 1, 1, 200);
        let stats = q.stats("t").await.unwrap();
        assert_eq!((stats.failed, stats.timed_out), (1, 1), "{stats:?}");
        // A requeue starts the attempts over: the timeout is history.
        assert_eq!(q.requeue(doc! {"_id": "once"}).await.unwrap().len(), 1);
        assert_eq!(TimedOutAttempt::of(&doc_of(&s, "once").await), None);
        assert_eq!(q.stats("t").await.unwrap().timed_out, 0);
    }

    /// A handler that goes on past its timeout and the grace is aborted; its
    /// claim is not released but left to lapse (no other agent gets the task
    /// before the lease's end), and then the task runs again, while a write
    /// from work the handler left running is fenced out.
    pub(crate) async fn a_handler_that_ignores_its_timeout_is_abandoned_and_fenced_out<H: Harness>(h: &H) {
        let s = h.store("ag_timeout_abandoned").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(NewTask::new("t", doc! {}).id("hung")).await.unwrap();
        let ttl = h.ttl();
        let build = || {
            Agent::builder(s.clone(), "t", "tasks")
                .ttl(ttl)
                .timeout(Duration::from_millis(200))
                .timeout_grace(Duration::from_millis(200))
                .backoff(Duration::from_millis(10), Duration::from_millis(10))
                .build()
                .unwrap()
        };
        let (a, b) = (build(), build());
        let (left_tx, left_rx) = tokio::sync::oneshot::channel::<Task>();
        let left = Arc::new(parking_lot::Mutex::new(Some(left_tx)));
        let got = a
            .process(move |t: Task| {
                // Work the handler started and cannot stop, holding the task.
                if let Some(tx) = left.lock().take() {
                    let _ = tx.send(t.clone());
                }
                async move {
                    loop {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    #[allow(unreachable_code)]
                    Outcome::done()
                }
            })
            .await
            .unwrap();
        assert_eq!(got, Some(Processed::Abandoned(id.clone())));
        let coll = Collection::new("tasks").unwrap();
        let record = s.get(&coll, &Key::new("hung").unwrap()).await.unwrap().record.unwrap();
        assert!(record.lease().is_some(), "the claim was not released: {record:?}");
        let held = record.into_data();
        assert_ne!(held.get_bool("complete").ok(), Some(true), "no outcome was written: {held}");
        // Marked under the claim it keeps.
        assert_marked(&held, 1, 1, 200);
        assert_eq!(q.stats("t").await.unwrap().timed_out, 1);
        // Nobody gets it before the lease's end.
        let early = b.process(|_t: Task| async { true }).await.unwrap();
        assert_eq!(early, None, "the abandoned claim still holds the task");
        // After it, the task runs again, as its next attempt.
        tokio::time::sleep(ttl + Duration::from_millis(500)).await;
        let again = b.process(|t: Task| async move { second_attempt(&t) });
        assert_eq!(again.await.unwrap(), Some(Processed::Completed(id)));
        assert_eq!(q.stats("t").await.unwrap().timed_out, 0);
        // The work left running writes under its old claim: fenced out.
        let stale = left_rx.await.unwrap();
        let e = stale.progress(50).await.unwrap_err();
        assert!(matches!(e, AgentError::ClaimLost { fence: 1, .. }), "{e}");
        assert!(doc_of(&s, "hung").await.get("progress").is_none());
    }

    /// A timeout of zero or above a year is a typed error, at enqueue and at
    /// build; nothing is enqueued.
    pub(crate) async fn timeouts_out_of_range_are_refused<H: Harness>(h: &H) {
        let s = h.store("ag_timeout_range").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        for d in [Duration::ZERO, Duration::from_nanos(10), mongoagent::MAX_TIMEOUT + Duration::from_secs(1)] {
            let e = q.enqueue(NewTask::new("t", doc! {}).timeout(d)).await.unwrap_err();
            assert!(matches!(e, AgentError::InvalidTask(_)), "{d:?}: {e}");
            let e = Agent::builder(s.clone(), "t", "tasks").timeout(d).build().unwrap_err();
            assert!(matches!(e, AgentError::Config(_)), "{d:?}: {e}");
        }
        let coll = Collection::new("tasks").unwrap();
        assert_eq!(s.count(&coll, &store_trait::Query::eq(doc! {})).await.unwrap(), 0);
    }

    /// A success that hands over to follow-ups (its own write, not the common
    /// outcome write) clears an earlier attempt's timeout too: the mark tells of
    /// the latest attempt only.
    pub(crate) async fn a_success_with_follow_ups_clears_the_timeout<H: Harness>(h: &H) {
        let s = h.store("ag_timeout_cleared").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(NewTask::new("t", doc! {}).id("split")).await.unwrap();
        let a = Agent::builder(s.clone(), "t", "tasks")
            .ttl(h.ttl())
            .timeout(Duration::from_millis(100))
            .backoff(Duration::from_millis(10), Duration::from_millis(10))
            .build()
            .unwrap();
        let run = |t: Task| async move {
            if t.attempt() == 1 {
                t.cancellation().cancelled().await;
            }
            Outcome::done().follow_up(NewTask::new("part", doc! {}))
        };
        assert_eq!(a.process(run).await.unwrap(), Some(Processed::Retried(id.clone())));
        assert_marked(&doc_of(&s, "split").await, 1, 1, 100);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(a.process(run).await.unwrap(), Some(Processed::Completed(id)));
        let d = doc_of(&s, "split").await;
        assert!(d.get_bool("complete").unwrap() && TimedOutAttempt::of(&d).is_none(), "{d}");
        assert_eq!(q.stats("t").await.unwrap().timed_out, 0);
    }
}
