//! A schedule's definition: when it ticks (cron in a time zone, an interval,
//! one time), what each tick enqueues, and its policies (overlap, missed
//! ticks, starting deadline, jitter).

use std::time::Duration;

use bson::{doc, Bson, Document};
use mongolock::ConfigError;
use store_trait::{Key, StoreTime};

use super::ticks::{self, Ticks};
use super::{task_id, Plan};
use crate::error::AgentError;
use crate::schema::fields as task_fields;
use crate::task::NewTask;

/// Field names of a schedule document.
pub mod fields {
    /// The definition (a subdocument), compared on upsert.
    pub const DEF: &str = "def";
    /// Grows by one each time the definition changes (1 when created).
    pub const VERSION: &str = "version";
    /// Whether ticks are skipped.
    pub const PAUSED: &str = "paused";
    /// Ticks before this instant (epoch ms) are never run: when the schedule
    /// was created, last changed or resumed. A one-off time
    /// ([`super::When::At`]) is not held to it: one that has passed runs once
    /// or not, per the missed-tick policy.
    pub const SINCE: &str = "since";
    /// The last tick handled, run or skipped (epoch ms); only moves forward.
    pub const LAST_TICK: &str = "last_tick";
    /// The id of the last task enqueued.
    pub const LAST_TASK: &str = "last_task";
    /// With [`super::Overlap::Skip`]: the id of the one tick at or before
    /// `last_tick` that may not have ended; every other had, when a pass
    /// checked them and wrote this. A pass then reads only that tick and
    /// those from `last_tick` on. Removed by a pass that records ticks
    /// without that check (another policy, ticks missed), by a change of the
    /// definition and by a resume.
    pub const ONLY_OPEN: &str = "only_open";
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
    /// The tick is skipped (recorded as handled, no task) while an earlier
    /// tick's task has not ended. When one pass finds several ticks to run
    /// (missed ticks caught up), only the newest runs. A tick
    /// [cancelled](crate::Queue::cancel) while its handler runs counts as
    /// ended at once, though the handler stops only when its agent sees the
    /// cancel (at the latest when its lease ends); a tick revived by
    /// [`Queue::requeue`](crate::Queue::requeue) after a later tick was
    /// enqueued is not waited for.
    #[default]
    Skip,
    /// The tick's task is enqueued anyway.
    Allow,
    /// The tick's task is enqueued held back (not ready), and made ready once
    /// the previous tick's task has ended: ticks run one at a time, in order.
    /// Ticks enqueued under another policy before a change to this one are
    /// waited for first. Held tasks wait while the schedule is paused; if
    /// the policy is changed, they are let through one at a time under
    /// [`Overlap::Skip`] and all at once under [`Overlap::Allow`]; they stay
    /// held if the schedule is deleted. As with [`Overlap::Skip`], a
    /// cancelled tick counts as ended at once; a tick revived by
    /// [`Queue::requeue`](crate::Queue::requeue) is ready again at once,
    /// beside the tick let through.
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
/// use mongoagent::schedule::Schedule;
/// use mongoagent::NewTask;
/// let nightly = Schedule::cron("nightly-report", "0 30 2 * * *", "Europe/Berlin", NewTask::new("report", bson::doc! {}))
///     .unwrap()
///     .starting_deadline(std::time::Duration::from_secs(600));
/// # let _ = nightly;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub(crate) name: String,
    pub(crate) when: When,
    pub(crate) agent_name: String,
    pub(crate) data: Document,
    pub(crate) priority: i64,
    pub(crate) max_attempts: Option<u32>,
    /// Each tick's task's own execution timeout ([`NewTask::timeout`]).
    pub(crate) timeout: Option<Duration>,
    /// The group every tick's task runs in ([`NewTask::group`]).
    pub(crate) group: Option<String>,
    pub(crate) overlap: Overlap,
    pub(crate) missed: Missed,
    pub(crate) starting_deadline: Duration,
    pub(crate) jitter: Duration,
}

/// The longest interval, starting deadline or jitter accepted: 366 days.
pub(crate) const MAX_SPAN: Duration = Duration::from_secs(366 * 24 * 3600);

pub(crate) fn ms_of(what: &str, d: Duration) -> Result<i64, AgentError> {
    if d > MAX_SPAN {
        return Err(AgentError::Config(format!("{what} {d:?} is longer than 366 days").into()));
    }
    i64::try_from(d.as_millis()).map_err(|_| AgentError::Config(format!("{what} {d:?} is too long").into()))
}

impl Schedule {
    /// A schedule named `name` (its id) that enqueues `task` at each tick. Of
    /// `task`, the agent name, data, priority, attempt limit, timeout and
    /// group are used.
    ///
    /// A tick's task in a group ([`NewTask::group`]) waits for its group's
    /// turn like any task of the group, behind the tasks enqueued before it:
    /// a schedule's ticks share one customer's or one entity's group with
    /// the tasks producers enqueue for it. Its ticks are enqueued in tick
    /// order, so under a cap of 1 they also run one at a time, in order,
    /// which is what [`Overlap::Queue`] would add: a grouped schedule takes
    /// [`Overlap::Skip`] or [`Overlap::Allow`] ([`Schedules::upsert`](super::Schedules::upsert)
    /// refuses [`Overlap::Queue`] with a group, as [`AgentError::Config`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use mongoagent::schedule::{Overlap, Schedule};
    /// use mongoagent::NewTask;
    ///
    /// // Every hour, customer 42's statement, in turn with its orders.
    /// let task = NewTask::new("billing", bson::doc! { "statement": true }).group("customer-42");
    /// let s = Schedule::every("statement-42", Duration::from_secs(3600), task)?.overlap(Overlap::Allow);
    /// # let _ = s;
    /// # Ok::<(), mongoagent::AgentError>(())
    /// ```
    pub fn new(name: impl Into<String>, when: When, task: NewTask) -> Result<Self, AgentError> {
        let s = Self::valid(name.into(), when, task)?;
        // A cron expression of a date that never comes (the 30th of
        // February) parses, then waits for ever. Checked here, for a
        // definition being made, not on one read back: a cron with a year
        // has no tick after its last, which a pass reads it to enqueue.
        let now = store_trait::Clock::now(&store_trait::SystemClock).as_millis();
        if matches!(s.when, When::Cron { .. }) && s.ticks()?.next_at_or_after(now).is_none() {
            return Err(AgentError::Config("the cron expression never fires".into()));
        }
        Ok(s)
    }

    /// A schedule whose parts are each valid (what [`Schedule::new`] checks
    /// but whether a cron expression has a tick to come).
    fn valid(name: String, when: When, task: NewTask) -> Result<Self, AgentError> {
        let s = Schedule {
            name,
            when,
            agent_name: task.agent_name,
            data: task.data,
            priority: task.priority,
            max_attempts: task.max_attempts,
            timeout: task.timeout,
            group: task.group,
            overlap: Overlap::default(),
            missed: Missed::default(),
            starting_deadline: Duration::from_secs(60),
            jitter: Duration::ZERO,
        };
        s.ticks()?;
        s.template(StoreTime::from_millis(0)).to_document()?;
        // The name is the schedule's key, and part of every tick's task id.
        Key::new(s.name.as_str()).map_err(|e| AgentError::Config(ConfigError::caused_by(e)))?;
        Key::new(task_id(&s.name, StoreTime::from_millis(i64::MIN)))
            .map_err(|e| AgentError::Config(ConfigError::caused_by(e)))?;
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
    #[must_use]
    pub fn overlap(mut self, o: Overlap) -> Self {
        self.overlap = o;
        self
    }

    /// The missed-tick policy (default [`Missed::Skip`]).
    #[must_use]
    pub fn missed(mut self, m: Missed) -> Self {
        self.missed = m;
        self
    }

    /// A tick older than this when a scheduler notices it is missed (default
    /// 60 s; at least 1 ms, at most 366 days; longer values are capped).
    #[must_use]
    pub fn starting_deadline(mut self, d: Duration) -> Self {
        self.starting_deadline = d.clamp(Duration::from_millis(1), MAX_SPAN);
        self
    }

    /// Each tick's task is made ready up to this much after the tick (a
    /// pseudo-random amount derived from the name and the tick; default none;
    /// at most 366 days).
    #[must_use]
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

    /// The data every tick's task carries.
    pub fn data(&self) -> &Document {
        &self.data
    }

    /// The group every tick's task runs in, if any.
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
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
                    ).into()));
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
        t.timeout = self.timeout;
        t.group.clone_from(&self.group);
        t.schedule = Some((self.name.clone(), tick));
        t.held = self.overlap == Overlap::Queue;
        t
    }

    pub(crate) fn jitter_for(&self, tick: StoreTime) -> i64 {
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

    pub(crate) fn to_def(&self) -> Result<Document, AgentError> {
        let mut d = doc! { task_fields::AGENT_NAME: &self.agent_name, "data": self.data.clone(), task_fields::PRIORITY: self.priority };
        if let Some(n) = self.max_attempts {
            d.insert(task_fields::MAX_ATTEMPTS, i64::from(n));
        }
        if let Some(t) = self.timeout {
            d.insert(task_fields::TIMEOUT_MS, crate::task::timeout_ms(t)?);
        }
        self.check_overlap()?;
        if let Some(g) = &self.group {
            d.insert(task_fields::GROUP_KEY, g.as_str());
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

    pub(crate) fn from_def(name: &str, d: &Document) -> Result<Self, AgentError> {
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
            d.get_str(task_fields::AGENT_NAME).map_err(|_| bad(task_fields::AGENT_NAME))?,
            d.get_document("data").map_err(|_| bad("data"))?.clone(),
        )
        .priority(int(task_fields::PRIORITY)?);
        if d.contains_key(task_fields::MAX_ATTEMPTS) {
            task = task.max_attempts(
                u32::try_from(int(task_fields::MAX_ATTEMPTS)?).map_err(|_| bad(task_fields::MAX_ATTEMPTS))?,
            );
        }
        if d.contains_key(task_fields::TIMEOUT_MS) {
            task = task.timeout(dur(task_fields::TIMEOUT_MS)?);
        }
        if d.contains_key(task_fields::GROUP_KEY) {
            task = task.group(d.get_str(task_fields::GROUP_KEY).map_err(|_| bad(task_fields::GROUP_KEY))?);
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
        let s = Schedule::valid(name.to_owned(), when, task)?
            .overlap(overlap)
            .missed(missed)
            .starting_deadline(dur("starting_deadline_ms")?)
            .jitter(dur("jitter_ms")?);
        s.check_overlap()?;
        Ok(s)
    }

    /// A grouped schedule's ticks already wait for their group's turn, in
    /// tick order: [`Overlap::Queue`] would hold each back a second time, and
    /// a tick let through by one of the two could wait for ever on the other.
    fn check_overlap(&self) -> Result<(), AgentError> {
        match (&self.group, self.overlap) {
            (Some(g), Overlap::Queue) => Err(AgentError::Config(format!(
                "schedule {:?}: its ticks are in group {g:?}, whose turn they already wait for in tick order (one at a time under a cap of 1): give it Overlap::Skip or Overlap::Allow, not Overlap::Queue",
                self.name
            ).into())),
            _ => Ok(()),
        }
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
