//! Errors of the agent.

use mongolock::LockError;
use store_trait::StoreError;

/// Everything an agent or queue operation can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The configuration was rejected (empty name, zero concurrency, …).
    #[error("invalid agent configuration: {0}")]
    Config(String),
    /// A task to enqueue, or a claimed task, is malformed.
    #[error("invalid task: {0}")]
    InvalidTask(String),
    /// A lease operation failed.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
