//! One queue run of the bench: tasks preloaded, agents driven until every
//! one is done, and what the run measured ([`QueueRun`]): its rate, its
//! commands per task, and where they went.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::doc;
use mongoagent::{Agent, NewTask, Outcome, Queue, Task};
use store_mongo::MongoStore;

use super::counted::{counted_store, Counts};
use super::figures::Figures;
use crate::error::LabError;

/// Throughput and commands per completed task of one queue run.
pub(super) struct QueueRun {
    pub(super) rate: f64,
    pub(super) commands_per_task: f64,
    /// The commands by kind over the run.
    pub(super) counts: Counts,
}

/// Preloads `tasks` trivial tasks for agent `bench` into `coll` (with the
/// queue's indexes), through the uncounted `store`.
pub(super) async fn preload(store: &MongoStore, tasks: u32, coll: &str) -> Result<Queue<MongoStore>, LabError> {
    preload_grouped(store, tasks, coll, None).await
}

/// As [`preload`]; with `groups`, task `i` in group `i % groups`.
pub(super) async fn preload_grouped(
    store: &MongoStore,
    tasks: u32,
    coll: &str,
    groups: Option<u32>,
) -> Result<Queue<MongoStore>, LabError> {
    let queue = Queue::new(store.clone(), coll)?;
    let task = |i: u32| {
        let t = NewTask::new("bench", doc! {"i": i64::from(i)});
        match groups {
            Some(g) => t.group(format!("g{}", i % g.max(1))),
            None => t,
        }
    };
    let batch: Vec<NewTask> = (0..tasks).map(task).collect();
    match queue.enqueue_all(&batch).await {
        Ok(_) => {}
        // A pooled connection that the server closed while the bench left
        // it idle (the seed's failover trial idles it for a minute) fails
        // the next write with a transient fault, and the bench's URI turns
        // retryable writes off. The write may or may not have landed: the
        // trial's collection is emptied and the tasks enqueued again, once.
        Err(e) if e.is_retryable() => {
            eprintln!("  (preloading {coll}: {e}; emptied and preloaded again)");
            store.database().collection::<bson::Document>(coll).delete_many(doc! {}).await?;
            queue.enqueue_all(&batch).await?;
        }
        Err(e) => return Err(e.into()),
    }
    Ok(queue)
}

/// Runs `agents` on trivial tasks (each counted in `done`) until `tasks` are
/// done, then shuts them down: the rate from `start`, and the completions
/// the agents counted. Counted in-process: polling the queue's statistics
/// would load the server.
pub(super) async fn drive(
    agents: &[Agent<MongoStore>],
    done: &Arc<AtomicU64>,
    tasks: u32,
    start: Instant,
    what: &str,
) -> Result<(f64, u64), LabError> {
    let mut workers = Vec::new();
    for a in agents {
        let (a, done) = (a.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            a.work(move |_t: Task| {
                let done = done.clone();
                async move {
                    done.fetch_add(1, Ordering::Relaxed);
                    Outcome::done()
                }
            })
            .await
        }));
    }
    let limit = Duration::from_secs(1800);
    while done.load(Ordering::Relaxed) < u64::from(tasks) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if start.elapsed() > limit {
            return Err(LabError::timed_out(format!("{what} benchmark did not finish"), limit));
        }
    }
    let rate = f64::from(tasks) / start.elapsed().as_secs_f64();
    for a in agents {
        a.shutdown();
    }
    let mut completed = 0;
    // An agent told to shut down with nothing in hand stops at once: one that
    // does not within a minute is a fault to report, not to wait on.
    let stop_limit = Duration::from_secs(60);
    for w in workers {
        completed += tokio::time::timeout(stop_limit, w)
            .await
            .map_err(|_| LabError::timed_out(format!("an agent of the {what} benchmark did not stop"), stop_limit))?
            .map_err(|e| LabError::join(format!("an agent of the {what} benchmark stopped"), e))??
            .completed;
    }
    Ok((rate, completed))
}

/// How the agents of a queue run are built ([`queue_run`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Shape {
    /// Built on one `Queue` (`Agent::on_queue`), taking turns claiming;
    /// else each on its own (`Agent::builder`).
    pub(super) shared: bool,
    /// Under a global concurrency of this many permits.
    pub(super) global: Option<u32>,
    /// The tasks spread over this many groups, the agents capped at one
    /// task per group.
    pub(super) groups: Option<u32>,
}

/// 4 agents (concurrency 4 each) in this process, built as `shape` says,
/// process `tasks` trivial tasks from `coll`. Commands are counted from the
/// agents' start until they have shut down.
pub(super) async fn queue_run(
    uri: &str,
    db: &str,
    store: &MongoStore,
    tasks: u32,
    coll: &str,
    shape: Shape,
) -> Result<QueueRun, LabError> {
    let Shape { shared, global, groups } = shape;
    preload_grouped(store, tasks, coll, groups).await?;
    let (counted, commands) = counted_store(uri, db).await?;
    let queue = Queue::new(counted.clone(), coll)?;
    let done = Arc::new(AtomicU64::new(0));
    let c0 = commands.snapshot();
    let start = Instant::now();
    let agents: Vec<Agent<MongoStore>> = (0..4)
        .map(|_| {
            let b =
                if shared { Agent::on_queue(&queue, "bench") } else { Agent::builder(counted.clone(), "bench", coll) };
            let b = b.concurrency(4).poll_interval(Duration::from_millis(200));
            let b = if groups.is_some() { b.group_concurrency(1) } else { b };
            match global {
                Some(n) => b.global_concurrency(n).build(),
                None => b.build(),
            }
        })
        .collect::<Result<_, _>>()?;
    let (rate, completed) = drive(&agents, &done, tasks, start, "queue").await?;
    let counts = commands.snapshot().since(&c0);
    if completed != u64::from(tasks) {
        return Err(LabError::Completions { run: "queue benchmark", completed, tasks: u64::from(tasks) });
    }
    Ok(QueueRun { rate, commands_per_task: counts.total as f64 / f64::from(tasks), counts })
}

/// Commands per task by kind (`PREFIX_cmd_KIND`): where a shape's commands go.
pub(super) fn put_breakdown(f: &mut Figures, prefix: &str, counts: &Counts, tasks: u32) {
    for (kind, per_task) in counts.per_task(tasks) {
        f.put(format!("{prefix}_cmd_{kind}"), per_task);
    }
    // Times exist for this process's commands only (not the agent processes').
    if !counts.micros.is_empty() {
        f.put(format!("{prefix}_command_ms_per_task"), counts.command_ms_per_task(tasks));
        for (kind, ms) in counts.mean_ms() {
            f.put(format!("{prefix}_ms_{kind}"), ms);
        }
    }
}
