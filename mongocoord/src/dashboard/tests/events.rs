//! The task page's events: what the dashboard's own feed saw of a task.

use std::time::Duration;

use axum::http::StatusCode;
use bson::doc;
use mongoagent::{NewTask, Queue};
use store_trait::Store;

use super::{app, get, router, send, SCRIPT};

/// The task detail lists the events the dashboard saw of the task, in order,
/// escaped.
pub(super) async fn task_events_seen<S: Store + Clone + 'static>(store: S) {
    let r = router(app(store.clone(), true));
    // The queue's event feed starts in the background.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let q = Queue::new(store.clone(), "jobs").unwrap();
    q.enqueue(NewTask::new("resize", doc! {}).id("watched")).await.unwrap();
    let agent = mongoagent::Agent::builder(store.clone(), "resize", "jobs").build().unwrap();
    let run = |t: mongoagent::Task| async move {
        t.progress(doc! { "done": 1 }).await.unwrap();
        mongoagent::Outcome::failed_permanently(SCRIPT)
    };
    assert!(agent.process(run).await.unwrap().is_some());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let page = send(&r, get("/tasks/watched?queue=jobs")).await;
        assert_eq!(page.status, StatusCode::OK);
        if page.body.contains(r#"<tr class="failed">"#) {
            break page.body;
        }
        assert!(tokio::time::Instant::now() < deadline, "no failed event seen: {}", page.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let at = |e: &str| body.find(&format!(r#"<tr class="{e}">"#)).unwrap_or_else(|| panic!("no {e}: {body}"));
    assert!(at("enqueued") < at("claimed") && at("claimed") < at("failed"), "{body}");
    assert!(body.contains("attempt 1") && body.contains("&lt;script&gt;"), "{body}");
    assert!(!body.contains(SCRIPT), "markup in an error is escaped");
    // Another task's page has none of them.
    q.enqueue(NewTask::new("resize", doc! {}).id("other")).await.unwrap();
    let other = send(&r, get("/tasks/other?queue=jobs")).await.body;
    assert!(!other.contains(r#"<tr class="failed">"#), "{other}");

    // An attempt past its timeout: the event before the failure, and the mark.
    q.enqueue(NewTask::new("slow", doc! {}).id("late").max_attempts(1)).await.unwrap();
    let slow =
        mongoagent::Agent::builder(store.clone(), "slow", "jobs").timeout(Duration::from_millis(100)).build().unwrap();
    let run = |t: mongoagent::Task| async move {
        t.cancellation().cancelled().await;
        mongoagent::Outcome::done()
    };
    assert!(slow.process(run).await.unwrap().is_some());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let page = send(&r, get("/tasks/late?queue=jobs")).await;
        if page.body.contains(r#"<tr class="failed">"#) {
            break page.body;
        }
        assert!(tokio::time::Instant::now() < deadline, "no failed event seen: {}", page.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let at = |e: &str| body.find(&format!(r#"<tr class="{e}">"#)).unwrap_or_else(|| panic!("no {e}: {body}"));
    assert!(at("claimed") < at("timed_out") && at("timed_out") < at("failed"), "{body}");
    assert!(body.contains("attempt 1, timeout_ms 100"), "{body}");
    assert!(body.contains(r#"<dd id="timed-out" class="timed-out">attempt 1 timed out after 100 ms</dd>"#), "{body}");
}
