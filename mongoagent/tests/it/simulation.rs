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
//!
//! The store also fails after applying a write (the ambiguous case), slows
//! down, and ends its change streams.
//!
//! The handler only *records* what it sees (`Checks`); the test asserts at the
//! end. An `assert!` inside the handler could never fail the test: the agent
//! catches a handler's panic and counts it as a failed attempt, and this
//! simulation makes handlers panic on purpose.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, AgentCounters, NewTask, Outcome, Queue, Task};
use store_memory::MemoryStore;
use store_test::memory::FaultSchedule;
use store_test::{Client, Partitionable};
use store_trait::{Collection, Query, Store};

fn coll() -> Collection {
    Collection::new("tasks").unwrap()
}
use tokio_util::sync::CancellationToken;

const SEEDED: usize = 120;

/// What handlers observed, shared by every agent, checked at the end of the test.
#[derive(Default)]
struct Checks {
    /// Every claim a handler ran under, per task.
    running: Mutex<HashMap<String, Vec<CancellationToken>>>,
    /// Handler starts that found another run of the same task still live.
    overlaps: Mutex<Vec<String>>,
    /// Handler runs that found the task's follow-ups invalid for a fan-in step.
    fan_in: Mutex<Vec<String>>,
    /// Handler runs that started after an earlier run of the same task.
    reruns: AtomicU64,
    /// Fan-in runs checked.
    fan_in_runs: AtomicU64,
    /// Per task, the newest claim (fence) a handler ran under, and whether that
    /// run panicked (and so wrote no outcome of its own).
    last_run: Mutex<HashMap<String, (u64, bool)>>,
}

impl Checks {
    fn violation(list: &Mutex<Vec<String>>, what: String) {
        list.lock().unwrap().push(what);
    }
}

/// Counts on the store, retrying injected faults (the handler must see the truth,
/// not a fault meant for the agents).
async fn count_open_follow_ups(store: &MemoryStore, waiter: &Task) -> u64 {
    let open = Query::eq(doc! {"join": waiter.id().as_bson().clone()})
        .when(store_trait::Condition::FieldEq("complete".into(), true.into()).negate());
    loop {
        if let Ok(n) = store.count(&coll(), &open).await {
            return n;
        }
    }
}

fn handler(
    checks: Arc<Checks>,
    store: MemoryStore,
    seed: u64,
) -> impl Fn(Task) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>> + Send + Sync + 'static {
    move |task: Task| {
        let (checks, store) = (checks.clone(), store.clone());
        Box::pin(async move {
            let id = task.id().to_string();
            {
                let mut r = checks.running.lock().unwrap();
                let others = r.entry(id.clone()).or_default();
                if !others.is_empty() {
                    checks.reruns.fetch_add(1, Ordering::SeqCst);
                }
                if !others.iter().all(CancellationToken::is_cancelled) {
                    Checks::violation(
                        &checks.overlaps,
                        format!("task {id} runs twice at once (fence {})", task.fence()),
                    );
                }
                others.push(task.cancellation().clone());
                let mut last = checks.last_run.lock().unwrap();
                let last = last.entry(id.clone()).or_default();
                if task.fence() > last.0 {
                    *last = (task.fence(), false);
                }
            }
            let id_hash =
                id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
            let mut rng = fastrand::Rng::with_seed(seed ^ (task.fence() * 7919) ^ id_hash);
            // Some handlers outlast a partition longer than the lease (they do not
            // watch their cancellation): their late outcome must be rejected.
            let work = if rng.u32(..4) == 0 { rng.u64(8_000..30_000) } else { rng.u64(10..3_000) };
            tokio::time::sleep(Duration::from_millis(work)).await;
            let stage = task.data().get_i32("stage").unwrap_or(0);
            let fan = task.data().get_i64("i").unwrap_or(0) % 3;
            if task.round() > 0 || stage == 2 {
                // Fan-in: every follow-up has ended, and the handler sees them all.
                checks.fan_in_runs.fetch_add(1, Ordering::SeqCst);
                let open = count_open_follow_ups(&store, &task).await;
                let children = task.children();
                let ended = children.iter().filter(|c| c.data().get_bool("complete").ok() == Some(true)).count();
                if open != 0 || children.len() != 2 || ended != 2 {
                    let what = format!("{id}: {open} follow-ups open, sees {} of which {ended} ended", children.len());
                    Checks::violation(&checks.fan_in, what);
                }
            }
            let two = |o: Outcome| {
                o.follow_up(NewTask::new("sim", doc! {"stage": 1})).follow_up(NewTask::new("sim", doc! {"stage": 1}))
            };
            let outcome = match rng.u32(..100) {
                0..=7 => Outcome::failed("flaky"),
                8..=9 => {
                    checks.last_run.lock().unwrap().entry(id).and_modify(|r| r.1 |= r.0 == task.fence());
                    panic!("handler bug")
                }
                10 => Outcome::failed_permanently("bad input"),
                _ if stage == 0 && task.round() == 0 && fan == 1 => two(Outcome::done()).wait_for_follow_ups(),
                _ if stage == 0 && fan == 2 => two(Outcome::done()).then(NewTask::new("sim", doc! {"stage": 2})),
                _ if stage == 0 && task.round() == 0 => two(Outcome::done()),
                _ => Outcome::done(),
            };
            // Every outcome says which claim wrote it.
            outcome.merge(doc! {"outcome_fence": i64::try_from(task.fence()).unwrap()})
        })
    }
}

struct Worker {
    client: Client,
    task: tokio::task::JoinHandle<AgentCounters>,
    agent: Agent<Client>,
}

fn spawn(store: &MemoryStore, checks: &Arc<Checks>, seed: u64) -> Worker {
    let client = store.client();
    let agent = Agent::builder(client.clone(), "sim", "tasks")
        .ttl(Duration::from_secs(3))
        .concurrency(3)
        .max_attempts(4)
        .backoff(Duration::from_millis(200), Duration::from_secs(2))
        .poll_interval(Duration::from_secs(2))
        .drain_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let h = handler(checks.clone(), store.clone(), seed);
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
    let checks = Arc::new(Checks::default());
    let mut workers: Vec<Worker> = (0..4).map(|i| spawn(&store, &checks, i)).collect();
    let mut logs: Vec<AgentCounters> = Vec::new();
    let (mut crashes, mut partitions) = (0, 0);
    let mut injected = FaultSchedule::default();
    for step in 0..400_u64 {
        let i = rng.usize(..workers.len());
        match rng.u32(..100) {
            0..=3 => {
                // Crash mid-task: cut off, then the process is gone (its handlers die
                // with it); a fresh one replaces it.
                workers[i].client.set_partitioned(true);
                workers[i].task.abort();
                let _ = (&mut workers[i].task).await;
                // What the dead process had applied still counts.
                logs.push(workers[i].agent.counters());
                workers[i] = spawn(&store, &checks, 1000 + step);
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
            10..=15 => injected.inject(&store, &mut rng),
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(50..700))).await;
    }
    // Heal everything and let the pipeline drain.
    store.faults().clear();
    for w in &workers {
        w.client.set_partitioned(false);
    }
    let coll = coll();
    let open =
        || Query::all().when(store_trait::Condition::FieldEq("complete".into(), bson::Bson::Boolean(true)).negate());
    for _ in 0..2_000 {
        // Follow-ups exist before their parent ends, so once no task is open and
        // no fan-in step is pending (claimed), nothing more will come.
        let claimed = Query::eq(doc! {"claimed": true});
        if store.count(&coll, &open()).await.unwrap() == 0 && store.count(&coll, &claimed).await.unwrap() == 0 {
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
    let all = store.find(&coll, &Query::all()).await.unwrap();
    // Follow-ups a stale run enqueued (pending, marked with its claim's fence)
    // and that the holder's outcome did not take over: never activated, never
    // run, and left behind inert. Their parent has ended; they are not tasks.
    let (debris, docs): (Vec<_>, Vec<_>) = all.into_iter().partition(|r| r.data().contains_key("pending_parent_fence"));
    for d in &debris {
        let parent = d.data().get("parent").and_then(|p| all_parent(&docs, p));
        assert!(
            parent.is_some_and(|p| p.data().get_bool("complete").ok() == Some(true)),
            "a pending follow-up whose parent has not ended: {d:?}"
        );
    }
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
    let open: Vec<_> = docs.iter().filter(|r| r.data().get_bool("complete").ok() != Some(true)).collect();
    assert!(open.is_empty(), "every task ended: {open:?}");
    assert!(docs.iter().all(|r| r.lease().is_none()), "no claim left behind");
    let applied: u64 = logs.iter().map(|l| l.completed + l.failed_permanently).sum();
    assert!(applied <= docs.len() as u64, "no outcome applied twice: {applied} > {}", docs.len());
    // Each task's outcome is the one its newest claim's handler returned: a late
    // outcome of an older claim was never applied over it.
    let last_run = checks.last_run.lock().unwrap();
    let mut outcomes_checked = 0;
    for r in &docs {
        let Some(&(fence, panicked)) = last_run.get(&r.key().to_string()) else { continue };
        if panicked {
            continue;
        }
        let written = r.data().get_i64("outcome_fence").ok();
        assert_eq!(written, Some(i64::try_from(fence).unwrap()), "{}: outcome written by an older claim", r.key());
        outcomes_checked += 1;
    }
    assert!(outcomes_checked > docs.len() / 2, "{outcomes_checked} outcomes checked");
    let stale: u64 = logs.iter().map(|l| l.stale_rejected).sum();
    eprintln!("applied {applied} of {} tasks, {stale} stale", docs.len());
    assert!(stale > 0, "late outcomes of lapsed claims were tried (and rejected)");
    assert!(crashes > 5 && partitions > 5, "faults happened: {crashes} crashes, {partitions} partitions");
    assert!(
        injected.after_apply >= 3 && injected.latency >= 3 && injected.streams_ended >= 3,
        "store faults happened: {injected:?}"
    );
    let overlaps = checks.overlaps.lock().unwrap();
    assert!(overlaps.is_empty(), "two live claims ran one task at once: {overlaps:#?}");
    let fan_in = checks.fan_in.lock().unwrap();
    assert!(fan_in.is_empty(), "fan-in steps ran too early: {fan_in:#?}");
    // The checks above saw enough to mean something.
    let (reruns, fan_in_runs) = (checks.reruns.load(Ordering::SeqCst), checks.fan_in_runs.load(Ordering::SeqCst));
    eprintln!("checked: {reruns} reruns, {fan_in_runs} fan-in runs");
    assert!(reruns > 50 && fan_in_runs > SEEDED as u64 / 2, "{reruns} reruns, {fan_in_runs} fan-in runs checked");
}

/// The task whose id is `id`, among `docs`.
fn all_parent<'a>(docs: &'a [store_trait::Record], id: &bson::Bson) -> Option<&'a store_trait::Record> {
    docs.iter().find(|r| r.key().as_bson() == id)
}
