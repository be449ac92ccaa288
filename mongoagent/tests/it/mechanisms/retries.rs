//! Retries: attempts counted per round, a task's own attempt limit, the
//! backoff.

use super::*;

/// Attempts count the claims of a round: waiting for follow-ups is no failure,
/// so a new round has its full `max_attempts`; a requeued task starts over too.
#[tokio::test(start_paused = true)]
async fn attempts_count_per_round_and_start_over_on_requeue() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("job", doc! {}).id("j")).await.unwrap();
    let job = Agent::builder(store.clone(), "job", "tasks").max_attempts(2).build().unwrap();
    let part = Agent::builder(store.clone(), "part", "tasks").build().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = {
        let seen = seen.clone();
        move |t: Task| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push((t.round(), t.attempt()));
                if t.round() == 0 {
                    Outcome::done().follow_up(NewTask::new("part", doc! {})).wait_for_follow_ups()
                } else {
                    Outcome::failed("once more")
                }
            }
        }
    };
    assert!(matches!(job.process(handler.clone()).await.unwrap(), Some(Processed::Waiting(_))));
    assert!(matches!(part.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
    // The first claim of round 1 is its attempt 1 of 2: retried, not failed for good.
    assert!(matches!(job.process(handler.clone()).await.unwrap(), Some(Processed::Retried(_))));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(matches!(job.process(handler.clone()).await.unwrap(), Some(Processed::Failed(_))));
    assert_eq!(q.requeue(doc! {"agent_name": "job"}).await.unwrap().len(), 1);
    assert!(matches!(job.process(handler.clone()).await.unwrap(), Some(Processed::Retried(_))));
    assert_eq!(*seen.lock().unwrap(), [(0, 1), (1, 1), (1, 2), (1, 1)]);
}

/// A task's own attempt limit overrides the agent's: a task enqueued with
/// `max_attempts(2)` fails for good at its second failed attempt under an
/// agent that allows five.
#[tokio::test(start_paused = true)]
async fn a_tasks_own_attempt_limit_overrides_the_agents() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {}).max_attempts(2)).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").max_attempts(5).build().unwrap();
    let fail = |_t: Task| async { Outcome::failed("boom") };
    assert_eq!(agent.process(fail).await.unwrap(), Some(Processed::Retried(id.clone())));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(agent.process(fail).await.unwrap(), Some(Processed::Failed(id)));
}

/// Retries back off exponentially from the base up to the maximum, each delay
/// jittered by ±50%: with a base of 1 s and a maximum of 8 s, the fourth
/// retry waits at least 4 s (8 s − 50%), the sixth less than 12 s (8 s + 50%).
#[tokio::test(start_paused = true)]
async fn retry_delays_double_up_to_the_maximum() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks")
        .max_attempts(10)
        .backoff(Duration::from_secs(1), Duration::from_secs(8))
        .build()
        .unwrap();
    let mut delays = Vec::new();
    for _ in 0..6 {
        let fail = |_t: Task| async { Outcome::failed("boom") };
        assert_eq!(agent.process(fail).await.unwrap(), Some(Processed::Retried(id.clone())));
        let run_at = data(&store, &id).await.get_datetime("run_at").unwrap().timestamp_millis();
        let delay = Duration::from_millis(u64::try_from(run_at - store.now().await.unwrap().as_millis()).unwrap());
        delays.push(delay);
        tokio::time::sleep(delay + Duration::from_millis(1)).await;
    }
    assert!(delays[3] >= Duration::from_secs(4), "the fourth retry waits 8 s ± 50%: {delays:?}");
    assert!(delays[5] < Duration::from_secs(12), "capped at 8 s ± 50%: {delays:?}");
}
