//! The queue section: on the same server and the same number of tasks, a
//! hand-written driver loop and the shapes of ours side by side
//! (`queue_<shape>_*`), then the cost of a global limit that never binds.

use store_mongo::MongoStore;

use super::figures::{Figures, SHAPES};
use super::processes::queue_processes_run;
use super::queue::{put_breakdown, queue_run, QueueRun, Shape};
use super::raw_queue::raw_queue_run;
use crate::error::LabError;

/// Puts `queue_tasks`, the raw loop's figures (`raw_queue_*`), each shape's
/// (`queue_<shape>_*`) and the global limit's (`queue_global_1000_*`), each
/// run on `tasks` tasks (the global limit's pairs on twice as many).
pub(super) async fn put_figures(
    f: &mut Figures,
    uri: &str,
    db: &str,
    store: &MongoStore,
    tasks: u32,
) -> Result<(), LabError> {
    // The queue, side by side on the same server and the same number of tasks
    // (SecantusDB's writes cost time in proportion to the collection's size, so
    // only same-size figures of the same run compare): a hand-written driver
    // loop, three shapes of ours, and Agenda. Every shape gets a collection of
    // its own, preloaded the same way.
    f.put("queue_tasks", f64::from(tasks));
    eprintln!("raw queue: one client, claim (filter + sort) then fenced complete, {tasks} tasks…");
    let raw_queue = raw_queue_run(uri, db, store, tasks, "bench_raw_queue").await?;
    f.put("raw_queue_per_s", raw_queue.rate);
    f.put("raw_queue_commands_per_task", raw_queue.commands_per_task);
    put_breakdown(f, "raw_queue", &raw_queue.counts, tasks);
    let mut shapes: Vec<(&str, QueueRun)> = Vec::new();
    let [per_agent, shared, shared_global, processes] = SHAPES;
    eprintln!("queue: 4 agents, {tasks} trivial tasks, each agent on its own Queue (Agent::builder)…");
    shapes.push((per_agent, queue_run(uri, db, store, tasks, "bench_queue", Shape::default()).await?));
    eprintln!("queue: 4 agents sharing one Queue (Agent::on_queue), {tasks} trivial tasks…");
    shapes.push((
        shared,
        queue_run(uri, db, store, tasks, "bench_queue_shared", Shape { shared: true, ..Shape::default() }).await?,
    ));
    eprintln!("queue: as shared, with a global concurrency of 1,000 (never binding), {tasks} trivial tasks…");
    let global = queue_run(
        uri,
        db,
        store,
        tasks,
        "bench_queue_global",
        Shape { shared: true, global: Some(1000), ..Shape::default() },
    )
    .await?;
    shapes.push((shared_global, global));
    eprintln!("queue: 4 agent processes (lab bench-agent), {tasks} trivial tasks…");
    shapes.push((processes, queue_processes_run(uri, db, store, tasks, "bench_queue_processes", 4).await?));

    // Printed now: a run that fails later (Agenda, the seed) still shows them.
    for (shape, r) in &shapes {
        f.put(format!("queue_{shape}_tasks_per_s"), r.rate);
        f.put(format!("queue_{shape}_commands_per_task"), r.commands_per_task);
        put_breakdown(f, &format!("queue_{shape}"), &r.counts, tasks);
        f.put(format!("queue_{shape}_vs_raw_queue"), r.rate / raw_queue.rate);
    }
    // Groups: the per-agent shape with its tasks in 100 groups, one at a
    // time each (the producers' numbering and nudges are not counted).
    eprintln!("queue: as per agent, the tasks in 100 groups, a cap of 1 per group, {tasks} trivial tasks…");
    let grouped =
        queue_run(uri, db, store, tasks, "bench_queue_grouped", Shape { groups: Some(100), ..Shape::default() })
            .await?;
    f.put("queue_grouped_100_tasks_per_s", grouped.rate);
    f.put("queue_grouped_100_commands_per_task", grouped.commands_per_task);
    put_breakdown(f, "queue_grouped_100", &grouped.counts, tasks);
    if let Some((_, per_agent)) = shapes.first() {
        f.put("queue_grouped_100_vs_per_agent", grouped.rate / per_agent.rate);
    }
    {
        // The cost of a global limit that never binds (issue 15: within 10 %),
        // in a block of its own: shared, global, global, shared, back to back
        // (a load that drifts during the block weighs on both alike), on twice
        // the tasks, so the limit's fixed costs (its slot documents, the
        // first grants, the last releases) weigh as in a run of some length
        // rather than as in a ten-second one.
        let n = tasks.saturating_mul(2);
        eprintln!("queue: shared / global 1,000 / global 1,000 / shared, {n} trivial tasks each…");
        let shared_a =
            queue_run(uri, db, store, n, "bench_queue_pair_shared_a", Shape { shared: true, ..Shape::default() })
                .await?;
        let global_a = queue_run(
            uri,
            db,
            store,
            n,
            "bench_queue_pair_global_a",
            Shape { shared: true, global: Some(1000), ..Shape::default() },
        )
        .await?;
        let global_b = queue_run(
            uri,
            db,
            store,
            n,
            "bench_queue_pair_global_b",
            Shape { shared: true, global: Some(1000), ..Shape::default() },
        )
        .await?;
        let shared_b =
            queue_run(uri, db, store, n, "bench_queue_pair_shared_b", Shape { shared: true, ..Shape::default() })
                .await?;
        f.put("queue_global_1000_pair_tasks", f64::from(n));
        f.put("queue_global_1000_vs_shared_first_pair", global_a.rate / shared_a.rate);
        f.put("queue_global_1000_vs_shared_second_pair", global_b.rate / shared_b.rate);
        f.put("queue_global_1000_vs_shared", (global_a.rate + global_b.rate) / (shared_a.rate + shared_b.rate));
        let extra = (global_a.commands_per_task + global_b.commands_per_task)
            - (shared_a.commands_per_task + shared_b.commands_per_task);
        f.put("queue_global_1000_extra_commands_per_task", extra / 2.0);
    }

    Ok(())
}
