//! Wake-ups of idle agents: by the changes that make a task of theirs
//! claimable, and by the idle deadline; nothing in between.

use super::*;

/// Wake-ups filtered where the changes happen (`claim::claimable_changes`,
/// `Store::watch_filtered`): an idle agent sleeps through another agent's
/// claims and completions of its own tasks, and still wakes at once for a task
/// of its own. Without the filter every claim and completion wakes it into a
/// claim that finds nothing (about 40 here).
#[tokio::test(start_paused = true)]
async fn an_idle_agent_sleeps_through_other_agents_work() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let tasks: Vec<_> = (0..20_i64).map(|i| NewTask::new("busy", doc! {"i": i})).collect();
    queue.enqueue_all(&tasks).await.unwrap();
    let counted = Counted::new(store.clone());
    let idle =
        Agent::builder(counted.clone(), "idle", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let (idle_run, ran) = work_signalling(&idle);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = counted.claims.load(Ordering::SeqCst);
    let busy = Agent::builder(store.clone(), "busy", "tasks").build().unwrap();
    let busy_run = tokio::spawn({
        let busy = busy.clone();
        async move {
            busy.work(|_t: Task| async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                true
            })
            .await
        }
    });
    for _ in 0..600 {
        if busy.counters().completed >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    busy.shutdown();
    assert_eq!(busy_run.await.unwrap().unwrap().completed, 20);
    let woken = counted.claims.load(Ordering::SeqCst) - before;
    assert_eq!(woken, 0, "claims by the idle agent while another agent worked");
    // A task of its own wakes it at once, long before its 600 s poll.
    let sent = tokio::time::Instant::now();
    queue.enqueue(NewTask::new("idle", doc! {})).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), ran.notified()).await.expect("woken by the insert");
    assert!(sent.elapsed() < Duration::from_secs(1));
    idle.shutdown();
    assert_eq!(idle_run.await.unwrap().unwrap().completed, 1);
}

/// An idle agent of `w` (600 s poll) on `store`; a second later `write` is
/// applied to task `key` by another writer, and the agent must run that
/// task within five seconds: the write's change woke it (`what`).
async fn a_write_wakes_the_idle_agent(store: MemoryStore, key: &Key, write: Write, what: &str) {
    let agent = Agent::builder(store.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let (run, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(store.write(&coll(), key, &write).await.unwrap().is_applied());
    tokio::time::timeout(Duration::from_secs(5), ran.notified())
        .await
        .unwrap_or_else(|_| panic!("not woken by {what}"));
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1);
}

/// A task made ready by a write that sets `ready: true` and nothing of its
/// lease (as a schedule lets its held task go, `schedule/mod.rs`) wakes its
/// idle agent at once: `claim::claimable_changes` admits it. Without that
/// clause the task waits for the idle agent's 600 s poll.
#[tokio::test(start_paused = true)]
async fn a_task_made_ready_wakes_its_idle_agent() {
    let store = MemoryStore::new();
    let held = doc! {"_id": "t", "agent_name": "w", "ready": false, "overlap_held": true};
    store.insert_many(&coll(), vec![held]).await.unwrap();
    let let_go = Write::new(
        Condition::FieldEq("overlap_held".into(), true.into()),
        store_trait::Mutation::new().set("ready", true).unset("overlap_held"),
    );
    a_write_wakes_the_idle_agent(store, &Key::new("t").unwrap(), let_go, "the task made ready").await;
}

/// A claim given back (a drain that timed out) wakes an idle agent of the
/// same name at once: the give-back lets the lease go without finishing the
/// task, which `claim::claimable_changes` admits. Without that clause the task
/// waits for the idle agent's poll or the lease's 60 s.
#[tokio::test(start_paused = true)]
async fn a_claim_given_back_wakes_an_idle_peer() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    queue.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let started = Arc::new(Notify::new());
    let holder = Agent::builder(store.clone(), "w", "tasks")
        .ttl(Duration::from_secs(60))
        .drain_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let holder_run = tokio::spawn({
        let (holder, started) = (holder.clone(), started.clone());
        async move {
            holder
                .work(move |_t: Task| {
                    let started = started.clone();
                    async move {
                        started.notify_one();
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        true
                    }
                })
                .await
        }
    });
    started.notified().await;
    let idle = Agent::builder(store.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let (idle_run, ran) = work_signalling(&idle);
    tokio::time::sleep(Duration::from_secs(1)).await;
    holder.shutdown();
    assert_eq!(holder_run.await.unwrap().unwrap().completed, 0);
    tokio::time::timeout(Duration::from_secs(5), ran.notified())
        .await
        .expect("the idle peer takes the task given back");
    idle.shutdown();
    assert_eq!(idle_run.await.unwrap().unwrap().completed, 1);
}

/// A retry moves the idle deadline (`work.rs`: `idle_until` cleared when
/// `reap` sees a retried task): a task this agent retried for a second later
/// runs a second later, not at the end of the idle period before it (the
/// 600 s poll); its own retry write is no change it sees (it watches only
/// while idle).
#[tokio::test(start_paused = true)]
async fn a_retry_due_soon_runs_when_due_after_an_earlier_idle_period() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let epoch = tokio::time::Instant::now();
    let run = tokio::spawn({
        let (agent, attempts) = (agent.clone(), attempts.clone());
        async move {
            agent
                .work(move |t: Task| {
                    let attempts = attempts.clone();
                    async move {
                        attempts.lock().unwrap().push(epoch.elapsed());
                        if t.attempt() == 1 {
                            Outcome::retry_after("once more", Duration::from_secs(1))
                        } else {
                            Outcome::done()
                        }
                    }
                })
                .await
        }
    });
    // Idle first (a 600 s idle period begins), then a task arrives.
    tokio::time::sleep(Duration::from_secs(1)).await;
    queue.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1, "the retry ran within 10 s: {:?}", attempts.lock().unwrap());
}

/// An idle agent wakes when another program moves a task's due time
/// forward (`claimable_changes`: the clause on `run_at`), not at the due
/// time it read when it went idle: without the clause, the task below waits
/// the hour it was first delayed by.
#[tokio::test(start_paused = true)]
async fn a_due_time_moved_forward_wakes_an_idle_agent() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = queue.enqueue(NewTask::new("w", doc! {}).delay(Duration::from_secs(3600))).await.unwrap();
    // Another program (an operator in a shell) makes the task due now.
    let now = Write::new(Condition::Always, store_trait::Mutation::new().set_now("run_at"));
    a_write_wakes_the_idle_agent(store, &id, now, "the due time moved").await;
}

/// A wake-up by an update reads the idle deadline afresh: the update may
/// have moved a due time sooner. Agent B's run fails and is retried in about
/// a second; idle agent A, woken by that write, finds it not yet due and
/// sleeps until it is, not until the deadline it had before (the lapse of
/// B's claim, a minute later).
#[tokio::test(start_paused = true)]
async fn a_retry_written_by_another_agent_runs_when_due() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent = || {
        Agent::builder(store.clone(), "w", "tasks")
            .poll_interval(Duration::from_secs(600))
            .backoff(Duration::from_secs(1), Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let (b, a) = (agent(), agent());
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let failing = tokio::spawn({
        let (started, finish) = (started.clone(), finish.clone());
        async move {
            b.process(move |_t: Task| {
                let (started, finish) = (started.clone(), finish.clone());
                async move {
                    started.notify_one();
                    finish.notified().await;
                    Outcome::failed("try again")
                }
            })
            .await
        }
    });
    started.notified().await;
    let (work, ran) = work_signalling(&a);
    // A finds the task held, and idles until B's claim could lapse.
    tokio::time::sleep(Duration::from_secs(1)).await;
    finish.notify_one();
    assert_eq!(failing.await.unwrap().unwrap(), Some(Processed::Retried(id)));
    tokio::time::timeout(Duration::from_secs(5), ran.notified()).await.expect("the retry runs when due");
    a.shutdown();
    assert_eq!(work.await.unwrap().unwrap().completed, 1);
}

/// An idle agent with change notifications sends nothing on a timer: no
/// poll (notifications and its due-time timer cover what a poll would find),
/// and no reread of the pause state once its queue has been quiet for half a
/// minute (`control.rs`). Over nine quiet minutes it makes no call at all;
/// its `recheck_interval` (10 min by default) brings one check, which finds
/// nothing and so starts no rereads of the pause state. Without
/// that, it claimed every 5 s (its `poll_interval`) and the pause state was
/// read every 750 ms: about 100 calls a minute.
#[tokio::test(start_paused = true)]
async fn an_idle_agent_makes_no_call_between_its_checks() {
    let store = MemoryStore::new();
    let held = HoldBack::new(store.clone());
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    // A matcher that never holds: it sees every get, write, find and claim.
    held.hold_next(move |_, _| {
        c.fetch_add(1, Ordering::SeqCst);
        false
    });
    let agent = Agent::builder(held.clone(), "w", "tasks").build().unwrap();
    let (run, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(40)).await;
    let before = calls.load(Ordering::SeqCst);
    assert!(before > 0, "the agent's first claims went through the counting store");
    tokio::time::sleep(Duration::from_secs(9 * 60)).await;
    assert_eq!(calls.load(Ordering::SeqCst) - before, 0, "calls in nine quiet minutes");
    tokio::time::sleep(Duration::from_secs(90)).await;
    let check = calls.load(Ordering::SeqCst) - before;
    assert!(check > 0, "no check at ten minutes");
    // The check found nothing, so it started no rereads of the pause state
    // (with them: 40 more calls, 30 s of one every 750 ms).
    assert!(check <= 8, "the check at ten minutes cost {check} calls");
    // Still woken at once by a task of its own.
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    queue.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), ran.notified()).await.expect("woken by the insert");
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1);
}

/// With no poll, nothing announces a claim that lapses: an idle agent woken
/// by an insert that another agent claimed first, and which that agent then
/// held as it died, takes the task when that claim lapses (`work.rs`: woken
/// by a change and claiming nothing, it reads its idle deadline again within
/// `poll_interval`), not at its 10-minute check.
#[tokio::test(start_paused = true)]
async fn a_task_lost_to_an_agent_that_died_runs_when_its_claim_lapses() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let coll = Collection::new("tasks").unwrap();
    let ttl = Duration::from_secs(10);
    let agent = Agent::builder(store.clone(), "w", "tasks").ttl(ttl).build().unwrap();
    let (run, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let dead = Claim {
        query: Query::eq(doc! {"agent_name": "w", "ready": true}),
        mutation: Mutation::new()
            .grant("dead-agent", Ttl::new(ttl).unwrap())
            .bump_fence()
            .set("ready", false)
            .set("claimed", true),
    };
    // The other agent claims the task before ours, woken by the insert,
    // takes its turn (it waits a few milliseconds to coalesce a burst).
    queue.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    assert!(store.claim(&coll, &dead).await.unwrap().is_some(), "the other agent claimed first");
    let sent = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(60), ran.notified()).await.expect("taken after the dead claim lapsed");
    let after = sent.elapsed();
    assert!(after >= ttl && after < ttl + Duration::from_secs(1), "run {after:?} after the insert");
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1);
}

/// A task inserted for later while its agent idles wakes the agent, which
/// cannot claim it yet: it runs when due, by the timer that the read of the
/// idle deadline a `poll_interval` after the wake-up set, not at the
/// 10-minute check.
#[tokio::test(start_paused = true)]
async fn a_delayed_task_inserted_while_idle_runs_when_due() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let (run, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let sent = tokio::time::Instant::now();
    queue.enqueue(NewTask::new("w", doc! {}).delay(Duration::from_secs(20))).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), ran.notified()).await.expect("ran when due");
    let after = sent.elapsed();
    assert!(after >= Duration::from_secs(20) && after < Duration::from_secs(21), "run {after:?} after the insert");
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1);
}
