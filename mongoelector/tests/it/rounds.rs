//! The rounds (on_loop after the lease maintenance), `on_new_leader`, and the
//! status documents (schema, reader, garbage collection).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongoelector::{status, Elector, DEFAULT_COLLECTION, DEFAULT_STATUS_COLLECTION};
use mongolock::{Identity, Lock};
use store_memory::MemoryStore;
use store_trait::{Collection, Condition, Key, Mutation, Store, Write};

use crate::suite::wait_leader;

const TTL: Duration = Duration::from_secs(3);

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}"));
}

#[tokio::test(start_paused = true)]
async fn on_loop_runs_after_the_rounds_renewal() {
    let store = MemoryStore::new();
    // Someone else holds the lease at first, so this node's term begins between
    // two of its rounds.
    let other = Lock::builder(store.clone(), "scheduler").collection(DEFAULT_COLLECTION).ttl(TTL).build().unwrap();
    let held = other.acquire().await.unwrap();
    let (coll, key) = (Collection::new(DEFAULT_COLLECTION).unwrap(), Key::new("scheduler").unwrap());
    let me = Identity::new("node-a", 1);
    let seen: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let (s, id, log) = (store.clone(), me.clone(), seen.clone());
    let a = Elector::builder(store.clone(), "scheduler")
        .ttl(TTL)
        .identity(me)
        .report_status(false)
        .on_loop(move || {
            // What is left of this node's lease when on_loop runs.
            let snap = s.peek(&coll, &key).unwrap();
            let lease = snap.record.as_ref().and_then(|r| r.holder_at(snap.now));
            if let Some(l) = lease.filter(|l| id.is_mine(&l.owner)) {
                log.lock().unwrap().push(snap.now.until(l.until));
            }
        })
        .build()
        .unwrap();
    a.start().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    held.release().await.unwrap();
    wait_leader(std::slice::from_ref(&a)).await;
    tokio::time::sleep(TTL * 3).await;
    a.stop().await;
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 8, "rounds as leader: {seen:?}");
    assert!(
        seen.iter().all(|left| *left >= TTL - Duration::from_millis(50)),
        "on_loop runs right after the round renewed the lease: {seen:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn on_new_leader_reports_each_new_leader_once() {
    let store = MemoryStore::new();
    let node = |log: &Arc<Mutex<Vec<String>>>| {
        let log = log.clone();
        Elector::builder(store.clone(), "scheduler")
            .ttl(TTL)
            .report_status(false)
            .on_new_leader(move |l| log.lock().unwrap().push(l.owner))
            .build()
            .unwrap()
    };
    let (a_log, b_log) = (Arc::default(), Arc::default());
    let (a, b) = (node(&a_log), node(&b_log));
    a.start().unwrap();
    wait_leader(std::slice::from_ref(&a)).await;
    b.start().unwrap();
    wait_until("b reports a", || b_log.lock().unwrap().len() == 1).await;
    a.stop().await;
    wait_leader(std::slice::from_ref(&b)).await;
    wait_until("b reports itself", || b_log.lock().unwrap().len() == 2).await;
    // Renewals are no new leader.
    tokio::time::sleep(TTL * 3).await;
    b.stop().await;
    let (a_log, b_log) = (a_log.lock().unwrap().clone(), b_log.lock().unwrap().clone());
    assert_eq!(a_log.len(), 1, "{a_log:?}");
    assert!(a.identity().is_mine(&a_log[0]));
    assert_eq!(b_log.len(), 2, "{b_log:?}");
    assert!(a.identity().is_mine(&b_log[0]) && b.identity().is_mine(&b_log[1]), "{b_log:?}");
}

#[tokio::test(start_paused = true)]
async fn status_documents_carry_the_version_and_are_garbage_collected() {
    let store = MemoryStore::new();
    let coll = Collection::new(DEFAULT_STATUS_COLLECTION).unwrap();
    let a = Elector::builder(store.clone(), "scheduler").ttl(TTL).version("app-1.2.3").build().unwrap();
    assert_eq!(a.node_status().last_round, None);
    a.start().unwrap();
    wait_leader(std::slice::from_ref(&a)).await;
    a.report_status().await.unwrap();
    let st = a.node_status();
    assert_eq!((st.version.as_str(), st.pid), ("app-1.2.3", std::process::id()));
    assert_eq!(st.host, a.identity().host());
    assert!(st.last_round.is_some());
    // A document the schema does not fit is left out and reported.
    let bad = Mutation::new().set(status::fields::ELECTION, "scheduler");
    store.write(&coll, &Key::new("by-hand").unwrap(), &Write::new(Condition::Always, bad).upsert()).await.unwrap();
    let reports = status::read_reports(&store, &coll, Some("scheduler")).await.unwrap();
    assert_eq!(reports.nodes.len(), 1);
    assert_eq!((reports.nodes[0].version.as_str(), reports.nodes[0].is_leader), ("app-1.2.3", true));
    assert_eq!(reports.skipped.len(), 1);
    assert_eq!((reports.skipped[0].id.as_str(), reports.skipped[0].field), ("by-hand", status::fields::NODE));
    // A pid out of a process id's range (`u32`) is not read as one.
    let mut wide = Mutation::new().set(status::fields::PID, i64::from(u32::MAX) + 1);
    for (k, v) in [(status::fields::NODE, "n"), (status::fields::HOST, "h"), (status::fields::VERSION, "v")] {
        wide = wide.set(k, v);
    }
    let wide = wide
        .set(status::fields::ELECTION, "other")
        .set(status::fields::IS_LEADER, false)
        .set_now(status::fields::LAST_ROUND);
    store.write(&coll, &Key::new("wide-pid").unwrap(), &Write::new(Condition::Always, wide).upsert()).await.unwrap();
    let other = status::read_reports(&store, &coll, Some("other")).await.unwrap();
    assert_eq!((other.nodes.len(), other.skipped[0].field), (0, status::fields::PID), "{other:?}");
    let detail = a.cluster_detail().await.unwrap();
    assert_eq!(detail.nodes, reports.nodes);
    a.stop().await;
    // A stopped node's document is deleted by the TTL index (a minute after its
    // last report at this ttl).
    tokio::time::sleep(Duration::from_secs(61)).await;
    store.prune_ttl();
    let left = status::read_reports(&store, &coll, None).await.unwrap();
    assert!(left.nodes.is_empty(), "the stopped node's status document is gone: {left:?}");
}
