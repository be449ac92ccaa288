//! The chaos run's pause/resume cycle: the driver feeds the limited agent
//! ([`LIMITED`]) a batch of tasks, lets it run a few seconds, pauses its name
//! (`Queue::set_paused`), feeds it another batch once the pause is due to be
//! seen, resumes it, and again, until the run ends (resumed). The checker
//! verifies the pause invariant from the logs:
//! no claim of the paused name began (its server stamp) later than the pause
//! plus [`CONTROL_REFRESH`] plus [`SLACK`] and before the resume, unless its
//! process was SIGSTOPped meanwhile (a process without CPU sees nothing).
//! Claims are seen through their runs' `lclaim` lines: one whose process was
//! killed before its handler started goes unchecked.
//!
//! Driver log lines (`driver.log`, server clock, epoch ms):
//! - `pause <now>`: read after the pause was acknowledged (so no earlier
//!   than it took effect: the check is looser for it, never wrong);
//! - `resume <now>`: read before the resume was sent;
//! - `wstop <worker> <now>`: read before the worker (its log's name) got
//!   SIGSTOP; `wcont <worker> <now>`: read after it got SIGCONT;
//! - `lseed <task>`: a limited task is in the queue (enqueue acknowledged).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use mongoagent::{NewTask, Queue, CONTROL_REFRESH};
use store_mongo::MongoStore;
use tokio::time::Instant;

use super::limited::{LIMITED, QUEUE};
use super::log::Log;
use super::retrying::now_retrying;
use crate::error::LabError;

/// Allowance beyond [`CONTROL_REFRESH`] for what lies between an agent's
/// read of the pause state and its claim's stamp (its permit's acquisition,
/// its turn at the queue's claim gate, the claim's send), and the spread of
/// the server's clock read over connections.
const SLACK: i64 = 1_000;

/// Limited tasks enqueued at once (twice a cycle).
const BATCH: usize = 8;

/// Feeds, pauses and resumes the limited agent until `end`, then resumes it
/// for good. Each cycle: a batch to run, 2-4 s, the pause; once the pause is
/// due to be seen (its allowance), another batch, which must wait for the
/// resume 1.5-3 s later (an agent that ignored the pause would claim it).
pub(super) async fn cycle(store: MongoStore, log: Log, seed: u64, end: Instant) -> Result<(), LabError> {
    let queue = Queue::new(store.clone(), QUEUE)?;
    let mut rng = fastrand::Rng::with_seed(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1));
    let mut next = 0;
    let until = |ms: u64| tokio::time::sleep_until(end.min(Instant::now() + Duration::from_millis(ms)));
    while Instant::now() < end {
        feed(&queue, &log, &mut next).await;
        until(rng.u64(2000..4000)).await;
        if Instant::now() >= end {
            break;
        }
        set_paused(&queue, true).await;
        log.line(format!("pause {}", now_retrying(&store).await));
        until(allowance() as u64 + 200).await;
        feed(&queue, &log, &mut next).await;
        until(rng.u64(1500..3000)).await;
        log.line(format!("resume {}", now_retrying(&store).await));
        set_paused(&queue, false).await;
    }
    Ok(())
}

/// How long after a pause a claim may still begin: [`CONTROL_REFRESH`] and [`SLACK`].
fn allowance() -> i64 {
    i64::try_from(CONTROL_REFRESH.as_millis()).unwrap_or(i64::MAX) + SLACK
}

/// Enqueues the next [`BATCH`] limited tasks (`lim-<k>`), retried until
/// acknowledged (idempotent: the ids), and logs them.
async fn feed(queue: &Queue<MongoStore>, log: &Log, next: &mut usize) {
    let batch: Vec<NewTask> = (*next..*next + BATCH)
        .map(|k| NewTask::new(LIMITED, bson::doc! { "l": k as i64 }).id(format!("lim-{k}")))
        .collect();
    while queue.enqueue_all(&batch).await.is_err() {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for t in *next..*next + BATCH {
        log.line(format!("lseed lim-{t}"));
    }
    *next += BATCH;
}

/// `Queue::set_paused`, retried until acknowledged (idempotent).
async fn set_paused(queue: &Queue<MongoStore>, paused: bool) {
    while queue.set_paused(LIMITED, paused).await.is_err() {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The pause history, from the logs.
#[derive(Debug, Default)]
pub(super) struct Pauses {
    /// Pause and resume times, in the driver's order.
    marks: Vec<(bool, i64)>,
    /// worker -> its SIGSTOP windows (`None`: never continued).
    stops: HashMap<String, Vec<(i64, Option<i64>)>>,
    /// (worker, task, claim stamp) of every limited run.
    claims: Vec<(String, String, i64)>,
    /// Limited tasks the driver enqueued.
    pub(super) seeded: HashSet<String>,
}

/// What the pause check found.
#[derive(Debug, Default)]
pub(super) struct PauseReport {
    pub(super) cycles: usize,
    /// Claims whose stamp fell in a pause, before the pause was due to be seen.
    pub(super) claims_in_grace: usize,
    /// Claims in a pause past the grace by a worker SIGSTOPped meanwhile.
    pub(super) claims_excused: usize,
    /// The latest claim of a pause, after the pause's time (ms), not excused.
    pub(super) latest_ms: i64,
    /// Runs without a claim stamp.
    pub(super) unstamped: usize,
    /// Claims past the allowance: violations.
    pub(super) late: usize,
}

impl Pauses {
    /// Takes a line of `source`'s log (its file stem), split on whitespace.
    pub(super) fn line(&mut self, source: &str, f: &[&str]) {
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<i64>().ok());
        match (f.first().copied(), num(1)) {
            (Some("pause"), Some(t)) => self.marks.push((true, t)),
            (Some("resume"), Some(t)) => self.marks.push((false, t)),
            (Some("wstop"), _) => {
                if let (Some(w), Some(t)) = (f.get(1), num(2)) {
                    self.stops.entry((*w).to_owned()).or_default().push((t, None));
                }
            }
            (Some("wcont"), _) => {
                if let (Some(w), Some(t)) = (f.get(1), num(2)) {
                    if let Some(open) = self.stops.get_mut(*w).and_then(|s| s.iter_mut().rev().find(|s| s.1.is_none()))
                    {
                        open.1 = Some(t);
                    }
                }
            }
            (Some("lseed"), _) => {
                if let Some(t) = f.get(1) {
                    self.seeded.insert((*t).to_owned());
                }
            }
            (Some("lclaim"), _) => {
                if let (Some(t), Some(at)) = (f.get(1), num(3)) {
                    self.claims.push((source.to_owned(), (*t).to_owned(), at));
                }
            }
            _ => {}
        }
    }

    /// No claim of the paused name began after the pause was due to be seen
    /// and before the resume, unless its process was stopped in between.
    pub(super) fn check(&self, violations: &mut Vec<String>) -> PauseReport {
        let mut r = PauseReport { latest_ms: -1, ..Default::default() };
        let mut windows = Vec::new();
        let mut paused_at = None;
        for (pause, t) in &self.marks {
            match (pause, paused_at) {
                (true, _) => paused_at = Some(*t),
                (false, Some(p)) => {
                    windows.push((p, *t));
                    paused_at = None;
                }
                (false, None) => {}
            }
        }
        if let Some(p) = paused_at {
            violations.push(format!("{LIMITED} was paused at {p} and never resumed"));
            windows.push((p, i64::MAX));
        }
        r.cycles = windows.len();
        let due = allowance();
        for (worker, task, at) in &self.claims {
            if *at < 0 {
                r.unstamped += 1;
                continue;
            }
            let Some((p, _)) = windows.iter().find(|(p, resume)| at >= p && at < resume) else { continue };
            let stopped = self
                .stops
                .get(worker)
                .is_some_and(|s| s.iter().any(|(from, to)| *from <= *at && to.is_none_or(|to| to >= *p)));
            if stopped {
                r.claims_excused += 1;
            } else if *at - p < due {
                r.claims_in_grace += 1;
                r.latest_ms = r.latest_ms.max(at - p);
            } else {
                r.latest_ms = r.latest_ms.max(at - p);
                r.late += 1;
                if r.late > 5 {
                    continue;
                }
                violations.push(format!(
                    "{worker} claimed {task} at {at}, {} ms after {LIMITED} was paused at {p} (allowed: {due} ms)",
                    at - p
                ));
            }
        }
        if r.late > 5 {
            violations.push(format!("… and {} more claims of paused {LIMITED} past the allowance", r.late - 5));
        }
        if self.claims.len() == r.unstamped && !self.claims.is_empty() {
            violations.push("no limited run had a claim stamp: the pause check checked nothing".into());
        }
        r
    }
}
