//! Claims ahead of free slots (`agent/ahead.rs`): when an agent claims ahead,
//! and what becomes of the tasks it claimed ahead.

use super::*;
use store_test::Partitionable;

/// Claims ahead of free slots (`ahead.rs`): a busy agent with short tasks
/// and a backlog (more ready than its list's window of 64) claims more than
/// its free slots and starts them as slots free, so it claims at most two
/// thirds as often as with `prefetch(0)`; every task runs once.
#[tokio::test(start_paused = true)]
async fn a_busy_agent_with_short_tasks_claims_ahead() {
    let mut claims = Vec::new();
    for prefetch in [None, Some(0)] {
        let (_, calls) = busy_queue(256).await;
        let mut b = Agent::builder(calls.clone(), "w", "tasks")
            .concurrency(4)
            .poll_interval(Duration::from_secs(60))
            .process_while(|l| l.completed < 256);
        if let Some(n) = prefetch {
            b = b.prefetch(n);
        }
        let log = b.build().unwrap().work(|_t: Task| async { true }).await.unwrap();
        assert_eq!((log.completed, log.tasks_processed), (256, 256), "prefetch {prefetch:?}");
        let asked = calls.asked_max.load(Ordering::SeqCst);
        assert_eq!(asked > 4, prefetch.is_none(), "prefetch {prefetch:?}: a claim asked for {asked}");
        claims.push(calls.claims.load(Ordering::SeqCst));
    }
    assert!(claims[0] * 3 <= claims[1] * 2, "claims with prefetch and without: {claims:?}");
}

/// Nothing is claimed ahead of tasks that run long (`ahead::SHORT_RUN`): a
/// task claimed ahead would wait a long run, while an idle peer could run it.
#[tokio::test(start_paused = true)]
async fn long_tasks_are_not_claimed_ahead() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue_all(&(0..24).map(|n| NewTask::new("w", doc! { "n": n })).collect::<Vec<_>>()).await.unwrap();
    let calls = Counted::new(store.clone());
    let log = Agent::builder(calls.clone(), "w", "tasks")
        .concurrency(4)
        .poll_interval(Duration::from_secs(60))
        .process_while(|l| l.completed < 24)
        .build()
        .unwrap()
        .work(|_t: Task| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            true
        })
        .await
        .unwrap();
    assert_eq!(log.completed, 24);
    assert_eq!(calls.asked_max.load(Ordering::SeqCst), 4, "no claim asked for more than the free slots");
}

/// A stopping agent runs the tasks it claimed ahead in its drain, as slots
/// free: none is left claimed, and each ran once.
#[tokio::test(start_paused = true)]
async fn a_stopping_agent_runs_the_tasks_it_claimed_ahead() {
    let (store, calls) = busy_queue(200).await;
    let agent = Agent::builder(calls.clone(), "w", "tasks")
        .concurrency(4)
        .poll_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let run = tokio::spawn({
        let agent = agent.clone();
        async move {
            agent
                .work(|_t: Task| async {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    true
                })
                .await
        }
    });
    // Stop once claims ahead happen (a claim asked for more than four).
    let ahead = async {
        while calls.asked_max.load(Ordering::SeqCst) <= 4 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), ahead).await.expect("no claim ahead within 10 s");
    tokio::time::sleep(Duration::from_millis(7)).await;
    agent.shutdown();
    let log = run.await.unwrap().unwrap();
    let c = Collection::new("tasks").unwrap();
    let all = store.find(&c, &Query::all()).await.unwrap();
    let done = all.iter().filter(|r| r.data().get_bool("complete").unwrap_or(false)).count();
    let held = all
        .iter()
        .filter(|r| r.data().get_bool("claimed").unwrap_or(false) && !r.data().get_bool("complete").unwrap_or(false))
        .count();
    assert_eq!(held, 0, "a task claimed and not run");
    assert_eq!(u64::try_from(done).unwrap(), log.completed);
    assert_eq!(log.tasks_processed, log.completed);
    assert!(done > 8 && done < 200, "{done} done");
}

/// Nothing is claimed ahead without a backlog (fewer ready tasks than a list's
/// window of 64, as at the end of a burst): idle peers share the last tasks.
#[tokio::test(start_paused = true)]
async fn without_a_backlog_nothing_is_claimed_ahead() {
    let (_, calls) = busy_queue(40).await;
    let log = Agent::builder(calls.clone(), "w", "tasks")
        .concurrency(4)
        .poll_interval(Duration::from_secs(60))
        .process_while(|l| l.completed < 40)
        .build()
        .unwrap()
        .work(|_t: Task| async { true })
        .await
        .unwrap();
    assert_eq!(log.completed, 40);
    assert_eq!(calls.asked_max.load(Ordering::SeqCst), 4, "no claim asked for more than the free slots");
}

/// An agent stopped by `process_while` gives back the tasks it claimed ahead,
/// unstarted, instead of running them past what it was asked for; another
/// agent then runs every task left, each once.
#[tokio::test(start_paused = true)]
async fn process_while_gives_back_the_tasks_claimed_ahead() {
    for stop_at in [100_u64, 101, 102, 103] {
        let (store, calls) = busy_queue(256).await;
        let first = Agent::builder(calls.clone(), "w", "tasks")
            .concurrency(4)
            .poll_interval(Duration::from_secs(60))
            .process_while(move |l| l.completed < stop_at)
            .build()
            .unwrap()
            .work(|_t: Task| async { true })
            .await
            .unwrap();
        assert!(calls.asked_max.load(Ordering::SeqCst) > 4, "claims ahead happened");
        // At the stop, at most the four tasks in flight finish.
        assert!(first.tasks_processed < stop_at + 4, "stop at {stop_at}: {} run", first.tasks_processed);
        let rest = 256 - first.completed;
        // A task given back unstarted was not tried: its next run is its first attempt.
        let retried = Arc::new(AtomicU64::new(0));
        let second = Agent::builder(store.clone(), "w", "tasks")
            .concurrency(4)
            .poll_interval(Duration::from_secs(60))
            .process_while(move |l| l.completed < rest)
            .build()
            .unwrap()
            .work({
                let retried = retried.clone();
                move |t: Task| {
                    if t.attempt() != 1 {
                        retried.fetch_add(1, Ordering::SeqCst);
                    }
                    async { true }
                }
            })
            .await
            .unwrap();
        assert_eq!((first.tasks_processed + second.tasks_processed, first.completed + second.completed), (256, 256));
        assert_eq!(retried.load(Ordering::SeqCst), 0, "stop at {stop_at}: tasks given back ran as later attempts");
    }
}

/// A task claimed ahead whose claim was lost before a slot freed is let go,
/// never started: another agent may hold it by then. The agent is cut off
/// from the store past its lease while its four slots are busy; the running
/// handlers see the loss and return, and none of the tasks it had claimed
/// ahead starts under its lost claim.
#[tokio::test(start_paused = true)]
async fn a_task_claimed_ahead_whose_claim_was_lost_never_starts() {
    let store = MemoryStore::new();
    store.faults().set_latency(Duration::from_millis(5));
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue_all(&(0..200).map(|n| NewTask::new("w", doc! { "n": n })).collect::<Vec<_>>()).await.unwrap();
    let client = store.client();
    let agent = Agent::builder(client.clone(), "w", "tasks")
        .concurrency(4)
        .ttl(Duration::from_secs(3))
        .poll_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let (runs, lost_at_start) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let handler = {
        let (runs, lost_at_start) = (runs.clone(), lost_at_start.clone());
        move |t: Task| {
            let (runs, lost_at_start) = (runs.clone(), lost_at_start.clone());
            async move {
                if t.cancellation().is_cancelled() {
                    lost_at_start.fetch_add(1, Ordering::SeqCst);
                }
                // From the 21st run on, each holds its slot until its claim is lost.
                if runs.fetch_add(1, Ordering::SeqCst) >= 20 {
                    t.cancellation().cancelled().await;
                }
                true
            }
        }
    };
    let work = tokio::spawn({
        let agent = agent.clone();
        async move { agent.work(handler).await }
    });
    while runs.load(Ordering::SeqCst) < 24 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let claimed = Query::eq(doc! { "claimed": true }).when(Condition::FieldEq("complete".into(), true.into()).negate());
    let held = store.count(&coll(), &claimed).await.unwrap();
    assert!(held > 4, "{held} claimed: none claimed ahead of the four running");
    client.set_partitioned(true);
    tokio::time::sleep(Duration::from_secs(10)).await;
    agent.shutdown();
    work.await.unwrap().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 24, "a task claimed ahead started under a lost claim");
    assert_eq!(lost_at_start.load(Ordering::SeqCst), 0);
}
