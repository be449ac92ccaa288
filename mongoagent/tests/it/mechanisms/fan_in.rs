//! Fan-in: the wake-up of a waiting task, once per round, and a fan-in step no
//! cancel interrupts.

use super::*;
use store_test::Partitionable;

/// Fan-in conditional wake: the wake-up is conditional on the round the task
/// waits on. A follow-up of round 0 whose agent died after recording its outcome
/// and before telling the waiter is finished later by whoever claims it; by
/// then the waiter woke itself (it counts too), ran round 1 and waits on a new
/// follow-up. That late wake-up for round 0 must not wake it.
#[tokio::test(start_paused = true)]
async fn a_late_wake_up_for_an_earlier_round_wakes_nobody() {
    let store = MemoryStore::new();
    store
        .insert_many(
            &coll(),
            vec![
                doc! {"_id": "job", "agent_name": "split", "ready": false, "round": 1_i64, "waiting": 1_i64},
                doc! {"_id": "job/0", "agent_name": "count", "ready": true, "join": "job", "join_round": 0_i64},
                doc! {"_id": "job@1/0", "agent_name": "count", "ready": false, "join": "job", "join_round": 1_i64},
            ],
        )
        .await
        .unwrap();
    // The dead agent's claim on job/0, with its outcome recorded.
    let dead = store_trait::Claim {
        query: store_trait::Query::eq(doc! {"_id": "job/0"}),
        mutation: store_trait::Mutation::new()
            .grant("dead-agent", store_trait::Ttl::new(Duration::from_secs(2)).unwrap())
            .bump_fence()
            .set("ready", false)
            .set("claimed", true)
            .set("complete", true)
            .set("error_encountered", false),
    };
    assert!(store.claim(&coll(), &dead).await.unwrap().is_some());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let recover = Agent::builder(store.client(), "count", "tasks")
        .poll_interval(Duration::from_secs(3600))
        .process_while(|l| l.recovered < 1)
        .build()
        .unwrap();
    let log = tokio::time::timeout(Duration::from_secs(60), recover.work(|_t: Task| async { true }))
        .await
        .expect("the dead agent's step is finished")
        .unwrap();
    assert_eq!((log.recovered, log.tasks_processed), (1, 0));
    let d = data(&store, &Key::new("job").unwrap()).await;
    assert_eq!((d.get_i64("waiting").ok(), d.get_bool("ready").unwrap()), (Some(1), false), "still waits: {d}");
    let split = Agent::builder(store.client(), "split", "tasks").build().unwrap();
    assert!(split.process(|_t: Task| async { true }).await.unwrap().is_none(), "not ready while round 1 is open");
}

/// Cancel leaves a fan-in step to its agents: neither a task waiting for its
/// follow-ups nor a follow-up something waits for is cancelled. A cancelled
/// last follow-up would end without telling its waiter, which would wait for
/// ever; a cancelled waiter would still be woken by its follow-ups.
#[tokio::test(start_paused = true)]
async fn a_fan_in_step_is_not_cancelled() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("split", doc! {}).id("job")).await.unwrap();
    let split = Agent::builder(store.clone(), "split", "tasks").build().unwrap();
    let part = Agent::builder(store.clone(), "part", "tasks").build().unwrap();
    let split_job = |t: Task| async move {
        match t.round() {
            0 => Outcome::done().follow_up(NewTask::new("part", doc! {})).wait_for_follow_ups(),
            _ => Outcome::done(),
        }
    };
    let job = Key::new("job").unwrap();
    assert_eq!(split.process(split_job).await.unwrap(), Some(Processed::Waiting(job.clone())));
    assert!(q.cancel(doc! {}).dry_run(true).await.unwrap().is_empty(), "nothing to cancel");
    assert!(q.cancel(doc! {}).await.unwrap().is_empty());
    assert!(part.process(|_t: Task| async { true }).await.unwrap().is_some());
    assert_eq!(split.process(split_job).await.unwrap(), Some(Processed::Completed(job)));
}
