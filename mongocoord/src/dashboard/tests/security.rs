//! The dashboard's defences at the HTTP level: what a confirmation acts on,
//! who may read, logins, the audit log, and the bounds on pages, tabs,
//! requests and shared reads.

use super::*;

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
pub(super) async fn a_confirmation_acts_on_the_previewed_tasks<S: Store + Clone + 'static>(store: S) {
    let (_guard, _, _) = seed(&store).await;
    let r = router(app(store.clone(), false));
    let q = Queue::new(store.clone(), "jobs").unwrap();
    let filter = format!("queue=jobs&filter={}", enc(r#"{"agent_name": "resize"}"#));
    let state = |id: &'static str| {
        let s = store.clone();
        async move { super::super::pages::state(&crate::data::task_detail(&s, "jobs", id).await.unwrap().unwrap().task) }
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
    let (pinned, n) = super::super::confirm::pin_ids(&[oid.clone(), store_trait::Key::new(hexy).unwrap()]);
    assert_eq!(n, 2);
    assert_eq!(super::super::confirm::parse_ids(&pinned).unwrap(), [oid, store_trait::Key::new(hexy).unwrap()]);
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
        script.headers_mut().insert(super::super::auth::TOKEN_HEADER, TOKEN.parse().unwrap());
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
    cfg.public = Some(super::super::auth::PublicUrl::parse("https://dash.example.com").unwrap());
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
    assert!(cookie.contains(&format!("Max-Age={}", super::super::auth::COOKIE_MAX_AGE)), "{cookie}");
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
    let peer = super::super::conns::Peer(std::net::SocketAddr::from(([192, 0, 2, 7], 50123)));
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
    cfg.public = Some(super::super::auth::PublicUrl::parse("https://dash.example.com").unwrap());
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
