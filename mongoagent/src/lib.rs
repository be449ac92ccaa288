//! Task agents that never lose or double-run a task: the Rust counterpart of
//! `mongo_agent`, built on the [`store_trait::Store`] contract and
//! [`mongolock`]'s leases.
//!
//! Tasks are documents in a queue collection with the original fields
//! (`agent_name`, `ready`, `started_at`, `agent_host`, `complete`,
//! `completed_at`, `error_encountered`), so existing queues keep working. What is
//! new:
//!
//! - **Atomic claim**: one round trip picks the next task by priority, then
//!   `run_at`, then insertion, and leases it to this agent.
//! - **Leases and crash recovery**: the claim is renewed while the handler runs;
//!   a crashed or hung agent's task is claimable again once its lease lapses.
//! - **Fenced outcomes**: completion and failure are applied only if this agent's
//!   claim's fence still holds; a stale agent's late result is rejected and counted.
//! - **Retries** with exponential backoff and jitter up to an attempt limit, then
//!   failure for good (`complete: true, error_encountered: true`).
//! - **Pipelines**: follow-up tasks are enqueued idempotently, with ids derived
//!   from the parent, before the parent is marked complete.
//! - **Fan-in**: a handler can wait for its follow-ups and run again once all
//!   have ended ([`Outcome::wait_for_follow_ups`]), or add a task made ready
//!   once they have ([`Outcome::then`]). The last follow-up to end wakes the
//!   waiting task; nothing polls.
//! - **Push wake-up**: an idle agent is woken by a change notification, not a
//!   5-second sleep.
//! - **Dedupe scopes and debounce** ([`DedupeScope`]): a dedupe key that holds
//!   for ever, until its task ended, or for a window; or a debounce, where a
//!   burst of enqueues runs once, with the last data.
//! - **Transactional enqueue** ([`Queue::prepare`], MongoDB only): a task that
//!   exists if and only if the caller's transaction commits (the outbox).
//! - **Schedules** ([`schedule`]): cron expressions in a time zone, fixed
//!   intervals and one-off times (feature `schedule`, on by default); any number of processes run a [`schedule::Scheduler`]
//!   and each tick still becomes exactly one task, with no leader.
//! - **Metrics** ([`metrics`]): task outcomes by queue, agent name and
//!   outcome, and claim round trips, through the `metrics` facade
//!   (`mongoagent_*`), for whatever recorder the application installs.
//!
//! A two-stage pipeline:
//!
//! ```
//! use mongoagent::{Agent, NewTask, Outcome, Queue, Task};
//! use bson::doc;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), mongoagent::AgentError> {
//! let store = store_memory::MemoryStore::new(); // or mongoagent::mongo_from_env().await?
//! let queue = Queue::new(store.clone(), "pipeline")?;
//! queue.enqueue(NewTask::new("download", doc! { "url": "https://example.com/a.csv" })).await?;
//!
//! let download = Agent::builder(store.clone(), "download", "pipeline").build()?;
//! download
//!     .process(|task: Task| async move {
//!         let url = task.data().get_str("url").unwrap_or_default().to_owned();
//!         Outcome::done_with(doc! { "bytes": 1234 }).follow_up(NewTask::new("parse", doc! { "source": url }))
//!     })
//!     .await?;
//!
//! let parse = Agent::builder(store, "parse", "pipeline").build()?;
//! let done = parse.process(|_task: Task| async { true }).await?;
//! assert!(matches!(done, Some(mongoagent::Processed::Completed(_))));
//! assert_eq!(parse.counters().tasks_processed, 1);
//! # Ok(()) }
//! ```

mod agent;
mod control;
mod dedupe;
mod error;
mod events;
pub mod group;
pub mod metrics;
pub mod operator;
mod outcome;
mod prepare;
mod progress;
mod queue;
mod rate;
#[cfg(feature = "schedule")]
pub mod schedule;
mod schema;
mod shared;
mod task;
mod trace;
mod wait;

pub use agent::{Agent, AgentBuilder, AgentCounters, Handler, Processed};
pub use control::CONTROL_REFRESH;
pub use error::AgentError;
pub use events::{EventFilter, EventKind, EventStream, QueueEvent, TaskEvent};
pub use outcome::{Outcome, Retry};
pub use prepare::PreparedTask;
pub use progress::MAX_PROGRESS_BYTES;
pub use queue::{Queue, QueueStats};
pub use rate::{RateLimit, MAX_RATE_STARTS};

pub use schema::{fields, TimedOutAttempt, MAX_DATA_DEPTH};
pub use task::{Child, DedupeScope, NewTask, Task, MAX_TIMEOUT};
#[cfg(feature = "otel")]
pub use trace::TraceContext;
pub use wait::Ended;

pub use mongolock;
pub use store_trait;
/// The cancellation token [`Task::cancellation`] returns and [`AgentBuilder::shutdown_on`] takes.
pub use tokio_util::sync::CancellationToken;

/// The MongoDB backend, re-exported for convenience.
#[cfg(feature = "mongo")]
pub use store_mongo as mongo;

/// Connects to MongoDB as the Ruby `mongo_agent` did: `MONGODB_URI`, or else
/// `MONGO_HOST` (any form `mongod` accepts: `host`, `host:port`, or a URI); the
/// database is `MONGO_DB` (default [`store_mongo::DEFAULT_DATABASE`]), created
/// on first write. The rules live in [`store_mongo::ConnectionConfig`].
///
/// # Cancel safety
///
/// Cancel-safe: nothing is written.
#[cfg(feature = "mongo")]
pub async fn mongo_from_env() -> Result<store_mongo::MongoStore, AgentError> {
    Ok(store_mongo::ConnectionConfig::from_env()?.connect().await?)
}
