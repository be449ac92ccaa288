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
