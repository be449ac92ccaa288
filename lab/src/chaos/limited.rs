//! The chaos run's globally limited agent: every worker process also runs an
//! agent named [`LIMITED`] with `global_concurrency(LIMIT)` on a queue of its
//! own ([`QUEUE`]), two `Agent::process` loops sharing it (so two runs at once
//! per process), and the checker verifies from the logs that no more than
//! [`LIMIT`] of its runs ever held a permit at once.
//!
//! Not `Agent::work`: an idle work loop holds change subscriptions, and
//! SecantusDB answers a waiting change-stream `getMore` at every write to
//! the server (its oplog is one for all databases); four idle limited agents
//! halved the rest of the run's throughput (13 pipeline tasks per 10 s
//! instead of 30, measured on a loaded machine). `process` polls (every two
//! seconds or so while idle) and reads the pause state on its timer
//! (`CONTROL_REFRESH`).
//!
//! Log lines (server clock, epoch ms):
//! - `lclaim <task> <fence> <started_at>`: a run began; `started_at` is the
//!   claim's own stamp (the server's time of the claim), read by the pause
//!   check (`pause.rs`);
//! - `lrun <task> <fence> <now>`: the handler read the server's time `now`,
//!   and then found its task not cancelled and its claim not lost. A lost
//!   permit cancels its task (`Task::cancellation`) before another process
//!   can take it, so at `now` the run held its permit — as `hold` lines are
//!   for the lock.
//!
//! A run's confirmations span `[first, last]`: it held its permit all along
//! (a permit once lost is never held again by the same run, and a permit
//! passed to the same agent's next claim passes only after the run ended). A
//! SIGKILLed run has no later line: its span ends at its last confirmation,
//! however long its lease lasted after. So more than [`LIMIT`] spans that
//! overlap (strictly: a tie is no proof) are more than `LIMIT` permits held
//! at once.

use std::collections::HashMap;
use std::time::Duration;

use mongoagent::{fields, Agent, Outcome, Task};
use store_mongo::MongoStore;
use store_trait::Store;
use tokio::time::Instant;

use super::log::Log;
use crate::error::LabError;

/// The limited agent's name.
pub(super) const LIMITED: &str = "chaos-limited";
/// Its global concurrency, across every worker process.
pub(super) const LIMIT: u32 = 2;
/// Its queue.
pub(super) const QUEUE: &str = "chaos_limited";

/// Runs the limited agent of one worker process (two loops, so the limit
/// binds across processes) until the process is killed.
pub(super) async fn agent_loop(store: MongoStore, log: Log, ttl: Duration) -> Result<(), LabError> {
    let agent = Agent::builder(store.clone(), LIMITED, QUEUE)
        .ttl(ttl)
        .global_concurrency(LIMIT)
        .max_attempts(50)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .poll_interval(Duration::from_secs(1))
        .build()?;
    let handler = move |task: Task| {
        let (store, log) = (store.clone(), log.clone());
        async move {
            let (id, fence) = (task.id().to_string(), task.fence());
            let claimed = task.data().get_datetime(fields::STARTED_AT).map_or(-1, |d| d.timestamp_millis());
            log.line(format!("lclaim {id} {fence} {claimed}"));
            let until = Instant::now() + Duration::from_millis(fastrand::u64(200..800));
            loop {
                let now = store.now().await;
                // After the read: at `now` the permit was still held.
                if task.cancellation().is_cancelled() || task.validity().is_lost() {
                    return Outcome::failed("the claim or its permit was lost");
                }
                if let Ok(now) = now {
                    log.line(format!("lrun {id} {fence} {}", now.as_millis()));
                }
                if Instant::now() >= until {
                    return Outcome::done();
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        }
    };
    // Idle, paused, no permit free, or the server away. An idle poll costs
    // about five commands (a permit taken and given back, the claim's two
    // queries): not often.
    super::side::two_loops(agent, handler, 1500..2500).await;
    Ok(())
}

/// The runs of the limited agent, from the logs.
#[derive(Debug, Default)]
pub(super) struct Runs {
    /// (task, fence) -> first and last confirmation.
    spans: HashMap<(String, u64), (i64, i64)>,
}

/// What the check found.
#[derive(Debug, Default)]
pub(super) struct Overlap {
    /// Runs with at least one confirmation.
    pub(super) runs: usize,
    /// The most runs that held a permit at one moment.
    pub(super) most: usize,
}

impl Runs {
    /// Takes an `lrun` line (split on whitespace); other lines are ignored.
    pub(super) fn line(&mut self, f: &[&str]) {
        let (Some(&"lrun"), Some(task), Some(fence), Some(now)) = (f.first(), f.get(1), f.get(2), f.get(3)) else {
            return;
        };
        let (Ok(fence), Ok(now)) = (fence.parse::<u64>(), now.parse::<i64>()) else { return };
        let e = self.spans.entry(((*task).to_owned(), fence)).or_insert((now, now));
        e.0 = e.0.min(now);
        e.1 = e.1.max(now);
    }

    /// No moment with more than [`LIMIT`] runs holding a permit. Spans
    /// overlap when each began strictly before the other ended; the largest
    /// set of pairwise overlapping spans is, for the span `i` that began last
    /// in it, `i` and the spans that began strictly before `i` began and
    /// ended strictly after.
    pub(super) fn check(&self, violations: &mut Vec<String>) -> Overlap {
        let spans: Vec<_> = self.spans.iter().collect();
        let (mut most, mut found) = (0, 0);
        for (run, (first, _)) in &spans {
            let during: Vec<String> = spans
                .iter()
                .filter(|(_, (f, l))| f < first && l > first)
                .map(|((t, fence), (f, l))| format!("{t} (fence {fence}, {f}..{l})"))
                .collect();
            let n = during.len() + 1;
            if n > LIMIT as usize {
                found += 1;
            }
            // The first few in full; the rest counted.
            if n > LIMIT as usize && found <= 5 {
                violations.push(format!(
                    "{n} runs of {LIMIT}-limited {LIMITED} at once: {} (fence {}) began at {first} while {}",
                    run.0,
                    run.1,
                    during.join(", ")
                ));
            }
            most = most.max(n);
        }
        if found > 5 {
            violations.push(format!("… and {} more runs of {LIMITED} began over its limit", found - 5));
        }
        Overlap { runs: spans.len(), most }
    }
}

/// The limited agent's tasks in the store (`side::check_store`).
pub(super) async fn check_store(
    store: &MongoStore,
    seeded: &std::collections::HashSet<String>,
    violations: &mut Vec<String>,
) -> Result<usize, LabError> {
    super::side::check_store(store, QUEUE, "limited", seeded, violations).await
}
