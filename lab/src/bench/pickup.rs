//! Idle pickup: how long a task waits for an idle agent, from the enqueue
//! call to its handler's start.

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
/// from each enqueue call to its handler's start.
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
    for _ in 0..picks {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let sent = i64::try_from(epoch.elapsed().as_micros()).unwrap_or_default();
        queue.enqueue(NewTask::new("pickup", doc! {"sent_us": sent})).await?;
    }
    let until = Instant::now() + Duration::from_secs(30);
    while picked.lock().len() < picks && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent.shutdown();
    let _ = worker.await;
    let pk = sorted(picked.lock().clone());
    f.put("pickup_ms_p50", pct(&pk, 0.5));
    f.put("pickup_ms_p99", pct(&pk, 0.99));
    Ok(())
}
