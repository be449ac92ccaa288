//! Operator actions on tasks: a requeue writes only over what it read, and a
//! cancel racing a completion leaves one final state.

use super::*;

/// Cancel against completion: the cancel's write is conditional on the task
/// not having ended, and it releases the lease and bumps the fence, so the
/// holder's completion is rejected after it. Every interleaving (the cancel
/// started at each millisecond of a run whose store takes a millisecond per
/// call) gives exactly one final state: cancelled, or completed.
#[tokio::test(start_paused = true)]
async fn a_cancel_racing_a_completion_leaves_one_final_state() {
    let (mut cancels_won, mut completions_won) = (0, 0);
    for offset_ms in 0..40_u64 {
        let store = MemoryStore::new();
        store.faults().set_latency(Duration::from_millis(1));
        let q = Queue::new(store.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
        let a = Agent::builder(store.clone(), "w", "tasks").ttl(Duration::from_secs(3)).build().unwrap();
        let run = tokio::spawn(async move {
            a.process(|_t: Task| async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                true
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(offset_ms)).await;
        let cancelled = q.cancel_ids(std::slice::from_ref(&id)).await.unwrap();
        let processed = run.await.unwrap().unwrap();
        let d = data(&store, &id).await;
        assert_eq!(d.get_bool("complete").ok(), Some(true), "offset {offset_ms}: the task ended: {d}");
        let is_cancelled = d.get_bool("cancelled").ok() == Some(true);
        match processed {
            Some(Processed::Completed(_)) => {
                assert!(cancelled.is_empty() && !is_cancelled, "offset {offset_ms}: completed and cancelled: {d}");
                assert_eq!(d.get_bool("error_encountered").ok(), Some(false), "offset {offset_ms}: {d}");
                completions_won += 1;
            }
            Some(Processed::Stale(_)) | None => {
                assert!(cancelled == [id.clone()] && is_cancelled, "offset {offset_ms}: the cancel lost: {d}");
                cancels_won += 1;
            }
            other => panic!("offset {offset_ms}: {other:?}"),
        }
    }
    assert!(cancels_won > 0 && completions_won > 0, "both orders happened: {cancels_won} / {completions_won}");
}

/// Requeue takes tasks failed for good and lapsed ones (claimed by an agent
/// whose lease lapsed), never a running one: its holder's claim is live, and
/// a requeue would take it away and run the task a second time.
#[tokio::test(start_paused = true)]
async fn requeue_leaves_a_running_task_alone() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let (run, started, finish) = a_held_run(&agent);
    started.notified().await;
    assert!(q.requeue(doc! {}).await.unwrap().is_empty(), "a running task is not requeued");
    finish.notify_one();
    assert_eq!(run.await.unwrap().unwrap(), Some(Processed::Completed(id)));
}

/// A requeue writes only over the state it read (`queue.rs`: `FenceIs` the
/// fence read): its attempts start over from that fence. Here operator X read
/// a failed task and its write is held back while operator Y requeues the
/// task, and an agent runs it and it fails again. X's write then finds a task
/// it did not read, and leaves it alone. Without the fence in the condition
/// X revives it, and its next run counts attempts from the fence X read: it
/// starts at attempt 3 of 1.
#[tokio::test(start_paused = true)]
async fn a_requeue_over_a_task_changed_since_it_was_read_is_not_applied() {
    let store = MemoryStore::new();
    let held = HoldBack::new(store.clone());
    let y = Queue::new(store.clone(), "tasks").unwrap();
    let x = Queue::new(held.clone(), "tasks").unwrap();
    let (id, _) = y.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").max_attempts(1).build().unwrap();
    let attempts: Arc<std::sync::Mutex<Vec<u64>>> = Arc::default();
    let failing = || {
        let attempts = attempts.clone();
        move |t: Task| {
            attempts.lock().unwrap().push(t.attempt());
            async { false }
        }
    };
    assert_eq!(agent.process(failing()).await.unwrap(), Some(Processed::Failed(id.clone())));
    held.hold_next(|_, op| matches!(op, Op::Write(w) if w.mutation.set.contains_key("round_fence")));
    let stale = tokio::spawn(async move { x.requeue(doc! {}).await });
    held.reached().await;
    assert_eq!(y.requeue(doc! {}).await.unwrap(), vec![id.clone()]);
    assert_eq!(agent.process(failing()).await.unwrap(), Some(Processed::Failed(id.clone())));
    held.open();
    assert!(stale.await.unwrap().unwrap().is_empty(), "a requeue written over a task it did not read");
    assert_eq!(agent.process(failing()).await.unwrap(), None, "nothing was requeued");
    assert_eq!(*attempts.lock().unwrap(), vec![1, 1], "each round starts at attempt 1");
}
