//! `mongocoord demo`: three electors, a contended lock and a pipeline of agents
//! (batches fan out to fetches and wait for them; each fetch is followed by a
//! parse), with members killed (their runtime torn down without any cleanup,
//! as when a process dies) and restarted on a schedule, a live display, and a
//! summary that checks the invariants and fails the command if one broke.

use std::collections::HashMap;
use std::io::{IsTerminal, Write as _};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use bson::doc;
use mongoagent::{fields, Agent, NewTask, Outcome, Queue, Task};
use mongoelector::Elector;
use mongolock::{Acquire, Lock};
use serde_json::json;
use store_memory::MemoryStore;
use store_mongo::MongoStore;
use store_trait::{Collection, Condition, Query, Store};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::CliError;

const ELECTION: &str = "demo-scheduler";
const ELECTOR_COLL: &str = "demo_electorlocks";
const STATUS_COLL: &str = "demo_electorstatus";
const LOCK_COLL: &str = "demo_locks";
const QUEUE: &str = "demo_pipeline";
/// Fetches per batch.
const BATCH: u32 = 10;

/// A simulated process: its own thread and runtime. Killing it tears the runtime
/// down without running any cleanup — no release, no final write — as `kill -9`.
struct Proc {
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    fn spawn<F, Fut>(f: F) -> Proc
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                tokio::select! {
                    _ = f() => {}
                    _ = rx => {}
                }
            });
            rt.shutdown_background();
        });
        Proc { kill: Some(tx), thread: Some(thread) }
    }

    fn kill(&mut self) {
        if let Some(tx) = self.kill.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Default)]
struct Shared {
    /// Lock fences in the order they were granted.
    lock_fences: Mutex<Vec<u64>>,
    lock_holders: AtomicUsize,
    lock_overlaps: AtomicU64,
    /// Per task: how many handlers run it right now.
    running: Mutex<HashMap<String, usize>>,
    double_runs: AtomicU64,
    handler_runs: AtomicU64,
    two_leaders: AtomicU64,
    failovers: AtomicU64,
    /// Batches that ran again before all their fetches had ended.
    early_joins: AtomicU64,
}

struct Node<S: Store + Clone> {
    proc: Option<Proc>,
    elector: Option<Elector<S>>,
}

fn start_elector<S: Store + Clone>(store: &S, name: usize) -> Node<S> {
    let e = Elector::builder(store.clone(), ELECTION)
        .collection(ELECTOR_COLL)
        .status_collection(STATUS_COLL)
        .ttl(Duration::from_secs(2))
        .on_leader(move || tracing::info!(node = name, "on_leader: scheduler started"))
        .on_leader_loss(move || tracing::info!(node = name, "on_leader_loss: scheduler stopped"))
        .build();
    let Ok(e) = e else { return Node { proc: None, elector: None } };
    let handle = e.clone();
    let proc = Proc::spawn(move || async move {
        if e.start().is_ok() {
            std::future::pending::<()>().await;
        }
    });
    Node { proc: Some(proc), elector: Some(handle) }
}

struct Running {
    shared: Arc<Shared>,
    id: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(c) = self.shared.running.lock().get_mut(&self.id) {
            *c -= 1;
        }
    }
}

fn handler(
    shared: Arc<Shared>,
    seed: u64,
) -> impl Fn(Task) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>> + Send + Sync + 'static {
    let counter = Arc::new(AtomicU64::new(seed));
    move |task: Task| {
        let shared = shared.clone();
        let n = counter.fetch_add(1, Ordering::Relaxed);
        Box::pin(async move {
            let id = task.id().to_string();
            {
                let mut r = shared.running.lock();
                let c = r.entry(id.clone()).or_default();
                *c += 1;
                if *c > 1 {
                    shared.double_runs.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Counted down when the handler ends, however it ends (a killed
            // process drops it mid-way).
            let _running = Running { shared: shared.clone(), id };
            shared.handler_runs.fetch_add(1, Ordering::Relaxed);
            let mut rng = fastrand::Rng::with_seed(n);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(rng.u64(20..120))) => {}
                _ = task.cancellation().cancelled() => {}
            }
            let stage = task.data().get_str("stage").unwrap_or("fetch").to_owned();
            if rng.u32(..100) < 8 {
                return Outcome::failed("flaky upstream (demo)");
            }
            match stage.as_str() {
                // A batch fans out to its fetches and waits; run again once they
                // have all ended, it sums what they fetched.
                "batch" if task.round() == 0 => {
                    let (from, size) =
                        (task.data().get_i64("from").unwrap_or(0), task.data().get_i64("size").unwrap_or(0));
                    (from..from + size)
                        .fold(Outcome::done(), |o, n| {
                            o.follow_up(NewTask::new("fetch", doc! {"stage": "fetch", "n": n}))
                        })
                        .wait_for_follow_ups()
                }
                "batch" => {
                    let children = task.children();
                    let ended =
                        children.iter().filter(|c| c.data().get_bool(fields::COMPLETE).ok() == Some(true)).count();
                    if ended != children.len() || children.len() as i64 != task.data().get_i64("size").unwrap_or(-1) {
                        shared.early_joins.fetch_add(1, Ordering::Relaxed);
                    }
                    let fetched = children.iter().filter(|c| c.succeeded()).count() as i64;
                    let bytes: i64 = children.iter().filter_map(|c| c.data().get_i64("bytes").ok()).sum();
                    Outcome::done_with(doc! {"fetched": fetched, "bytes": bytes})
                }
                "fetch" => Outcome::done_with(doc! {"bytes": rng.i64(100..10_000)})
                    .follow_up(NewTask::new("parse", doc! {"stage": "parse"})),
                _ => Outcome::done_with(doc! {"rows": rng.i64(1..100)}),
            }
        })
    }
}

fn start_agent<S: Store + Clone>(store: &S, stage: &'static str, shared: &Arc<Shared>, seed: u64) -> Proc {
    let (store, shared) = (store.clone(), shared.clone());
    Proc::spawn(move || async move {
        let Ok(agent) = Agent::builder(store, stage, QUEUE)
            .concurrency(4)
            .ttl(Duration::from_secs(4))
            .max_attempts(10)
            .backoff(Duration::from_millis(50), Duration::from_millis(500))
            .poll_interval(Duration::from_millis(500))
            .build()
        else {
            return;
        };
        let _ = agent.work(handler(shared, seed)).await;
    })
}

fn bar(done: u64, total: u64) -> String {
    let width = 24;
    let filled = (done.min(total) * width).checked_div(total).unwrap_or(0) as usize;
    format!("[{}{}] {done}/{total}", "#".repeat(filled), ".".repeat(width as usize - filled))
}

/// Runs the demo; returns the exit status (1 when an invariant failed).
pub(crate) async fn run(
    target: Option<store_mongo::ConnectionConfig>,
    seconds: u64,
    tasks: u32,
    json: bool,
) -> Result<u8, CliError> {
    match target {
        None => {
            eprintln!("mongocoord demo: in-memory store (set MONGODB_URI or pass --uri to run it on MongoDB)");
            demo(MemoryStore::new(), "memory", seconds, tasks, json).await
        }
        Some(c) => {
            eprintln!("mongocoord demo: MongoDB at {c}");
            let store: MongoStore = crate::connection::connect_to(&c).await?;
            for c in [ELECTOR_COLL, STATUS_COLL, LOCK_COLL, QUEUE] {
                store.database().collection::<bson::Document>(c).drop().await?;
            }
            demo(store, "mongodb", seconds, tasks, json).await
        }
    }
}

async fn demo<S: Store + Clone>(store: S, backend: &str, seconds: u64, tasks: u32, json: bool) -> Result<u8, CliError> {
    let shared = Arc::new(Shared::default());
    let queue = Queue::new(store.clone(), QUEUE)?;
    let seeded: Vec<NewTask> = (0..tasks)
        .step_by(BATCH as usize)
        .map(|from| {
            let size = BATCH.min(tasks - from);
            NewTask::new("batch", doc! {"stage": "batch", "from": i64::from(from), "size": i64::from(size)})
        })
        .collect();
    let batches = seeded.len() as u64;
    queue.enqueue_all(&seeded).await?;

    let mut electors: Vec<Node<S>> = (0..3).map(|i| start_elector(&store, i)).collect();
    let mut agents: Vec<(&'static str, Proc)> = vec![
        ("fetch", start_agent(&store, "fetch", &shared, 1)),
        ("fetch", start_agent(&store, "fetch", &shared, 2)),
        ("parse", start_agent(&store, "parse", &shared, 3)),
        ("parse", start_agent(&store, "parse", &shared, 4)),
        ("batch", start_agent(&store, "batch", &shared, 5)),
    ];

    // Lock contenders: each takes the lock, checks nobody else holds it, works a
    // little, releases.
    let stop_workers = CancellationToken::new();
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (store, shared, stop) = (store.clone(), shared.clone(), stop_workers.clone());
        workers.push(tokio::spawn(async move {
            let Ok(lock) =
                Lock::builder(store, "demo-report").collection(LOCK_COLL).ttl(Duration::from_secs(1)).build()
            else {
                return;
            };
            while !stop.is_cancelled() {
                let acquired = tokio::select! {
                    r = lock.acquire_with(Acquire::new().timeout(Duration::from_secs(5)).auto_renew()) => r,
                    _ = stop.cancelled() => break,
                };
                let Ok(guard) = acquired else { continue };
                shared.lock_fences.lock().push(guard.fence());
                if shared.lock_holders.fetch_add(1, Ordering::SeqCst) > 0 {
                    shared.lock_overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(fastrand::u64(20..120))).await;
                shared.lock_holders.fetch_sub(1, Ordering::SeqCst);
                let _ = guard.release().await;
            }
        }));
    }

    let leader_lock = Lock::builder(store.clone(), ELECTION).collection(ELECTOR_COLL).build()?;
    let report_lock = Lock::builder(store.clone(), "demo-report").collection(LOCK_COLL).build()?;
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let chaos_until = started + Duration::from_secs(seconds);
    let deadline = chaos_until + Duration::from_secs(90);
    let mut next_chaos = started + Duration::from_secs(2);
    let mut restarts: Vec<(Instant, usize)> = Vec::new();
    let (mut kills, mut clean_stops, mut agent_kills) = (0, 0, 0);
    let mut last_leader: Option<String> = None;
    let mut leader_changes = 0;
    let total = u64::from(tasks);
    let mut last_print = Instant::now() - Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = Instant::now();
        // At most one live elector believes it leads.
        let leading = electors.iter().filter(|n| n.elector.as_ref().is_some_and(Elector::is_leader)).count();
        if leading > 1 {
            shared.two_leaders.fetch_add(1, Ordering::Relaxed);
        }
        let leader = leader_lock.get_current().await.ok().flatten();
        let leader_owner = leader.as_ref().map(|l| l.owner.clone());
        if leader_owner.is_some() && leader_owner != last_leader {
            leader_changes += 1;
            last_leader = leader_owner.clone();
        }
        // Chaos while it lasts: kill the leader, stop a member cleanly, kill an agent.
        if now < chaos_until && now >= next_chaos {
            next_chaos = now + Duration::from_millis(2500);
            let round = kills + clean_stops + agent_kills;
            match round % 3 {
                0 => {
                    if let Some(i) = electors.iter().position(|n| n.elector.as_ref().is_some_and(Elector::is_leader)) {
                        if let Some(mut p) = electors[i].proc.take() {
                            electors[i].elector = None;
                            p.kill();
                            kills += 1;
                            shared.failovers.fetch_add(1, Ordering::Relaxed);
                            restarts.push((now + Duration::from_secs(3), i));
                        }
                    }
                }
                1 => {
                    let i = fastrand::usize(..electors.len());
                    if let Some(e) = electors[i].elector.take() {
                        e.stop().await;
                        electors[i].proc = None;
                        clean_stops += 1;
                        restarts.push((now + Duration::from_secs(1), i));
                    }
                }
                _ => {
                    let i = fastrand::usize(..agents.len());
                    let stage = agents[i].0;
                    agents[i].1.kill();
                    agents[i].1 = start_agent(&store, stage, &shared, 100 + agent_kills);
                    agent_kills += 1;
                }
            }
        }
        let mut still = Vec::new();
        for (at, i) in restarts.drain(..) {
            if now >= at && electors[i].elector.is_none() {
                electors[i] = start_elector(&store, i);
            } else if electors[i].elector.is_none() {
                still.push((at, i));
            }
        }
        restarts = still;
        let fetch = queue.stats("fetch").await?;
        let parse = queue.stats("parse").await?;
        let batch = queue.stats("batch").await?;
        let fetch_done = fetch.completed + fetch.failed;
        let parse_done = parse.completed + parse.failed;
        let batch_done = batch.completed + batch.failed;
        let finished =
            fetch_done >= total && parse_done >= fetch.completed && batch_done >= batches && now >= chaos_until;
        if now.duration_since(last_print) >= Duration::from_millis(if tty { 250 } else { 2000 }) || finished {
            last_print = now;
            let holder = report_lock.get_current().await.ok().flatten();
            let line = format!(
                "t={:>4.1}s  leader: {:<28}  lock: {:<22}  fetch {}  parse {}  batches {batch_done}/{batches}  kills {kills} stops {clean_stops} agent-kills {agent_kills}",
                started.elapsed().as_secs_f64(),
                leader.as_ref().map_or("(none)".to_owned(), |l| format!("{} (term {})", short(&l.owner), l.fence)),
                holder.as_ref().map_or("free".to_owned(), |h| format!("{} #{}", short(&h.owner), h.fence)),
                bar(fetch_done, total),
                bar(parse_done, fetch.completed.max(1)),
            );
            if tty {
                eprint!("\r\x1b[2K{line}");
            } else {
                eprintln!("{line}");
            }
            let _ = std::io::stderr().flush();
        }
        if finished || now >= deadline {
            break;
        }
    }
    if tty {
        eprintln!();
    }
    stop_workers.cancel();
    for w in workers {
        let _ = w.await;
    }
    for n in &mut electors {
        if let Some(e) = n.elector.take() {
            e.stop().await;
        }
        n.proc = None;
    }
    for (_, p) in &mut agents {
        p.kill();
    }

    // Verify.
    let coll = Collection::new(QUEUE)?;
    let all = store.count(&coll, &Query::all()).await?;
    let open = store
        .count(
            &coll,
            &Query::all().when(Condition::FieldEq(fields::COMPLETE.into(), bson::Bson::Boolean(true)).negate()),
        )
        .await?;
    let fetch = queue.stats("fetch").await?;
    let parse_total = store.count(&coll, &Query::eq(doc! {fields::AGENT_NAME: "parse"})).await?;
    let joined = store
        .count(
            &coll,
            &Query::eq(doc! {fields::AGENT_NAME: "batch", fields::COMPLETE: true, fields::ERROR_ENCOUNTERED: false, fields::ROUND: 1}),
        )
        .await?;
    let fences = shared.lock_fences.lock().clone();
    let increasing = fences.windows(2).all(|w| w[0] < w[1]);
    let checks = [
        ("at most one leader at a time", shared.two_leaders.load(Ordering::Relaxed) == 0),
        ("lock never held twice at once", shared.lock_overlaps.load(Ordering::Relaxed) == 0),
        ("lock fences strictly increase", increasing && !fences.is_empty()),
        ("no task ran twice at once", shared.double_runs.load(Ordering::Relaxed) == 0),
        ("every task finished", open == 0 && fetch.completed + fetch.failed == total),
        ("one follow-up per completed fetch", parse_total == fetch.completed),
        (
            "each batch ran again once, after all its fetches ended",
            joined == batches && shared.early_joins.load(Ordering::Relaxed) == 0,
        ),
        ("leadership changed hands", leader_changes >= 1),
    ];
    let ok = checks.iter().all(|(_, pass)| *pass);
    let summary = json!({
        "backend": backend,
        "seconds": started.elapsed().as_secs_f64(),
        "leader_kills": kills, "clean_stops": clean_stops, "agent_kills": agent_kills,
        "leadership_terms_seen": leader_changes,
        "lock_acquisitions": fences.len(),
        "tasks": all, "handler_runs": shared.handler_runs.load(Ordering::Relaxed),
        "checks": checks.iter().map(|(name, pass)| json!({"check": name, "pass": pass})).collect::<Vec<_>>(),
        "ok": ok,
    });
    if json {
        println!("{summary}");
    } else {
        println!("\nmongocoord demo on {backend}: {:.1} s", started.elapsed().as_secs_f64());
        println!("  {kills} leader kills, {clean_stops} clean stops, {agent_kills} agent kills, {leader_changes} leadership terms seen");
        println!(
            "  {} lock acquisitions, {all} tasks ({} handler runs)",
            fences.len(),
            shared.handler_runs.load(Ordering::Relaxed)
        );
        for (name, pass) in &checks {
            println!("  [{}] {name}", if *pass { "ok" } else { "FAILED" });
        }
    }
    Ok(if ok { 0 } else { 1 })
}

fn short(owner: &str) -> String {
    // host/pid/instance/seq → instance/seq
    let parts: Vec<&str> = owner.split('/').collect();
    if parts.len() >= 4 {
        format!("{}/{}", parts[2], parts[3])
    } else {
        owner.to_owned()
    }
}
