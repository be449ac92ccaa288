//! Permits of a global concurrency, and starts under the rate limit: a lost
//! permit cancels its task, a freed one wakes an idle agent.

use super::*;
use store_test::Partitionable;

/// A stop while a claimed task waits for its start under the rate limit gives
/// the claim back unspent: the handler never ran, so the task's next run is
/// still its first attempt (a give-back must not use up its retries).
#[tokio::test(start_paused = true)]
async fn a_claim_given_back_before_its_rate_start_is_not_an_attempt() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue_all(&(0..3).map(|i| NewTask::new("r", doc! { "i": i })).collect::<Vec<_>>()).await.unwrap();
    let limited = Agent::builder(store.clone(), "r", "tasks")
        .concurrency(3)
        .rate_limit(1, Duration::from_secs(3600))
        .poll_interval(Duration::from_secs(60))
        .build()
        .unwrap();
    let worker = tokio::spawn({
        let a = limited.clone();
        async move { a.work(|_t: Task| async { true }).await.unwrap() }
    });
    // One task starts; the other two are claimed and wait for a start.
    tokio::time::sleep(Duration::from_secs(5)).await;
    limited.shutdown();
    let first = worker.await.unwrap();
    assert_eq!(first.tasks_processed, 1, "the limit lets one task start in the hour");
    // Given back unstarted, they are ready and unclaimed, not shown as lapsed.
    let stats = q.stats("r").await.unwrap();
    assert_eq!((stats.ready, stats.lapsed, stats.completed), (2, 0, 1), "{stats:?}");
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let rest = Agent::builder(store.clone(), "r", "tasks")
        .poll_interval(Duration::from_secs(60))
        .process_while(|l| l.completed < 2)
        .build()
        .unwrap()
        .work({
            let attempts = attempts.clone();
            move |t: Task| {
                attempts.lock().unwrap().push(t.attempt());
                async { true }
            }
        })
        .await
        .unwrap();
    assert_eq!(rest.completed, 2);
    assert_eq!(*attempts.lock().unwrap(), [1, 1], "the claims given back were counted as attempts");
}

/// A task runs under a permit of its name's global concurrency: when the
/// permit's lease is lost (here taken away by a write), the handler's
/// cancellation fires, as for the loss of its claim, before another process
/// could take the permit and start a task beyond the limit.
#[tokio::test(start_paused = true)]
async fn a_lost_permit_cancels_its_task() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent =
        Agent::builder(store.clone(), "w", "tasks").ttl(Duration::from_secs(6)).global_concurrency(1).build().unwrap();
    let started = Arc::new(Notify::new());
    let run = tokio::spawn({
        let (agent, started) = (agent.clone(), started.clone());
        async move {
            // Completes when it saw the cancellation, fails for good when not.
            agent
                .process(move |t: Task| {
                    let started = started.clone();
                    async move {
                        started.notify_one();
                        tokio::time::timeout(Duration::from_secs(30), t.cancellation().cancelled()).await.is_ok()
                    }
                })
                .await
        }
    });
    started.notified().await;
    take_the_permit_away(&store).await;
    assert_eq!(run.await.unwrap().unwrap(), Some(Processed::Completed(id)), "the handler saw its permit's loss");
}

/// Takes the only permit of agent name `w` (global concurrency 1) away from
/// its holder, as another process would find it after a lapse: released, its
/// fence bumped. The holder's next renewal is rejected: the permit is lost.
async fn take_the_permit_away(store: &MemoryStore) {
    let taken = Write::new(Condition::Always, store_trait::Mutation::new().release().bump_fence());
    let permits = Collection::new("tasks_control").unwrap();
    assert!(store.write(&permits, &Key::new("permits:w#0").unwrap(), &taken).await.unwrap().is_applied());
}

/// A permit lost while its task ran is not used again: the agent's next task
/// runs under a fresh permit, its cancellation quiet. Two checks, each enough
/// alone: a task's lost permit is not kept for the next claim
/// (`return_permit`), and a claim takes no lost permit from those kept.
#[tokio::test(start_paused = true)]
async fn a_lost_permit_is_not_used_for_the_next_task() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("w", doc! {}).id("first").priority(1)).await.unwrap();
    q.enqueue(NewTask::new("w", doc! {}).id("second")).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks")
        .ttl(Duration::from_secs(6))
        .global_concurrency(1)
        .process_while(|l| l.tasks_processed < 2)
        .build()
        .unwrap();
    let (started, second_quiet) = (Arc::new(Notify::new()), Arc::new(AtomicUsize::new(0)));
    let handler = {
        let (started, second_quiet) = (started.clone(), second_quiet.clone());
        move |t: Task| {
            let (started, second_quiet) = (started.clone(), second_quiet.clone());
            async move {
                if t.id().to_string() == "first" {
                    started.notify_one();
                    tokio::time::timeout(Duration::from_secs(30), t.cancellation().cancelled()).await.unwrap();
                } else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if !t.cancellation().is_cancelled() {
                        second_quiet.fetch_add(1, Ordering::SeqCst);
                    }
                }
                true
            }
        }
    };
    let work = tokio::spawn({
        let agent = agent.clone();
        async move { agent.work(handler).await }
    });
    started.notified().await;
    take_the_permit_away(&store).await;
    assert_eq!(work.await.unwrap().unwrap().completed, 2);
    assert_eq!(second_quiet.load(Ordering::SeqCst), 1, "the second task ran under the lost permit");
}

/// Under a global concurrency limit an idle agent wakes at every change of
/// its queue, a completion included: a task ending anywhere frees a permit.
/// The only permit is held by another agent's run while a second task waits;
/// when that run ends, the idle agent takes the task at once, not at the
/// claim's lapse (a minute) or its next poll (ten minutes).
#[tokio::test(start_paused = true)]
async fn a_permit_freed_elsewhere_wakes_an_idle_limited_agent() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (first, _) = q.enqueue(NewTask::new("w", doc! {}).priority(1)).await.unwrap();
    q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let limited = || {
        Agent::builder(store.clone(), "w", "tasks")
            .global_concurrency(1)
            .poll_interval(Duration::from_secs(600))
            .build()
            .unwrap()
    };
    let (holder, idle) = (limited(), limited());
    let (held, started, finish) = a_held_run(&holder);
    started.notified().await;
    let (work, ran) = work_signalling(&idle);
    // The idle agent finds no free permit, and idles.
    tokio::time::sleep(Duration::from_secs(1)).await;
    finish.notify_one();
    assert_eq!(held.await.unwrap().unwrap(), Some(Processed::Completed(first)));
    tokio::time::timeout(Duration::from_secs(5), ran.notified()).await.expect("the freed permit is taken at once");
    idle.shutdown();
    assert_eq!(work.await.unwrap().unwrap().completed, 1);
}

/// Under a global limit an idle agent woken by an insert claims as usual after
/// the keyed claim of what was inserted (`Woken::then_claim_as_usual` in
/// `limits.rs`): its last claim may have found no free permit rather than no
/// task. Here the only permit is held by a process that died, so the agent
/// idles with a task of its own ready; the permit lapses (which writes
/// nothing), and a task of another name is inserted: without the usual
/// claim the agent claims nothing and its task waits for the 600 s poll.
#[tokio::test(start_paused = true)]
async fn a_limited_agent_woken_by_another_names_insert_claims_its_own_task() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    // A process takes the permit (10 s lease) and dies: cut off, it never
    // renews nor releases it.
    let dead = store.client();
    let lock =
        mongolock::Lock::builder(dead.clone(), "permits:w").collection("tasks_control").ttl(Duration::from_secs(10));
    let permit = mongolock::Semaphore::new(lock, 1).unwrap().try_acquire().await.unwrap().unwrap();
    dead.set_partitioned(true);
    std::mem::forget(permit);
    q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks")
        .global_concurrency(1)
        .poll_interval(Duration::from_secs(600))
        .build()
        .unwrap();
    let (work, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(11)).await;
    q.enqueue(NewTask::new("other", doc! {})).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), ran.notified()).await.expect("its own task runs at the wake-up");
    agent.shutdown();
    assert_eq!(work.await.unwrap().unwrap().completed, 1);
}
