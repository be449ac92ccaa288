//! Claims: what is claimable, the claim gate, claims by key from candidate
//! lists, batch claims, the fence that keeps a lapsed claim's outcome out, and
//! recovery of lapsed claims.

use super::*;
use store_test::Partitionable;

/// Fence check: an agent cut off for longer than its lease finishes its handler
/// after another agent took the task over and completed it. Its late outcome is
/// rejected, whatever order the two finish in.
#[tokio::test(start_paused = true)]
async fn a_late_outcome_of_a_lapsed_claim_is_rejected() {
    for newer_finishes_first in [true, false] {
        let store = MemoryStore::new();
        let (id, _) = Queue::new(store.clone(), "tasks").unwrap().enqueue(NewTask::new("w", doc! {})).await.unwrap();
        let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let slow = store.client();
        let old = Agent::builder(slow.clone(), "w", "tasks").ttl(Duration::from_secs(3)).build().unwrap();
        let old_run = tokio::spawn({
            let (started, finish) = (started.clone(), finish.clone());
            async move {
                let handler = move |_t: Task| {
                    let (started, finish) = (started.clone(), finish.clone());
                    async move {
                        started.notify_one();
                        finish.notified().await;
                        Outcome::done_with(doc! {"by": "old"})
                    }
                };
                old.process(handler).await.map(|p| (p, old.counters()))
            }
        });
        started.notified().await;
        // Cut off past the lease: the claim lapses on the store.
        slow.set_partitioned(true);
        tokio::time::sleep(Duration::from_secs(4)).await;

        let new = Agent::builder(store.client(), "w", "tasks").ttl(Duration::from_secs(3)).build().unwrap();
        let new_started = Arc::new(Notify::new());
        let new_run = tokio::spawn({
            let (new, new_started) = (new.clone(), new_started.clone());
            let release = if newer_finishes_first { None } else { Some(finish.clone()) };
            async move {
                let handler = move |t: Task| {
                    let (new_started, release) = (new_started.clone(), release.clone());
                    async move {
                        assert_eq!(t.attempt(), 2);
                        new_started.notify_one();
                        if let Some(r) = release {
                            // The old agent finishes while this one still runs.
                            r.notify_one();
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        Outcome::done_with(doc! {"by": "new"})
                    }
                };
                new.process(handler).await
            }
        });
        new_started.notified().await;
        slow.set_partitioned(false);
        if newer_finishes_first {
            assert_eq!(new_run.await.unwrap().unwrap(), Some(Processed::Completed(id.clone())));
            finish.notify_one();
            let (old_processed, old_log) = old_run.await.unwrap().unwrap();
            assert_eq!(old_processed, Some(Processed::Stale(id.clone())), "the late outcome is rejected");
            assert_eq!((old_log.completed, old_log.stale_rejected), (0, 1));
        } else {
            let (old_processed, old_log) = old_run.await.unwrap().unwrap();
            assert_eq!(old_processed, Some(Processed::Stale(id.clone())), "the late outcome is rejected");
            assert_eq!((old_log.completed, old_log.stale_rejected), (0, 1));
            assert_eq!(new_run.await.unwrap().unwrap(), Some(Processed::Completed(id.clone())));
        }
        let d = data(&store, &id).await;
        assert_eq!((d.get_str("by").unwrap(), d.get_bool("complete").unwrap()), ("new", true), "{d}");
    }
}

/// Claim (ready tasks): a task can be ready and still held, for a moment: the
/// last follow-up wakes a waiting task while the waiter's own agent still holds
/// it. Nobody claims it until that agent lets go.
#[tokio::test(start_paused = true)]
async fn a_ready_task_still_held_is_not_claimed() {
    let store = MemoryStore::new();
    store.insert_many(&coll(), vec![doc! {"_id": "t", "agent_name": "w", "ready": true}]).await.unwrap();
    let ttl = store_trait::Ttl::new(Duration::from_secs(60)).unwrap();
    let hold =
        store_trait::Write::new(store_trait::Condition::Always, store_trait::Mutation::new().grant("other", ttl));
    assert!(store.write(&coll(), &Key::new("t").unwrap(), &hold).await.unwrap().is_applied());
    let a = Agent::builder(store.client(), "w", "tasks").build().unwrap();
    assert!(a.process(|_t: Task| async { true }).await.unwrap().is_none(), "a held task is not claimed");
    let release = store_trait::Write::new(store_trait::Condition::Always, store_trait::Mutation::new().release());
    assert!(store.write(&coll(), &Key::new("t").unwrap(), &release).await.unwrap().is_applied());
    assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(Key::new("t").unwrap())));
}

/// Claim gate: agents built on one `Queue` take turns claiming instead of racing
/// for the head of the queue; counted on a store that records claims in flight.
#[tokio::test(start_paused = true)]
async fn agents_on_one_queue_claim_in_turn() {
    let store = MemoryStore::new();
    store.faults().set_latency(Duration::from_millis(20));
    let counted = Counted::new(store.clone());
    let queue = Queue::new(counted.clone(), "tasks").unwrap();
    let tasks: Vec<_> = (0..24_i64).map(|i| NewTask::new("w", doc! {"i": i})).collect();
    queue.enqueue_all(&tasks).await.unwrap();
    let agents: Vec<_> = (0..4).map(|_| Agent::on_queue(&queue, "w").concurrency(2).build().unwrap()).collect();
    let workers: Vec<_> = agents
        .iter()
        .map(|a| {
            let a = a.clone();
            tokio::spawn(async move { a.work(|_t: Task| async { true }).await.unwrap() })
        })
        .collect();
    let done = Query::eq(doc! {"complete": true});
    // Bounded (simulated time), so that a broken agent fails the test instead of
    // hanging it.
    for _ in 0..3_000 {
        if store.count(&coll(), &done).await.unwrap() >= 24 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agents.iter().for_each(Agent::shutdown);
    let mut completed = 0;
    for w in workers {
        completed += w.await.unwrap().completed;
    }
    assert_eq!(completed, 24);
    assert!(agents.iter().filter(|a| a.counters().completed > 0).count() > 1, "the agents shared the work");
    assert_eq!(counted.max.load(Ordering::SeqCst), 1, "one claim in flight at a time");
}

/// An idle agent woken by inserts claims the inserted tasks by key
/// (`claim::Woken`): one light claim each, none by the queue's filter and
/// sort, and nothing more when the insert was another agent's task (it was
/// idle: nothing else is claimable). Without that, each wake-up claims the
/// head by query.
#[tokio::test(start_paused = true)]
async fn a_woken_agent_claims_the_inserted_task_by_key() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let counted = Counted::new(store.clone());
    let agent = Agent::builder(counted.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let (run, ran) = work_signalling(&agent);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let count = || {
        (
            counted.claims.load(Ordering::SeqCst),
            counted.keyed.load(Ordering::SeqCst),
            counted.reads.load(Ordering::SeqCst),
        )
    };
    let before = count();
    for _ in 0..3 {
        queue.enqueue(NewTask::new("other", doc! {})).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    queue.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), ran.notified()).await.expect("woken by the insert");
    let after = count();
    // Four wake-ups, four keyed claims (three misses, one hit), no list read.
    assert_eq!((after.0 - before.0, after.1 - before.1, after.2 - before.2), (4, 4, 0));
    agent.shutdown();
    assert_eq!(run.await.unwrap().unwrap().completed, 1);
}

/// A claim of the head that finds nothing right after a list read found
/// some (here the server gave up on it, as SecantusDB does on a write
/// conflict) is tried again after a backoff (`Candidates::head_claimed`,
/// `Claims::outrun`), not taken for an empty queue: without that the agent idles
/// until its 600 s poll with tasks left (no change wakes it).
#[tokio::test(start_paused = true)]
async fn an_empty_head_claim_after_a_list_with_tasks_is_tried_again() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let tasks: Vec<_> = (0..10_i64).map(|i| NewTask::new("w", doc! {"i": i})).collect();
    queue.enqueue_all(&tasks).await.unwrap();
    let counted = Counted::new(store.clone());
    let agent = Agent::builder(counted.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let run = tokio::spawn({
        let agent = agent.clone();
        async move {
            agent
                .work(|_t: Task| async {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    true
                })
                .await
        }
    });
    // The first claim takes the head, the second reads a short list (nine):
    // from then on the head again whenever the list is old or spent.
    while counted.reads.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Three in a row: the work loop claims again when it opens its idle
    // watch and before it sleeps; those come back empty too.
    counted.false_empty.store(3, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    agent.shutdown();
    assert_eq!(counted.false_empty.load(Ordering::SeqCst), 0, "a claim of the head came back empty");
    assert_eq!(run.await.unwrap().unwrap().completed, 10, "every task within 30 s");
}

/// Outrun: a claimer whose candidates others took, read after read, gives up
/// with ready tasks left, and no change will come to say so (the idle watch
/// passes over other claimers' claims). It tries again after a backoff
/// (`Claims::outrun` in `claim.rs`, read in `work.rs`) and takes the rest at once; without
/// that it sleeps until its 600 s poll.
#[tokio::test(start_paused = true)]
async fn an_outrun_claimer_tries_again_soon() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let tasks: Vec<_> = (0..1000_i64).map(|i| NewTask::new("w", doc! {"i": i})).collect();
    queue.enqueue_all(&tasks).await.unwrap();
    let counted = Counted::new(store.clone());
    // Every list read of the first four claims (two each) is raced: 8 × 64 keys.
    counted.race.store(8, Ordering::SeqCst);
    let agent = Agent::builder(counted.clone(), "w", "tasks").poll_interval(Duration::from_secs(600)).build().unwrap();
    let run = tokio::spawn({
        let agent = agent.clone();
        async move { agent.work(|_t: Task| async { true }).await }
    });
    let remaining = 1000 - 1 - 8 * 64;
    tokio::time::sleep(Duration::from_secs(30)).await;
    agent.shutdown();
    let done = run.await.unwrap().unwrap().completed;
    assert_eq!(counted.race.load(Ordering::SeqCst), 0, "every raced read happened");
    assert_eq!(done, 1 + remaining, "the head, then every task the racer left, within 30 s");
}

/// A claim is kept through mongolock's one lease seam (`Leases`), like a lock's
/// acquisition: renewed while the handler runs longer than the lease; cut off, the
/// handler's cancellation fires while the claim is still live on the store; and
/// the claim is not released behind the handler's back.
#[tokio::test(start_paused = true)]
async fn a_claim_is_kept_like_a_lock() {
    let store = MemoryStore::new();
    let (id, _) = Queue::new(store.clone(), "tasks").unwrap().enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let lease = Duration::from_secs(3);
    let agent = Agent::builder(store.clone(), "w", "tasks").ttl(lease).build().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = {
        let (store, id, seen) = (store.clone(), id.clone(), seen.clone());
        move |t: Task| {
            let (store, id, seen) = (store.clone(), id.clone(), seen.clone());
            async move {
                let holder = |what: &str| {
                    let snap = store.peek(&coll(), &id).unwrap();
                    let live = snap.record.unwrap().holder_at(snap.now).map(|l| l.owner.clone());
                    seen.lock().unwrap().push((what.to_owned(), live));
                };
                tokio::time::sleep(lease * 2).await;
                assert!(!t.cancellation().is_cancelled(), "the claim is renewed while the handler runs");
                holder("renewed");
                store.faults().set_unreachable(true);
                tokio::time::timeout(lease, t.cancellation().cancelled()).await.expect("the claim's loss is signalled");
                holder("signalled");
                store.faults().set_unreachable(false);
                tokio::time::sleep(Duration::from_millis(50)).await;
                holder("after");
                Outcome::done_with(doc! {"late": true})
            }
        }
    };
    // The outcome's write is fenced, not refused for the signal: the claim was
    // still this agent's, so it applies.
    let out = agent.process(handler).await.unwrap();
    assert_eq!(out, Some(Processed::Completed(id.clone())));
    let seen = seen.lock().unwrap().clone();
    let owners: Vec<_> = seen.iter().map(|(_, o)| o.clone()).collect();
    assert!(owners.iter().all(Option::is_some), "held at every step: {seen:?}");
    assert!(owners.windows(2).all(|w| w[0] == w[1]), "by the same claim: {seen:?}");
}

/// Batch claims: an agent with four free slots claims four tasks in one batch,
/// each under its own bumped fence; tasks a lost batch stamped (its caller
/// never learned them) lapse and are run under the next fence.
#[tokio::test(start_paused = true)]
async fn batch_claims_fence_each_task_and_lost_batches_lapse() {
    let store = MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let tasks: Vec<_> = (0..8_i64).map(|i| NewTask::new("w", doc! {"i": i})).collect();
    queue.enqueue_all(&tasks).await.unwrap();
    // A batch whose caller died before it read back what it claimed: four tasks.
    let lease = store_trait::Ttl::new(Duration::from_secs(3)).unwrap();
    let lost = Claim {
        query: Query::eq(doc! {"agent_name": "w", "ready": true}).sort("i", store_trait::Order::Asc),
        mutation: store_trait::Mutation::new()
            .grant("lost", lease)
            .bump_fence()
            .set("ready", false)
            .set("claimed", true),
    };
    assert_eq!(store.claim_many(&coll(), &lost, 4).await.unwrap().len(), 4);
    let agent = Agent::builder(store.clone(), "w", "tasks").concurrency(4).build().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let worker = tokio::spawn({
        let (agent, seen) = (agent.clone(), seen.clone());
        async move {
            agent
                .work(move |t: Task| {
                    let seen = seen.clone();
                    async move {
                        seen.lock().unwrap().push((t.data().get_i64("i").unwrap(), t.fence()));
                        true
                    }
                })
                .await
                .unwrap()
        }
    });
    for _ in 0..600 {
        if seen.lock().unwrap().len() >= 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agent.shutdown();
    assert_eq!(worker.await.unwrap().completed, 8);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    let want: Vec<(i64, u64)> = (0..8).map(|i| (i, if i < 4 { 2 } else { 1 })).collect();
    assert_eq!(seen, want, "each task ran once, under its own next fence");
}

/// The store operations of plain tasks, once the agent is warm: a claim and
/// an outcome each, nothing else (no query for follow-ups a first run cannot
/// have); the agent's list of candidates, read by the second claim (the
/// first takes the head), serves the next claims without another read (this fails if a list were read per
/// claim; claims without lists at all would pass it too).
#[tokio::test(start_paused = true)]
async fn a_plain_task_costs_a_claim_and_an_outcome() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    q.enqueue_all(&(0..9).map(|n| NewTask::new("w", doc! {"n": n})).collect::<Vec<_>>()).await.unwrap();
    // The first claim takes the head by query, the second reads the list.
    for _ in 0..2 {
        assert!(matches!(agent.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
    }
    let before = store.operation_count();
    for _ in 2..9 {
        assert!(matches!(agent.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
    }
    assert_eq!(store.operation_count() - before, 2 * 7, "one claim, one outcome write per task");
}

/// Claims by key from a list of candidates keep the whole claim filter: an
/// agent whose list was read before another agent (on its own `Queue`, as in
/// another process) took and finished those tasks passes them over; every
/// task runs exactly once.
#[tokio::test(start_paused = true)]
async fn a_candidate_taken_by_another_claimer_is_passed_over() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue_all(&(0..10).map(|n| NewTask::new("w", doc! {}).id(format!("t{n}"))).collect::<Vec<_>>()).await.unwrap();
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = |runs: Arc<std::sync::Mutex<Vec<String>>>| {
        move |t: Task| {
            let runs = runs.clone();
            async move {
                runs.lock().unwrap().push(t.id().to_string());
                true
            }
        }
    };
    let first = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let second = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    // The first agent takes the head, then reads its list (t1..t9) and
    // claims t1 from it: its list now holds the other eight.
    for _ in 0..2 {
        assert!(first.process(handler(runs.clone())).await.unwrap().is_some());
    }
    for _ in 0..8 {
        assert!(second.process(handler(runs.clone())).await.unwrap().is_some());
    }
    assert_eq!(first.process(handler(runs.clone())).await.unwrap(), None, "a finished task was claimed again");
    let mut ran = runs.lock().unwrap().clone();
    ran.sort_unstable();
    assert_eq!(ran, (0..10).map(|n| format!("t{n}")).collect::<Vec<_>>());
}

/// A list of candidates is read again once it is `MAX_AGE` (1 s) old: a
/// task enqueued ahead of the list (a higher priority) is claimed next after
/// that, not after the list is spent.
#[tokio::test(start_paused = true)]
async fn an_old_candidate_list_is_read_again() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue_all(&(0..8).map(|n| NewTask::new("w", doc! {}).id(format!("low-{n}"))).collect::<Vec<_>>())
        .await
        .unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let next = || async {
        match agent.process(|_t: Task| async { true }).await.unwrap() {
            Some(Processed::Completed(k)) => k.to_string(),
            other => panic!("{other:?}"),
        }
    };
    // The head by query, then a list read.
    assert_eq!(next().await, "low-0");
    assert_eq!(next().await, "low-1");
    q.enqueue(NewTask::new("w", doc! {}).id("high").priority(9)).await.unwrap();
    assert_eq!(next().await, "low-2", "a fresh list is claimed from");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(next().await, "high");
}

/// Slots freed together are claimed together: tasks claimed in one batch end
/// a moment apart (here 0 to 3 ms, against a 5 ms round trip), so the first
/// one's outcome is written alone and the others' in the next group commit.
/// The work loop claims for the slot the first one freed once that second
/// write has landed, with the other three, in one batch claim: one claim and
/// two outcome writes per four tasks. Fails without the wait for the landing
/// (the freed slot is claimed alone, the four slots drift apart, and claims
/// and outcome writes go one or two at a time).
#[tokio::test(start_paused = true)]
async fn slots_freed_together_are_claimed_together() {
    let (_, calls) = busy_queue(32).await;
    let agent = Agent::builder(calls.clone(), "w", "tasks")
        .concurrency(4)
        .poll_interval(Duration::from_secs(60))
        .process_while(|l| l.completed < 32)
        .build()
        .unwrap();
    let log = agent
        .work(|t: Task| async move {
            let n = t.data().get_i32("n").unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(u64::from(n.unsigned_abs() % 4))).await;
            true
        })
        .await
        .unwrap();
    assert_eq!(log.completed, 32);
    let (claims, writes) = (calls.claims.load(Ordering::SeqCst), calls.write_batches.load(Ordering::SeqCst));
    // 8 rounds of 4 tasks: a claim each (the last finds nothing more), two
    // outcome writes each.
    assert!(claims <= 9, "{claims} claims for 32 tasks, four slots");
    assert!(writes <= 16, "{writes} outcome writes for 32 tasks, four slots");
}

/// A claim makes its task live again, whatever marked it for collection
/// before (an operator's write, an older version's): the handler runs with no
/// `gc_at` on its task, so a TTL pass never deletes a running task.
#[tokio::test(start_paused = true)]
async fn a_claim_clears_an_earlier_mark_for_collection() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let ttl = store_trait::Ttl::new(Duration::from_millis(1)).unwrap();
    let mark = Write::new(Condition::Always, store_trait::Mutation::new().gc_after(ttl));
    assert!(store.write(&coll(), &id, &mark).await.unwrap().is_applied());
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let handler = {
        let store = store.clone();
        move |t: Task| {
            let store = store.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                store.prune_ttl();
                store.peek(&coll(), t.id()).unwrap().record.is_some()
            }
        }
    };
    assert_eq!(agent.process(handler).await.unwrap(), Some(Processed::Completed(id)), "collected while it ran");
}

/// A task that ended is never claimed again, whatever another program
/// writes of its readiness: an operator's `ready: true` on a completed task
/// (the claim filter's `not_complete` clause; `Queue::requeue` is the way to
/// run it again). Without the clause it runs twice.
#[tokio::test(start_paused = true)]
async fn an_ended_task_marked_ready_by_another_program_is_not_run_again() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let agent = Agent::builder(store.clone(), "w", "tasks").build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        move |_t: Task| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { true }
        }
    };
    assert_eq!(agent.process(handler.clone()).await.unwrap(), Some(Processed::Completed(id.clone())));
    let ready = Write::new(Condition::Always, store_trait::Mutation::new().set("ready", true));
    assert!(store.write(&coll(), &id, &ready).await.unwrap().is_applied());
    assert_eq!(agent.process(handler).await.unwrap(), None, "an ended task was claimed");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Recovery never starves under load: every sixteenth claim looks for lapsed
/// claims first. A crashed agent's task runs again while 40 ready tasks still
/// wait; without that turn it would wait until no task is ready (on a queue
/// that never empties, for ever).
#[tokio::test(start_paused = true)]
async fn a_lapsed_claim_is_recovered_while_ready_tasks_wait() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("w", doc! {}).id("crashed")).await.unwrap();
    let dead = Claim {
        query: Query::eq(doc! {"_id": "crashed"}),
        mutation: store_trait::Mutation::new()
            .grant("dead-agent", store_trait::Ttl::new(Duration::from_secs(2)).unwrap())
            .bump_fence()
            .set("ready", false)
            .set("claimed", true),
    };
    assert!(store.claim(&coll(), &dead).await.unwrap().is_some());
    tokio::time::sleep(Duration::from_secs(3)).await;
    q.enqueue_all(&(0..40).map(|i| NewTask::new("w", doc! {}).id(format!("t{i:02}"))).collect::<Vec<_>>())
        .await
        .unwrap();
    let order: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    // One task per claim (nothing claimed ahead): run n is claim n.
    let agent = Agent::builder(store.clone(), "w", "tasks")
        .prefetch(0)
        .process_while(|l| l.tasks_processed < 41)
        .build()
        .unwrap();
    let log = agent
        .work({
            let order = order.clone();
            move |t: Task| {
                order.lock().unwrap().push(t.id().to_string());
                async { true }
            }
        })
        .await
        .unwrap();
    assert_eq!(log.completed, 41);
    let order = order.lock().unwrap();
    let at = order.iter().position(|id| id == "crashed").unwrap();
    assert!(at < 16, "the lapsed claim ran as run {} of 41: {order:?}", at + 1);
}
