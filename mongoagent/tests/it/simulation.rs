//! A deterministic simulation on the in-memory store under paused time: several
//! agents process a pipeline while agents crash mid-task, are cut off for longer
//! than their lease, the store fails transiently, and handlers fail or panic at
//! random. Each seeded task makes two follow-ups; a third of them then wait for
//! their follow-ups and run again (fan-in on the task), a third add a fan-in
//! task that runs after them. Checked:
//! - two live agents never run the same task at once (a handler starting on a
//!   task finds every earlier attempt's claim already cancelled);
//! - every task, seeded or follow-up, ends exactly once, completed or failed
//!   for good: applied outcomes across all agents equal the number of tasks, and
//!   every task document is complete;
//! - follow-ups are never duplicated;
//! - a waiting task runs again, and a fan-in task runs, only once every one of
//!   its follow-ups has ended, and sees all of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, AgentLog, NewTask, Outcome, Queue, Task};
use store_memory::{Client, MemoryStore};
use store_trait::{Collection, Query, Store};

fn coll() -> Collection {
    Collection::new("tasks").unwrap()
}
use tokio_util::sync::CancellationToken;

const SEEDED: usize = 120;

type Running = Arc<Mutex<HashMap<String, Vec<CancellationToken>>>>;

fn handler(
    running: Running,
    store: MemoryStore,
    seed: u64,
) -> impl Fn(Task) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>> + Send + Sync + 'static {
    move |task: Task| {
        let (running, store) = (running.clone(), store.clone());
        Box::pin(async move {
            let id = task.id().to_string();
            {
                let mut r = running.lock().unwrap();
                let others = r.entry(id.clone()).or_default();
                assert!(others.iter().all(CancellationToken::is_cancelled), "task {id} runs twice at once");
                others.push(task.cancelled().clone());
            }
            let mut rng = fastrand::Rng::with_seed(seed ^ (task.token() * 7919) ^ id.len() as u64);
            tokio::time::sleep(Duration::from_millis(rng.u64(10..3_000))).await;
            let stage = task.data().get_i32("stage").unwrap_or(0);
            let fan = task.data().get_i64("i").unwrap_or(0) % 3;
            if task.round() > 0 || stage == 2 {
                // Fan-in: every follow-up has ended, and the handler sees them all.
                let open = Query::eq(doc! {"join": task.id().as_bson().clone()})
                    .when(store_trait::Condition::FieldEq("complete".into(), true.into()).negate());
                assert_eq!(store.count(&coll(), &open).await.unwrap(), 0, "{id} runs before its follow-ups end");
                assert_eq!(task.children().len(), 2, "{id} sees its follow-ups");
                assert!(task.children().iter().all(|c| c.data().get_bool("complete").ok() == Some(true)));
            }
            let two = |o: Outcome| {
                o.follow_up(NewTask::new("sim", doc! {"stage": 1})).follow_up(NewTask::new("sim", doc! {"stage": 1}))
            };
            match rng.u32(..100) {
                0..=7 => Outcome::failed("flaky"),
                8..=9 => panic!("handler bug"),
                10 => Outcome::failed_permanently("bad input"),
                _ if stage == 0 && task.round() == 0 && fan == 1 => two(Outcome::done()).wait_for_follow_ups(),
                _ if stage == 0 && fan == 2 => two(Outcome::done()).then(NewTask::new("sim", doc! {"stage": 2})),
                _ if stage == 0 && task.round() == 0 => two(Outcome::done()),
                _ => Outcome::done(),
            }
        })
    }
}

struct Worker {
    client: Client,
    task: tokio::task::JoinHandle<AgentLog>,
    agent: Agent<Client>,
}

fn spawn(store: &MemoryStore, running: &Running, seed: u64) -> Worker {
    let client = store.client();
    let agent = Agent::builder(client.clone(), "sim", "tasks")
        .lease(Duration::from_secs(3))
        .concurrency(3)
        .max_attempts(4)
        .backoff(Duration::from_millis(200), Duration::from_secs(2))
        .sleep_between(Duration::from_secs(2))
        .drain_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let h = handler(running.clone(), store.clone(), seed);
    let a = agent.clone();
    let task = tokio::spawn(async move { a.work(h).await.unwrap_or_default() });
    Worker { client, task, agent }
}

#[tokio::test(start_paused = true)]
async fn agents_under_crashes_partitions_and_faults() {
    let mut rng = fastrand::Rng::with_seed(42);
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let seeded: Vec<_> = (0..SEEDED).map(|i| NewTask::new("sim", doc! {"stage": 0, "i": i as i64})).collect();
    queue.enqueue_all(&seeded).await.unwrap();
    let running: Running = Arc::default();
    let mut workers: Vec<Worker> = (0..4).map(|i| spawn(&store, &running, i)).collect();
    let mut logs: Vec<AgentLog> = Vec::new();
    let (mut crashes, mut partitions) = (0, 0);
    for step in 0..400_u64 {
        let i = rng.usize(..workers.len());
        match rng.u32(..100) {
            0..=3 => {
                // Crash mid-task: cut off, then the process is gone (its handlers die
                // with it); a fresh one replaces it.
                workers[i].client.set_partitioned(true);
                workers[i].task.abort();
                let _ = (&mut workers[i].task).await;
                workers[i] = spawn(&store, &running, 1000 + step);
                crashes += 1;
            }
            4..=7 => {
                // Cut off for longer than the lease, then back.
                let c = workers[i].client.clone();
                c.set_partitioned(true);
                partitions += 1;
                let d = Duration::from_millis(rng.u64(3_500..8_000));
                tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    c.set_partitioned(false);
                });
            }
            8..=9 => store.faults().fail_next(u64::from(rng.u32(1..3))),
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(50..700))).await;
    }
    // Heal everything and let the pipeline drain.
    store.faults().clear();
    for w in &workers {
        w.client.set_partitioned(false);
    }
    let total = SEEDED as u64 * 3 + SEEDED as u64 / 3;
    let coll = coll();
    let open =
        || Query::all().when(store_trait::Condition::FieldEq("complete".into(), bson::Bson::Boolean(true)).negate());
    for _ in 0..2_000 {
        if store.count(&coll, &open()).await.unwrap() == 0 && store.count(&coll, &Query::all()).await.unwrap() >= total
        {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for w in &workers {
        w.agent.shutdown();
    }
    for w in workers {
        logs.push(w.task.await.unwrap());
    }
    // Crashed processes' logs are gone with them; count outcomes from the store.
    let docs = store.find(&coll, &Query::all()).await.unwrap();
    let stage = |r: &store_trait::Record| r.data().get_i32("stage").unwrap_or(-1);
    let seeded: Vec<_> = docs.iter().filter(|r| stage(r) == 0).collect();
    assert_eq!(seeded.len(), SEEDED);
    let mut fan_ins = 0;
    for p in &seeded {
        let made = |st: i32| {
            docs.iter().filter(|r| r.data().get("parent") == Some(p.key().as_bson()) && stage(r) == st).count()
        };
        let fan = p.data().get_i64("i").unwrap() % 3;
        let completed = p.data().get_bool("error_encountered").ok() == Some(false);
        let round = p.data().get_i64("round").unwrap_or(0);
        // A handler run whose outcome was then rejected (its claim had lapsed) may
        // have enqueued follow-ups for a task that later failed for good.
        let expected = if completed { 2 } else { made(1) };
        assert_eq!(made(1), expected, "{}: two follow-ups per completed task, never duplicated", p.key());
        assert!(expected == 0 || expected == 2, "{}: {expected} follow-ups", p.key());
        match fan {
            1 if completed => assert_eq!(round, 1, "{} ran again after its follow-ups", p.key()),
            2 => {
                assert!(made(2) <= 1, "{}: one fan-in task at most", p.key());
                assert!(!completed || made(2) == 1, "{}: a fan-in task", p.key());
                fan_ins += made(2);
            }
            _ => {}
        }
    }
    assert!(fan_ins > SEEDED / 4, "fan-in tasks ran: {fan_ins}");
    assert!(docs.iter().all(|r| r.data().get_bool("complete").ok() == Some(true)), "every task ended");
    assert!(docs.iter().all(|r| r.lease().is_none()), "no claim left behind");
    let applied: u64 = logs.iter().map(|l| l.completed + l.failed_permanently).sum();
    assert!(applied <= docs.len() as u64, "no outcome applied twice: {applied} > {}", docs.len());
    assert!(crashes > 5 && partitions > 5, "faults happened: {crashes} crashes, {partitions} partitions");
}
