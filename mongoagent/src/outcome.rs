//! What a handler returns ([`Outcome`]), and how a `bool` or a `Result`
//! becomes one.

use std::time::Duration;

use bson::Document;

use crate::error::AgentError;
use crate::task::NewTask;

/// What a handler reports.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Outcome {
    /// Success: merge these fields into the task and enqueue these follow-ups
    /// (before the task is marked complete, with ids derived from it, so a retried
    /// handler never duplicates them).
    Complete {
        /// Fields to merge into the task document.
        merge: Document,
        /// Tasks to enqueue.
        follow_ups: Vec<NewTask>,
        /// A task made ready once every follow-up has ended (fan-in).
        then: Option<Box<NewTask>>,
    },
    /// Not finished: enqueue these follow-ups, and run this task again (with
    /// [`Task::round`](crate::Task::round) one higher and [`Task::children`](crate::Task::children) filled) once every one
    /// of them has ended. No agent polls for it: the last follow-up to end makes
    /// the task ready.
    Wait {
        /// Fields to merge into the task document.
        merge: Document,
        /// Tasks to enqueue and wait for (at least one).
        follow_ups: Vec<NewTask>,
    },
    /// Failure.
    Fail {
        /// What went wrong (recorded as `last_error`).
        error: String,
        /// Fields to merge into the task document.
        merge: Document,
        /// Whether and when to try again.
        retry: Retry,
    },
}

/// Whether a failed task is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retry {
    /// Per the agent's policy: exponential backoff with jitter, up to the attempt limit.
    Policy,
    /// Never: fail for good now.
    Never,
    /// After this delay (still counting against the attempt limit).
    After(Duration),
}

impl Outcome {
    /// Success with nothing to add.
    pub fn done() -> Self {
        Outcome::Complete { merge: Document::new(), follow_ups: Vec::new(), then: None }
    }

    /// Success, merging `merge` into the task.
    pub fn done_with(merge: Document) -> Self {
        Outcome::Complete { merge, follow_ups: Vec::new(), then: None }
    }

    /// Adds a follow-up task (on success, or to wait for).
    #[must_use]
    pub fn follow_up(mut self, t: NewTask) -> Self {
        if let Outcome::Complete { follow_ups, .. } | Outcome::Wait { follow_ups, .. } = &mut self {
            follow_ups.push(t);
        }
        self
    }

    /// Fan-in, as a new task: on success, enqueue `task` now but make it ready
    /// only once every follow-up has ended; its handler sees them in
    /// [`Task::children`](crate::Task::children). If this task is itself a follow-up something waits
    /// for, that wait extends to `task`. Its id is derived from this task's,
    /// which keeps it once: its dedupe key and scope, if any, are dropped.
    /// In a group ([`NewTask::group`](crate::NewTask::group)), it takes no
    /// turn while it waits: once every follow-up has ended it waits for its
    /// group's turn, in the place of its enqueue.
    ///
    /// ```
    /// use mongoagent::{NewTask, Outcome};
    /// let split = Outcome::done()
    ///     .follow_up(NewTask::new("count", bson::doc! { "part": 1 }))
    ///     .follow_up(NewTask::new("count", bson::doc! { "part": 2 }))
    ///     .then(NewTask::new("sum", bson::doc! {}));
    /// # let _ = split;
    /// ```
    #[must_use]
    pub fn then(mut self, task: NewTask) -> Self {
        if let Outcome::Complete { then, .. } = &mut self {
            *then = Some(Box::new(task));
        }
        self
    }

    /// Fan-in, on this task: instead of completing, wait for the follow-ups and
    /// run again once every one has ended ([`Task::round`](crate::Task::round) tells the runs apart).
    ///
    /// ```
    /// use mongoagent::{NewTask, Outcome, Task};
    /// async fn handle(task: Task) -> Outcome {
    ///     if task.round() == 0 {
    ///         return Outcome::done()
    ///             .follow_up(NewTask::new("count", bson::doc! { "part": 1 }))
    ///             .follow_up(NewTask::new("count", bson::doc! { "part": 2 }))
    ///             .wait_for_follow_ups();
    ///     }
    ///     let total: i64 = task.children().iter().filter_map(|c| c.data().get_i64("n").ok()).sum();
    ///     Outcome::done_with(bson::doc! { "total": total })
    /// }
    /// # let _ = handle;
    /// ```
    #[must_use]
    pub fn wait_for_follow_ups(self) -> Self {
        match self {
            Outcome::Complete { merge, follow_ups, .. } => Outcome::Wait { merge, follow_ups },
            other => other,
        }
    }

    /// Failure, retried per the agent's policy (exponential backoff with
    /// jitter, up to the attempt limit). Unlike a handler's plain `false`, which
    /// fails the task for good at once.
    #[doc(alias = "retry")]
    pub fn failed(error: impl Into<String>) -> Self {
        Outcome::Fail { error: error.into(), merge: Document::new(), retry: Retry::Policy }
    }

    /// Failure, not retried.
    pub fn failed_permanently(error: impl Into<String>) -> Self {
        Outcome::Fail { error: error.into(), merge: Document::new(), retry: Retry::Never }
    }

    /// Failure, retried after `delay`.
    pub fn retry_after(error: impl Into<String>, delay: Duration) -> Self {
        Outcome::Fail { error: error.into(), merge: Document::new(), retry: Retry::After(delay) }
    }

    /// Adds fields to merge (success or failure).
    #[must_use]
    pub fn merge(mut self, fields: Document) -> Self {
        match &mut self {
            Outcome::Complete { merge, .. } | Outcome::Wait { merge, .. } | Outcome::Fail { merge, .. } => {
                merge.extend(fields)
            }
        }
        self
    }
}

/// The Ruby `mongo_agent`'s handlers return a boolean: `true` completes the
/// task, `false` fails it **for good at once** (`complete: true,
/// error_encountered: true`), as the original's `fail` did. To have a failure
/// retried, return [`Outcome::failed`] (or [`Outcome::retry_after`]); a
/// handler's error (a `Result<Outcome, AgentError>`) and a panic are retried
/// per the agent's policy.
impl From<bool> for Outcome {
    fn from(ok: bool) -> Self {
        if ok {
            Outcome::done()
        } else {
            Outcome::failed_permanently("the handler reported failure")
        }
    }
}

/// A handler's error fails the task per the retry policy; an
/// [`AgentError::InvalidTask`] (a task that cannot be read) fails it for good.
impl From<Result<Outcome, AgentError>> for Outcome {
    fn from(r: Result<Outcome, AgentError>) -> Self {
        match r {
            Ok(o) => o,
            Err(AgentError::InvalidTask(e)) => Outcome::failed_permanently(e),
            Err(e) => Outcome::failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn outcomes() {
        assert_eq!(Outcome::from(true), Outcome::done());
        assert!(
            matches!(Outcome::from(false), Outcome::Fail { retry: Retry::Never, .. }),
            "as in the Ruby mongo_agent, false fails the task for good"
        );
        let o = Outcome::done().merge(doc! {"a": 1}).follow_up(NewTask::new("b", doc! {}));
        assert!(
            matches!(o, Outcome::Complete { ref merge, ref follow_ups, then: None } if merge.len() == 1 && follow_ups.len() == 1)
        );
        let w = o.clone().then(NewTask::new("c", doc! {}));
        assert!(matches!(w, Outcome::Complete { then: Some(_), .. }));
        let w = o.wait_for_follow_ups().follow_up(NewTask::new("c", doc! {}));
        assert!(matches!(w, Outcome::Wait { ref follow_ups, .. } if follow_ups.len() == 2));
        assert!(matches!(w.then(NewTask::new("d", doc! {})), Outcome::Wait { .. }), "then applies to success only");
        assert!(Outcome::failed("x").wait_for_follow_ups() == Outcome::failed("x"));
        let bad: Result<Outcome, AgentError> = Err(AgentError::InvalidTask("x".into()));
        assert!(matches!(Outcome::from(bad), Outcome::Fail { retry: Retry::Never, .. }));
    }
}
