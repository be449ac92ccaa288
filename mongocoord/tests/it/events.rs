//! `mongocoord watch --queue` prints the queue's task events live, and
//! `mongocoord tasks --failed` lists the tasks that failed for good.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::{env, wait_until};

#[test]
fn watch_prints_task_events_as_ndjson() {
    let Some(e) = env("watch_events") else { return };
    let mut watch = e
        .cmd(&["watch", "--queue", "jobs", "--agent", "w", "--json", "--count", "5", "--interval", "0.2"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It says so once it is subscribed: nothing after that is missed.
    let mut started = String::new();
    BufReader::new(watch.stderr.take().unwrap()).read_line(&mut started).unwrap();
    assert!(started.contains("watching the tasks of jobs"), "{started}");
    e.json(&["enqueue", "--queue", "jobs", "--agent", "other", "{}", "--id", "x"]);
    e.json(&["enqueue", "--queue", "jobs", "--agent", "w", "{}", "--id", "a"]);
    let out = e.run(&["agent", "w", "--queue", "jobs", "--max-tasks", "1", "--", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    e.json(&["enqueue", "--queue", "jobs", "--agent", "w", "{}", "--id", "c"]);
    e.json(&["cancel", "--queue", "jobs", "c"]);
    wait_until("watch to print five events", Duration::from_secs(60), || watch.try_wait().unwrap().is_some());
    let out = watch.wait_with_output().unwrap();
    assert!(out.status.success());
    let events: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let seen: Vec<(&str, &str)> =
        events.iter().map(|v| (v["task"].as_str().unwrap(), v["event"].as_str().unwrap())).collect();
    assert_eq!(
        seen,
        [("a", "enqueued"), ("a", "claimed"), ("a", "completed"), ("c", "enqueued"), ("c", "cancelled")],
        "the other agent's task is not shown: {events:?}"
    );
    assert_eq!((events[1]["attempt"].as_u64(), events[1]["agent"].as_str()), (Some(1), Some("w")));
}

#[test]
fn tasks_failed_lists_failed_tasks_with_their_last_error() {
    let Some(e) = env("tasks_failed") else { return };
    e.json(&["enqueue", "--queue", "jobs", "--agent", "w", "{}", "--id", "f"]);
    e.json(&["enqueue", "--queue", "jobs", "--agent", "w", "{}", "--id", "c", "--priority", "-1"]);
    e.json(&["cancel", "--queue", "jobs", "c"]);
    let script = "echo 'disk full' >&2; exit 1";
    let out =
        e.run(&["agent", "w", "--queue", "jobs", "--max-tasks", "1", "--max-attempts", "1", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let failed = e.json(&["tasks", "--queue", "jobs", "--failed"]);
    let failed = failed.as_array().unwrap();
    assert_eq!(failed.len(), 1, "a cancelled task did not fail: {failed:?}");
    assert_eq!(failed[0]["_id"], "f");
    assert!(failed[0]["last_error"].as_str().unwrap().contains("disk full"), "{failed:?}");
    let table = e.run(&["tasks", "--queue", "jobs", "--failed", "--agent", "w"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("LAST ERROR") && table.contains("disk full"), "{table}");
    assert!(e.json(&["tasks", "--queue", "jobs", "--failed", "--agent", "other"]).as_array().unwrap().is_empty());
    // `requeue` revives it.
    e.json(&["requeue", "--queue", "jobs", "--yes"]);
    assert!(e.json(&["tasks", "--queue", "jobs", "--failed"]).as_array().unwrap().is_empty());
}

/// Escape sequences in stored data (an agent name, a task id, a lock key, a
/// failed command's stderr) reach no terminal: every human-readable view
/// shows them as visible escapes, and `--json` keeps them exact.
#[test]
fn views_print_no_escape_sequences_from_stored_data() {
    let Some(e) = env("terminal_escapes") else { return };
    let evil = "a\x1b]0;pwned\x07\x1b[2J\u{202e}";
    let task = "t\x1b[2J";
    let mut watch = e
        .cmd(&["watch", "--queue", "jobs", "--count", "3", "--interval", "0.2"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut started = String::new();
    BufReader::new(watch.stderr.take().unwrap()).read_line(&mut started).unwrap();
    assert!(started.contains("watching the tasks of jobs"), "{started}");
    e.json(&["enqueue", "--queue", "jobs", "--agent", evil, "{}", "--id", task]);
    let script = r"printf '\033]0;pwned\007\033[2Jfailed\n' >&2; exit 1";
    let out =
        e.run(&["agent", evil, "--queue", "jobs", "--max-tasks", "1", "--max-attempts", "1", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = e.run(&["lock", "k\x1b[2J\x07", "--", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let failed = e.json(&["tasks", "--queue", "jobs", "--failed"]);
    assert_eq!(failed[0]["agent_name"], evil, "--json is exact: {failed}");
    assert!(failed[0]["last_error"].as_str().unwrap().contains("\x1b]0;pwned\x07"), "{failed}");

    let clean = |args: &[&str], shows: &str| {
        let out = e.run(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!out.stdout.iter().any(|b| matches!(b, 0x1b | 0x07)), "{args:?}: {text:?}");
        assert!(!text.contains('\u{202e}'), "{args:?}: {text:?}");
        assert!(text.contains(shows), "{args:?}: {shows} in {text:?}");
    };
    clean(&["tasks", "--queue", "jobs", "--failed"], r"a\u001b]0;pwned\u0007\u001b[2J\u202e");
    clean(&["tasks", "--queue", "jobs", "--failed"], r"\u001b]0;pwned\u0007\u001b[2Jfailed");
    clean(&["tasks", "--queue", "jobs", "--list"], r"\u001b]0;pwned");
    clean(&["tasks", "--queue", "jobs"], r"a\u001b]0;pwned\u0007\u001b[2J\u202e");
    clean(&["locks"], r"k\u001b[2J\u0007");
    // Piped, plain `watch` does not clear the screen either.
    clean(&["watch", "--count", "1"], r"k\u001b[2J\u0007");

    // Enqueued, claimed, failed.
    wait_until("watch to print three events", Duration::from_secs(60), || watch.try_wait().unwrap().is_some());
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.lines().count() == 3, "{text:?}");
    assert!(!out.stdout.iter().any(|b| matches!(b, 0x1b | 0x07)) && !text.contains('\u{202e}'), "{text:?}");
    assert!(text.contains(r"t\u001b[2J") && text.contains(r"a\u001b]0;pwned\u0007"), "{text:?}");
}
