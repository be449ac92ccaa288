//! Configuring an agent.

use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use mongolock::unstable::{check_interval, LeaseTiming, Leases};
use mongolock::{ConfigError, Identity};
use store_trait::{Store, Ttl};
use tokio_util::sync::CancellationToken;

use super::processed::AgentCounters;
use super::{Agent, Inner};
use crate::error::AgentError;
use crate::queue::Queue;

/// How long a timed-out handler has to end, by default ([`AgentBuilder::timeout_grace`]).
const DEFAULT_TIMEOUT_GRACE: Duration = Duration::from_secs(10);

/// How long an idle agent with live notifications goes without a check, by
/// default ([`AgentBuilder::recheck_interval`]).
const DEFAULT_RECHECK: Duration = Duration::from_secs(600);

pub(super) type ProcessWhile = Arc<dyn Fn(&AgentCounters) -> bool + Send + Sync>;

/// Configures an [`Agent`].
pub struct AgentBuilder<S> {
    store: S,
    name: String,
    queue: Result<Queue<S>, AgentError>,
    poll_interval: Duration,
    recheck_interval: Duration,
    ttl: Duration,
    max_attempts: u32,
    backoff: (Duration, Duration),
    timeout: Option<Duration>,
    timeout_grace: Duration,
    concurrency: usize,
    prefetch: Option<usize>,
    drain_timeout: Duration,
    retain_finished: Option<Duration>,
    identity: Option<Identity>,
    process_while: Option<ProcessWhile>,
    shutdown_on: Option<CancellationToken>,
    global_concurrency: Option<u32>,
    rate_limit: Option<(u32, Duration)>,
    group_concurrency: Option<usize>,
    tracer: crate::trace::ClaimTracer,
}

impl<S> std::fmt::Debug for AgentBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBuilder").field("name", &self.name).finish_non_exhaustive()
    }
}

impl<S: Store + Clone> AgentBuilder<S> {
    /// The defaults: the Ruby `mongo_agent`'s 5 s poll, a 60 s claim lease, 5 attempts.
    pub(super) fn new(store: S, name: String, queue: Result<Queue<S>, AgentError>) -> Self {
        AgentBuilder {
            store,
            name,
            queue,
            poll_interval: Duration::from_secs(5),
            recheck_interval: DEFAULT_RECHECK,
            ttl: Duration::from_secs(60),
            max_attempts: 5,
            backoff: (Duration::from_secs(1), Duration::from_secs(600)),
            timeout: None,
            timeout_grace: DEFAULT_TIMEOUT_GRACE,
            concurrency: 1,
            prefetch: None,
            drain_timeout: Duration::from_secs(30),
            retain_finished: None,
            identity: None,
            process_while: None,
            shutdown_on: None,
            global_concurrency: None,
            rate_limit: None,
            group_concurrency: None,
            tracer: crate::trace::ClaimTracer::default(),
        }
    }

    /// How long an idle agent waits between polls when the store has no change
    /// notifications (default 5 s, as in the Ruby `mongo_agent`), or while
    /// its subscription is down. With notifications, an idle agent is woken
    /// when a task arrives, and checks anyway only every
    /// [`recheck_interval`](Self::recheck_interval).
    #[doc(alias = "sleep_between")]
    #[must_use]
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }

    /// How long an idle agent with live change notifications goes without
    /// looking at the queue anyway (default 10 min). It needs no poll to
    /// see tasks arrive, become due or have their claims lapse: a
    /// notification or a timer at the next due time wakes it. This check is
    /// the net under what neither foresees: another program's write that
    /// makes a task claimable in a way the agent's filter of notifications
    /// passes over (`claim.rs`); and a store clock that steps forward while
    /// the agent idles, which makes its timer late by the step, at most
    /// this long. Each costs about five commands; at the
    /// default, an idle agent sends about 1.5 commands a minute in all on
    /// MongoDB.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use store_memory::MemoryStore;
    /// use mongoagent::Agent;
    ///
    /// let agent = Agent::builder(MemoryStore::new(), "mailer", "tasks")
    ///     .recheck_interval(Duration::from_secs(60))
    ///     .build()?;
    /// # Ok::<(), mongoagent::AgentError>(())
    /// ```
    #[must_use]
    pub fn recheck_interval(mut self, d: Duration) -> Self {
        self.recheck_interval = d;
        self
    }

    /// The claim lease's length (default 60 s; `ttl` as for a lock), renewed every third of it while the handler
    /// runs; a crashed agent's task is claimable again once it lapses.
    #[doc(alias = "lease")]
    #[must_use]
    pub fn ttl(mut self, d: Duration) -> Self {
        self.ttl = d;
        self
    }

    /// Attempts before a task fails for good (default 5).
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Retry backoff: `base * 2^(attempt-1)`, capped at `max`, with ±50 % jitter
    /// (default 1 s and 10 min).
    #[must_use]
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = (base, max);
        self
    }

    /// How long one attempt of a task may run (default: no limit), unless
    /// the task says otherwise ([`NewTask::timeout`](crate::NewTask::timeout)).
    /// When it passes, [`Task::cancellation`](crate::Task::cancellation) fires
    /// ([`Task::timed_out`](crate::Task::timed_out) tells it from a lost claim)
    /// and the attempt fails with "timed out after …", retried by the usual
    /// policy. A handler still running [`timeout_grace`](Self::timeout_grace)
    /// later is aborted and its claim left to lapse, not released: no other
    /// agent gets the task before the lease's end, and whatever the handler
    /// still writes after that is fenced out.
    ///
    /// ```
    /// # use store_memory::MemoryStore;
    /// use mongoagent::Agent;
    /// use std::time::Duration;
    ///
    /// let agent = Agent::builder(MemoryStore::new(), "render", "tasks")
    ///     .timeout(Duration::from_secs(300))
    ///     .timeout_grace(Duration::from_secs(10))
    ///     .build()
    ///     .unwrap();
    /// # let _ = agent;
    /// ```
    #[must_use]
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// How long a handler whose timeout passed has to end after its
    /// cancellation fires (default 10 s) before it is aborted and its claim
    /// left to lapse.
    #[must_use]
    pub fn timeout_grace(mut self, d: Duration) -> Self {
        self.timeout_grace = d;
        self
    }

    /// Tasks in flight at once in [`Agent::work`] (default 1).
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Tasks a busy agent may claim ahead of its free slots, at most (default:
    /// twice its [`concurrency`](Self::concurrency), at most 1,000; 0 turns
    /// it off; more than 1,000 is a configuration error).
    ///
    /// They start as slots free, without a claim each time, so an agent
    /// claims a third as often under load. Only while its handler runs are
    /// short (under 100 ms on average), its last claim got every task it
    /// asked for from a backlog (at least 64 ready), and neither a rate limit
    /// nor a binding global concurrency stops it: a task claimed ahead waits
    /// for at most about one short run. A task claimed ahead is claimed,
    /// leased and fenced like any other. It runs in the drain after
    /// [`Agent::shutdown`]; a stop by [`process_while`](Self::process_while)
    /// gives it back unstarted, and its next run is still the same attempt.
    #[doc(alias = "claim_ahead")]
    #[must_use]
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = Some(n);
        self
    }

    /// At most `n` tasks of this agent's name run at once across every
    /// process (default: no such limit; [`concurrency`](Self::concurrency)
    /// bounds one agent). Built on a [`mongolock::Semaphore`] of `n` permits
    /// in the queue's control collection: an agent takes a permit before each
    /// claim (as many as it has free slots, in one batch) and gives it back
    /// when the task ends; a crashed process's permits lapse with their lease.
    /// Every process of a name must give the same `n`.
    #[must_use]
    pub fn global_concurrency(mut self, n: u32) -> Self {
        self.global_concurrency = Some(n);
        self
    }

    /// At most `n` task starts of this agent's name in any window of `per`,
    /// across every process, on the store's clock (default: no limit). A start
    /// beyond the limit waits; it never fails. One conditional write per start
    /// on a control document ([`RateLimit`](crate::RateLimit)). Every process
    /// of a name must give the same limit (another limit is counted apart).
    #[must_use]
    pub fn rate_limit(mut self, n: u32, per: Duration) -> Self {
        self.rate_limit = Some((n, per));
        self
    }

    /// At most `n` tasks of one group ([`NewTask::group`](crate::NewTask::group))
    /// run at once across the cluster, started in enqueue order; with 1, a
    /// group's tasks run one at a time, in order. Other groups, and tasks
    /// without a group, run beside them as usual. Without it, the agent runs
    /// no grouped task: they wait for an agent of the name that has a cap.
    /// Every process of a name should give the same `n` (each lets tasks
    /// through by its own).
    ///
    /// The agent then also lets a group's next task through when it ends
    /// one; [`Agent::work`] watches the queue's group slots
    /// (`<queue>_groups`) for producers' nudges and sweeps its name's active
    /// slots (every [`SWEEP`](crate::group::SWEEP)), and [`Agent::process`]
    /// sweeps when it finds nothing ready, at most once per poll interval.
    ///
    /// ```
    /// use mongoagent::Agent;
    ///
    /// # fn build(store: store_memory::MemoryStore) -> Result<(), mongoagent::AgentError> {
    /// let agent = Agent::builder(store, "orders", "tasks").concurrency(8).group_concurrency(1).build()?;
    /// # let _ = agent; Ok(()) }
    /// ```
    #[must_use]
    pub fn group_concurrency(mut self, n: usize) -> Self {
        self.group_concurrency = Some(n);
        self
    }

    /// The tracer provider the agent's `mongoagent.claim` spans come from
    /// (the `otel` feature; default: the global one,
    /// [`opentelemetry::global::tracer_provider`]): for an application that
    /// keeps a provider of its own, or several. The run spans are
    /// `tracing` spans, exported through the `tracing-opentelemetry` layer
    /// whatever this says.
    ///
    /// ```
    /// use mongoagent::Agent;
    /// use opentelemetry::trace::noop::NoopTracerProvider;
    ///
    /// # fn build(store: store_memory::MemoryStore) -> Result<(), mongoagent::AgentError> {
    /// let agent = Agent::builder(store, "orders", "tasks").tracer_provider(NoopTracerProvider::new()).build()?;
    /// # let _ = agent; Ok(()) }
    /// ```
    #[cfg(feature = "otel")]
    #[must_use]
    pub fn tracer_provider<P, T, Sp>(mut self, provider: P) -> Self
    where
        Sp: opentelemetry::trace::Span + Send + Sync + 'static,
        T: opentelemetry::trace::Tracer<Span = Sp> + Send + Sync + 'static,
        P: opentelemetry::trace::TracerProvider<Tracer = T> + Send + Sync + 'static,
    {
        self.tracer.provider = Some(std::sync::Arc::new(provider));
        self
    }

    /// How long a stopping agent lets in-flight tasks finish before it gives
    /// their claims back (default 30 s).
    #[must_use]
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }

    /// Garbage-collects finished tasks this long after they finish (TTL index;
    /// default: keep them). Only ended tasks are marked, and the mark is removed
    /// whenever a task is made ready again (requeue, retry, wake, claim). A
    /// follow-up something waits for is marked only once its waiter has ended
    /// for good, so the waiter always reads every one of them.
    ///
    /// A schedule's tick is one task while its task exists: for an agent that
    /// runs ticks, keep them longer than any scheduler may stall between
    /// reading its schedules and enqueuing (`mongocoord cron` refuses under an
    /// hour), or a stalled scheduler may enqueue a deleted tick again.
    #[must_use]
    pub fn retain_finished(mut self, d: Duration) -> Self {
        self.retain_finished = Some(d);
        self
    }

    /// The identity recorded on claims (default [`Identity::current`]).
    #[must_use]
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
    #[must_use]
    pub fn shutdown_on(mut self, token: &CancellationToken) -> Self {
        self.shutdown_on = Some(token.child_token());
        self
    }

    /// [`Agent::work`] continues while this returns true for the log (default:
    /// forever). It is asked before every claim, and an idle agent with it
    /// claims once per [`poll_interval`](Self::poll_interval), as the seed's
    /// `work` loop does, even with change notifications.
    #[must_use]
    pub fn process_while(mut self, f: impl Fn(&AgentCounters) -> bool + Send + Sync + 'static) -> Self {
        self.process_while = Some(Arc::new(f));
        self
    }

    /// Validates the configuration.
    pub fn build(self) -> Result<Agent<S>, AgentError> {
        let bad = |m: String| Err(AgentError::Config(m.into()));
        if self.name.is_empty() {
            return bad("an agent needs a non-empty name".into());
        }
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1".into());
        }
        let prefetch = match self.prefetch {
            Some(n) if n > super::ahead::MAX_PREFETCH => {
                return bad(format!("prefetch {n} is above {}", super::ahead::MAX_PREFETCH))
            }
            Some(n) => n,
            None => self.concurrency.saturating_mul(2).min(super::ahead::MAX_PREFETCH),
        };
        if self.max_attempts == 0 {
            return bad("max_attempts must be at least 1".into());
        }
        if let Some(t) = self.timeout {
            crate::task::timeout_ms(t)
                .map_err(|_| AgentError::Config(format!("timeout {t:?}: from 1 ms to a year").into()))?;
        }
        if self.group_concurrency == Some(0) {
            return bad("group_concurrency must be at least 1".into());
        }
        if self.timeout_grace > crate::task::MAX_TIMEOUT {
            return bad(format!("timeout_grace {:?} is above a year", self.timeout_grace));
        }
        let config = |e: mongolock::LockError| AgentError::Config(ConfigError::caused_by(e));
        check_interval("poll_interval", self.poll_interval).map_err(config)?;
        check_interval("recheck_interval", self.recheck_interval).map_err(config)?;
        if !self.drain_timeout.is_zero() {
            check_interval("drain_timeout", self.drain_timeout).map_err(config)?;
        }
        let (base, max) = self.backoff;
        check_interval("backoff base", base).map_err(config)?;
        check_interval("backoff maximum", max).map_err(config)?;
        if max < base {
            return bad(format!("the backoff maximum {max:?} is below its base {base:?}"));
        }
        // The claim's lease is kept like a lock's: reject a lease that leaves no
        // room to renew it before it could lapse now, not after a claim.
        let ttl = LeaseTiming::new(self.ttl, None, None).map_err(config)?.ttl();
        let retain = self
            .retain_finished
            .map(Ttl::new)
            .transpose()
            .map_err(|e| AgentError::Config(ConfigError::caused_by(e)))?;
        let queue = self.queue?;
        let identity = self.identity.unwrap_or_else(Identity::current);
        let limits = super::limits::Limits::new(
            &self.store,
            &queue,
            &self.name,
            (ttl.as_duration(), &identity),
            self.global_concurrency,
            self.rate_limit,
        )?;
        // Every claim's lease is kept through these, like a lock's acquisition.
        let leases = Leases::builder(self.store.clone(), queue.coll.as_str())
            .ttl(ttl.as_duration())
            .identity(identity.clone())
            // Task leases: a task's document is marked for collection when it ends.
            .allow_gc()
            .build()
            .map_err(config)?;
        // Without a cap, groups only to nudge the capped agents (a queue name
        // too long for the slots' collection has no grouped tasks anyway).
        let groups = match (self.group_concurrency, queue.groups()) {
            (Some(cap), groups) => Some((groups?, Some(cap))),
            (None, groups) => groups.ok().map(|g| (g, None)),
        };
        let groups = groups
            .map(|(g, cap)| Arc::new(super::groups::GroupCap::new(self.name.clone(), self.poll_interval, g, cap)));
        let shutdown = self.shutdown_on.unwrap_or_default();
        Ok(Agent {
            inner: Arc::new(Inner {
                store: self.store.clone(),
                claimer: super::claim::Claimer::new(
                    queue.clone(),
                    self.name.clone(),
                    identity,
                    ttl,
                    leases,
                    limits,
                    shutdown.clone(),
                )
                .with_tracer(self.tracer.clone()),
                finisher: super::finish::Finisher {
                    store: self.store.clone(),
                    queue: queue.clone(),
                    name: self.name.clone(),
                    max_attempts: self.max_attempts,
                    backoff: self.backoff,
                    retain,
                    committer: std::sync::OnceLock::new(),
                    log: Mutex::new(AgentCounters::default()),
                },
                name: self.name,
                queue,
                poll_interval: self.poll_interval,
                recheck_interval: self.recheck_interval.max(self.poll_interval),
                timeout: self.timeout,
                timeout_grace: self.timeout_grace,
                concurrency: self.concurrency,
                prefetch,
                run_times: super::ahead::RunTimes::default(),
                drain_timeout: self.drain_timeout,
                process_while: self.process_while,
                groups,
                shutdown,
            }),
        })
    }
}
