//! `mongocoord cron`: three processes on one schedule ticking every two
//! seconds, one SIGKILLed and restarted midway, run the command exactly once
//! per tick (a short version of the issue's one-minute check, which the chaos
//! run makes: `lab chaos --only cron`); bad input is a usage error.

use std::collections::BTreeMap;
use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{env, lines, signal, wait_until, Env, BIN};

const NAME: &str = "every2";

fn spawn_cron(e: &Env, ledger: &std::path::Path) -> Child {
    let script = format!("echo \"$MONGOCOORD_TICK $MONGOCOORD_FENCE $MONGOCOORD_SCHEDULE\" >> '{}'", ledger.display());
    e.spawn(&["cron", NAME, "*/2 * * * * *", "--overlap", "allow", "--ttl", "5", "--", "sh", "-c", &script])
}

/// The ledger's lines by tick: (tick, fences that ran it).
fn runs(ledger: &std::path::Path) -> BTreeMap<i64, Vec<u64>> {
    let mut out: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    for l in lines(ledger) {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f.len(), 3, "a line per run: {l:?}");
        assert_eq!(f[2], NAME);
        out.entry(f[0].parse().unwrap()).or_default().push(f[1].parse().unwrap());
    }
    out
}

fn wall_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()
}

/// Waits for the quiet half of an interval (a second after a tick), with no
/// tick's task ready or running: a SIGKILL then interrupts no command.
fn wait_for_a_quiet_moment(e: &Env) {
    wait_until("a quiet moment", Duration::from_secs(30), || {
        let phase = wall_ms() % 2_000;
        if !(700..1_100).contains(&phase) {
            return false;
        }
        let counts = e.json(&["tasks", "--queue", "cron", "--agent", NAME]);
        counts[NAME]["running"] == 0 && counts[NAME]["ready"] == 0 && (700..1_300).contains(&(wall_ms() % 2_000))
    });
}

#[test]
fn three_cron_processes_run_each_tick_once_across_a_kill() {
    let Some(e) = env("cron_three") else { return };
    let ledger = e.file("ledger");
    let mut procs: Vec<Child> = (0..3).map(|_| spawn_cron(&e, &ledger)).collect();
    wait_until("the first tick", Duration::from_secs(60), || !lines(&ledger).is_empty());
    let first = Instant::now();
    std::thread::sleep(Duration::from_secs(5));
    wait_for_a_quiet_moment(&e);
    signal(&procs[0], "-KILL");
    let _ = procs[0].wait();
    std::thread::sleep(Duration::from_millis(300));
    procs[0] = spawn_cron(&e, &ledger);
    while first.elapsed() < Duration::from_secs(14) {
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_for_a_quiet_moment(&e);
    for p in &procs {
        signal(p, "-TERM");
    }
    for mut p in procs {
        assert!(p.wait().unwrap().success(), "SIGTERM stops a cron runner with status 0");
    }

    let runs = runs(&ledger);
    let ticks: Vec<i64> = runs.keys().copied().collect();
    assert!(ticks.len() >= 7, "{runs:?}");
    assert!(ticks.windows(2).all(|w| w[1] - w[0] == 2_000), "no tick missing: {ticks:?}");
    assert!(runs.values().all(|f| f == &[1]), "each tick ran once, on its first claim: {runs:?}");

    // One task per tick, each showing the schedule it came from.
    let tasks = e.json(&["tasks", "--queue", "cron", "--list", "--schedule", NAME, "--limit", "1000"]);
    let tasks = tasks.as_array().unwrap();
    assert_eq!(tasks.len(), ticks.len(), "{tasks:?}");
    for t in tasks {
        assert_eq!((t["schedule"].as_str(), t["complete"].as_bool()), (Some(NAME), Some(true)), "{t}");
        assert_eq!(t["error_encountered"], false, "{t}");
        let tick = t["_id"].as_str().unwrap().rsplit('/').next().unwrap().parse::<i64>().unwrap();
        assert!(runs.contains_key(&tick) && t["scheduled_for"].is_object(), "{t}");
    }
    let listed = e.json(&["schedules", "--queue", "cron"]);
    assert_eq!((listed[0]["name"].as_str(), listed[0]["spec"].as_str()), (Some(NAME), Some("*/2 * * * * *")));
    assert_eq!(listed[0]["version"], 1, "the same line again changes nothing");
}

#[test]
fn bad_schedules_are_usage_errors() {
    // Checked before connecting: no server is needed.
    let port = store_test::free_port().unwrap();
    let uri = format!("mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=300");
    for (args, says) in [
        (&["61 * * * *"][..], "cron expression \"61 * * * *\""),
        (&["* * * * *", "--tz", "Mars/Olympus"][..], "time zone \"Mars/Olympus\""),
        (&["--every", "0"][..], "--every must be"),
        (&[][..], "a cron expression or --every"),
        (&["* * * * *", "--overlap", "sometimes"][..], "invalid value 'sometimes'"),
        (&["* * * * *", "--missed", "most"][..], "invalid value 'most'"),
        (&["* * * * *", "--retain=-1"][..], "--retain"),
    ] {
        let out = std::process::Command::new(BIN)
            .args(["--uri", &uri, "cron", "job"])
            .args(args)
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// Two lines with one schedule name and different commands: the second is told
/// it replaces the first's command, and the first is told at each tick it runs
/// that was scheduled with the other command. (Each tick still runs once.)
#[test]
fn lines_sharing_a_name_with_different_commands_are_told() {
    let Some(e) = env("cron_two_commands") else { return };
    let ledger = e.file("ledger");
    let spawn = |who: &str| {
        let script = format!("echo {who} >> '{}'", ledger.display());
        let err = std::fs::File::create(e.file(&format!("{who}.err"))).unwrap();
        e.cmd(&["cron", "twice", "--every", "1", "--", "sh", "-c", &script])
            .stdin(std::process::Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap()
    };
    let a = spawn("a");
    wait_until("a's first tick", Duration::from_secs(30), || lines(&ledger).iter().any(|l| l == "a"));
    let b = spawn("b");
    let said = |who: &str| std::fs::read_to_string(e.file(&format!("{who}.err"))).unwrap_or_default();
    wait_until("b is told", Duration::from_secs(30), || said("b").contains("was defined by another line to run"));
    // Only once b has written its definition (a SIGTERM before that could
    // find b without its handler, and the definition still a's).
    wait_until("b's definition", Duration::from_secs(30), || said("b").contains("changed to this line's definition"));
    // From now on ticks carry b's command; a is told whenever it runs one.
    signal(&b, "-TERM");
    wait_until("a is told", Duration::from_secs(30), || said("a").contains("had this tick scheduled to run"));
    assert!(said("a").contains(r#"but this line runs ["sh", "-c", "echo a >>"#), "{}", said("a"));
    // b has had its SIGTERM: a second one would end it at once (status 143),
    // which a slow shutdown on a loaded server can still be in.
    signal(&a, "-TERM");
    for mut p in [a, b] {
        assert!(p.wait().unwrap().success());
    }
}

/// A cron line keeps an ended tick's task for `--retain` (a week by
/// default): the server deletes it after that (`gc_at`), where it kept one
/// per tick for ever; `schedules`, on `cron`'s queue without `--queue`,
/// says how many are kept.
#[test]
fn ended_ticks_are_kept_for_their_retention_and_counted() {
    let Some(e) = env("cron_retain") else { return };
    let mut cron = e.spawn(&["cron", "keep", "--every", "1", "--retain", "3600", "--", "true"]);
    wait_until("two ticks ran", Duration::from_secs(30), || {
        e.json(&["tasks", "--queue", "cron", "--agent", "keep"])["keep"]["completed"].as_u64().unwrap_or(0) >= 2
    });
    signal(&cron, "-TERM");
    assert!(cron.wait().unwrap().success());
    // Read with the driver: `gc_at` is the store's field, not the task's.
    let ended: Vec<bson::Document> = e.on_db(async |db| {
        use futures::TryStreamExt;
        let tasks = db.collection::<bson::Document>("cron");
        tasks.find(bson::doc! { "schedule": "keep", "complete": true }).await.unwrap().try_collect().await.unwrap()
    });
    assert!(ended.len() >= 2, "{ended:?}");
    for t in &ended {
        let (ended_at, gc) = (t.get_datetime("completed_at").unwrap(), t.get_datetime("gc_at"));
        let gc = gc.unwrap_or_else(|_| panic!("an ended tick is marked for deletion: {t:?}"));
        let kept = gc.timestamp_millis() - ended_at.timestamp_millis();
        assert!((3_500_000..=3_700_000).contains(&kept), "kept {kept} ms: {t:?}");
    }
    let rows = e.json(&["schedules"]);
    let row = rows.as_array().unwrap().iter().find(|r| r["name"] == "keep").unwrap().clone();
    assert!(row["ended_kept"].as_u64().unwrap() >= 2, "{row}");
}
