//! The cluster-wide limits of an agent name, around the claim: permits of its
//! global concurrency (a [`Semaphore`] in the queue's control collection,
//! taken before a claim, given back when the task ends) and its rate limit
//! (one conditional write per start, `crate::rate`).
//!
//! Architecture Invariant (global concurrency): a task of a limited agent
//! name runs only under a permit of its name's semaphore, taken before its
//! claim and released after its outcome is written (or, while the limit does
//! not bind, handed to the agent's next claim, which comes at once, for at
//! most `PERMIT_REUSE` after its grant; what that claim does not use is
//! released). An agent that holds no
//! permit claims nothing. Permits are leases kept through the one lease seam
//! (`mongolock::unstable::Leases`, through the semaphore's lock), so a crashed process's
//! permits lapse with their lease, and a permit whose lease is lost cancels
//! its task (the handler's cancellation fires) before another process can take
//! it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mongolock::{ConfigError, Identity, Lock, LockGuard, Semaphore};
use store_trait::{Mutation, Store};
use tokio_util::sync::CancellationToken;

use super::commit::Committer;
use crate::error::AgentError;
use crate::queue::Queue;
use crate::rate::{RateGate, RateLimit};

/// How long a permit may pass from a task that ended to the agent's next
/// claim before it is released and taken afresh: agents waiting for a permit
/// get their turn at least this often. Long enough that a permit serves many
/// tasks while the limit does not bind (the measurement behind it:
/// docs/performance.md, "Constants and what chose them").
const PERMIT_REUSE: Duration = Duration::from_secs(10);

/// A permit of the global concurrency and when it was granted.
pub(super) struct Permit<S: Store + Clone> {
    pub(super) guard: LockGuard<S>,
    granted: tokio::time::Instant,
}

/// What limits an agent name across processes.
pub(super) struct Limits<S: Store + Clone> {
    permits: Option<Semaphore<S>>,
    /// Permits go back in batches, as outcomes do (permits of tasks ending
    /// together: one command).
    returns: std::sync::OnceLock<Committer<S>>,
    rate: Option<RateGate<S>>,
    /// Whether the last claim under permits found nothing: the next takes one
    /// permit only (an idle agent woken by a change probes with one, not with
    /// a batch it must give back).
    found_none: AtomicBool,
    /// Permits of tasks that just ended, kept for this agent's next claim
    /// (which follows at once in the work loop) instead of a release and a
    /// new grant: a limit that never binds costs no command per task. Only
    /// while the limit did not bind at the last acquisition, so busy agents
    /// do not keep permits from others.
    pool: parking_lot::Mutex<Vec<Permit<S>>>,
    /// Whether the last acquisition got fewer permits than it asked for.
    binding: AtomicBool,
    /// One start waits at a time per agent (the rest queue, in order).
    rate_turn: tokio::sync::Mutex<()>,
}

impl<S: Store + Clone> Limits<S> {
    /// Whether the agent name has a global concurrency limit: then a task
    /// ending anywhere may free a permit.
    pub(super) fn is_global(&self) -> bool {
        self.permits.is_some()
    }

    /// Whether a cluster-wide limit of the agent name stops claims ahead of
    /// free slots (`ahead.rs`): a rate limit does (a task claimed ahead would
    /// wait for a start under its lease). A global concurrency needs no rule
    /// here: a claim asks for no more tasks than the permits it got, so under
    /// a limit that binds it comes back short of what the agent asked, and a
    /// short claim stops claims ahead (`Ahead::claimed`).
    pub(super) fn stops_claims_ahead(&self) -> bool {
        self.rate.is_some()
    }

    /// Validates the limits: `global` permits, `rate` starts per interval.
    pub(super) fn new(
        store: &S,
        queue: &Queue<S>,
        name: &str,
        (ttl, identity): (Duration, &Identity),
        global: Option<u32>,
        rate: Option<(u32, Duration)>,
    ) -> Result<Self, AgentError> {
        let config = |e: mongolock::LockError| AgentError::Config(ConfigError::caused_by(e));
        let control = queue.control_collection()?;
        let permits = match global {
            None => None,
            Some(0) => return Err(AgentError::Config("global_concurrency must be at least 1".into())),
            Some(n) => {
                // Permits last as long as claims: each is renewed with its task's claim.
                let lock = Lock::builder(store.clone(), format!("permits:{name}"))
                    .collection(control.as_str())
                    .ttl(ttl)
                    .identity(identity.clone());
                Some(Semaphore::new(lock, n).map_err(config)?)
            }
        };
        let rate = match rate {
            None => None,
            Some((n, per)) => Some(RateGate::new(store.clone(), control, name, RateLimit::new(n, per)?)?),
        };
        Ok(Limits {
            permits,
            returns: std::sync::OnceLock::new(),
            rate,
            found_none: Default::default(),
            pool: Default::default(),
            binding: Default::default(),
            rate_turn: tokio::sync::Mutex::new(()),
        })
    }
}

impl<S: Store + Clone> Limits<S> {
    /// Up to `capacity` permits of the global concurrency, in one batch:
    /// those kept from tasks that just ended first, then new grants (one
    /// only after a claim that found nothing). `None` without a global
    /// concurrency (the claim is not limited); empty when none is free.
    pub(super) async fn acquire(&self, agent: &str, capacity: usize) -> Result<Option<Vec<Permit<S>>>, AgentError> {
        let Some(sem) = &self.permits else { return Ok(None) };
        // Kept permits serve a claim that comes at once: one kept past
        // `PERMIT_REUSE` (the agent was paused, or idle) goes back.
        let (mut permits, stale): (Vec<Permit<S>>, Vec<Permit<S>>) = {
            let mut pool = self.pool.lock();
            let n = pool.len().min(capacity);
            pool.drain(..n).filter(|p| !p.guard.is_lost()).partition(|p| p.granted.elapsed() < PERMIT_REUSE)
        };
        self.release(agent, stale).await;
        let want = if self.found_none.load(Ordering::Relaxed) { 1 } else { capacity };
        let want = want.saturating_sub(permits.len());
        if want > 0 {
            let granted = tokio::time::Instant::now();
            let got = sem.try_acquire_many(want).await?;
            self.binding.store(got.len() < want, Ordering::Relaxed);
            permits.extend(got.into_iter().map(|guard| Permit { guard, granted }));
        }
        Ok(Some(permits))
    }

    /// Notes what the claim under permits got: after one that found nothing,
    /// the next asks for a single permit.
    pub(super) fn claimed(&self, found: usize) {
        self.found_none.store(found == 0, Ordering::Relaxed);
    }

    /// Takes a start under the agent name's rate limit (at once without one),
    /// waiting while the limit is reached; one waiter per agent at a time, the
    /// others queue behind it in order. `Ok(false)` when `shutdown` fires first.
    pub(super) async fn rate_start(&self, shutdown: &CancellationToken) -> Result<bool, AgentError> {
        let Some(rate) = &self.rate else { return Ok(true) };
        let _turn = self.rate_turn.lock().await;
        rate.start(shutdown).await
    }

    /// Releases `permits` (one command for all of them).
    pub(super) async fn release(&self, agent: &str, permits: Vec<Permit<S>>) {
        if permits.is_empty() {
            return;
        }
        let released = LockGuard::release_many(permits.into_iter().map(|p| (p.guard, Mutation::new())).collect()).await;
        if let Some(Err(e)) = released.into_iter().find(Result::is_err) {
            tracing::debug!(agent, error = %e, "a permit was not released; it lapses");
        }
    }

    /// Releases the permits kept for a next claim that is not coming (the
    /// work loop ended, or `process` returned).
    pub(super) async fn release_pooled(&self, agent: &str) {
        let pooled = std::mem::take(&mut *self.pool.lock());
        self.release(agent, pooled).await;
    }

    /// Gives a task's permit back once its outcome is written: kept for the
    /// agent's next claim while the limit does not bind (and the agent is not
    /// `stopping`), else released, batched with the permits of tasks ending
    /// at the same time.
    pub(super) async fn give_back(&self, agent: &str, permit: Option<Permit<S>>, stopping: bool) {
        let Some(permit) = permit else { return };
        let keep = !self.binding.load(Ordering::Relaxed)
            && !stopping
            && !permit.guard.is_lost()
            && permit.granted.elapsed() < PERMIT_REUSE;
        if keep {
            self.pool.lock().push(permit);
            return;
        }
        let returns = self.returns.get_or_init(Committer::start);
        if let Err(e) = returns.release_with(permit.guard, Mutation::new()).await {
            tracing::debug!(agent, error = %e, "a permit was not released; it lapses");
        }
    }
}

impl<S: Store + Clone> Permit<S> {
    /// Leaves the permit of an abandoned task (`run.rs`, a handler that
    /// ignored its timeout) to lapse with the task's claim: work that handler
    /// left running still counts against the global concurrency until then.
    pub(super) fn abandon(self) {
        self.guard.abandon();
    }
}

/// The cancellation a task's handler sees: its claim's, and with a permit
/// also the permit's loss (another process could take the permit then).
pub(super) fn task_cancellation<S: Store + Clone>(
    guard: &LockGuard<S>,
    permit: Option<&Permit<S>>,
) -> CancellationToken {
    let cancel = guard.cancellation();
    if let Some(p) = permit {
        let (lost, task) = (p.guard.cancellation(), cancel.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = lost.cancelled() => task.cancel(),
                _ = task.cancelled() => {}
            }
        });
    }
    cancel
}
