//! The agent: claims tasks atomically, runs the handler under a renewed lease,
//! and records the outcome with a write fenced by the claim's fence.
//!
//! One concern per file: [`builder`](AgentBuilder) (configuration), `work`
//! (the loop: concurrency, idle wait, drain), `claim` (claim queries, order,
//! the claim gate), `candidates` (the keys claims name), `ahead` (claims
//! ahead of free slots), `run` (the
//! handler), `finish` (outcomes, retry policy, fencing), `fan_in`
//! (waiting for follow-ups), `turns` (follow-ups that would wait behind a
//! waiting chain's group turn) and `groups` (letting grouped tasks through).
//! This file holds the handle and its counters.

mod ahead;
mod builder;
mod candidates;
mod claim;
mod commit;
mod fan_in;
mod finish;
mod groups;
mod limits;
mod processed;
mod run;
mod turns;
mod work;

use std::sync::Arc;

use std::time::Duration;

use bson::{doc, Document};
use store_trait::{Record, Store};
use tokio_util::sync::CancellationToken;

pub use builder::AgentBuilder;
pub use processed::{AgentCounters, Processed};
pub use run::Handler;

use crate::error::AgentError;
use crate::queue::Queue;
use crate::schema::fields;
use builder::ProcessWhile;

struct Inner<S: Store + Clone> {
    store: S,
    name: String,
    queue: Queue<S>,
    poll_interval: Duration,
    /// The idle agent's check with live notifications (never under `poll_interval`).
    recheck_interval: Duration,
    /// Takes the agent's tasks: claims, candidates, pause state, limits.
    claimer: claim::Claimer<S>,
    /// Records their outcomes: fenced writes, retries, fan-in, counters.
    finisher: finish::Finisher<S>,
    /// How long one attempt may run, unless its task says otherwise.
    timeout: Option<Duration>,
    /// How long a timed-out handler has to end after its cancellation.
    timeout_grace: Duration,
    concurrency: usize,
    /// Tasks claimed ahead of free slots, at most (`ahead.rs`).
    prefetch: usize,
    /// The handler's run times, which decide whether to claim ahead.
    run_times: ahead::RunTimes,
    drain_timeout: Duration,
    process_while: Option<ProcessWhile>,
    /// With a cap per group: the queue's groups, and the cap (`groups.rs`).
    groups: Option<Arc<groups::GroupCap<S>>>,
    shutdown: CancellationToken,
}

/// An agent: takes tasks named for it from a queue collection and processes them.
/// Cheap to clone.
#[derive(Clone)]
pub struct Agent<S: Store + Clone> {
    inner: Arc<Inner<S>>,
}

impl<S: Store + Clone> std::fmt::Debug for Agent<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.inner.name)
            .field("queue", &self.inner.queue.coll)
            .finish_non_exhaustive()
    }
}

impl<S: Store + Clone> Agent<S> {
    /// An agent named `name` on queue collection `queue` (the Ruby `mongo_agent`'s `new(name, queue)`).
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
        AgentBuilder::new(store, name, queue)
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

    /// How long an idle agent waits between polls when the store has no
    /// change notifications, at most ([`AgentBuilder::poll_interval`]; the
    /// Ruby `mongo_agent`'s `sleep_between`, 5 s by default).
    #[doc(alias = "sleep_between")]
    pub fn poll_interval(&self) -> Duration {
        self.inner.poll_interval
    }

    /// The counters so far (the Ruby `mongo_agent`'s log).
    #[doc(alias = "log")]
    pub fn counters(&self) -> AgentCounters {
        *self.inner.finisher.log.lock()
    }

    /// Stops [`Agent::work`]: no new claims; in-flight tasks get the drain timeout.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    /// Ready tasks of this agent (the Ruby `mongo_agent`'s `get_tasks`), or those matching
    /// `filter` (field equality).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read.
    pub async fn get_tasks(&self, filter: Option<Document>) -> Result<Vec<Record>, AgentError> {
        let filter = filter.unwrap_or_else(|| doc! { fields::AGENT_NAME: &self.inner.name, fields::READY: true });
        self.inner.queue.tasks(filter, None).await
    }

    /// Processes at most one task: claims the next one (one round trip), runs
    /// `handler` while renewing the claim, records the outcome. `Ok(None)` when no
    /// task is ready.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped after its claim, the task is not run to the end and
    /// no outcome is written; its lease is released in the background and it is
    /// claimed again with a higher fence (nothing is lost, a late write of the
    /// dropped run is rejected).
    pub async fn process(&self, handler: impl Handler) -> Result<Option<Processed>, AgentError> {
        let handler: Arc<dyn Handler> = Arc::new(handler);
        // With a cap per group, a sweep (at most once per poll interval, busy
        // or not) lets held tasks through: no loop beside `process` does, and
        // no nudge reaches it.
        let groups = self.inner.groups.as_deref();
        if let Some(g) = groups {
            g.sweep_if_due().await;
        }
        let claimed = self.inner.claimer.claim(1, None).await?.tasks.pop();
        if let Some(g) = groups {
            g.claimed_for_process(claimed.is_some());
        }
        match claimed {
            Some(c) => {
                let processed = self.run(c, handler).await;
                // No next claim follows here: a kept permit goes back now.
                self.inner.claimer.release_pooled().await;
                Ok(Some(processed?))
            }
            None => Ok(None),
        }
    }

    fn bump(&self, f: impl FnOnce(&mut AgentCounters)) {
        self.inner.finisher.bump(f);
    }
}
