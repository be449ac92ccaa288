//! `queue_events_per_s`: the lifecycle events (`Queue::events`) one subscriber
//! receives while 4 agents on one `Queue` run trivial tasks at full speed.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mongoagent::{Agent, EventFilter, EventKind, Queue, QueueEvent};
use store_mongo::MongoStore;

use super::figures::Figures;
use super::queue::{drive, preload};
use crate::error::LabError;

/// Runs `tasks` trivial tasks from `coll` (preloaded, so the subscriber sees
/// each task claimed and completed) with one subscriber reading every event,
/// and puts `queue_events_per_s` (events delivered ÷ seconds from the agents'
/// start to the last task's `Completed` event), `queue_events_per_task`,
/// `queue_events_tasks_per_s` (the queue's throughput while watched) and
/// `queue_events_resyncs` (how often the subscriber fell behind: 0 expected).
pub(super) async fn put_figures(f: &mut Figures, store: &MongoStore, tasks: u32, coll: &str) -> Result<(), LabError> {
    let queue = preload(store, tasks, coll).await?;
    let mut events = queue.events(EventFilter::all()).await?;
    let start = Instant::now();
    let reader = tokio::spawn(async move {
        let (mut delivered, mut completed, mut resyncs) = (0_u64, 0_u64, 0_u64);
        while completed < u64::from(tasks) {
            match tokio::time::timeout(Duration::from_secs(120), events.next()).await {
                Ok(Some(QueueEvent::Task(ev))) => {
                    delivered += 1;
                    completed += u64::from(matches!(ev.kind, EventKind::Completed));
                }
                Ok(Some(_)) => resyncs += 1,
                Ok(None) | Err(_) => {
                    return Err(LabError::Broken(format!("events: {completed} of {tasks} completions seen")))
                }
            }
        }
        Ok((delivered, resyncs, start.elapsed()))
    });
    let shared = Queue::new(store.clone(), coll)?;
    let done = Arc::new(AtomicU64::new(0));
    let agents: Vec<Agent<MongoStore>> = (0..4)
        .map(|_| Agent::on_queue(&shared, "bench").concurrency(4).poll_interval(Duration::from_millis(200)).build())
        .collect::<Result<_, _>>()?;
    let (task_rate, _) = drive(&agents, &done, tasks, start, "events").await?;
    let (delivered, resyncs, took) = reader.await.map_err(|e| LabError::join("the events' reader stopped", e))??;
    f.put("queue_events_per_s", delivered as f64 / took.as_secs_f64());
    f.put("queue_events_per_task", delivered as f64 / f64::from(tasks));
    f.put("queue_events_tasks_per_s", task_rate);
    f.put("queue_events_resyncs", resyncs as f64);
    Ok(())
}
