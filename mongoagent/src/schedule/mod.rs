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

mod definition;
mod held;
mod scheduler;
mod ticks;

use bson::{doc, Bson};
use mongolock::ConfigError;
use store_trait::{Collection, Condition, InsertOutcome, Key, Mutation, Query, Record, Store, StoreTime, Write};

pub use definition::{fields, Missed, Overlap, Schedule, When};
pub use scheduler::{Pass, Scheduler, SchedulerHandle};

use crate::error::AgentError;
use crate::queue::Queue;
use crate::schema::fields as task_fields;
use crate::schema::not_complete;

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
/// use mongoagent::schedule::{Schedule, Schedules};
/// use mongoagent::NewTask;
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
        let coll = Collection::new(collection).map_err(|e| AgentError::Config(ConfigError::caused_by(e)))?;
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
        Key::new(name).map_err(|e| AgentError::Config(ConfigError::caused_by(e)))
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
                        Mutation::new()
                            .set(fields::DEF, def.clone())
                            .set(fields::SINCE, now)
                            .inc(fields::VERSION, 1)
                            .unset(fields::ONLY_OPEN),
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
            // Ticks that fell while paused are not run (and a tick enqueued
            // before, whose record was lost, is looked for again).
            m = m.set(fields::SINCE, self.store.now().await?.as_millis()).unset(fields::ONLY_OPEN);
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
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in effect: one conditional write; a dropped call may or may not
    /// have paused the schedule, and pausing again is idempotent.
    pub async fn pause(&self, name: &str) -> Result<bool, AgentError> {
        self.set_paused(name, true).await
    }

    /// Resumes the schedule; the ticks that fell while it was paused are not
    /// run, but for a one-off time ([`When::At`]), which runs once or not per
    /// the missed-tick policy, as one set in the past does. False when there
    /// is no such schedule.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in effect: one conditional write, idempotent.
    pub async fn resume(&self, name: &str) -> Result<bool, AgentError> {
        self.set_paused(name, false).await
    }

    /// Deletes the schedule (its tasks stay). False when there was none.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in effect: one delete, idempotent.
    pub async fn delete(&self, name: &str) -> Result<bool, AgentError> {
        let out = self.store.delete(&self.coll, &Self::key(name)?, &Condition::Always).await?;
        let deleted = matches!(out, store_trait::DeleteOutcome::Deleted(_));
        if deleted {
            tracing::info!(schedule = %name, "schedule deleted");
        }
        Ok(deleted)
    }

    /// One schedule as stored (`None` when there is none).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read.
    pub async fn get(&self, name: &str) -> Result<Option<ScheduleInfo>, AgentError> {
        let snap = self.store.get(&self.coll, &Self::key(name)?).await?;
        snap.record.map(|r| info(&r, snap.now)).transpose()
    }

    /// Every schedule, by name.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: reads only.
    pub async fn list(&self) -> Result<Vec<ScheduleInfo>, AgentError> {
        self.list_each().await?.into_iter().collect()
    }

    /// Every schedule, by name, each read on its own: a document that is
    /// not a schedule (another program's, a damaged one) is its own
    /// `Err` (a [`StoreError::Malformed`](store_trait::StoreError::Malformed)
    /// naming it), and the others are still read.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: reads only.
    pub async fn list_each(&self) -> Result<Vec<Result<ScheduleInfo, AgentError>>, AgentError> {
        let now = self.store.now().await?;
        let all = self.store.find_each(&self.coll, &Query::all().sort("_id", store_trait::Order::Asc)).await?;
        let coll = self.coll.as_str();
        Ok(all
            .into_iter()
            .map(|r| {
                let r = r?;
                info(&r, now).map_err(|e| {
                    let reason = match e {
                        AgentError::InvalidTask(reason) => reason,
                        other => other.to_string(),
                    };
                    AgentError::Store(store_trait::StoreError::malformed(coll, r.key(), reason))
                })
            })
            .collect())
    }

    /// Creates the index the scheduler's queries on the queue need (a
    /// schedule's ticks, its held ticks first, each by tick), if missing.
    ///
    /// `overlap_held` is in it so that finding the oldest held tick
    /// ([`Overlap::Queue`]) reads the held ticks alone, not every kept tick.
    /// (It replaces an index `schedule` without that field, which a queue
    /// scheduled by an earlier version keeps until it is dropped by hand.)
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: index creation is idempotent.
    pub async fn ensure_indexes(&self) -> Result<(), AgentError> {
        let by_schedule = store_trait::IndexSpec::new(
            "schedule_held",
            vec![
                (task_fields::SCHEDULE.into(), store_trait::Order::Asc),
                (task_fields::OVERLAP_HELD.into(), store_trait::Order::Asc),
                (task_fields::SCHEDULED_FOR.into(), store_trait::Order::Asc),
            ],
        )
        .sparse();
        self.queue.ensure_indexes().await?;
        Ok(self.store.ensure_indexes(&self.queue.coll, &[by_schedule]).await?)
    }

    /// Which ticks of the schedule have not ended, `r` being its definition
    /// as the pass read it and `since_last` its ticks from `last_tick` up to
    /// now.
    ///
    /// Where a pass recorded the only tick that may not have ended
    /// ([`fields::ONLY_OPEN`]), the unfinished ones can only be that tick
    /// and those from `last_tick` on (inserted by a pass whose record was
    /// lost or refused): only they are read, by `_id`, and checked here, not
    /// by a condition (on SecantusDB's Rust server any `$expr` reads the
    /// whole collection, even beside an `_id`). Else, and when those ticks
    /// are too many, every kept tick of the schedule is read (the index does
    /// not hold `complete`, which pending tasks lack).
    pub(crate) async fn unfinished(
        &self,
        name: &str,
        r: &Record,
        since_last: &[i64],
    ) -> Result<Unfinished, AgentError> {
        let by_schedule = Query::eq(doc! { task_fields::SCHEDULE: name });
        let open = r.data().get(fields::ONLY_OPEN).and_then(|id| Key::from_bson(id.clone()).ok());
        let found = match open {
            Some(open) if since_last.len() < ticks::MAX_KEYS_TO_CHECK => {
                let ids = since_last.iter().filter_map(|&t| Key::new(task_id(name, StoreTime::from_millis(t))).ok());
                let mut keys: Vec<Key> = ids.filter(|k| *k != open).collect();
                keys.push(open);
                let found = self.store.find(&self.queue.coll, &by_schedule.keys(keys)).await?;
                found.into_iter().filter(|t| t.data().get_bool(task_fields::COMPLETE).ok() != Some(true)).collect()
            }
            _ => self.store.find(&self.queue.coll, &by_schedule.when(not_complete()).limit(2)).await?,
        };
        let mut ids = found.iter().map(|t| t.key().clone());
        Ok(match (ids.next(), ids.next()) {
            (None, _) => Unfinished::None,
            (Some(k), None) => Unfinished::One(k),
            (Some(_), Some(_)) => Unfinished::Several,
        })
    }

    /// Removes the schedule's `only_open` unless it names `ours` (the tick a
    /// pass inserted): conditional on the revision read, so that it removes
    /// only the mark it looked at.
    pub(crate) async fn withdraw_only_open(&self, key: &Key, ours: Option<&Bson>) -> Result<(), AgentError> {
        for _ in 0..3 {
            let Some(r) = self.store.get(&self.coll, key).await?.record else { return Ok(()) };
            let named = r.data().get(fields::ONLY_OPEN);
            if named.is_none() || named == ours {
                return Ok(());
            }
            let w = Write::new(Condition::RevIs(r.rev()), Mutation::new().unset(fields::ONLY_OPEN));
            if self.store.write(&self.coll, key, &w).await?.is_applied() {
                tracing::info!(schedule = %key, "a late tick inserted: the next pass reads every unfinished tick");
                return Ok(());
            }
        }
        Ok(())
    }
}

/// What [`Schedules::unfinished`] found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Unfinished {
    /// Every tick has ended.
    None,
    /// This tick alone has not.
    One(Key),
    /// More than one have not.
    Several,
}

/// That `field` of a schedule is still as it was in `r`: equal to its value,
/// or still absent (or null). What a write conditions on to be for the
/// definition it read.
pub(crate) fn unchanged(r: &Record, field: &str) -> Condition {
    match r.data().get(field) {
        Some(v) if *v != Bson::Null => Condition::FieldEq(field.into(), v.clone()),
        _ => Condition::Exists(field.into()).negate(),
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

/// The last tick a pass recorded (run or skipped), if any.
pub(crate) fn last_tick(r: &Record) -> Option<i64> {
    int_field(r, fields::LAST_TICK)
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
    use crate::task::NewTask;
    use std::time::Duration;

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
        let grouped = Schedule::every("g", Duration::from_secs(60), NewTask::new("w", doc! {}).group("c-1")).unwrap();
        let def = grouped.to_def().unwrap();
        assert_eq!(Schedule::from_def("g", &def).unwrap(), grouped);
        assert_eq!(grouped.template(StoreTime::from_millis(0)).group.as_deref(), Some("c-1"));
        // A grouped schedule's ticks already wait for their group's turn in order.
        assert!(matches!(grouped.clone().overlap(Overlap::Queue).to_def(), Err(AgentError::Config(_))));
        let mut queued = def;
        queued.insert("overlap", "queue");
        assert!(Schedule::from_def("g", &queued).is_err(), "nor is one read back");
        assert!(Schedule::from_def("x", &doc! {"kind": "cron"}).is_err());
        let offset = When::Every { every: Duration::from_secs(1), offset: Duration::from_secs(1) };
        assert!(Schedule::new("o", offset, NewTask::new("w", doc! {})).is_err(), "the offset must be shorter");
    }

    /// A cron with a year has no tick after its last: a pass reads the
    /// definition at (and just after) that tick to enqueue it, and must not
    /// refuse it as one that never fires, which only a new definition is.
    #[test]
    fn a_definition_whose_last_tick_passed_is_read_back() {
        let once = Schedule::cron("y", "0 0 9 15 3 * 2099", "Europe/Berlin", NewTask::new("w", doc! {})).unwrap();
        let mut def = once.to_def().unwrap();
        def.insert("cron", "0 0 9 15 3 * 2020");
        let back = Schedule::from_def("y", &def).unwrap();
        let last = back.ticks().unwrap().prev_at_or_before(1_609_459_200_000).unwrap();
        assert_eq!(last, 1_584_259_200_000, "2020-03-15T09:00 in Berlin (08:00Z)");
        let new = Schedule::cron("y", "0 0 9 15 3 * 2020", "Europe/Berlin", NewTask::new("w", doc! {}));
        assert!(matches!(new, Err(AgentError::Config(_))), "a new one that never fires is refused");
    }
}
