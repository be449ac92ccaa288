//! `lab bench`: the figures behind the README's Performance section,
//! measured on one server in one run, side by side with the raw driver and the
//! Python `mongoelector` (the seed's own implementation). `cargo xtask bench`
//! provisions the server and calls it. Correctness checks inside (one holder,
//! every task done) fail loudly; numbers never fail anything.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use bson::doc;
use mongoagent::{Agent, NewTask, Outcome, Queue, Task};
use mongolock::{Acquire, Lock};
use store_memory::MemoryStore;
use store_mongo::mongodb::options::{Acknowledgment, CollectionOptions, ReadConcern, ReturnDocument, WriteConcern};
use store_mongo::MongoStore;

mod agenda;
mod counted;
mod election;
mod events;
mod figures;
pub(crate) mod idle;
mod scaling;
pub(crate) mod table;
use counted::{counted_store, Counts};
use figures::{Figures, Section};

use crate::server::ServerSpec;

/// How big a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every section at a tiny size, then a check that every promised figure
    /// is there (CI runs it: the bench cannot rot unseen). Its numbers mean
    /// nothing.
    Smoke,
    /// A short run whose figures compare within the run.
    Quick,
    /// The README's figures.
    Full,
}

/// The sizes of each section in one [`Mode`].
#[derive(Debug, Clone, Copy)]
struct Size {
    /// Raw `findAndModify` calls, lock cycles, minimal-pipeline cycles.
    calls: usize,
    handovers: usize,
    /// Clean stops, then as many kills, of the elected leader.
    elect_trials: usize,
    /// Tasks per queue shape.
    tasks: u32,
    picks: usize,
    ticks: usize,
    sim_minutes: u64,
    /// Seconds each idle process is measured, after `idle_warm_up_s`: long
    /// enough to take in the periodic costs (a change stream's `getMore`
    /// every 2 minutes, an idle agent's check every 10) at full size.
    idle_s: u64,
    /// Seconds before the idle window opens: past an agent's quiet spell
    /// (`mongoagent/src/control.rs`, 30 s), so the window sees it idle.
    idle_warm_up_s: u64,
    seed_cycles: usize,
    agenda: agenda::AgendaSize,
}

impl Mode {
    fn size(self) -> Size {
        match self {
            Mode::Smoke => Size {
                calls: 20,
                handovers: 2,
                elect_trials: 1,
                tasks: 20,
                picks: 2,
                ticks: 2,
                sim_minutes: 1,
                idle_s: 2,
                idle_warm_up_s: 3,
                seed_cycles: 10,
                // As many jobs as our tasks, so the ratios compare like with like.
                agenda: agenda::AgendaSize { jobs: 20, picks: 1, limit_s: 30 },
            },
            Mode::Quick => Size {
                calls: 300,
                handovers: 10,
                elect_trials: 3,
                tasks: 400,
                picks: 10,
                ticks: 10,
                sim_minutes: 10,
                idle_s: 130,
                idle_warm_up_s: 35,
                seed_cycles: 100,
                agenda: agenda::AgendaSize { jobs: 400, picks: 5, limit_s: 120 },
            },
            Mode::Full => Size {
                calls: 2000,
                handovers: 30,
                elect_trials: 5,
                tasks: 2000,
                picks: 30,
                ticks: 30,
                sim_minutes: 60,
                idle_s: 600,
                idle_warm_up_s: 35,
                seed_cycles: 500,
                agenda: agenda::AgendaSize { jobs: 2000, picks: 15, limit_s: 180 },
            },
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Smoke => "smoke",
            Mode::Quick => "quick",
            Mode::Full => "full",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct BenchOpts {
    pub(crate) mode: Mode,
    pub(crate) out: PathBuf,
    pub(crate) mongocoord: PathBuf,
    pub(crate) python: Option<PathBuf>,
    pub(crate) seed_script: Option<PathBuf>,
    /// The installed Agenda harness (a directory with `bench.mjs` and its
    /// `node_modules`); without it the Agenda figures are skipped.
    pub(crate) agenda: Option<PathBuf>,
    /// The server each of Agenda's settings gets fresh; `None`: the run's.
    pub(crate) peer_server: Option<ServerSpec>,
    /// Tasks per queue run (ours, the raw loop's and Agenda's alike), in
    /// place of the mode's.
    pub(crate) tasks: Option<u32>,
}

impl BenchOpts {
    /// The mode's sizes, with the queue's task count overridden if asked.
    fn size(&self) -> Size {
        let mut size = self.mode.size();
        if let Some(n) = self.tasks {
            size.tasks = n;
            size.agenda.jobs = n;
        }
        size
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Runs the benchmark against `store` (database `db` at `uri`).
pub(crate) async fn run(uri: &str, db: &str, store: MongoStore, o: BenchOpts) -> Result<u8, String> {
    let mut f = Figures::default();
    let size = o.size();
    let version = store
        .database()
        .run_command(doc! {"buildInfo": 1})
        .await
        .ok()
        .and_then(|d| d.get_str("version").ok().map(str::to_owned))
        .unwrap_or_default();
    let server = std::env::var("MONGOCOORD_BENCH_SERVER").unwrap_or_else(|_| "mongodb".into());
    reset(&store, db).await?;
    let n = size.calls;

    eprintln!("raw findAndModify ({n} calls)…");
    let raw = store.database().collection::<bson::Document>("bench_raw");
    let mut lat = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        raw.find_one_and_update(
            doc! {"_id": "k"},
            vec![doc! {"$set": {"n": {"$add": [{"$ifNull": ["$n", 0]}, 1]}, "at": "$$NOW"}}],
        )
        .upsert(true)
        .await
        .map_err(|e| e.to_string())?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let raw_rate = n as f64 / start.elapsed().as_secs_f64();
    let raw_p50 = pct(&sorted(lat), 0.5);
    f.put("raw_fam_per_s", raw_rate);
    f.put("raw_fam_p50_us", raw_p50);

    eprintln!("lock acquire + release ({n} cycles)…");
    let lock =
        Lock::builder(store.clone(), "bench-lock").ttl(Duration::from_secs(30)).build().map_err(|e| e.to_string())?;
    let mut acq = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let g = lock.try_acquire().await.map_err(|e| e.to_string())?.ok_or("uncontended lock was held")?;
        acq.push(t.elapsed().as_secs_f64() * 1e6);
        g.release().await.map_err(|e| e.to_string())?;
    }
    f.put("lock_cycles_per_s", n as f64 / start.elapsed().as_secs_f64());
    let acq = sorted(acq);
    f.put("lock_acquire_p50_us", pct(&acq, 0.5));
    f.put("lock_acquire_p99_us", pct(&acq, 0.99));
    f.put("lock_acquire_vs_raw", pct(&acq, 0.5) / raw_p50);

    eprintln!("minimal DistributedLock.MongoDB-style acquire pipeline + release ({n} cycles)…");
    let minimal = sorted(minimal_lock_cycles(&store, n).await?);
    f.put("minimal_pipeline_acquire_p50_us", pct(&minimal, 0.5));
    f.put("lock_vs_minimal_pipeline", pct(&acq, 0.5) / pct(&minimal, 0.5));

    let trials = size.handovers;
    eprintln!("lock handover ({trials} trials)…");
    let mut hand = Vec::new();
    for _ in 0..trials {
        let a = Lock::builder(store.clone(), "bench-handover")
            .ttl(Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        let b = a.clone();
        let g = a.acquire().await.map_err(|e| e.to_string())?;
        let waiter = tokio::spawn(async move {
            b.acquire_with(Acquire::new().timeout(Duration::from_secs(20))).await.map(|g| (Instant::now(), g))
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        let t0 = Instant::now();
        g.release().await.map_err(|e| e.to_string())?;
        let (t1, g2) = waiter.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        hand.push(t1.duration_since(t0).as_secs_f64() * 1e3);
        g2.release().await.map_err(|e| e.to_string())?;
    }
    let hand = sorted(hand);
    f.put("handover_ms_p50", pct(&hand, 0.5));
    f.put("handover_ms_p99", pct(&hand, 0.99));

    let skip = std::env::var("MONGOCOORD_BENCH_SKIP").unwrap_or_default();
    let elect_trials = size.elect_trials;
    if skip.contains("elector") {
        f.skip(Section::Elector, "MONGOCOORD_BENCH_SKIP");
    } else {
        eprintln!("elector: 3 processes, ttl 3 s, {elect_trials} clean stops and {elect_trials} kills…");
        let exe = o.mongocoord.clone();
        let ours = |key: &str, file: &Path| {
            // The runner's pid, which the trials signal: the command's parent
            // is the runner's supervisor, not the runner.
            let script = format!("echo $(date +%s%N) $MONGOCOORD_RUNNER_PID >> {}; exec sleep 100000", file.display());
            let mut c = tokio::process::Command::new(&exe);
            c.args(["--uri", uri, "--db", db, "elect", key, "--ttl", "3", "--", "sh", "-c", &script]);
            c
        };
        let lease = election::LeaseDoc::new(&store, mongoelector::DEFAULT_COLLECTION).await?;
        let t = election::trials("bench-elect", &o.out, elect_trials, elect_trials, Some(&lease), ours).await?;
        let (h, fo) = (sorted(t.handovers_ms), sorted(t.failovers_s));
        f.put("elector_handover_ms_p50", pct(&h, 0.5));
        f.put("failover_s_p50", pct(&fo, 0.5));
        f.put("failover_over_ttl", pct(&fo, 0.5) / 3.0);
        f.put("failover_overhead_ms_p50", pct(&sorted(t.overheads_ms), 0.5));
    }

    // The queue, side by side on the same server and the same number of tasks
    // (SecantusDB's writes cost time in proportion to the collection's size, so
    // only same-size figures of the same run compare): a hand-written driver
    // loop, three shapes of ours, and Agenda. Every shape gets a collection of
    // its own, preloaded the same way.
    let tasks = size.tasks;
    f.put("queue_tasks", f64::from(tasks));
    eprintln!("raw queue: one client, claim (filter + sort) then fenced complete, {tasks} tasks…");
    let raw_queue = raw_queue_run(uri, db, &store, tasks, "bench_raw_queue").await?;
    f.put("raw_queue_per_s", raw_queue.rate);
    f.put("raw_queue_commands_per_task", raw_queue.commands_per_task);
    put_breakdown(&mut f, "raw_queue", &raw_queue.counts, tasks);
    let mut shapes: Vec<(&str, QueueRun)> = Vec::new();
    let [per_agent, shared, shared_global, processes] = figures::SHAPES;
    eprintln!("queue: 4 agents, {tasks} trivial tasks, each agent on its own Queue (Agent::builder)…");
    shapes.push((per_agent, queue_run(uri, db, &store, tasks, "bench_queue", false, None).await?));
    eprintln!("queue: 4 agents sharing one Queue (Agent::on_queue), {tasks} trivial tasks…");
    shapes.push((shared, queue_run(uri, db, &store, tasks, "bench_queue_shared", true, None).await?));
    eprintln!("queue: as shared, with a global concurrency of 1,000 (never binding), {tasks} trivial tasks…");
    let global = queue_run(uri, db, &store, tasks, "bench_queue_global", true, Some(1000)).await?;
    shapes.push((shared_global, global));
    eprintln!("queue: 4 agent processes (lab bench-agent), {tasks} trivial tasks…");
    shapes.push((processes, queue_processes_run(uri, db, &store, tasks, "bench_queue_processes", 4).await?));

    // Printed now: a run that fails later (Agenda, the seed) still shows them.
    for (shape, r) in &shapes {
        f.put(format!("queue_{shape}_tasks_per_s"), r.rate);
        f.put(format!("queue_{shape}_commands_per_task"), r.commands_per_task);
        put_breakdown(&mut f, &format!("queue_{shape}"), &r.counts, tasks);
        f.put(format!("queue_{shape}_vs_raw_queue"), r.rate / raw_queue.rate);
    }
    {
        // The cost of a global limit that never binds (issue 15: within 10 %),
        // in a block of its own: shared, global, global, shared, back to back
        // (a load that drifts during the block weighs on both alike), on twice
        // the tasks, so the limit's fixed costs (its slot documents, the
        // first grants, the last releases) weigh as in a run of some length
        // rather than as in a ten-second one.
        let n = tasks.saturating_mul(2);
        eprintln!("queue: shared / global 1,000 / global 1,000 / shared, {n} trivial tasks each…");
        let shared_a = queue_run(uri, db, &store, n, "bench_queue_pair_shared_a", true, None).await?;
        let global_a = queue_run(uri, db, &store, n, "bench_queue_pair_global_a", true, Some(1000)).await?;
        let global_b = queue_run(uri, db, &store, n, "bench_queue_pair_global_b", true, Some(1000)).await?;
        let shared_b = queue_run(uri, db, &store, n, "bench_queue_pair_shared_b", true, None).await?;
        f.put("queue_global_1000_pair_tasks", f64::from(n));
        f.put("queue_global_1000_vs_shared_first_pair", global_a.rate / shared_a.rate);
        f.put("queue_global_1000_vs_shared_second_pair", global_b.rate / shared_b.rate);
        f.put("queue_global_1000_vs_shared", (global_a.rate + global_b.rate) / (shared_a.rate + shared_b.rate));
        let extra = (global_a.commands_per_task + global_b.commands_per_task)
            - (shared_a.commands_per_task + shared_b.commands_per_task);
        f.put("queue_global_1000_extra_commands_per_task", extra / 2.0);
    }

    eprintln!("queue events: one subscriber while 4 agents on one Queue run {tasks} trivial tasks…");
    events::put_figures(&mut f, &store, tasks, "bench_queue_events").await?;

    let picks = size.picks;
    pickup_figures(&mut f, &store, picks).await?;

    if skip.contains("schedule") {
        f.skip(Section::Schedule, "MONGOCOORD_BENCH_SKIP");
    } else {
        let ticks = size.ticks;
        eprintln!("schedule tick lag: 3 mongocoord cron processes, a tick a second, {ticks} ticks…");
        let lag = sorted(crate::tick_lag::measure(&o.mongocoord, uri, db, &store, &o.out, ticks).await?);
        f.put("schedule_tick_lag_ms_p50", pct(&lag, 0.5));
        f.put("schedule_tick_lag_ms_p99", pct(&lag, 0.99));
    }

    eprintln!("memory-store simulation…");
    f.put("sim_steps_per_s", simulate(size.sim_minutes).await?);

    if skip.contains("idle") {
        f.skip(Section::Idle, "MONGOCOORD_BENCH_SKIP");
    } else {
        let window = Duration::from_secs(size.idle_s);
        eprintln!("idle cost: mongocoord agent, elect follower, lock waiter and cron, {window:?} each, side by side…");
        let dir = o.out.parent().unwrap_or(Path::new("."));
        let warm_up = Duration::from_secs(size.idle_warm_up_s);
        idle::put_figures(&mut f, &o.mongocoord, uri, db, dir, warm_up, window).await?;
    }

    match (&o.python, &o.seed_script) {
        _ if skip.contains("seed") => {
            f.skip(Section::Seed, "MONGOCOORD_BENCH_SKIP");
            f.skip(Section::SeedFailover, "MONGOCOORD_BENCH_SKIP");
        }
        (Some(py), Some(script)) => seed_figures(&mut f, uri, db, &o, py, script).await?,
        _ => {
            let why = "no --python and --seed-script (cargo xtask bench gives them: a venv in target/bench)";
            f.skip(Section::Seed, why);
            f.skip(Section::SeedFailover, why);
        }
    }

    // Last of the queue's on the run's server: its 16 processes load a slow
    // server the most.
    scaling::put_figures(&mut f, uri, db, &store, tasks).await?;

    // Agenda last, each setting on a fresh server when we have one: on a slow
    // server its lock queries pile up (see lab/bench/agenda/bench.mjs) and
    // keep the server busy after it stops, which would weigh on whatever ran
    // next, and a server our sections loaded would weigh on Agenda.
    match &o.agenda {
        Some(dir) => {
            let peer = agenda::PeerServer::new(o.peer_server.clone(), uri);
            agenda::put_figures(&mut f, dir, &peer, db, size.agenda).await;
            agenda::put_idle_figures(&mut f, dir, &peer, db, size.idle_s.min(60)).await;
        }
        None => f.skip(
            Section::Agenda,
            "no --agenda harness (cargo xtask bench installs it when node and npm exist; --smoke only uses an installed one)",
        ),
    }

    // Against Agenda at its best setting of the sweep.
    let agenda = f.get("agenda_best_tasks_per_s");
    for (shape, r) in &shapes {
        if let Some(a) = agenda {
            f.put(format!("queue_{shape}_vs_agenda"), r.rate / a);
        }
    }
    // The figure names of earlier runs, where they still mean the same thing.
    if let (Some(per_agent), Some(shared)) = (f.get("queue_per_agent_tasks_per_s"), f.get("queue_shared_tasks_per_s")) {
        f.put("queue_tasks_per_s", per_agent);
        f.put("queue_vs_raw", per_agent / raw_rate);
        f.put("queue_shared_vs_raw", shared / raw_rate);
    }

    let name = std::env::var("MONGOCOORD_BENCH_SERVER_NAME").unwrap_or_else(|_| "uri".into());
    let commit = std::env::var("MONGOCOORD_BENCH_COMMIT").unwrap_or_else(|_| "unknown".into());
    let date = bson::DateTime::now().try_to_rfc3339_string().unwrap_or_default();
    let date = date.get(..10).unwrap_or("unknown");
    let header = [
        ("server", server.as_str()),
        ("server_name", &name),
        ("server_version", &version),
        ("mode", o.mode.name()),
        ("commit", &commit),
        ("agenda_server", if o.peer_server.is_some() { "a fresh server per setting" } else { "the run's server" }),
        ("date", date),
    ];
    f.write(&o.out, &header)?;
    let plot = o.out.with_extension("svg");
    scaling::write_plot(&f, &server, &plot)?;
    eprintln!("wrote {}", plot.display());
    eprintln!("wrote {}", o.out.display());
    match f.check(std::env::var_os("CI").is_some()) {
        Ok(()) => Ok(0),
        Err(e) if o.mode == Mode::Smoke => {
            eprintln!("lab bench --smoke: {e}");
            Ok(1)
        }
        Err(e) => {
            // The summary is written (what was measured stays usable), but a
            // run that lost figures without a reason is not a good run.
            eprintln!("lab bench: {e}");
            Ok(1)
        }
    }
}

/// The seed's Python `mongoelector` on the same server: lock cycles, and
/// election handovers (and, in a full run, failovers) as ours are measured.
async fn seed_figures(
    f: &mut Figures,
    uri: &str,
    db: &str,
    o: &BenchOpts,
    py: &Path,
    script: &Path,
) -> Result<(), String> {
    let size = o.mode.size();
    eprintln!("the seed's Python mongoelector, same server…");
    let cycles = tokio::process::Command::new(py)
        .arg(script)
        .args([uri, db, "lock-cycles", &size.seed_cycles.to_string()])
        .output()
        .await
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&cycles.stdout);
    match text.trim().parse::<f64>() {
        Ok(v) => f.put("seed_lock_cycles_per_s", v),
        Err(_) => f.skip_figure(
            "seed_lock_cycles_per_s",
            format!("seed_bench.py lock-cycles failed: {}", String::from_utf8_lossy(&cycles.stderr).trim()),
        ),
    }
    let seed = |key: &str, file: &Path| {
        let mut c = tokio::process::Command::new(py);
        c.arg(script).args([uri, db, "elect", key, "3", &file.display().to_string()]);
        c
    };
    // The seed replaces a killed leader only after MongoDB's TTL monitor
    // deletes its lock (about once a minute): only full runs kill it.
    let kills = if o.mode == Mode::Full { size.elect_trials } else { 0 };
    let t = election::trials("seed-elect", &o.out, size.elect_trials, kills, None, seed).await?;
    f.put("seed_handover_ms_p50", pct(&sorted(t.handovers_ms), 0.5));
    if kills > 0 {
        f.put("seed_failover_s_p50", pct(&sorted(t.failovers_s), 0.5));
    } else {
        f.skip(Section::SeedFailover, "full runs only: a failover waits for the TTL monitor, about a minute a trial");
    }
    Ok(())
}

/// Commands per task by kind (`PREFIX_cmd_KIND`): where a shape's commands go.
fn put_breakdown(f: &mut Figures, prefix: &str, counts: &Counts, tasks: u32) {
    for (kind, per_task) in counts.per_task(tasks) {
        f.put(format!("{prefix}_cmd_{kind}"), per_task);
    }
    // Times exist for this process's commands only (not the agent processes').
    if !counts.micros.is_empty() {
        f.put(format!("{prefix}_command_ms_per_task"), counts.command_ms_per_task(tasks));
        for (kind, ms) in counts.mean_ms() {
            f.put(format!("{prefix}_ms_{kind}"), ms);
        }
    }
}

/// Store operations per wall second of the five-elector simulation on the
/// memory store under paused time.
async fn simulate(minutes: u64) -> Result<f64, String> {
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let store = MemoryStore::new();
            let electors: Vec<_> = (0..5)
                .map(|_| {
                    mongoelector::Elector::builder(store.client(), "sim")
                        .ttl(Duration::from_secs(3))
                        .report_status(false)
                        .build()
                })
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            for e in &electors {
                e.start().map_err(|e| e.to_string())?;
            }
            let wall = Instant::now();
            let mut rng = fastrand::Rng::with_seed(1);
            let end = tokio::time::Instant::now() + Duration::from_secs(60 * minutes);
            while tokio::time::Instant::now() < end {
                let e = &electors[rng.usize(..electors.len())];
                if rng.u32(..10) == 0 {
                    let _ = e.release().await;
                }
                tokio::time::sleep(Duration::from_millis(rng.u64(100..2000))).await;
            }
            let ops = store.operation_count() as f64;
            for e in &electors {
                e.stop().await;
            }
            Ok(ops / wall.elapsed().as_secs_f64())
        })
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Throughput and commands per completed task of one queue run.
struct QueueRun {
    rate: f64,
    commands_per_task: f64,
    /// The commands by kind over the run.
    counts: Counts,
}

/// Preloads `tasks` trivial tasks for agent `bench` into `coll` (with the
/// queue's indexes), through the uncounted `store`.
async fn preload(store: &MongoStore, tasks: u32, coll: &str) -> Result<Queue<MongoStore>, String> {
    let queue = Queue::new(store.clone(), coll).map_err(|e| e.to_string())?;
    let batch: Vec<NewTask> = (0..tasks).map(|i| NewTask::new("bench", doc! {"i": i64::from(i)})).collect();
    queue.enqueue_all(&batch).await.map_err(|e| e.to_string())?;
    Ok(queue)
}

/// The server's limit for an unbatched queue: one client claims the next task
/// (the agent's filter and sort, one `findAndModify` with a lease and a fence)
/// and completes it with an update conditional on that fence, until none is left.
/// Same documents, claim index and write concern as the agents'.
async fn raw_queue_run(uri: &str, db: &str, store: &MongoStore, tasks: u32, coll: &str) -> Result<QueueRun, String> {
    preload(store, tasks, coll).await?;
    let (counted, commands) = counted_store(uri, db).await?;
    let c = counted.database().collection_with_options::<bson::Document>(
        coll,
        CollectionOptions::builder()
            .write_concern(WriteConcern::builder().w(Acknowledgment::Majority).journal(true).build())
            .read_concern(ReadConcern::majority())
            .build(),
    );
    let now = doc! {"$toLong": "$$NOW"};
    let filter = doc! {
        "agent_name": "bench",
        "ready": true,
        "complete": {"$ne": true},
        "$expr": {"$and": [
            {"$lte": [{"$ifNull": [{"$toLong": "$run_at"}, 0_i64]}, now.clone()]},
            {"$or": [
                {"$eq": [{"$ifNull": ["$lease_owner", null]}, null]},
                {"$lte": [{"$ifNull": [{"$toLong": "$lease_until"}, 0_i64]}, now.clone()]},
            ]},
        ]},
    };
    let claim = vec![doc! {"$set": {
        "lease_owner": "raw",
        "lease_until": {"$add": [now, 30_000_i64]},
        "fence": {"$add": [{"$ifNull": ["$fence", 0_i64]}, 1_i64]},
        "ready": false,
        "claimed": true,
    }}];
    let c0 = commands.snapshot();
    let start = Instant::now();
    let mut completed = 0_u32;
    while let Some(task) = c
        .find_one_and_update(filter.clone(), claim.clone())
        .sort(doc! {"priority": -1, "run_at": 1, "_id": 1})
        .return_document(ReturnDocument::After)
        .await
        .map_err(|e| e.to_string())?
    {
        let id = task.get("_id").cloned().ok_or("claimed task without _id")?;
        let fence = task.get("fence").cloned().ok_or("claimed task without fence")?;
        let done = c
            .update_one(
                doc! {"_id": id, "fence": fence},
                vec![doc! {"$set": {
                    "complete": true,
                    "claimed": false,
                    "lease_owner": null,
                    "lease_until": null,
                    "completed_at": "$$NOW",
                }}],
            )
            .await
            .map_err(|e| e.to_string())?;
        if done.matched_count != 1 {
            return Err("raw queue: a fenced completion matched no task".into());
        }
        completed += 1;
    }
    let rate = f64::from(tasks) / start.elapsed().as_secs_f64();
    let counts = commands.snapshot().since(&c0);
    if completed != tasks {
        return Err(format!("raw queue: {completed} completions for {tasks} tasks"));
    }
    Ok(QueueRun { rate, commands_per_task: counts.total as f64 / f64::from(tasks), counts })
}

/// Idle pickup: one agent idle on a quiet queue of its own (not one the
/// throughput runs filled: on SecantusDB each write costs in proportion to
/// its collection's size), `picks` tasks enqueued 300 ms apart; the time
/// from each enqueue call to its handler's start.
async fn pickup_figures(f: &mut Figures, store: &MongoStore, picks: usize) -> Result<(), String> {
    let queue = Queue::new(store.clone(), "bench_pickup").map_err(|e| e.to_string())?;
    eprintln!("idle pickup latency ({picks} trials)…");
    let picked = Arc::new(Mutex::new(Vec::new()));
    let agent = Agent::builder(store.clone(), "pickup", "bench_pickup")
        .poll_interval(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())?;
    let p2 = picked.clone();
    let epoch = Instant::now();
    let worker = tokio::spawn({
        let agent = agent.clone();
        async move {
            agent
                .work(move |t: Task| {
                    let p2 = p2.clone();
                    async move {
                        let sent = t.data().get_i64("sent_us").unwrap_or_default();
                        let now = i64::try_from(epoch.elapsed().as_micros()).unwrap_or_default();
                        p2.lock().push((now - sent) as f64 / 1e3);
                        Outcome::done()
                    }
                })
                .await
        }
    });
    for _ in 0..picks {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let sent = i64::try_from(epoch.elapsed().as_micros()).unwrap_or_default();
        queue.enqueue(NewTask::new("pickup", doc! {"sent_us": sent})).await.map_err(|e| e.to_string())?;
    }
    let until = Instant::now() + Duration::from_secs(30);
    while picked.lock().len() < picks && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent.shutdown();
    let _ = worker.await;
    let pk = sorted(picked.lock().clone());
    f.put("pickup_ms_p50", pct(&pk, 0.5));
    f.put("pickup_ms_p99", pct(&pk, 0.99));
    Ok(())
}

/// A minimal DistributedLock.MongoDB-style acquire: one `findAndModify` upsert
/// whose single `$set` stage takes the lock when it is free or expired (a `$cond`
/// on `$$NOW` per field: owner, expiry, fence). Released by an untimed update.
/// Same write concern as our lock. Returns the acquire latencies in µs.
async fn minimal_lock_cycles(store: &MongoStore, n: usize) -> Result<Vec<f64>, String> {
    let c = store.database().collection_with_options::<bson::Document>(
        "bench_minimal_lock",
        CollectionOptions::builder()
            .write_concern(WriteConcern::builder().w(Acknowledgment::Majority).journal(true).build())
            .build(),
    );
    let now = doc! {"$toLong": "$$NOW"};
    let free = doc! {"$or": [
        {"$eq": [{"$ifNull": ["$owner", null]}, null]},
        {"$lte": [{"$ifNull": ["$expires_ms", 0_i64]}, now.clone()]},
    ]};
    let acquire = vec![doc! {"$set": {
        "owner": {"$cond": [free.clone(), "bench", "$owner"]},
        "expires_ms": {"$cond": [free.clone(), {"$add": [now, 30_000_i64]}, "$expires_ms"]},
        "fence": {"$cond": [free, {"$add": [{"$ifNull": ["$fence", 0_i64]}, 1_i64]}, "$fence"]},
    }}];
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let got = c
            .find_one_and_update(doc! {"_id": "bench"}, acquire.clone())
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await
            .map_err(|e| e.to_string())?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        if got.as_ref().and_then(|d| d.get_str("owner").ok()) != Some("bench") {
            return Err("minimal lock pipeline: a free lock was not taken".into());
        }
        c.update_one(doc! {"_id": "bench", "owner": "bench"}, doc! {"$set": {"owner": null}})
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(lat)
}

/// Runs `agents` on trivial tasks (each counted in `done`) until `tasks` are
/// done, then shuts them down: the rate from `start`, and the completions
/// the agents counted. Counted in-process: polling the queue's statistics
/// would load the server.
pub(crate) async fn drive(
    agents: &[Agent<MongoStore>],
    done: &Arc<AtomicU64>,
    tasks: u32,
    start: Instant,
    what: &str,
) -> Result<(f64, u64), String> {
    let mut workers = Vec::new();
    for a in agents {
        let (a, done) = (a.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            a.work(move |_t: Task| {
                let done = done.clone();
                async move {
                    done.fetch_add(1, Ordering::Relaxed);
                    Outcome::done()
                }
            })
            .await
        }));
    }
    while done.load(Ordering::Relaxed) < u64::from(tasks) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if start.elapsed() > Duration::from_secs(1800) {
            return Err(format!("{what} benchmark did not finish in 30 minutes"));
        }
    }
    let rate = f64::from(tasks) / start.elapsed().as_secs_f64();
    for a in agents {
        a.shutdown();
    }
    let mut completed = 0;
    for w in workers {
        completed += w.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?.completed;
    }
    Ok((rate, completed))
}

/// 4 agents (concurrency 4 each) in this process process `tasks` trivial tasks
/// from `coll`; with `shared`, the agents are built on one `Queue`
/// (`Agent::on_queue`) and take turns claiming, else each on its own
/// (`Agent::builder`); with `global`, under a global concurrency of that many
/// permits. Commands are counted from the agents' start until they have shut
/// down.
async fn queue_run(
    uri: &str,
    db: &str,
    store: &MongoStore,
    tasks: u32,
    coll: &str,
    shared: bool,
    global: Option<u32>,
) -> Result<QueueRun, String> {
    preload(store, tasks, coll).await?;
    let (counted, commands) = counted_store(uri, db).await?;
    let queue = Queue::new(counted.clone(), coll).map_err(|e| e.to_string())?;
    let done = Arc::new(AtomicU64::new(0));
    let c0 = commands.snapshot();
    let start = Instant::now();
    let agents: Vec<Agent<MongoStore>> = (0..4)
        .map(|_| {
            let b =
                if shared { Agent::on_queue(&queue, "bench") } else { Agent::builder(counted.clone(), "bench", coll) };
            let b = b.concurrency(4).poll_interval(Duration::from_millis(200));
            match global {
                Some(n) => b.global_concurrency(n).build(),
                None => b.build(),
            }
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let (rate, completed) = drive(&agents, &done, tasks, start, "queue").await?;
    let counts = commands.snapshot().since(&c0);
    if completed != u64::from(tasks) {
        return Err(format!("queue benchmark: {completed} completions for {tasks} tasks"));
    }
    Ok(QueueRun { rate, commands_per_task: counts.total as f64 / f64::from(tasks), counts })
}

/// `n` agent processes (`lab bench-agent`, one agent each, concurrency 4) process
/// `tasks` trivial tasks from `coll`. Each connects and builds its agent, says
/// `ready`, starts on `go`, and stops when its stdin closes, reporting the
/// commands it sent from `go` on and when its handler last ran. The clock
/// runs from `go` to the last handler start of any process (on the system
/// clock the processes share), as in-process runs and Agenda's stop at the
/// last handler; a count of completed tasks, polled every 250 ms and not
/// counted, only tells when all are done.
async fn queue_processes_run(
    uri: &str,
    db: &str,
    store: &MongoStore,
    tasks: u32,
    coll: &str,
    n: usize,
) -> Result<QueueRun, String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    preload(store, tasks, coll).await?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut procs = Vec::new();
    for _ in 0..n {
        let mut child = tokio::process::Command::new(&exe)
            .args(["--uri", uri, "--db", db, "bench-agent", "--coll", coll])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start a bench agent: {e}"))?;
        let stdin = child.stdin.take().ok_or("bench agent without stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("bench agent without stdout")?).lines();
        procs.push((child, Some(stdin), stdout));
    }
    for (_, _, out) in &mut procs {
        match tokio::time::timeout(Duration::from_secs(60), out.next_line()).await {
            Ok(Ok(Some(l))) if l == "ready" => {}
            other => return Err(format!("bench agent did not get ready: {other:?}")),
        }
    }
    let c = store.database().collection::<bson::Document>(coll);
    let start = Instant::now();
    let start_ns = unix_ns();
    for (_, stdin, _) in &mut procs {
        if let Some(s) = stdin.as_mut() {
            s.write_all(b"go\n").await.map_err(|e| e.to_string())?;
            s.flush().await.map_err(|e| e.to_string())?;
        }
    }
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let n = c.count_documents(doc! {"agent_name": "bench", "complete": true}).await.map_err(|e| e.to_string())?;
        if n >= u64::from(tasks) {
            break;
        }
        if start.elapsed() > Duration::from_secs(1800) {
            return Err("queue processes did not finish in 30 minutes".into());
        }
    }
    let (mut counts, mut completed, mut last_ns) = (Counts::default(), 0_u64, 0_u128);
    for (_, stdin, _) in &mut procs {
        drop(stdin.take());
    }
    for (child, _, out) in &mut procs {
        let line = tokio::time::timeout(Duration::from_secs(60), out.next_line())
            .await
            .map_err(|_| "bench agent did not stop within 60 s".to_owned())?
            .map_err(|e| e.to_string())?
            .ok_or("bench agent ended without a report")?;
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next(), words.next(), words.next(), words.next()) {
            (Some("commands"), Some(c), Some("completed"), Some(d), Some("last_ns"), Some(t)) => {
                last_ns = last_ns.max(t.parse::<u128>().map_err(|e| format!("bench agent reported {line:?}: {e}"))?);
                let by_kind = Counts::parse_words(words)?;
                if by_kind.total != c.parse::<u64>().map_err(|e| e.to_string())? {
                    return Err(format!("bench agent reported {line:?}: the breakdown does not add up"));
                }
                counts.add(&by_kind);
                completed += d.parse::<u64>().map_err(|e| e.to_string())?;
            }
            _ => return Err(format!("bench agent reported {line:?}")),
        }
        let _ = child.wait().await;
    }
    if completed != u64::from(tasks) {
        return Err(format!("queue processes: {completed} completions for {tasks} tasks"));
    }
    if last_ns <= start_ns {
        return Err("queue processes: no handler ran after go".into());
    }
    let rate = f64::from(tasks) / ((last_ns - start_ns) as f64 / 1e9);
    Ok(QueueRun { rate, commands_per_task: counts.total as f64 / f64::from(tasks), counts })
}

/// Drops the database `db` and the bench's others (`db_*`: the idle roles',
/// Agenda's), so that a run against a server an earlier run used starts as
/// on a fresh one: the queue runs count the completed tasks they find.
async fn reset(store: &MongoStore, db: &str) -> Result<(), String> {
    let client = store.database().client().clone();
    let names = client.list_database_names().await.map_err(|e| format!("cannot list the databases: {e}"))?;
    let prefix = format!("{db}_");
    for name in names.iter().filter(|n| *n == db || n.starts_with(&prefix)) {
        eprintln!("dropping the database {name} (an earlier run's)");
        client.database(name).drop().await.map_err(|e| format!("cannot drop the database {name}: {e}"))?;
    }
    Ok(())
}

/// The system clock in nanoseconds since the Unix epoch: what processes on
/// one machine compare times on.
fn unix_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// `lab bench-agent`: one agent (concurrency 4, a trivial handler) on `coll`
/// for the orchestrator in [`queue_processes_run`]. Prints `ready`, starts
/// on a `go` line, stops when stdin closes, then prints
/// `commands C completed N last_ns T` (commands sent since `go`, and when its
/// handler last ran, in nanoseconds since the Unix epoch) and the commands
/// by kind.
pub(crate) async fn bench_agent(uri: &str, db: &str, coll: &str) -> Result<u8, String> {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let (store, commands) = counted_store(uri, db).await?;
    let agent = Agent::builder(store, "bench", coll)
        .concurrency(4)
        .poll_interval(Duration::from_millis(200))
        .build()
        .map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    println!("ready");
    match lines.next_line().await.map_err(|e| e.to_string())? {
        Some(l) if l.trim() == "go" => {}
        other => return Err(format!("bench-agent: expected go, got {other:?}")),
    }
    let c0 = commands.snapshot();
    let last = Arc::new(parking_lot::Mutex::new(0_u128));
    let worker = tokio::spawn({
        let (agent, last) = (agent.clone(), last.clone());
        async move {
            agent
                .work(move |_t: Task| {
                    let last = last.clone();
                    async move {
                        let now = unix_ns();
                        let mut l = last.lock();
                        *l = (*l).max(now);
                        Outcome::done()
                    }
                })
                .await
        }
    });
    while lines.next_line().await.map_err(|e| e.to_string())?.is_some() {}
    agent.shutdown();
    let log = worker.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    let used = commands.snapshot().since(&c0);
    let last_ns = *last.lock();
    println!("commands {} completed {} last_ns {last_ns} {}", used.total, log.completed, used.words());
    Ok(0)
}
