//! `--timeout` on the command line: a task's command that runs past it has
//! its whole process tree stopped (SIGTERM, SIGKILL after `--grace`) and its
//! attempt failed with "timed out after …"; with `--max-attempts 1` the task
//! fails for good. A task's own `enqueue --timeout` wins over the agent's.
//! And `enqueue --wait`, which waits for the outcome.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{env, wait_until};

/// Whether a process with this pid is alive (and not a zombie).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

fn read_pid(file: &Path) -> String {
    wait_until("the command wrote its child's pid", Duration::from_secs(20), || {
        std::fs::read_to_string(file).is_ok_and(|s| !s.trim().is_empty())
    });
    std::fs::read_to_string(file).unwrap().trim().to_owned()
}

/// The agent's `--timeout` stops a command that ignores SIGTERM, and its
/// child, within the grace; the task fails for good saying it timed out.
#[test]
fn agent_timeout_stops_the_tree_and_fails_the_task() {
    let Some(e) = env("agent_timeout") else { return };
    e.json(&["enqueue", "--queue", "jobs", "--agent", "slow", "{}", "--id", "t1"]);
    let pid_file = e.dir.join("child.pid");
    // The command ignores SIGTERM; its child does not run in its foreground.
    let script = format!("trap '' TERM; sleep 600 & echo $! > {}; wait; sleep 600", pid_file.display());
    let started = Instant::now();
    let out = e.run(&[
        "agent",
        "slow",
        "--queue",
        "jobs",
        "--max-tasks",
        "1",
        "--max-attempts",
        "1",
        "--timeout",
        "1",
        "--grace",
        "1",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(30), "stopped within the timeout and the grace");
    let child = read_pid(&pid_file);
    assert!(!alive(&child), "the command's child {child} was stopped with it");
    let failed = e.json(&["tasks", "--queue", "jobs", "--failed"]);
    assert_eq!(failed[0]["last_error"], "timed out after 1 s", "{failed}");
    assert_eq!(
        (failed[0]["timed_out_attempt"].as_u64(), failed[0]["timed_out_after_ms"].as_u64()),
        (Some(1), Some(1000))
    );
    // The views tell a timeout from another failure.
    let table = e.run(&["tasks", "--queue", "jobs", "--failed"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("TIMED OUT") && table.contains("attempt 1 timed out after 1 s"), "{table}");
    let stats = e.json(&["tasks", "--queue", "jobs"]);
    assert_eq!((stats["slow"]["failed"].as_u64(), stats["slow"]["timed_out"].as_u64()), (Some(1), Some(1)), "{stats}");
    let table = e.run(&["tasks", "--queue", "jobs"]);
    let table = String::from_utf8_lossy(&table.stdout);
    let (header, row) = (table.lines().next().unwrap(), table.lines().nth(1).unwrap());
    let columns: Vec<&str> = header.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    let cells: Vec<&str> = row.split_whitespace().collect();
    let at = |c: &str| columns.iter().position(|h| *h == c).unwrap_or_else(|| panic!("no {c}: {table}"));
    assert_eq!((cells[at("FAILED")], cells[at("TIMED OUT")]), ("1", "1"), "{table}");
}

/// `watch --queue` prints a timed-out attempt (`timed_out`, with the attempt
/// and the timeout) before the failure it led to; a failure of another kind
/// is no timeout.
#[test]
fn watch_prints_a_timed_out_attempt_before_its_failure() {
    let Some(e) = env("watch_timeout") else { return };
    let mut watch = e
        .cmd(&["watch", "--queue", "jobs", "--json", "--count", "7", "--interval", "0.2"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut started = String::new();
    BufReader::new(watch.stderr.take().unwrap()).read_line(&mut started).unwrap();
    assert!(started.contains("watching the tasks of jobs"), "{started}");
    e.json(&["enqueue", "--queue", "jobs", "--agent", "w", r#"{"n": 1}"#, "--id", "late", "--timeout", "0.5"]);
    e.json(&["enqueue", "--queue", "jobs", "--agent", "w", r#"{"n": 2}"#, "--id", "bad", "--priority", "-1"]);
    let script = r#"read -r t; case "$t" in *'"n": 2'*|*'"n":2'*) exit 3;; esac; exec sleep 600"#;
    let out =
        e.run(&["agent", "w", "--queue", "jobs", "--max-tasks", "2", "--max-attempts", "1", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until("watch to print seven events", Duration::from_secs(60), || watch.try_wait().unwrap().is_some());
    let out = watch.wait_with_output().unwrap();
    assert!(out.status.success());
    let events: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let of = |id: &str| -> Vec<&Value> { events.iter().filter(|v| v["task"] == id).collect() };
    let names = |id: &str| -> Vec<&str> { of(id).iter().map(|v| v["event"].as_str().unwrap()).collect() };
    assert_eq!(names("late"), ["enqueued", "claimed", "timed_out", "failed"], "{events:?}");
    assert_eq!(names("bad"), ["enqueued", "claimed", "failed"], "{events:?}");
    let told = of("late")[2];
    assert_eq!((told["attempt"].as_u64(), told["timeout_ms"].as_u64()), (Some(1), Some(500)), "{told}");
    assert_eq!(of("late")[3]["error"], "timed out after 500 ms");
}

/// `enqueue --timeout` sets the task's own limit, which wins over the
/// agent's; a command within it completes as before.
#[test]
fn a_tasks_own_timeout_wins_over_the_agents() {
    let Some(e) = env("task_timeout") else { return };
    e.json(&["enqueue", "--queue", "jobs", "--agent", "w", "{}", "--id", "short", "--timeout", "0.5"]);
    e.json(&["enqueue", "--queue", "jobs", "--agent", "w", "{}", "--id", "fine"]);
    let out = e.run(&[
        "agent",
        "w",
        "--queue",
        "jobs",
        "--max-tasks",
        "2",
        "--max-attempts",
        "1",
        "--timeout",
        "60",
        "--",
        "sh",
        "-c",
        "read -r t; case \"$t\" in *short*) exec sleep 600;; esac",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let failed = e.json(&["tasks", "--queue", "jobs", "--failed"]);
    assert_eq!(failed.as_array().map(Vec::len), Some(1), "{failed}");
    assert_eq!(failed[0]["last_error"], "timed out after 500 ms", "{failed}");
    let stats = e.json(&["tasks", "--queue", "jobs"]);
    assert_eq!(stats["w"]["completed"], 1, "{stats}");
}

/// A timeout that is not a positive number of seconds up to a year is a
/// usage error (status 2), before anything is enqueued or run.
#[test]
fn bad_timeouts_are_usage_errors() {
    let Some(e) = env("timeout_usage") else { return };
    for bad in ["0", "-1", "nan", "1e300"] {
        let out = e.run(&["enqueue", "--queue", "jobs", "--agent", "w", "{}", "--timeout", bad]);
        assert_eq!(out.status.code(), Some(2), "enqueue --timeout {bad}");
        let out = e.run(&["agent", "w", "--queue", "jobs", "--timeout", bad, "--", "true"]);
        assert_eq!(out.status.code(), Some(2), "agent --timeout {bad}");
        let out = e.run(&["cron", "c", "* * * * *", "--timeout", bad, "--", "true"]);
        assert_eq!(out.status.code(), Some(2), "cron --timeout {bad}");
    }
    let stats = e.json(&["tasks", "--queue", "jobs"]);
    assert!(stats.get("w").is_none(), "nothing was enqueued: {stats}");
}

/// `enqueue --wait` prints the ended task as JSON, exit status 0 when it
/// completed (with the command's result), 1 when it failed for good, and 74
/// when `--wait-timeout` passes first.
#[test]
fn enqueue_waits_for_the_outcome() {
    let Some(e) = env("enqueue_wait") else { return };
    let agent = std::process::Command::new(env!("CARGO_BIN_EXE_mongocoord"))
        .args(["--uri", &e.uri, "--db", &e.db, "agent", "w", "--queue", "jobs", "--max-tasks", "2", "--max-attempts"])
        .args(["1", "--", "sh", "-c", r#"read -r t; case "$t" in *bad*) exit 3;; esac; echo '{"answer": 42}'"#])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = e.run(&["enqueue", "--queue", "jobs", "--agent", "w", r#"{"kind": "good"}"#, "--wait"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["completed"], true, "{v}");
    assert_eq!(v["result"]["answer"], 42, "{v}");
    let out = e.run(&["enqueue", "--queue", "jobs", "--agent", "w", r#"{"kind": "bad"}"#, "--wait"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["completed"], false, "{v}");
    assert!(v["error"].as_str().unwrap().contains("exit status 3"), "{v}");
    let mut agent = agent;
    let _ = agent.wait();
    // Nobody takes this one.
    let out = e.run(&["enqueue", "--queue", "jobs", "--agent", "nobody", "{}", "--wait", "--wait-timeout", "0.5"]);
    assert_eq!(out.status.code(), Some(74), "{}", String::from_utf8_lossy(&out.stderr));
    let out = e.run(&["enqueue", "--queue", "jobs", "--agent", "w", "{}", "--wait-timeout", "1"]);
    assert_eq!(out.status.code(), Some(2), "--wait-timeout without --wait is a usage error");
}

/// `--dedupe-until-ended`: a second enqueue with the key while the first
/// task has not ended is a duplicate naming it; once it ended, a new task.
#[test]
fn enqueue_dedupe_until_ended() {
    let Some(e) = env("dedupe_until_ended") else { return };
    if !super::has("enqueue_dedupe_until_ended", store_test::mongo::Feature::UniqueKeyRelease) {
        return;
    }
    let enqueue = |id: &str| {
        e.json(&[
            "enqueue",
            "--queue",
            "jobs",
            "--agent",
            "d",
            "{}",
            "--id",
            id,
            "--dedupe-key",
            "k",
            "--dedupe-until-ended",
        ])
    };
    assert_eq!(enqueue("a")["inserted"], true);
    let dup = enqueue("b");
    assert_eq!((dup["inserted"].clone(), dup["id"].clone()), (false.into(), "a".into()), "{dup}");
    let out = e.run(&["agent", "d", "--queue", "jobs", "--max-tasks", "1", "--", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(enqueue("c")["inserted"], true, "the key is free once a ended");
    let out = e.run(&["enqueue", "--queue", "jobs", "--agent", "d", "{}", "--dedupe-until-ended"]);
    assert_eq!(out.status.code(), Some(2), "a scope needs --dedupe-key");
}

/// `--debounce`: later enqueues with the key while the task waits say
/// "debounced" and its id; the task runs once, with the last data, a
/// debounce after the last enqueue; one enqueued after it ran is new.
#[test]
fn enqueue_debounce() {
    let Some(e) = env("enqueue_debounce") else { return };
    let enqueue = |data: &str| {
        e.run(&["enqueue", "--queue", "jobs", "--agent", "d", data, "--dedupe-key", "k", "--debounce", "1.5"])
    };
    let first = enqueue(r#"{"n": 1, "only_first": true}"#);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let id = String::from_utf8_lossy(&first.stdout).trim().strip_prefix("enqueued ").unwrap().to_owned();
    for n in 2..=3 {
        let out = enqueue(&format!(r#"{{"n": {n}}}"#));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("debounced: {id}"));
    }
    let seen = e.dir.join("seen.json");
    let script = format!("cat >> {}", seen.display());
    let out = e.run(&["agent", "d", "--queue", "jobs", "--max-tasks", "1", "--", "sh", "-c", &script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ran: Value = serde_json::from_str(&std::fs::read_to_string(&seen).unwrap()).unwrap();
    assert_eq!((ran["n"].clone(), ran.get("only_first")), (3.into(), None), "the last data, whole: {ran}");
    // Where the server keeps a key its task no longer holds (secantusd-rs),
    // the key cannot move to a new task: there is nothing more to check.
    if super::has("enqueue_debounce", store_test::mongo::Feature::UniqueKeyRelease) {
        let again =
            e.json(&["enqueue", "--queue", "jobs", "--agent", "d", "{}", "--dedupe-key", "k", "--debounce", "1"]);
        assert_eq!(again["inserted"], true, "the debounced task ran: a new one");
    }
    e.json(&["enqueue", "--queue", "jobs", "--agent", "d", "{}", "--dedupe-key", "forever"]);
    let out =
        e.run(&["enqueue", "--queue", "jobs", "--agent", "d", "{}", "--dedupe-key", "forever", "--debounce", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(2) && err.contains("nothing was enqueued"), "a key held for ever: {err}");
    for bad in [
        &["--debounce", "1"][..],
        &["--dedupe-key", "k", "--debounce", "1", "--id", "x"],
        &["--dedupe-key", "k", "--debounce", "1", "--dedupe-until-ended"],
        &["--dedupe-key", "k", "--debounce", "0"],
    ] {
        let out = e.run(&[&["enqueue", "--queue", "jobs", "--agent", "d", "{}"][..], bad].concat());
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// `enqueue --wait` whose task is deleted while it waits exits 2, and still
/// prints the task's id with `"ended": false` on stdout: the task was
/// enqueued, and a retry must not enqueue another.
#[test]
fn enqueue_wait_prints_the_id_when_the_wait_fails() {
    let Some(e) = env("enqueue_wait_fails") else { return };
    let waiting = std::process::Command::new(env!("CARGO_BIN_EXE_mongocoord"))
        .args(["--uri", &e.uri, "--db", &e.db, "enqueue", "--queue", "jobs", "--agent", "nobody", "{}"])
        .args(["--id", "doomed", "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the task is enqueued", Duration::from_secs(30), || {
        e.json(&["tasks", "--queue", "jobs", "--list"]).as_array().is_some_and(|a| !a.is_empty())
    });
    let out = e.run(&["delete", "--queue", "jobs", "--force", "doomed"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = waiting.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["id"].clone(), v["ended"].clone()), ("doomed".into(), false.into()), "{v}");
}
