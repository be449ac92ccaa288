//! `Queue::wait_for`, every backend: it returns once the task has ended
//! (completed, failed for good, cancelled), with its result, woken by the
//! change; a task that is not there, or is deleted while waited for, is
//! `AgentError::NotFound`.

use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, AgentError, NewTask, Outcome, Queue, Task};
use store_test::Harness;
use store_trait::{Collection, Key, Store};

/// The suite (`wait_suite`): each `pub(crate) async fn` over a `Harness` here
/// is one test on every backend, registered by being written.
#[store_test::suite(wait_suite, crate::wait::cases)]
pub(crate) mod cases {
    use super::*;

    /// A waiter started before the task runs returns when its agent completes
    /// it, with the merged result; a second waiter after the end returns at once.
    pub(crate) async fn waiting_returns_the_result_once_the_task_ends<H: Harness>(h: &H) {
        let s = h.store("ag_wait_result").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(NewTask::new("w", doc! { "n": 20_i64 })).await.unwrap();
        let waiter = tokio::spawn({
            let (q, id) = (q.clone(), id.clone());
            async move { q.wait_for(&id).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiter.is_finished(), "it waits while the task is ready");
        let a = Agent::builder(s.clone(), "w", "tasks").ttl(h.ttl()).build().unwrap();
        a.process(|t: Task| async move { Outcome::done_with(doc! { "sum": t.data().get_i64("n").unwrap() + 1 }) })
            .await
            .unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(20), waiter).await.unwrap().unwrap().unwrap();
        assert!(ended.completed() && !ended.cancelled() && ended.error().is_none(), "{ended:?}");
        assert_eq!(ended.id(), &id);
        assert_eq!(ended.data().get_i64("sum").unwrap(), 21);
        let again = tokio::time::timeout(Duration::from_secs(5), q.wait_for(&id)).await.unwrap().unwrap();
        assert_eq!(again, ended);
    }

    /// A task failed for good, and one cancelled, end the wait with what happened.
    pub(crate) async fn waiting_reports_failures_and_cancels<H: Harness>(h: &H) {
        let s = h.store("ag_wait_failed").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (bad, _) = q.enqueue(NewTask::new("w", doc! {}).max_attempts(1)).await.unwrap();
        let (gone, _) = q.enqueue(NewTask::new("later", doc! {})).await.unwrap();
        let a = Agent::builder(s.clone(), "w", "tasks").ttl(h.ttl()).build().unwrap();
        a.process(|_t: Task| async { Outcome::failed("no luck") }).await.unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(20), q.wait_for(&bad)).await.unwrap().unwrap();
        assert!(!ended.completed(), "{ended:?}");
        assert_eq!(ended.error(), Some("no luck"));
        let waiter = tokio::spawn({
            let (q, id) = (q.clone(), gone.clone());
            async move { q.wait_for(&id).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        q.cancel_ids(std::slice::from_ref(&gone)).await.unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(20), waiter).await.unwrap().unwrap().unwrap();
        assert!(ended.cancelled() && !ended.completed(), "{ended:?}");
    }

    /// No such task, or one deleted while waited for: `NotFound`, not a hang.
    pub(crate) async fn waiting_for_a_missing_or_deleted_task_is_not_found<H: Harness>(h: &H) {
        let s = h.store("ag_wait_missing").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let e = q.wait_for(&Key::new("nope").unwrap()).await.unwrap_err();
        assert!(matches!(&e, AgentError::NotFound { task } if task == "nope"), "{e}");
        let (id, _) = q.enqueue(NewTask::new("idle", doc! {})).await.unwrap();
        let waiter = tokio::spawn({
            let (q, id) = (q.clone(), id.clone());
            async move { q.wait_for(&id).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.delete(&Collection::new("tasks").unwrap(), &id, &store_trait::Condition::Always).await.unwrap();
        let e = tokio::time::timeout(Duration::from_secs(60), waiter).await.unwrap().unwrap().unwrap_err();
        assert!(matches!(e, AgentError::NotFound { .. }), "{e}");
    }
}
