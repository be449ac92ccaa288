//! The `mongocoord` command-line tool: a demo of the whole toolkit, Unix-style
//! runners (`lock`, `elect`, `agent`) for shell scripts and other languages, and
//! operator views (`locks`, `leaders`, `tasks`, `enqueue`, `requeue`, `cancel`, `delete`, `pause`, `resume`, `watch`,
//! `schedules`, `schedule`, `dashboard`).
//!
//! Connection: `--uri`, else `MONGODB_URI`, else `MONGO_HOST` (+ `MONGO_DB`), as
//! the original `mongo_agent` read it. Passwords are never printed.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod args;
mod connection;
mod cron;
mod dashboard;
mod data;
mod demo;
mod error;
mod events;
mod exposition;
mod queue_ops;
mod runners;
mod schedules;
mod supervise;
mod telemetry;
mod terminal;
mod views;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::connection::{close_clients, connect, resolve_connection};
use crate::error::CliError;

#[derive(Debug, Parser)]
#[command(name = "mongocoord", version, about = "Locks, leader election and task agents on MongoDB")]
struct Cli {
    /// MongoDB URI (default: $MONGODB_URI, else mongodb://$MONGO_HOST). A
    /// command line is readable by every user of the host (/proc/PID/cmdline):
    /// give a URI with a password through $MONGODB_URI or --uri-file instead.
    #[arg(long, global = true, conflicts_with = "uri_file")]
    uri: Option<String>,
    /// Read the MongoDB URI from this file (its first line), so that no
    /// password is on the command line.
    #[arg(long, global = true, value_name = "PATH")]
    uri_file: Option<std::path::PathBuf>,
    /// Database (default: $MONGO_DB, else "mongocoord").
    #[arg(long, global = true)]
    db: Option<String>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,
    /// Log what happens (also RUST_LOG).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Runs a small cluster in one process: 3 electors, a contended lock and a
    /// two-stage pipeline of agents, with crashes and restarts; checks its own
    /// invariants at the end. In memory unless a URI is given.
    Demo {
        /// How long to run the chaos part.
        #[arg(long, default_value_t = 15)]
        seconds: u64,
        /// Tasks fed into the pipeline.
        #[arg(long, default_value_t = 300)]
        tasks: u32,
        /// Use the in-memory store even if a URI is configured.
        #[arg(long)]
        memory: bool,
    },
    /// Acquires a lock, runs CMD while holding it (auto-renewed, its fence in
    /// $MONGOCOORD_FENCE), releases it once CMD and every process it started are
    /// gone. If the lock is at risk or lost, they are stopped (SIGTERM, SIGKILL
    /// before the lease can lapse) and the exit status is 75.
    Lock {
        /// The lock's key.
        key: String,
        /// Lease length in seconds.
        #[arg(long, default_value_t = 30.0)]
        ttl: f64,
        /// Give up after this many seconds (exit status 74).
        #[arg(long)]
        timeout: Option<f64>,
        /// The lock collection.
        #[arg(long, default_value = mongolock::DEFAULT_COLLECTION)]
        collection: String,
        #[command(flatten)]
        command: args::Command,
    },
    /// Campaigns for leadership of KEY; while leader runs CMD (the term's fence in
    /// $MONGOCOORD_FENCE); on loss stops CMD's whole process tree and campaigns
    /// again; on SIGTERM or SIGINT stops it and then releases leadership at once.
    Elect {
        /// The election key.
        key: String,
        /// Lease length in seconds.
        #[arg(long, default_value_t = 15.0)]
        ttl: f64,
        #[command(flatten)]
        command: args::Command,
    },
    /// A language-agnostic agent: for each claimed task runs CMD with the task as JSON on stdin.
    /// Exit 0 completes it (a JSON object on stdout is merged in; its "follow_ups" array enqueues
    /// tasks, each with an "agent_name", and a "group_key" to put it in a group); non-zero fails it.
    Agent {
        /// The agent name (tasks' `agent_name`).
        name: String,
        /// The queue collection.
        #[arg(long)]
        queue: String,
        /// Tasks in flight at once.
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// Tasks claimed ahead of free slots, at most, while commands run
        /// short (under 100 ms on average) and many tasks are ready (default:
        /// twice the concurrency; 0 turns it off; at most 1,000).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(..=1000))]
        prefetch: Option<u16>,
        /// Attempts before a task fails for good.
        #[arg(long, default_value_t = 5)]
        max_attempts: u32,
        /// Claim lease length in seconds (renewed while CMD runs); `--lease` is an alias.
        #[arg(long = "ttl", alias = "lease", value_name = "TTL", default_value_t = 60.0)]
        lease: f64,
        /// Stop after this many tasks.
        #[arg(long)]
        max_tasks: Option<u64>,
        /// Seconds one run of a task's command may take (a task's own, from
        /// `enqueue --timeout`, comes first): then its process tree gets
        /// SIGTERM, SIGKILL after --grace, and the attempt fails with "timed
        /// out after …", tried again up to --max-attempts
        #[arg(long, value_name = "SECS")]
        timeout: Option<f64>,
        #[command(flatten)]
        limits: args::Limits,
        #[command(flatten)]
        command: args::Command,
    },
    /// A distributed cron: runs CMD once per tick of schedule NAME across every
    /// machine that runs the same line, with no leader (the task as JSON on
    /// stdin; $MONGOCOORD_TICK is the tick's instant in epoch ms, server clock).
    /// The schedule is upserted by name (a changed line makes a new version).
    /// CMD runs as `agent` runs it: its process tree is stopped before the
    /// claim can lapse, and on SIGTERM/SIGINT.
    Cron(cron::CronArgs),
    /// Lock holders, fences and expiry on the server clock.
    Locks {
        /// The lock collection.
        #[arg(long, default_value = mongolock::DEFAULT_COLLECTION)]
        collection: String,
    },
    /// Per election: leader, since when, and the nodes that reported recently.
    Leaders {
        /// The election lease collection.
        #[arg(long, default_value = mongoelector::DEFAULT_COLLECTION)]
        collection: String,
        /// The node status collection.
        #[arg(long, default_value = mongoelector::DEFAULT_STATUS_COLLECTION)]
        status_collection: String,
    },
    /// Task counts by agent and state (and how many timed out on their
    /// latest attempt); with --list, the tasks themselves.
    Tasks {
        /// The queue collection.
        #[arg(long)]
        queue: String,
        /// Only this agent.
        #[arg(long)]
        agent: Option<String>,
        /// List tasks (matching --filter) instead of counting.
        #[arg(long)]
        list: bool,
        /// List the tasks that failed for good (matching --filter), the
        /// latest first, with their last error and, when their last attempt
        /// timed out, which and after how long; `requeue` revives them.
        #[arg(long, conflicts_with = "list")]
        failed: bool,
        /// With --list: only the tasks of this schedule's ticks.
        #[arg(long, requires = "list")]
        schedule: Option<String>,
        /// With --list or --failed: an equality filter as a JSON object.
        #[arg(long)]
        filter: Option<String>,
        /// At most this many listed tasks (at least 1).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
    },
    /// Enqueues a task from a JSON object.
    Enqueue {
        /// The queue collection.
        #[arg(long)]
        queue: String,
        /// The agent that takes it.
        #[arg(long)]
        agent: String,
        /// The task's fields as a JSON object.
        data: String,
        /// Higher runs first.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i64,
        /// Not before this many seconds from now.
        #[arg(long)]
        delay: Option<f64>,
        /// Enqueue at most one task per key.
        #[arg(long)]
        dedupe_key: Option<String>,
        /// The dedupe key blocks another task with it only until this task
        /// has ended (by default, for as long as the task's document exists)
        #[arg(long, requires = "dedupe_key", conflicts_with = "dedupe_for")]
        dedupe_until_ended: bool,
        /// The dedupe key blocks another task with it for this many seconds
        /// after the enqueue, ended or not
        #[arg(long, value_name = "SECS", requires = "dedupe_key")]
        dedupe_for: Option<f64>,
        /// Debounce by the dedupe key: start this many seconds after the
        /// latest enqueue with the key. While its task has never been
        /// claimed, a later --debounce enqueue with the key replaces its data
        /// and pushes its start (prints "debounced" and its id); once claimed
        /// or ended, a new task is enqueued. A task of another scope or agent
        /// still holding the key fails the enqueue (exit 2): its data would
        /// not run
        #[arg(long, value_name = "SECS", requires = "dedupe_key", conflicts_with_all = ["dedupe_for", "dedupe_until_ended", "id"])]
        debounce: Option<f64>,
        /// An explicit id.
        #[arg(long)]
        id: Option<String>,
        /// Seconds one run of it may take, whatever its agent's --timeout
        #[arg(long, value_name = "SECS")]
        timeout: Option<f64>,
        /// Put the task in group KEY: agents started with --group-concurrency N run at most N
        /// of the group's tasks at once, in enqueue order (debounced: its burst's first's place)
        #[arg(long, value_name = "KEY")]
        group: Option<String>,
        /// Wait until the task has ended, then print it as JSON (`completed`,
        /// `error`, `result`: the task's document): exit status 0 if it
        /// completed, 1 if it failed for good or was cancelled, 74 if
        /// --wait-timeout passed first
        #[arg(long)]
        wait: bool,
        /// Give up waiting after this many seconds (with --wait)
        #[arg(long, value_name = "SECS", requires = "wait")]
        wait_timeout: Option<f64>,
    },
    /// Makes failed or lapsed tasks ready again.
    Requeue {
        /// The queue collection.
        #[arg(long)]
        queue: String,
        /// Equality filter as a JSON object (e.g. '{"agent_name": "resize"}').
        #[arg(long, default_value = "{}")]
        filter: String,
        /// Only list what would be requeued.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Cancels tasks that have not ended (a running one's agent loses its claim).
    Cancel {
        #[command(flatten)]
        which: queue_ops::Selection,
    },
    /// Deletes ended tasks (with --force, any task).
    Delete {
        #[command(flatten)]
        which: queue_ops::Selection,
        /// Delete tasks that have not ended too (their agents' outcomes are rejected).
        #[arg(long)]
        force: bool,
    },
    /// Stops every agent of this name on the queue from claiming (running tasks finish).
    Pause {
        /// The queue collection.
        #[arg(long)]
        queue: String,
        /// The agent name.
        #[arg(long)]
        agent: String,
    },
    /// Lets agents of this name on the queue claim again.
    Resume {
        /// The queue collection.
        #[arg(long)]
        queue: String,
        /// The agent name.
        #[arg(long)]
        agent: String,
    },
    /// A queue's schedules: spec, zone, next tick, last tick and how its task
    /// went, paused.
    Schedules {
        /// The queue collection (default: `cron`'s).
        #[arg(long, default_value = crate::cron::DEFAULT_QUEUE)]
        queue: String,
        /// The schedules collection (default: `<queue>_schedules`).
        #[arg(long)]
        collection: Option<String>,
    },
    /// Pauses, resumes or deletes a schedule (exit status 1 if there is none).
    Schedule {
        /// What to do.
        #[arg(value_enum)]
        action: schedules::Action,
        /// The schedule's name.
        name: String,
        /// The queue collection (default: `cron`'s).
        #[arg(long, default_value = crate::cron::DEFAULT_QUEUE)]
        queue: String,
        /// The schedules collection (default: `<queue>_schedules`).
        #[arg(long)]
        collection: Option<String>,
    },
    /// The supervisor of a lock/elect/agent/cron command (started by those runners):
    /// runs CMD in its own process group and kills its whole tree when the
    /// runner dies.
    #[command(hide = true)]
    Supervise {
        /// The runner's pid.
        #[arg(long)]
        parent: i32,
        /// Milliseconds between SIGTERM and SIGKILL.
        #[arg(long)]
        grace_ms: u64,
        /// An inherited pipe on which the runner sends the word to start CMD,
        /// then the lease's deadline after each renewal.
        #[arg(long)]
        control_fd: Option<i32>,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// A live view of locks and leaders; with --queue, the queue's task
    /// events as they happen (enqueued, claimed, progress, completed,
    /// timed_out, retrying, failed, lapsed, recovered, cancelled, waiting,
    /// woken, requeued, deleted), one line each, or NDJSON with --json.
    Watch {
        /// The queue whose task events to print.
        #[arg(long)]
        queue: Option<String>,
        /// With --queue: only this agent name's tasks.
        #[arg(long, requires = "queue")]
        agent: Option<String>,
        /// Refresh interval in seconds; with --queue, how often a server
        /// without change streams is polled.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many refreshes (with --queue: events).
        #[arg(long)]
        count: Option<u64>,
    },
    /// A live web view of elections, locks, queues and schedules, with
    /// requeue and enqueue (behind a token) and Prometheus metrics at /metrics.
    Dashboard {
        /// The address to serve on (loopback by default).
        #[arg(long, default_value = "127.0.0.1:8080")]
        bind: String,
        /// No actions: only views and metrics.
        #[arg(long)]
        read_only: bool,
        /// A file holding the token that actions need (default: a random
        /// one, printed at start); only its owner may read it (chmod 600).
        #[arg(long)]
        token_file: Option<std::path::PathBuf>,
        /// Reads (pages, JSON, /events, /metrics) need the token too; always
        /// so when --bind is not a loopback address.
        #[arg(long)]
        auth_reads: bool,
        /// Where browsers reach the dashboard when a proxy (TLS, say) stands
        /// in front of it, e.g. https://dash.example.com: its origin passes the
        /// CSRF check and its host the Host check.
        #[arg(long)]
        public_url: Option<String>,
        /// A queue collection to show (repeatable).
        #[arg(long)]
        queue: Vec<String>,
        /// The lock collection.
        #[arg(long, default_value = mongolock::DEFAULT_COLLECTION)]
        lock_collection: String,
        /// The election lease collection.
        #[arg(long, default_value = mongoelector::DEFAULT_COLLECTION)]
        election_collection: String,
        /// The node status collection.
        #[arg(long, default_value = mongoelector::DEFAULT_STATUS_COLLECTION)]
        status_collection: String,
    },
}

/// The log filter when `RUST_LOG` is not set: `warn` (which records the
/// dashboard's audit log, `dashboard::audit`), or `info` with `--verbose`.
pub(crate) fn default_log_filter(verbose: bool) -> &'static str {
    if verbose {
        "info"
    } else {
        "warn"
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let supervising = matches!(cli.cmd, Cmd::Supervise { .. });
    if supervising {
        // On the main thread, whose name is the process's, before any other.
        if let Err(e) = supervise::before_supervisor_runtime() {
            return fail("mongocoord supervise", &e);
        }
    }
    let filter = default_log_filter(cli.verbose);
    // The supervisor exports nothing: its runner's spans tell its story.
    let telemetry = match telemetry::init(filter, !supervising) {
        Ok(t) => t,
        Err(e) => return fail("mongocoord", &e),
    };
    // The supervisor reads no document and waits, mostly: one thread, which
    // starts sooner and costs an idle follower less. Elsewhere, a large stack
    // for the workers: decoding a document is recursive, and a foreign
    // document nested deep (MongoDB allows 100 levels) must not overflow the
    // default 2 MiB of a debug build.
    let mut builder = if supervising {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(2).thread_stack_size(16 << 20);
        b
    };
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail("mongocoord", &CliError::Runtime(e)),
    };
    let result = rt.block_on(async {
        let result = telemetry::in_handed_trace(run(cli)).await;
        close_clients().await;
        result
    });
    telemetry.shutdown();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => fail("mongocoord", &e),
    }
}

/// Reports `e` on stderr as one line, `who: message`, and gives its exit
/// status ([`CliError::exit_code`]). The message may quote the database (a
/// holder, a task id, a document's field): it is made [`terminal::safe`].
fn fail(who: &str, e: &CliError) -> ExitCode {
    eprintln!("{who}: {}", terminal::safe(&e.to_string()));
    ExitCode::from(e.exit_code())
}

impl Cmd {
    /// The runners' `--metrics-bind`.
    fn metrics_bind(&self) -> Option<&str> {
        match self {
            Cmd::Lock { command, .. } | Cmd::Elect { command, .. } | Cmd::Agent { command, .. } => {
                command.metrics_bind.as_deref()
            }
            Cmd::Cron(args) => args.command().metrics_bind.as_deref(),
            _ => None,
        }
    }
}

async fn run(cli: Cli) -> Result<u8, CliError> {
    let uri = connection::uri_from_flags(cli.uri, cli.uri_file.as_deref())?;
    let (uri, db, json) = (uri.as_deref(), cli.db.as_deref(), cli.json);
    if let Some(addr) = cli.cmd.metrics_bind() {
        let bound = exposition::serve(addr).await?;
        eprintln!("mongocoord: metrics on http://{bound}/metrics");
    }
    match cli.cmd {
        Cmd::Demo { seconds, tasks, memory } => {
            let target = if memory { None } else { resolve_connection(uri, db).ok() };
            demo::run(target, seconds, tasks, json).await
        }
        Cmd::Lock { key, ttl, timeout, collection, command } => {
            let run = runners::Run::of(&command, ttl)?;
            runners::lock(connect(uri, db).await?, &key, &collection, timeout, &run).await
        }
        Cmd::Elect { key, ttl, command } => {
            let run = runners::Run::of(&command, ttl)?;
            runners::elect(connect(uri, db).await?, &key, &run).await
        }
        Cmd::Agent { name, queue, concurrency, prefetch, max_attempts, lease, max_tasks, timeout, limits, command } => {
            let run = runners::Run::of(&command, lease)?;
            let prefetch = prefetch.map(usize::from);
            let timeout = timeout.map(|t| args::seconds("timeout", t, false)).transpose()?;
            let (limits, retain) = (Some(limits), None);
            let opts = runners::AgentOpts { concurrency, prefetch, max_attempts, max_tasks, timeout, limits, retain };
            runners::agent(connect(uri, db).await?, &name, &queue, opts, &run).await
        }
        Cmd::Cron(args) => {
            let (run, schedule) = (args.run()?, args.schedule()?);
            cron::cron(connect(uri, db).await?, &args, schedule, &run).await
        }
        Cmd::Supervise { parent, grace_ms, control_fd, cmd } => {
            supervise::supervisor(parent, std::time::Duration::from_millis(grace_ms), control_fd, &cmd).await
        }
        Cmd::Locks { collection } => views::locks(&connect(uri, db).await?, &collection, json).await,
        Cmd::Leaders { collection, status_collection } => {
            views::leaders(&connect(uri, db).await?, &collection, &status_collection, json).await
        }
        Cmd::Tasks { queue, agent, list, failed, schedule, filter, limit } => {
            if filter.is_some() && !list && !failed {
                return Err(CliError::invalid("--filter selects tasks to list: give --list or --failed too"));
            }
            let only = views::Only { agent: agent.as_deref(), schedule: schedule.as_deref(), failed };
            views::tasks(&connect(uri, db).await?, &queue, only, list, filter.as_deref(), limit, json).await
        }
        Cmd::Enqueue {
            queue,
            agent,
            data,
            priority,
            delay,
            dedupe_key,
            dedupe_until_ended,
            dedupe_for,
            debounce,
            id,
            timeout,
            group,
            wait,
            wait_timeout,
        } => {
            let wait = wait.then(|| wait_timeout.map(|s| args::seconds("wait-timeout", s, false)).transpose());
            let wait = wait.transpose()?;
            let dedupe_scope = match (dedupe_until_ended, dedupe_for, debounce) {
                (_, _, Some(s)) => mongoagent::DedupeScope::Debounce(args::seconds("debounce", s, false)?),
                (true, _, None) => mongoagent::DedupeScope::UntilEnded,
                (false, Some(s), None) => mongoagent::DedupeScope::For(args::seconds("dedupe-for", s, false)?),
                (false, None, None) => mongoagent::DedupeScope::Forever,
            };
            let opts = views::EnqueueOpts { priority, delay, dedupe_key, dedupe_scope, id, timeout, group, wait };
            views::enqueue(&connect(uri, db).await?, &queue, &agent, &data, opts, json).await
        }
        Cmd::Requeue { queue, filter, dry_run, yes } => {
            views::requeue(&connect(uri, db).await?, &queue, &filter, dry_run, yes, json).await
        }
        Cmd::Cancel { which } => queue_ops::cancel(&connect(uri, db).await?, &which, json).await,
        Cmd::Delete { which, force } => queue_ops::delete(&connect(uri, db).await?, &which, force, json).await,
        Cmd::Pause { queue, agent } => {
            queue_ops::set_paused(&connect(uri, db).await?, &queue, &agent, true, json).await
        }
        Cmd::Resume { queue, agent } => {
            queue_ops::set_paused(&connect(uri, db).await?, &queue, &agent, false, json).await
        }
        Cmd::Schedules { queue, collection } => {
            schedules::list(&connect(uri, db).await?, &queue, collection.as_deref(), json).await
        }
        Cmd::Schedule { action, name, queue, collection } => {
            schedules::act(&connect(uri, db).await?, &queue, collection.as_deref(), action, &name, json).await
        }
        Cmd::Watch { queue: Some(queue), agent, interval, count } => {
            let poll = args::seconds("interval", interval, false)?;
            let w = events::WatchEvents { queue: &queue, agent: agent.as_deref(), poll, count, json };
            events::watch(&connect(uri, db).await?, w).await
        }
        Cmd::Watch { queue: None, interval, count, .. } => {
            views::watch(&connect(uri, db).await?, interval, count).await
        }
        Cmd::Dashboard {
            bind,
            read_only,
            auth_reads,
            token_file,
            public_url,
            queue,
            lock_collection,
            election_collection,
            status_collection,
        } => {
            let collections = [lock_collection, election_collection, status_collection];
            let opts =
                dashboard::Opts { bind, read_only, auth_reads, token_file, public_url, queues: queue, collections };
            dashboard::run(connect(uri, db).await?, opts).await
        }
    }
}
