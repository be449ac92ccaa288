//! What the agent reports: the outcome of one task it took ([`Processed`]) and
//! its running totals ([`AgentCounters`]), which the machinery below the
//! handle fills in.

use store_trait::Key;

/// The agent's counters: the Ruby `mongo_agent`'s log (`tasks_processed`,
/// `failed_tasks`; its example's `errors_encountered` is `failed_tasks`) and more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AgentCounters {
    /// Handler calls.
    pub tasks_processed: u64,
    /// Handler calls that failed (including panics).
    #[doc(alias = "errors_encountered")]
    pub failed_tasks: u64,
    /// Tasks completed.
    pub completed: u64,
    /// Failures scheduled for another attempt.
    pub retried: u64,
    /// Tasks failed for good.
    pub failed_permanently: u64,
    /// Outcomes rejected because the claim was lost (another agent took the task
    /// after this one's lease lapsed): never applied.
    pub stale_rejected: u64,
    /// Tasks set to wait for their follow-ups ([`Outcome::wait_for_follow_ups`](crate::Outcome::wait_for_follow_ups)).
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
    /// The agent stopped while the task waited for a start under its rate
    /// limit: the handler never ran, and the claim was given back.
    NotStarted(Key),
    /// The attempt's timeout passed and its handler did not end within the
    /// grace ([`AgentBuilder::timeout_grace`](crate::AgentBuilder::timeout_grace)): it was aborted, and its claim
    /// left to lapse at its lease's end (no outcome written; the next claim
    /// is the next attempt).
    Abandoned(Key),
}

impl Processed {
    /// Its `outcome` label in the metrics (`mongoagent_tasks_total`).
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Processed::Completed(_) => "completed",
            Processed::Retried(_) => "retried",
            Processed::Failed(_) => "failed_permanently",
            Processed::Stale(_) => "stale",
            Processed::Waiting(_) => "waiting",
            Processed::Recovered(_) => "recovered",
            Processed::NotStarted(_) => "not_started",
            Processed::Abandoned(_) => "abandoned",
        }
    }
}
