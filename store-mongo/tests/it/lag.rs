//! Watchers that cannot follow every event one by one: one that falls behind
//! the collection's one change stream (more unread events than the fan-out
//! buffer holds), and a keyed one whose collection is dropped, are told to
//! resync, never left with a silent gap.

use std::time::Duration;

use bson::doc;
use futures::StreamExt;
use store_test::mongo::test_store;
use store_trait::{ChangeKind, Collection, Key, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_falls_behind_is_told_to_resync() {
    let Some(store) = test_store("a_watcher_that_falls_behind_is_told_to_resync").await else { return };
    let c = Collection::new("events").unwrap();
    let last = Key::new("last").unwrap();
    // Three watchers on the one stream: two never read while the events
    // come, one reads along until it has seen the last insert (or fell behind
    // itself, which means the others did too).
    let mut behind = store.watch(&c, None).await.unwrap();
    let mut behind_keyed = store.watch(&c, Some(&last)).await.unwrap();
    let mut reader = store.watch(&c, None).await.unwrap();
    let reading = tokio::spawn(async move {
        while let Some(ev) = reader.next().await {
            let ev = ev.unwrap();
            if ev.kind == ChangeKind::Resync || ev.key.as_ref().is_some_and(|k| k.to_string() == "last") {
                return;
            }
        }
    });
    let docs = (0..400).map(|i| doc! { "_id": format!("d{i}") }).collect();
    store.insert_many(&c, docs).await.unwrap();
    store.insert_many(&c, vec![doc! { "_id": "last" }]).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), reading).await.expect("the stream delivers").unwrap();
    for (what, w) in [("unkeyed", &mut behind), ("keyed", &mut behind_keyed)] {
        let first = tokio::time::timeout(Duration::from_secs(10), w.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(first.kind, ChangeKind::Resync, "{what}: {first:?}");
    }
}

/// An event the stream cannot tie to one document (the collection dropped)
/// reaches a keyed watcher too, as `Resync`: whatever it waited for may be gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_watcher_is_told_when_its_collection_is_dropped() {
    let Some(store) = test_store("a_keyed_watcher_is_told_when_its_collection_is_dropped").await else { return };
    let c = Collection::new("locks").unwrap();
    store.insert_many(&c, vec![doc! { "_id": "job" }]).await.unwrap();
    let mut keyed = store.watch(&c, Some(&Key::new("job").unwrap())).await.unwrap();
    store.database().collection::<bson::Document>("locks").drop().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), keyed.next()).await.expect("told within 30 s");
    assert_eq!(first.map(|ev| ev.unwrap().kind), Some(ChangeKind::Resync));
}
