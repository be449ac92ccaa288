//! A batch claim that crashes between its steps, on a real server: the read
//! back fails after the conditional updates applied (`failCommand` on the
//! second `find`). The caller gets an error and holds nothing; the documents
//! stay leased to the lost batch's owner, lapse at the lease's end, and are
//! claimed again with a higher fence.

use std::time::Duration;

use bson::doc;
use store_trait::{Claim, Collection, Condition, Mutation, Order, Query, Store, Ttl};

fn batch(owner: &str, ttl: Ttl) -> Claim {
    Claim {
        query: Query::all().when(Condition::Free).sort("n", Order::Asc),
        mutation: Mutation::new().grant(owner, ttl).bump_fence().set("ready", false),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_lost_between_update_and_read_back_lapses_and_is_claimed_again() {
    let Some(store) = store_test::mongo::test_store_as("claim_many_crash", "cmcrash").await else { return };
    let Some(admin) = store_test::mongo::admin_client("claim_many_crash").await else { return };
    let c = Collection::new("tasks").unwrap();
    let docs = (0..3).map(|n| doc! { "_id": format!("t{n}"), "n": n, "ready": true }).collect();
    store.insert_many(&c, docs).await.unwrap();
    let ttl = Ttl::new(Duration::from_millis(1500)).unwrap();
    // The candidates' `find` passes, the read back fails (and its retry).
    admin
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand", "mode": { "skip": 1 },
            "data": { "failCommands": ["find"], "errorCode": 2, "appName": "cmcrash" },
        })
        .await
        .unwrap();
    let lost = store.claim_many(&c, &batch("lost", ttl), 3).await;
    admin.database("admin").run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" }).await.unwrap();
    assert!(lost.is_err(), "the read back failed: {lost:?}");
    for n in 0..3 {
        let r = store.get(&c, &store_trait::Key::new(format!("t{n}")).unwrap()).await.unwrap().record.unwrap();
        assert_eq!((r.fence(), r.lease().map(|l| l.owner.as_str())), (1, Some("lost")), "applied before the crash");
    }
    assert!(store.claim_many(&c, &batch("early", ttl), 3).await.unwrap().is_empty(), "a live batch is not taken");
    // Wait for the lease (on the server's clock) to lapse.
    let until =
        store.get(&c, &store_trait::Key::new("t0").unwrap()).await.unwrap().record.unwrap().lease().unwrap().until;
    while store.now().await.unwrap() <= until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = store.claim_many(&c, &batch("next", ttl), 3).await.unwrap();
    let got: Vec<(String, u64)> = again.iter().map(|r| (r.key().to_string(), r.fence())).collect();
    assert_eq!(got, [("t0".to_owned(), 2), ("t1".to_owned(), 2), ("t2".to_owned(), 2)]);
}
