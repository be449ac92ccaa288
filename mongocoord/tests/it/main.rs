//! The `mongocoord` binary as real processes against a real server: mutual
//! exclusion of concurrent `lock` runs, `elect` takeover after SIGTERM and
//! SIGKILL, an `agent` completing and failing tasks through a shell command, the
//! operator views' JSON, the demo, and the dashboard in a real browser.
#![allow(clippy::unwrap_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod cron;
mod dashboard;
mod events;
#[cfg(feature = "otel")]
mod otel;
mod reserved;
#[cfg(feature = "otel")]
mod review_otel;
#[cfg(feature = "otel")]
mod review_otel2;
mod review_retain;
mod schedules;
mod standby;
mod supervise;
mod timeouts;

const BIN: &str = env!("CARGO_BIN_EXE_mongocoord");

struct Env {
    uri: String,
    db: String,
    dir: PathBuf,
}

fn env(test: &str) -> Option<Env> {
    let uri = match store_test::mongo::server_uri() {
        Ok(u) => u,
        Err(why) => {
            store_test::mongo::skip(test, &why);
            return None;
        }
    };
    // The test's database starts empty, as every Mongo test's: a second run
    // on one server (MONGODB_URI) must not find the first run's tasks.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(store_test::mongo::test_store(&format!("cli_{test}")))?;
    let dir = store_test::target_dir().join("cli-tests").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Some(Env { uri, db: store_test::mongo::db_name(&format!("cli_{test}")), dir })
}

/// Whether the test server has `feature`; when not, `test` is reported (see
/// `store_test::mongo::server_has`) and should return.
fn has(test: &str, feature: store_test::mongo::Feature) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(store_test::mongo::server_has(test, feature))
}

impl Env {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(["--uri", &self.uri, "--db", &self.db]).args(args).env_remove("MONGODB_URI").env("RUST_LOG", "warn");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).stdin(Stdio::null()).output().unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.run(&[args, &["--json"]].concat());
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
    }

    fn spawn(&self, args: &[&str]) -> Child {
        self.cmd(args).stdin(Stdio::null()).spawn().unwrap()
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes `docs` into `coll` directly, as another program would.
    fn insert_raw(&self, coll: &str, docs: Vec<bson::Document>) {
        self.on_db(async |db| {
            db.collection::<bson::Document>(coll).insert_many(docs).await.unwrap();
        });
    }

    /// Every document of `coll`, read directly.
    fn raw(&self, coll: &str) -> Vec<bson::Document> {
        self.on_db(async |db| {
            let mut c = db.collection::<bson::Document>(coll).find(bson::doc! {}).await.unwrap();
            let mut out = Vec::new();
            while c.advance().await.unwrap() {
                out.push(c.deserialize_current().unwrap());
            }
            out
        })
    }

    fn on_db<T>(&self, f: impl AsyncFnOnce(store_mongo::mongodb::Database) -> T) -> T {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let db = store_mongo::mongodb::Client::with_uri_str(&self.uri).await.unwrap().database(&self.db);
            f(db).await
        })
    }
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p).unwrap_or_default().lines().map(str::to_owned).collect()
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(child: &Child, sig: &str) {
    assert!(Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap().success());
}

#[test]
fn lock_runs_exclude_each_other_and_pass_increasing_fences() {
    let Some(e) = env("lock_exclusion") else { return };
    let log = e.file("log");
    let script =
        format!("echo start $MONGOCOORD_FENCE >> {0}; sleep 0.3; echo end $MONGOCOORD_FENCE >> {0}", log.display());
    let children: Vec<Child> =
        (0..4).map(|_| e.spawn(&["lock", "shared-resource", "--ttl", "5", "--", "sh", "-c", &script])).collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let l = lines(&log);
    assert_eq!(l.len(), 8, "{l:?}");
    let mut last = 0;
    for pair in l.chunks(2) {
        let (s, t) = (pair[0].split_once(' ').unwrap(), pair[1].split_once(' ').unwrap());
        assert_eq!((s.0, t.0), ("start", "end"), "runs never interleave: {l:?}");
        assert_eq!(s.1, t.1);
        let fence: u64 = s.1.parse().unwrap();
        assert!(fence > last, "fences increase: {l:?}");
        last = fence;
    }
    // The command's exit status is passed through; a timeout is its own status.
    assert_eq!(e.run(&["lock", "k2", "--", "sh", "-c", "exit 7"]).status.code(), Some(7));
    let mut holder = e.spawn(&["lock", "k3", "--ttl", "10", "--", "sleep", "30"]);
    wait_until("the holder", Duration::from_secs(20), || {
        e.json(&["locks"]).as_array().unwrap().iter().any(|l| l["key"] == "k3" && l["held"] == true)
    });
    let out = e.run(&["lock", "k3", "--timeout", "0.5", "--", "true"]);
    assert_eq!(out.status.code(), Some(74), "{}", String::from_utf8_lossy(&out.stderr));
    let locks = e.json(&["locks"]);
    let k3 = locks.as_array().unwrap().iter().find(|l| l["key"] == "k3").unwrap();
    assert!(k3["expires_in_ms"].as_u64().unwrap() > 0 && k3["pid"].as_u64().is_some());
    signal(&holder, "-TERM");
    let _ = holder.wait();
}

#[test]
fn elect_hands_over_on_sigterm_and_after_sigkill() {
    let Some(e) = env("elect_takeover") else { return };
    let log = e.file("terms");
    let pids = e.file("pids");
    let script = format!("echo $MONGOCOORD_FENCE >> {}; echo $$ >> {}; exec sleep 300", log.display(), pids.display());
    let args = ["elect", "scheduler", "--ttl", "2", "--", "sh", "-c", script.as_str()];
    let first = e.cmd(&args).stdin(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    wait_until("the first leader", Duration::from_secs(20), || lines(&log).len() == 1);
    let mut second = e.spawn(&args);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(lines(&log).len(), 1, "one leader at a time");
    signal(&first, "-TERM");
    let t = Instant::now();
    wait_until("takeover after SIGTERM", Duration::from_secs(20), || lines(&log).len() == 2);
    let sigterm_handover = t.elapsed();
    let first = first.wait_with_output().unwrap();
    assert!(first.status.success());
    // A clean stop is no fault: nothing at `warn` (the default) or above, such
    // as the change stream failing as the client shuts down under it.
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(!stderr.contains(" WARN ") && !stderr.contains(" ERROR "), "{stderr}");
    assert!(stderr.contains("elected leader"), "{stderr}");
    let mut third = e.spawn(&args);
    std::thread::sleep(Duration::from_millis(300));
    signal(&second, "-KILL");
    let _ = second.wait();
    let t = Instant::now();
    wait_until("takeover after SIGKILL", Duration::from_secs(20), || lines(&log).len() == 3);
    let sigkill_failover = t.elapsed();
    let terms: Vec<u64> = lines(&log).iter().map(|l| l.parse().unwrap()).collect();
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
    // The killed runner's command died with it: it does not go on acting as leader.
    let second_child = lines(&pids)[1].clone();
    wait_until("the orphan to die", Duration::from_secs(10), || !Path::new(&format!("/proc/{second_child}")).exists());
    // A document of another schema in the status collection is reported, not fatal.
    e.json(&["enqueue", "--queue", mongoelector::DEFAULT_STATUS_COLLECTION, "--agent", "intruder", "{}"]);
    let leaders = e.json(&["leaders"]);
    let s = leaders["elections"].as_array().unwrap().iter().find(|l| l["election"] == "scheduler").unwrap();
    assert_eq!(s["fence"].as_u64(), Some(terms[2]));
    let nodes = s["nodes"].as_array().unwrap();
    assert!(!nodes.is_empty() && nodes.iter().all(|n| !n["version"].as_str().unwrap().is_empty()), "{nodes:?}");
    let skipped = leaders["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0]["error"].as_str().unwrap().contains("election"), "{skipped:?}");
    signal(&third, "-TERM");
    assert!(third.wait().unwrap().success());
    eprintln!(
        "elect: handover after SIGTERM {sigterm_handover:?}, failover after SIGKILL {sigkill_failover:?} (ttl 2 s)"
    );
}

#[test]
fn agent_runs_a_shell_command_per_task() {
    let Some(e) = env("agent_shell") else { return };
    let ok = e.json(&["enqueue", "--queue", "jobs", "--agent", "convert", r#"{"file": "a.png"}"#]);
    assert_eq!(ok["inserted"], true);
    e.json(&["enqueue", "--queue", "jobs", "--agent", "convert", r#"{"file": "fail.png"}"#, "--priority", "-1"]);
    let dup = e.json(&["enqueue", "--queue", "jobs", "--agent", "other", "{}", "--dedupe-key", "once"]);
    let dup2 = e.json(&["enqueue", "--queue", "jobs", "--agent", "other", "{}", "--dedupe-key", "once"]);
    assert_eq!((dup["inserted"].as_bool(), dup2["inserted"].as_bool()), (Some(true), Some(false)));
    let script = r#"t=$(cat); case "$t" in *fail.png*) echo "cannot convert" >&2; exit 3;; *) echo '{"width": 640, "follow_ups": [{"agent_name": "upload", "size": 1}]}';; esac"#;
    let out = e.run(&[
        "agent",
        "convert",
        "--queue",
        "jobs",
        "--max-tasks",
        "2",
        "--max-attempts",
        "1",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stats = e.json(&["tasks", "--queue", "jobs"]);
    assert_eq!(stats["convert"]["completed"], 1);
    assert_eq!(stats["convert"]["failed"], 1);
    assert_eq!(stats["upload"]["ready"], 1, "the follow-up was enqueued");
    let done = e.json(&["tasks", "--queue", "jobs", "--list", "--filter", r#"{"file": "a.png"}"#]);
    assert_eq!(done[0]["width"], 640);
    assert_eq!(done[0]["complete"], true);
    let failed = e.json(&["tasks", "--queue", "jobs", "--list", "--filter", r#"{"file": "fail.png"}"#]);
    assert!(failed[0]["last_error"].as_str().unwrap().contains("cannot convert"));
    let dry = e.json(&["requeue", "--queue", "jobs", "--dry-run"]);
    assert_eq!(dry["ids"].as_array().unwrap().len(), 1);
    let re = e.json(&["requeue", "--queue", "jobs", "--yes"]);
    assert_eq!(re["ids"].as_array().unwrap().len(), 1);
    assert_eq!(e.json(&["tasks", "--queue", "jobs", "--agent", "convert"])["convert"]["ready"], 1);
    // Bad input: a clear error and a usage status.
    let bad = e.run(&["tasks", "--queue", "jobs", "--list", "--filter", "not json"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("the filter is not valid JSON"));
    let bad = e.run(&["enqueue", "--queue", "jobs", "--agent", "convert", "not json"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("the task is not valid JSON"),
        "names the task, not a filter"
    );
    // Numbers too large for a duration: a usage error, not a panic (exit 101).
    for (flag, value) in [("--delay", "1e20"), ("--delay", "NaN"), ("--delay", "-1")] {
        let bad = e.run(&["enqueue", "--queue", "jobs", "--agent", "convert", "{}", flag, value]);
        assert_eq!(bad.status.code(), Some(2), "{flag} {value}: {}", String::from_utf8_lossy(&bad.stderr));
    }
    let bad = e.run(&["watch", "--interval", "1e300", "--count", "1"]);
    assert_eq!(bad.status.code(), Some(2), "{}", String::from_utf8_lossy(&bad.stderr));
}

#[test]
fn agent_limits_from_the_command_line() {
    let Some(e) = env("agent_limits") else { return };
    for i in 0..3 {
        e.json(&["enqueue", "--queue", "jobs", "--agent", "lim", &format!(r#"{{"i": {i}}}"#)]);
    }
    let limited = ["agent", "lim", "--queue", "jobs", "--global-concurrency", "1", "--rate", "2/1", "--prefetch", "0"];
    let out = e.run(&[&limited[..], &["--max-tasks", "3", "--concurrency", "3", "--", "true"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(e.json(&["tasks", "--queue", "jobs"])["lim"]["completed"], 3);
    // Strictly parsed: a clear error and a usage status, before connecting.
    for (flag, value) in [
        ("--rate", "100"),
        ("--rate", "1e3/60"),
        ("--rate", "0/60"),
        ("--rate", "5/0"),
        ("--global-concurrency", "0"),
        ("--prefetch", "1001"),
        ("--prefetch", "lots"),
    ] {
        let bad = e.run(&["agent", "lim", "--queue", "jobs", flag, value, "--", "true"]);
        let err = String::from_utf8_lossy(&bad.stderr);
        assert_eq!(bad.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag), "{flag} {value}: names the option: {err}");
    }
}

/// `enqueue --group` and `agent --group-concurrency 1`: a group's commands
/// run one at a time, in enqueue order, beside another group's; bad groups
/// and caps are usage errors.
#[test]
fn agent_runs_a_group_one_at_a_time_in_order() {
    let Some(e) = env("agent_groups") else { return };
    for i in 0..6 {
        let g = if i % 3 == 2 { "d" } else { "c" };
        e.json(&[
            "enqueue",
            "--queue",
            "jobs",
            "--agent",
            "ord",
            "--group",
            g,
            &format!(r#"{{"g": "{g}", "i": {i}}}"#),
        ]);
    }
    let log = e.file("runs.log");
    let script = format!("read -r t; echo \"start $t\" >> {0}; sleep 0.2; echo \"end $t\" >> {0}", log.display());
    let args =
        ["agent", "ord", "--queue", "jobs", "--concurrency", "4", "--group-concurrency", "1", "--max-tasks", "6"];
    let out = e.run(&[&args[..], &["--", "sh", "-c", &script]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs: Vec<(bool, String, i64)> = lines(&log)
        .iter()
        .map(|l| {
            let (what, task) = l.split_once(' ').unwrap();
            let t: Value = serde_json::from_str(task).unwrap();
            (what == "start", t["g"].as_str().unwrap().to_owned(), t["i"].as_i64().unwrap())
        })
        .collect();
    for g in ["c", "d"] {
        let mine: Vec<&(bool, String, i64)> = runs.iter().filter(|r| r.1 == g).collect();
        let order: Vec<i64> = mine.iter().filter(|r| r.0).map(|r| r.2).collect();
        let expected: Vec<i64> = (0..6).filter(|i| (if i % 3 == 2 { "d" } else { "c" }) == g).collect();
        assert_eq!(order, expected, "group {g} in enqueue order: {runs:?}");
        // One at a time: starts and ends alternate.
        assert!(mine.iter().enumerate().all(|(k, r)| r.0 == (k % 2 == 0)), "group {g} one at a time: {runs:?}");
    }
    assert_eq!(e.json(&["tasks", "--queue", "jobs"])["ord"]["completed"], 6);
    for bad in [
        &["agent", "ord", "--queue", "jobs", "--group-concurrency", "0", "--", "true"][..],
        &["enqueue", "--queue", "jobs", "--agent", "ord", "--group", "", "{}"][..],
    ] {
        let out = e.run(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// A command's follow-up with a "group_key" joins that group when its
/// parent's outcome is written: behind the group's task enqueued before,
/// ahead of the one enqueued after. `enqueue --group` with `--debounce`
/// is accepted.
#[test]
fn a_commands_follow_up_joins_its_group() {
    let Some(e) = env("agent_group_follow_ups") else { return };
    e.json(&["enqueue", "--queue", "jobs", "--agent", "ord", "--group", "c", r#"{"i": 0}"#]);
    e.json(&["enqueue", "--queue", "jobs", "--agent", "parent", "{}"]);
    let follow_up = r#"{"follow_ups": [{"agent_name": "ord", "group_key": "c", "i": 1}]}"#;
    let out = e.run(&["agent", "parent", "--queue", "jobs", "--max-tasks", "1", "--", "echo", follow_up]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    e.json(&[
        "enqueue",
        "--queue",
        "jobs",
        "--agent",
        "ord",
        "--group",
        "c",
        "--dedupe-key",
        "k",
        "--debounce",
        "0.05",
        r#"{"i": 2}"#,
    ]);
    let log = e.file("runs.log");
    let script = format!("read -r t; echo \"$t\" >> {}", log.display());
    let args = ["agent", "ord", "--queue", "jobs", "--group-concurrency", "1", "--max-tasks", "3"];
    let out = e.run(&[&args[..], &["--", "sh", "-c", &script]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let order: Vec<i64> =
        lines(&log).iter().map(|l| serde_json::from_str::<Value>(l).unwrap()["i"].as_i64().unwrap()).collect();
    assert_eq!(order, [0, 1, 2], "in the group's order");
}

#[test]
fn cancel_and_delete_by_id_and_filter() {
    let Some(e) = env("cancel_delete") else { return };
    for id in ["a", "b", "c"] {
        e.json(&["enqueue", "--queue", "jobs", "--agent", "w", r#"{"batch": 1}"#, "--id", id]);
    }
    let dry = e.json(&["cancel", "--queue", "jobs", "--filter", r#"{"batch": 1}"#, "--dry-run"]);
    assert_eq!(dry["ids"].as_array().unwrap().len(), 3);
    assert_eq!(e.json(&["cancel", "--queue", "jobs", "a", "b"])["ids"], serde_json::json!(["a", "b"]));
    let listed = e.json(&["tasks", "--queue", "jobs", "--list", "--filter", r#"{"_id": "a"}"#]);
    assert_eq!((listed[0]["cancelled"].as_bool(), listed[0]["complete"].as_bool()), (Some(true), Some(true)));
    assert_eq!(e.json(&["cancel", "--queue", "jobs", "a"])["ids"], serde_json::json!([]), "already ended");
    // Delete: the ended ones only, unless forced.
    let gone = e.json(&["delete", "--queue", "jobs", "--filter", r#"{"batch": 1}"#]);
    assert_eq!(gone["ids"].as_array().unwrap().len(), 2);
    assert_eq!(e.json(&["delete", "--queue", "jobs", "c"])["ids"], serde_json::json!([]), "c has not ended");
    assert_eq!(e.json(&["delete", "--queue", "jobs", "c", "--force"])["ids"], serde_json::json!(["c"]));
    let bad = e.run(&["cancel", "--queue", "jobs"]);
    assert_eq!(bad.status.code(), Some(2), "ids or --filter are required");
}

#[test]
fn pause_and_resume_an_agent_name() {
    let Some(e) = env("pause_resume") else { return };
    e.json(&["enqueue", "--queue", "jobs", "--agent", "w", "{}"]);
    assert_eq!(e.json(&["pause", "--queue", "jobs", "--agent", "w"])["paused"], true);
    assert_eq!(e.json(&["tasks", "--queue", "jobs"])["w"]["paused"], true);
    let out = e.run(&["tasks", "--queue", "jobs"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("PAUSED"));
    // A paused agent claims nothing: `agent --max-tasks 1` would run the task.
    let mut agent = e.spawn(&["agent", "w", "--queue", "jobs", "--max-tasks", "1", "--", "true"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(e.json(&["tasks", "--queue", "jobs"])["w"]["ready"], 1, "nothing claimed while paused");
    assert_eq!(e.json(&["resume", "--queue", "jobs", "--agent", "w"])["paused"], false);
    wait_until("the resumed agent ran the task", Duration::from_secs(30), || {
        e.json(&["tasks", "--queue", "jobs"])["w"]["completed"] == 1
    });
    assert!(agent.wait().unwrap().success());
    assert_eq!(e.json(&["tasks", "--queue", "jobs"])["w"]["paused"], false);
}

/// `GET http://addr/metrics`, the body.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(c, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn agent_serves_its_figures_with_metrics_bind() {
    use std::io::BufRead;
    let Some(e) = env("metrics_bind") else { return };
    e.json(&["enqueue", "--queue", "jobs", "--agent", "w", "{}"]);
    e.json(&["enqueue", "--queue", "jobs", "--agent", "w", r#"{"fail": true}"#]);
    let script = r#"case "$(cat)" in *fail*) exit 3;; esac"#;
    let args = ["agent", "w", "--queue", "jobs", "--max-attempts", "1", "--metrics-bind", "127.0.0.1:0"];
    let mut agent = e.cmd(&[&args[..], &["--", "sh", "-c", script]].concat()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = std::io::BufReader::new(agent.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("mongocoord: metrics on http://").and_then(|l| l.strip_suffix("/metrics"));
    let addr = addr.unwrap_or_else(|| panic!("the address served, not {line:?}")).to_owned();
    let completed = r#"mongoagent_tasks_total{queue="jobs",agent="w",outcome="completed"} 1"#;
    let failed = r#"mongoagent_tasks_total{queue="jobs",agent="w",outcome="failed_permanently"} 1"#;
    wait_until("the agent's outcomes on its /metrics", Duration::from_secs(30), || {
        let text = scrape(&addr);
        text.contains(completed) && text.contains(failed)
    });
    let text = scrape(&addr);
    assert!(text.contains("application/openmetrics-text"), "{text}");
    assert!(text.contains(r#"mongoagent_claim_seconds_count{queue="jobs",agent="w"}"#), "{text}");
    assert!(text.contains(r#"mongolock_acquisitions_total{collection="jobs"} 2"#), "{text}");
    signal(&agent, "-TERM");
    assert!(agent.wait().unwrap().success());
}

#[test]
fn unreachable_server_is_a_clear_error_without_the_password() {
    let port = store_test::free_port().unwrap();
    let out = Command::new(BIN)
        .args(["--uri", &format!("mongodb://admin:s3cret@127.0.0.1:{port}/?serverSelectionTimeoutMS=300"), "locks"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot use") && !err.contains("s3cret"), "{err}");
    // A password with an '@' in it, which the driver refuses (not URL
    // encoded): only the scheme and host are shown; no other text is
    // rewritten.
    let out = Command::new(BIN)
        .args(["--uri", &format!("mongodb://u:p@ss@127.0.0.1:{port}/?serverSelectionTimeoutMS=300"), "locks"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("mongodb://***@127.0.0.1:{port}/***"))
            && !err.contains("ss@")
            && !err.contains("***rovided"),
        "{err}"
    );
}

/// Secrets in a URI are printed neither on stdout nor on stderr: a secret
/// option (`proxyPassword`), a percent-encoded password, and a URI the driver
/// cannot parse (a `?` in the password), whose message quotes a piece of it.
/// Bad input and an unreachable server both exit with status 2.
#[test]
fn uri_secrets_are_never_printed() {
    let port = store_test::free_port().unwrap();
    for (uri, secrets) in [
        (
            format!("mongodb://u:p%3Fss@127.0.0.1:{port}/?proxyPassword=hunter2&serverSelectionTimeoutMS=200"),
            &["hunter2", "p%3Fss", "p?ss"][..],
        ),
        (
            format!(
                "mongodb://u:p%3Fss@127.0.0.1:{port}/?proxyHost=127.0.0.1&proxyUsername=u&proxyPassword=hunter2&serverSelectionTimeoutMS=200"
            ),
            &["hunter2", "p%3Fss", "p?ss"][..],
        ),
        ("mongodb://u:pa?ss@h:1/".to_owned(), &["pa?ss", "ss@", "?ss"][..]),
    ] {
        let out = Command::new(BIN).args(["locks", "--uri", &uri]).env_remove("MONGODB_URI").output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(2), "{uri}: {stderr}");
        assert!(stderr.contains("mongocoord: ") && stderr.contains("mongodb://"), "{uri}: {stderr}");
        for s in secrets {
            assert!(!stdout.contains(s) && !stderr.contains(s), "{uri}: {s} in\n{stdout}\n{stderr}");
        }
    }
}

#[test]
fn demo_checks_its_invariants_in_memory() {
    let out = Command::new(BIN)
        .args(["demo", "--memory", "--seconds", "6", "--tasks", "80", "--json"])
        .env_remove("MONGODB_URI")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["tasks"], 80 + 80 + 8, "fetches, parses and batches");
    assert!(v["checks"].as_array().unwrap().iter().all(|c| c["pass"] == true));
}

#[test]
fn demo_checks_its_invariants_on_mongodb() {
    let Some(e) = env("demo") else { return };
    let out = e.run(&["demo", "--seconds", "4", "--tasks", "25", "--json"]);
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["backend"].as_str(), &v["ok"]), (Some("mongodb"), &Value::Bool(true)), "{v}");
    assert_eq!(v["tasks"], 25 + 25 + 3, "fetches, parses and batches (the last one of five)");
    assert!(v["checks"].as_array().unwrap().iter().all(|c| c["pass"] == true));
}

/// Documents another program wrote, that the store cannot read (a UUID `_id`, a
/// string `fence`): the views list everything else and report them, on stderr
/// and in `--json` (entries marked `"skipped": true`; under `$skipped` in the
/// per-agent counts), instead of failing.
#[test]
fn views_report_documents_they_cannot_read() {
    let Some(e) = env("views_skipped") else { return };
    let uuid = bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![2; 16] };
    e.insert_raw("mongolocker", vec![bson::doc! {"_id": uuid.clone(), "lease_owner": "x"}, bson::doc! {"_id": "fine"}]);
    e.insert_raw(
        "jobs",
        vec![
            bson::doc! {"_id": uuid.clone(), "agent_name": "convert", "ready": true},
            bson::doc! {"_id": "bad-fence", "agent_name": "convert", "ready": true, "fence": "1"},
            bson::doc! {"_id": "ok", "agent_name": "convert", "ready": true},
        ],
    );
    let skipped = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .filter(|x| x["skipped"] == true)
            .map(|x| x["key"].as_str().unwrap().to_owned())
            .collect()
    };
    let locks = e.json(&["locks"]);
    assert_eq!(locks.as_array().unwrap().len(), 2, "{locks}");
    let bad = skipped(&locks);
    assert!(bad.len() == 1 && bad[0].contains("$binary"), "{locks}");
    let out = e.run(&["locks"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("fine"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("skipped 1 lock document"));
    let list = e.json(&["tasks", "--queue", "jobs", "--list"]);
    assert_eq!(list.as_array().unwrap().len(), 3, "{list}");
    let mut bad = skipped(&list);
    bad.sort();
    assert_eq!(bad.len(), 2, "{list}");
    assert_eq!(bad[0], "bad-fence");
    let stats = e.json(&["tasks", "--queue", "jobs"]);
    assert_eq!(stats["convert"]["ready"], 3, "{stats}");
    assert_eq!(stats["$skipped"].as_array().map(Vec::len), Some(2), "{stats}");
}
