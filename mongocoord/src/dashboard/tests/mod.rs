//! Every route and action at the HTTP level (`oneshot` on the router),
//! against the memory store and the real server.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use bson::doc;
use futures::StreamExt;
use http_body_util::BodyExt;
use mongoagent::{NewTask, Queue};
use store_memory::MemoryStore;
use store_trait::{Condition, Mutation, Store, Write};
use tower::ServiceExt;

use super::{auth::Token, router, App, Config};

const TOKEN: &str = "0123456789abcdef-test";
const HOST: &str = "127.0.0.1:8080";

mod events;
mod security;

use events::task_events_seen;

fn app<S: Store + Clone + 'static>(store: S, read_only: bool) -> std::sync::Arc<App<S>> {
    let mut cfg = Config::new(vec!["jobs".into()], HOST.parse().unwrap());
    cfg.read_only = read_only;
    App::new(store, cfg, Some(Token::new(TOKEN).unwrap())).unwrap()
}

struct Res {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn send(r: &Router, req: Request<Body>) -> Res {
    let res = r.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = String::from_utf8_lossy(&body.collect().await.unwrap().to_bytes()).into_owned();
    Res { status: parts.status, headers: parts.headers, body }
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).header(header::HOST, HOST).body(Body::empty()).unwrap()
}

/// A form post as the dashboard's own page sends it, with `auth` as the
/// cookie (or none).
fn post(path: &str, form: &str, auth: Option<&str>) -> Request<Body> {
    let mut b = Request::post(path)
        .header(header::HOST, HOST)
        .header(header::ORIGIN, format!("http://{HOST}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(t) = auth {
        b = b.header(header::COOKIE, format!("mongocoord_token={t}"));
    }
    b.body(Body::from(form.to_owned())).unwrap()
}

fn enc(s: &str) -> String {
    super::escape::url(s)
}

const SCRIPT: &str = "<script>alert(1)</script>";
const IMG: &str = r#""><img src=x onerror=alert(2)>"#;

/// A lock held, a ready task whose data is markup, and a failed task.
async fn seed<S: Store + Clone>(store: &S) -> (mongolock::LockGuard<S>, String, String) {
    let lock = mongolock::Lock::builder(store.clone(), "nightly-report").build().unwrap();
    let guard = lock.try_acquire().await.unwrap().unwrap();
    let q = Queue::new(store.clone(), "jobs").unwrap();
    let (evil, _) = q.enqueue(NewTask::new("resize", doc! { "html": SCRIPT, "attr": IMG }).id("evil")).await.unwrap();
    let (failed, _) = q.enqueue(NewTask::new("resize", doc! { "n": 1 }).id("broken")).await.unwrap();
    // It failed for good when its one attempt timed out, as an agent records it.
    let w = Write::new(
        Condition::Always,
        Mutation::new()
            .set("complete", true)
            .set("error_encountered", true)
            .set("ready", false)
            .set("last_error", "timed out after 1.5 s")
            .set("timed_out_fence", 1_i64)
            .set("timed_out_attempt", 1_i64)
            .set("timed_out_after_ms", 1500_i64),
    );
    assert!(store.write(q.collection(), &failed, &w).await.unwrap().is_applied());
    let every =
        mongoagent::schedule::Schedule::every("sweep", Duration::from_secs(60), NewTask::new("resize", doc! {}))
            .unwrap();
    mongoagent::schedule::Schedules::new(store.clone(), "jobs").unwrap().upsert(&every).await.unwrap();
    (guard, evil.to_string(), failed.to_string())
}

async fn pages_json_and_metrics<S: Store + Clone + 'static>(store: S) {
    // As `dashboard::run` does: the library figures count from here on.
    crate::exposition::installed();
    let (_guard, evil, _) = seed(&store).await;
    let q = Queue::new(store.clone(), "jobs").unwrap();
    let progress = Write::new(
        Condition::Always,
        Mutation::new().set("progress", doc! { "done": 3, "of": 10 }).set("attempts", 2).set("max_attempts", 5),
    );
    assert!(store
        .write(q.collection(), &store_trait::Key::new("evil").unwrap(), &progress)
        .await
        .unwrap()
        .is_applied());
    let r = router(app(store.clone(), false));
    // The watchers open in the background.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let o = send(&r, get("/")).await;
    assert_eq!(o.status, StatusCode::OK);
    assert!(o.body.contains("nightly-report") && o.body.contains("resize"), "{}", o.body);
    assert!(o.body.contains(r#"action="/enqueue""#), "actions are offered");
    // Schedules say how many ended ticks they keep, and their group.
    assert!(o.body.contains("<th>ended kept</th>") && o.body.contains("<th>group</th>"), "{}", o.body);
    let csp = o.headers.get(header::CONTENT_SECURITY_POLICY).unwrap().to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    let fragment =
        send(&r, Request::get("/").header(header::HOST, HOST).header("x-fragment", "1").body(Body::empty()).unwrap())
            .await;
    assert!(fragment.body.contains("nightly-report") && !fragment.body.contains("<html"));

    // Markup in a task is shown as text, never as markup.
    for path in [format!("/tasks/{evil}?queue=jobs"), "/tasks?queue=jobs".into()] {
        let t = send(&r, get(&path)).await;
        assert_eq!(t.status, StatusCode::OK, "{path}");
        assert!(!t.body.contains("<script>alert") && !t.body.contains("<img src=x"), "{path}: {}", t.body);
    }
    let detail = send(&r, get(&format!("/tasks/{evil}?queue=jobs"))).await.body;
    assert!(detail.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{detail}");
    assert!(detail.contains("&quot;&gt;&lt;img src=x onerror=alert(2)&gt;"), "{detail}");
    assert!(detail.contains(r#"<dd id="progress">{&quot;done&quot;:3,&quot;of&quot;:10}</dd>"#), "{detail}");
    assert!(detail.contains(r#"<dd id="attempts">2 of at most 5</dd>"#), "{detail}");
    assert!(detail.contains(r#"action="/cancel/preview""#), "a ready task offers cancel: {detail}");

    let one = send(&r, get("/tasks?queue=jobs&id=broken")).await.body;
    assert!(
        one.contains(">broken<") && !one.contains(">evil<") && one.contains(r#"name="id" value="broken""#),
        "{one}"
    );
    let list = send(&r, get("/tasks?queue=jobs&state=failed")).await.body;
    assert!(list.contains("broken") && !list.contains(">evil<"), "{list}");
    assert!(list.contains("requeue…"), "a failed task offers requeue: {list}");
    // Its timeout shows as a badge in the list, and on its page.
    let badge = r#"<td>failed <span class="badge timed-out">attempt 1 timed out after 1.5 s</span></td>"#;
    assert!(list.contains(badge), "{list}");
    let broken = send(&r, get("/tasks/broken?queue=jobs")).await.body;
    let dd = r#"<dd id="timed-out" class="timed-out">attempt 1 timed out after 1.5 s</dd>"#;
    assert!(broken.contains(dd) && broken.contains(r#"<dd id="state" class="failed">failed</dd>"#), "{broken}");
    let all = send(&r, get("/tasks?queue=jobs")).await.body;
    assert_eq!(all.matches("badge timed-out").count(), 1, "only the task that timed out: {all}");
    assert!(!detail.contains(r#"id="timed-out""#), "{detail}");
    // The overview counts it beside the states.
    assert!(o.body.contains("<th>failed</th><th>timed out</th>"), "{}", o.body);
    assert!(o.body.contains(r#"<td class="n timed-out">1</td>"#), "{}", o.body);

    // JSON carries the data as it is, as JSON (never sniffed as HTML).
    let api = send(&r, get("/api/tasks?queue=jobs")).await;
    assert_eq!(api.headers[header::CONTENT_TYPE], "application/json");
    assert_eq!(api.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    let api: serde_json::Value = serde_json::from_str(&api.body).unwrap();
    assert_eq!(api["tasks"].as_array().unwrap().len(), 2);
    let api: serde_json::Value = serde_json::from_str(&send(&r, get("/api/overview")).await.body).unwrap();
    assert_eq!(api["locks"]["rows"][0]["key"], "nightly-report");
    assert_eq!(api["queues"]["jobs"]["agents"]["resize"]["failed"], 1);
    assert_eq!(api["queues"]["jobs"]["agents"]["resize"]["timed_out"], 1);

    let m = send(&r, get("/metrics")).await;
    assert!(m.headers[header::CONTENT_TYPE].to_str().unwrap().contains("openmetrics"));
    for line in [
        r#"mongocoord_queue_tasks{queue="jobs",agent="resize",state="ready"} 1"#,
        r#"mongocoord_queue_tasks{queue="jobs",agent="resize",state="failed"} 1"#,
        r#"mongocoord_queue_timed_out_tasks{queue="jobs",agent="resize"} 1"#,
        r#"mongocoord_lock_held{collection="mongolocker",key="nightly-report",holder="#,
        r#"mongocoord_lock_remaining_seconds{collection="mongolocker",key="nightly-report"}"#,
        "mongocoord_dashboard_watchers 5",
        "mongocoord_dashboard_resyncs_total 0",
        "mongocoord_dashboard_live_clients 0",
        // This process's library figures follow: the seed took a lock.
        r#"mongolock_acquisitions_total{collection="mongolocker"}"#,
    ] {
        assert!(m.body.contains(line), "{line} in\n{}", m.body);
    }
    assert!(m.body.ends_with("# EOF\n") && m.body.matches("# EOF").count() == 1, "{}", m.body);

    assert!(send(&r, get("/assets/app.js")).await.body.contains("EventSource"));
    assert!(send(&r, get("/assets/app.css")).await.status.is_success());
    assert_eq!(send(&r, get("/tasks/nothing?queue=jobs")).await.status, StatusCode::NOT_FOUND);
    assert_eq!(send(&r, get("/tasks?queue=elsewhere")).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(send(&r, get("/tasks?queue=jobs&page=x")).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(send(&r, get("/tasks?queue=jobs&state=odd")).await.status, StatusCode::BAD_REQUEST);
    // Another name for this server (DNS rebinding) is refused.
    let rebound = Request::get("/").header(header::HOST, "evil.example:8080").body(Body::empty()).unwrap();
    assert_eq!(send(&r, rebound).await.status, StatusCode::FORBIDDEN);
}

async fn actions<S: Store + Clone + 'static>(store: S) {
    let (_guard, _, failed) = seed(&store).await;
    let r = router(app(store.clone(), false));
    let task = "queue=jobs&agent=resize&priority=3&data=".to_owned() + &enc(r#"{"size": 10}"#);

    // Without the token, with a wrong one, or from another origin: refused.
    assert_eq!(send(&r, post("/enqueue", &task, None)).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(send(&r, post("/enqueue", &task, Some("0123456789abcdef-tesT"))).await.status, StatusCode::UNAUTHORIZED);
    let mut cross = post("/enqueue", &task, Some(TOKEN));
    cross.headers_mut().insert(header::ORIGIN, "http://evil.example".parse().unwrap());
    assert_eq!(send(&r, cross).await.status, StatusCode::FORBIDDEN);

    // Logging in sets a strict cookie.
    let bad = send(&r, post("/login", "token=nope", None)).await;
    assert_eq!(bad.status, StatusCode::UNAUTHORIZED);
    let ok = send(&r, post("/login", &format!("token={}", enc(TOKEN)), None)).await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER);
    let cookie = ok.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains("SameSite=Strict") && cookie.contains("HttpOnly"), "{cookie}");
    assert!(send(&r, get("/login")).await.body.contains(r#"name="token""#));

    // Enqueue: bad JSON and bad numbers are a clear 400.
    let bad = send(&r, post("/enqueue", "queue=jobs&agent=resize&data=%7Bnope", Some(TOKEN))).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("not valid JSON"), "{}", bad.body);
    let bad = send(&r, post("/enqueue", "queue=jobs&agent=resize&data=%5B1%5D", Some(TOKEN))).await;
    assert!(bad.status == StatusCode::BAD_REQUEST && bad.body.contains("must be a JSON object"));
    let bad = send(&r, post("/enqueue", "queue=jobs&agent=resize&data=%7B%7D&priority=high", Some(TOKEN))).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let bad = send(&r, post("/enqueue", "queue=other&agent=resize&data=%7B%7D", Some(TOKEN))).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "only the queues shown");
    let huge = format!("queue=jobs&agent=resize&data={}", "x".repeat(super::BODY_LIMIT + 1));
    assert_eq!(send(&r, post("/enqueue", &huge, Some(TOKEN))).await.status, StatusCode::PAYLOAD_TOO_LARGE);

    let done = send(&r, post("/enqueue", &task, Some(TOKEN))).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    let to = done.headers[header::LOCATION].to_str().unwrap().to_owned();
    assert!(send(&r, get(&to)).await.body.contains("&quot;size&quot;: 10"));
    // A script may send the token in a header instead of the cookie.
    let mut scripted = post("/enqueue", &task, None);
    scripted.headers_mut().insert(super::auth::TOKEN_HEADER, TOKEN.parse().unwrap());
    assert_eq!(send(&r, scripted).await.status, StatusCode::SEE_OTHER);

    // Requeue: the preview lists what it would touch and changes nothing.
    let preview = send(&r, post("/requeue/preview", &format!("queue=jobs&id={failed}"), Some(TOKEN))).await;
    assert_eq!(preview.status, StatusCode::OK);
    assert!(preview.body.contains("Requeue 1 task(s)") && preview.body.contains("broken"), "{}", preview.body);
    let state_of = |s: S, id: &'static str| async move {
        let d = crate::data::task_detail(&s, "jobs", id).await.unwrap().unwrap();
        super::pages::state(&d.task)
    };
    let state = |s: S| state_of(s, "broken");
    assert_eq!(state(store.clone()).await, "failed");
    let filter = format!("queue=jobs&filter={}", enc(r#"{"agent_name": "resize"}"#));
    let by_filter = send(&r, post("/requeue/preview", &filter, Some(TOKEN))).await;
    assert!(by_filter.body.contains("Requeue 1 task(s)"), "{}", by_filter.body);
    let bad = send(&r, post("/requeue/preview", "queue=jobs&filter=%7Bx", Some(TOKEN))).await;
    assert!(bad.status == StatusCode::BAD_REQUEST && bad.body.contains("not valid JSON"));
    assert_eq!(
        send(&r, post("/requeue", &format!("queue=jobs&id={failed}"), None)).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(state(store.clone()).await, "failed");

    let done = send(&r, post("/requeue", &format!("queue=jobs&id={failed}"), Some(TOKEN))).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    assert_eq!(state(store.clone()).await, "ready");
    let none = send(&r, post("/requeue/preview", &format!("queue=jobs&id={failed}"), Some(TOKEN))).await;
    assert!(none.body.contains("Nothing to requeue"));

    // Cancel: offered for a pending task; the preview lists what it would
    // touch and changes nothing; then the task ends as cancelled.
    let q = Queue::new(store.clone(), "jobs").unwrap();
    q.enqueue(NewTask::new("resize", doc! {}).id("doomed")).await.unwrap();
    let list = send(&r, get("/tasks?queue=jobs&state=ready")).await.body;
    assert!(list.contains(r#"action="/cancel/preview""#), "{list}");
    let preview = send(&r, post("/cancel/preview", "queue=jobs&id=doomed", Some(TOKEN))).await;
    assert_eq!(preview.status, StatusCode::OK);
    assert!(preview.body.contains("Cancel 1 task(s)") && preview.body.contains("doomed"), "{}", preview.body);
    let by_filter = send(&r, post("/cancel/preview", &filter, Some(TOKEN))).await.body;
    assert!(by_filter.contains("doomed") && !by_filter.contains("Nothing"), "{by_filter}");
    assert_eq!(state_of(store.clone(), "doomed").await, "ready");
    assert_eq!(send(&r, post("/cancel", "queue=jobs&id=doomed", None)).await.status, StatusCode::UNAUTHORIZED);
    let mut cross = post("/cancel", "queue=jobs&id=doomed", Some(TOKEN));
    cross.headers_mut().insert(header::ORIGIN, "http://evil.example".parse().unwrap());
    assert_eq!(send(&r, cross).await.status, StatusCode::FORBIDDEN);
    assert_eq!(state_of(store.clone(), "doomed").await, "ready");
    let done = send(&r, post("/cancel", "queue=jobs&id=doomed", Some(TOKEN))).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    assert_eq!(state_of(store.clone(), "doomed").await, "cancelled");
    let cancelled = send(&r, get("/tasks?queue=jobs&state=cancelled")).await.body;
    assert!(cancelled.contains(">doomed<") && !cancelled.contains(">broken<"), "{cancelled}");
    let failed = send(&r, get("/tasks?queue=jobs&state=failed")).await;
    assert_eq!(failed.status, StatusCode::OK);
    assert!(!failed.body.contains(">doomed<"), "a cancelled task is not failed: {}", failed.body);
    let none = send(&r, post("/cancel/preview", "queue=jobs&id=doomed", Some(TOKEN))).await;
    assert!(none.body.contains("Nothing to cancel"), "{}", none.body);
    let bad = send(&r, post("/cancel/preview", "queue=jobs&filter=%5B%5D", Some(TOKEN))).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    // An agent name's pause: the overview offers it, the preview shows its
    // tasks and changes nothing, then every agent of the name is paused.
    let overview = send(&r, get("/")).await.body;
    assert!(overview.contains(r#"action="/agent/preview""#) && overview.contains(r#"name="agent" value="resize""#));
    let preview = send(&r, post("/agent/preview", "queue=jobs&agent=resize&action=pause", Some(TOKEN))).await;
    assert_eq!(preview.status, StatusCode::OK);
    assert!(preview.body.contains("This will pause agent resize") && preview.body.contains("paused now"));
    assert!(!q.is_paused("resize").await.unwrap());
    let markup = format!("queue=jobs&action=pause&agent={}", enc(SCRIPT));
    let shown = send(&r, post("/agent/preview", &markup, Some(TOKEN))).await.body;
    assert!(!shown.contains("<script>alert") && shown.contains("No task of this agent"), "{shown}");
    let pause = "queue=jobs&agent=resize&action=pause";
    assert_eq!(send(&r, post("/agent", pause, None)).await.status, StatusCode::UNAUTHORIZED);
    assert!(!q.is_paused("resize").await.unwrap());
    assert_eq!(send(&r, post("/agent", pause, Some(TOKEN))).await.status, StatusCode::SEE_OTHER);
    assert!(q.is_paused("resize").await.unwrap());
    let overview = send(&r, get("/")).await.body;
    assert!(
        overview.contains(">paused<") && overview.contains(r#"value="resume"><button class="agent">"#),
        "{overview}"
    );
    for bad in [
        "queue=jobs&agent=resize&action=stop",
        "queue=jobs&agent=&action=pause",
        "queue=other&agent=resize&action=pause",
    ] {
        assert_eq!(send(&r, post("/agent", bad, Some(TOKEN))).await.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    assert!(q.is_paused("resize").await.unwrap());
    let resume = "queue=jobs&agent=resize&action=resume";
    assert_eq!(send(&r, post("/agent", resume, Some(TOKEN))).await.status, StatusCode::SEE_OTHER);
    assert!(!q.is_paused("resize").await.unwrap());

    // A schedule's pause: the preview shows it, then it is paused.
    assert!(send(&r, get("/")).await.body.contains(r#"name="action" value="pause""#));
    let paused = || async { crate::schedules::rows(&store, "jobs", None).await.unwrap()[0]["paused"].clone() };
    let preview = send(&r, post("/schedule/preview", "queue=jobs&name=sweep&action=pause", Some(TOKEN))).await;
    assert!(preview.status == StatusCode::OK && preview.body.contains("every 60s"), "{}", preview.body);
    assert_eq!(paused().await, false);
    assert_eq!(
        send(&r, post("/schedule", "queue=jobs&name=sweep&action=pause", None)).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&r, post("/schedule", "queue=jobs&name=sweep&action=pause", Some(TOKEN))).await.status,
        StatusCode::SEE_OTHER
    );
    assert_eq!(paused().await, true);
    assert!(send(&r, get("/")).await.body.contains(r#"name="action" value="resume""#));
    let bad = send(&r, post("/schedule", "queue=jobs&name=sweep&action=drop", Some(TOKEN))).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let none = send(&r, post("/schedule/preview", "queue=jobs&name=nope&action=pause", Some(TOKEN))).await;
    assert_eq!(none.status, StatusCode::NOT_FOUND);
    assert_eq!(
        send(&r, post("/schedule", "queue=jobs&name=sweep&action=resume", Some(TOKEN))).await.status,
        StatusCode::SEE_OTHER
    );
    assert_eq!(paused().await, false);
}

async fn read_only<S: Store + Clone + 'static>(store: S) {
    let (_guard, _, failed) = seed(&store).await;
    let r = router(app(store.clone(), true));
    for path in ["/", "/tasks?queue=jobs", &format!("/tasks/{failed}?queue=jobs")] {
        let p = send(&r, get(path)).await;
        assert_eq!(p.status, StatusCode::OK);
        assert!(!p.body.contains(r#"method="post""#) && !p.body.contains("/login"), "{path}: {}", p.body);
        assert!(p.body.contains("read-only"));
    }
    for path in [
        "/requeue",
        "/requeue/preview",
        "/cancel",
        "/cancel/preview",
        "/agent",
        "/agent/preview",
        "/enqueue",
        "/schedule",
        "/schedule/preview",
        "/login",
    ] {
        let s = send(&r, post(path, &format!("queue=jobs&id={failed}"), Some(TOKEN))).await.status;
        assert!(s == StatusCode::NOT_FOUND || s == StatusCode::METHOD_NOT_ALLOWED, "{path}: {s}");
    }
    assert_eq!(send(&r, get("/login")).await.status, StatusCode::NOT_FOUND);
}

/// Opens six `/events` streams and waits (on whatever clock the runtime has)
/// until each announces the change of a lock. `ops` reads the store's
/// operation count where the backend has one.
async fn tabs_see<S: Store + Clone + 'static>(store: S, paused: bool, ops: impl Fn() -> Option<u64>) {
    let a = app(store.clone(), true);
    let r = router(a.clone());
    // Let the pumps subscribe (simulated time when paused).
    let settle = Duration::from_millis(if paused { 100 } else { 500 });
    tokio::time::sleep(settle).await;
    let before = ops();
    let mut tabs = Vec::new();
    for _ in 0..6 {
        let res = r.clone().oneshot(get("/events")).await.unwrap();
        assert_eq!(res.headers()[header::CONTENT_TYPE], "text/event-stream");
        tabs.push(res.into_body().into_data_stream());
    }
    tokio::time::sleep(settle).await;
    // Six tabs, one watcher per watched collection (locks, elections, status,
    // the queue and its schedules), not one per tab; tabs cost the store
    // nothing (not one operation, a subscription included).
    assert_eq!(a.live.counters.watchers.load(Ordering::Relaxed), 5);
    assert_eq!(a.live.counters.clients.load(Ordering::Relaxed), 6);
    assert_eq!(ops(), before, "opening tabs touched the store");
    let lock = mongolock::Lock::builder(store.clone(), "seen-live").build().unwrap();
    let _guard = lock.try_acquire().await.unwrap().unwrap();
    for tab in &mut tabs {
        let mut seen = String::new();
        while !seen.contains("data: locks") {
            let chunk = tokio::time::timeout(Duration::from_secs(20), tab.next()).await.unwrap().unwrap().unwrap();
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
    drop(tabs);
    assert_eq!(a.live.counters.clients.load(Ordering::Relaxed), 0);
    // Shutting down ends the open streams, which would otherwise hold the
    // graceful shutdown open.
    let mut tab = r.clone().oneshot(get("/events")).await.unwrap().into_body().into_data_stream();
    a.shutdown.cancel();
    assert!(tokio::time::timeout(Duration::from_secs(20), tab.next()).await.unwrap().is_none());
}

/// What `x"} 1\nforged_series_total 1\n#` would make of an exposition that
/// wrote it unescaped.
const FORGED: &str = "x\"} 1\nforged_series_total 1\n#";

/// Names from the database (an agent, a lock key and holder, an election)
/// that hold quotes, backslashes and line feeds reach `/metrics` escaped: the
/// scrape parses, and forges no series. Past the cap, label sets are left
/// out and counted.
async fn metrics_escape_and_cap_names_from_the_database<S: Store + Clone + 'static>(store: S) {
    crate::exposition::installed();
    let q = Queue::new(store.clone(), "jobs").unwrap();
    q.enqueue(NewTask::new(FORGED, doc! {}).id("forged")).await.unwrap();
    // A cancel is counted by the library (`mongoagent_tasks_total`) under
    // the task's agent name: the bridged figures are escaped too.
    q.enqueue(NewTask::new(FORGED, doc! {}).id("forged-cancelled")).await.unwrap();
    q.cancel(doc! { "_id": "forged-cancelled" }).await.unwrap();
    let key = "k\"ey\\\nforged_series_total 2\n";
    let host = mongolock::Identity::new(FORGED, 1);
    let lock = mongolock::Lock::builder(store.clone(), key).identity(host).build().unwrap();
    let _guard = lock.try_acquire().await.unwrap().unwrap();
    let elector = mongoelector::Elector::builder(store.clone(), "e\"\nforged_series_total 3").build().unwrap();
    elector.poll().await.unwrap();
    let r = router(app(store.clone(), true));

    let text = send(&r, get("/metrics")).await.body;
    let samples = crate::exposition::tests::check_exposition(&text).unwrap_or_else(|e| panic!("{e} in\n{text}"));
    assert!(!text.lines().any(|l| l.starts_with("forged_series_total")), "{text}");
    let has = |name: &str, label: &str, value: &str| {
        samples.iter().any(|(n, ls)| n == name && ls.iter().any(|(k, v)| k == label && v == value))
    };
    assert!(has("mongocoord_queue_tasks", "agent", FORGED), "{text}");
    assert!(has("mongoagent_tasks_total", "agent", FORGED), "{text}");
    let holder = samples.iter().flat_map(|(_, ls)| ls).any(|(k, v)| k == "holder" && v.starts_with(FORGED));
    assert!(has("mongocoord_lock_held", "key", key) && holder, "{text}");
    assert!(has("mongocoord_election_has_leader", "election", "e\"\nforged_series_total 3"), "{text}");
    assert!(!text.contains("mongocoord_metrics_series_truncated{"), "nothing left out yet: {text}");

    // 150 agent names make 1,050 label sets of `queue_tasks` (seven states).
    for n in 0..150 {
        q.enqueue(NewTask::new(format!("agent-{n}"), doc! {})).await.unwrap();
    }
    // The overview is read at most every 250 ms.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let text = send(&r, get("/metrics")).await.body;
    let samples = crate::exposition::tests::check_exposition(&text).unwrap_or_else(|e| panic!("{e} in\n{text}"));
    let max = crate::exposition::MAX_SERIES;
    assert_eq!(samples.iter().filter(|(n, _)| n == "mongocoord_queue_tasks").count(), max);
    let left_out =
        format!(r#"mongocoord_metrics_series_truncated{{metric="mongocoord_queue_tasks"}} {}"#, 151 * 7 - max);
    assert!(text.contains(&left_out), "{left_out} in\n{text}");
}

mod memory {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn metrics_escape_and_cap_names_from_the_database() {
        super::metrics_escape_and_cap_names_from_the_database(MemoryStore::new()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn pages_json_and_metrics() {
        super::pages_json_and_metrics(MemoryStore::new()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn actions() {
        super::actions(MemoryStore::new()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn read_only() {
        super::read_only(MemoryStore::new()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_confirmation_acts_on_the_previewed_tasks() {
        super::security::a_confirmation_acts_on_the_previewed_tasks(MemoryStore::new()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn task_events_seen() {
        super::task_events_seen(MemoryStore::new()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn task_events_seen_without_change_streams() {
        super::task_events_seen(MemoryStore::builder().change_streams(false).build()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn tabs_share_one_watcher_per_collection() {
        let s = MemoryStore::new();
        super::tabs_see(s.clone(), true, || Some(s.operation_count())).await;
    }

    #[tokio::test(start_paused = true)]
    async fn without_change_streams_sections_are_polled() {
        let s = MemoryStore::builder().change_streams(false).build();
        super::tabs_see(s.clone(), true, || Some(s.operation_count())).await;
    }
}

mod mongo {
    #[tokio::test]
    async fn metrics_escape_and_cap_names_from_the_database() {
        let Some(s) = store_test::mongo::test_store("dash_metrics_escape").await else { return };
        super::metrics_escape_and_cap_names_from_the_database(s).await;
    }

    #[tokio::test]
    async fn pages_json_and_metrics() {
        let Some(s) = store_test::mongo::test_store("dash_pages").await else { return };
        super::pages_json_and_metrics(s).await;
    }

    #[tokio::test]
    async fn actions() {
        let Some(s) = store_test::mongo::test_store("dash_actions").await else { return };
        super::actions(s).await;
    }

    #[tokio::test]
    async fn a_confirmation_acts_on_the_previewed_tasks() {
        let Some(s) = store_test::mongo::test_store("dash_confirm_pins").await else { return };
        super::security::a_confirmation_acts_on_the_previewed_tasks(s).await;
    }

    #[tokio::test]
    async fn read_only() {
        let Some(s) = store_test::mongo::test_store("dash_read_only").await else { return };
        super::read_only(s).await;
    }

    #[tokio::test]
    async fn task_events_seen() {
        let Some(s) = store_test::mongo::test_store("dash_events_seen").await else { return };
        super::task_events_seen(s).await;
    }

    #[tokio::test]
    async fn tabs_share_one_watcher_per_collection() {
        let Some(s) = store_test::mongo::test_store("dash_tabs").await else { return };
        super::tabs_see(s, false, || None).await;
    }
}
