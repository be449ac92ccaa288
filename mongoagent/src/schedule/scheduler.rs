//! The scheduler: a periodic executor that sleeps until the next tick of any
//! schedule, wakes early when a schedule changes, and stops promptly.

use std::time::Duration;

use bson::Bson;
use store_trait::helpers::Watcher;
use store_trait::{Condition, InsertOutcome, Mutation, Query, Record, Store, StoreError, StoreTime, Write};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ticks::MAX_KEYS_TO_CHECK;
use super::{fields, from_of, last_tick, parse_record, unchanged, Overlap, Schedule, Schedules, Unfinished};
use mongolock::unstable::Backoff;

use crate::error::AgentError;

/// Turns the ticks of a queue's schedules into tasks. Run one in every process
/// that should keep the schedules going: nobody is elected, and each tick still
/// becomes exactly one task (its id is derived from the schedule and the tick).
///
/// It sleeps until the next tick of any schedule (on the store clock), wakes
/// early when a schedule changes (change notifications, or a poll every
/// [`Scheduler::poll_every`] on a store without them), and has no other timer.
#[derive(Debug, Clone)]
pub struct Scheduler<S> {
    schedules: Schedules<S>,
    poll_every: Duration,
    retry_max: Duration,
    only: Option<String>,
}

/// A running scheduler. Dropping it stops the scheduler (at its next await
/// point); [`SchedulerHandle::stop`] also waits for it to end.
#[derive(Debug)]
pub struct SchedulerHandle {
    cancel: CancellationToken,
    join: Option<tokio::task::JoinHandle<Result<(), AgentError>>>,
}

impl SchedulerHandle {
    /// Stops the scheduler and waits for it; returns the error that ended it, if any.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the scheduler is told to stop before the first await; dropping
    /// the future only stops waiting for it to end.
    pub async fn stop(mut self) -> Result<(), AgentError> {
        self.cancel.cancel();
        match self.join.take() {
            Some(j) => j.await.unwrap_or(Ok(())),
            None => Ok(()),
        }
    }

    /// Whether it ended (stopped, or failed for good).
    pub fn is_finished(&self) -> bool {
        self.join.as_ref().is_none_or(|j| j.is_finished())
    }
}

impl Drop for SchedulerHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(j) = &self.join {
            j.abort();
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pass {
    /// Tasks this pass inserted (others may have been inserted by other processes).
    pub enqueued: u64,
    /// The next tick of any schedule, on the store clock.
    pub next_tick: Option<StoreTime>,
    /// Whether tasks held back by [`Overlap::Queue`] wait for a running one to end.
    pub held: bool,
    /// The store time the pass read, and when.
    read_now: StoreTime,
    read_at: Instant,
}

impl Default for Pass {
    fn default() -> Self {
        Pass { enqueued: 0, next_tick: None, held: false, read_now: StoreTime::default(), read_at: Instant::now() }
    }
}

impl<S: Store + Clone> Scheduler<S> {
    /// A scheduler for `schedules`.
    pub fn new(schedules: Schedules<S>) -> Self {
        Scheduler { schedules, poll_every: Duration::from_secs(5), retry_max: Duration::from_secs(5), only: None }
    }

    /// Handles only the schedule named `name` (default: every schedule in the
    /// collection). A process that runs one schedule's tasks (as `mongocoord
    /// cron` does) enqueues only that schedule's ticks: the ticks of a schedule
    /// whose processes are all down are then not enqueued meanwhile, and its
    /// missed-tick policy decides what runs when they come back.
    #[must_use]
    pub fn only(mut self, name: impl Into<String>) -> Self {
        self.only = Some(name.into());
        self
    }

    /// On a store without change notifications, how often to look for changed
    /// schedules (default 5 s). Also the delay before re-subscribing after a
    /// change stream ends.
    #[must_use]
    pub fn poll_every(mut self, d: Duration) -> Self {
        self.poll_every = d.max(Duration::from_millis(1));
        self
    }

    /// Starts the scheduler on the current tokio runtime. It stops when the
    /// handle is dropped or stopped.
    pub fn spawn(self) -> SchedulerHandle {
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let join = tokio::spawn(async move { self.run(token).await });
        SchedulerHandle { cancel, join: Some(join) }
    }

    /// Runs until `cancel` is cancelled. Transient store errors are retried with
    /// backoff; others end it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a pass cut short leaves at most ticks enqueued but not
    /// recorded, which the next pass (of any process) enqueues again as
    /// duplicates and records; under [`Overlap::Skip`] it finds such a tick
    /// among those from `last_tick` on, and skips while it runs.
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), AgentError> {
        let s = &self.schedules;
        let mut backoff = Backoff::new(Duration::from_millis(50), self.retry_max);
        loop {
            match s.ensure_indexes().await {
                Ok(()) => break,
                Err(e) if e.is_retryable() => {
                    tracing::warn!(schedules = %s.coll, error = %e, "creating indexes failed; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let mut events = Watcher::open(s.store.clone(), s.coll.clone(), None, self.poll_every).await;
        let push = events.is_live();
        tracing::info!(schedules = %s.coll, push, "scheduler running");
        backoff.reset();
        // Opened once a schedule holds tasks back (Overlap::Queue): the end of
        // the running task lets the next one through.
        let mut task_events: Option<Watcher<S>> = None;
        let mut held = false;
        loop {
            if cancel.is_cancelled() {
                break;
            }
            // A pass is cancel-safe: stopping mid-pass loses nothing.
            let pass = tokio::select! {
                _ = cancel.cancelled() => break,
                pass = self.pass() => pass,
            };
            let wake = match pass {
                Ok(pass) => {
                    backoff.reset();
                    held = pass.held;
                    if held && task_events.is_none() {
                        let w = Watcher::open(s.store.clone(), s.queue.coll.clone(), None, self.poll_every).await;
                        task_events = Some(w.ignore_renewals());
                        // A task may have ended before the subscription: look again.
                        continue;
                    }
                    // The next tick, from the store time the pass read and the
                    // moment it read it.
                    let at_tick =
                        pass.next_tick.map(|t| pass.read_at + pass.read_now.until(t).max(Duration::from_millis(1)));
                    // Without notifications, look for changed schedules every `poll_every`.
                    let task_push = !held || task_events.as_ref().is_some_and(Watcher::is_live);
                    let cap = if events.is_live() && task_push { None } else { Some(Instant::now() + self.poll_every) };
                    [at_tick, cap].into_iter().flatten().min()
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(schedules = %s.coll, error = %e, "scheduler pass failed; retrying");
                    let at = Instant::now() + backoff.next_delay();
                    Some(at)
                }
                Err(e) => {
                    tracing::error!(schedules = %s.coll, error = %e, "scheduler stopped");
                    return Err(e);
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = async { match wake { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {}
                _ = events.changed() => {
                    // Coalesce a burst of notifications into one pass.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    events.drain_ready();
                }
                _ = async { match task_events.as_mut() { Some(w) => { w.changed().await; } None => std::future::pending().await } }, if held => {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    if let Some(w) = task_events.as_mut() {
                        w.drain_ready();
                    }
                }
            }
        }
        tracing::info!(schedules = %s.coll, "scheduler stopped");
        Ok(())
    }

    /// One pass: enqueues every due tick of every schedule (per its policies)
    /// and records it; returns the next tick of any schedule.
    ///
    /// # Cancel safety
    ///
    /// See [`Scheduler::run`].
    pub async fn pass(&self) -> Result<Pass, AgentError> {
        let s = &self.schedules;
        let which = match &self.only {
            Some(name) => Query::eq(bson::doc! { "_id": name.as_str() }),
            None => Query::all(),
        };
        let records = s.store.find(&s.coll, &which).await?;
        let read_now = s.store.now().await?;
        let mut out = Pass { read_now, read_at: Instant::now(), ..Pass::default() };
        let now = read_now.as_millis();
        for r in records {
            if r.data().get_bool(fields::PAUSED).unwrap_or(false) {
                continue;
            }
            let sched = match parse_record(&r) {
                Ok(sched) => sched,
                Err(e) => {
                    tracing::warn!(schedule = %r.key(), error = %e, "schedule cannot be read; skipped");
                    continue;
                }
            };
            match self.pass_one(&sched, &r, now, &mut out).await {
                Ok(()) => {}
                // One schedule's bad data (a field another program wrote) is
                // that schedule's problem, not every schedule's.
                Err(
                    e @ (AgentError::Config(_)
                    | AgentError::InvalidTask(_)
                    | AgentError::ReservedField { .. }
                    | AgentError::Store(StoreError::InvalidInput { .. } | StoreError::Malformed { .. })),
                ) => {
                    tracing::warn!(schedule = %r.key(), error = %e, "schedule cannot be handled; skipped");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The pass's work on one schedule: its due ticks enqueued (per its
    /// policies) and recorded, held ticks let through, its next tick noted.
    async fn pass_one(&self, sched: &Schedule, r: &Record, now: i64, out: &mut Pass) -> Result<(), AgentError> {
        let s = &self.schedules;
        // Skip checks the ticks from the recorded `last_tick` up to `now`. A
        // pass reads every schedule, and the time, once, and may reach this
        // one late; another pass, later, may have recorded a newer tick in
        // the meantime, which this one would not check. So it reads the
        // schedule again, with the store's time, before a check.
        if sched.overlap == Overlap::Skip && !sched.plan(&sched.ticks()?, from_of(sched, r), now).run.is_empty() {
            let snap = s.store.get(&s.coll, r.key()).await?;
            let Some(fresh) = snap.record else { return Ok(()) };
            if fresh.data().get_bool(fields::PAUSED).unwrap_or(false) {
                return Ok(());
            }
            return self.handle(&parse_record(&fresh)?, &fresh, snap.now.as_millis(), out).await;
        }
        self.handle(sched, r, now, out).await
    }

    /// [`Scheduler::pass_one`] on the schedule as read at `now`.
    async fn handle(&self, sched: &Schedule, r: &Record, now: i64, out: &mut Pass) -> Result<(), AgentError> {
        let s = &self.schedules;
        let ticks = sched.ticks()?;
        let from = from_of(sched, r);
        let plan = sched.plan(&ticks, from, now);
        if let Some(newest) = plan.newest {
            let mut run = plan.run;
            // What the record says may still run: set only by a pass that
            // checked (Skip), withdrawn by every other.
            let mut only_open = None;
            if sched.overlap == Overlap::Skip && !run.is_empty() {
                let since_last = ticks.between(last_tick(r).unwrap_or(from), now, MAX_KEYS_TO_CHECK);
                match s.unfinished(&sched.name, r, &since_last).await? {
                    Unfinished::None => {
                        // The ticks of one pass would overlap each other: the newest runs.
                        run.drain(..run.len() - 1);
                        only_open =
                            run.last().map(|&t| Bson::String(super::task_id(&sched.name, StoreTime::from_millis(t))));
                    }
                    open => {
                        tracing::info!(schedule = %sched.name, skipped = run.len(), "tick skipped: the previous task has not ended");
                        run.clear();
                        if let Unfinished::One(k) = open {
                            only_open = Some(k.as_bson().clone());
                        }
                    }
                }
            }
            let tasks: Vec<_> = run.iter().map(|&t| sched.template(StoreTime::from_millis(t))).collect();
            let mut inserted = 0;
            if !tasks.is_empty() {
                let outcomes = s.queue.enqueue_all(&tasks).await?;
                inserted = outcomes.iter().filter(|o| matches!(o, InsertOutcome::Inserted(_))).count();
                out.enqueued += u64::try_from(inserted).unwrap_or(u64::MAX);
                tracing::info!(schedule = %sched.name, ticks = tasks.len(), inserted, "ticks enqueued");
            }
            // Only forward, and only for the definition this pass read.
            let mut m = Mutation::new().set(fields::LAST_TICK, newest);
            if let Some(&last) = run.last() {
                m = m.set(fields::LAST_TASK, super::task_id(&sched.name, StoreTime::from_millis(last)));
            }
            // Ticks of another policy are not let through by Queue: held ones
            // left from it wait for them too (`Schedules::let_through`).
            if sched.overlap != Overlap::Queue && r.data().get(fields::RUNNING).is_some_and(|b| *b != Bson::Null) {
                m = m.set(fields::RUNNING, Bson::Null);
            }
            m = match &only_open {
                Some(id) => m.set(fields::ONLY_OPEN, id.clone()),
                None => m.unset(fields::ONLY_OPEN),
            };
            // `since` too: a schedule deleted and created again under its name
            // starts at version 1 again, with its own `since`.
            let cond = Condition::AtMost(fields::LAST_TICK.into(), newest.saturating_sub(1))
                .and(unchanged(r, fields::VERSION))
                .and(unchanged(r, fields::SINCE));
            let recorded = s.store.write(&s.coll, r.key(), &Write::new(cond, m)).await?.is_applied();
            // A tick this pass inserted after another pass recorded a newer
            // one (this pass was held up) is at or before `last_tick` and not
            // named: the next pass must look at every unfinished tick.
            // Whatever this pass's policy: the schedule may be Skip now.
            if !recorded && inserted > 0 {
                s.withdraw_only_open(r.key(), only_open.as_ref()).await?;
            }
        }
        // Also after a change away from Queue, until the held tasks are
        // through: marked by `running`, or, where none was let through yet
        // (or the schedule was deleted and created again), found by a pass
        // with ticks due.
        let held = sched.overlap == Overlap::Queue
            || r.data().contains_key(fields::RUNNING)
            || (plan.newest.is_some() && s.has_held(&sched.name).await?);
        if held {
            out.held |= s.let_through(&sched.name).await?;
        }
        let after = from.max(now.saturating_add(1)).max(plan.newest.map_or(i64::MIN, |t| t.saturating_add(1)));
        if let Some(next) = ticks.next_at_or_after(after) {
            let next = StoreTime::from_millis(next);
            out.next_tick = Some(out.next_tick.map_or(next, |t: StoreTime| t.min(next)));
        }
        Ok(())
    }
}
