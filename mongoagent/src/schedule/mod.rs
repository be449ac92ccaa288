//! Schedules: cron expressions, fixed intervals and one-off instants that
//! enqueue tasks, each tick exactly once across any number of scheduler
//! processes, with no leader.
//!
//! A schedule is a document in a schedules collection (by default
//! `<queue>_schedules`), keyed by its name. Each tick becomes one task whose id
//! is derived from the schedule's name and the tick's instant
//! (`sched/<name>/<epoch ms>`), so every scheduler process may enqueue it and
//! the unique `_id` keeps exactly one. The last tick handled is recorded on the
//! schedule with a write that only moves it forward, so the next due tick is
//! known without scanning tasks.
//!
//! Time is the store's: ticks are computed against [`Store::now`], never a
//! client's clock.
//!
//! **Time zones and daylight saving.** A cron expression is read in its zone
//! (IANA names, `chrono-tz`) and evaluated by `croner`, whose documented rules
//! apply: on a spring-forward gap, a fixed-time job (specific seconds, minutes
//! and hours, such as `0 30 2 * * *`) runs at the first valid time after the
//! gap on the same day, and an interval or wildcard job skips the occurrences in
//! the gap; on a fall-back overlap, a fixed-time job runs once (the first pass
//! of the repeated hour), an interval or wildcard job runs for each matching
//! time in both passes. Intervals and one-off times are instants and know no
//! zone.

mod scheduler;
mod ticks;

use std::time::Duration;

use bson::{doc, Bson, Document};
use store_trait::{Collection, Condition, InsertOutcome, Key, Mutation, Query, Record, Store, StoreTime, Write};

pub use scheduler::{Pass, Scheduler, SchedulerHandle};
use ticks::Ticks;

use crate::queue::not_complete;
use crate::task::fields as task_fields;
use crate::{AgentError, NewTask, Queue};

/// Field names of a schedule document.
pub mod fields {
    /// The definition (a subdocument), compared on upsert.
    pub const DEF: &str = "def";
    /// Grows by one each time the definition changes (1 when created).
    pub const VERSION: &str = "version";
    /// Whether ticks are skipped.
    pub const PAUSED: &str = "paused";
    /// Ticks before this instant (epoch ms) are never run: when the schedule
    /// was created, last changed or resumed.
    pub const SINCE: &str = "since";
    /// The last tick handled, run or skipped (epoch ms); only moves forward.
    pub const LAST_TICK: &str = "last_tick";
    /// The id of the last task enqueued.
    pub const LAST_TASK: &str = "last_task";
    /// With [`super::Overlap::Queue`]: the task let through last; the next
    /// held task is let through only once it has ended.
    pub const RUNNING: &str = "running";
}

/// When a schedule ticks.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum When {
    /// A cron expression (5 fields, or 6 with seconds first) read in an IANA
    /// time zone.
    Cron {
        /// The expression, e.g. `"0 30 2 * * *"`.
        expr: String,
        /// The zone, e.g. `"Europe/Berlin"` or `"UTC"`.
        zone: String,
    },
    /// Every `every`, at `offset` past each whole multiple of `every` since the
    /// Unix epoch (so every process computes the same instants).
    Every {
        /// The period (at least 1 ms).
        every: Duration,
        /// The phase (less than `every`).
        offset: Duration,
    },
    /// Once, at this instant.
    At(StoreTime),
}

/// Whether a tick may start while an earlier tick's task has not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Overlap {
    /// The tick is skipped (recorded as handled, no task). When one pass finds
    /// several ticks to run (missed ticks caught up), only the newest runs.
    #[default]
    Skip,
    /// The tick's task is enqueued anyway.
    Allow,
    /// The tick's task is enqueued held back (not ready), and made ready once
    /// the previous tick's task has ended: ticks run one at a time, in order.
    /// Held tasks wait while the schedule is paused, are still let through one
    /// at a time if the policy is changed, and stay held if the schedule is
    /// deleted.
    Queue,
}

/// What happens to ticks missed while no scheduler ran. A tick is missed when
/// it is older than the starting deadline when a scheduler notices it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Missed {
    /// Missed ticks are not run.
    #[default]
    Skip,
    /// The most recent missed tick runs once, unless a tick on time is due too.
    Once,
    /// Up to this many of the most recent missed ticks run, each as its own task.
    All(u32),
}

/// A schedule's definition.
///
/// ```
/// use mongoagent::{NewTask, Schedule};
/// let nightly = Schedule::cron("nightly-report", "0 30 2 * * *", "Europe/Berlin", NewTask::new("report", bson::doc! {}))
///     .unwrap()
///     .starting_deadline(std::time::Duration::from_secs(600));
/// # let _ = nightly;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    name: String,
    when: When,
    agent_name: String,
    data: Document,
    priority: i64,
    max_attempts: Option<u32>,
    overlap: Overlap,
    missed: Missed,
    starting_deadline: Duration,
    jitter: Duration,
}

/// The longest interval, starting deadline or jitter accepted: 366 days.
const MAX_SPAN: Duration = Duration::from_secs(366 * 24 * 3600);

fn ms_of(what: &str, d: Duration) -> Result<i64, AgentError> {
    if d > MAX_SPAN {
        return Err(AgentError::Config(format!("{what} {d:?} is longer than 366 days")));
    }
    i64::try_from(d.as_millis()).map_err(|_| AgentError::Config(format!("{what} {d:?} is too long")))
}

impl Schedule {
    /// A schedule named `name` (its id) that enqueues `task` at each tick. Of
    /// `task`, the agent name, data, priority and attempt limit are used.
    pub fn new(name: impl Into<String>, when: When, task: NewTask) -> Result<Self, AgentError> {
        let s = Schedule {
            name: name.into(),
            when,
            agent_name: task.agent_name,
            data: task.data,
            priority: task.priority,
            max_attempts: task.max_attempts,
            overlap: Overlap::default(),
            missed: Missed::default(),
            starting_deadline: Duration::from_secs(60),
            jitter: Duration::ZERO,
        };
        s.ticks()?;
        s.template(StoreTime::from_millis(0)).to_document()?;
        // The name is the schedule's key, and part of every tick's task id.
        Key::new(s.name.as_str()).map_err(|e| AgentError::Config(e.to_string()))?;
        Key::new(task_id(&s.name, StoreTime::from_millis(i64::MIN))).map_err(|e| AgentError::Config(e.to_string()))?;
        if s.name.is_empty() {
            return Err(AgentError::Config("a schedule needs a non-empty name".into()));
        }
        Ok(s)
    }

    /// A cron schedule (5 fields, or 6 with seconds first) in an IANA zone.
    pub fn cron(
        name: impl Into<String>,
        expr: impl Into<String>,
        zone: impl Into<String>,
        task: NewTask,
    ) -> Result<Self, AgentError> {
        Self::new(name, When::Cron { expr: expr.into(), zone: zone.into() }, task)
    }

    /// Every `every`, aligned to the Unix epoch.
    pub fn every(name: impl Into<String>, every: Duration, task: NewTask) -> Result<Self, AgentError> {
        Self::new(name, When::Every { every, offset: Duration::ZERO }, task)
    }

    /// Once, at `at`.
    pub fn at(name: impl Into<String>, at: StoreTime, task: NewTask) -> Result<Self, AgentError> {
        Self::new(name, When::At(at), task)
    }

    /// The overlap policy (default [`Overlap::Skip`]).
    pub fn overlap(mut self, o: Overlap) -> Self {
        self.overlap = o;
        self
    }

    /// The missed-tick policy (default [`Missed::Skip`]).
    pub fn missed(mut self, m: Missed) -> Self {
        self.missed = m;
        self
    }

    /// A tick older than this when a scheduler notices it is missed (default
    /// 60 s; at least 1 ms, at most 366 days; longer values are capped).
    pub fn starting_deadline(mut self, d: Duration) -> Self {
        self.starting_deadline = d.clamp(Duration::from_millis(1), MAX_SPAN);
        self
    }

    /// Each tick's task is made ready up to this much after the tick (a
    /// pseudo-random amount derived from the name and the tick; default none;
    /// at most 366 days).
    pub fn jitter(mut self, d: Duration) -> Self {
        self.jitter = d.min(MAX_SPAN);
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When it ticks.
    pub fn when(&self) -> &When {
        &self.when
    }

    /// The overlap policy.
    pub fn overlap_policy(&self) -> Overlap {
        self.overlap
    }

    /// The missed-tick policy.
    pub fn missed_policy(&self) -> Missed {
        self.missed
    }

    /// The agent the tasks are for.
    pub fn agent_name(&self) -> &str {
        &self.agent_name
    }

    pub(crate) fn ticks(&self) -> Result<Ticks, AgentError> {
        Ok(match &self.when {
            When::Cron { expr, zone } => Ticks::Cron(Box::new(ticks::parse_cron(expr)?), ticks::parse_zone(zone)?),
            When::Every { every, offset } => {
                let every_ms = ms_of("interval", *every)?;
                let offset_ms = ms_of("offset", *offset)?;
                if every_ms < 1 || offset_ms >= every_ms {
                    return Err(AgentError::Config(format!(
                        "an interval of {every:?} with offset {offset:?}: the interval must be at least 1 ms and the offset shorter"
                    )));
                }
                Ticks::Every { every_ms, offset_ms }
            }
            When::At(t) => Ticks::At(t.as_millis()),
        })
    }

    /// The task for one tick.
    pub(crate) fn template(&self, tick: StoreTime) -> NewTask {
        let mut t = NewTask::new(self.agent_name.clone(), self.data.clone())
            .id(task_id(&self.name, tick))
            .priority(self.priority)
            .run_at(StoreTime::from_millis(tick.as_millis().saturating_add(self.jitter_for(tick))));
        t.max_attempts = self.max_attempts;
        t.schedule = Some((self.name.clone(), tick));
        t.held = self.overlap == Overlap::Queue;
        t
    }

    fn jitter_for(&self, tick: StoreTime) -> i64 {
        let max = i64::try_from(self.jitter.as_millis()).unwrap_or(0);
        if max == 0 {
            return 0;
        }
        // FNV-1a of the name and tick: the same on every process.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.name.bytes().chain(tick.as_millis().to_le_bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        fastrand::Rng::with_seed(h).i64(0..=max)
    }

    fn to_def(&self) -> Result<Document, AgentError> {
        let mut d = doc! { "agent_name": &self.agent_name, "data": self.data.clone(), "priority": self.priority };
        if let Some(n) = self.max_attempts {
            d.insert("max_attempts", i64::from(n));
        }
        match &self.when {
            When::Cron { expr, zone } => {
                d.insert("kind", "cron");
                d.insert("cron", expr.as_str());
                d.insert("zone", zone.as_str());
            }
            When::Every { every, offset } => {
                d.insert("kind", "every");
                d.insert("every_ms", ms_of("interval", *every)?);
                d.insert("offset_ms", ms_of("offset", *offset)?);
            }
            When::At(t) => {
                d.insert("kind", "at");
                d.insert("at", t.to_bson_datetime());
            }
        }
        d.insert(
            "overlap",
            match self.overlap {
                Overlap::Skip => "skip",
                Overlap::Allow => "allow",
                Overlap::Queue => "queue",
            },
        );
        match self.missed {
            Missed::Skip => d.insert("missed", "skip"),
            Missed::Once => d.insert("missed", "once"),
            Missed::All(n) => {
                d.insert("missed_max", i64::from(n));
                d.insert("missed", "all")
            }
        };
        d.insert("starting_deadline_ms", ms_of("starting deadline", self.starting_deadline)?);
        d.insert("jitter_ms", ms_of("jitter", self.jitter)?);
        Ok(d)
    }

    fn from_def(name: &str, d: &Document) -> Result<Self, AgentError> {
        let bad = |what: &str| AgentError::InvalidTask(format!("schedule {name:?}: {what} is missing or malformed"));
        let int = |k: &str| -> Result<i64, AgentError> {
            match d.get(k) {
                Some(Bson::Int64(n)) => Ok(*n),
                Some(Bson::Int32(n)) => Ok(i64::from(*n)),
                _ => Err(bad(k)),
            }
        };
        let dur = |k: &str| -> Result<Duration, AgentError> {
            u64::try_from(int(k)?).map(Duration::from_millis).map_err(|_| bad(k))
        };
        let when = match d.get_str("kind").map_err(|_| bad("kind"))? {
            "cron" => When::Cron {
                expr: d.get_str("cron").map_err(|_| bad("cron"))?.to_owned(),
                zone: d.get_str("zone").map_err(|_| bad("zone"))?.to_owned(),
            },
            "every" => When::Every { every: dur("every_ms")?, offset: dur("offset_ms")? },
            "at" => When::At(StoreTime::from_millis(d.get_datetime("at").map_err(|_| bad("at"))?.timestamp_millis())),
            _ => return Err(bad("kind")),
        };
        let mut task = NewTask::new(
            d.get_str("agent_name").map_err(|_| bad("agent_name"))?,
            d.get_document("data").map_err(|_| bad("data"))?.clone(),
        )
        .priority(int("priority")?);
        if d.contains_key("max_attempts") {
            task = task.max_attempts(u32::try_from(int("max_attempts")?).map_err(|_| bad("max_attempts"))?);
        }
        let overlap = match d.get_str("overlap").map_err(|_| bad("overlap"))? {
            "skip" => Overlap::Skip,
            "allow" => Overlap::Allow,
            "queue" => Overlap::Queue,
            _ => return Err(bad("overlap")),
        };
        let missed = match d.get_str("missed").map_err(|_| bad("missed"))? {
            "skip" => Missed::Skip,
            "once" => Missed::Once,
            "all" => Missed::All(u32::try_from(int("missed_max")?).map_err(|_| bad("missed_max"))?),
            _ => return Err(bad("missed")),
        };
        Ok(Schedule::new(name, when, task)?
            .overlap(overlap)
            .missed(missed)
            .starting_deadline(dur("starting_deadline_ms")?)
            .jitter(dur("jitter_ms")?))
    }

    /// Which ticks to run and which to record as handled, at store time `now`,
    /// considering ticks at or after `from`.
    pub(crate) fn plan(&self, ticks: &Ticks, from: i64, now: i64) -> Plan {
        let deadline = i64::try_from(self.starting_deadline.as_millis()).unwrap_or(i64::MAX);
        let on_time_from = from.max(now.saturating_sub(deadline));
        let mut run = ticks.between(on_time_from, now, ticks::MAX_TICKS_PER_PASS);
        // A pass that stopped at the guard records only what it looked at.
        let capped = run.len() >= ticks::MAX_TICKS_PER_PASS;
        let latest_missed =
            if on_time_from > from { ticks.prev_at_or_before(on_time_from - 1).filter(|&t| t >= from) } else { None };
        let mut newest = if capped { run.last().copied() } else { run.last().copied().or(latest_missed) };
        match self.missed {
            Missed::Skip => {}
            Missed::Once => {
                if run.is_empty() {
                    run.extend(latest_missed);
                }
            }
            Missed::All(n) => {
                let mut caught_up = Vec::new();
                let mut at = latest_missed;
                while let Some(t) = at {
                    if caught_up.len() >= usize::try_from(n).unwrap_or(usize::MAX) {
                        break;
                    }
                    caught_up.push(t);
                    at = t.checked_sub(1).and_then(|b| ticks.prev_at_or_before(b)).filter(|&p| p >= from);
                }
                caught_up.reverse();
                caught_up.extend(run);
                run = caught_up;
            }
        }
        if capped {
            newest = run.last().copied();
        }
        Plan { run, newest }
    }
}

/// The ticks one pass handles for one schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Ticks to enqueue a task for, oldest first (before the overlap policy).
    pub(crate) run: Vec<i64>,
    /// The newest tick handled (run or skipped): the new `last_tick`.
    pub(crate) newest: Option<i64>,
}

/// The id of a tick's task: `sched/<name>/<epoch ms>`.
pub fn task_id(name: &str, tick: StoreTime) -> String {
    format!("sched/{name}/{}", tick.as_millis())
}

/// What an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Upserted {
    /// The schedule was new (version 1).
    Created,
    /// The definition changed: this is its new version.
    Changed(u64),
    /// The same definition was there already, at this version.
    Unchanged(u64),
}

/// A schedule as stored, for listings.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// The definition.
    pub schedule: Schedule,
    /// How many times the definition was set (1 when never changed).
    pub version: u64,
    /// Whether ticks are skipped.
    pub paused: bool,
    /// The last tick handled (run or skipped).
    pub last_tick: Option<StoreTime>,
    /// The id of the last task enqueued.
    pub last_task: Option<String>,
    /// The next tick, on the store clock (`None` when paused or no tick is left).
    pub next_tick: Option<StoreTime>,
}

/// The schedules of one queue: define, pause, resume, delete, list. A
/// [`Scheduler`] turns their ticks into tasks.
///
/// ```
/// use mongoagent::{NewTask, Schedule, Schedules};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), mongoagent::AgentError> {
/// let store = store_memory::MemoryStore::new();
/// let schedules = Schedules::new(store, "jobs")?;
/// let every_minute = Schedule::every("sweep", std::time::Duration::from_secs(60), NewTask::new("sweeper", bson::doc! {}))?;
/// schedules.upsert(&every_minute).await?;
/// let scheduler = schedules.scheduler().spawn(); // stops when dropped
/// # drop(scheduler);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Schedules<S> {
    pub(crate) store: S,
    pub(crate) coll: Collection,
    pub(crate) queue: Queue<S>,
}

impl<S: Store + Clone> Schedules<S> {
    /// The schedules of queue `queue`, kept in `<queue>_schedules`.
    pub fn new(store: S, queue: &str) -> Result<Self, AgentError> {
        Self::with_collection(store, queue, &format!("{queue}_schedules"))
    }

    /// The schedules of queue `queue`, kept in collection `collection`.
    pub fn with_collection(store: S, queue: &str, collection: &str) -> Result<Self, AgentError> {
        let coll = Collection::new(collection).map_err(|e| AgentError::Config(e.to_string()))?;
        Ok(Schedules { queue: Queue::new(store.clone(), queue)?, store, coll })
    }

    /// The schedules collection.
    pub fn collection(&self) -> &Collection {
        &self.coll
    }

    /// The queue the ticks' tasks go to.
    pub fn queue(&self) -> &Queue<S> {
        &self.queue
    }

    /// A scheduler for these schedules (see [`Scheduler::spawn`]).
    pub fn scheduler(&self) -> Scheduler<S> {
        Scheduler::new(self.clone())
    }

    fn key(name: &str) -> Result<Key, AgentError> {
        Key::new(name).map_err(|e| AgentError::Config(e.to_string()))
    }

    /// Creates the schedule, or updates its definition by name. Idempotent: the
    /// same definition again changes nothing; a changed one bumps the version
    /// and starts its ticks from now (earlier ticks of the new definition are
    /// not run; ticks already handled are never run again).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: each write is one atomic conditional write.
    pub async fn upsert(&self, s: &Schedule) -> Result<Upserted, AgentError> {
        let key = Self::key(&s.name)?;
        let def = s.to_def()?;
        loop {
            let snap = self.store.get(&self.coll, &key).await?;
            let now = snap.now.as_millis();
            match snap.record {
                None => {
                    let d = doc! { "_id": s.name.as_str(), fields::DEF: def.clone(), fields::VERSION: 1_i64,
                    fields::PAUSED: false, fields::SINCE: now };
                    if let Some(InsertOutcome::Inserted(_)) = self.store.insert_many(&self.coll, vec![d]).await?.pop() {
                        tracing::info!(schedule = %s.name, "schedule created");
                        return Ok(Upserted::Created);
                    }
                }
                Some(r) => {
                    let version = version_of(&r);
                    if r.data().get_document(fields::DEF).ok() == Some(&def) {
                        return Ok(Upserted::Unchanged(version));
                    }
                    let w = Write::new(
                        Condition::RevIs(r.rev()),
                        Mutation::new().set(fields::DEF, def.clone()).set(fields::SINCE, now).inc(fields::VERSION, 1),
                    );
                    if self.store.write(&self.coll, &key, &w).await?.is_applied() {
                        tracing::info!(schedule = %s.name, version = version + 1, "schedule changed");
                        return Ok(Upserted::Changed(version + 1));
                    }
                }
            }
        }
    }

    async fn set_paused(&self, name: &str, paused: bool) -> Result<bool, AgentError> {
        let key = Self::key(name)?;
        let mut m = Mutation::new().set(fields::PAUSED, paused);
        if !paused {
            // Ticks that fell while paused are not run.
            m = m.set(fields::SINCE, self.store.now().await?.as_millis());
        }
        let cond = Condition::FieldEq(fields::PAUSED.into(), Bson::Boolean(!paused));
        let applied = self.store.write(&self.coll, &key, &Write::new(cond, m)).await?.is_applied();
        if applied {
            tracing::info!(schedule = %name, paused, "schedule paused or resumed");
        }
        Ok(applied || self.store.get(&self.coll, &key).await?.record.is_some())
    }

    /// Pauses the schedule: its ticks are skipped until it is resumed. False
    /// when there is no such schedule.
    pub async fn pause(&self, name: &str) -> Result<bool, AgentError> {
        self.set_paused(name, true).await
    }

    /// Resumes the schedule; the ticks that fell while it was paused are not
    /// run. False when there is no such schedule.
    pub async fn resume(&self, name: &str) -> Result<bool, AgentError> {
        self.set_paused(name, false).await
    }

    /// Deletes the schedule (its tasks stay). False when there was none.
    pub async fn delete(&self, name: &str) -> Result<bool, AgentError> {
        let out = self.store.delete(&self.coll, &Self::key(name)?, &Condition::Always).await?;
        let deleted = matches!(out, store_trait::DeleteOutcome::Deleted(_));
        if deleted {
            tracing::info!(schedule = %name, "schedule deleted");
        }
        Ok(deleted)
    }

    /// One schedule as stored (`None` when there is none).
    pub async fn get(&self, name: &str) -> Result<Option<ScheduleInfo>, AgentError> {
        let snap = self.store.get(&self.coll, &Self::key(name)?).await?;
        snap.record.map(|r| info(&r, snap.now)).transpose()
    }

    /// Every schedule, by name.
    pub async fn list(&self) -> Result<Vec<ScheduleInfo>, AgentError> {
        let now = self.store.now().await?;
        let all = self.store.find(&self.coll, &Query::all().sort("_id", store_trait::Order::Asc)).await?;
        all.iter().map(|r| info(r, now)).collect()
    }

    /// Creates the index the scheduler's queries on the queue need (the
    /// schedule's tasks by tick), if missing.
    pub async fn ensure_indexes(&self) -> Result<(), AgentError> {
        let by_schedule = store_trait::IndexSpec::new(
            "schedule",
            vec![
                (task_fields::SCHEDULE.into(), store_trait::Order::Asc),
                (task_fields::SCHEDULED_FOR.into(), store_trait::Order::Asc),
            ],
        )
        .sparse();
        self.queue.ensure_indexes().await?;
        Ok(self.store.ensure_indexes(&self.queue.coll, &[by_schedule]).await?)
    }

    /// Whether a task of the schedule has not ended.
    pub(crate) async fn has_unfinished(&self, name: &str) -> Result<bool, AgentError> {
        let q = Query::eq(doc! { task_fields::SCHEDULE: name }).when(not_complete()).limit(1);
        Ok(self.store.count(&self.queue.coll, &q).await? > 0)
    }
}

impl<S: Store + Clone> Schedules<S> {
    /// With [`Overlap::Queue`]: lets the oldest held task of the schedule
    /// through once the one let through before has ended. Returns whether
    /// held tasks remain.
    ///
    /// One at a time across processes: the schedule's `running` field moves
    /// from an ended task to the next by a compare-and-set, and only then is
    /// that task made ready (a process that dies between the two leaves it to
    /// the next pass, which finishes the step).
    pub(crate) async fn let_through(&self, name: &str) -> Result<bool, AgentError> {
        let key = Self::key(name)?;
        let Some(sched) = self.store.get(&self.coll, &key).await?.record else { return Ok(false) };
        let running = sched.data().get(fields::RUNNING).filter(|b| !matches!(b, Bson::Null)).cloned();
        let release = |id: Bson| async move {
            let k = Key::from_bson(id)?;
            let w = Write::new(
                Condition::FieldEq(task_fields::OVERLAP_HELD.into(), Bson::Boolean(true)),
                Mutation::new().set(task_fields::READY, true).unset(task_fields::OVERLAP_HELD),
            );
            self.store.write(&self.queue.coll, &k, &w).await.map(|o| o.is_applied())
        };
        if let Some(id) = &running {
            let task = self.store.get(&self.queue.coll, &Key::from_bson(id.clone())?).await?.record;
            if let Some(t) = task {
                if t.data().get_bool(task_fields::COMPLETE).ok() != Some(true) {
                    // Not ended: make sure it was let through (a process may have
                    // died between the two steps), and wait for it.
                    if t.data().get_bool(task_fields::OVERLAP_HELD).ok() == Some(true) {
                        release(id.clone()).await?;
                    }
                    return self.has_held(name).await;
                }
            }
        }
        let oldest = Query::eq(doc! { task_fields::SCHEDULE: name, task_fields::OVERLAP_HELD: true })
            .sort(task_fields::SCHEDULED_FOR, store_trait::Order::Asc)
            .limit(1);
        let Some(next) = self.store.find(&self.queue.coll, &oldest).await?.into_iter().next() else {
            return Ok(false);
        };
        let next_id = next.key().as_bson().clone();
        let cond = match running {
            Some(id) => Condition::FieldEq(fields::RUNNING.into(), id),
            None => Condition::Exists(fields::RUNNING.into()).negate(),
        };
        let w = Write::new(cond, Mutation::new().set(fields::RUNNING, next_id.clone()));
        if self.store.write(&self.coll, &key, &w).await?.is_applied() {
            release(next_id).await?;
            tracing::info!(schedule = %name, task = %next.key(), "held tick let through");
        }
        self.has_held(name).await
    }

    async fn has_held(&self, name: &str) -> Result<bool, AgentError> {
        let q = Query::eq(doc! { task_fields::SCHEDULE: name, task_fields::OVERLAP_HELD: true }).limit(1);
        Ok(self.store.count(&self.queue.coll, &q).await? > 0)
    }
}

/// An integer field, 32- or 64-bit (a document written by another client may hold either).
fn int_field(r: &Record, k: &str) -> Option<i64> {
    match r.data().get(k) {
        Some(Bson::Int64(n)) => Some(*n),
        Some(Bson::Int32(n)) => Some(i64::from(*n)),
        _ => None,
    }
}

fn version_of(r: &Record) -> u64 {
    int_field(r, fields::VERSION).and_then(|v| u64::try_from(v).ok()).unwrap_or(0)
}

/// The first tick considered: after the last one handled, not before `since`
/// (a one-off time ignores `since`: one set in the past runs once, per the
/// missed-tick policy).
pub(crate) fn from_of(s: &Schedule, r: &Record) -> i64 {
    let last = int_field(r, fields::LAST_TICK).map(|t| t.saturating_add(1));
    let since = int_field(r, fields::SINCE).unwrap_or(0);
    match s.when {
        When::At(_) => last.unwrap_or(i64::MIN),
        _ => last.unwrap_or(i64::MIN).max(since),
    }
}

pub(crate) fn parse_record(r: &Record) -> Result<Schedule, AgentError> {
    let name = match r.key().as_bson() {
        Bson::String(s) => s.clone(),
        other => other.to_string(),
    };
    let def = r
        .data()
        .get_document(fields::DEF)
        .map_err(|_| AgentError::InvalidTask(format!("schedule {name:?} has no definition")))?;
    Schedule::from_def(&name, def)
}

fn info(r: &Record, now: StoreTime) -> Result<ScheduleInfo, AgentError> {
    let schedule = parse_record(r)?;
    let paused = r.data().get_bool(fields::PAUSED).unwrap_or(false);
    let from = from_of(&schedule, r).max(now.as_millis().saturating_add(1));
    let next_tick = if paused { None } else { schedule.ticks()?.next_at_or_after(from).map(StoreTime::from_millis) };
    Ok(ScheduleInfo {
        version: version_of(r),
        paused,
        last_tick: int_field(r, fields::LAST_TICK).map(StoreTime::from_millis),
        last_task: r.data().get_str(fields::LAST_TASK).ok().map(str::to_owned),
        next_tick,
        schedule,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn hourly(missed: Missed) -> Schedule {
        Schedule::every("h", Duration::from_secs(3600), NewTask::new("w", doc! {})).unwrap().missed(missed)
    }

    #[test]
    fn jitter_is_the_same_in_every_process() {
        let a = hourly(Missed::Skip).jitter(Duration::from_secs(30));
        let b = hourly(Missed::Skip).jitter(Duration::from_secs(30));
        let tick = StoreTime::from_millis(3_600_000);
        assert_eq!(a.template(tick), b.template(tick));
        assert_eq!(a.template(tick).id, Some(Bson::String("sched/h/3600000".into())));
        assert!((0..=30_000).contains(&a.jitter_for(tick)));
        assert_eq!(hourly(Missed::Skip).jitter_for(tick), 0);
    }

    #[test]
    fn plans_per_missed_tick_policy() {
        const H: i64 = 3_600_000;
        // Last handled at 1h; noticed at 5h + 30 s: 5h is on time, 2h to 4h missed.
        let (from, now) = (H + 1, 5 * H + 30_000);
        let plan = |m: Missed| {
            let s = hourly(m);
            s.plan(&s.ticks().unwrap(), from, now)
        };
        assert_eq!(plan(Missed::Skip), Plan { run: vec![5 * H], newest: Some(5 * H) });
        assert_eq!(plan(Missed::Once), Plan { run: vec![5 * H], newest: Some(5 * H) });
        assert_eq!(plan(Missed::All(2)), Plan { run: vec![3 * H, 4 * H, 5 * H], newest: Some(5 * H) });
        assert_eq!(plan(Missed::All(0)).run, vec![5 * H]);
        // Noticed at 5h + 2 min: every due tick is missed.
        let late = |m: Missed| {
            let s = hourly(m);
            s.plan(&s.ticks().unwrap(), from, 5 * H + 120_000)
        };
        assert_eq!(late(Missed::Skip), Plan { run: vec![], newest: Some(5 * H) });
        assert_eq!(late(Missed::Once), Plan { run: vec![5 * H], newest: Some(5 * H) });
        assert_eq!(late(Missed::All(10)).run, vec![2 * H, 3 * H, 4 * H, 5 * H]);
        // Nothing due.
        assert_eq!(late(Missed::All(10)).newest, Some(5 * H));
        let s = hourly(Missed::Once);
        assert_eq!(s.plan(&s.ticks().unwrap(), 5 * H + 1, 5 * H + 120_000), Plan { run: vec![], newest: None });
    }

    #[test]
    fn definitions_round_trip() {
        let s = Schedule::cron("c", "*/5 * * * *", "UTC", NewTask::new("w", doc! {"a": 1}).priority(3).max_attempts(2))
            .unwrap()
            .overlap(Overlap::Queue)
            .missed(Missed::All(4))
            .starting_deadline(Duration::from_secs(9))
            .jitter(Duration::from_millis(5));
        assert_eq!(Schedule::from_def("c", &s.to_def().unwrap()).unwrap(), s);
        let at = Schedule::at("a", StoreTime::from_millis(42), NewTask::new("w", doc! {})).unwrap();
        assert_eq!(Schedule::from_def("a", &at.to_def().unwrap()).unwrap(), at);
        assert!(Schedule::from_def("x", &doc! {"kind": "cron"}).is_err());
        let offset = When::Every { every: Duration::from_secs(1), offset: Duration::from_secs(1) };
        assert!(Schedule::new("o", offset, NewTask::new("w", doc! {})).is_err(), "the offset must be shorter");
    }
}
