//! Review of `mongocoord cron --retain` and of `schedules`/`schedule` on
//! cron's queue by default, through the binary.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{env, signal, wait_until, BIN};

/// Every bad `--retain` is a clear usage error (status 2) naming the
/// option, given before any connection (the URI here answers nothing), never
/// a panic or a hang.
#[test]
fn bad_retain_values_are_usage_errors_before_connecting() {
    let uri = "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=3000&connectTimeoutMS=3000";
    let mut failures = Vec::new();
    for bad in [
        &["--retain", "NaN"][..],
        &["--retain", "inf"],
        &["--retain=-inf"],
        &["--retain=-1"],
        &["--retain", "-1"],
        &["--retain=-0.5"],
        &["--retain", "1e400"],
        &["--retain", "31622401"],
        &["--retain", ""],
        &["--retain", "abc"],
        &["--retain", "1s"],
        &["--retain", "1e-10"],
        &["--retain"],
        // Positive, but under the hour `cron` takes at least.
        &["--retain", "0.0005"],
        &["--retain", "0.0009"],
        &["--retain", "60"],
        &["--retain", "3599"],
    ] {
        let started = Instant::now();
        let out = Command::new(BIN)
            .args(["--uri", uri, "cron", "job", "--every", "1"])
            .args(bad)
            .args(["--", "true"])
            .env_remove("MONGODB_URI")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let took = started.elapsed();
        if out.status.code() != Some(2)
            || !err.contains("--retain")
            || err.contains("panicked")
            || took > Duration::from_millis(2_500)
        {
            failures.push(format!("{bad:?}: status {:?} after {took:?}: {}", out.status.code(), err.trim()));
        }
    }
    assert!(failures.is_empty(), "bad --retain not refused up front:\n{}", failures.join("\n"));
}

/// On a real server: a `--retain` under the hour must not create or change
/// the schedule before it is refused, and must name `--retain`.
#[test]
fn a_short_retain_is_refused_without_touching_the_schedule() {
    let Some(e) = env("review_retain_tiny") else { return };
    let out = e.run(&["cron", "tiny", "--every", "1", "--retain", "0.0005", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let rows = e.json(&["schedules"]);
    let created = rows.as_array().unwrap().iter().any(|r| r["name"] == "tiny");
    assert!(
        out.status.code() == Some(2) && err.contains("--retain") && !created,
        "status {:?}, stderr {err:?}, schedule left behind: {created}",
        out.status.code()
    );
}

/// `schedules`' ENDED KEPT is the number of the schedule's ended ticks
/// (completed and failed), and drops to 0 once their time is up (moved into
/// the past here, as an hour passing would) and the server's TTL pass has
/// run; the ticks themselves are gone then.
/// `schedule pause|resume` work on cron's queue without `--queue`, and a
/// `--queue` of another queue does not find the schedule.
#[test]
fn ended_kept_is_exact_and_drops_after_retention() {
    let Some(e) = env("review_retain_count") else { return };
    // Fails on odd seconds: completed and failed ticks both.
    let script = "test $(( MONGOCOORD_TICK / 1000 % 2 )) -eq 0";
    let mut cron = e.spawn(&["cron", "cnt", "--every", "1", "--retain", "3600", "--", "sh", "-c", script]);
    wait_until("four ended ticks", Duration::from_secs(60), || {
        let c = &e.json(&["tasks", "--queue", "cron", "--agent", "cnt"])["cnt"];
        c["completed"].as_u64().unwrap_or(0) >= 2 && c["failed"].as_u64().unwrap_or(0) >= 2
    });
    // Paused by name, on cron's queue, with no --queue.
    let paused = e.run(&["schedule", "pause", "cnt"]);
    assert!(paused.status.success(), "{}", String::from_utf8_lossy(&paused.stderr));
    assert_eq!(e.run(&["schedule", "resume", "cnt", "--queue", "elsewhere"]).status.code(), Some(1));
    assert!(e.json(&["schedules", "--queue", "elsewhere"]).as_array().unwrap().is_empty());
    std::thread::sleep(Duration::from_millis(1_500));
    signal(&cron, "-TERM");
    assert!(cron.wait().unwrap().success());

    let raw = e.raw("cron");
    let ended = raw
        .iter()
        .filter(|d| d.get_str("schedule").ok() == Some("cnt") && d.get_bool("complete").ok() == Some(true))
        .count();
    let rows = e.json(&["schedules"]);
    let row = rows.as_array().unwrap().iter().find(|r| r["name"] == "cnt").unwrap().clone();
    assert_eq!(row["paused"], true, "{row}");
    assert_eq!(row["ended_kept"].as_u64(), Some(ended as u64), "{row}");
    let c = &e.json(&["tasks", "--queue", "cron", "--agent", "cnt"])["cnt"];
    assert_eq!(c["completed"].as_u64().unwrap() + c["failed"].as_u64().unwrap(), ended as u64, "{c}");
    // The table says it too, under ENDED KEPT.
    let table = String::from_utf8_lossy(&e.run(&["schedules"]).stdout).into_owned();
    let header = table.lines().next().unwrap().to_owned();
    let line = table.lines().find(|l| l.starts_with("cnt ")).unwrap().to_owned();
    let col = header.find("ENDED KEPT").unwrap();
    assert_eq!(line[col..].split_whitespace().next(), Some(ended.to_string().as_str()), "{table}");

    // Past the retention, after a TTL pass: none kept.
    let marked = e.on_db(async |db| {
        let past = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() - 1_000);
        let q = bson::doc! { "schedule": "cnt", "gc_at": { "$exists": true } };
        let r = db.collection::<bson::Document>("cron").update_many(q, bson::doc! { "$set": { "gc_at": past } }).await;
        r.unwrap().modified_count
    });
    assert_eq!(marked, ended as u64, "every ended tick, and only those, is marked for deletion");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(store_test::mongo::prune_ttl());
    let rows = e.json(&["schedules"]);
    let row = rows.as_array().unwrap().iter().find(|r| r["name"] == "cnt").unwrap().clone();
    assert_eq!(row["ended_kept"].as_u64(), Some(0), "{row}");
    let left: Vec<_> = e.raw("cron").into_iter().filter(|d| d.get_str("schedule").ok() == Some("cnt")).collect();
    assert!(left.iter().all(|d| d.get_bool("complete").ok() != Some(true)), "ended ticks kept past --retain: {left:?}");
}

/// SIGTERM while a tick's command runs: whatever the runner does with the
/// tick (drains it or gives it back), a tick that has not ended carries no
/// deletion mark and survives a TTL pass past the retention.
#[test]
fn sigterm_mid_tick_leaves_no_unended_tick_marked_for_deletion() {
    let Some(e) = env("review_retain_sigterm") else { return };
    let started = e.file("started");
    let script = format!("echo x >> '{}'; sleep 4", started.display());
    let mut cron =
        e.spawn(&["cron", "slow", "--every", "30", "--missed", "once", "--retain", "3600", "--", "sh", "-c", &script]);
    wait_until("a tick's command started", Duration::from_secs(60), || started.exists());
    signal(&cron, "-TERM");
    assert!(cron.wait().unwrap().success());
    let ticks: Vec<_> = e.raw("cron").into_iter().filter(|d| d.get_str("schedule").ok() == Some("slow")).collect();
    assert!(!ticks.is_empty());
    for t in &ticks {
        if t.get_bool("complete").ok() != Some(true) {
            assert!(t.get("gc_at").is_none(), "an unended tick marked for deletion: {t:?}");
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(store_test::mongo::prune_ttl());
    let after: Vec<_> = e.raw("cron").into_iter().filter(|d| d.get_str("schedule").ok() == Some("slow")).collect();
    let unended = |v: &[bson::Document]| v.iter().filter(|d| d.get_bool("complete").ok() != Some(true)).count();
    assert_eq!(unended(&after), unended(&ticks), "before {ticks:?}\nafter {after:?}");
}

/// Lines of one schedule that keep its ended ticks for different times are
/// told so at start, as lines with different commands are.
#[test]
fn a_line_with_another_retention_is_told() {
    let Some(e) = env("review_retain_lines") else { return };
    let mut a = e.spawn(&["cron", "two", "--every", "3600", "--retain", "0", "--", "true"]);
    wait_until("the first line's schedule", Duration::from_secs(60), || {
        e.json(&["schedules"]).as_array().is_some_and(|v| v.iter().any(|r| r["name"] == "two"))
    });
    signal(&a, "-TERM");
    assert!(a.wait().unwrap().success());
    let b = e
        .cmd(&["cron", "two", "--every", "3600", "--retain", "7200", "--", "true"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It warns before it writes its own definition, which records 7200.
    wait_until("the second line's definition", Duration::from_secs(60), || {
        e.raw("cron_schedules").iter().any(|d| d.get_str("_id").ok() == Some("two") && d.to_string().contains("7200"))
    });
    signal(&b, "-TERM");
    let out = b.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("keep ended ticks for ever") && err.contains("this line keeps those it runs 7200 s"), "{err}");
}
