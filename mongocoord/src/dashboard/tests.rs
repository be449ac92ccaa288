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
    super::pages::url(s)
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
    let w = Write::new(
        Condition::Always,
        Mutation::new().set("complete", true).set("error_encountered", true).set("ready", false),
    );
    assert!(store.write(q.collection(), &failed, &w).await.unwrap().is_applied());
    let every = mongoagent::Schedule::every("sweep", Duration::from_secs(60), NewTask::new("resize", doc! {})).unwrap();
    mongoagent::Schedules::new(store.clone(), "jobs").unwrap().upsert(&every).await.unwrap();
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

    // JSON carries the data as it is, as JSON (never sniffed as HTML).
    let api = send(&r, get("/api/tasks?queue=jobs")).await;
    assert_eq!(api.headers[header::CONTENT_TYPE], "application/json");
    assert_eq!(api.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    let api: serde_json::Value = serde_json::from_str(&api.body).unwrap();
    assert_eq!(api["tasks"].as_array().unwrap().len(), 2);
    let api: serde_json::Value = serde_json::from_str(&send(&r, get("/api/overview")).await.body).unwrap();
    assert_eq!(api["locks"]["rows"][0]["key"], "nightly-report");
    assert_eq!(api["queues"]["jobs"]["agents"]["resize"]["failed"], 1);

    let m = send(&r, get("/metrics")).await;
    assert!(m.headers[header::CONTENT_TYPE].to_str().unwrap().contains("openmetrics"));
    for line in [
        r#"mongocoord_queue_tasks{queue="jobs",agent="resize",state="ready"} 1"#,
        r#"mongocoord_queue_tasks{queue="jobs",agent="resize",state="failed"} 1"#,
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

/// The value of the hidden input `name` in a confirmation, as the browser
/// would post it (URL-encoded).
fn hidden(body: &str, name: &str) -> String {
    let start = format!(r#"name="{name}" value=""#);
    let at = body.find(&start).unwrap_or_else(|| panic!("no {name} in {body}")) + start.len();
    let raw = &body[at..at + body[at..].find('"').unwrap()];
    let text = raw.replace("&quot;", "\"").replace("&lt;", "<").replace("&gt;", ">").replace("&#39;", "'");
    enc(&text.replace("&amp;", "&"))
}

/// A confirmation acts on the tasks its preview listed, not on its filter
/// read again: tasks that came to match in between are left alone.
async fn a_confirmation_acts_on_the_previewed_tasks<S: Store + Clone + 'static>(store: S) {
    let (_guard, _, _) = seed(&store).await;
    let r = router(app(store.clone(), false));
    let q = Queue::new(store.clone(), "jobs").unwrap();
    let filter = format!("queue=jobs&filter={}", enc(r#"{"agent_name": "resize"}"#));
    let state = |id: &'static str| {
        let s = store.clone();
        async move { super::pages::state(&crate::data::task_detail(&s, "jobs", id).await.unwrap().unwrap().task) }
    };
    let fail = |id: &'static str| {
        let (s, q) = (store.clone(), q.clone());
        async move {
            let (key, _) = q.enqueue(NewTask::new("resize", doc! {}).id(id)).await.unwrap();
            let w = Write::new(
                Condition::Always,
                Mutation::new().set("complete", true).set("error_encountered", true).set("ready", false),
            );
            assert!(s.write(q.collection(), &key, &w).await.unwrap().is_applied());
        }
    };

    let preview = send(&r, post("/requeue/preview", &filter, Some(TOKEN))).await.body;
    assert!(preview.contains("Requeue 1 task(s)"), "{preview}");
    let ids = hidden(&preview, "ids");
    fail("late-failure").await;
    let done = send(&r, post("/requeue", &format!("queue=jobs&ids={ids}&id="), Some(TOKEN))).await;
    assert!(done.status.is_success() && done.body.contains("Requeued 1 task(s)"), "{}", done.body);
    assert_eq!(state("broken").await, "ready");
    assert_eq!(state("late-failure").await, "failed", "a task the preview did not list was requeued");

    let preview = send(&r, post("/cancel/preview", &filter, Some(TOKEN))).await.body;
    assert!(preview.contains("Cancel 2 task(s)"), "evil and broken: {preview}");
    let ids = hidden(&preview, "ids");
    q.enqueue(NewTask::new("resize", doc! {}).id("late-arrival")).await.unwrap();
    let done = send(&r, post("/cancel", &format!("queue=jobs&ids={ids}"), Some(TOKEN))).await;
    assert!(done.body.contains("Cancelled 2 task(s)"), "{}", done.body);
    assert_eq!(state("evil").await, "cancelled");
    assert_eq!(state("late-arrival").await, "ready", "a task the preview did not list was cancelled");

    // A confirmation without ids (a filter alone) is refused; ids that are
    // not what a preview writes are a 400.
    for form in [filter.as_str(), "queue=jobs&ids=%7B%7D", "queue=jobs&ids=%5B%5B1%5D%5D"] {
        let refused = send(&r, post("/cancel", form, Some(TOKEN))).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{form}: {}", refused.body);
    }
    assert_eq!(state("late-arrival").await, "ready");
    // An ObjectId id survives the round trip as an ObjectId, and a string
    // id of 24 hex digits as a string.
    let (oid, _) = q.enqueue(NewTask::new("resize", doc! {})).await.unwrap();
    let hexy = "0123456789abcdef01234567";
    q.enqueue(NewTask::new("resize", doc! {}).id(hexy)).await.unwrap();
    let (pinned, n) = super::confirm::pin_ids(&[oid.clone(), store_trait::Key::new(hexy).unwrap()]);
    assert_eq!(n, 2);
    assert_eq!(super::confirm::parse_ids(&pinned).unwrap(), [oid, store_trait::Key::new(hexy).unwrap()]);
}

/// Bound off loopback (or with `--auth-reads`), every read needs the token:
/// from the cookie, the header, or `Authorization: Bearer` (a Prometheus
/// scrape); the login page and its assets stay open. Read-only too.
#[tokio::test(start_paused = true)]
async fn reads_need_the_token_when_asked() {
    let store = MemoryStore::new();
    let _seeded = seed(&store).await;
    for read_only in [false, true] {
        let mut cfg = Config::new(vec!["jobs".into()], HOST.parse().unwrap());
        (cfg.read_only, cfg.auth_reads) = (read_only, true);
        let r = router(App::new(store.clone(), cfg, Some(Token::new(TOKEN).unwrap())).unwrap());
        for path in
            ["/", "/tasks?queue=jobs", "/tasks/broken?queue=jobs", "/api/overview", "/api/tasks", "/metrics", "/events"]
        {
            let open = send(&r, get(path)).await;
            assert_eq!(open.status, StatusCode::UNAUTHORIZED, "{path} without the token");
            assert!(!open.body.contains("nightly-report") && !open.body.contains("broken"), "{path}: {}", open.body);
            let mut wrong = get(path);
            wrong.headers_mut().insert(header::AUTHORIZATION, "Bearer 0123456789abcdef-tesT".parse().unwrap());
            assert_eq!(send(&r, wrong).await.status, StatusCode::UNAUTHORIZED, "{path} with a wrong token");
        }
        let mut cookie = get("/");
        cookie.headers_mut().insert(header::COOKIE, format!("mongocoord_token={TOKEN}").parse().unwrap());
        assert!(send(&r, cookie).await.body.contains("nightly-report"));
        let mut scrape = get("/metrics");
        scrape.headers_mut().insert(header::AUTHORIZATION, format!("Bearer {TOKEN}").parse().unwrap());
        assert!(send(&r, scrape).await.body.contains("mongocoord_queue_tasks"));
        let mut script = get("/api/tasks?queue=jobs");
        script.headers_mut().insert(super::auth::TOKEN_HEADER, TOKEN.parse().unwrap());
        assert_eq!(send(&r, script).await.status, StatusCode::OK);
        for open in ["/login", "/assets/app.css", "/assets/app.js"] {
            assert_eq!(send(&r, get(open)).await.status, StatusCode::OK, "{open}");
        }
        let login = send(&r, post("/login", &format!("token={}", enc(TOKEN)), None)).await;
        assert_eq!(login.status, StatusCode::SEE_OTHER);
        let action = send(&r, post("/cancel", "queue=jobs&id=evil", Some(TOKEN))).await.status;
        assert_eq!(action == StatusCode::NOT_FOUND, read_only, "read-only: {read_only}, {action}");
    }
    // Without the flag on loopback, reads stay open.
    let r = router(app(store.clone(), true));
    assert_eq!(send(&r, get("/")).await.status, StatusCode::OK);
}

/// Bound to every interface behind a proxy, the Host check still refuses
/// another name (DNS rebinding) and admits the public one.
#[tokio::test(start_paused = true)]
async fn every_interface_behind_a_proxy_checks_the_host() {
    let mut cfg = Config::new(vec!["jobs".into()], "0.0.0.0:8080".parse().unwrap());
    cfg.public = Some(super::auth::PublicUrl::parse("https://dash.example.com").unwrap());
    let r = router(App::new(MemoryStore::new(), cfg, Some(Token::new(TOKEN).unwrap())).unwrap());
    let to = |host: &str| Request::get("/login").header(header::HOST, host).body(Body::empty()).unwrap();
    assert_eq!(send(&r, to("evil.example:8080")).await.status, StatusCode::FORBIDDEN);
    assert_eq!(send(&r, to("dash.example.com")).await.status, StatusCode::OK);
}

/// A login lasts a while (the cookie's `Max-Age`); a logout ends it, and
/// only the dashboard's own pages may log out.
#[tokio::test(start_paused = true)]
async fn logins_expire_and_log_out() {
    let r = router(app(MemoryStore::new(), false));
    let ok = send(&r, post("/login", &format!("token={}", enc(TOKEN)), None)).await;
    let cookie = ok.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains(&format!("Max-Age={}", super::auth::COOKIE_MAX_AGE)), "{cookie}");
    let out = send(&r, post("/logout", "", Some(TOKEN))).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    let cleared = out.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(cleared.starts_with("mongocoord_token=;") && cleared.contains("Max-Age=0"), "{cleared}");
    let mut cross = post("/logout", "", Some(TOKEN));
    cross.headers_mut().insert(header::ORIGIN, "http://evil.example".parse().unwrap());
    assert_eq!(send(&r, cross).await.status, StatusCode::FORBIDDEN);
    assert!(send(&r, get("/")).await.body.contains(r#"action="/logout""#));
}

/// Every action is in the audit log under the CLI's default filter: who
/// (the client address, when served), what, and which ids.
#[tokio::test(start_paused = true)]
async fn actions_are_audited_by_default() {
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(crate::default_log_filter(false)))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let store = MemoryStore::new();
    let _seeded = seed(&store).await;
    let r = router(app(store.clone(), false));
    let mut cancel = post("/cancel", "queue=jobs&id=evil", Some(TOKEN));
    let peer = super::conns::Peer(std::net::SocketAddr::from(([192, 0, 2, 7], 50123)));
    cancel.extensions_mut().insert(axum::extract::ConnectInfo(peer));
    assert_eq!(send(&r, cancel).await.status, StatusCode::SEE_OTHER);
    let pause = send(&r, post("/agent", "queue=jobs&agent=resize&action=pause", Some(TOKEN))).await;
    assert_eq!(pause.status, StatusCode::SEE_OTHER);
    let log = String::from_utf8(buf.0.lock().clone()).unwrap();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("mongocoord::audit")).collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(
        lines[0].contains("192.0.2.7:50123") && lines[0].contains("Cancel") && lines[0].contains(r#""evil""#),
        "{log}"
    );
    assert!(lines[1].contains("pause agent") && lines[1].contains("resize"), "{log}");
}

/// A far page is refused rather than read: the store has no offset, and a
/// page reads the ids of every task before it. A page in range holds the
/// tasks after the previous one, in claim order.
#[tokio::test(start_paused = true)]
async fn pages_stop_short_of_huge_skips() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "jobs").unwrap();
    for n in 0..120 {
        q.enqueue(NewTask::new("resize", doc! {}).id(format!("t{n:03}"))).await.unwrap();
    }
    let r = router(app(store.clone(), true));
    let far = send(&r, get("/api/tasks?queue=jobs&page=80000000")).await;
    assert_eq!(far.status, StatusCode::BAD_REQUEST, "{}", far.body);
    assert!(far.body.contains("pages stop at"), "{}", far.body);
    let ids = |body: &str| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v["tasks"].as_array().unwrap().iter().map(|t| t["_id"].as_str().unwrap().to_owned()).collect()
    };
    let mut all = Vec::new();
    for page in 0..3 {
        let body = send(&r, get(&format!("/api/tasks?queue=jobs&page={page}"))).await.body;
        all.extend(ids(&body));
    }
    let expected: Vec<String> = (0..120).map(|n| format!("t{n:03}")).collect();
    assert_eq!(all, expected, "three pages, in claim order, each task once");
    assert_eq!(send(&r, get("/api/tasks?queue=jobs&page=199")).await.status, StatusCode::OK);
}

/// Open tabs are capped (a 503 past the cap, a slot again when one
/// closes), and a request the store does not answer ends in a 503 at the
/// timeout instead of holding its connection.
#[tokio::test(start_paused = true)]
async fn live_tabs_and_slow_requests_are_bounded() {
    let store = MemoryStore::new();
    let mut cfg = Config::new(vec!["jobs".into()], HOST.parse().unwrap());
    cfg.read_only = true;
    cfg.limits.live_clients = 2;
    let r = router(App::new(store.clone(), cfg, None).unwrap());
    let first = send_streaming(&r, get("/events")).await;
    let second = send_streaming(&r, get("/events")).await;
    assert_eq!((first.status(), second.status()), (StatusCode::OK, StatusCode::OK));
    assert_eq!(send_streaming(&r, get("/events")).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(first);
    assert_eq!(send_streaming(&r, get("/events")).await.status(), StatusCode::OK);

    store.faults().set_latency(Duration::from_secs(3600));
    let started = tokio::time::Instant::now();
    let slow = send(&r, get("/api/overview")).await;
    assert_eq!(slow.status, StatusCode::SERVICE_UNAVAILABLE, "{}", slow.body);
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
}

/// The response of a request whose body is a stream, not read.
async fn send_streaming(r: &Router, req: Request<Body>) -> axum::response::Response {
    r.clone().oneshot(req).await.unwrap()
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

/// Tabs that re-fetch together share one read of the store.
#[tokio::test(start_paused = true)]
async fn tabs_refreshing_together_share_one_read() {
    let store = MemoryStore::new();
    let _seeded = seed(&store).await;
    let r = router(app(store.clone(), true));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fragment =
        || Request::get("/").header(header::HOST, HOST).header("x-fragment", "1").body(Body::empty()).unwrap();
    let before = store.operation_count();
    assert!(send(&r, fragment()).await.body.contains("nightly-report"));
    let one = store.operation_count() - before;
    assert!(one > 0);
    let all = futures::future::join_all((0..8).map(|_| send(&r, fragment()))).await;
    assert!(all.iter().all(|p| p.body.contains("nightly-report")));
    send(&r, get("/metrics")).await;
    assert_eq!(store.operation_count() - before, one, "eight tabs and a scrape read once");
    tokio::time::sleep(Duration::from_secs(1)).await;
    send(&r, fragment()).await;
    assert_eq!(store.operation_count() - before, 2 * one, "a later change is read again");
}

/// Behind a TLS-terminating proxy (`--public-url`): the proxy forwards the
/// public Host and the browser sends the public origin; a login and an action
/// pass, the cookie is `Secure`, and any other origin is still refused.
#[tokio::test(start_paused = true)]
async fn behind_a_proxy_with_a_public_url() {
    let store = MemoryStore::new();
    let _seeded = seed(&store).await;
    let mut cfg = Config::new(vec!["jobs".into()], HOST.parse().unwrap());
    cfg.public = Some(super::auth::PublicUrl::parse("https://dash.example.com").unwrap());
    let r = router(App::new(store.clone(), cfg, Some(Token::new(TOKEN).unwrap())).unwrap());
    let proxied = |path: &str, origin: &str, form: String| {
        Request::post(path)
            .header(header::HOST, "dash.example.com")
            .header(header::ORIGIN, origin)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(form))
            .unwrap()
    };
    let login = send(&r, proxied("/login", "https://dash.example.com", format!("token={TOKEN}"))).await;
    assert_eq!(login.status, StatusCode::SEE_OTHER, "{}", login.body);
    let cookie = login.headers.get(header::SET_COOKIE).unwrap().to_str().unwrap();
    assert!(cookie.ends_with("; Secure"), "{cookie}");
    let page = Request::get("/").header(header::HOST, "dash.example.com").body(Body::empty()).unwrap();
    assert_eq!(send(&r, page).await.status, StatusCode::OK, "the public Host is allowed");
    let requeue = |origin: &str| {
        let mut req = proxied("/requeue", origin, "queue=jobs&id=broken".into());
        req.headers_mut().insert(header::COOKIE, format!("mongocoord_token={TOKEN}").parse().unwrap());
        req
    };
    assert_eq!(send(&r, requeue("https://evil.example")).await.status, StatusCode::FORBIDDEN);
    let done = send(&r, requeue("https://dash.example.com")).await;
    assert!(done.status.is_success() || done.status.is_redirection(), "{} {}", done.status, done.body);
    let q = Queue::new(store.clone(), "jobs").unwrap();
    let broken = q.tasks(doc! {"_id": "broken"}, None).await.unwrap();
    assert_eq!(broken[0].get_bool("ready"), Some(true), "the requeue from the public origin applied");
}

/// The task detail lists the events the dashboard saw of the task, in order,
/// escaped.
async fn task_events_seen<S: Store + Clone + 'static>(store: S) {
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
        super::a_confirmation_acts_on_the_previewed_tasks(MemoryStore::new()).await;
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
        let Some(s) = store_mongo::testing::test_store("dash_metrics_escape").await else { return };
        super::metrics_escape_and_cap_names_from_the_database(s).await;
    }

    #[tokio::test]
    async fn pages_json_and_metrics() {
        let Some(s) = store_mongo::testing::test_store("dash_pages").await else { return };
        super::pages_json_and_metrics(s).await;
    }

    #[tokio::test]
    async fn actions() {
        let Some(s) = store_mongo::testing::test_store("dash_actions").await else { return };
        super::actions(s).await;
    }

    #[tokio::test]
    async fn a_confirmation_acts_on_the_previewed_tasks() {
        let Some(s) = store_mongo::testing::test_store("dash_confirm_pins").await else { return };
        super::a_confirmation_acts_on_the_previewed_tasks(s).await;
    }

    #[tokio::test]
    async fn read_only() {
        let Some(s) = store_mongo::testing::test_store("dash_read_only").await else { return };
        super::read_only(s).await;
    }

    #[tokio::test]
    async fn task_events_seen() {
        let Some(s) = store_mongo::testing::test_store("dash_events_seen").await else { return };
        super::task_events_seen(s).await;
    }

    #[tokio::test]
    async fn tabs_share_one_watcher_per_collection() {
        let Some(s) = store_mongo::testing::test_store("dash_tabs").await else { return };
        super::tabs_see(s, false, || None).await;
    }
}
