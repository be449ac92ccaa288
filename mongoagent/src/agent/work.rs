//! The work loop: up to `concurrency` tasks in flight, an idle wait that
//! sleeps until the next due time or a change notification, and the drain on
//! shutdown.

use std::sync::Arc;
use std::time::Duration;

use store_trait::helpers::Watcher;
use store_trait::Store;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::ahead::Ahead;
use super::claim::{Claimed, Woken};
use super::processed::{AgentCounters, Processed};
use super::{Agent, Handler};
use mongolock::unstable::Backoff;

use crate::control::ControlView;
use crate::error::AgentError;
use crate::schema::{fields, next_due, next_lapse};

impl<S: Store + Clone> Agent<S> {
    /// Processes tasks until `process_while(log)` says stop or [`Agent::shutdown`]
    /// is called, up to `concurrency` at once. An idle agent wakes when a task
    /// arrives (change notification), when a delayed task or a lapsed claim
    /// becomes due, and for a check every `recheck_interval` (10 min); without
    /// change notifications, or with `process_while`, after `poll_interval`.
    /// On shutdown it stops claiming, lets in-flight tasks finish within the
    /// drain timeout, then gives the rest back.
    /// A claim error that trying again cannot mend ends it the same way, with
    /// a drain, and is returned.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe as a whole: dropping the future stops claiming and drops
    /// the handlers in flight (and the tasks claimed ahead) at their next await
    /// point. No outcome is written for them: their leases are released in the
    /// background (a fenced write), and the tasks are claimed again with a
    /// higher fence, so nothing is lost and a late write of the dropped run is
    /// rejected. Use [`Agent::shutdown`] to stop with a drain.
    pub async fn work(&self, handler: impl Handler) -> Result<AgentCounters, AgentError> {
        self.inner.queue.ensure_indexes().await?;
        // Grouped tasks are let through beside the work loop, for as long as it runs.
        let groups = tokio_util::sync::CancellationToken::new();
        let _stop_groups = groups.clone().drop_guard();
        if let Some(g) = self.inner.groups.as_ref().filter(|g| g.cap.is_some()) {
            tokio::spawn(g.clone().let_through_until(groups));
        }
        Worker::new(self, Arc::new(handler)).run().await
    }

    /// Resolves when the pause view shows this agent's name paused or
    /// resumed against what the agent last saw, or lost its subscription
    /// (then the agent reads on its timer): not at the view's first read, nor
    /// for another name's pause, which are worth no claim. `None` when the
    /// view's task ended; pending without a view.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a `select!` branch; a change taken and found not to
    /// matter is not one to wait for again.
    async fn own_pause_changed(&self, view: &mut Option<watch::Receiver<ControlView>>) -> Option<()> {
        let Some(view) = view.as_mut() else { return std::future::pending().await };
        loop {
            view.changed().await.ok()?;
            let now = view.borrow_and_update().as_ref().map(|names| names.contains(&self.inner.name));
            let seen = self.inner.claimer.seen_paused();
            if now.is_none() || now != seen {
                return Some(());
            }
        }
    }

    pub(super) fn keep_going(&self) -> bool {
        let log = self.counters();
        self.inner.process_while.as_ref().is_none_or(|f| f(&log))
    }

    /// Logs how a task's run ended; true if it was retried (so a due time
    /// moved: the idle deadline is read afresh).
    pub(super) fn reap(&self, done: Result<Result<Processed, AgentError>, tokio::task::JoinError>) -> bool {
        match done {
            Ok(Ok(Processed::Retried(_))) => return true,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(agent = %self.inner.name, error = %e, "recording a task outcome failed; its claim will lapse and it will run again")
            }
            Err(e) => tracing::error!(agent = %self.inner.name, error = %e, "task runner failed"),
        }
        false
    }

    /// Gives back tasks claimed ahead that a stop does not run (`process_while`
    /// said stop, or the drain timed out): one fenced release each, in one
    /// batch (`LockGuard::release_many`), awaited; claimable again at once
    /// (as lapsed claims), with a higher fence at their next claim. Their
    /// permits of the global concurrency go back too.
    async fn give_back(&self, claimed: Vec<Claimed<S>>) {
        if claimed.is_empty() {
            return;
        }
        tracing::info!(agent = %self.inner.name, tasks = claimed.len(), "giving back tasks claimed ahead, unstarted");
        let mut permits = Vec::with_capacity(claimed.len());
        let items = claimed
            .into_iter()
            .map(|c| {
                permits.push(c.permit);
                (c.guard, crate::task::not_started(&c.record))
            })
            .collect();
        for r in mongolock::LockGuard::release_many(items).await {
            if let Err(e) = r {
                tracing::debug!(agent = %self.inner.name, error = %e, "a claim given back was not released; it lapses");
            }
        }
        for p in permits {
            self.inner.claimer.give_back(p, self.inner.shutdown.is_cancelled()).await;
        }
    }

    /// Runs a claimed task on its own task in `running`.
    fn spawn_run(
        &self,
        running: &mut JoinSet<Result<Processed, AgentError>>,
        c: Claimed<S>,
        handler: &Arc<dyn Handler>,
    ) {
        let (this, h) = (self.clone(), handler.clone());
        running.spawn(async move { this.run(c, h).await });
    }

    /// Lets in-flight tasks finish within the drain timeout, and starts the
    /// tasks claimed ahead as their slots free; then drops the tasks still
    /// running (their guards release their claims) and gives back the tasks
    /// claimed ahead still unstarted.
    async fn drain(
        &self,
        mut running: JoinSet<Result<Processed, AgentError>>,
        mut ahead: Ahead<S>,
        handler: &Arc<dyn Handler>,
    ) {
        if running.is_empty() && ahead.is_empty() {
            return;
        }
        tracing::info!(agent = %self.inner.name, in_flight = running.len(), ahead = ahead.len(), "draining");
        let deadline = Instant::now() + self.inner.drain_timeout;
        loop {
            for c in ahead.start(self.inner.concurrency.saturating_sub(running.len())) {
                self.spawn_run(&mut running, c, handler);
            }
            tokio::select! {
                done = running.join_next() => match done {
                    Some(done) => {
                        self.reap(done);
                    }
                    None => return,
                },
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(agent = %self.inner.name, abandoned = running.len() + ahead.len(), "drain timeout: giving claims back");
                    running.shutdown().await;
                    self.give_back(ahead.take_all()).await;
                    return;
                }
            }
        }
    }

    /// How long an idle agent may sleep: until the next delayed task or lapsed
    /// claim becomes due, at most `cap`.
    pub(super) async fn idle_wait(&self, cap: Duration) -> Duration {
        let inner = &self.inner;
        let (next_run, next_lapse) = (next_due(&inner.name), next_lapse(&inner.name));
        let soonest = async {
            let now = inner.store.now().await.ok()?;
            let run = inner.store.find(&inner.queue.coll, &next_run).await.ok()?;
            let lapse = inner.store.find(&inner.queue.coll, &next_lapse).await.ok()?;
            let run_at = run
                .first()
                .and_then(|r| r.data().get_datetime(fields::RUN_AT).ok())
                .map(|d| store_trait::StoreTime::from_millis(d.timestamp_millis()));
            let lapse_at = lapse.first().and_then(|r| r.lease().map(|l| l.until));
            Some([run_at, lapse_at].into_iter().flatten().min().map(|t| now.until(t) + Duration::from_millis(1)))
        };
        match soonest.await {
            Some(due) => due.map_or(cap, |d| d.min(cap)),
            // A read failed: nothing known, so look again after a poll's time.
            None => inner.poll_interval.min(cap),
        }
    }
}

/// What one turn of the work loop decided.
enum Turn {
    /// Take another turn.
    Again,
    /// Stop: a shutdown, or `process_while` said so.
    Stop,
    /// Stop with this claim error, which trying again cannot mend.
    Fail(AgentError),
}

/// The work loop and what it keeps between its turns ([`Agent::work`]).
struct Worker<'a, S: Store + Clone> {
    agent: &'a Agent<S>,
    handler: Arc<dyn Handler>,
    /// The tasks in flight.
    running: JoinSet<Result<Processed, AgentError>>,
    /// Tasks claimed ahead of free slots (`ahead.rs`).
    ahead: Ahead<S>,
    /// Change notifications, only while idle: a busy agent does not wait for
    /// them, and every claim and completion in the queue is one, so a
    /// subscription held while busy would cost a `getMore` per event in
    /// every process. Opened when a claim finds nothing, and the claim is
    /// tried once more before waiting (subscribe, then read), so no change
    /// falls between; dropped at the next successful claim. It subscribes
    /// again by itself after the stream ends (a server restart).
    events: Option<Watcher<S>>,
    /// While idle, a view of the queue's pause state (`control.rs`): it
    /// keeps the control subscription open, and a pause or resume wakes the
    /// agent. Dropped with `events`.
    control: Option<watch::Receiver<ControlView>>,
    /// The pause between claims that other claimers outran, or that failed.
    backoff: Backoff,
    /// Until when an idle agent sleeps: the next due time it read (a delayed
    /// task, a claim that will lapse), at most its poll or recheck interval.
    /// Read once per idle period, not per wake-up.
    idle_until: Option<Instant>,
    /// What woke the agent from idle, for its next claim (`claim::Woken`).
    woken: Option<Woken>,
    /// Whether this claim already waited for outcomes landing (at most once).
    waited: bool,
}

impl<'a, S: Store + Clone> Worker<'a, S> {
    fn new(agent: &'a Agent<S>, handler: Arc<dyn Handler>) -> Self {
        Worker {
            agent,
            handler,
            running: JoinSet::new(),
            ahead: Ahead::new(),
            events: None,
            control: None,
            backoff: Backoff::new(Duration::from_millis(50), agent.inner.poll_interval),
            idle_until: None,
            woken: None,
            waited: false,
        }
    }

    /// Takes turns until one says stop, then drains.
    async fn run(mut self) -> Result<AgentCounters, AgentError> {
        let (agent, inner) = (self.agent, &self.agent.inner);
        tracing::info!(agent = %inner.name, queue = %inner.queue.coll, "agent working");
        let failed = loop {
            match self.turn().await {
                Turn::Again => {}
                Turn::Stop => break None,
                Turn::Fail(e) => break Some(e),
            }
        };
        // A failed claim ends the loop as a stop does: the tasks in flight
        // finish within the drain timeout (dropped at once, a handler's claim
        // would be let go while work it started may still run, a runner's
        // command tree). The tasks claimed ahead are not run past a stop that
        // `process_while` or a failure asked for: their claims go back now
        // (one command).
        if failed.is_some() || !inner.shutdown.is_cancelled() {
            agent.give_back(self.ahead.take_all()).await;
        }
        agent.drain(self.running, self.ahead, &self.handler).await;
        inner.claimer.release_pooled().await;
        match failed {
            Some(e) => Err(e),
            None => Ok(agent.counters()),
        }
    }

    /// One turn: reap, start tasks claimed ahead, wait for a slot, or claim.
    async fn turn(&mut self) -> Turn {
        let (agent, inner) = (self.agent, &self.agent.inner);
        while let Some(done) = self.running.try_join_next() {
            self.ended(done);
        }
        if inner.shutdown.is_cancelled() || !agent.keep_going() {
            return Turn::Stop;
        }
        // Tasks claimed ahead start as slots free, without a claim.
        if self.running.len() < inner.concurrency && !self.ahead.is_empty() {
            for c in self.ahead.start(inner.concurrency - self.running.len()) {
                agent.spawn_run(&mut self.running, c, &self.handler);
            }
            return Turn::Again;
        }
        if self.running.len() >= inner.concurrency {
            tokio::select! {
                _ = inner.shutdown.cancelled() => return Turn::Stop,
                Some(done) = self.running.join_next() => self.ended(done),
            }
            // Tasks whose outcomes went in one group commit end together:
            // let them all be reaped, so their slots are claimed in one batch.
            tokio::task::yield_now().await;
            return Turn::Again;
        }
        // Slots whose tasks' outcomes are being written are claimed with
        // the slots already free: wait for that batch to land (one round
        // trip, at most once per claim), so slots freed together take one
        // batch claim instead of a claim each (`commit.rs`).
        if !self.running.is_empty() && !self.waited {
            if let Some(landing) = inner.finisher.committer.get().and_then(|c| c.landing()) {
                self.waited = true;
                // A task ending ends the wait too (one whose outcome went
                // another way, or whose batch the committing task dropped).
                tokio::select! {
                    _ = inner.shutdown.cancelled() => return Turn::Stop,
                    _ = landing => {}
                    Some(done) = self.running.join_next() => self.ended(done),
                }
                // Let the tasks whose outcomes landed end, so their slots count.
                tokio::task::yield_now().await;
                return Turn::Again;
            }
        }
        self.waited = false;
        self.claim().await
    }

    /// Notes a task's end; a retry moved a due time, so the idle deadline is
    /// read afresh.
    fn ended(&mut self, done: Result<Result<Processed, AgentError>, tokio::task::JoinError>) {
        if self.agent.reap(done) {
            self.idle_until = None;
        }
    }

    /// Claims for the free slots (and ahead of them), and starts what it got;
    /// else backs off (outrun, or a failure worth trying again) or idles.
    async fn claim(&mut self) -> Turn {
        let (agent, inner) = (self.agent, &self.agent.inner);
        let free = inner.concurrency - self.running.len();
        let asked =
            free + self.ahead.room(inner.prefetch, inner.run_times.short(), inner.claimer.limits.stops_claims_ahead());
        // Woken by a change and claiming nothing, the agent lost what
        // woke it to another claimer, whose claim lapses with no change
        // to say so if that claimer dies; or the task is due later (a
        // delayed insert). Either way the idle deadline is read again
        // within `poll_interval`, as a poll would, so a timer covers it.
        // Not at once: a herd of idle agents woken by one insert would
        // pay that read (three commands) each, per insert.
        let after_change = self.woken.is_some();
        let claimed = inner.claimer.claim(asked, self.woken.take()).await;
        match claimed.map(|c| (self.ahead.claimed(asked, free, c.tasks, c.backlog), c.outrun)) {
            Ok((start, _)) if !start.is_empty() => {
                self.backoff.reset();
                self.events = None;
                self.control = None;
                // Busy, the agent watches nothing: delayed tasks and
                // claims that appear meanwhile are in no deadline it
                // read. Back to idle, it reads one again within a
                // poll's time, as a poll would have found them (not at
                // once: three commands per busy period, per task under
                // light load).
                self.cap_idle_until();
                for c in start {
                    agent.spawn_run(&mut self.running, c, &self.handler);
                }
                Turn::Again
            }
            Ok((_, true)) => {
                // Others took every candidate: tasks remain, and their
                // claims wake no idle watch. Try again after a backoff.
                tracing::debug!(agent = %inner.name, "outrun by other claimers: trying again");
                tokio::select! {
                    _ = inner.shutdown.cancelled() => return Turn::Stop,
                    _ = tokio::time::sleep(self.backoff.next_delay()) => {}
                    Some(done) = self.running.join_next(), if !self.running.is_empty() => self.ended(done),
                }
                Turn::Again
            }
            Ok(_) => {
                if after_change {
                    self.cap_idle_until();
                }
                self.idle().await
            }
            Err(e) => {
                tracing::warn!(agent = %inner.name, error = %e, "claim failed");
                if !e.is_retryable() {
                    return Turn::Fail(e);
                }
                tokio::select! {
                    _ = inner.shutdown.cancelled() => Turn::Stop,
                    _ = tokio::time::sleep(self.backoff.next_delay()) => Turn::Again,
                }
            }
        }
    }

    /// Brings the idle deadline, if one was read, within `poll_interval`.
    fn cap_idle_until(&mut self) {
        let poll = Instant::now() + self.agent.inner.poll_interval;
        self.idle_until = self.idle_until.map(|t| t.min(poll));
    }

    /// Idles after a claim that found nothing: subscribes first (and claims
    /// once more), reads the next due time (and claims once more), then
    /// waits for that time, a change notification, a pause or resume of its
    /// name, or a finished task.
    async fn idle(&mut self) -> Turn {
        let (agent, inner) = (self.agent, &self.agent.inner);
        let Some(watcher) = self.events.as_mut() else {
            let (store, coll, poll) = (inner.store.clone(), inner.queue.coll.clone(), inner.poll_interval);
            // Under a global concurrency limit a task ending anywhere may
            // free a permit: those changes wake it too.
            let filter = if inner.claimer.limits.is_global() {
                super::claim::claimable_or_freeing_changes()
            } else {
                super::claim::claimable_changes()
            };
            let watcher = Watcher::open_filtered(store, coll, filter, poll).await.ignore_renewals();
            tracing::debug!(agent = %inner.name, push = watcher.is_live(), "idle: watching for changes");
            self.events = Some(watcher);
            self.control = Some(inner.claimer.control_view());
            // Claim once more now that the subscription is open.
            return Turn::Again;
        };
        let until = match self.idle_until {
            Some(t) if t > Instant::now() => t,
            _ => {
                // With notifications nothing needs a poll
                // (`AgentBuilder::recheck_interval`); without, poll.
                // `process_while` is asked once per poll, as the
                // seed's loop asks it once per sleep.
                // Nor under a global concurrency limit: a permit
                // freed or lapsed elsewhere is no change to the
                // queue, and may land after the outcome that woke
                // the agent.
                let push = watcher.is_live() && inner.process_while.is_none() && !inner.claimer.limits.is_global();
                let cap = if push { inner.recheck_interval } else { inner.poll_interval };
                self.idle_until = Some(Instant::now() + agent.idle_wait(cap).await);
                // Claim once more before sleeping: a task that became due
                // (or whose claim lapsed) between the claim and the due-time
                // queries is in neither's view, and would wait a full
                // `poll_interval`.
                return Turn::Again;
            }
        };
        tokio::select! {
            _ = inner.shutdown.cancelled() => return Turn::Stop,
            _ = tokio::time::sleep_until(until) => self.idle_until = None,
            Some(done) = self.running.join_next(), if !self.running.is_empty() => self.ended(done),
            Some(()) = agent.own_pause_changed(&mut self.control) => {}
            ev = watcher.changed() => {
                // Coalesce a burst of notifications into one claim
                // attempt, which tries the inserted tasks first.
                let mut w = Woken::default();
                w.saw(&ev);
                tokio::time::sleep(Duration::from_millis(2)).await;
                watcher.drain_ready_with(|ev| w.saw(ev));
                // An update may have moved a due time (a retry, a
                // requeue): read the idle deadline afresh.
                if w.other {
                    self.idle_until = None;
                }
                self.woken = Some(w);
            }
        }
        Turn::Again
    }
}
