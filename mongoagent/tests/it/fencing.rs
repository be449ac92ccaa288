//! Stale agents change nothing: a lapsed claim's late outcome is never taken for
//! done (memory store, paused time, fault injection).

use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, NewTask, Outcome, Processed, Queue, Task};
use store_memory::MemoryStore;
use store_trait::{Collection, Key};

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
    let a = Agent::builder(store.clone(), "w", "tasks").lease(Duration::from_secs(2)).build().unwrap();
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
                // the stuck task while the agent backs off.
                store.faults().fail_next(1);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    assert_eq!(q.requeue(doc! {"_id": "t"}, false).await.unwrap().len(), 1);
                });
                Outcome::done_with(doc! {"result": "first run"})
            }
        }
    };
    let token = record(&store, "t").fence() + 1;
    let out = a.process(handler).await.unwrap();
    assert_eq!(out, Some(Processed::Stale(Key::new("t").unwrap())), "the outcome was never written");
    assert_eq!(a.log().completed, 0);
    let r = record(&store, "t");
    assert_eq!((r.data().get_bool("ready").unwrap(), r.data().get_bool("complete").unwrap()), (true, false));
    assert!(r.data().get("result").is_none());
    assert_eq!(r.fence(), token + 1, "a requeue bumps the fence");
}

/// A run whose claim lapsed while another agent took the task over returns
/// follow-ups first (with its own data), then its outcome is rejected. Its
/// follow-ups never run; the holder's, with the same ids, do.
#[tokio::test(start_paused = true)]
async fn a_stale_runs_follow_ups_never_run() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("split", doc! {}).id("job")).await.unwrap();
    let (client_a, client_b) = (store.client(), store.client());
    let builder = |c: &store_memory::Client| {
        Agent::builder(c.clone(), "split", "tasks")
            .lease(Duration::from_secs(2))
            .sleep_between(Duration::from_secs(3600))
    };
    let (a, b) = (builder(&client_a).build().unwrap(), builder(&client_b).build().unwrap());
    let (a_running_tx, a_running) = tokio::sync::oneshot::channel::<()>();
    let (a_go, a_go_rx) = tokio::sync::oneshot::channel::<()>();
    let handler_a = {
        let cell = std::sync::Mutex::new(Some((a_running_tx, a_go_rx)));
        move |_t: Task| {
            let (running, go) = cell.lock().unwrap().take().unwrap();
            async move {
                running.send(()).unwrap();
                go.await.unwrap();
                Outcome::done().follow_up(NewTask::new("part", doc! {"from": "stale"}))
            }
        }
    };
    let run_a = tokio::spawn(async move { a.process(handler_a).await });
    a_running.await.unwrap();
    // Agent A is cut off until its claim lapses; agent B takes the task over.
    client_a.set_partitioned(true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (b_running_tx, b_running) = tokio::sync::oneshot::channel::<()>();
    let (b_go, b_go_rx) = tokio::sync::oneshot::channel::<()>();
    let handler_b = {
        let cell = std::sync::Mutex::new(Some((b_running_tx, b_go_rx)));
        move |_t: Task| {
            let (running, go) = cell.lock().unwrap().take().unwrap();
            async move {
                running.send(()).unwrap();
                go.await.unwrap();
                Outcome::done().follow_up(NewTask::new("part", doc! {"from": "holder"}))
            }
        }
    };
    let run_b = tokio::spawn(async move { b.process(handler_b).await });
    b_running.await.unwrap();
    // A comes back and finishes first: its follow-ups are inserted before its
    // outcome is rejected.
    client_a.set_partitioned(false);
    a_go.send(()).unwrap();
    assert_eq!(run_a.await.unwrap().unwrap(), Some(Processed::Stale(Key::new("job").unwrap())));
    b_go.send(()).unwrap();
    assert_eq!(run_b.await.unwrap().unwrap(), Some(Processed::Completed(Key::new("job").unwrap())));

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
    assert_eq!(*seen.lock().unwrap(), vec!["holder".to_owned()], "only the holder's follow-up ran");
}

/// The agent dies after its outcome write, before it activated the follow-ups:
/// the next agent to claim the task activates them (only those of the claim
/// whose outcome was written) and ends the task; no handler runs twice.
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
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = {
        let seen = seen.clone();
        move |t: Task| {
            seen.lock().unwrap().push(t.data().get_str("from").unwrap().to_owned());
            async { true }
        }
    };
    while part.process(handler.clone()).await.unwrap().is_some() {}
    assert_eq!(*seen.lock().unwrap(), vec!["written".to_owned()]);
    assert!(record(&store, "job/1").data().get_bool("ready").is_ok_and(|r| !r), "the stale one stays inert");
}
