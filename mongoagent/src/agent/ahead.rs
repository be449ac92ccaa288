//! Claims ahead of free slots (prefetch): a busy agent whose tasks are short
//! claims up to [`AgentBuilder::prefetch`](super::AgentBuilder::prefetch)
//! tasks more than it has free slots, and starts them as slots free, without
//! a claim each time.
//!
//! Why: a claim costs the same commands for one task as for a batch (one
//! `update` and its read back on MongoDB, [`Store::claim_many`](store_trait::Store::claim_many)),
//! and an agent whose tasks end a few at a time claims a few at a time. Claimed
//! ahead, the next tasks start the moment a slot frees, and each claim takes
//! up to `prefetch` more (by default twice the agent's concurrency: three
//! times the batch).
//!
//! When: only while claiming ahead delays no task by more than a short run.
//! - the agent's handler runs are short (a moving average below
//!   [`SHORT_RUN`]; unknown before the first run ends): a task claimed ahead
//!   waits for one of them, where an idle peer would have had to claim it,
//!   which costs about as long;
//! - its last claim got every task it asked for, by key from a list of
//!   candidates whose read filled its window (a backlog: more tasks are
//!   ready than the window holds, at least 64; with fewer, at the end of a
//!   burst or under light load, nothing is claimed ahead, so idle peers
//!   share the last tasks);
//! - its name has no rate limit (a task claimed ahead would wait for its
//!   start under a lease). A global concurrency that binds stops it through
//!   the rule above: a claim asks for no more tasks than the permits it
//!   got, so it comes back short of what the agent asked (a task claimed
//!   ahead holds its permit while it waits, which another process may be
//!   waiting for); one that does not bind does not stop it.
//!
//! Architecture Invariant: a task claimed ahead is claimed like any other,
//! fenced and under a lease the agent's `Leases` keep. It starts only while
//! its claim is held (one whose lease was lost is let go unstarted). It runs
//! in the drain of an agent stopped by `shutdown` as its slot frees. It is
//! given back unstarted, in one batch (`work.rs`, `give_back`; not counted
//! as an attempt: `task::not_started`), when
//! `process_while` stops the agent (so it runs no task past what it was
//! asked for) and when the drain times out. A crash leaves it to lapse like
//! any claim.

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use store_trait::Store;

use super::claim::Claimed;

/// Handler runs at or above this, on a moving average, turn claiming ahead
/// off.
pub(super) const SHORT_RUN: Duration = Duration::from_millis(100);

/// The most tasks an agent claims ahead of its free slots.
pub(crate) const MAX_PREFETCH: usize = 1000;

/// A moving average of an agent's handler run times.
#[derive(Debug, Default)]
pub(super) struct RunTimes(Mutex<Option<Duration>>);

impl RunTimes {
    /// Records one handler run.
    pub(super) fn record(&self, took: Duration) {
        let mut avg = self.0.lock();
        *avg = Some(match *avg {
            // An eighth of the new run: a few long runs turn claiming ahead off.
            Some(a) => a.saturating_mul(7).saturating_add(took) / 8,
            None => took,
        });
    }

    /// Whether runs are short: known, and below [`SHORT_RUN`].
    pub(super) fn short(&self) -> bool {
        self.0.lock().is_some_and(|a| a < SHORT_RUN)
    }
}

/// The tasks an agent claimed ahead, in claim order, and whether its last
/// claim got all it asked for from a backlog.
pub(super) struct Ahead<S: Store + Clone> {
    tasks: VecDeque<Claimed<S>>,
    last_full: bool,
}

impl<S: Store + Clone> Ahead<S> {
    pub(super) fn new() -> Self {
        Ahead { tasks: VecDeque::new(), last_full: false }
    }

    /// How many tasks the next claim asks for beyond `free` slots: `prefetch`
    /// when nothing is claimed ahead now and claiming ahead delays no task by
    /// more than a short run (the module's rules), else none.
    pub(super) fn room(&self, prefetch: usize, short_runs: bool, limit_stops: bool) -> usize {
        if prefetch > 0 && self.tasks.is_empty() && self.last_full && short_runs && !limit_stops {
            prefetch
        } else {
            0
        }
    }

    /// Records a claim that asked for `asked` tasks and got `got`, from a
    /// backlog or not (`Claims::backlog`), and keeps those past the first
    /// `free`; returns the ones to start now.
    pub(super) fn claimed(
        &mut self,
        asked: usize,
        free: usize,
        mut got: Vec<Claimed<S>>,
        backlog: bool,
    ) -> Vec<Claimed<S>> {
        self.last_full = backlog && asked > 0 && got.len() >= asked;
        let later = got.split_off(free.min(got.len()));
        if !later.is_empty() {
            tracing::debug!(ahead = later.len(), "tasks claimed ahead of free slots");
        }
        self.tasks.extend(later);
        got
    }

    /// Up to `free` tasks claimed ahead whose claims are still held, in claim
    /// order; those whose claim was lost are let go unstarted.
    pub(super) fn start(&mut self, free: usize) -> Vec<Claimed<S>> {
        let mut out = Vec::with_capacity(free.min(self.tasks.len()));
        while out.len() < free {
            let Some(c) = self.tasks.pop_front() else { break };
            if c.guard.is_lost() {
                tracing::warn!(task = %c.record.key(), "a task claimed ahead lost its claim before it started: let go");
                continue;
            }
            out.push(c);
        }
        out
    }

    /// Every task claimed ahead, to give back.
    pub(super) fn take_all(&mut self) -> Vec<Claimed<S>> {
        self.tasks.drain(..).collect()
    }

    /// Whether no task is claimed ahead.
    pub(super) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// How many tasks are claimed ahead.
    pub(super) fn len(&self) -> usize {
        self.tasks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moving_average_of_run_times() {
        let t = RunTimes::default();
        assert!(!t.short(), "unknown before the first run");
        t.record(Duration::from_millis(5));
        assert!(t.short());
        // One long run in a row of short ones does not turn it off; a few do.
        t.record(Duration::from_millis(500));
        assert!(t.short());
        for _ in 0..3 {
            t.record(Duration::from_millis(500));
        }
        assert!(!t.short());
    }

    #[test]
    fn room_only_after_a_full_claim_with_short_runs_and_no_limit() {
        let mut a: Ahead<store_memory::MemoryStore> = Ahead::new();
        assert_eq!(a.room(4, true, false), 0, "no claim yet");
        assert!(a.claimed(4, 4, Vec::new(), true).is_empty());
        assert_eq!(a.room(4, true, false), 0, "the last claim got none of four");
        a.last_full = true;
        assert_eq!(a.room(4, true, false), 4);
        assert_eq!(a.room(0, true, false), 0, "prefetch off");
        assert_eq!(a.room(4, false, false), 0, "long runs");
        assert_eq!(a.room(4, true, true), 0, "a cluster-wide limit that stops it");
    }
}
