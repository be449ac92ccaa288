//! The cluster-wide limits of an agent name, on every backend: the global
//! concurrency checked over a history of runs (start and end of every handler
//! run, with its claim's fence) while agents crash and restart, and the rate
//! limit over a simulated hour.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, AgentCounters, NewTask, Outcome, Queue, Task};
use store_trait::Store;
use tokio::time::Instant;

/// One handler run: its task, its claim's fence, when it started and ended
/// (tokio's clock: the memory store's clock under paused time; one process's
/// monotonic clock on the real server).
#[derive(Debug, Clone)]
struct Run {
    task: String,
    fence: u64,
    start: Instant,
    end: Option<Instant>,
}

#[derive(Default)]
struct History(Mutex<Vec<Run>>);

/// Records a run's end when dropped: also when the handler is aborted (its
/// process crashed).
struct Span(Arc<History>, usize);

impl Drop for Span {
    fn drop(&mut self) {
        self.0 .0.lock().unwrap()[self.1].end = Some(Instant::now());
    }
}

impl History {
    fn open(self: &Arc<Self>, t: &Task) -> Span {
        let mut runs = self.0.lock().unwrap();
        runs.push(Run { task: t.id().to_string(), fence: t.fence(), start: Instant::now(), end: None });
        Span(self.clone(), runs.len() - 1)
    }

    /// The most runs that were running at one instant (an end before a start
    /// at the same instant), with the runs at that moment.
    fn max_overlap(&self) -> (usize, Vec<Run>) {
        let runs = self.0.lock().unwrap().clone();
        let mut edges: Vec<(Instant, u8, usize)> = Vec::new();
        for (i, r) in runs.iter().enumerate() {
            edges.push((r.start, 1, i));
            edges.push((r.end.expect("every run ended"), 0, i));
        }
        edges.sort();
        let (mut open, mut worst): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
        for (_, kind, i) in edges {
            if kind == 1 {
                open.push(i);
                if open.len() > worst.len() {
                    worst = open.clone();
                }
            } else {
                open.retain(|&j| j != i);
            }
        }
        (worst.len(), worst.into_iter().map(|i| runs[i].clone()).collect())
    }

    /// Runs of one task never overlap, and a later run has a newer fence.
    fn check_fences(&self) {
        let mut runs = self.0.lock().unwrap().clone();
        runs.sort_by(|a, b| (&a.task, a.start).cmp(&(&b.task, b.start)));
        for w in runs.windows(2) {
            if w[0].task == w[1].task {
                assert!(w[0].end.unwrap() <= w[1].start && w[0].fence < w[1].fence, "overlapping runs: {w:#?}");
            }
        }
    }
}

fn handler(
    history: Arc<History>,
) -> impl Fn(Task) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>> {
    move |t: Task| {
        let history = history.clone();
        Box::pin(async move {
            let _span = history.open(&t);
            let work = Duration::from_millis(100 + 37 * (t.fence() % 7));
            tokio::select! {
                _ = tokio::time::sleep(work) => Outcome::done(),
                // The claim or the permit was lost: stop before another can start.
                _ = t.cancellation().cancelled() => Outcome::failed("cancelled"),
            }
        })
    }
}

/// How a test crashes an agent's process: `crash(i)` stops worker `i` abruptly.
type Crash = Box<dyn Fn(usize) + Send + Sync>;

/// Three agents with a global concurrency of two (each alone could run three)
/// process 30 tasks while they crash and restart; the history of runs never
/// has three at once, and does have two.
async fn global_concurrency_holds<O: Store + Clone, S: Store + Clone>(
    observer: O,
    stores: Vec<S>,
    restart: impl Fn(usize) -> S,
    crash: Crash,
    ttl: Duration,
) {
    let q = Queue::new(observer, "tasks").unwrap();
    let n = 30;
    let tasks: Vec<_> = (0..n).map(|i| NewTask::new("w", doc! { "i": i64::try_from(i).unwrap() })).collect();
    q.enqueue_all(&tasks).await.unwrap();
    let history = Arc::new(History::default());
    let spawn = |s: S| {
        let a = Agent::builder(s, "w", "tasks")
            .ttl(ttl)
            .concurrency(3)
            .global_concurrency(2)
            .max_attempts(100)
            .backoff(Duration::from_millis(50), Duration::from_millis(100))
            .poll_interval(Duration::from_millis(200))
            .build()
            .unwrap();
        let h = handler(history.clone());
        tokio::spawn(async move { a.work(h).await.unwrap_or_default() })
    };
    let mut workers: Vec<tokio::task::JoinHandle<AgentCounters>> = stores.into_iter().map(&spawn).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut crashes = 0;
    while q.stats("w").await.unwrap().completed < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(450)).await;
        if crashes < 6 {
            let i = crashes % 3;
            crash(i);
            workers[i].abort();
            let _ = (&mut workers[i]).await;
            workers[i] = spawn(restart(i));
            crashes += 1;
        }
    }
    for w in &workers {
        w.abort();
    }
    for w in workers {
        let _ = w.await;
    }
    assert_eq!(q.stats("w").await.unwrap().completed, n, "every task completed");
    history.check_fences();
    let (most, at_once) = history.max_overlap();
    assert!(most <= 2, "{most} tasks ran at once under a global concurrency of 2: {at_once:#?}");
    assert_eq!(most, 2, "the limit was reached (else this test checks nothing)");
}

/// Starts of three agents sharing a limit of `n` per `per`, for `run_for`:
/// no window of `per` holds more than `n`, and the agents started nearly as
/// many as the limit allows (a burst waits, it does not fail).
///
/// Starts are read on the store's clock when the handler starts, a little
/// after the start's write: on the real server that delay varies by a few
/// milliseconds, which `slack` allows.
async fn rate_limit_holds<S: Store + Clone>(store: S, n: u32, per: Duration, run_for: Duration, slack_ms: i64) {
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let periods = u32::try_from(run_for.as_millis() / per.as_millis()).unwrap();
    let total = i64::from(n * (periods + 2));
    let tasks: Vec<_> = (0..total).map(|i| NewTask::new("r", doc! { "i": i })).collect();
    q.enqueue_all(&tasks).await.unwrap();
    let starts = Arc::new(Mutex::new(Vec::<i64>::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut workers = Vec::new();
    for _ in 0..3 {
        let a = Agent::builder(store.clone(), "r", "tasks")
            .concurrency(4)
            .rate_limit(n, per)
            .shutdown_on(&stop)
            .build()
            .unwrap();
        let (starts, s) = (starts.clone(), store.clone());
        workers.push(tokio::spawn(async move {
            a.work(move |_t: Task| {
                let (starts, s) = (starts.clone(), s.clone());
                async move {
                    // On the store's clock: the limit is enforced on it.
                    let now = s.now().await.unwrap().as_millis();
                    starts.lock().unwrap().push(now);
                    true
                }
            })
            .await
            .unwrap()
        }));
    }
    tokio::time::sleep(run_for).await;
    stop.cancel();
    for w in workers {
        w.await.unwrap();
    }
    let mut at = starts.lock().unwrap().clone();
    at.sort_unstable();
    let (n_us, per_ms) = (usize::try_from(n).unwrap(), i64::try_from(per.as_millis()).unwrap());
    for w in at.windows(n_us + 1) {
        assert!(
            w[n_us] - w[0] >= per_ms - slack_ms,
            "{} starts within {} ms (limit {n} per {per_ms} ms): {w:?} of {}",
            n + 1,
            w[n_us] - w[0],
            at.len()
        );
    }
    // Every full period started its `n` (the last may be cut short).
    let allowed = usize::try_from(n * (periods - 1)).unwrap();
    assert!(
        at.len() >= allowed,
        "{} starts in {run_for:?}, the limit allows {allowed}: bursts waited too long",
        at.len()
    );
}

mod memory {
    use super::*;
    use store_memory::MemoryStore;
    use store_test::Partitionable;

    #[tokio::test(start_paused = true)]
    async fn global_concurrency_across_crashes_and_restarts() {
        global_concurrency_crashes(MemoryStore::new()).await;
    }

    /// A crash: cut off from the store, then the process is gone (its
    /// handlers with it); its permits and claims lapse with their leases.
    pub(super) async fn global_concurrency_crashes(store: MemoryStore) {
        let clients: Arc<Mutex<Vec<store_test::Client>>> =
            Arc::new(Mutex::new((0..3).map(|_| store.client()).collect()));
        let first = clients.lock().unwrap().clone();
        let crash_clients = clients.clone();
        let crash: Crash = Box::new(move |i| crash_clients.lock().unwrap()[i].set_partitioned(true));
        let restart = |i: usize| {
            let c = store.client();
            clients.lock().unwrap()[i] = c.clone();
            c
        };
        global_concurrency_holds(store.clone(), first, restart, crash, Duration::from_secs(2)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limit_holds_over_a_simulated_hour() {
        rate_limit_holds(MemoryStore::new(), 10, Duration::from_secs(60), Duration::from_secs(3600), 0).await;
    }
}

mod memory_polling {
    use super::*;
    use store_memory::MemoryStore;

    #[tokio::test(start_paused = true)]
    async fn global_concurrency_across_crashes_and_restarts() {
        super::memory::global_concurrency_crashes(MemoryStore::builder().change_streams(false).build()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limit_holds_over_a_simulated_hour() {
        let store = MemoryStore::builder().change_streams(false).build();
        rate_limit_holds(store, 10, Duration::from_secs(60), Duration::from_secs(3600), 0).await;
    }
}

/// A global concurrency that never binds leaves every agent working: four
/// agents on one `Queue` under a limit of 1,000 each run tasks (none is left
/// idle for want of a permit), and every task runs once.
async fn a_limit_that_never_binds_idles_nobody<S: Store + Clone>(store: S, tasks: usize) {
    let q = Queue::new(store.clone(), "never_binds").unwrap();
    let docs: Vec<NewTask> = (0..tasks).map(|n| NewTask::new("w", doc! {}).id(format!("t{n:04}"))).collect();
    q.enqueue_all(&docs).await.unwrap();
    let agents: Vec<Agent<S>> =
        (0..4).map(|_| Agent::on_queue(&q, "w").concurrency(4).global_concurrency(1000).build().unwrap()).collect();
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut runs = Vec::new();
    for a in &agents {
        let (a, done) = (a.clone(), done.clone());
        runs.push(tokio::spawn(async move {
            a.work(move |_t: Task| {
                let done = done.clone();
                async move {
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Outcome::done()
                }
            })
            .await
        }));
    }
    let started = Instant::now();
    while done.load(std::sync::atomic::Ordering::SeqCst) < tasks {
        assert!(started.elapsed() < Duration::from_secs(120), "not done in 2 minutes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for a in &agents {
        a.shutdown();
    }
    let mut per_agent = Vec::new();
    for r in runs {
        per_agent.push(r.await.unwrap().unwrap().completed);
    }
    assert_eq!(per_agent.iter().sum::<u64>(), tasks as u64, "{per_agent:?}");
    let least = (tasks / 16) as u64;
    assert!(per_agent.iter().all(|&n| n >= least), "an agent was left idle: {per_agent:?}");
}

mod memory_never_binds {
    use super::*;
    use store_memory::MemoryStore;

    #[tokio::test(start_paused = true)]
    async fn a_limit_that_never_binds_idles_nobody() {
        let store = MemoryStore::new();
        store.faults().set_latency(Duration::from_millis(1));
        super::a_limit_that_never_binds_idles_nobody(store, 200).await;
    }
}

mod mongo {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_limit_that_never_binds_idles_nobody() {
        let Some(store) = store_test::mongo::test_store("ag_limits_never_binds").await else { return };
        super::a_limit_that_never_binds_idles_nobody(store, 160).await;
    }

    /// On the real server a crash is the process's tasks dropped at once
    /// (their claims and permits are given back in the background).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn global_concurrency_across_crashes_and_restarts() {
        let Some(store) = store_test::mongo::test_store("ag_limits_global").await else { return };
        let s = store.clone();
        global_concurrency_holds(
            store.clone(),
            vec![store.clone(), store.clone(), store],
            move |_| s.clone(),
            Box::new(|_| {}),
            Duration::from_secs(2),
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rate_limit_holds() {
        let Some(store) = store_test::mongo::test_store("ag_limits_rate").await else { return };
        super::rate_limit_holds(store, 4, Duration::from_secs(2), Duration::from_secs(8), 250).await;
    }
}
