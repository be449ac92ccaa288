//! `mongocoord cron NAME 'SPEC' -- CMD`: a distributed cron. Every machine that
//! runs the same line runs CMD once per tick between them, with no leader.
//!
//! Each process upserts the schedule (idempotent by name; a changed definition
//! gets a new version), runs a scheduler for this one schedule
//! ([`mongoagent::schedule::Scheduler::only`]) and an agent whose tasks are its ticks.
//! Each tick is one task whose id is derived from the name and the tick's
//! instant, so the processes' schedulers enqueue it once between them, and one
//! agent claims it. Its command runs exactly as `mongocoord agent` runs one
//! ([`crate::runners::work_tasks`]): under a supervisor, stopped before the
//! claim can lapse, with the same exit statuses.

use std::time::Duration;

use bson::doc;
use mongoagent::{
    schedule::{Missed, Overlap, Schedule, Schedules, Upserted, When},
    NewTask, Task,
};
use store_mongo::MongoStore;
use tokio_util::sync::CancellationToken;

use crate::error::CliError;
use crate::runners::{self, AgentOpts, Run};
use crate::supervise;

/// The queue collection `cron` uses by default (schedules in `cron_schedules`).
pub(crate) const DEFAULT_QUEUE: &str = "cron";

/// `--overlap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum OverlapArg {
    /// A tick is skipped while the previous tick's command runs.
    Skip,
    /// Ticks wait for the previous one and run one at a time, in order.
    Queue,
    /// Ticks run whether or not the previous one has ended.
    Allow,
}

/// `--missed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum MissedArg {
    /// Ticks missed while no process ran are not run.
    Skip,
    /// The most recent missed tick runs once.
    Once,
    /// Missed ticks run, each once, up to --max-missed of the most recent.
    All,
}

/// The options of `mongocoord cron`.
#[derive(Debug, clap::Args)]
pub(crate) struct CronArgs {
    /// The schedule's name: every process that runs it shares it.
    name: String,
    /// A cron expression: 5 fields, or 6 with seconds first (e.g. '*/2 * * * * *',
    /// every two seconds). Or give --every.
    spec: Option<String>,
    /// The IANA time zone the cron expression is read in (default UTC).
    #[arg(long)]
    tz: Option<String>,
    /// A fixed interval in seconds instead of a cron expression (ticks at whole
    /// multiples since the Unix epoch).
    #[arg(long, conflicts_with_all = ["spec", "tz"])]
    every: Option<f64>,
    /// Whether a tick may start while the previous tick's command still runs.
    #[arg(long, value_enum, default_value_t = OverlapArg::Skip)]
    overlap: OverlapArg,
    /// Ticks missed while no process ran (or noticed later than
    /// --starting-deadline): not run, the latest once, or all.
    #[arg(long, value_enum, default_value_t = MissedArg::Skip)]
    missed: MissedArg,
    /// With --missed all: at most this many of the most recent missed ticks run.
    #[arg(long, default_value_t = 100)]
    max_missed: u32,
    /// A tick noticed more than this many seconds late counts as missed.
    #[arg(long, default_value_t = 60.0)]
    starting_deadline: f64,
    /// Each tick's command starts up to this many seconds after the tick (the
    /// same amount on every machine).
    #[arg(long)]
    jitter: Option<f64>,
    /// The queue collection the ticks' tasks go to (the schedule is kept in
    /// `<queue>_schedules`).
    #[arg(long, default_value = DEFAULT_QUEUE)]
    queue: String,
    /// Tick commands this process runs at once (with --overlap allow).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Runs of a tick whose command fails (exit status not 0) before it fails
    /// for good; by default 1: the next tick is the next try.
    #[arg(long, default_value_t = 1)]
    max_attempts: u32,
    /// Claim lease length of a tick's task in seconds (renewed while CMD runs);
    /// `--lease` is an alias.
    #[arg(long = "ttl", alias = "lease", value_name = "TTL", default_value_t = 60.0)]
    lease: f64,
    /// Seconds one run of a tick's command may take: then its process tree
    /// gets SIGTERM, SIGKILL after --grace, and the run fails with "timed
    /// out after …" (tried again up to --max-attempts)
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Seconds an ended tick's task is kept (its outcome, for `schedules`
    /// and `tasks`) before the server deletes it: at least 3600, or 0 to keep
    /// them for ever. Without a limit a schedule keeps one document per tick
    /// for ever. Give every line of a schedule the same value.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_RETAIN_S, allow_negative_numbers = true)]
    retain: f64,
    #[command(flatten)]
    command: crate::args::Command,
}

/// How long `cron` keeps an ended tick's task by default: a week.
pub(crate) const DEFAULT_RETAIN_S: f64 = 7.0 * 24.0 * 3600.0;

/// The shortest `--retain`: an hour. A tick is one task because its id is
/// taken while its task exists; once deleted, a scheduler that read the
/// schedule before the tick was recorded, and stalled (paused, swapped out)
/// until after the deletion, would enqueue it again. The floor puts that
/// stall at over an hour (docs/invariants.md).
pub(crate) const MIN_RETAIN_S: f64 = 3600.0;

impl CronArgs {
    /// The options shared with the other runners.
    pub(crate) fn command(&self) -> &crate::args::Command {
        &self.command
    }

    /// The runner's lease, grace and command, checked.
    pub(crate) fn run(&self) -> Result<Run<'_>, CliError> {
        self.timeout()?;
        self.retain()?;
        Run::of(&self.command, self.lease)
    }

    /// `--retain`, checked: `None` (0) keeps ended ticks for ever.
    fn retain(&self) -> Result<Option<std::time::Duration>, CliError> {
        if self.retain == 0.0 {
            return Ok(None);
        }
        let d = crate::args::seconds("retain", self.retain, false)?;
        if self.retain < MIN_RETAIN_S {
            return Err(CliError::invalid(format!(
                "--retain must be 0 (for ever) or at least {MIN_RETAIN_S} seconds (an hour), not {}: a scheduler stalled for longer than the retention could enqueue a deleted tick again",
                self.retain
            )));
        }
        Ok(Some(d))
    }

    /// `--retain` in seconds as the definition records it (0: for ever).
    fn retain_s(&self) -> Result<f64, CliError> {
        Ok(self.retain()?.map_or(0.0, |d| d.as_secs_f64()))
    }

    /// `--timeout`, checked.
    fn timeout(&self) -> Result<Option<std::time::Duration>, CliError> {
        self.timeout.map(|t| crate::args::seconds("timeout", t, false)).transpose()
    }

    /// The schedule this line defines, checked before connecting: a bad
    /// expression, zone or number is a usage error (status 2).
    pub(crate) fn schedule(&self) -> Result<Schedule, CliError> {
        if self.name.is_empty() {
            return Err(CliError::invalid("the schedule needs a name"));
        }
        let when = match (&self.spec, self.every) {
            (Some(expr), None) => {
                When::Cron { expr: expr.clone(), zone: self.tz.clone().unwrap_or_else(|| "UTC".into()) }
            }
            (None, Some(every)) => {
                When::Every { every: crate::args::seconds("every", every, false)?, offset: Duration::ZERO }
            }
            _ => return Err(CliError::invalid("give a cron expression or --every SECONDS")),
        };
        // The command is part of the definition: a line with another command
        // changes it, and is told so (`warn_of_another_command`); so is the
        // retention, which each line applies to the ticks it runs.
        let task =
            NewTask::new(self.name.clone(), doc! { COMMAND: self.command.cmd.clone(), RETAIN: self.retain_s()? });
        let mut s = Schedule::new(self.name.clone(), when, task).map_err(CliError::CronLine)?;
        s = s
            .overlap(match self.overlap {
                OverlapArg::Skip => Overlap::Skip,
                OverlapArg::Queue => Overlap::Queue,
                OverlapArg::Allow => Overlap::Allow,
            })
            .missed(match self.missed {
                MissedArg::Skip => Missed::Skip,
                MissedArg::Once => Missed::Once,
                MissedArg::All => Missed::All(self.max_missed),
            })
            .starting_deadline(crate::args::seconds("starting-deadline", self.starting_deadline, false)?);
        if let Some(j) = self.jitter {
            s = s.jitter(crate::args::seconds("jitter", j, true)?);
        }
        Ok(s)
    }
}

/// The field of a tick's task (and of the schedule's definition) that holds
/// the command line that defined it.
const COMMAND: &str = "command";

/// The field of a schedule's definition (and of its ticks' tasks) that holds
/// the `--retain` of the line that defined it, in seconds (0: for ever).
const RETAIN: &str = "retain_s";

/// The command a schedule's definition or a tick's task names, if any.
fn command_of(data: &bson::Document) -> Option<Vec<String>> {
    let items = data.get_array(COMMAND).ok()?;
    items.iter().map(|v| v.as_str().map(str::to_owned)).collect()
}

/// Lines on different machines that share a schedule's name but not its
/// command are a mistake no tick can settle (each tick runs once, on any of
/// them): said when a line replaces another's command, and at every tick a
/// line runs that was scheduled with another command.
fn warn_of_another_command(name: &str, theirs: &[String], ours: &[String], when: &str) {
    tracing::warn!(schedule = name, ?theirs, ?ours, "a schedule shared by lines with different commands");
    // The name may come from a tick's stored data; the commands are written
    // with `{:?}`, which escapes control characters.
    eprintln!(
        "mongocoord: schedule {} {when} {theirs:?}, but this line runs {ours:?}: lines that share a schedule's name should run the same command",
        crate::terminal::safe(name)
    );
}

/// Lines of one schedule with different `--retain`s keep its ended ticks
/// for as long as the line that ran each says: its history would have gaps.
fn warn_of_another_retention(name: &str, theirs: f64, ours: f64) {
    tracing::warn!(schedule = name, theirs, ours, "a schedule shared by lines with different retention");
    let says = |s: f64| if s == 0.0 { "for ever".to_owned() } else { format!("{s} s") };
    eprintln!(
        "mongocoord: schedule {} was defined by another line to keep ended ticks {}, but this line keeps those it runs {}: lines that share a schedule's name should give the same --retain",
        crate::terminal::safe(name),
        says(theirs),
        says(ours)
    );
}

/// `MONGOCOORD_SCHEDULE` and `MONGOCOORD_TICK` (the tick's instant on the
/// server clock, epoch milliseconds) for a tick's command; a tick scheduled
/// with another command than this line's is reported.
fn tick_env(task: &Task, ours: &[String]) -> Vec<(&'static str, String)> {
    let d = task.data();
    if let Some(theirs) = command_of(d).filter(|t| t != ours) {
        let name = d.get_str(mongoagent::fields::SCHEDULE).unwrap_or_default();
        warn_of_another_command(name, &theirs, ours, "had this tick scheduled to run");
    }
    let mut env = Vec::new();
    if let Ok(name) = d.get_str(mongoagent::fields::SCHEDULE) {
        env.push(("MONGOCOORD_SCHEDULE", name.to_owned()));
    }
    if let Ok(tick) = d.get_datetime(mongoagent::fields::SCHEDULED_FOR) {
        env.push(("MONGOCOORD_TICK", tick.timestamp_millis().to_string()));
    }
    env
}

/// `mongocoord cron NAME SPEC -- CMD`: runs until SIGTERM/SIGINT (status 0), or
/// until the scheduler or the agent fails for good (status 2).
pub(crate) async fn cron(store: MongoStore, a: &CronArgs, schedule: Schedule, run: &Run<'_>) -> Result<u8, CliError> {
    let name = schedule.name().to_owned();
    let schedules = Schedules::new(store.clone(), &a.queue).map_err(CliError::CronLine)?;
    let ours = a.command.cmd.clone();
    let before = schedules.get(&name).await?;
    let before = before.map(|b| b.schedule.data().clone());
    if let Some(theirs) = before.as_ref().and_then(command_of).filter(|t| *t != ours) {
        warn_of_another_command(&name, &theirs, &ours, "was defined by another line to run");
    }
    let retain_s = a.retain_s()?;
    if let Some(theirs) = before.as_ref().and_then(|d| d.get_f64(RETAIN).ok()).filter(|t| *t != retain_s) {
        warn_of_another_retention(&name, theirs, retain_s);
    }
    if let Upserted::Changed(v) = schedules.upsert(&schedule).await? {
        eprintln!("mongocoord: schedule {name} changed to this line's definition (version {v})");
    }
    let opts = AgentOpts {
        concurrency: a.concurrency,
        prefetch: None,
        max_attempts: a.max_attempts,
        max_tasks: None,
        timeout: a.timeout()?,
        limits: None,
        retain: a.retain()?,
    };
    let agent = runners::agent_builder(store, &name, &a.queue, opts, run).build().map_err(CliError::CronLine)?;
    let signal = supervise::on_signal();
    let stop_scheduler = CancellationToken::new();
    let _stop_on_exit = stop_scheduler.clone().drop_guard();
    let scheduler = schedules.scheduler().only(name.clone());
    let mut scheduling = tokio::spawn({
        let stop = stop_scheduler.clone();
        async move { scheduler.run(stop).await }
    });
    tracing::info!(schedule = %name, queue = %a.queue, "cron running");
    let work = runners::work_tasks(&agent, run, &signal, std::sync::Arc::new(move |t: &Task| tick_env(t, &ours)));
    tokio::pin!(work);
    let (log, scheduled) = tokio::select! {
        log = &mut work => {
            stop_scheduler.cancel();
            (log, (&mut scheduling).await)
        }
        // The scheduler ends by itself only when it failed for good: the
        // commands running are let finish, and the runner stops.
        scheduled = &mut scheduling => {
            agent.shutdown();
            (work.await, scheduled)
        }
    };
    let log = log?;
    eprintln!(
        "mongocoord: cron {name}: {} ticks run, {} completed, {} failed for good, {} retried",
        log.tasks_processed, log.completed, log.failed_permanently, log.retried
    );
    match scheduled {
        Ok(Ok(())) => Ok(0),
        Ok(Err(source)) => Err(CliError::Scheduler { name, source }),
        Err(source) => Err(CliError::Join { what: format!("the scheduler of {name} stopped"), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Line {
        #[command(flatten)]
        args: CronArgs,
    }

    fn parse(line: &[&str]) -> Result<CronArgs, clap::Error> {
        Line::try_parse_from([&["cron"], line].concat()).map(|l| l.args)
    }

    fn schedule(line: &[&str]) -> Result<Schedule, CliError> {
        parse(line).unwrap().schedule()
    }

    #[test]
    fn a_line_defines_a_schedule() {
        let s = schedule(&["backup", "0 30 2 * * *", "--tz", "Europe/Berlin", "--", "true"]).unwrap();
        assert_eq!(s.when(), &When::Cron { expr: "0 30 2 * * *".into(), zone: "Europe/Berlin".into() });
        assert_eq!((s.overlap_policy(), s.missed_policy(), s.agent_name()), (Overlap::Skip, Missed::Skip, "backup"));
        let s =
            schedule(&["t", "--every", "2", "--overlap", "allow", "--missed", "all", "--max-missed", "3", "--", "x"]);
        let s = s.unwrap();
        assert_eq!(s.when(), &When::Every { every: Duration::from_secs(2), offset: Duration::ZERO });
        assert_eq!((s.overlap_policy(), s.missed_policy()), (Overlap::Allow, Missed::All(3)));
        assert_eq!(
            schedule(&["t", "* * * * *", "--", "x"]).unwrap().when(),
            &When::Cron { expr: "* * * * *".into(), zone: "UTC".into() }
        );
    }

    #[test]
    fn ended_ticks_are_kept_a_week_unless_told() {
        let retain = |line: &[&str]| parse(&[&["t", "--every", "1"], line, &["--", "x"]].concat()).unwrap().retain();
        assert_eq!(retain(&[]).unwrap(), Some(Duration::from_secs(7 * 24 * 3600)));
        assert_eq!(retain(&["--retain", "3600"]).unwrap(), Some(Duration::from_secs(3600)));
        assert_eq!(retain(&["--retain", "0"]).unwrap(), None, "0 keeps them for ever");
        for short in ["60", "3599.9", "0.0005"] {
            let e = retain(&["--retain", short]).unwrap_err().to_string();
            assert!(e.contains("--retain") && e.contains("at least 3600"), "{short}: {e}");
        }
        assert!(retain(&["--retain=-5"]).is_err());
        let negative = retain(&["--retain", "-5"]).unwrap_err().to_string();
        assert!(negative.contains("--retain must be"), "{negative}");
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let err = |line: &[&str]| schedule(line).unwrap_err().to_string();
        assert!(err(&["t", "61 * * * *", "--", "x"]).contains("cron expression \"61 * * * *\""));
        assert!(err(&["t", "* * * * *", "--tz", "Mars/Olympus", "--", "x"]).contains("time zone \"Mars/Olympus\""));
        assert!(err(&["t", "--", "x"]).contains("a cron expression or --every"));
        assert!(err(&["t", "--every", "0", "--", "x"]).contains("--every must be"));
        assert!(err(&["t", "--every", "1e20", "--", "x"]).contains("--every must be"));
        assert!(err(&["t", "* * * * *", "--starting-deadline", "0", "--", "x"]).contains("--starting-deadline"));
        assert!(err(&["t", "* * * * *", "--jitter", "NaN", "--", "x"]).contains("--jitter"));
        assert!(err(&["", "* * * * *", "--", "x"]).contains("needs a name"));
        // Policies and conflicting options are refused by the parser (status 2).
        assert!(parse(&["t", "* * * * *", "--overlap", "sometimes", "--", "x"]).is_err());
        assert!(parse(&["t", "* * * * *", "--missed", "most", "--", "x"]).is_err());
        assert!(parse(&["t", "* * * * *", "--every", "2", "--", "x"]).is_err());
        assert!(parse(&["t", "* * * * *"]).is_err(), "a command is required");
        let grace = parse(&["t", "* * * * *", "--ttl", "2", "--grace", "5", "--", "x"]).unwrap();
        assert!(grace.run().unwrap_err().to_string().contains("does not fit"));
    }
}
