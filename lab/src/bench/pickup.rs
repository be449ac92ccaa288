//! Idle pickup: how long a task waits for an idle agent, from the enqueue
//! call to its handler's start; and how long its producer waits for its
//! result (`Queue::wait_for`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::doc;
use mongoagent::{Agent, NewTask, Outcome, Queue, Task};
use parking_lot::Mutex;
use store_mongo::MongoStore;

use super::figures::Figures;
use super::stats::{pct, sorted};
use crate::error::LabError;

/// Idle pickup: one agent idle on a quiet queue of its own (not one the
/// throughput runs filled: on SecantusDB each write costs in proportion to
/// its collection's size), `picks` tasks enqueued 300 ms apart; the time
/// from each enqueue call to its handler's start, and to the end seen by
/// `Queue::wait_for` (`wait_for_ms_p50`).
pub(super) async fn put_figures(f: &mut Figures, store: &MongoStore, picks: usize) -> Result<(), LabError> {
    let queue = Queue::new(store.clone(), "bench_pickup")?;
    eprintln!("idle pickup latency ({picks} trials)…");
    let picked = Arc::new(Mutex::new(Vec::new()));
    let agent =
        Agent::builder(store.clone(), "pickup", "bench_pickup").poll_interval(Duration::from_secs(5)).build()?;
    let p2 = picked.clone();
    let epoch = Instant::now();
    let worker = tokio::spawn({
        let agent = agent.clone();
        async move {
            agent
                .work(move |t: Task| {
                    let p2 = p2.clone();
                    async move {
                        let sent = t.data().get_i64("sent_us").unwrap_or_default();
                        let now = i64::try_from(epoch.elapsed().as_micros()).unwrap_or_default();
                        p2.lock().push((now - sent) as f64 / 1e3);
                        Outcome::done()
                    }
                })
                .await
        }
    });
    let mut waited = Vec::with_capacity(picks);
    for _ in 0..picks {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let sent = i64::try_from(epoch.elapsed().as_micros()).unwrap_or_default();
        let t0 = Instant::now();
        let (id, _) = queue.enqueue(NewTask::new("pickup", doc! {"sent_us": sent})).await?;
        // The producer's side: from the enqueue call to its result seen.
        let limit = Duration::from_secs(30);
        tokio::time::timeout(limit, queue.wait_for(&id))
            .await
            .map_err(|_| LabError::timed_out("a task waited for did not end", limit))??;
        waited.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let until = Instant::now() + Duration::from_secs(30);
    while picked.lock().len() < picks && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent.shutdown();
    let stop_limit = Duration::from_secs(60);
    if tokio::time::timeout(stop_limit, worker).await.is_err() {
        return Err(LabError::timed_out("the pickup benchmark's agent did not stop", stop_limit));
    }
    let pk = sorted(picked.lock().clone());
    f.put("pickup_ms_p50", pct(&pk, 0.5));
    f.put("pickup_ms_p99", pct(&pk, 0.99));
    f.put("wait_for_ms_p50", pct(&sorted(waited), 0.5));
    Ok(())
}
