//! The chaos run's worker processes: `lab chaos-worker`, which contends for
//! the lock (with fenced writes), campaigns for leadership and runs agents
//! until killed, and `lab ledger-writer`, the grandchild of a forking
//! `mongocoord lock` runner. Their log lines are listed in the module's docs.

use std::path::Path;
use std::time::Duration;

use bson::doc;
use mongoagent::{fields, Agent, NewTask, Outcome, Processed, Task};
use mongoelector::Elector;
use mongolock::{Acquire, Lock};
use store_trait::{Collection, Condition, Key, Mutation, Store, Write, WriteOutcome};
use tokio::time::Instant;

use super::log::Log;
use super::names::{ELECTION, FORK_LEDGER, LEDGER, LOCK, QUEUE};
use super::retrying::connect_retrying;
use super::{grouped, limited};
use crate::error::LabError;

/// Opens a worker's log, for appending.
fn open_log(path: &Path) -> Result<Log, LabError> {
    Log::open(path).map_err(|e| LabError::io(format!("cannot open the log {}", path.display()), e))
}

/// One worker process: contends for the lock (with fenced writes), campaigns for
/// leadership, and runs an agent, until killed.
pub(crate) async fn worker(uri: &str, db: &str, log_path: &Path) -> Result<u8, LabError> {
    let log = open_log(log_path)?;
    let store = connect_retrying(uri, db).await;
    let ttl = Duration::from_secs(2);

    let lock_loop = {
        let (store, log) = (store.clone(), log.clone());
        async move {
            let ledger = Collection::new(LEDGER)?;
            let lock = Lock::builder(store.clone(), LOCK).ttl(ttl).build()?;
            // Half the workers write as careless code does: without asking
            // whether the lock is still theirs, right after a pause past their
            // lease, and even after letting go. Only the fence on the ledger
            // stops those writes, so the run shows stale writes rejected by it.
            let careless = fastrand::bool();
            loop {
                let Ok(guard) = lock.acquire_with(Acquire::new().timeout(Duration::from_secs(10)).auto_renew()).await
                else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let fence = guard.fence();
                log.line(format!("acq {fence} {}", guard.since().as_millis()));
                let hold_until = Instant::now() + Duration::from_millis(fastrand::u64(50..600));
                let ledger_key = Key::new("ledger")?;
                // A write only a holder with the newest fence may make.
                let write = || async {
                    let t = i64::try_from(fence).unwrap_or(i64::MAX);
                    let w = Write::new(
                        Condition::AtMost("last_fence".into(), t),
                        Mutation::new().set("last_fence", t).inc("writes", 1),
                    )
                    .upsert();
                    match store.write(&ledger, &ledger_key, &w).await {
                        Ok(WriteOutcome::Applied(r)) => log.line(format!("write {fence} {} ok", r.rev())),
                        Ok(WriteOutcome::Rejected(r)) => {
                            log.line(format!("write {fence} {} rejected", r.map_or(0, |r| r.rev())))
                        }
                        Err(_) => {}
                    }
                };
                while Instant::now() < hold_until && (careless || !guard.is_lost()) {
                    write().await;
                    if let Ok(now) = store.now().await {
                        if !guard.is_lost() {
                            log.line(format!("hold {fence} {}", now.as_millis()));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if careless {
                    // Once more after the hold, however long a pause took,
                    // without a look at the lease.
                    write().await;
                }
                let _ = guard.release().await;
                if careless {
                    // And once after letting go, as code that writes after its
                    // unlock does: a newer holder's write in between makes the
                    // fence reject it.
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..300))).await;
                    write().await;
                }
            }
            #[allow(unreachable_code)]
            Ok::<(), LabError>(())
        }
    };

    let elect_loop = {
        let (store, log) = (store.clone(), log.clone());
        async move {
            let elector = Elector::builder(store.clone(), ELECTION).ttl(ttl).build()?;
            elector.start()?;
            let probe = Lock::builder(store.clone(), ELECTION).collection(mongoelector::DEFAULT_COLLECTION).build()?;
            let mut last_term = 0;
            loop {
                if let Some(term) = elector.node_status().fence {
                    if term != last_term {
                        if let Ok(Some(info)) = probe.get_current().await {
                            if info.fence == term {
                                log.line(format!("term {term} {}", info.since.as_millis()));
                            }
                        }
                        last_term = term;
                    }
                    if let Ok(now) = store.now().await {
                        if elector.node_status().fence == Some(term) {
                            log.line(format!("lead {term} {}", now.as_millis()));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            #[allow(unreachable_code)]
            Ok::<(), LabError>(())
        }
    };

    let agent_loop = {
        let (store, log) = (store.clone(), log.clone());
        // About half the workers (each picks at random) run short tasks, so
        // their agents claim ahead of free slots (`mongoagent`'s `ahead.rs`:
        // runs under 100 ms on average) and are killed holding tasks claimed
        // ahead.
        let runs = if fastrand::bool() { 5..60 } else { 20..400 };
        async move {
            let agent = Agent::builder(store, "chaos", QUEUE)
                .ttl(ttl)
                .concurrency(2)
                .max_attempts(20)
                .backoff(Duration::from_millis(100), Duration::from_secs(1))
                .poll_interval(Duration::from_secs(1))
                .build()?;
            let joins = log.clone();
            let handler = move |task: Task| {
                let (joins, runs) = (joins.clone(), runs.clone());
                async move {
                    if task.round() > 0 {
                        let ended =
                            task.children().iter().filter(|c| c.data().get_bool(fields::COMPLETE).ok() == Some(true));
                        joins.line(format!("joined {} {} {}", task.id(), ended.count(), task.children().len()));
                    }
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(runs.clone()))).await;
                    if fastrand::u32(..10) == 0 {
                        return Outcome::failed("chaos");
                    }
                    // Odd seeded tasks wait for their follow-ups and run again (fan-in).
                    let fan_in = task.data().get_i64("i").is_ok_and(|i| i % 2 == 1);
                    match task.data().get_i32("stage") {
                        Ok(0) if task.round() == 0 => {
                            let o = Outcome::done()
                                .follow_up(NewTask::new("chaos", doc! {"stage": 1}))
                                .follow_up(NewTask::new("chaos", doc! {"stage": 1}));
                            if fan_in {
                                o.wait_for_follow_ups()
                            } else {
                                o
                            }
                        }
                        _ => Outcome::done(),
                    }
                }
            };
            loop {
                match agent.process(handler.clone()).await {
                    Ok(Some(Processed::Completed(k) | Processed::Failed(k))) => log.line(format!("done {k} 0")),
                    Ok(Some(Processed::Stale(k))) => log.line(format!("stale {k} 0")),
                    Ok(Some(_)) => {}
                    Ok(None) => tokio::time::sleep(Duration::from_millis(200)).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "chaos worker: processing a task failed");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            #[allow(unreachable_code)]
            Ok::<(), LabError>(())
        }
    };
    let limited_loop = limited::agent_loop(store.clone(), log.clone(), ttl);
    let grouped_loop = grouped::agent_loop(store.clone(), log.clone(), ttl);
    tokio::try_join!(lock_loop, elect_loop, agent_loop, limited_loop, grouped_loop)?;
    Ok(0)
}

/// A ledger writer: started by `sh` under a `mongocoord lock` runner, so it is
/// the runner's grandchild; it writes with the runner's fence until killed.
/// It never checks the lock itself: that it stops in time is the runner's job.
pub(crate) async fn ledger_writer(uri: &str, db: &str, log_path: &Path, fence: u64) -> Result<u8, LabError> {
    let log = open_log(log_path)?;
    let store = connect_retrying(uri, db).await;
    let ledger = Collection::new(FORK_LEDGER)?;
    let key = Key::new("ledger")?;
    let f = i64::try_from(fence).map_err(|e| LabError::invalid(format!("--fence {fence}: {e}")))?;
    loop {
        let w = Write::new(
            Condition::AtMost("last_fence".into(), f),
            Mutation::new().set("last_fence", f).inc("writes", 1),
        )
        .upsert();
        match store.write(&ledger, &key, &w).await {
            Ok(WriteOutcome::Applied(r)) => log.line(format!("fwrite {fence} {} ok", r.rev())),
            Ok(WriteOutcome::Rejected(r)) => log.line(format!("fwrite {fence} {} rejected", r.map_or(0, |r| r.rev()))),
            Err(_) => {}
        }
        if let Ok(now) = store.now().await {
            log.line(format!("fhold {fence} {}", now.as_millis()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
