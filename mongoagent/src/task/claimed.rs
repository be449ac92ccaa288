//! A claimed task as its handler sees it ([`Task`]), the follow-ups a
//! re-run task sees ([`Child`]), and what a task writes to its own
//! document ([`TaskWrites`]).

use std::time::Duration;

use bson::Document;
use serde::de::DeserializeOwned;
use store_trait::Key;
use tokio_util::sync::CancellationToken;

use crate::error::AgentError;
use crate::schema::fields;

/// A claimed task, as the handler sees it.
#[derive(Debug, Clone)]
pub struct Task {
    pub(crate) key: Key,
    pub(crate) data: Document,
    pub(crate) fence: u64,
    pub(crate) attempt: u64,
    pub(crate) cancel: CancellationToken,
    /// Set, before [`Task::cancellation`] fires, when the attempt's timeout passed.
    pub(crate) timed_out: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The attempt's timeout, if any.
    pub(crate) timeout: Option<Duration>,
    pub(crate) validity: mongolock::Validity,
    pub(crate) round: u64,
    pub(crate) children: Vec<Child>,
    /// Where [`Task::progress`] writes.
    pub(crate) writes: TaskWrites,
}

impl Task {
    /// The task's id.
    pub fn id(&self) -> &Key {
        &self.key
    }

    /// The task document's fields (the queue's reserved lease fields excluded).
    pub fn data(&self) -> &Document {
        &self.data
    }

    /// The task document as a typed value. A malformed task is an error the agent
    /// records as a permanent failure when the handler returns it.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, AgentError> {
        bson::deserialize_from_document(self.data.clone())
            .map_err(|e| AgentError::InvalidTask(format!("task {} cannot be read: {e}", self.key)))
    }

    /// Which attempt of this round this is (1 for the first): every claim of the
    /// task counts, including one whose agent died (a task that crashes its
    /// agents must end), but a new round after follow-ups, and a requeue, start
    /// over. `max_attempts` bounds it.
    pub fn attempt(&self) -> u64 {
        self.attempt
    }

    /// The fence of this claim: every claim of the task has a larger one, and a
    /// stale claim's outcome is rejected by it.
    #[doc(alias = "token")]
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Cancelled when the claim is lost (before its lease can lapse) or the agent
    /// stops waiting for the handler; long handlers should select on it. The
    /// handler of a task cancelled or deleted under it that still runs when
    /// its lease reaches its local deadline is aborted (dropped at its next
    /// `.await`): past it, its group's next task may begin.
    #[doc(alias = "cancelled")]
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Whether this attempt's timeout passed: set before
    /// [`Task::cancellation`] fires for it, so a handler woken by the
    /// cancellation can tell a timeout from a lost claim.
    pub fn timed_out(&self) -> bool {
        self.timed_out.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How long this attempt may run ([`NewTask::timeout`](crate::NewTask::timeout), else the agent's
    /// [`AgentBuilder::timeout`](crate::AgentBuilder::timeout)), if limited.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The claim's lease, readable from anywhere: how much confirmed time is left
    /// ([`mongolock::Validity::remaining`]), and a wait until less than a grace
    /// period is ([`mongolock::Validity::expiring`]), so a long handler can stop
    /// gracefully before [`Task::cancellation`] fires.
    pub fn validity(&self) -> &mongolock::Validity {
        &self.validity
    }

    /// How many times this task's follow-ups all finished and it ran again: 0 on
    /// its first run; 1 when a handler that returned
    /// [`Outcome::wait_for_follow_ups`](crate::Outcome::wait_for_follow_ups) runs again, or when a task enqueued with
    /// [`Outcome::then`](crate::Outcome::then) runs.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// The follow-ups this task waited for (the last round's), in the order they
    /// were returned; empty on a first run. Each has ended, completed or failed
    /// for good.
    pub fn children(&self) -> &[Child] {
        &self.children
    }
}

/// A follow-up a task waited for, as it ended. See [`Task::children`].
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    pub(crate) key: Key,
    pub(crate) data: Document,
}

impl Child {
    /// Its id.
    pub fn id(&self) -> &Key {
        &self.key
    }

    /// Whether it completed (rather than failed for good).
    pub fn succeeded(&self) -> bool {
        self.data.get_bool(fields::ERROR_ENCOUNTERED).ok() == Some(false)
    }

    /// The last failure's message, if it failed.
    pub fn error(&self) -> Option<&str> {
        if self.succeeded() {
            None
        } else {
            self.data.get_str(fields::LAST_ERROR).ok()
        }
    }

    /// Its document: its data and what its handler merged into it.
    pub fn data(&self) -> &Document {
        &self.data
    }

    /// Its document as a typed value.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, AgentError> {
        bson::deserialize_from_document(self.data.clone())
            .map_err(|e| AgentError::InvalidTask(format!("follow-up {} cannot be read: {e}", self.key)))
    }
}

/// What a claimed [`Task`] needs to write to its own document: the store and
/// the queue collection, shared by the agent's tasks.
#[derive(Debug, Clone)]
pub(crate) struct TaskWrites {
    pub(crate) store: std::sync::Arc<dyn store_trait::Store>,
    pub(crate) coll: store_trait::Collection,
}
