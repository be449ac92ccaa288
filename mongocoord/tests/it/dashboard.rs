//! `mongocoord dashboard` in a real browser: headless Chromium from Debian's
//! packages (`chromium`, `chromium-driver`; `cargo xtask ci` installs them), driven
//! over WebDriver by `fantoccini`, against the binary and the real server.
//! Without the browser the test skips with a message, and fails under `CI`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};

use crate::{env, Env};

/// Kills a child process when dropped (a failed assertion must not leave a
/// dashboard or a driver running).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn chromedriver() -> Option<PathBuf> {
    ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"].iter().map(PathBuf::from).find(|p| p.exists())
}

fn port() -> u16 {
    store_test::free_port().unwrap()
}

fn dashboard(e: &Env, port: u16, extra: &[&str]) -> Killed {
    let bind = format!("127.0.0.1:{port}");
    let mut args = vec!["dashboard", "--bind", &bind, "--queue", "jobs"];
    args.extend(extra);
    let child = e.cmd(&args).stdin(Stdio::null()).spawn().unwrap();
    store_test::wait_for_port(port, Duration::from_secs(30)).unwrap();
    Killed(child)
}

/// Waits until the page's element `css` contains `text`; returns how long that
/// took. The page is never reloaded here: a marker set on `window` before must
/// still be there.
async fn wait_text(c: &Client, css: &str, text: &str, timeout: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let now = match c.find(Locator::Css(css)).await {
            Ok(el) => el.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if now.contains(text) {
            let marker = c.execute("return window.__noReload === true;", vec![]).await.unwrap();
            assert_eq!(marker, serde_json::Value::Bool(true), "the page was reloaded waiting for {text:?}");
            return start.elapsed();
        }
        assert!(start.elapsed() < timeout, "{text:?} never appeared in {css}: {now}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The element `css` once the page has it (a click's navigation may still be
/// under way; on two cores busy with the rest of the suite a navigation has
/// taken over 10 s, and a confirmation page whose source had the element
/// was not found within 30 s); the page's source if it never comes.
async fn find(c: &Client, css: &str) -> fantoccini::elements::Element {
    match c.wait().at_most(Duration::from_secs(90)).for_element(Locator::Css(css)).await {
        Ok(el) => el,
        Err(e) => panic!("{css}: {e}: {}", c.source().await.unwrap_or_default()),
    }
}

async fn mark(c: &Client) {
    c.execute("window.__noReload = true;", vec![]).await.unwrap();
}

#[test]
fn the_dashboard_in_a_browser() {
    let Some(driver) = chromedriver() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromedriver is missing; `cargo xtask ci` installs the Debian packages chromium and chromium-driver"
        );
        eprintln!("SKIPPED the_dashboard_in_a_browser: no chromedriver (apt-get install chromium chromium-driver)");
        return;
    };
    let Some(e) = env("dashboard_browser") else { return };
    let token_file = e.file("token");
    std::fs::write(&token_file, "browser-test-token-0123456789\n").unwrap();
    // The dashboard refuses a token file others may read.
    std::fs::set_permissions(&token_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // A failed task to requeue from the page.
    let id = e.json(&["enqueue", "--queue", "jobs", "--agent", "resize", r#"{"file": "a.png"}"#])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let failing =
        ["agent", "resize", "--queue", "jobs", "--max-tasks", "1", "--max-attempts", "1", "--", "sh", "-c", "exit 3"];
    assert!(e.run(&failing).status.success());
    // A task whose one attempt timed out.
    let late = e.json(&["enqueue", "--queue", "jobs", "--agent", "slow", "{}", "--timeout", "0.5"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let slow = ["agent", "slow", "--queue", "jobs", "--max-tasks", "1", "--max-attempts", "1", "--", "sleep", "600"];
    assert!(e.run(&slow).status.success());

    let (web, ro_port, drv_port) = (port(), port(), port());
    let _dash = dashboard(&e, web, &["--token-file", token_file.to_str().unwrap()]);
    let _ro = dashboard(&e, ro_port, &["--read-only"]);
    let _driver = Killed(
        Command::new(driver)
            .arg(format!("--port={drv_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    store_test::wait_for_port(drv_port, Duration::from_secs(30)).unwrap();

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"] }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let c = ClientBuilder::new(connector).capabilities(caps).connect(&format!("http://127.0.0.1:{drv_port}")).await.unwrap();
        let base = format!("http://127.0.0.1:{web}");
        // The session is closed whatever happens, or a failed assertion would
        // leave the browser running after the driver is killed.
        let run = std::panic::AssertUnwindSafe(async {
            // The overview; a lock taken now appears without a reload.
            c.goto(&format!("{base}/")).await.unwrap();
            assert_eq!(c.find(Locator::Css("h1")).await.unwrap().text().await.unwrap(), "Overview");
            mark(&c).await;
            let mut holder = Killed(e.spawn(&["lock", "browser-lock", "--ttl", "30", "--", "sleep", "60"]));
            let mut leader = Killed(e.spawn(&["elect", "scheduler", "--ttl", "15", "--", "sleep", "60"]));
            crate::wait_until("the lock", Duration::from_secs(20), || {
                e.json(&["locks"]).as_array().unwrap().iter().any(|l| l["key"] == "browser-lock" && l["held"] == true)
            });
            let took = wait_text(&c, "#live", "browser-lock", Duration::from_secs(10)).await;
            // The page never shows where or how the dashboard connects.
            let source = c.source().await.unwrap();
            assert!(!source.contains(&e.uri) && !source.contains(&e.db), "the connection leaked into the page");
            eprintln!("the lock appeared on the page {} ms after the store had it", took.as_millis());

            // Requeue the failed task from its page, after logging in.
            c.goto(&format!("{base}/login")).await.unwrap();
            c.find(Locator::Css("#token")).await.unwrap().send_keys("browser-test-token-0123456789").await.unwrap();
            c.find(Locator::Css("#login")).await.unwrap().click().await.unwrap();
            find(&c, "h1").await;
            c.goto(&format!("{base}/tasks/{id}?queue=jobs")).await.unwrap();
            assert_eq!(c.find(Locator::Css("#state")).await.unwrap().text().await.unwrap(), "failed");
            c.find(Locator::Css("button.requeue")).await.unwrap().click().await.unwrap();
            let confirm = find(&c, "#confirm").await;
            assert_eq!(confirm.text().await.unwrap(), "Requeue 1 task(s)");
            assert!(c.source().await.unwrap().contains(&id), "the confirmation names the task");
            confirm.click().await.unwrap();
            // The action redirects to the task's page.
            let start = Instant::now();
            while c.current_url().await.unwrap().path() != format!("/tasks/{id}") {
                assert!(start.elapsed() < Duration::from_secs(10), "no redirect to the task");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            mark(&c).await;
            assert_eq!(find(&c, "#state").await.text().await.unwrap(), "ready");
            // An agent runs it; the page shows it completed, without a reload.
            let ok = ["agent", "resize", "--queue", "jobs", "--max-tasks", "1", "--", "sh", "-c", "cat >/dev/null"];
            assert!(e.run(&ok).status.success());
            wait_text(&c, "#state", "completed", Duration::from_secs(10)).await;

            c.goto(&format!("{base}/")).await.unwrap();
            mark(&c).await;
            wait_text(&c, "#live", "browser-lock", Duration::from_secs(10)).await;
            wait_text(&c, "#elections", "scheduler", Duration::from_secs(20)).await;
            // The task that timed out: counted on the overview, marked on its page.
            let counts = c.find_all(Locator::Css("td.timed-out")).await.unwrap();
            let mut texts = Vec::new();
            for td in counts {
                texts.push(td.text().await.unwrap());
            }
            texts.sort();
            assert_eq!(texts, ["0", "1"], "resize's tasks did not time out, slow's did");
            let shot = c.screenshot().await.unwrap();
            std::fs::write(store_test::target_dir().join("dashboard.png"), &shot).unwrap();
            // The README's screenshot is refreshed on request only, so a test run
            // leaves the checkout clean.
            if std::env::var_os("UPDATE_SCREENSHOT").is_some() {
                let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs");
                std::fs::create_dir_all(&docs).unwrap();
                std::fs::write(docs.join("dashboard.png"), &shot).unwrap();
            }

            // Markup in a task's data is shown, never run.
            let evil = r#"{"html": "<script>window.__xss = 1</script>", "attr": "\"><img src=x onerror=\"window.__xss = 2\">"}"#;
            let evil = e.json(&["enqueue", "--queue", "jobs", "--agent", "resize", evil])["id"].as_str().unwrap().to_owned();
            c.goto(&format!("{base}/tasks/{evil}?queue=jobs")).await.unwrap();
            let shown = find(&c, "pre").await.text().await.unwrap();
            assert!(shown.contains("<script>window.__xss = 1</script>") && shown.contains("onerror"), "{shown}");
            let ran = c.execute("return window.__xss === undefined;", vec![]).await.unwrap();
            assert_eq!(ran, serde_json::Value::Bool(true), "a task's markup ran in the page");

            // Cancel it from its page: the confirmation names it, then it ends.
            c.find(Locator::Css("button.cancel")).await.unwrap().click().await.unwrap();
            let confirm = find(&c, "#confirm").await;
            assert_eq!(confirm.text().await.unwrap(), "Cancel 1 task(s)");
            confirm.click().await.unwrap();
            let start = Instant::now();
            while c.current_url().await.unwrap().path() != format!("/tasks/{evil}") {
                assert!(start.elapsed() < Duration::from_secs(10), "no redirect to the task");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(find(&c, "#state").await.text().await.unwrap(), "cancelled");

            c.goto(&format!("{base}/tasks/{late}?queue=jobs")).await.unwrap();
            assert_eq!(find(&c, "#state").await.text().await.unwrap(), "failed");
            assert_eq!(find(&c, "#timed-out").await.text().await.unwrap(), "attempt 1 timed out after 500 ms");
            c.goto(&format!("{base}/tasks?queue=jobs&agent=slow")).await.unwrap();
            let badge = find(&c, "span.badge.timed-out").await.text().await.unwrap();
            assert_eq!(badge, "attempt 1 timed out after 500 ms");

            // A grouped task no capped agent let through: held, its group and number shown.
            let grouped = e.json(&["enqueue", "--queue", "jobs", "--agent", "ordered", "--group", "customer-7", "{}"]);
            let grouped = grouped["id"].as_str().unwrap().to_owned();
            c.goto(&format!("{base}/tasks/{grouped}?queue=jobs")).await.unwrap();
            assert_eq!(find(&c, "#state").await.text().await.unwrap(), "held");
            assert_eq!(find(&c, "#group").await.text().await.unwrap(), "customer-7 (number 1, waiting for its turn)");

            // A read-only dashboard offers no action.
            c.goto(&format!("http://127.0.0.1:{ro_port}/tasks?queue=jobs")).await.unwrap();
            assert!(c.find(Locator::Css(".ro")).await.is_ok());
            let buttons = "form[method=post], button.requeue, button.cancel, button.agent";
            assert!(c.find_all(Locator::Css(buttons)).await.unwrap().is_empty());
            c.goto(&format!("http://127.0.0.1:{ro_port}/")).await.unwrap();
            assert!(c.find_all(Locator::Css("form[method=post]")).await.unwrap().is_empty());
            assert!(c.find_all(Locator::LinkText("log in")).await.unwrap().is_empty());
            for runner in [&mut holder, &mut leader] {
                crate::signal(&runner.0, "-TERM");
                let _ = runner.0.wait();
            }
        });
        let outcome = futures::FutureExt::catch_unwind(run).await;
        let _ = c.close().await;
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    });
}
