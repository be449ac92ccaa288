//! The agent: claims tasks atomically, runs the handler under a renewed lease,
//! and records the outcome with a write fenced by the claim token.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson, Document};
use mongolock::{Identity, Lock, LockError, LockGuard};
use store_trait::{fields as reserved, Claim, Condition, Key, Mutation, Query, Record, Store, StoreError, Ttl};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::queue::{joined_to, lapsed_tasks, not_complete, ready_tasks};
use crate::task::{fields, Child};
use crate::{AgentError, NewTask, Outcome, Queue, Retry, Task};

/// A task handler: an async function from a [`Task`] to an [`Outcome`].
pub trait Handler: Send + Sync + 'static {
    /// Processes one task.
    fn handle(&self, task: Task) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'static>>;
}

impl<F, Fut, O> Handler for F
where
    F: Fn(Task) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = O> + Send + 'static,
    O: Into<Outcome>,
{
    fn handle(&self, task: Task) -> Pin<Box<dyn Future<Output = Outcome> + Send + 'static>> {
        let fut = self(task);
        Box::pin(async move { fut.await.into() })
    }
}

/// The agent's log: the seed's counters and more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AgentLog {
    /// Handler calls.
    pub tasks_processed: u64,
    /// Handler calls that failed (including panics).
    pub failed_tasks: u64,
    /// The same as `failed_tasks`, under the name the seed's example uses.
    pub errors_encountered: u64,
    /// Tasks completed.
    pub completed: u64,
    /// Failures scheduled for another attempt.
    pub retried: u64,
    /// Tasks failed for good.
    pub failed_permanently: u64,
    /// Outcomes rejected because the claim was lost (another agent took the task
    /// after this one's lease lapsed): never applied.
    pub stale_rejected: u64,
    /// Tasks set to wait for their follow-ups ([`Outcome::wait_for_follow_ups`]).
    pub waiting: u64,
    /// Tasks whose crashed agent had recorded the outcome but not finished the
    /// fan-in step; this agent finished it (no handler ran).
    pub recovered: u64,
}

/// What one `process` call did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Processed {
    /// The task completed.
    Completed(Key),
    /// The task failed and will be tried again.
    Retried(Key),
    /// The task failed for good.
    Failed(Key),
    /// The claim was lost before the outcome could be recorded; nothing was applied.
    Stale(Key),
    /// The task waits for its follow-ups and will run again when they have ended.
    Waiting(Key),
    /// A crashed agent's fan-in step on this task was finished; no handler ran.
    Recovered(Key),
}

type ProcessWhile = Arc<dyn Fn(&AgentLog) -> bool + Send + Sync>;

/// Configures an [`Agent`].
pub struct AgentBuilder<S> {
    store: S,
    name: String,
    queue: Result<Queue<S>, AgentError>,
    sleep_between: Duration,
    lease: Duration,
    max_attempts: u32,
    backoff: (Duration, Duration),
    concurrency: usize,
    drain: Duration,
    retain_finished: Option<Duration>,
    identity: Option<Identity>,
    process_while: Option<ProcessWhile>,
    shutdown: Option<CancellationToken>,
}

impl<S> std::fmt::Debug for AgentBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBuilder").field("name", &self.name).finish_non_exhaustive()
    }
}

impl<S: Store + Clone> AgentBuilder<S> {
    /// How long an idle agent waits between polls when the store has no change
    /// notifications (default 5 s, as in the seed). With notifications, an idle
    /// agent is woken when a task arrives.
    pub fn sleep_between(mut self, d: Duration) -> Self {
        self.sleep_between = d;
        self
    }

    /// The claim lease (default 60 s), renewed every third of it while the handler
    /// runs; a crashed agent's task is claimable again once it lapses.
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = d;
        self
    }

    /// Attempts before a task fails for good (default 5).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Retry backoff: `base * 2^(attempt-1)`, capped at `max`, with ±50 % jitter
    /// (default 1 s and 10 min).
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = (base, max);
        self
    }

    /// Tasks in flight at once in [`Agent::work`] (default 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// How long a stopping agent lets in-flight tasks finish before it gives
    /// their claims back (default 30 s).
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain = d;
        self
    }

    /// Garbage-collects finished tasks this long after they finish (TTL index;
    /// default: keep them).
    pub fn retain_finished(mut self, d: Duration) -> Self {
        self.retain_finished = Some(d);
        self
    }

    /// The identity recorded on claims (default [`Identity::current`]).
    pub fn identity(mut self, id: Identity) -> Self {
        self.identity = Some(id);
        self
    }

    /// [`Agent::work`] stops (and drains) when `token` is cancelled, as when
    /// [`Agent::shutdown`] is called. One token can stop every agent of a
    /// process, from a signal handler:
    ///
    /// ```
    /// # fn wire(store: store_memory::MemoryStore) -> Result<(), mongoagent::AgentError> {
    /// let stop = tokio_util::sync::CancellationToken::new();
    /// let agent = mongoagent::Agent::builder(store, "resize", "tasks").shutdown_on(&stop).build()?;
    /// // tokio::spawn(async move { tokio::signal::ctrl_c().await.ok(); stop.cancel() });
    /// # let _ = agent; Ok(()) }
    /// ```
    pub fn shutdown_on(mut self, token: &CancellationToken) -> Self {
        self.shutdown = Some(token.child_token());
        self
    }

    /// [`Agent::work`] continues while this returns true for the log (default:
    /// forever).
    pub fn process_while(mut self, f: impl Fn(&AgentLog) -> bool + Send + Sync + 'static) -> Self {
        self.process_while = Some(Arc::new(f));
        self
    }

    /// Validates the configuration.
    pub fn build(self) -> Result<Agent<S>, AgentError> {
        let bad = |m: String| Err(AgentError::Config(m));
        if self.name.is_empty() {
            return bad("an agent needs a non-empty name".into());
        }
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1".into());
        }
        if self.max_attempts == 0 {
            return bad("max_attempts must be at least 1".into());
        }
        if self.sleep_between.is_zero() {
            return bad("sleep_between must be positive".into());
        }
        if self.backoff.0.is_zero() || self.backoff.1 < self.backoff.0 {
            return bad(format!("bad backoff {:?}", self.backoff));
        }
        let lease = Ttl::new(self.lease).map_err(|e| AgentError::Config(e.to_string()))?;
        let retain = self.retain_finished.map(Ttl::new).transpose().map_err(|e| AgentError::Config(e.to_string()))?;
        let queue = self.queue?;
        Ok(Agent {
            inner: Arc::new(Inner {
                store: self.store,
                name: self.name,
                queue,
                sleep_between: self.sleep_between,
                lease,
                max_attempts: self.max_attempts,
                backoff: self.backoff,
                concurrency: self.concurrency,
                drain: self.drain,
                retain,
                identity: self.identity.unwrap_or_else(Identity::current),
                process_while: self.process_while,
                log: Mutex::new(AgentLog::default()),
                seq: AtomicU64::new(1),
                shutdown: self.shutdown.unwrap_or_default(),
            }),
        })
    }
}

struct Inner<S> {
    store: S,
    name: String,
    queue: Queue<S>,
    sleep_between: Duration,
    lease: Ttl,
    max_attempts: u32,
    backoff: (Duration, Duration),
    concurrency: usize,
    drain: Duration,
    retain: Option<Ttl>,
    identity: Identity,
    process_while: Option<ProcessWhile>,
    log: Mutex<AgentLog>,
    seq: AtomicU64,
    shutdown: CancellationToken,
}

/// An agent: takes tasks named for it from a queue collection and processes them.
/// Cheap to clone.
#[derive(Clone)]
pub struct Agent<S> {
    inner: Arc<Inner<S>>,
}

impl<S> std::fmt::Debug for Agent<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.inner.name)
            .field("queue", &self.inner.queue.coll)
            .finish_non_exhaustive()
    }
}

/// A claimed task with its lease.
struct Claimed<S: Store + Clone> {
    guard: LockGuard<S>,
    record: Record,
}

impl<S: Store + Clone> Agent<S> {
    /// An agent named `name` on queue collection `queue` (the seed's `new(name, queue)`).
    pub fn builder(store: S, name: impl Into<String>, queue: impl Into<String>) -> AgentBuilder<S> {
        let queue = Queue::new(store.clone(), &queue.into());
        Self::builder_for(store, name.into(), queue)
    }

    /// An agent named `name` on an existing [`Queue`]. Agents built on clones of
    /// one `Queue` take turns claiming, instead of racing each other for the head
    /// of the queue.
    pub fn on_queue(queue: &Queue<S>, name: impl Into<String>) -> AgentBuilder<S> {
        Self::builder_for(queue.store.clone(), name.into(), Ok(queue.clone()))
    }

    fn builder_for(store: S, name: String, queue: Result<Queue<S>, AgentError>) -> AgentBuilder<S> {
        AgentBuilder {
            store,
            name,
            queue,
            sleep_between: Duration::from_secs(5),
            lease: Duration::from_secs(60),
            max_attempts: 5,
            backoff: (Duration::from_secs(1), Duration::from_secs(600)),
            concurrency: 1,
            drain: Duration::from_secs(30),
            retain_finished: None,
            identity: None,
            process_while: None,
            shutdown: None,
        }
    }

    /// An agent with the default configuration.
    pub fn new(store: S, name: &str, queue: &str) -> Result<Self, AgentError> {
        Self::builder(store, name, queue).build()
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The queue.
    pub fn queue(&self) -> &Queue<S> {
        &self.inner.queue
    }

    /// The log so far.
    pub fn log(&self) -> AgentLog {
        *self.inner.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops [`Agent::work`]: no new claims; in-flight tasks get the drain timeout.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    /// Ready tasks of this agent (the seed's `get_tasks`), or those matching
    /// `filter` (field equality).
    pub async fn get_tasks(&self, filter: Option<Document>) -> Result<Vec<Record>, AgentError> {
        let filter = filter.unwrap_or_else(|| doc! { fields::AGENT_NAME: &self.inner.name, fields::READY: true });
        self.inner.queue.tasks(filter, None).await
    }

    /// Processes at most one task: claims the next one (one round trip), runs
    /// `handler` while renewing the claim, records the outcome. `Ok(None)` when no
    /// task is ready.
    pub async fn process(&self, handler: impl Handler) -> Result<Option<Processed>, AgentError> {
        let handler: Arc<dyn Handler> = Arc::new(handler);
        match self.claim().await? {
            Some(c) => Ok(Some(self.run(c, handler).await?)),
            None => Ok(None),
        }
    }

    /// Processes tasks until `process_while(log)` says stop or [`Agent::shutdown`]
    /// is called, up to `concurrency` at once. An idle agent wakes when a task
    /// arrives (change notification), when a delayed task or a lapsed claim
    /// becomes due, or after `sleep_between`. On shutdown it stops claiming, lets
    /// in-flight tasks finish within the drain timeout, then gives the rest back.
    pub async fn work(&self, handler: impl Handler) -> Result<AgentLog, AgentError> {
        let handler: Arc<dyn Handler> = Arc::new(handler);
        let inner = &self.inner;
        inner.queue.ensure_indexes().await?;
        // Re-subscribes by itself after the stream ends (a server restart).
        let mut events =
            store_trait::Watcher::open(inner.store.clone(), inner.queue.coll.clone(), None, inner.sleep_between)
                .await
                .ignore_renewals();
        let mut running: JoinSet<Result<Processed, AgentError>> = JoinSet::new();
        let mut backoff = Duration::from_millis(50);
        let mut idle_until: Option<Instant> = None;
        tracing::info!(agent = %inner.name, queue = %inner.queue.coll, push = events.is_live(), "agent working");
        loop {
            while let Some(done) = running.try_join_next() {
                self.reap(done);
            }
            if inner.shutdown.is_cancelled() || !self.keep_going() {
                break;
            }
            if running.len() >= inner.concurrency {
                tokio::select! {
                    _ = inner.shutdown.cancelled() => break,
                    Some(done) = running.join_next() => self.reap(done),
                }
                continue;
            }
            match self.claim().await {
                Ok(Some(c)) => {
                    backoff = Duration::from_millis(50);
                    let (this, h) = (self.clone(), handler.clone());
                    running.spawn(async move { this.run(c, h).await });
                }
                Ok(None) => {
                    // Idle until the next due time (computed once per idle period, not
                    // per wake-up), a change notification, or a finished task.
                    let until = match idle_until {
                        Some(t) if t > Instant::now() => t,
                        _ => {
                            idle_until = Some(Instant::now() + self.idle_wait().await);
                            // Claim once more before sleeping: a task that became due
                            // (or whose claim lapsed) between the claim and the due-time
                            // queries is in neither's view, and would wait a full
                            // `sleep_between`.
                            continue;
                        }
                    };
                    tokio::select! {
                        _ = inner.shutdown.cancelled() => break,
                        _ = tokio::time::sleep_until(until) => idle_until = None,
                        Some(done) = running.join_next(), if !running.is_empty() => self.reap(done),
                        _ = events.changed() => {
                            // Coalesce a burst of notifications into one claim attempt.
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            events.drain_ready();
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(agent = %inner.name, error = %e, "claim failed");
                    if !e.is_retryable() {
                        running.shutdown().await;
                        return Err(e);
                    }
                    tokio::select! {
                        _ = inner.shutdown.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(inner.sleep_between);
                }
            }
        }
        self.drain(running).await;
        Ok(self.log())
    }

    fn keep_going(&self) -> bool {
        let log = self.log();
        self.inner.process_while.as_ref().is_none_or(|f| f(&log))
    }

    fn reap(&self, done: Result<Result<Processed, AgentError>, tokio::task::JoinError>) {
        match done {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(agent = %self.inner.name, error = %e, "recording a task outcome failed; its claim will lapse and it will run again")
            }
            Err(e) => tracing::error!(agent = %self.inner.name, error = %e, "task runner failed"),
        }
    }

    /// Lets in-flight tasks finish within the drain timeout; then drops the rest,
    /// which gives their claims back (their guards release them).
    async fn drain(&self, mut running: JoinSet<Result<Processed, AgentError>>) {
        if running.is_empty() {
            return;
        }
        tracing::info!(agent = %self.inner.name, in_flight = running.len(), "draining");
        let deadline = Instant::now() + self.inner.drain;
        loop {
            tokio::select! {
                done = running.join_next() => match done {
                    Some(done) => self.reap(done),
                    None => return,
                },
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(agent = %self.inner.name, abandoned = running.len(), "drain timeout: giving claims back");
                    running.shutdown().await;
                    return;
                }
            }
        }
    }

    /// How long an idle agent may sleep: until the next delayed task or lapsed
    /// claim becomes due, at most `sleep_between`.
    async fn idle_wait(&self) -> Duration {
        let inner = &self.inner;
        let mine = |extra: Document| {
            let mut d = doc! { fields::AGENT_NAME: &inner.name };
            d.extend(extra);
            Query::eq(d)
        };
        let next_run = mine(doc! { fields::READY: true })
            .when(not_complete())
            .when(Condition::DueBy(fields::RUN_AT.into()).negate())
            .sort(fields::RUN_AT, store_trait::Order::Asc)
            .limit(1);
        let next_lapse = mine(doc! { fields::CLAIMED: true })
            .when(Condition::Free.negate())
            .sort(reserved::LEASE_UNTIL, store_trait::Order::Asc)
            .limit(1);
        let soonest = async {
            let now = inner.store.now().await.ok()?;
            let run = inner.store.find(&inner.queue.coll, &next_run).await.ok()?;
            let lapse = inner.store.find(&inner.queue.coll, &next_lapse).await.ok()?;
            let run_at = run
                .first()
                .and_then(|r| r.data().get_datetime(fields::RUN_AT).ok())
                .map(|d| store_trait::StoreTime::from_millis(d.timestamp_millis()));
            let lapse_at = lapse.first().and_then(|r| r.lease().map(|l| l.until));
            [run_at, lapse_at].into_iter().flatten().min().map(|t| now.until(t) + Duration::from_millis(1))
        };
        soonest.await.map_or(inner.sleep_between, |d| d.min(inner.sleep_between))
    }

    /// Claims the next task: one round trip for a ready task. Tasks whose claim
    /// lapsed (a crashed agent's) are looked for when no task is ready, and first
    /// on every sixteenth claim, so recovery never starves under load.
    async fn claim(&self) -> Result<Option<Claimed<S>>, AgentError> {
        let inner = &self.inner;
        // Claims race for the same head-of-queue document; agents sharing a
        // `Queue` take turns instead of making the server resolve their write
        // conflicts (measured on SecantusDB: 1 claimer 71 tasks/s, 4 at once 16,
        // 16 at once 3.5).
        let _turn = inner.queue.claim_gate.lock().await;
        let seq = inner.seq.fetch_add(1, Ordering::Relaxed);
        let (ready, lapsed) = (ready_tasks(&inner.name), lapsed_tasks(&inner.name));
        let order = if seq % 16 == 0 { [&lapsed, &ready] } else { [&ready, &lapsed] };
        for query in order {
            if let Some(c) = self.claim_from(query, seq).await? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    async fn claim_from(&self, query: &Query, seq: u64) -> Result<Option<Claimed<S>>, AgentError> {
        let inner = &self.inner;
        let owner = format!("{}/{}/{}", inner.identity, inner.name, seq);
        let claim = Claim {
            query: query.clone(),
            mutation: Mutation::new()
                .grant(owner, inner.lease)
                .bump_fence()
                .set(fields::READY, false)
                .set(fields::CLAIMED, true)
                .set(fields::AGENT_HOST, inner.identity.host())
                .set_now(fields::STARTED_AT),
        };
        let sent = Instant::now();
        let Some(record) = inner.store.claim(&inner.queue.coll, &claim).await? else { return Ok(None) };
        let lock = Lock::builder_with_key(inner.store.clone(), record.key().clone())
            .collection(inner.queue.coll.as_str())
            .ttl(inner.lease.as_duration())
            .identity(inner.identity.clone())
            .build()?;
        let guard = lock.adopt(&record, sent, true)?;
        tracing::debug!(agent = %inner.name, task = %record.key(), token = record.fence(), "task claimed");
        Ok(Some(Claimed { guard, record }))
    }

    fn bump(&self, f: impl FnOnce(&mut AgentLog)) {
        f(&mut self.inner.log.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Runs the handler on a claimed task and records the outcome. A claimed task
    /// that already has an outcome, or that waits for its follow-ups, was left
    /// by a crashed agent in the middle of a fan-in step: that step is finished
    /// instead.
    async fn run(&self, c: Claimed<S>, handler: Arc<dyn Handler>) -> Result<Processed, AgentError> {
        let Claimed { guard, record } = c;
        let key = record.key().clone();
        let data = record.data();
        if data.get_bool(fields::COMPLETE).ok() == Some(true) {
            self.notify_waiter(data).await?;
            return self.recovered(guard.release_with(self.close(Mutation::new())).await, key);
        }
        if let Some(round) = data.get(fields::WAITING).and_then(store_trait::semantics::as_i64) {
            let released = self.settle_wait(guard, &key, round).await;
            return self.recovered(released, key);
        }
        let round = task_round(data);
        let children = match round.checked_sub(1) {
            Some(r) => self.children(&key, r).await?,
            None => Vec::new(),
        };
        let task = Task {
            key: key.clone(),
            data: data.clone(),
            token: record.fence(),
            cancel: guard.lost_token(),
            round: u64::try_from(round).unwrap_or(0),
            children,
        };
        // The handler runs on its own task: a panic is a failure, not a crash. If
        // this future is dropped (drain timeout), the handler is aborted with it.
        let mut handle = AbortOnDrop(tokio::spawn(handler.handle(task)));
        let outcome = match (&mut handle.0).await {
            Ok(o) => o,
            Err(e) => Outcome::failed(format!("the handler panicked: {e}")),
        };
        self.bump(|l| l.tasks_processed += 1);
        if matches!(outcome, Outcome::Fail { .. }) {
            self.bump(|l| {
                l.failed_tasks += 1;
                l.errors_encountered += 1;
            });
        }
        self.finish(guard, &record, outcome).await
    }

    fn recovered(&self, released: Result<Record, LockError>, key: Key) -> Result<Processed, AgentError> {
        match released {
            Ok(_) | Err(LockError::Lost { .. }) => {
                self.bump(|l| l.recovered += 1);
                tracing::info!(agent = %self.inner.name, task = %key, "finished a crashed agent's fan-in step");
                Ok(Processed::Recovered(key))
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn finish(&self, guard: LockGuard<S>, record: &Record, outcome: Outcome) -> Result<Processed, AgentError> {
        let inner = &self.inner;
        let key = record.key().clone();
        let token = guard.token();
        let round = task_round(record.data());
        let outcome = match outcome {
            Outcome::Complete { merge, follow_ups, then } => match check_merge(&merge) {
                Err(e) => Outcome::failed_permanently(e),
                Ok(()) => match self.enqueue_follow_ups(record, round, follow_ups, then.map(|t| *t)).await {
                    Ok(()) => Outcome::done_with(merge),
                    Err(e) => Outcome::failed(format!("could not enqueue follow-up tasks: {e}")),
                },
            },
            Outcome::Wait { follow_ups, .. } if follow_ups.is_empty() => {
                Outcome::failed_permanently("the handler waits for follow-ups but returned none")
            }
            Outcome::Wait { merge, follow_ups } => match check_merge(&merge) {
                Err(e) => Outcome::failed_permanently(e),
                Ok(()) => {
                    let join = (key.as_bson().clone(), round);
                    match self.enqueue_children(&key, round, follow_ups, Some(join)).await {
                        Ok(()) => return self.wait(guard, &key, round, merge).await,
                        Err(e) => Outcome::failed(format!("could not enqueue follow-up tasks: {e}")),
                    }
                }
            },
            fail => fail,
        };
        let limit = record
            .data()
            .get(fields::MAX_ATTEMPTS)
            .and_then(store_trait::semantics::as_i64)
            .map_or(u64::from(inner.max_attempts), |n| n.max(1) as u64);
        let (changes, result) = match outcome {
            Outcome::Complete { merge, .. } | Outcome::Wait { merge, .. } => (
                self.finished(Mutation::new().set_all(merge), token).set(fields::ERROR_ENCOUNTERED, false),
                Processed::Completed(key.clone()),
            ),
            Outcome::Fail { error, merge, retry } => {
                let merge = if check_merge(&merge).is_ok() { merge } else { Document::new() };
                let delay = match retry {
                    Retry::Never => None,
                    _ if token >= limit => None,
                    Retry::After(d) => Some(d),
                    _ => Some(self.backoff(token)),
                };
                match delay {
                    None => (
                        self.finished(Mutation::new().set_all(merge), token)
                            .set(fields::ERROR_ENCOUNTERED, true)
                            .set(fields::LAST_ERROR, error),
                        Processed::Failed(key.clone()),
                    ),
                    Some(d) => (
                        Mutation::new()
                            .set_all(merge)
                            .set(fields::READY, true)
                            .set(fields::CLAIMED, false)
                            .set(fields::ATTEMPTS, i64::try_from(token).unwrap_or(i64::MAX))
                            .set(fields::LAST_ERROR, error)
                            .set_time_after(fields::RUN_AT, d),
                        Processed::Retried(key.clone()),
                    ),
                }
            }
        };
        let ended = !matches!(result, Processed::Retried(_));
        let joined = ended && record.data().contains_key(fields::JOIN);
        // A follow-up something waits for keeps its claim until it has told the
        // waiter: if this agent dies in between, the claim lapses and whoever
        // claims it next finishes the step.
        let applied = if joined {
            guard.write(changes).await.map(|_| Some(guard))
        } else if ended {
            guard.release_with(self.close(changes)).await.map(|_| None)
        } else {
            guard.release_with(changes).await.map(|_| None)
        };
        match applied {
            Ok(kept) => {
                self.bump(|l| match &result {
                    Processed::Completed(_) => l.completed += 1,
                    Processed::Retried(_) => l.retried += 1,
                    Processed::Failed(_) => l.failed_permanently += 1,
                    _ => {}
                });
                tracing::info!(agent = %inner.name, task = %key, token, outcome = ?result, "task finished");
                if let Some(guard) = kept {
                    self.notify_waiter(record.data()).await?;
                    match guard.release_with(self.close(Mutation::new())).await {
                        Ok(_) | Err(LockError::Lost { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(result)
            }
            Err(LockError::Lost { current, .. }) => Ok(self.stale(&key, token, current)),
            Err(e) => Err(e.into()),
        }
    }

    fn stale(&self, key: &Key, token: u64, current: Option<Box<mongolock::LockInfo>>) -> Processed {
        self.bump(|l| l.stale_rejected += 1);
        tracing::warn!(agent = %self.inner.name, task = %key, token, now_held_by = ?current.map(|c| c.owner), "claim lost: outcome rejected, not applied");
        Processed::Stale(key.clone())
    }

    /// The handler waits for the follow-ups of `round` (enqueued already): mark
    /// the task waiting, still holding the claim, then settle.
    async fn wait(&self, guard: LockGuard<S>, key: &Key, round: i64, merge: Document) -> Result<Processed, AgentError> {
        let changes = Mutation::new().set_all(merge).set(fields::WAITING, round).set(fields::READY, false);
        match guard.write(changes).await {
            Ok(_) => {}
            Err(LockError::Lost { current, .. }) => return Ok(self.stale(key, guard.token(), current)),
            Err(e) => return Err(e.into()),
        }
        self.bump(|l| l.waiting += 1);
        tracing::info!(agent = %self.inner.name, task = %key, round, "task waits for its follow-ups");
        match self.settle_wait(guard, key, round).await {
            Ok(_) | Err(LockError::Lost { .. }) => Ok(Processed::Waiting(key.clone())),
            Err(e) => Err(e.into()),
        }
    }

    /// Lets go of a task that waits for its follow-ups of `round`: ready again at
    /// once if they have all ended (the last of them may have ended before the
    /// task was marked waiting, and found nothing to wake), otherwise left for
    /// the last one to wake.
    async fn settle_wait(&self, guard: LockGuard<S>, key: &Key, round: i64) -> Result<Record, LockError> {
        let open = match self.open_children(key.as_bson(), round).await {
            Ok(n) => n,
            // Dropping the guard gives the claim back; the next claimer settles.
            Err(e) => return Err(LockError::Store(e)),
        };
        let changes = if open == 0 { wake(Mutation::new(), round) } else { Mutation::new() };
        let out = guard.release_with(changes.set(fields::CLAIMED, false)).await;
        if open == 0 && out.is_ok() {
            tracing::info!(agent = %self.inner.name, task = %key, round, "follow-ups all ended: task ready again");
        }
        out
    }

    async fn open_children(&self, waiter: &Bson, round: i64) -> Result<u64, StoreError> {
        let q = joined_to(waiter, round).when(not_complete());
        self.inner.store.count(&self.inner.queue.coll, &q).await
    }

    /// After a follow-up ended: if every follow-up of its waiter's round has
    /// ended, makes the waiter ready. Idempotent; several last follow-ups ending
    /// at once make it ready once (the write is conditional on the round).
    async fn notify_waiter(&self, data: &Document) -> Result<(), AgentError> {
        let Some(waiter) = data.get(fields::JOIN) else { return Ok(()) };
        let round = data.get(fields::JOIN_ROUND).and_then(store_trait::semantics::as_i64).unwrap_or(0);
        self.wake_if_done(waiter, round).await
    }

    async fn wake_if_done(&self, waiter: &Bson, round: i64) -> Result<(), AgentError> {
        if self.open_children(waiter, round).await? > 0 {
            return Ok(());
        }
        let key = Key::from_bson(waiter.clone())?;
        let w = store_trait::Write::new(
            Condition::FieldEq(fields::WAITING.into(), Bson::Int64(round)),
            wake(Mutation::new(), round),
        );
        if self.inner.store.write(&self.inner.queue.coll, &key, &w).await?.is_applied() {
            tracing::info!(agent = %self.inner.name, task = %key, round, "follow-ups all ended: task ready");
        }
        Ok(())
    }

    /// The follow-ups `key` waited for in `round`, in the order they were returned.
    async fn children(&self, key: &Key, round: i64) -> Result<Vec<Child>, AgentError> {
        let found = self.inner.store.find(&self.inner.queue.coll, &joined_to(key.as_bson(), round)).await?;
        let mut children: Vec<Child> =
            found.into_iter().map(|r| Child { key: r.key().clone(), data: r.into_data() }).collect();
        let position = |c: &Child| c.key.to_string().rsplit('/').next().and_then(|i| i.parse::<u64>().ok());
        // Follow-ups in the order they were returned, then a fan-in task the wait
        // extended to.
        children.sort_by_key(|c| (position(c).is_none(), position(c), c.key.to_string()));
        Ok(children)
    }

    /// The changes that end a task (completed or failed for good); the claim is
    /// let go by [`Agent::close`].
    fn finished(&self, m: Mutation, token: u64) -> Mutation {
        m.set(fields::COMPLETE, true)
            .set(fields::READY, false)
            .set(fields::ATTEMPTS, i64::try_from(token).unwrap_or(i64::MAX))
            .set_now(fields::COMPLETED_AT)
    }

    /// Lets go of an ended task (and schedules its garbage collection).
    fn close(&self, m: Mutation) -> Mutation {
        let m = m.set(fields::CLAIMED, false);
        match self.inner.retain {
            Some(ttl) => m.gc_after(ttl),
            None => m,
        }
    }

    fn backoff(&self, attempt: u64) -> Duration {
        let (base, max) = self.inner.backoff;
        let exp = base.saturating_mul(1_u32 << attempt.saturating_sub(1).min(20)).min(max);
        exp.mul_f64(0.5 + fastrand::f64())
    }

    /// Enqueues a successful handler's follow-ups; with a fan-in task, the
    /// follow-ups joined to it first, then the task, waiting for them.
    async fn enqueue_follow_ups(
        &self,
        record: &Record,
        round: i64,
        children: Vec<NewTask>,
        then: Option<NewTask>,
    ) -> Result<(), AgentError> {
        let key = record.key();
        let Some(mut waiter) = then else { return self.enqueue_children(key, round, children, None).await };
        let waiter_key = Key::new(format!("{}/then", child_prefix(key, round)))?;
        // Every follow-up exists before the fan-in task does: one that ends early
        // finds no task to wake, and never wakes it before its siblings exist.
        self.enqueue_children(key, round, children, Some((waiter_key.as_bson().clone(), 0))).await?;
        waiter.id = Some(waiter_key.as_bson().clone());
        waiter.parent = Some(key.as_bson().clone());
        waiter.dedupe_key = None;
        waiter.fan_in = true;
        // A wait on this task extends to the fan-in task: it is enqueued before
        // this task ends, so the waiter always sees one of them open.
        waiter.join = record.data().get(fields::JOIN).map(|w| {
            let r = record.data().get(fields::JOIN_ROUND).and_then(store_trait::semantics::as_i64).unwrap_or(0);
            (w.clone(), r)
        });
        self.inner.queue.enqueue_all(std::slice::from_ref(&waiter)).await?;
        // The follow-ups may all have ended already (or a retried handler finds
        // the fan-in task from its first run): wake it if so. Idempotent.
        self.wake_if_done(waiter_key.as_bson(), 0).await
    }

    /// Enqueues follow-ups with ids derived from the parent, its round and their
    /// position, so a retried handler never duplicates them.
    async fn enqueue_children(
        &self,
        parent: &Key,
        round: i64,
        children: Vec<NewTask>,
        join: Option<(Bson, i64)>,
    ) -> Result<(), AgentError> {
        if children.is_empty() {
            return Ok(());
        }
        let prefix = child_prefix(parent, round);
        let tasks: Vec<NewTask> = children
            .into_iter()
            .enumerate()
            .map(|(i, mut t)| {
                t.id = Some(Bson::String(format!("{prefix}/{i}")));
                t.parent = Some(parent.as_bson().clone());
                t.join = join.clone();
                t
            })
            .collect();
        self.inner.queue.enqueue_all(&tasks).await?;
        Ok(())
    }
}

/// How many times the task's follow-ups all ended and it was made ready again.
fn task_round(data: &Document) -> i64 {
    data.get(fields::ROUND).and_then(store_trait::semantics::as_i64).unwrap_or(0).max(0)
}

/// Follow-up ids: `parent/i` on a first run, `parent@round/i` after `round` joins.
fn child_prefix(parent: &Key, round: i64) -> String {
    if round == 0 {
        parent.to_string()
    } else {
        format!("{parent}@{round}")
    }
}

/// Makes a task that waited on `round` ready again.
fn wake(m: Mutation, round: i64) -> Mutation {
    m.unset(fields::WAITING).set(fields::READY, true).set(fields::ROUND, round.saturating_add(1))
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn check_merge(merge: &Document) -> Result<(), String> {
    for k in merge.keys() {
        if fields::CONTROL.contains(&k.as_str()) {
            return Err(format!("the handler tried to set the queue's own field {k:?}"));
        }
        if let Err(e) = store_trait::check_field_name(k) {
            return Err(format!("the handler returned a bad field: {e}"));
        }
    }
    Ok(())
}
