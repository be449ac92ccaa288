//! Outcomes: the fenced write that records what the handler reported, the
//! retry policy, and what a stale agent's rejected outcome means.

use std::time::Duration;

use bson::Document;
use mongolock::{LockError, LockGuard};
use parking_lot::Mutex;
use store_trait::{Key, Mutation, Record, Store, Ttl};

use super::commit::Committer;
use super::processed::{AgentCounters, Processed};
use crate::error::AgentError;
use crate::outcome::{Outcome, Retry};
use crate::schema::pending::Finish;
use crate::schema::{fields, task_round, timed_out};
use crate::task::NewTask;

/// What an outcome write records of a timed-out attempt
/// ([`TimedOutAttempt`](crate::TimedOutAttempt)).
#[derive(Debug, Clone, Copy)]
pub(super) enum TimeoutMark {
    /// The attempt did not time out: the mark of an earlier one, if any, is
    /// removed, so the mark always tells of the latest attempt to have ended.
    Clear,
    /// This claim's attempt timed out, after this long.
    This(Duration),
    /// The claim before this one timed out and was abandoned, and this one
    /// fails the task for good for it without a run: its mark stays.
    Keep,
}

/// An agent's outcomes: the fenced writes that record what its handlers
/// reported (group-committed, `commit.rs`), the retry policy, the fan-in
/// steps (`fan_in.rs`), and the counters they keep. Built once per agent.
pub(super) struct Finisher<S: Store + Clone> {
    pub(super) store: S,
    pub(super) queue: crate::queue::Queue<S>,
    pub(super) name: String,
    pub(super) max_attempts: u32,
    pub(super) backoff: (Duration, Duration),
    /// How long ended tasks are kept, if they are collected at all.
    pub(super) retain: Option<Ttl>,
    /// The group commit of outcome writes, started by the first outcome.
    pub(super) committer: std::sync::OnceLock<Committer<S>>,
    pub(super) log: Mutex<AgentCounters>,
}

impl<S: Store + Clone> Finisher<S> {
    /// Adds to the agent's counters.
    pub(super) fn bump(&self, f: impl FnOnce(&mut AgentCounters)) {
        f(&mut self.log.lock());
    }

    /// Records `outcome`, the outcome of an attempt that did not time out.
    pub(super) async fn finish(
        &self,
        guard: LockGuard<S>,
        record: &Record,
        outcome: Outcome,
    ) -> Result<Processed, AgentError> {
        self.finish_marked(guard, record, outcome, TimeoutMark::Clear).await
    }

    /// Records `outcome`, and what `mark` says of a timeout, in one fenced
    /// write (with the claim's release, unless a waiter must be told first),
    /// in its span (`mongoagent.complete` or `mongoagent.fail`): every
    /// outcome an agent writes, its handler's or its own (a timeout, an
    /// abandoned last attempt, a bad mark).
    pub(super) async fn finish_marked(
        &self,
        guard: LockGuard<S>,
        record: &Record,
        outcome: Outcome,
        mark: TimeoutMark,
    ) -> Result<Processed, AgentError> {
        let span = crate::trace::outcome_span(&outcome);
        tracing::Instrument::instrument(self.write_outcome(guard, record, outcome, mark), span).await
    }

    async fn write_outcome(
        &self,
        guard: LockGuard<S>,
        record: &Record,
        outcome: Outcome,
        mark: TimeoutMark,
    ) -> Result<Processed, AgentError> {
        let key = record.key().clone();
        let fence = guard.fence();
        let round = task_round(record);
        let outcome = match outcome {
            Outcome::Complete { merge, follow_ups, then } => {
                let mut checked =
                    check_merge(&merge).and_then(|()| check_follow_ups(follow_ups.iter().chain(then.as_deref())));
                if checked.is_ok() && then.is_some() {
                    // The fan-in task extends the wait of whatever waits for
                    // this task to itself and to the follow-ups before it.
                    let awaited: Vec<&NewTask> = follow_ups.iter().chain(then.as_deref()).collect();
                    checked = self.check_not_behind_waiters(record, false, &awaited).await;
                }
                match checked {
                    Err(e) => Outcome::failed_permanently(e),
                    Ok(()) if follow_ups.is_empty() && then.is_none() => Outcome::done_with(merge),
                    // Follow-ups are enqueued pending and activated only after this
                    // claim's fenced outcome write: a stale run's never run.
                    Ok(()) => {
                        let finish = if then.is_some() { Finish::CompleteThen } else { Finish::Complete };
                        match self.enqueue_follow_ups(record, round, fence, follow_ups, then.map(|t| *t)).await {
                            Ok(()) => return self.hand_over(guard, record, merge, finish).await,
                            Err(e) => self.follow_ups_not_enqueued(&key, fence, &e).await,
                        }
                    }
                }
            }
            Outcome::Wait { follow_ups, .. } if follow_ups.is_empty() => {
                Outcome::failed_permanently("the handler waits for follow-ups but returned none")
            }
            Outcome::Wait { merge, follow_ups } => {
                let mut checked = check_merge(&merge).and_then(|()| check_follow_ups(&follow_ups));
                if checked.is_ok() {
                    let awaited: Vec<&NewTask> = follow_ups.iter().collect();
                    checked = self.check_not_behind_waiters(record, true, &awaited).await;
                }
                match checked {
                    Err(e) => Outcome::failed_permanently(e),
                    Ok(()) => {
                        let join = (key.as_bson().clone(), round);
                        match self.enqueue_children(&key, round, fence, follow_ups, Some(join)).await {
                            Ok(()) => return self.hand_over(guard, record, merge, Finish::Wait).await,
                            Err(e) => self.follow_ups_not_enqueued(&key, fence, &e).await,
                        }
                    }
                }
            }
            fail => fail,
        };
        let limit = self.attempt_limit(record);
        let attempt = crate::task::attempt(record);
        let (changes, result) = match outcome {
            Outcome::Complete { merge, .. } | Outcome::Wait { merge, .. } => (
                self.finished(Mutation::new().set_all(merge), attempt).set(fields::ERROR_ENCOUNTERED, false),
                Processed::Completed(key.clone()),
            ),
            Outcome::Fail { error, merge, retry } => {
                let merge = if check_merge(&merge).is_ok() { merge } else { Document::new() };
                let delay = match retry {
                    Retry::Never => None,
                    _ if attempt >= limit => None,
                    Retry::After(d) => Some(d),
                    _ => Some(self.backoff(attempt)),
                };
                match delay {
                    None => (
                        self.finished(Mutation::new().set_all(merge), attempt)
                            .set(fields::ERROR_ENCOUNTERED, true)
                            .set(fields::LAST_ERROR, error),
                        Processed::Failed(key.clone()),
                    ),
                    Some(d) => (
                        Mutation::new()
                            .set_all(merge)
                            .set(fields::READY, true)
                            .set(fields::CLAIMED, false)
                            .set(fields::ATTEMPTS, i64::try_from(attempt).unwrap_or(i64::MAX))
                            .set(fields::LAST_ERROR, error)
                            .set_time_after(fields::RUN_AT, d)
                            .clear_gc(),
                        Processed::Retried(key.clone()),
                    ),
                }
            }
        };
        let changes = match mark {
            TimeoutMark::Clear => timed_out::clear(changes, record.data()),
            TimeoutMark::This(limit) => timed_out::mark(changes, fence, attempt, limit),
            TimeoutMark::Keep => changes,
        };
        let ended = !matches!(result, Processed::Retried(_));
        let joined = ended && record.data().contains_key(fields::JOIN);
        // A follow-up something waits for keeps its claim until it has told the
        // waiter: if this agent dies in between, the claim lapses and whoever
        // claims it next finishes the step.
        let applied = if joined {
            guard.write(changes).await.map(|_| Some(guard))
        } else {
            let changes = if ended { self.close(changes, record.data()) } else { changes };
            // Group-committed with other tasks' outcomes (see `commit`).
            let committer = self.committer.get_or_init(Committer::start);
            committer.release_with(guard, changes).await.map(|()| None)
        };
        match applied {
            Ok(kept) => {
                self.bump(|l| match &result {
                    Processed::Completed(_) => l.completed += 1,
                    Processed::Retried(_) => l.retried += 1,
                    Processed::Failed(_) => l.failed_permanently += 1,
                    _ => {}
                });
                tracing::info!(agent = %self.name, task = %key, fence, outcome = ?result, "task finished");
                crate::metrics::outcome(&self.queue.coll, &self.name, result.label());
                if let Some(guard) = kept {
                    self.notify_waiter(record).await?;
                    match guard.release_with(self.close(Mutation::new(), record.data())).await {
                        Ok(_) | Err(LockError::Lost { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                if ended {
                    self.collect_children(&key, record).await;
                }
                self.collect_older_follow_ups(&key, record, fence).await;
                Ok(result)
            }
            Err(LockError::Lost { current, .. }) => Ok(self.stale(&key, fence, current)),
            Err(e) => Err(e.into()),
        }
    }

    /// How many attempts a round of `record` may have: its own limit, else the agent's.
    pub(super) fn attempt_limit(&self, record: &Record) -> u64 {
        record.get_i64(fields::MAX_ATTEMPTS).map_or(u64::from(self.max_attempts), |n| n.max(1) as u64)
    }

    pub(super) fn stale(&self, key: &Key, fence: u64, current: Option<Box<mongolock::LockInfo>>) -> Processed {
        self.bump(|l| l.stale_rejected += 1);
        tracing::warn!(agent = %self.name, task = %key, fence, now_held_by = ?current.map(|c| c.owner), "claim lost: outcome rejected, not applied");
        let stale = Processed::Stale(key.clone());
        crate::metrics::outcome(&self.queue.coll, &self.name, stale.label());
        stale
    }

    /// The changes that end a task (completed or failed for good); the claim is
    /// let go by [`Finisher::close`].
    pub(super) fn finished(&self, m: Mutation, attempt: u64) -> Mutation {
        m.set(fields::COMPLETE, true)
            .set(fields::READY, false)
            .set(fields::ATTEMPTS, i64::try_from(attempt).unwrap_or(i64::MAX))
            .set_now(fields::COMPLETED_AT)
    }

    /// Lets go of an ended task (and schedules its garbage collection). A
    /// follow-up something waits for (`join`) is not marked: its waiter reads it
    /// when it runs again, and marks it when it ends itself
    /// ([`Finisher::collect_children`]).
    pub(super) fn close(&self, m: Mutation, data: &Document) -> Mutation {
        let m = m.set(fields::CLAIMED, false);
        match self.retain {
            Some(ttl) if !data.contains_key(fields::JOIN) => m.gc_after(ttl),
            _ => m,
        }
    }

    pub(super) fn backoff(&self, attempt: u64) -> Duration {
        let (base, max) = self.backoff;
        let exp = base.saturating_mul(1_u32 << attempt.saturating_sub(1).min(20)).min(max);
        exp.mul_f64(0.5 + fastrand::f64())
    }
}

/// A handler's merge is checked against the schema before anything is
/// written: a reserved or malformed field fails the outcome for good, saying
/// which, and is never applied nor silently dropped.
pub(super) fn check_merge(merge: &Document) -> Result<(), String> {
    crate::schema::check_user_fields(merge).map_err(|e| format!("the handler's result cannot be merged: {e}"))
}

impl<S: Store + Clone> Finisher<S> {
    /// What a failure to enqueue follow-ups makes of the outcome: tried
    /// again later, unless the follow-ups themselves cannot be (bad data, an
    /// id or a dedupe key that is another task's), which fails it for good,
    /// saying why. Those this claim (`fence`) enqueued pending before the
    /// failure are removed first: never to be activated, they would hold
    /// their ids and dedupe keys for ever after a last attempt.
    async fn follow_ups_not_enqueued(&self, parent: &Key, fence: u64, e: &AgentError) -> Outcome {
        if let Err(e) = self.discard_stale_follow_ups(parent, fence).await {
            tracing::warn!(agent = %self.name, task = %parent, error = %e, "could not remove the follow-ups left pending; the next claim does");
        }
        let why = format!("could not enqueue follow-up tasks: {e}");
        match e {
            AgentError::InvalidTask(_) | AgentError::ReservedField { .. } => Outcome::failed_permanently(why),
            _ => Outcome::failed(why),
        }
    }
}

/// Every follow-up is checked before the first is enqueued, so a bad one
/// fails the outcome for good (saying which and why) and leaves no pending
/// sibling behind: a follow-up is never dropped while its parent completes.
pub(super) fn check_follow_ups<'a>(follow_ups: impl IntoIterator<Item = &'a NewTask>) -> Result<(), String> {
    for (i, t) in follow_ups.into_iter().enumerate() {
        t.to_document().map_err(|e| format!("follow-up {i} (for {:?}) cannot be enqueued: {e}", t.agent_name))?;
    }
    Ok(())
}
