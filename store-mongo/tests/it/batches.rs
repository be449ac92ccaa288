//! Batches on a real server, with failpoints: a batch claim when another
//! caller claims one of its candidates between its `find` and its `update`,
//! and a batch of writes whose write concern fails.

use std::time::Duration;

use bson::{doc, Bson};
use store_test::mongo::{admin_client, connect_as, test_store_as};
use store_trait::{Claim, Collection, Condition, Key, Mutation, Order, Query, Store, Ttl, Write};

fn claim(owner: &str) -> Claim {
    Claim {
        query: Query::eq(doc! { "ready": true }).when(Condition::Free).sort("_id", Order::Asc),
        mutation: Mutation::new()
            .grant(owner, Ttl::new(Duration::from_secs(60)).unwrap())
            .bump_fence()
            .set("ready", false),
    }
}

/// A batch hands out only what its own update claimed: a candidate someone
/// else took in between is passed over, not returned as the batch's (its read
/// back is by the call's nonce, not by the candidates' ids).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_claim_returns_only_what_it_claimed() {
    let test = "a_batch_claim_returns_only_what_it_claimed";
    let Some(batcher) = test_store_as(test, "cmbatch").await else { return };
    let Some(other) = connect_as(test, "cmother").await else { return };
    let Some(admin) = admin_client(test).await else { return };
    let c = Collection::new("tasks").unwrap();
    let tasks = ["t0", "t1", "t2"].map(|id| doc! { "_id": id, "ready": true });
    batcher.insert_many(&c, tasks.to_vec()).await.unwrap();
    // The batch's `update` waits a second before it runs; its `find` does not.
    let data = doc! { "failCommands": ["update"], "blockConnection": true, "blockTimeMS": 1000, "appName": "cmbatch" };
    let fail_point = doc! { "configureFailPoint": "failCommand", "mode": { "times": 1 }, "data": data };
    admin.database("admin").run_command(fail_point).await.unwrap();
    let batch = tokio::spawn({
        let (store, c) = (batcher.clone(), c.clone());
        async move { store.claim_many(&c, &claim("batch"), 3).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let taken = other.claim(&c, &claim("other")).await.unwrap().expect("t0 is ready");
    assert_eq!(taken.key().as_bson(), &Bson::String("t0".into()));
    let got = batch.await.unwrap().unwrap();
    admin.database("admin").run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" }).await.unwrap();
    let owners: Vec<(String, String)> =
        got.iter().map(|r| (r.key().to_string(), r.lease().unwrap().owner.clone())).collect();
    assert_eq!(owners, [("t1".to_owned(), "batch".to_owned()), ("t2".to_owned(), "batch".to_owned())]);
}

async fn fail_once(admin: &mongodb::Client, data: bson::Document) {
    let fail_point = doc! { "configureFailPoint": "failCommand", "mode": { "times": 1 }, "data": data };
    admin.database("admin").run_command(fail_point).await.unwrap();
}

/// A batch of writes applied on the primary but not confirmed as asked (a
/// `writeConcernError`) is in doubt: an error the caller may retry, never
/// "applied".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_batch_not_confirmed_is_in_doubt() {
    let test = "a_write_batch_not_confirmed_is_in_doubt";
    let Some(store) = test_store_as(test, "wmconcern").await else { return };
    let Some(admin) = admin_client(test).await else { return };
    let c = Collection::new("tasks").unwrap();
    store.insert_many(&c, vec![doc! { "_id": "a" }, doc! { "_id": "b" }]).await.unwrap();
    let writes: Vec<(Key, Write)> = ["a", "b"]
        .into_iter()
        .map(|k| (Key::new(k).unwrap(), Write::new(Condition::Always, Mutation::new().set("done", true))))
        .collect();
    let concern = doc! { "code": 64, "errmsg": "waiting for replication timed out" };
    fail_once(&admin, doc! { "failCommands": ["update"], "writeConcernError": concern, "appName": "wmconcern" }).await;
    let out = store.write_many(&c, &writes).await;
    assert!(matches!(&out, Err(e) if e.is_ambiguous()), "{out:?}");
}
