//! Pausing an agent name: seen by notification, or within `CONTROL_REFRESH`
//! without one; before every claim; and what wakes a paused agent.

use super::*;

/// The pause view wakes an idle agent only when its own name's pause state
/// changed (`work.rs`), not at the view's first read (the control task
/// starts when the agent goes idle alone) or for another name's pause: each
/// of those was a claim that found nothing.
#[tokio::test(start_paused = true)]
async fn the_pause_view_wakes_an_idle_agent_only_for_its_own_pause() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let counted = Counted::new(store.clone());
    let agent = Agent::builder(counted.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let (run, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The claims before sleeping: the first, once the idle watch is open,
    // once the idle deadline is read; each of ready tasks, then of lapsed ones.
    assert_eq!(counted.claims.load(Ordering::SeqCst), 6);
    queue.set_paused("other", true).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(counted.claims.load(Ordering::SeqCst), 6, "another name's pause woke it");
    queue.set_paused("w", true).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    queue.set_paused("w", false).await.unwrap();
    queue.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), ran.notified()).await.expect("runs after the resume");
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1);
}

/// A pause is seen within `CONTROL_REFRESH` of being written, whatever the
/// control collection's notifications do (`control.rs`). Here they stall:
/// the subscription opens, then says nothing. The control task reads the
/// paused names again when no notification made it read for a while, so an
/// idle agent learns of a resume; and an agent trusts the task's view only
/// while its read is younger than `CONTROL_REFRESH`, so one woken for a new
/// task while that read hangs reads its own document, and claims nothing
/// while paused; and each read is published, changed or not, so an agent
/// that learned of the pause by its own read wakes at the resume. Without the
/// rereads, or without publishing an unchanged read, the resumed agent sleeps
/// through its 600 s poll; without the age check it claims while paused.
#[tokio::test(start_paused = true)]
async fn a_pause_is_seen_though_its_notifications_stall() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let held = HoldBack::new(store.clone());
    held.stall_watches("tasks_control");
    let agent = Agent::builder(held.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let (run, ran) = work_signalling(&agent);
    let runs = |within: u64| tokio::time::timeout(Duration::from_secs(within), ran.notified());
    tokio::time::sleep(Duration::from_secs(5)).await;
    queue.set_paused("w", true).await.unwrap();
    tokio::time::sleep(CONTROL_REFRESH).await;
    queue.enqueue(NewTask::new("w", doc! {"n": 1})).await.unwrap();
    assert!(runs(5).await.is_err(), "claimed while paused");
    queue.set_paused("w", false).await.unwrap();
    runs(5).await.expect("runs after the resume");
    // Idle again (a new control task has read), then paused while the
    // task's next read hangs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    held.hold_next(|c, op| {
        c.as_str() == "tasks_control" && matches!(op, Op::Find(q) if q.filter.contains_key("paused"))
    });
    held.reached().await;
    queue.set_paused("w", true).await.unwrap();
    tokio::time::sleep(CONTROL_REFRESH).await;
    queue.enqueue(NewTask::new("w", doc! {"n": 2})).await.unwrap();
    assert!(runs(5).await.is_err(), "claimed while paused, on a view too old to trust");
    queue.set_paused("w", false).await.unwrap();
    held.open();
    runs(5).await.expect("runs after the resume");
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 2);
}

/// Agents sharing a `Queue` take turns claiming; each reads the pause state
/// once it is its turn (`claim.rs`), not before waiting for it. Here agent A's
/// claim is held back two seconds while B waits its turn, and the name is
/// paused meanwhile: B, whose read before waiting said "not paused", claims
/// nothing. Checked before the wait, B claims a task two seconds after the
/// pause.
#[tokio::test(start_paused = true)]
async fn a_claim_that_waited_its_turn_sees_a_pause_written_meanwhile() {
    let store = MemoryStore::new();
    let held = HoldBack::new(store.clone());
    let queue = Queue::new(held.clone(), "tasks").unwrap();
    queue.enqueue_all(&[NewTask::new("w", doc! {"n": 1}), NewTask::new("w", doc! {"n": 2})]).await.unwrap();
    let a = Agent::on_queue(&queue, "w").build().unwrap();
    let b = Agent::on_queue(&queue, "w").build().unwrap();
    held.hold_next(|_, op| matches!(op, Op::Claim(c) if c.query.filter.get_bool("ready").is_ok_and(|r| r)));
    let first = tokio::spawn(async move { a.process(|_: Task| async { true }).await });
    held.reached().await;
    let second = tokio::spawn(async move { b.process(|_: Task| async { true }).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    queue.set_paused("w", true).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    held.open();
    assert!(first.await.unwrap().unwrap().is_some(), "A's claim was sent before the pause");
    assert_eq!(second.await.unwrap().unwrap(), None, "B claimed two seconds after the pause");
}

/// The control collection also holds permits and rate limits, written at
/// every task start: those writes cost an idle agent's subscription no read
/// and wake nobody (a wake-up would make an idle agent probe for a permit,
/// which writes to the control collection again: a loop). A pause still is
/// read.
#[tokio::test(start_paused = true)]
async fn control_writes_not_about_a_pause_cost_an_idle_agent_nothing() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").poll_interval(Duration::from_secs(60)).build().unwrap();
    let worker = tokio::spawn({
        let agent = agent.clone();
        async move { agent.work(|_t: Task| async { true }).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let control = q.control_collection().unwrap();
    let before = store.operation_count();
    for i in 0..20 {
        let w = Write::new(Condition::Always, store_trait::Mutation::new().set("n", i)).upsert();
        let key = Key::new(format!("permits:w:{}", i % 3)).unwrap();
        assert!(store.write(&control, &key, &w).await.unwrap().is_applied());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.operation_count() - before, 20, "only the writes themselves");
    // A pause document written without changing the paused names is read,
    // and wakes nobody.
    let before = store.operation_count();
    for _ in 0..5 {
        q.set_paused("other", false).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(store.operation_count() - before, 10, "each write and one read after it");
    q.set_paused("w", true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(store.operation_count() - before >= 12, "a change of the paused names is read");
    agent.shutdown();
    worker.await.unwrap().unwrap();
}

/// Pause delivery by change notification: an idle agent, which has read "not
/// paused" a moment ago, sees a pause as soon as the queue's control task has
/// read it after the notification (well within `CONTROL_REFRESH`), so a task
/// arriving then is not claimed; the resume wakes it at once (its poll interval
/// is a minute) and it claims the task.
#[tokio::test(start_paused = true)]
async fn a_pause_arrives_by_notification_and_a_resume_wakes_the_agent() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").poll_interval(Duration::from_secs(60)).build().unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let worker = tokio::spawn({
        let (agent, done) = (agent.clone(), done.clone());
        async move {
            agent
                .work(move |_t: Task| {
                    let done = done.clone();
                    async move {
                        done.fetch_add(1, Ordering::SeqCst);
                        true
                    }
                })
                .await
        }
    });
    let settle = || tokio::time::sleep(Duration::from_millis(20));
    settle().await;
    q.set_paused("w", true).await.unwrap();
    settle().await;
    q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    settle().await;
    assert_eq!(done.load(Ordering::SeqCst), 0, "the pause was seen before the task arrived");
    q.set_paused("w", false).await.unwrap();
    settle().await;
    assert_eq!(done.load(Ordering::SeqCst), 1, "the resume woke the idle agent");
    agent.shutdown();
    assert_eq!(worker.await.unwrap().unwrap().completed, 1);
}

/// After a pause, an insert's keyed claim that misses does not send the agent
/// back to sleep (`Woken`, `was_paused` in `claim.rs`): the claims while
/// paused saw nothing, so the tasks enqueued meanwhile are claimed at the
/// resume, whichever reaches the agent first, the resume or an insert. Here
/// the insert is of a task not yet due (its keyed claim misses); without
/// the rule, when the insert comes first, the task enqueued during the pause
/// waits for the 600 s poll. Repeated, since which comes first is the
/// runtime's choice.
#[tokio::test(start_paused = true)]
async fn tasks_enqueued_during_a_pause_run_at_the_resume() {
    for round in 0..12 {
        let store = MemoryStore::new();
        let queue = Queue::new(store.clone(), "tasks").unwrap();
        let agent =
            Agent::builder(store.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
        let (run, ran) = work_signalling(&agent);
        tokio::time::sleep(Duration::from_secs(1)).await;
        queue.set_paused("w", true).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        queue.enqueue(NewTask::new("w", doc! {"during": true})).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        queue.set_paused("w", false).await.unwrap();
        queue.enqueue(NewTask::new("w", doc! {}).delay(Duration::from_secs(3600))).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), ran.notified())
            .await
            .unwrap_or_else(|_| panic!("round {round}: the task enqueued during the pause waits"));
        agent.shutdown();
        assert_eq!(run.await.unwrap().unwrap().completed, 1);
    }
}
