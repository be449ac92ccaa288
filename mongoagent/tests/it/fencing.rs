//! Stale agents change nothing: a lapsed claim's late outcome is never taken for
//! done (memory store, paused time, fault injection).

use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, NewTask, Outcome, Processed, Queue, Task};
use store_memory::MemoryStore;
use store_trait::{Collection, Key, Store};

use crate::hold_back::{HoldBack, Op};
use store_test::Partitionable;

fn record(store: &MemoryStore, id: &str) -> store_trait::Record {
    store.peek(&Collection::new("tasks").unwrap(), &Key::new(id).unwrap()).unwrap().record.unwrap()
}

/// The agent's claim lapses while its handler runs; its outcome write fails
/// before it applies, and the task is requeued before the retry. The retry finds
/// no lease and (before requeue bumped the fence) the same fence: the old check
/// took that for "my earlier attempt applied" and reported the task completed,
/// although its outcome was never written and it runs again.
#[tokio::test(start_paused = true)]
async fn a_requeue_between_retries_is_not_taken_for_done() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("w", doc! {}).id("t")).await.unwrap();
    let a = Agent::builder(store.clone(), "w", "tasks").ttl(Duration::from_secs(2)).build().unwrap();
    let handler = {
        let (store, q) = (store.clone(), q.clone());
        move |_t: Task| {
            let (store, q) = (store.clone(), q.clone());
            async move {
                // Cut off until the claim lapses.
                store.faults().set_unreachable(true);
                tokio::time::sleep(Duration::from_secs(3)).await;
                store.faults().set_unreachable(false);
                // The outcome write fails before it applies; an operator requeues
                // the lapsed task while the agent backs off.
                store.faults().fail_next(1);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    assert_eq!(q.requeue(doc! {"_id": "t"}).await.unwrap().len(), 1);
                });
                Outcome::done_with(doc! {"result": "first run"})
            }
        }
    };
    let fence = record(&store, "t").fence() + 1;
    let out = a.process(handler).await.unwrap();
    assert_eq!(out, Some(Processed::Stale(Key::new("t").unwrap())), "the outcome was never written");
    assert_eq!(a.counters().completed, 0);
    let r = record(&store, "t");
    assert_eq!((r.data().get_bool("ready").unwrap(), r.data().get_bool("complete").unwrap()), (true, false));
    assert!(r.data().get("result").is_none());
    assert_eq!(r.fence(), fence + 1, "a requeue bumps the fence");
}

/// A handler that signals it runs, then waits for the go-ahead and returns
/// `outcome(round)`.
fn gated(
    outcome: fn(&str, u64) -> Outcome,
    from: &'static str,
) -> (impl Fn(Task) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>> + Clone, Gate) {
    let (running_tx, running) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (go, go_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let go_rx = std::sync::Arc::new(tokio::sync::Mutex::new(go_rx));
    let handler = move |t: Task| {
        let (running_tx, go_rx) = (running_tx.clone(), go_rx.clone());
        Box::pin(async move {
            if t.round() == 0 {
                running_tx.send(()).unwrap();
                go_rx.lock().await.recv().await.unwrap();
            }
            outcome(from, t.round())
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>>
    };
    (handler, Gate { running, go })
}

struct Gate {
    running: tokio::sync::mpsc::UnboundedReceiver<()>,
    go: tokio::sync::mpsc::UnboundedSender<()>,
}

/// Runs every ready "part" task; returns their `from` fields in the order run.
async fn parts_run(store: &MemoryStore) -> Vec<String> {
    let part = Agent::builder(store.clone(), "part", "tasks").build().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = {
        let seen = seen.clone();
        move |t: Task| {
            seen.lock().unwrap().push(t.data().get_str("from").unwrap().to_owned());
            async { true }
        }
    };
    while part.process(handler.clone()).await.unwrap().is_some() {}
    let seen = seen.lock().unwrap().clone();
    seen
}

/// The ids of the follow-ups left pending with the parent claim `fence`.
async fn pending_of(store: &MemoryStore, fence: i64) -> Vec<String> {
    use store_trait::{Query, Store};
    let q = Query::eq(doc! {"pending_parent_fence": fence});
    let found = store.find(&Collection::new("tasks").unwrap(), &q).await.unwrap();
    found.iter().map(|r| r.key().to_string()).collect()
}

/// Two runs of one task, both held at their gates: agent A's, whose claim
/// lapsed while it was cut off (it is back now), and agent B's, which took the
/// task over. Each returns `outcome` with its own data ("stale", "holder").
struct TakenOver {
    store: MemoryStore,
    run_a: tokio::task::JoinHandle<Result<Option<Processed>, mongoagent::AgentError>>,
    gate_a: Gate,
    run_b: tokio::task::JoinHandle<Result<Option<Processed>, mongoagent::AgentError>>,
    gate_b: Gate,
}

async fn taken_over(outcome: fn(&str, u64) -> Outcome) -> TakenOver {
    let store = MemoryStore::new();
    let (client_a, client_b) = (store.client(), store.client());
    taken_over_on(outcome, store, client_a.clone(), client_b, &client_a).await
}

/// As [`taken_over`], agent A on `a` and agent B on `b`: clients of `store`,
/// or wrappers of them; `a_client` is the client A's calls go through.
async fn taken_over_on<S: Store + Clone>(
    outcome: fn(&str, u64) -> Outcome,
    store: MemoryStore,
    a: S,
    b: S,
    a_client: &store_test::Client,
) -> TakenOver {
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("split", doc! {}).id("job")).await.unwrap();
    let builder =
        |s: S| Agent::builder(s, "split", "tasks").ttl(Duration::from_secs(2)).poll_interval(Duration::from_secs(3600));
    let (a, b) = (builder(a).build().unwrap(), builder(b).build().unwrap());
    let (handler_a, mut gate_a) = gated(outcome, "stale");
    let (handler_b, mut gate_b) = gated(outcome, "holder");
    let run_a = tokio::spawn(async move { a.process(handler_a).await });
    gate_a.running.recv().await.unwrap();
    // Agent A is cut off until its claim lapses; agent B takes the task over.
    a_client.set_partitioned(true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let run_b = tokio::spawn(async move { b.process(handler_b).await });
    gate_b.running.recv().await.unwrap();
    a_client.set_partitioned(false);
    TakenOver { store, run_a, gate_a, run_b, gate_b }
}

/// A run whose claim lapsed while another agent took the task over returns
/// `outcome` first (with its own data in the follow-ups), then its outcome
/// write is rejected; the holder returns the same shape with other data. Only
/// the holder's follow-ups run. Returns what the follow-ups saw, and the
/// parent's agent for a second round.
async fn stale_then_holder(outcome: fn(&str, u64) -> Outcome, holder_result: Processed) -> (Vec<String>, MemoryStore) {
    let TakenOver { store, run_a, gate_a, run_b, gate_b } = taken_over(outcome).await;
    // A finishes first: its follow-ups are inserted before its outcome is
    // rejected.
    gate_a.go.send(()).unwrap();
    assert_eq!(run_a.await.unwrap().unwrap(), Some(Processed::Stale(Key::new("job").unwrap())));
    // The stale run removed the follow-ups it left pending: nothing could ever
    // activate them.
    let left = pending_of(&store, 1).await;
    assert!(left.is_empty(), "the stale claim's follow-ups are left behind: {left:?}");
    gate_b.go.send(()).unwrap();
    assert_eq!(run_b.await.unwrap().unwrap(), Some(holder_result));

    (parts_run(&store).await, store)
}

#[tokio::test(start_paused = true)]
async fn a_stale_runs_follow_ups_never_run() {
    let outcome = |from: &str, _round: u64| Outcome::done().follow_up(NewTask::new("part", doc! {"from": from}));
    let (seen, _) = stale_then_holder(outcome, Processed::Completed(Key::new("job").unwrap())).await;
    assert_eq!(seen, vec!["holder".to_owned()], "only the holder's follow-up ran");
}

/// A follow-up the holder could not insert, because a stale run's pending
/// copy was in its place, is inserted once that copy is gone
/// (`Queue::enqueue_pending`). Here the stale run's two follow-ups go in
/// first and its outcome write waits; the holder's inserts find them, and its
/// read of the first waits while the stale run's rejected outcome removes
/// them. Without the insert after a vanished copy the holder gives up on both
/// and its outcome goes through without them: two follow-ups lost.
#[tokio::test(start_paused = true)]
async fn a_follow_up_whose_stale_copy_vanished_is_inserted_all_the_same() {
    fn outcome(from: &str, _round: u64) -> Outcome {
        let part = NewTask::new("part", doc! {"from": from});
        Outcome::done().follow_up(part.clone()).follow_up(part)
    }
    let store = MemoryStore::new();
    let (client_a, client_b) = (store.client(), store.client());
    let (held_a, held_b) = (HoldBack::new(client_a.clone()), HoldBack::new(client_b));
    let TakenOver { store, run_a, gate_a, run_b, gate_b } =
        taken_over_on(outcome, store, held_a.clone(), held_b.clone(), &client_a).await;
    held_a.hold_next(|_, op| matches!(op, Op::Write(w) if w.mutation.set.contains_key("follow_ups_fence")));
    gate_a.go.send(()).unwrap();
    held_a.reached().await;
    held_b.hold_next(|_, op| matches!(op, Op::Get(k) if k.to_string().starts_with("job/")));
    gate_b.go.send(()).unwrap();
    held_b.reached().await;
    held_a.open();
    let job = Key::new("job").unwrap();
    assert_eq!(run_a.await.unwrap().unwrap(), Some(Processed::Stale(job.clone())));
    held_b.open();
    assert_eq!(run_b.await.unwrap().unwrap(), Some(Processed::Completed(job)));
    assert_eq!(parts_run(&store).await, vec!["holder".to_owned(); 2], "the holder's two follow-ups ran");
}

/// The other order: the holder's follow-ups are enqueued (pending, not yet
/// activated) when the stale run enqueues the same ids. The stale run
/// replaces only an older claim's pending copies, never a newer one's: had
/// it replaced the holder's, its rejected outcome would remove them, and the
/// holder's activation would find none. Store calls take 5 ms; the stale run
/// is let go 0 to 19 ms after the holder, so one of its inserts falls between
/// the holder's insert and the holder's activation.
#[tokio::test(start_paused = true)]
async fn a_stale_run_enqueueing_after_the_holder_leaves_the_holders_follow_ups() {
    fn outcome(from: &str, _round: u64) -> Outcome {
        Outcome::done().follow_up(NewTask::new("part", doc! {"from": from}))
    }
    for delay in 0..20 {
        let TakenOver { store, run_a, gate_a, run_b, gate_b } = taken_over(outcome).await;
        store.faults().set_latency(Duration::from_millis(5));
        gate_b.go.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(delay)).await;
        gate_a.go.send(()).unwrap();
        assert_eq!(run_a.await.unwrap().unwrap(), Some(Processed::Stale(Key::new("job").unwrap())));
        assert_eq!(run_b.await.unwrap().unwrap(), Some(Processed::Completed(Key::new("job").unwrap())));
        store.faults().set_latency(Duration::ZERO);
        assert_eq!(parts_run(&store).await, vec!["holder".to_owned()], "stale run let go {delay} ms after the holder");
    }
}

/// The same with a wait for the follow-ups (fan-in): the task resumes once,
/// and sees the holder's follow-ups only.
#[tokio::test(start_paused = true)]
async fn a_stale_runs_joined_follow_ups_never_run() {
    fn outcome(from: &str, round: u64) -> Outcome {
        match round {
            0 => Outcome::done()
                .follow_up(NewTask::new("part", doc! {"from": from}))
                .follow_up(NewTask::new("part", doc! {"from": from}))
                .wait_for_follow_ups(),
            _ => Outcome::done(),
        }
    }
    let (seen, store) = stale_then_holder(outcome, Processed::Waiting(Key::new("job").unwrap())).await;
    assert_eq!(seen, vec!["holder".to_owned(), "holder".to_owned()]);
    let split = Agent::builder(store.clone(), "split", "tasks").build().unwrap();
    let children = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let resume = {
        let children = children.clone();
        move |t: Task| {
            children.lock().unwrap().extend(t.children().iter().map(|c| c.data().get_str("from").unwrap().to_owned()));
            async { true }
        }
    };
    assert_eq!(split.process(resume).await.unwrap(), Some(Processed::Completed(Key::new("job").unwrap())));
    assert_eq!(*children.lock().unwrap(), vec!["holder".to_owned(), "holder".to_owned()]);
}

/// The same with a fan-in task after the follow-ups (`Outcome::then`): the
/// holder's fan-in task runs once, after the holder's follow-ups.
#[tokio::test(start_paused = true)]
async fn a_stale_runs_fan_in_task_never_runs() {
    fn outcome(from: &str, _round: u64) -> Outcome {
        Outcome::done()
            .follow_up(NewTask::new("part", doc! {"from": from}))
            .then(NewTask::new("part", doc! {"from": format!("{from} fan-in")}))
    }
    let (seen, _) = stale_then_holder(outcome, Processed::Completed(Key::new("job").unwrap())).await;
    assert_eq!(seen, vec!["holder".to_owned(), "holder fan-in".to_owned()]);
}

/// The agent dies after its outcome write, before it activated the follow-ups:
/// the next agent to claim the task activates them (only those of the claim
/// whose outcome was written) and ends the task; no handler runs twice. The
/// activation removes an older claim's pending follow-ups, never a newer
/// one's: a late activation (an agent slow between its outcome write and
/// its activation, while the task ran its next round) must not take a later
/// round's follow-ups away before their claim activates them.
#[tokio::test(start_paused = true)]
async fn follow_ups_pending_after_a_crash_are_activated_by_recovery() {
    use store_trait::{Claim, Mutation, Query, Store, Ttl};
    let store = MemoryStore::new();
    let coll = Collection::new("tasks").unwrap();
    let pending = |id: &str, fence: i64, from: &str| {
        doc! {"_id": id, "agent_name": "part", "ready": false, "parent": "job", "from": from,
        "pending_parent_fence": fence, "pending_fields": {"ready": true}}
    };
    let docs = vec![
        doc! {"_id": "job", "agent_name": "split", "ready": true},
        pending("job/0", 1, "written"),
        pending("job/1", 0, "stale"),
        pending("job@1/0", 3, "newer"),
    ];
    store.insert_many(&coll, docs).await.unwrap();
    // The crashed agent's claim (fence 1), with its outcome written.
    let claim = Claim {
        query: Query::eq(doc! {"_id": "job"}),
        mutation: Mutation::new()
            .grant("dead-agent", Ttl::new(Duration::from_millis(1500)).unwrap())
            .bump_fence()
            .set("ready", false)
            .set("claimed", true)
            .set("result", 42)
            .set("follow_ups_fence", 1_i64)
            .set("follow_ups_finish", "complete"),
    };
    assert_eq!(store.claim(&coll, &claim).await.unwrap().unwrap().fence(), 1);
    let part = Agent::builder(store.clone(), "part", "tasks").build().unwrap();
    assert_eq!(part.process(|_t: Task| async { true }).await.unwrap(), None, "nothing active yet");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let split = Agent::builder(store.clone(), "split", "tasks").build().unwrap();
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handler = {
        let ran = ran.clone();
        move |_t: Task| {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            async { true }
        }
    };
    let out = split.process(handler).await.unwrap();
    assert_eq!(out, Some(Processed::Recovered(Key::new("job").unwrap())));
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst), "the handler did not run again");
    let job = record(&store, "job");
    let d = job.data();
    assert_eq!(
        (d.get_bool("complete").unwrap(), d.get_bool("claimed").unwrap(), d.get_i32("result").unwrap()),
        (true, false, 42)
    );
    assert!(d.get("follow_ups_fence").is_none() && job.lease().is_none(), "{d}");
    assert_eq!(parts_run(&store).await, vec!["written".to_owned()]);
    assert!(pending_of(&store, 0).await.is_empty(), "the older claim's pending follow-up is removed");
    assert_eq!(pending_of(&store, 3).await, ["job@1/0"], "a newer claim's pending follow-up is left to it");
}

/// As above, for a task that waits for its follow-ups: recovery activates them,
/// marks the task waiting, and the last follow-up to end makes it ready; it
/// resumes once and sees only the follow-ups of the claim whose outcome was
/// written.
#[tokio::test(start_paused = true)]
async fn joined_follow_ups_pending_after_a_crash_are_activated_by_recovery() {
    use store_trait::{Claim, Mutation, Query, Store, Ttl};
    let store = MemoryStore::new();
    let coll = Collection::new("tasks").unwrap();
    let pending = |id: &str, fence: i64, from: &str| {
        doc! {"_id": id, "agent_name": "part", "ready": false, "parent": "job", "from": from,
        "pending_parent_fence": fence, "pending_fields": {"ready": true, "join": "job", "join_round": 0_i64}}
    };
    let docs = vec![
        doc! {"_id": "job", "agent_name": "split", "ready": true},
        pending("job/0", 1, "written"),
        pending("job/1", 1, "written"),
        pending("job/2", 0, "stale"),
    ];
    store.insert_many(&coll, docs).await.unwrap();
    let claim = Claim {
        query: Query::eq(doc! {"_id": "job"}),
        mutation: Mutation::new()
            .grant("dead-agent", Ttl::new(Duration::from_millis(1500)).unwrap())
            .bump_fence()
            .set("ready", false)
            .set("claimed", true)
            .set("follow_ups_fence", 1_i64)
            .set("follow_ups_finish", "wait"),
    };
    assert_eq!(store.claim(&coll, &claim).await.unwrap().unwrap().fence(), 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let split = Agent::builder(store.clone(), "split", "tasks").build().unwrap();
    let children = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let resume = {
        let children = children.clone();
        move |t: Task| {
            children.lock().unwrap().push((t.round(), t.children().len()));
            async { true }
        }
    };
    assert_eq!(split.process(resume.clone()).await.unwrap(), Some(Processed::Recovered(Key::new("job").unwrap())));
    let job = record(&store, "job");
    assert_eq!(job.data().get_i64("waiting").unwrap(), 0, "{:?}", job.data());
    assert!(children.lock().unwrap().is_empty(), "no handler ran");
    let part = Agent::builder(store.clone(), "part", "tasks").build().unwrap();
    let mut ran = Vec::new();
    while let Some(p) = part.process(|_t: Task| async { true }).await.unwrap() {
        ran.push(p);
    }
    assert_eq!(ran.len(), 2, "{ran:?}");
    assert!(pending_of(&store, 0).await.is_empty(), "the older claim's pending follow-up is removed");
    assert_eq!(split.process(resume).await.unwrap(), Some(Processed::Completed(Key::new("job").unwrap())));
    assert_eq!(*children.lock().unwrap(), vec![(1, 2)]);
}

/// A run's outcome write applied (a first attempt whose reply was lost), then
/// its claim lapsed and the retry of the write is rejected. Its follow-ups are
/// the task's own (the task names the run's fence for them): the run must not
/// discard them as a stale run's, and the next claimer activates them.
#[tokio::test(start_paused = true)]
async fn a_run_whose_outcome_was_written_keeps_its_follow_ups() {
    use store_trait::{Condition, Mutation, Store, Write};
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("split", doc! {}).id("job")).await.unwrap();
    let client_a = store.client();
    let builder = |c: store_test::Client| {
        Agent::builder(c, "split", "tasks").ttl(Duration::from_secs(2)).poll_interval(Duration::from_secs(3600))
    };
    let a = builder(client_a.clone()).build().unwrap();
    let outcome = |from: &str, _round: u64| Outcome::done().follow_up(NewTask::new("part", doc! {"from": from}));
    let (handler_a, mut gate_a) = gated(outcome, "written");
    let run_a = tokio::spawn(async move { a.process(handler_a).await });
    gate_a.running.recv().await.unwrap();
    // What the lost first attempt of the run's outcome write left (fence 1).
    let applied = Mutation::new().set("follow_ups_fence", 1_i64).set("follow_ups_finish", "complete");
    let coll = Collection::new("tasks").unwrap();
    store.write(&coll, &Key::new("job").unwrap(), &Write::new(Condition::Always, applied)).await.unwrap();
    client_a.set_partitioned(true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    client_a.set_partitioned(false);
    gate_a.go.send(()).unwrap();
    assert_eq!(run_a.await.unwrap().unwrap(), Some(Processed::Stale(Key::new("job").unwrap())));
    assert_eq!(pending_of(&store, 1).await.len(), 1, "the run's follow-up is kept for the next claimer");
    let split = builder(store.client()).build().unwrap();
    let out = split.process(|_t: Task| async { true }).await.unwrap();
    assert_eq!(out, Some(Processed::Recovered(Key::new("job").unwrap())));
    assert_eq!(parts_run(&store).await, vec!["written".to_owned()]);
}
