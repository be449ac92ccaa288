//! The command line against user data that names the queue's own fields, and
//! filters that are not equality: each a usage error (status 2) naming what is
//! wrong, or a task failed for good saying why; never a task completed
//! without its command, nor a follow-up lost.

use crate::env;

/// `enqueue` with a reserved field is status 2 naming it: a task enqueued
/// with `follow_ups_fence` was completed without its command running.
#[test]
fn enqueue_refuses_reserved_fields() {
    let Some(e) = env("enqueue_reserved") else { return };
    for field in ["follow_ups_fence", "pending_parent_fence", "_id", "ready", "fence"] {
        let data = format!(r#"{{"{field}": 1}}"#);
        let out = e.run(&["enqueue", "--queue", "jobs", "--agent", "c", &data]);
        assert_eq!(out.status.code(), Some(2), "{field}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains(field), "{field}: names the field");
    }
    let stats = e.json(&["tasks", "--queue", "jobs"]);
    assert!(stats.get("c").is_none(), "nothing was enqueued: {stats}");
}

/// A command whose result names its own task's id as a follow-up's `_id`
/// fails its task for good, saying so; before, the task completed and the
/// follow-up was never created.
#[test]
fn a_follow_up_with_a_reserved_field_fails_its_task_for_good() {
    let Some(e) = env("follow_up_reserved") else { return };
    e.json(&["enqueue", "--queue", "jobs", "--agent", "a", "{}", "--id", "t1"]);
    let script = r#"cat >/dev/null; echo '{"follow_ups": [{"agent_name": "b", "_id": "t1"}]}'"#;
    let out = e.run(&["agent", "a", "--queue", "jobs", "--max-tasks", "1", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stats = e.json(&["tasks", "--queue", "jobs"]);
    assert_eq!(stats["a"]["failed"], 1, "{stats}");
    assert!(stats.get("b").is_none(), "no follow-up: {stats}");
    let failed = e.json(&["tasks", "--queue", "jobs", "--failed"]);
    assert!(failed[0]["last_error"].as_str().unwrap().contains("\"_id\""), "{failed}");
}

/// A filter read as a regular expression (extended JSON) matches by pattern,
/// not equality: refused with status 2 before anything is touched.
#[test]
fn filters_that_are_not_equality_are_refused() {
    let Some(e) = env("filter_regex") else { return };
    e.json(&["enqueue", "--queue", "jobs", "--agent", "keep", "{}"]);
    let regex = r#"{"agent_name": {"$regularExpression": {"pattern": ".*", "options": ""}}}"#;
    for args in [
        vec!["cancel", "--queue", "jobs", "--filter", regex],
        vec!["delete", "--queue", "jobs", "--filter", regex, "--force"],
        vec!["requeue", "--queue", "jobs", "--filter", regex, "--yes"],
        vec!["tasks", "--queue", "jobs", "--list", "--filter", regex],
    ] {
        let out = e.run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("only equality"), "{args:?}");
    }
    assert_eq!(e.json(&["tasks", "--queue", "jobs"])["keep"]["ready"], 1, "nothing was touched");
}

/// An id of 24 hex digits is refused at enqueue: every command reads such an
/// id back as an `ObjectId`, so a `cancel` of the id shown for one task hit
/// another (the `ObjectId` task it looked like).
#[test]
fn enqueue_refuses_ids_read_back_as_object_ids() {
    let Some(e) = env("enqueue_hex_id") else { return };
    let first = e.json(&["enqueue", "--queue", "jobs", "--agent", "precious", "{}"]);
    let id = first["id"].as_str().unwrap().to_owned();
    let out = e.run(&["enqueue", "--queue", "jobs", "--agent", "junk", "--id", &id, "{}"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ObjectId"));
    let stats = e.json(&["tasks", "--queue", "jobs"]);
    assert!(stats.get("junk").is_none(), "{stats}");
}

/// `--uri-file` reads the URI from a file, so that a password is not on the
/// command line (which every user of the host can read); `--uri` with a
/// password is warned about, without printing it.
#[test]
fn uri_file_keeps_secrets_off_the_command_line() {
    let Some(e) = env("uri_file") else { return };
    let file = e.file("uri");
    std::fs::write(&file, format!("{}\n", e.uri)).unwrap();
    let run = |args: &[&str]| {
        let mut c = std::process::Command::new(crate::BIN);
        c.args(args).args(["--db", &e.db, "tasks", "--queue", "jobs", "--json"]).env_remove("MONGODB_URI");
        c.stdin(std::process::Stdio::null()).output().unwrap()
    };
    let out = run(&["--uri-file", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "no warning for a URI from a file: {}", String::from_utf8_lossy(&out.stderr));
    let with_password = e.uri.replacen("mongodb://", "mongodb://user:hunter2@", 1);
    let out = run(&["--uri", &with_password]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--uri-file") && !stderr.contains("hunter2"), "{stderr}");
    let plain = run(&["--uri", &e.uri]);
    assert!(
        plain.status.success() && !String::from_utf8_lossy(&plain.stderr).contains("warning"),
        "no warning without a secret"
    );
}

/// Data nested deeper than `mongoagent::MAX_DATA_DEPTH`, or a 70,000-byte
/// agent name, is status 2 at `enqueue`: such a task was accepted, then
/// crashed every reader of the queue (a stack overflow decoding it, a panic
/// padding the name's column), the agent and `delete` included. A task
/// whose long value makes a wide cell is listed with the cell cut.
#[test]
fn enqueue_refuses_data_too_deep_and_names_too_long() {
    let Some(e) = env("enqueue_deep") else { return };
    let deep = format!("{}1{}", r#"{"a":"#.repeat(40), "}".repeat(40));
    let out = e.run(&["enqueue", "--queue", "jobs", "--agent", "a", &deep]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nests deeper"), "{}", String::from_utf8_lossy(&out.stderr));
    let long = "n".repeat(70_000);
    let out = e.run(&["enqueue", "--queue", "jobs", "--agent", &long, "{}"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let wide = format!(r#"{{"note": "{}"}}"#, "w".repeat(70_000));
    e.json(&["enqueue", "--queue", "jobs", "--agent", "a", &wide, "--id", "wide"]);
    let out = e.run(&["tasks", "--queue", "jobs", "--list"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = e.run(&["tasks", "--queue", "jobs"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Flags that would mean nothing are status 2: `tasks --filter` without a
/// listing (it counted every task, the filter ignored), `--limit 0`,
/// `pause` of the empty agent name, an empty `--dedupe-key`.
#[test]
fn flags_that_would_mean_nothing_are_refused() {
    let Some(e) = env("flags_nothing") else { return };
    for args in [
        vec!["tasks", "--queue", "jobs", "--filter", "{}"],
        vec!["tasks", "--queue", "jobs", "--list", "--limit", "0"],
        vec!["pause", "--queue", "jobs", "--agent", ""],
        vec!["enqueue", "--queue", "jobs", "--agent", "a", "{}", "--dedupe-key", ""],
    ] {
        let out = e.run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
