//! The chaos run's grouped agent: every worker process also runs an agent
//! named [`GROUPED`] with `group_concurrency(1)` on a queue of its own
//! ([`QUEUE`]), two `Agent::process` loops sharing it (so a process could run
//! two tasks of one group at once, were the cap not kept). The driver feeds
//! it tasks in [`GROUPS`] groups as the run goes (`gseed` lines in its log),
//! and the checker verifies, from the logs, that within each group every run
//! of a task came after every run of the tasks enqueued before it: one at a
//! time, in enqueue order, through kills, pauses and server restarts.
//!
//! Not `Agent::work`, for the reason the limited agent gives (`limited.rs`):
//! `process` sweeps the group slots when it finds nothing, at most once per
//! poll interval, and lets a group's next task through when it ends one.
//!
//! Log lines (server clock, epoch ms):
//! - `gseed <task>` (the driver's): a task was enqueued;
//! - `grun <task> <group> <seq> <fence> <now>`: the handler read the server's
//!   time `now`, and then found its claim not lost: at `now` the task was
//!   claimed, so let through, and not ended.
//!
//! With a cap of 1, task `k` of a group is let through only once every task
//! numbered before it has ended; a confirmed run of `k` at `t` and one of an
//! earlier task at `t'` so need `t' < t`. The check: for each group in number
//! order, the first confirmation of each task is after the last of every
//! task before it (strictly: a tie is no proof).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use bson::doc;
use mongoagent::{fields, Agent, NewTask, Outcome, Queue, Task};
use store_mongo::MongoStore;
use store_trait::Store;
use tokio::time::Instant;

use super::log::Log;
use crate::error::LabError;

/// The grouped agent's name.
pub(super) const GROUPED: &str = "chaos-grouped";
/// Its queue.
pub(super) const QUEUE: &str = "chaos_grouped";
/// How many groups the driver spreads its tasks over.
pub(super) const GROUPS: u32 = 3;

/// Runs the grouped agent of one worker process (two loops) until the
/// process is killed.
pub(super) async fn agent_loop(store: MongoStore, log: Log, ttl: Duration) -> Result<(), LabError> {
    let agent = Agent::builder(store.clone(), GROUPED, QUEUE)
        .ttl(ttl)
        .group_concurrency(1)
        .max_attempts(50)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .poll_interval(Duration::from_secs(1))
        .build()?;
    let handler = move |task: Task| {
        let (store, log) = (store.clone(), log.clone());
        async move {
            let (id, fence) = (task.id().to_string(), task.fence());
            let group = task.data().get_str(fields::GROUP_KEY).unwrap_or("?").to_owned();
            let seq = task.data().get_i64(fields::GROUP_SEQ).unwrap_or(-1);
            let until = Instant::now() + Duration::from_millis(fastrand::u64(100..500));
            loop {
                let now = store.now().await;
                // After the read: at `now` the claim was still held.
                if task.validity().is_lost() {
                    return Outcome::failed("the claim was lost");
                }
                if let Ok(now) = now {
                    log.line(format!("grun {id} {group} {seq} {fence} {}", now.as_millis()));
                }
                if Instant::now() >= until {
                    return Outcome::done();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    super::side::two_loops(agent, handler, 500..1500).await;
    Ok(())
}

/// Enqueues one task in a random group, logging `gseed` in the driver's log.
pub(super) async fn feed(store: &MongoStore, driver: &Log, rng: &mut fastrand::Rng) {
    let Ok(queue) = Queue::new(store.clone(), QUEUE) else { return };
    let group = format!("g{}", rng.u32(..GROUPS));
    let t = NewTask::new(GROUPED, doc! {}).group(group);
    // A failed enqueue (the server away) is no task: nothing to check.
    if let Ok((id, true)) = queue.enqueue(t).await {
        driver.line(format!("gseed {id}"));
    }
}

/// The grouped agent's runs, from the logs.
#[derive(Debug, Default)]
pub(super) struct Runs {
    /// group -> seq -> (task, first and last confirmation over its runs).
    groups: HashMap<String, BTreeMap<i64, (String, i64, i64)>>,
    /// Tasks the driver enqueued.
    pub(super) seeded: HashSet<String>,
}

/// What the check found.
#[derive(Debug, Default)]
pub(super) struct Report {
    /// Tasks with at least one confirmed run.
    pub(super) tasks_run: usize,
    /// Groups with a confirmed run.
    pub(super) groups: usize,
}

impl Runs {
    /// Takes a `grun` or `gseed` line (split on whitespace); others are ignored.
    pub(super) fn line(&mut self, f: &[&str]) {
        match f {
            ["gseed", task, ..] => {
                self.seeded.insert((*task).to_owned());
            }
            ["grun", task, group, seq, _fence, now, ..] => {
                let (Ok(seq), Ok(now)) = (seq.parse::<i64>(), now.parse::<i64>()) else { return };
                let e = self.groups.entry((*group).to_owned()).or_default().entry(seq).or_insert((
                    (*task).to_owned(),
                    now,
                    now,
                ));
                e.1 = e.1.min(now);
                e.2 = e.2.max(now);
            }
            _ => {}
        }
    }

    /// Within each group, in number order, each task's first confirmation
    /// after the last of every task before it.
    pub(super) fn check(&self, violations: &mut Vec<String>) -> Report {
        let mut found = 0;
        for (group, tasks) in &self.groups {
            let mut before: Option<(&str, i64, i64)> = None;
            for (seq, (task, first, last)) in tasks {
                if let Some((earlier, eseq, elast)) = before {
                    if elast >= *first {
                        found += 1;
                        if found <= 5 {
                            violations.push(format!(
                                "group {group}: task {task} (number {seq}) ran at {first}, but task {earlier} (number {eseq}, enqueued before it) still ran at {elast}"
                            ));
                        }
                    }
                }
                if before.is_none_or(|(_, _, l)| *last > l) {
                    before = Some((task, *seq, *last));
                }
            }
        }
        if found > 5 {
            violations.push(format!("… and {} more grouped runs out of turn", found - 5));
        }
        Report { tasks_run: self.groups.values().map(BTreeMap::len).sum(), groups: self.groups.len() }
    }
}

/// The grouped agent's tasks in the store (`side::check_store`).
pub(super) async fn check_store(
    store: &MongoStore,
    seeded: &std::collections::HashSet<String>,
    violations: &mut Vec<String>,
) -> Result<usize, LabError> {
    super::side::check_store(store, QUEUE, "grouped", seeded, violations).await
}
