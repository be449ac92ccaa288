//! `lab bench`: the figures behind the README's Performance section,
//! measured on one server in one run, side by side with the raw driver and the
//! Python `mongoelector` (the seed's own implementation). `cargo xtask bench`
//! provisions the server and calls it. Correctness checks inside (one holder,
//! every task done) fail loudly; numbers never fail anything.
//!
//! This file is the run: its sections in order. One concern per child
//! module: `size.rs` the modes and their sizes, `figures.rs` the promised
//! figures, `stats.rs` percentiles; the sections `lock.rs`, `election.rs`
//! (and the seed's, `seed.rs`), `shapes.rs` (the queue shapes, each run in
//! `queue.rs`, `raw_queue.rs` or `processes.rs`), `events.rs`, `pickup.rs`,
//! `sim.rs`, `idle.rs`, `scaling.rs`, `agenda.rs`; `counted.rs` counts
//! commands; `summary.rs` ends the run; `table.rs` writes the README's table.

use std::path::Path;
use std::time::Duration;

use bson::doc;
use store_mongo::MongoStore;

mod agenda;
mod counted;
mod election;
mod events;
mod figures;
mod idle;
mod lock;
mod pickup;
mod processes;
mod queue;
mod raw_queue;
pub(crate) mod report;
mod scaling;
mod seed;
mod shapes;
mod sim;
mod size;
mod stats;
mod summary;
pub(crate) mod table;

use figures::{Figures, Section};
use stats::{pct, sorted};

pub(crate) use processes::bench_agent;
pub(crate) use size::{BenchOpts, Mode};

use crate::error::LabError;

/// Runs the benchmark against `store` (database `db` at `uri`).
pub(crate) async fn run(uri: &str, db: &str, store: MongoStore, o: BenchOpts) -> Result<u8, LabError> {
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

    lock::put_figures(&mut f, &store, size.calls, size.handovers).await?;

    let skip = std::env::var("MONGOCOORD_BENCH_SKIP").unwrap_or_default();
    if skip.contains("elector") {
        f.skip(Section::Elector, "MONGOCOORD_BENCH_SKIP");
    } else {
        election::put_figures(&mut f, &o.mongocoord, uri, db, &store, &o.out, size.elect_trials).await?;
    }

    // The seed's lock and elector next to ours, on a server as fresh (its
    // lock's cycles after the whole queue's load would be timed on a slower
    // server than ours were).
    match (&o.python, &o.seed_script) {
        _ if skip.contains("seed") => {
            f.skip(Section::Seed, "MONGOCOORD_BENCH_SKIP");
            f.skip(Section::SeedFailover, "MONGOCOORD_BENCH_SKIP");
        }
        (Some(py), Some(script)) => seed::put_figures(&mut f, uri, db, &o, py, script).await?,
        _ => {
            let why = "no --python and --seed-script (cargo xtask bench gives them: a venv in target/bench)";
            f.skip(Section::Seed, why);
            f.skip(Section::SeedFailover, why);
        }
    }

    // The queue, its shapes side by side with the raw loop (Agenda's come
    // last, below).
    let tasks = size.tasks;
    shapes::put_figures(&mut f, uri, db, &store, tasks).await?;

    eprintln!("queue events: one subscriber while 4 agents on one Queue run {tasks} trivial tasks…");
    events::put_figures(&mut f, &store, tasks, "bench_queue_events").await?;

    pickup::put_figures(&mut f, &store, size.picks).await?;

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
    f.put("sim_steps_per_s", sim::simulate(size.sim_minutes).await?);

    if skip.contains("idle") {
        f.skip(Section::Idle, "MONGOCOORD_BENCH_SKIP");
    } else {
        let window = Duration::from_secs(size.idle_s);
        eprintln!("idle cost: mongocoord agent, elect follower, lock waiter and cron, {window:?} each, side by side…");
        let dir = o.out.parent().unwrap_or(Path::new("."));
        let warm_up = Duration::from_secs(size.idle_warm_up_s);
        let peer = agenda::PeerServer::new(o.peer_server.clone(), uri);
        idle::put_figures(&mut f, &o.mongocoord, &peer, db, dir, warm_up, window).await?;
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
            agenda::put_idle_figures(&mut f, dir, &peer, db, size.idle_warm_up_s, size.idle_s.min(60)).await;
        }
        None => f.skip(
            Section::Agenda,
            "no --agenda harness (cargo xtask bench installs it when node and npm exist; --smoke only uses an installed one)",
        ),
    }

    summary::finish(f, &o, &server, &version)
}

/// Drops the database `db` and the bench's others (`db_*`: the idle roles',
/// Agenda's), so that a run against a server an earlier run used starts as
/// on a fresh one: the queue runs count the completed tasks they find.
async fn reset(store: &MongoStore, db: &str) -> Result<(), LabError> {
    let client = store.database().client().clone();
    let names =
        client.list_database_names().await.map_err(|e| LabError::from(e).context("cannot list the databases"))?;
    let prefix = format!("{db}_");
    for name in names.iter().filter(|n| *n == db || n.starts_with(&prefix)) {
        eprintln!("dropping the database {name} (an earlier run's)");
        client
            .database(name)
            .drop()
            .await
            .map_err(|e| LabError::from(e).context(format!("cannot drop the database {name}")))?;
    }
    Ok(())
}
