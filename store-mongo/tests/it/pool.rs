//! Change streams must not hold pooled connections while their owner is busy
//! elsewhere. The driver keeps a change stream's in-flight `getMore`, and the
//! connection it checked out, inside the stream; a consumer that stops polling
//! (a `select!` that took another branch, an agent busy with its tasks) would
//! keep that connection until it polls again. With more idle watchers than
//! `maxPoolSize`, every operation then waits for a connection forever (seen:
//! the demo hung with 5 agents, 3 electors and 4 lock waiters on the default
//! pool of 10).

use std::time::Duration;

use futures::StreamExt;
use store_trait::{Collection, Key, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_change_streams_do_not_hold_connections() {
    let Some(store) = store_test::mongo::test_store_with("pool_idle_watchers", "maxPoolSize=2").await else {
        return;
    };
    let coll = Collection::new("watched").unwrap();
    let work = async {
        let mut streams = Vec::new();
        for _ in 0..4 {
            let mut s = store.watch(&coll, None).await.unwrap();
            // Start waiting for an event, then stop polling while it is in flight.
            let _ = tokio::time::timeout(Duration::from_millis(100), s.next()).await;
            streams.push(s);
        }
        store.get(&coll, &Key::new("k").unwrap()).await.unwrap();
        streams
    };
    let got = tokio::time::timeout(Duration::from_secs(20), work).await;
    assert!(got.is_ok(), "operations waited for connections held by idle change streams");
}

/// Watchers of one collection share one server-side stream, whatever their
/// number (counted on the server): each sees its own key's events; the stream
/// closes when the last watcher is gone, and the next watcher opens a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_share_one_stream_per_collection() {
    use store_test::mongo::{server_has, Feature};
    use store_trait::{ChangeKind, Condition, Mutation, Write};
    let test = "pool_shared_stream";
    let Some(store) = store_test::mongo::test_store_with(test, "maxPoolSize=3").await else {
        return;
    };
    if !server_has(test, Feature::IdleCursors).await {
        return;
    }
    // Its own pool: the count must not wait for the store's connections.
    let admin = store_mongo::mongodb::Client::with_uri_str(store_test::mongo::server_uri().unwrap()).await.unwrap();
    let ns = |c: &Collection| format!("{}.{}", store.database().name(), c.as_str());
    let coll = Collection::new("shared").unwrap();
    let (a, b) = (Key::new("a").unwrap(), Key::new("b").unwrap());
    let put = |k: Key| {
        let store = store.clone();
        let coll = coll.clone();
        async move {
            let w = Write::new(Condition::Exists("x".into()).negate(), Mutation::new().set("x", 1)).upsert();
            store.write(&coll, &k, &w).await.unwrap();
        }
    };
    for round in 0..2 {
        let coll_b = Collection::new(format!("shared_other_{round}")).unwrap();
        let mut only_a = store.watch(&coll, Some(&a)).await.unwrap();
        let mut all = store.watch(&coll, None).await.unwrap();
        let mut elsewhere = store.watch(&coll_b, None).await.unwrap();
        let mut more = Vec::new();
        for k in [None, Some(&a), Some(&b)] {
            more.push(store.watch(&coll, k).await.unwrap());
        }
        // Five watchers of one collection, one of another: one stream each.
        assert_eq!(server_streams(&admin, &ns(&coll)).await, 1, "one server-side stream for five watchers");
        assert_eq!(server_streams(&admin, &ns(&coll_b)).await, 1);
        put(b.clone()).await;
        put(a.clone()).await;
        assert_eq!(next_event(&mut all).await.key, Some(b.clone()));
        assert_eq!(next_event(&mut all).await.key, Some(a.clone()));
        let ev = next_event(&mut only_a).await;
        assert_eq!((ev.key, ev.kind), (Some(a.clone()), ChangeKind::Insert), "only its own key");
        assert!(
            tokio::time::timeout(Duration::from_millis(300), elsewhere.next()).await.is_err(),
            "no events from another collection"
        );
        drop((only_a, all, elsewhere, more));
        // Let the pumps notice that nobody watches, and close; the next round
        // opens new ones.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(server_streams(&admin, &ns(&coll)).await, 0, "closed with its last watcher");
        assert_eq!(server_streams(&admin, &ns(&coll_b)).await, 0);
        store.delete(&coll, &a, &Condition::Exists("x".into())).await.unwrap();
        store.delete(&coll, &b, &Condition::Exists("x".into())).await.unwrap();
    }
}

async fn next_event(s: &mut store_trait::ChangeStream) -> store_trait::ChangeEvent {
    tokio::time::timeout(Duration::from_secs(10), s.next()).await.expect("an event").unwrap().unwrap()
}

/// How many cursors (change streams, in these tests) are open on `ns`.
async fn server_streams(admin: &store_mongo::mongodb::Client, ns: &str) -> usize {
    store_test::mongo::open_cursors(admin, ns).await
}
