//! The lab: benchmarks and the chaos run, kept out of the product binary (as
//! sqlx keeps its CLI, test and bench crates apart from its libraries).
//! `cargo xtask bench` and `cargo xtask chaos` provision a server and drive it.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod bench;
mod chaos;
mod cron;
mod error;
mod server;
mod signal;
mod tick_lag;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use store_mongo::{ConnectionConfig, MongoStore};

use error::{LabError, EXIT_FAILED};

#[derive(Debug, Parser)]
#[command(name = "lab", about = "mongocoord's benchmarks and chaos run (driven by cargo xtask)")]
struct Cli {
    /// MongoDB URI (default: $MONGODB_URI, else mongodb://$MONGO_HOST).
    #[arg(long, global = true)]
    uri: Option<String>,
    /// Database (default: $MONGO_DB, else "mongocoord").
    #[arg(long, global = true)]
    db: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Measures throughput and latency against the configured server.
    Bench {
        /// A short run (figures that compare within the run).
        #[arg(long, conflicts_with = "smoke")]
        quick: bool,
        /// Every section at a tiny size, then a check that every promised
        /// figure is present and finite or skipped with a reason (exit status
        /// 1 if not); under `CI`, only the seed's failover may be
        /// skipped. What `cargo xtask ci` runs.
        #[arg(long)]
        smoke: bool,
        /// Where to write the JSON summary.
        #[arg(long, default_value = "target/bench/summary.json")]
        out: PathBuf,
        /// The `mongocoord` binary, whose `elect` and `cron` runners the election
        /// and schedule figures measure.
        #[arg(long)]
        mongocoord: PathBuf,
        /// A Python with `mongoelector` installed, to measure the Python implementation.
        #[arg(long)]
        python: Option<PathBuf>,
        /// The Python driver script (`lab/bench/seed_bench.py`).
        #[arg(long)]
        seed_script: Option<PathBuf>,
        /// The installed Agenda harness: a directory with `bench.mjs` and its
        /// `node_modules` (run as `node DIR/bench.mjs DB N PICKS`, the URI in `MONGODB_URI`).
        #[arg(long)]
        agenda: Option<PathBuf>,
        /// A server binary (`secantusd-py` or `secantusd-rs`) to start fresh
        /// for each of Agenda's settings, so that no setting runs on a server
        /// our sections, or another setting, left busy, and for each idle
        /// role, so that no role's writes wake another's change stream;
        /// without it both run on the `--uri` server.
        #[arg(long)]
        fresh_server_bin: Option<PathBuf>,
        /// Start those fresh servers in memory (`secantusd-py`), not on disk
        /// under the `--out` directory.
        #[arg(long, requires = "fresh_server_bin")]
        fresh_server_in_memory: bool,
        /// Tasks per queue run (ours, the raw loop's and Agenda's alike), in
        /// place of the mode's (20, 400 with `--quick`, else 2,000).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        tasks: Option<u32>,
    },
    /// Rewrites the README's Performance table (between its markers) from
    /// bench summaries, one column each.
    BenchTable {
        /// The README to rewrite.
        #[arg(long, default_value = "README.md")]
        readme: PathBuf,
        /// The summaries (`target/bench/summary-<server>.json`), in column order.
        #[arg(required = true)]
        summaries: Vec<PathBuf>,
    },
    /// A bench report: every figure of each summary side by side, the
    /// change from the first to each other, and the targets checked.
    BenchReport {
        /// Where to write it (Markdown).
        #[arg(long)]
        out: PathBuf,
        /// The summaries, the first being the one the others are compared to.
        #[arg(required = true)]
        summaries: Vec<PathBuf>,
    },
    /// One queue agent process of `lab bench` (started by it): prints `ready`,
    /// works on a `go` line, stops when stdin closes and prints its command count.
    #[command(hide = true)]
    BenchAgent {
        /// The queue's collection.
        #[arg(long)]
        coll: String,
    },
    /// Chaos run: worker processes lock, lead and process tasks, and (with
    /// --mongocoord) `mongocoord cron` processes keep a schedule, while they are
    /// killed, paused and restarted, and the server is restarted; then checks the
    /// recorded history. Writes `DIR/summary.json`; exit status 1 on a violation.
    Chaos {
        /// How long to inject faults, in minutes.
        #[arg(long, default_value_t = 1.0)]
        minutes: f64,
        /// Seed of the fault schedule.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Worker processes.
        #[arg(long, default_value_t = 4)]
        workers: usize,
        /// Where logs and the summary go.
        #[arg(long, default_value = "target/chaos")]
        dir: PathBuf,
        /// A `secantusd-py` to run (and kill and restart) the server with on-disk
        /// storage in DIR/data; without it, --uri / MONGODB_URI is used and the
        /// server is not restarted.
        #[arg(long)]
        server_bin: Option<PathBuf>,
        /// The `mongocoord` binary: with it, forking `mongocoord lock` runners
        /// (whose grandchildren write a fenced ledger) are killed too.
        #[arg(long)]
        mongocoord: Option<PathBuf>,
        /// Forking runners (with --mongocoord).
        #[arg(long, default_value_t = 2)]
        fork_workers: usize,
        /// Run only this scenario (`cron`: three `mongocoord cron` processes,
        /// exactly one run per tick across SIGKILLs; needs --mongocoord).
        #[arg(long, value_enum)]
        only: Option<chaos::Scenario>,
    },
    /// A ledger writer, the grandchild of a forking runner (started by `lab chaos`).
    #[command(hide = true)]
    LedgerWriter {
        /// The writer's append-only log.
        #[arg(long)]
        log: PathBuf,
        /// The runner's fence.
        #[arg(long)]
        fence: u64,
    },
    /// One chaos worker process (started by `lab chaos`).
    #[command(hide = true)]
    ChaosWorker {
        /// The worker's append-only log.
        #[arg(long)]
        log: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .try_init();
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lab: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        // A signal, or the end of the process that started this one (an
        // xtask killed by a signal sent to it alone), drops the run: the
        // servers and processes it started stop with it (each is killed on
        // drop), and no run goes on unseen to write its summary.
        let result = tokio::select! {
            result = run(cli) => result,
            why = stopped() => Err(LabError::Stopped(why)),
        };
        CLIENTS.close().await;
        result
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("lab: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// Resolves on SIGINT, SIGTERM or SIGHUP, or once the process that started
/// this one has gone (this one is given to another parent): what stopped it.
async fn stopped() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let parent = std::os::unix::process::parent_id();
    let orphaned = async move {
        while std::os::unix::process::parent_id() == parent {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    };
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) =
        (signal(SignalKind::interrupt()), signal(SignalKind::terminate()), signal(SignalKind::hangup()))
    else {
        orphaned.await;
        return "its parent process ended";
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
        () = orphaned => "its parent process ended",
    }
}

fn connection(uri: Option<&str>, db: Option<&str>) -> Result<ConnectionConfig, LabError> {
    Ok(ConnectionConfig::resolve(uri, db, |k| std::env::var(k).ok())?)
}

async fn connect(c: &ConnectionConfig) -> Result<MongoStore, LabError> {
    let store = c.connect().await.map_err(|source| LabError::Connect { target: c.to_string(), source })?;
    CLIENTS.keep_store(&store);
    Ok(store)
}

/// Every client this process made, shut down before its runtime ends
/// (see [`store_mongo::Clients`]): a `bench-agent` or chaos worker returns
/// with tasks still holding its store.
pub(crate) static CLIENTS: store_mongo::Clients = store_mongo::Clients::new();

async fn run(cli: Cli) -> Result<u8, LabError> {
    let (uri, db) = (cli.uri.as_deref(), cli.db.as_deref());
    match cli.cmd {
        Cmd::Bench {
            quick,
            smoke,
            out,
            mongocoord,
            python,
            seed_script,
            agenda,
            fresh_server_bin,
            fresh_server_in_memory,
            tasks,
        } => {
            let mode = match (smoke, quick) {
                (true, _) => bench::Mode::Smoke,
                (false, true) => bench::Mode::Quick,
                (false, false) => bench::Mode::Full,
            };
            let c = connection(uri, db)?;
            let store = connect(&c).await?;
            let peer_server = fresh_server_bin.map(|bin| server::ServerSpec {
                bin,
                storage: if fresh_server_in_memory {
                    server::Storage::Memory
                } else {
                    server::Storage::Dir(out.parent().unwrap_or(std::path::Path::new(".")).to_owned())
                },
            });
            let opts = bench::BenchOpts { mode, out, mongocoord, python, seed_script, agenda, peer_server, tasks };
            bench::run(c.uri(), c.database(), store, opts).await
        }
        Cmd::BenchTable { readme, summaries } => {
            let paths: Vec<&std::path::Path> = summaries.iter().map(PathBuf::as_path).collect();
            bench::table::rewrite(&readme, &paths)?;
            eprintln!("rewrote the table in {}", readme.display());
            Ok(0)
        }
        Cmd::BenchReport { out, summaries } => {
            let paths: Vec<&std::path::Path> = summaries.iter().map(PathBuf::as_path).collect();
            bench::report::write(&out, &paths)?;
            eprintln!("wrote {}", out.display());
            Ok(0)
        }
        Cmd::BenchAgent { coll } => {
            let c = connection(uri, db)?;
            bench::bench_agent(c.uri(), c.database(), &coll).await
        }
        Cmd::Chaos { minutes, seed, workers, dir, server_bin, mongocoord, fork_workers, only } => {
            if !minutes.is_finite() || minutes <= 0.0 || minutes > 7.0 * 24.0 * 60.0 {
                return Err(LabError::invalid(format!(
                    "--minutes must be a positive number of minutes up to a week, not {minutes}"
                )));
            }
            let duration = Duration::try_from_secs_f64(minutes * 60.0)
                .map_err(|e| LabError::invalid(format!("--minutes {minutes}: {e}")))?;
            let u = connection(uri, db).ok().map(|c| c.uri().to_owned());
            let d = db.map_or_else(|| "mongocoord_chaos".to_owned(), str::to_owned);
            let o = chaos::ChaosOpts { duration, seed, dir, server_bin, workers, mongocoord, fork_workers, only };
            chaos::run(u, &d, o).await
        }
        Cmd::LedgerWriter { log, fence } => {
            let c = connection(uri, db)?;
            chaos::ledger_writer(c.uri(), c.database(), &log, fence).await
        }
        Cmd::ChaosWorker { log } => {
            let c = connection(uri, db)?;
            chaos::worker(c.uri(), c.database(), &log).await
        }
    }
}
