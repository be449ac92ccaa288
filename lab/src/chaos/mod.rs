//! `lab chaos`: worker OS processes that lock, lead and process tasks
//! against one server while they are killed (SIGKILL), paused longer than their
//! leases (SIGSTOP/SIGCONT) and restarted, and the server itself is killed and
//! restarted. Every worker appends what it did to its own log; a checker reads
//! all logs and the store afterwards and verifies the history.
//!
//! Log lines (`<kind> <fields…>`, times on the server clock in epoch ms):
//! - `hold <fence> <now>`: the lock holder with `fence` confirmed, at server time
//!   `now`, that its guard was still valid (read `now`, then checked not lost);
//! - `acq <fence> <since>`: acquired (`since` is the lease's, for reference);
//! - `write <fence> <rev> ok|rejected`: a fenced write to the ledger;
//! - `lead <term> <now>`: the elector still believed it led at server time `now`;
//! - `term <term> <since>`: a term began (for reference);
//! - `done <task> <fence>`, `stale <task> <fence>`: a task outcome applied / rejected;
//! - `joined <task> <ended> <seen>`: a task that waited for its follow-ups ran
//!   again, and saw `seen` of them, `ended` of which had ended;
//! - `fwrite <fence> <rev> ok|rejected`, `fhold <fence> <now>`: a ledger writer
//!   that is the *grandchild* of a `mongocoord lock` runner (`sh -c 'writer &
//!   wait'`) wrote to its own ledger, and was still running at server time
//!   `now`. Runners are killed with SIGKILL, and sent any signal
//!   ([`crate::signal::ANY_SIGNAL`], caught or not), they or their supervisors: a
//!   grandchild that outlives its runner's lease shows up as two fences
//!   running at once;
//! - `lclaim`, `lrun`: the globally limited agent's runs (`limited.rs`);
//! - `grun`, and the driver's `gseed`: the grouped agent's runs and tasks
//!   (`grouped.rs`);
//! - the driver's own log, `driver.log`: the pause/resume cycle and the
//!   SIGSTOPs (`pause.rs`).
//!
//! One concern per child module: `worker.rs` the worker processes,
//! `check.rs` the checker, `limited.rs` and `pause.rs` the globally limited
//! agent and its pause cycle, `grouped.rs` the grouped agent, `side.rs` what
//! those two share, `names.rs` what the processes share, `log.rs`
//! their logs, `retrying.rs` the server as they reach it, `spawn.rs` how
//! they are started; this file is the orchestrator.

mod check;
mod grouped;
mod limited;
mod log;
mod names;
mod pause;
mod retrying;
mod side;
mod spawn;
mod worker;

use std::path::PathBuf;
use std::time::Duration;

use bson::{doc, Bson};
use mongoagent::{fields, NewTask, Queue};
use serde_json::json;
use store_mongo::MongoStore;
use store_trait::{Collection, Condition, Query, Store};
use tokio::time::Instant;

use check::{check, foreign_tasks};
use log::Log;
use names::{FORK_LOCK, QUEUE, SEEDED};
use retrying::{connect_retrying, now_retrying};
use spawn::{spawn_quiet, spawn_traced};
pub(crate) use worker::{ledger_writer, worker};

use crate::cron::{self, Crons};
use crate::error::LabError;
use crate::server::{Server, ServerSpec, Storage};
use crate::signal::{any_signal, runner_or_supervisor, signal};

/// Options of a chaos run.
#[derive(Debug, Clone)]
pub(crate) struct ChaosOpts {
    pub(crate) duration: Duration,
    pub(crate) seed: u64,
    pub(crate) dir: PathBuf,
    pub(crate) server_bin: Option<PathBuf>,
    pub(crate) workers: usize,
    /// The `mongocoord` binary: with it, forking runners contend for a lock too.
    pub(crate) mongocoord: Option<PathBuf>,
    /// How many forking runners.
    pub(crate) fork_workers: usize,
    /// Run only this scenario.
    pub(crate) only: Option<Scenario>,
}

/// A scenario `lab chaos --only` runs on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Scenario {
    /// Three `mongocoord cron` processes on one schedule, SIGKILLed and
    /// restarted between ticks: exactly one run per tick (needs --mongocoord).
    Cron,
}

/// `--only cron`: the schedule scenario alone (see [`crate::cron::only`]).
async fn run_cron_only(store: &MongoStore, uri: &str, db: &str, o: &ChaosOpts) -> Result<serde_json::Value, LabError> {
    let bin = o.mongocoord.as_ref().ok_or_else(|| LabError::invalid("--only cron needs --mongocoord"))?;
    let mut crons = Crons::start(bin, uri, db, &o.dir, store).await?;
    let report = cron::only(store, &mut crons, o.duration).await?;
    Ok(json!({
        "seed": o.seed, "minutes": o.duration.as_secs_f64() / 60.0, "only": "cron",
        "cron_processes": 3, "cron_kills": crons.kills, "cron_ticks": report.ticks, "cron_reruns": report.reruns,
        "violations": report.violations, "ok": report.violations.is_empty(),
    }))
}

/// Runs the chaos and the checker; returns 1 on any violation.
pub(crate) async fn run(uri: Option<String>, db: &str, o: ChaosOpts) -> Result<u8, LabError> {
    let _ = std::fs::remove_dir_all(&o.dir);
    let logs = o.dir.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| LabError::io(format!("cannot create {}", logs.display()), e))?;
    let mut server = None;
    let uri = match (uri, &o.server_bin) {
        (_, Some(bin)) => {
            let spec = ServerSpec { bin: bin.clone(), storage: Storage::Dir(o.dir.join("data")) };
            let mut s = Server::new(spec)?;
            s.start().await?;
            // retryWrites=false (in `uri`): SecantusDB keeps a record of every
            // retryable write and slows down twentyfold after some 10,000 of
            // them (`test-server.md`); the workers pass that within a minute,
            // and the drain then crawled until the stall check tripped (claims
            // answered after their 2 s leases could lapse). The store's own
            // handling of ambiguous writes (nonces, read-backs) is what the
            // run checks anyway; the driver's retry would only hide some of it.
            let uri = s.uri("serverSelectionTimeoutMS=2000&heartbeatFrequencyMS=500");
            server = Some(s);
            uri
        }
        (Some(u), None) => u,
        (None, None) => {
            return Err(LabError::invalid("chaos needs --server-bin (to own a restartable server) or --uri"))
        }
    };
    let store = connect_retrying(&uri, db).await;
    if o.only == Some(Scenario::Cron) {
        let summary = run_cron_only(&store, &uri, db, &o).await;
        if let Some(mut s) = server {
            s.kill().await;
        }
        let summary = summary?;
        write_summary(&o.dir, &summary)?;
        return Ok(if summary["ok"] == true { 0 } else { 1 });
    }
    let queue = Queue::new(store.clone(), QUEUE)?;
    let seeded: Vec<NewTask> = (0..SEEDED)
        .map(|i| NewTask::new("chaos", doc! {"stage": 0, "i": i64::from(i)}).id(format!("seed-{i}")))
        .collect();
    queue.enqueue_all(&seeded).await?;
    // Documents another program wrote into the queue, which no agent can read:
    // claims must pass over them, and nothing may stop on them.
    let raw = store.database().collection::<bson::Document>(QUEUE);
    raw.insert_many(foreign_tasks())
        .await
        .map_err(|e| LabError::from(e).context("cannot insert the foreign documents"))?;

    let exe = std::env::current_exe().map_err(|e| LabError::io("cannot find the lab's own binary", e))?;
    let spawn = |n: usize| -> Result<tokio::process::Child, LabError> {
        let mut c = tokio::process::Command::new(&exe);
        c.env("MONGODB_URI", &uri)
            .args(["--db", db, "chaos-worker", "--log"])
            .arg(o.dir.join("logs").join(format!("worker-{n}.log")));
        spawn_traced(c, &o.dir.join("logs").join(format!("worker-{n}.trace")))
    };
    let mut next_log = 0;
    let mut workers: Vec<tokio::process::Child> = Vec::new();
    // Each worker's log's name, as the driver's log names it.
    let mut names: Vec<String> = Vec::new();
    for _ in 0..o.workers {
        workers.push(spawn(next_log)?);
        names.push(format!("worker-{next_log}"));
        next_log += 1;
    }
    let end = Instant::now() + o.duration;
    let driver_log = logs.join("driver.log");
    let driver =
        Log::open(&driver_log).map_err(|e| LabError::io(format!("cannot open {}", driver_log.display()), e))?;
    let cycle = tokio::spawn(pause::cycle(store.clone(), driver.clone(), o.seed, end));
    // Forking runners: `mongocoord lock` runs `sh`, whose background child
    // (the runner's grandchild) writes to a ledger with the runner's fence.
    let spawn_fork = |n: usize| -> Result<tokio::process::Child, LabError> {
        let Some(bin) = &o.mongocoord else { return Err(LabError::invalid("forking runners need --mongocoord")) };
        let log = o.dir.join("logs").join(format!("fork-{n}.log"));
        let script = format!(
            "'{}' --db '{db}' ledger-writer --log '{}' --fence \"$MONGOCOORD_FENCE\" & wait",
            exe.display(),
            log.display()
        );
        let mut c = tokio::process::Command::new(bin);
        // The writer finds the server in MONGODB_URI, passed on to it.
        c.env("MONGODB_URI", &uri).args([
            "--db",
            db,
            "lock",
            FORK_LOCK,
            "--ttl",
            "2",
            "--pass-env",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        spawn_quiet(c)
    };
    let mut forks: Vec<tokio::process::Child> = Vec::new();
    if o.mongocoord.is_some() {
        for _ in 0..o.fork_workers {
            forks.push(spawn_fork(next_log)?);
            next_log += 1;
        }
    }
    // The schedule: three `mongocoord cron` processes (see `crate::cron`).
    let mut crons = match &o.mongocoord {
        Some(bin) => Some(Crons::start(bin, &uri, db, &o.dir, &store).await?),
        None => None,
    };
    let mut rng = fastrand::Rng::with_seed(o.seed);
    let (mut kills, mut pauses, mut restarts, mut runner_kills, mut runner_pauses) = (0, 0, 0, 0, 0);
    let mut runner_signals = 0;
    let server_every = (o.duration.as_secs_f64() / 3.0).max(15.0);
    let mut next_server_kill =
        Instant::now() + Duration::try_from_secs_f64(server_every).unwrap_or(Duration::from_secs(15));
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(rng.u64(700..2500))).await;
        grouped::feed(&store, &driver, &mut rng).await;
        let i = rng.usize(..workers.len());
        match rng.u32(..10) {
            0..=3 => {
                let _ = workers[i].start_kill();
                let _ = workers[i].wait().await;
                kills += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
                workers[i] = spawn(next_log)?;
                names[i] = format!("worker-{next_log}");
                next_log += 1;
            }
            4..=6 => {
                if let Some(pid) = workers[i].id() {
                    // Longer than the 2 s lease: the paused holder's lease lapses.
                    // Server times around it: it had no CPU at most in between.
                    driver.line(format!("wstop {} {}", names[i], now_retrying(&store).await));
                    signal(pid, "-STOP");
                    pauses += 1;
                    let d = Duration::from_millis(rng.u64(2500..5000));
                    let (store, driver, name) = (store.clone(), driver.clone(), names[i].clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(d).await;
                        signal(pid, "-CONT");
                        driver.line(format!("wcont {name} {}", now_retrying(&store).await));
                    });
                }
            }
            _ => {}
        }
        if !forks.is_empty() {
            // A runner whose lock was lost exits (status 75): start another. And
            // now and then SIGKILL one: its grandchild must die with it.
            for (j, f) in forks.iter_mut().enumerate() {
                if matches!(f.try_wait(), Ok(Some(_))) {
                    *f = spawn_fork(next_log)?;
                    next_log += 1;
                    let _ = j;
                }
            }
            match rng.u32(..6) {
                0 | 1 => {
                    let j = rng.usize(..forks.len());
                    let _ = forks[j].start_kill();
                    let _ = forks[j].wait().await;
                    runner_kills += 1;
                    forks[j] = spawn_fork(next_log)?;
                    next_log += 1;
                }
                3 => {
                    // Any signal, to the runner or to its supervisor: whatever
                    // ends either, the lock is free only once the tree is gone
                    // (a runner that exits is started again above).
                    if let Some(pid) = forks[rng.usize(..forks.len())].id() {
                        let target = runner_or_supervisor(pid, &mut rng);
                        signal(target, any_signal(&mut rng));
                        runner_signals += 1;
                    }
                }
                2 => {
                    // A runner stopped past its lease (SIGSTOP, Ctrl-Z): its
                    // supervisor must stop the command before the lease lapses.
                    if let Some(pid) = forks[rng.usize(..forks.len())].id() {
                        signal(pid, "-STOP");
                        runner_pauses += 1;
                        let d = Duration::from_millis(rng.u64(2500..5000));
                        tokio::spawn(async move {
                            tokio::time::sleep(d).await;
                            signal(pid, "-CONT");
                        });
                    }
                }
                _ => {}
            }
        }
        if let Some(c) = crons.as_mut() {
            c.chaos_step(&mut rng).await?;
        }
        if let Some(s) = server.as_mut() {
            if Instant::now() >= next_server_kill {
                s.kill().await;
                tokio::time::sleep(Duration::from_millis(rng.u64(500..2000))).await;
                s.start().await?;
                restarts += 1;
                next_server_kill =
                    Instant::now() + Duration::try_from_secs_f64(server_every).unwrap_or(Duration::from_secs(15));
            }
        }
    }
    // Every tick up to here must be accounted for.
    let cron_window_end = now_retrying(&store).await;
    // The limited agent is resumed for good (and fed no more) once this returns.
    cycle.await.map_err(|e| LabError::join("the pause cycle stopped", e))??;
    // Let paused workers resume and the queue drain.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let coll = Collection::new(QUEUE)?;
    let open = || {
        Query::all()
            .when(Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true)).negate())
            .when(Condition::FieldEq("foreign".into(), Bson::Boolean(true)).negate())
            .when(Condition::Exists(fields::PENDING_PARENT_FENCE.into()).negate())
    };
    let lcoll = Collection::new(limited::QUEUE)?;
    let lopen = Query::all().when(Condition::FieldEq(fields::COMPLETE.into(), Bson::Boolean(true)).negate());
    let gcoll = Collection::new(grouped::QUEUE)?;
    // Wait while the queues still move: the check then reports a queue that
    // stopped (no task ended for `STALL`), not one that drains slowly on a
    // loaded machine (two cores shared by the server, every worker and the
    // build: the queue has drained at under two tasks a second). Ten minutes
    // at most.
    const STALL: Duration = Duration::from_secs(60);
    let drain_until = Instant::now() + Duration::from_secs(600);
    let (mut fewest, mut moved_at) = (u64::MAX, Instant::now());
    while Instant::now() < drain_until && moved_at.elapsed() < STALL {
        let counts =
            (store.count(&coll, &open()).await, store.count(&lcoll, &lopen).await, store.count(&gcoll, &lopen).await);
        let left = match counts {
            (Ok(a), Ok(b), Ok(c)) => a + b + c,
            _ => u64::MAX,
        };
        if left == 0 {
            break;
        }
        if left < fewest {
            (fewest, moved_at) = (left, Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if let Some(c) = &crons {
        c.settle(&store, cron_window_end).await?;
    }
    for w in workers.iter_mut().chain(forks.iter_mut()) {
        let _ = w.start_kill();
        let _ = w.wait().await;
    }
    if let Some(c) = crons.as_mut() {
        c.stop(true).await;
    }
    // Every runner is gone: so must every ledger writer be, within the time the
    // runners' supervisors take to notice. Any line a writer logs after that is
    // a grandchild that outlived its runner.
    let runners_gone = store.now().await?.as_millis() + 1_000;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut report = check(&store, &logs).await?;
    if let Some(late) = report.last_fork_hold.filter(|t| *t > runners_gone) {
        report.violations.push(format!(
            "a ledger writer was still running at {late}, after every runner had been killed (by {runners_gone})"
        ));
    }
    let cron = match &crons {
        Some(c) => {
            let r = c.check(&store, cron_window_end, false).await?;
            report.violations.extend(r.violations.iter().cloned());
            json!({ "processes": 3, "kills": c.kills, "pauses": c.pauses, "signals": c.signals, "ticks": r.ticks, "reruns": r.reruns })
        }
        None => serde_json::Value::Null,
    };
    if let Some(mut s) = server {
        s.kill().await;
    }
    let summary = json!({
        "seed": o.seed, "minutes": o.duration.as_secs_f64() / 60.0, "workers": o.workers,
        "process_kills": kills, "pauses": pauses, "server_restarts": restarts, "runner_kills": runner_kills, "runner_pauses": runner_pauses, "runner_signals": runner_signals,
        "fork_fences": report.fork_fences, "fork_writes_accepted": report.fork_writes_ok,
        "lock_acquisitions": report.acquisitions, "fenced_writes_accepted": report.writes_ok,
        "stale_writes_rejected": report.writes_rejected, "leadership_terms": report.terms,
        "tasks": report.tasks, "stale_outcomes_rejected": report.stale, "fan_in_runs": report.joins,
        "cron": cron,
        "limited": {
            "agent": limited::LIMITED, "global_concurrency": limited::LIMIT, "tasks": report.limited_tasks,
            "runs": report.limited.runs, "most_at_once": report.limited.most,
            "pause_cycles": report.pause.cycles, "claims_before_pause_seen": report.pause.claims_in_grace,
            "claims_of_stopped_workers_in_pause": report.pause.claims_excused,
            "latest_claim_after_pause_ms": report.pause.latest_ms,
        },
        "grouped": {
            "agent": grouped::GROUPED, "group_concurrency": 1, "groups": report.grouped.groups,
            "tasks": report.grouped_tasks, "tasks_run": report.grouped.tasks_run,
        },
        "violations": report.violations,
        "ok": report.violations.is_empty(),
    });
    write_summary(&o.dir, &summary)?;
    Ok(if report.violations.is_empty() { 0 } else { 1 })
}

/// Writes `DIR/summary.json` and prints the summary.
fn write_summary(dir: &std::path::Path, summary: &serde_json::Value) -> Result<(), LabError> {
    let path = dir.join("summary.json");
    std::fs::write(&path, summary.to_string())
        .map_err(|e| LabError::io(format!("cannot write {}", path.display()), e))?;
    let pretty = serde_json::to_string_pretty(summary)
        .map_err(|e| LabError::Json { what: "cannot print the summary".into(), source: e })?;
    println!("{pretty}");
    Ok(())
}
