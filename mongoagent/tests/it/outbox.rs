//! Transactional enqueue (the outbox pattern), on the real server: a task
//! prepared by `Queue::prepare` and inserted with
//! `MongoStore::insert_in_session` exists if and only if the caller's
//! transaction commits. The server must support multi-document transactions
//! (a replica set); SecantusDB does. Each task is prepared before its
//! transaction starts, as `Queue::prepare` asks: what it writes (the queue's
//! indexes, a freed dedupe key) must precede the transaction's snapshot.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use mongoagent::{Agent, AgentError, CancellationToken, NewTask, Queue, Task};
use store_mongo::mongodb::ClientSession;
use store_mongo::MongoStore;
use store_trait::{Collection, Key, Store, StoreError};

fn tasks() -> Collection {
    Collection::new("tasks").unwrap()
}

async fn transaction(store: &MongoStore) -> ClientSession {
    let mut session = store.database().client().start_session().await.unwrap();
    session.start_transaction().await.unwrap();
    session
}

/// The business write of the transaction.
async fn place_order(store: &MongoStore, session: &mut ClientSession, id: i32) {
    let orders = store.database().collection::<Document>("orders");
    orders.insert_one(doc! { "_id": id }).session(session).await.unwrap();
}

async fn order_exists(store: &MongoStore, id: i32) -> bool {
    store.database().collection::<Document>("orders").find_one(doc! { "_id": id }).await.unwrap().is_some()
}

async fn task_exists(store: &MongoStore, id: &Key) -> bool {
    store.get(&tasks(), id).await.unwrap().record.is_some()
}

/// Committed: the task and the order appear together, and an idle agent,
/// whose only wake-up within the test is its change stream (its poll and
/// recheck are a minute away), runs the task. Before the commit, neither a
/// read nor the agent sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongo_a_committed_task_is_picked_up_by_an_idle_agent() {
    let Some(store) = store_test::mongo::test_store("ag_outbox_commit").await else { return };
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let ran: Arc<parking_lot::Mutex<Vec<Key>>> = Arc::default();
    let stop = CancellationToken::new();
    let agent = Agent::builder(store.clone(), "mail", "tasks")
        .poll_interval(Duration::from_secs(60))
        .recheck_interval(Duration::from_secs(60))
        .shutdown_on(&stop)
        .build()
        .unwrap();
    let seen = ran.clone();
    let working = tokio::spawn(async move {
        agent
            .work(move |t: Task| {
                seen.lock().push(t.id().clone());
                async { true }
            })
            .await
    });
    // The agent has claimed nothing and is waiting on its change stream.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let task = q.prepare(NewTask::new("mail", doc! { "order": 1 })).await.unwrap();
    let mut session = transaction(&store).await;
    place_order(&store, &mut session, 1).await;
    let id = task.id().clone();
    let inserted = store.insert_in_session(&mut session, q.collection(), task.into_document()).await.unwrap();
    assert_eq!(inserted, id, "the id prepare gave");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!task_exists(&store, &id).await, "not before the commit");
    assert!(ran.lock().is_empty(), "no agent runs it before the commit");

    let committed = Instant::now();
    session.commit_transaction().await.unwrap();
    while ran.lock().is_empty() && committed.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(*ran.lock(), vec![id.clone()], "the idle agent ran it, woken by the commit");
    assert!(order_exists(&store, 1).await);
    let ended = tokio::time::timeout(Duration::from_secs(20), q.wait_for(&id)).await.unwrap().unwrap();
    assert!(ended.completed(), "{ended:?}");
    stop.cancel();
    working.await.unwrap().unwrap();
}

/// Aborted: neither the order nor the task exists, no agent finds a task,
/// and the task's dedupe key is free for the next enqueue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongo_an_aborted_transaction_leaves_no_task() {
    let Some(store) = store_test::mongo::test_store("ag_outbox_abort").await else { return };
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let task = q.prepare(NewTask::new("mail", doc! { "order": 2 }).dedupe_key("order/2")).await.unwrap();
    let mut session = transaction(&store).await;
    place_order(&store, &mut session, 2).await;
    let id = task.id().clone();
    store.insert_in_session(&mut session, q.collection(), task.into_document()).await.unwrap();
    session.abort_transaction().await.unwrap();
    assert!(!task_exists(&store, &id).await);
    assert!(!order_exists(&store, 2).await);
    let agent = Agent::builder(store.clone(), "mail", "tasks").build().unwrap();
    assert_eq!(agent.process(|_t: Task| async { true }).await.unwrap(), None);
    let (again, new) = q.enqueue(NewTask::new("mail", doc! {}).dedupe_key("order/2")).await.unwrap();
    assert!(new && again != id, "the key was never taken");
}

/// The process dies before its commit: a session dropped unfinished (the
/// driver aborts it) and one never ended, its client shut down (a crash:
/// the server ends it after its lifetime). Neither task nor order is seen,
/// and no agent finds a task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongo_a_crash_before_commit_leaves_no_task() {
    let test = "ag_outbox_crash";
    let Some(store) = store_test::mongo::test_store(test).await else { return };
    // The transaction left open would stop every other test's notifications
    // for its lifetime where the server holds streams back behind it.
    if !store_test::mongo::server_has(test, store_test::mongo::Feature::StreamsPastOpenTransactions).await {
        return;
    }
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let mut ids = Vec::new();
    {
        let task = q.prepare(NewTask::new("mail", doc! { "order": 3 })).await.unwrap();
        let mut session = transaction(&store).await;
        place_order(&store, &mut session, 3).await;
        ids.push(store.insert_in_session(&mut session, q.collection(), task.into_document()).await.unwrap());
        drop(session);
    }
    {
        let Some(doomed) = store_test::mongo::connect_as(test, "doomed").await else { return };
        let dq = Queue::new(doomed.clone(), "tasks").unwrap();
        let task = dq.prepare(NewTask::new("mail", doc! { "order": 4 })).await.unwrap();
        let mut session = transaction(&doomed).await;
        place_order(&doomed, &mut session, 4).await;
        ids.push(doomed.insert_in_session(&mut session, dq.collection(), task.into_document()).await.unwrap());
        // No abort is sent: the process is gone with its connections.
        std::mem::forget(session);
        doomed.database().client().clone().shutdown().immediate(true).await;
    }
    for (id, order) in ids.iter().zip([3, 4]) {
        assert!(!task_exists(&store, id).await, "task {id}");
        assert!(!order_exists(&store, order).await, "order {order}");
    }
    let agent = Agent::builder(store.clone(), "mail", "tasks").build().unwrap();
    assert_eq!(agent.process(|_t: Task| async { true }).await.unwrap(), None);
    assert_eq!(store.count(&tasks(), &store_trait::Query::all()).await.unwrap(), 0);
}

/// A dedupe key that a task still holds makes the insert a typed duplicate
/// and the server aborts the transaction: the order does not commit either.
/// A key whose task no longer holds it (until-ended, ended) is moved off by
/// `prepare`, and the transaction's task takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongo_a_held_dedupe_key_fails_the_transaction_with_a_duplicate() {
    let test = "ag_outbox_dedupe";
    let Some(store) = store_test::mongo::test_store(test).await else { return };
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let (holder, _) = q.enqueue(NewTask::new("mail", doc! {}).dedupe_key("k")).await.unwrap();
    let task = q.prepare(NewTask::new("mail", doc! { "order": 5 }).dedupe_key("k")).await.unwrap();
    let mut session = transaction(&store).await;
    place_order(&store, &mut session, 5).await;
    let e = store.insert_in_session(&mut session, q.collection(), task.into_document()).await.unwrap_err();
    assert!(matches!(&e, StoreError::DuplicateKey { collection, .. } if collection == "tasks"), "{e:?}");
    let committed = session.commit_transaction().await;
    assert!(committed.is_err(), "the server aborted the transaction at the duplicate");
    assert!(!order_exists(&store, 5).await, "nothing of the transaction committed");
    assert_eq!(store.count(&tasks(), &store_trait::Query::all()).await.unwrap(), 1, "the holder alone");

    if !store_test::mongo::server_has(test, store_test::mongo::Feature::UniqueKeyRelease).await {
        return;
    }
    let ended = || NewTask::new("mail", doc! {}).dedupe_key("u").dedupe_scope(mongoagent::DedupeScope::UntilEnded);
    let (old, _) = q.enqueue(ended()).await.unwrap();
    let agent = Agent::builder(store.clone(), "mail", "tasks").build().unwrap();
    while agent.process(|_t: Task| async { true }).await.unwrap().is_some() {}
    let task = q.prepare(ended()).await.unwrap();
    let mut session = transaction(&store).await;
    place_order(&store, &mut session, 6).await;
    let id = store.insert_in_session(&mut session, q.collection(), task.into_document()).await.unwrap();
    session.commit_transaction().await.unwrap();
    assert!(id != old && id != holder);
    assert_eq!(q.enqueue(ended()).await.unwrap(), (id, false), "the transaction's task holds the key");
}

/// `prepare` checks a task as `enqueue` does, and refuses a debounce (which
/// rewrites a waiting task rather than insert one). On the memory store: no
/// server needed.
#[tokio::test(start_paused = true)]
async fn prepare_checks_the_task_as_enqueue_does() {
    let q = Queue::new(store_memory::MemoryStore::new(), "tasks").unwrap();
    let e = q.prepare(NewTask::new("mail", doc! { "ready": false })).await.unwrap_err();
    assert!(matches!(e, AgentError::ReservedField { .. }), "{e}");
    let e = q.prepare(NewTask::new("", doc! {})).await.unwrap_err();
    assert!(matches!(e, AgentError::InvalidTask(_)), "{e}");
    let debounced = NewTask::new("mail", doc! {}).dedupe_key("k").debounce(Duration::from_secs(1));
    let e = q.prepare(debounced).await.unwrap_err();
    assert!(matches!(e, AgentError::InvalidTask(_)), "{e}");
    let t = q.prepare(NewTask::new("mail", doc! { "n": 1 }).id("t1").delay(Duration::from_secs(5))).await.unwrap();
    assert_eq!(t.id(), &Key::new("t1").unwrap());
    let d = t.document();
    assert_eq!(
        (d.get_str("_id").ok(), d.get_str("agent_name").ok(), d.get_i32("n").ok()),
        (Some("t1"), Some("mail"), Some(1))
    );
    assert!(
        q.prepare(NewTask::new("mail", doc! {})).await.unwrap().document().get_object_id("_id").is_ok(),
        "an id of its own"
    );
    assert!(d.get_datetime("run_at").is_ok(), "its delay, on the store clock: {d}");
    assert!(q.tasks(doc! {}, None).await.unwrap().is_empty(), "nothing enqueued");
}

/// Grouped: a task prepared in its group and committed runs in its turn,
/// after the task enqueued before it; one whose transaction aborted leaves
/// no task and holds nothing up (its `after_insert` lands its slot's
/// announcement).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongo_a_committed_grouped_task_runs_in_its_turn_and_an_aborted_one_holds_nothing() {
    let Some(store) = store_test::mongo::test_store("ag_outbox_group").await else { return };
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let grouped = |n: i64| NewTask::new("mail", doc! { "n": n }).group("customer-1");
    q.enqueue(grouped(0)).await.unwrap();
    let aborted = q.prepare(grouped(1)).await.unwrap();
    let mut session = transaction(&store).await;
    store.insert_in_session(&mut session, q.collection(), aborted.document().clone()).await.unwrap();
    session.abort_transaction().await.unwrap();
    q.after_insert(&aborted).await.unwrap();
    let committed = q.prepare(grouped(2)).await.unwrap();
    let mut session = transaction(&store).await;
    place_order(&store, &mut session, 9).await;
    store.insert_in_session(&mut session, q.collection(), committed.document().clone()).await.unwrap();
    session.commit_transaction().await.unwrap();
    q.after_insert(&committed).await.unwrap();

    let ran: Arc<parking_lot::Mutex<Vec<i64>>> = Arc::default();
    let stop = CancellationToken::new();
    let agent = Agent::builder(store.clone(), "mail", "tasks").group_concurrency(1).shutdown_on(&stop).build().unwrap();
    let seen = ran.clone();
    let working = tokio::spawn(async move {
        agent
            .work(move |t: Task| {
                seen.lock().push(t.data().get_i64("n").unwrap());
                async { true }
            })
            .await
    });
    let t0 = Instant::now();
    while ran.lock().len() < 2 && t0.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    working.await.unwrap().unwrap();
    assert_eq!(*ran.lock(), vec![0, 2], "the committed task in its turn; the aborted one never");
    assert!(!task_exists(&store, aborted.id()).await);
    assert!(order_exists(&store, 9).await);
}
