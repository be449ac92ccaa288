//! Errors of the agent.

use mongolock::{ConfigError, LockError};
use store_trait::StoreError;

/// Everything an agent or queue operation can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The configuration was rejected (empty name, zero concurrency, …), with
    /// the error that rejected it where there is one.
    #[error("invalid agent configuration: {0}")]
    Config(ConfigError),
    /// A task to enqueue, or a claimed task, is malformed.
    #[error("invalid task: {0}")]
    InvalidTask(String),
    /// A write of a run of a claimed task (a progress report) was rejected:
    /// the task was claimed again since (this run's lease lapsed), cancelled,
    /// requeued or ended, so its fence is no longer this run's.
    #[error("task {task}: the run with fence {fence} no longer holds it (its fence is now {current:?})")]
    ClaimLost {
        /// The task's id.
        task: String,
        /// This run's fence.
        fence: u64,
        /// The task's fence now (`None` if it was deleted).
        current: Option<u64>,
    },
    /// User data (a new task's, a follow-up's, or a handler's merge) named a
    /// field the queue keeps for itself ([`crate::fields::RESERVED`]): the task
    /// is not enqueued, or the outcome fails for good, saying which.
    #[error("field {field:?} is the queue's own (see mongoagent::fields::RESERVED); use the NewTask methods, or another name")]
    ReservedField {
        /// The field.
        field: String,
    },
    /// A debounced enqueue ([`NewTask::debounce`](crate::NewTask::debounce))
    /// found its dedupe key held by a task it cannot give its data to (a
    /// task of another dedupe scope, or a debounced task of another agent
    /// name, that still holds the key): nothing was enqueued, and its data
    /// would not run. Not a duplicate, since the holder will not run that
    /// data either.
    #[error("dedupe key {dedupe_key:?} is held by task {holder} of another dedupe scope or agent name: a debounce replaces only a waiting debounced task of its own agent name, so nothing was enqueued")]
    KeyHeldByAnother {
        /// The dedupe key.
        dedupe_key: String,
        /// The task holding it.
        holder: String,
    },
    /// The task does not exist (or was deleted while waited for).
    #[error("task {task} not found")]
    NotFound {
        /// The task's id.
        task: String,
    },
    /// A progress value was rejected (not a number or a small document).
    #[error("invalid progress: {0}")]
    InvalidProgress(String),
    /// A lease operation failed. Never `LockError::Store`: a store fault
    /// under a lease operation is [`AgentError::Store`], so one fault has
    /// one variant.
    #[error(transparent)]
    Lock(LockError),
    /// The store failed (under a lease operation too).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<LockError> for AgentError {
    fn from(e: LockError) -> Self {
        match e {
            LockError::Store(e) => AgentError::Store(e),
            e => AgentError::Lock(e),
        }
    }
}

impl AgentError {
    /// Whether trying again later may succeed (transient store faults, a lease
    /// that was held).
    pub fn is_retryable(&self) -> bool {
        match self {
            AgentError::Store(e) => e.is_retryable(),
            AgentError::Lock(e) => e.is_retryable(),
            _ => false,
        }
    }
}
