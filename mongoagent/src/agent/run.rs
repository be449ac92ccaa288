//! Running the handler on a claimed task: the task as the handler sees it, a
//! panic turned into a failure, and the dispatch to the outcome (or, for a task
//! a crashed agent left mid-way through a fan-in step, to that step).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use mongolock::{LockError, LockGuard};
use store_trait::{Key, Mutation, Record, Store};
use tracing::Instrument;

use super::claim::Claimed;
use super::finish::TimeoutMark;
use super::processed::Processed;
use super::Agent;
use crate::error::AgentError;
use crate::outcome::Outcome;
use crate::schema::pending::Finish;
use crate::schema::{fields, pending, task_round, timed_out};
use crate::task::Task;

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

impl<S: Store + Clone> Agent<S> {
    /// Runs the handler on a claimed task and records the outcome. A claimed task
    /// that already has an outcome (with follow-ups perhaps still pending), or
    /// that waits for its follow-ups, was left by a crashed agent in the middle
    /// of a step: that step is finished instead.
    pub(super) async fn run(&self, c: Claimed<S>, handler: Arc<dyn Handler>) -> Result<Processed, AgentError> {
        let Claimed { guard, record, permit, trace } = c;
        let cancel = super::limits::task_cancellation(&guard, permit.as_ref());
        let (group, fence) = (super::groups::group_of(record.data()), guard.fence());
        // The run continues its producer's trace; its handler runs inside it.
        let span = crate::trace::run_span(&self.inner.name, &record, &trace);
        let stored = crate::trace::stored(&record);
        let run = crate::trace::carry(stored, self.run_claimed(guard, record, cancel, handler));
        let processed = run.instrument(span.clone()).await;
        if let Ok(p) = &processed {
            span.record("outcome", p.label());
        }
        if let (Ok(p), Some(g)) = (&processed, &self.inner.groups) {
            g.after_grouped(group, fence, p).await;
        }
        if let Ok(Processed::Abandoned(_)) = &processed {
            // Its claim is left to lapse, work of the handler perhaps still
            // running: so is its permit, which counts that work until then.
            if let Some(p) = permit {
                p.abandon();
            }
            return processed;
        }
        // The task has ended (its outcome written, or its claim given up):
        // its permit of the global concurrency goes back.
        self.inner.claimer.give_back(permit, self.inner.shutdown.is_cancelled()).await;
        processed
    }

    async fn run_claimed(
        &self,
        guard: LockGuard<S>,
        record: Record,
        cancel: tokio_util::sync::CancellationToken,
        handler: Arc<dyn Handler>,
    ) -> Result<Processed, AgentError> {
        let key = record.key().clone();
        let data = record.data();
        if let Some(fence) = record.get_i64(pending::PARENT_FENCE) {
            // The outcome was written; its follow-ups may still be pending. Only
            // an earlier claim of this task writes the mark, so it is below this
            // claim's fence; any other was written past the queue (which refuses
            // the field in user data), and is not taken as an outcome.
            let Some(fence) = u64::try_from(fence).ok().filter(|f| (1..record.fence()).contains(f)) else {
                let why = format!("its {} mark was not written by a claim of it", pending::PARENT_FENCE);
                return self.inner.finisher.finish(guard, &record, Outcome::failed_permanently(why)).await;
            };
            self.inner.finisher.end_with_follow_ups(guard, &key, &record, fence, Finish::of(data)).await?;
            return self.recovered(Ok(record.clone()), key);
        }
        if data.get_bool(fields::COMPLETE).ok() == Some(true) {
            self.inner.finisher.notify_waiter(&record).await?;
            let released = guard.release_with(self.inner.finisher.close(Mutation::new(), data)).await;
            self.inner.finisher.collect_children(&key, &record).await;
            return self.recovered(released, key);
        }
        if let Some(round) = record.get_i64(fields::WAITING) {
            let released = self.inner.finisher.settle_wait(guard, &key, round).await;
            return self.recovered(released, key);
        }
        if let Some(error) = self.abandoned_last_attempt(&record) {
            // The previous claim timed out on the round's last attempt and
            // was abandoned: the task failed, and is not run again.
            let keep = TimeoutMark::Keep;
            return self.inner.finisher.finish_marked(guard, &record, Outcome::failed_permanently(error), keep).await;
        }
        let round = task_round(&record);
        let timeout = crate::task::timeout_of(&record, self.inner.timeout);
        let timed_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = cancel.clone();
        // Follow-ups exist only after a join: a first run reads none (a query per
        // task that always came back empty).
        let children = if round > 0 { self.inner.finisher.children(&key, round - 1).await? } else { Vec::new() };
        let task = Task {
            key: key.clone(),
            data: data.clone(),
            fence: record.fence(),
            attempt: crate::task::attempt(&record),
            cancel,
            timed_out: timed_out.clone(),
            timeout,
            validity: guard.validity(),
            round: u64::try_from(round).unwrap_or(0),
            children,
            writes: crate::task::TaskWrites {
                store: Arc::new(self.inner.store.clone()),
                coll: self.inner.queue.coll.clone(),
            },
        };
        // A start under the agent name's rate limit, if any: it may wait.
        if !self.inner.claimer.limits.rate_start(&self.inner.shutdown).await? {
            // The agent stops: the task never started; its claim goes back,
            // not counted as an attempt.
            guard.release_with(crate::task::not_started(&record)).await?;
            return Ok(Processed::NotStarted(key));
        }
        // The handler runs on its own task: a panic is a failure, not a crash. If
        // this future is dropped (drain timeout), the handler is aborted with it.
        let started = tokio::time::Instant::now();
        let mut handle = AbortOnDrop(tokio::spawn(crate::trace::carried(handler.handle(task)).in_current_span()));
        let validity = guard.validity();
        let timeout_at = async {
            match timeout {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        // A handler whose claim was lost is told by its cancellation. If its
        // task was cancelled or deleted, one that goes on past the lease's
        // local deadline is aborted there: past it, its group's next task may
        // begin. A claim lost otherwise (lapsed, taken over) runs on, its
        // outcome fenced out, as a paused process's would.
        let outlived = async {
            stop.cancelled().await;
            if !self.ended_under(&key).await {
                std::future::pending::<()>().await;
            }
            validity.lapsed().await;
        };
        let joined = tokio::select! {
            biased;
            joined = &mut handle.0 => joined,
            () = timeout_at => {
                let limit = timeout.unwrap_or_default();
                return self.timed_out(guard, &record, handle, (stop, &timed_out), limit).await;
            }
            () = outlived => return self.outlived(guard, &record, handle).await,
        };
        let outcome = match joined {
            Ok(o) => o,
            Err(e) => Outcome::failed(format!("the handler panicked: {e}")),
        };
        self.inner.run_times.record(started.elapsed());
        self.bump(|l| l.tasks_processed += 1);
        if matches!(outcome, Outcome::Fail { .. }) {
            self.bump(|l| l.failed_tasks += 1);
        }
        self.inner.finisher.finish(guard, &record, outcome).await
    }

    /// An attempt whose timeout passed: its cancellation fires; a handler that
    /// ends within the grace has its attempt failed ("timed out after …",
    /// retried by the usual policy, whatever it returned); one that does not
    /// is aborted and its claim abandoned, to lapse at its lease's end.
    async fn timed_out(
        &self,
        guard: LockGuard<S>,
        record: &Record,
        mut handle: AbortOnDrop<Outcome>,
        (cancel, flag): (tokio_util::sync::CancellationToken, &std::sync::atomic::AtomicBool),
        limit: std::time::Duration,
    ) -> Result<Processed, AgentError> {
        let (inner, key) = (&self.inner, record.key().clone());
        let grace = inner.timeout_grace;
        tracing::warn!(agent = %inner.name, task = %key, fence = guard.fence(), ?limit, ?grace, "task timed out: its cancellation fired");
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        cancel.cancel();
        self.bump(|l| l.tasks_processed += 1);
        // The attempt failed, whether its handler stops in time or not.
        self.bump(|l| l.failed_tasks += 1);
        let error = timed_out::error(limit);
        let validity = guard.validity();
        let stopped = tokio::select! {
            biased;
            joined = tokio::time::timeout(grace, &mut handle.0) => joined.is_ok(),
            // The claim lost in the grace (cancelled, deleted, taken over): its
            // lease's end is the grace's too, for a run that failed anyway.
            () = validity.lapsed() => false,
        };
        if stopped {
            crate::metrics::timed_out(&inner.queue.coll, &inner.name, "stopped");
            return self
                .inner
                .finisher
                .finish_marked(guard, record, Outcome::failed(error), TimeoutMark::This(limit))
                .await;
        }
        crate::metrics::timed_out(&inner.queue.coll, &inner.name, "abandoned");
        handle.abort_and_wait().await;
        tracing::warn!(
            agent = %inner.name, task = %key, fence = guard.fence(), ?grace,
            "the timed-out handler ignored its cancellation: aborted, its claim left to lapse"
        );
        // Told under the claim, which it keeps (its lease is not
        // touched): the next claim is the next attempt, or, with none
        // left, fails the task for good saying why. Not written (the
        // claim lost meanwhile): the next claim runs as after a crash.
        let attempt = crate::task::attempt(record);
        let mark = timed_out::mark(Mutation::new().set(fields::LAST_ERROR, error), guard.fence(), attempt, limit);
        if let Err(e) = guard.write(mark).await {
            tracing::debug!(agent = %inner.name, task = %key, error = %e, "the timed-out attempt was not recorded");
        }
        guard.abandon();
        let done = Processed::Abandoned(key);
        crate::metrics::outcome(&inner.queue.coll, &inner.name, done.label());
        Ok(done)
    }

    /// Whether the task `key` was cancelled or deleted, read until a read
    /// answers: an agent cut off from the server runs on, as a paused one
    /// would, and learns it once it can.
    async fn ended_under(&self, key: &Key) -> bool {
        loop {
            match self.inner.store.get(&self.inner.queue.coll, key).await {
                Ok(got) => return got.record.is_none_or(|r| r.get_bool(fields::CANCELLED) == Some(true)),
                Err(e) => {
                    tracing::debug!(agent = %self.inner.name, task = %key, error = %e, "reading a task whose claim was lost failed; again");
                    tokio::time::sleep(self.inner.poll_interval.min(std::time::Duration::from_secs(1))).await;
                }
            }
        }
    }

    /// A handler that went on past its cancelled or deleted task's lease: aborted. Its
    /// outcome write, a failure, is made only if the claim is held after all
    /// (it lapsed locally only: a host suspend, say); else it is stale.
    async fn outlived(
        &self,
        guard: LockGuard<S>,
        record: &Record,
        handle: AbortOnDrop<Outcome>,
    ) -> Result<Processed, AgentError> {
        handle.abort_and_wait().await;
        tracing::warn!(
            agent = %self.inner.name, task = %record.key(), fence = guard.fence(),
            "the handler went on past its lost claim's lease: aborted"
        );
        self.bump(|l| l.tasks_processed += 1);
        let why = "its claim was lost, and its handler, still running at the lease's end, was aborted";
        self.inner.finisher.finish(guard, record, Outcome::failed(why)).await
    }

    /// The error to fail `record`'s task with for good, without a run, when
    /// the claim before this one timed out and was abandoned on the round's
    /// last attempt (`timed_out`): then no attempt is left. (An attempt
    /// whose handler stopped in time carries the mark too, but its outcome
    /// write retried it only with an attempt left, so the claim after it is
    /// within the limit.)
    fn abandoned_last_attempt(&self, record: &Record) -> Option<String> {
        let attempt = crate::task::attempt(record);
        let marked = record.get_i64(fields::TIMED_OUT_FENCE).and_then(|f| u64::try_from(f).ok());
        if attempt <= self.inner.finisher.attempt_limit(record) || marked != Some(record.fence().saturating_sub(1)) {
            return None;
        }
        Some(record.get_str(fields::LAST_ERROR).unwrap_or("timed out").to_owned())
    }

    pub(super) fn recovered(&self, released: Result<Record, LockError>, key: Key) -> Result<Processed, AgentError> {
        match released {
            Ok(_) | Err(LockError::Lost { .. }) => {
                self.bump(|l| l.recovered += 1);
                tracing::info!(agent = %self.inner.name, task = %key, "finished a crashed agent's fan-in step");
                let done = Processed::Recovered(key);
                crate::metrics::outcome(&self.inner.queue.coll, &self.inner.name, done.label());
                Ok(done)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    /// Aborts the task and waits, for a moment at most, until its future
    /// is dropped: what its drop does (a guard's release, a log line)
    /// happens before what the caller does next. A handler blocked in
    /// synchronous code is never dropped: the wait gives up.
    async fn abort_and_wait(mut self) {
        self.0.abort();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), &mut self.0).await;
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
