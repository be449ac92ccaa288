//! What the chaos run's side agents share (the globally limited agent,
//! `limited.rs`, and the grouped agent, `grouped.rs`): each worker process
//! runs one on a queue of its own with two `Agent::process` loops (so a
//! process could run two of its tasks at once, were its limit not kept), and
//! the checker finds every task the driver enqueued in the store, completed.

use std::collections::HashSet;
use std::ops::Range;
use std::time::Duration;

use mongoagent::{fields, Agent, Handler};
use store_mongo::MongoStore;
use store_trait::Store;

use crate::error::LabError;

/// Runs `agent` with `handler` in two `process` loops until the process is
/// killed; an empty or failed `process` (idle, paused, no permit, the
/// server away) sleeps a random time in `idle_ms` before the next.
pub(super) async fn two_loops<H: Handler + Clone>(agent: Agent<MongoStore>, handler: H, idle_ms: Range<u64>) {
    let one = |agent: Agent<MongoStore>| {
        let (handler, idle_ms) = (handler.clone(), idle_ms.clone());
        async move {
            loop {
                match agent.process(handler.clone()).await {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => {
                        tokio::time::sleep(Duration::from_millis(fastrand::u64(idle_ms.clone()))).await
                    }
                }
            }
        }
    };
    tokio::join!(one(agent.clone()), one(agent));
}

/// The tasks of side agent `what` in collection `queue`: every one the
/// driver enqueued (`seeded`) is there and completed, none failed for good
/// (their agents allow 50 attempts). Returns how many there are.
pub(super) async fn check_store(
    store: &MongoStore,
    queue: &str,
    what: &str,
    seeded: &HashSet<String>,
    violations: &mut Vec<String>,
) -> Result<usize, LabError> {
    let coll = store_trait::Collection::new(queue)?;
    let mut tasks = Vec::new();
    for t in store.find_each(&coll, &store_trait::Query::all()).await? {
        tasks.push(t.map_err(|e| LabError::from(e).context(format!("an unreadable {what} task")))?);
    }
    let present: HashSet<String> = tasks.iter().map(|t| t.key().to_string()).collect();
    if let Some(missing) = seeded.iter().find(|t| !present.contains(*t)) {
        violations.push(format!("{what} task {missing} was enqueued but is not in the store"));
    }
    let failed = tasks.iter().filter(|t| t.get_bool(fields::ERROR_ENCOUNTERED) == Some(true)).count();
    if failed > 0 {
        violations.push(format!("{failed} {what} task(s) failed for good (50 attempts)"));
    }
    let open = tasks.iter().filter(|t| t.get_bool(fields::COMPLETE) != Some(true)).count();
    if open > 0 {
        violations.push(format!("{open} {what} task(s) never finished"));
    }
    Ok(tasks.len())
}
