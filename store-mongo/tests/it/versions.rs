//! Servers older than MongoDB 5.1 (no `$documents`) get another form of
//! `get`, tried here on the test server as if it reported their wire version;
//! the version is learned from the first `hello`, once.

use std::time::Duration;

use bson::doc;
use store_test::conformance::{documents, leases, writes};
use store_test::mongo::{assuming_wire_version, test_store, MongoHarness};
use store_trait::{Collection, Condition, FaultKind, Key, Mutation, Store, StoreError, Ttl, Write};

use crate::round_trips::{monitored, take};

/// MongoDB 4.4 and 5.0.
const OLD_WIRE_VERSIONS: [i32; 2] = [9, 13];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_reads_the_record_and_the_time_on_servers_before_5_1() {
    let Some(fresh) = test_store("get_before_5_1").await else { return };
    for wire in OLD_WIRE_VERSIONS {
        let s = assuming_wire_version(fresh.clone(), wire).unwrap();
        let (c, k) = (Collection::new(format!("locks{wire}")).unwrap(), Key::new("k").unwrap());
        // A collection that does not exist yet: still one row, with the time.
        let before = s.now().await.unwrap();
        let snap = s.get(&c, &k).await.unwrap();
        assert!(snap.record.is_none(), "wire {wire}");
        assert!(snap.now >= before, "wire {wire}: {} < {before}", snap.now);

        let ttl = Ttl::new(Duration::from_secs(60)).unwrap();
        let take = Write::new(Condition::Free, Mutation::new().grant("a", ttl).bump_fence()).upsert();
        let written = s.write(&c, &k, &take).await.unwrap().record().cloned().unwrap();
        let other = Key::new("other").unwrap();
        s.write(&c, &other, &take).await.unwrap();
        let snap = s.get(&c, &k).await.unwrap();
        assert_eq!(snap.record.as_ref(), Some(&written), "wire {wire}: the document of that key only");
        assert!(snap.record.unwrap().is_held_by_at("a", snap.now), "wire {wire}");
        assert!(s.get(&c, &Key::new("missing").unwrap()).await.unwrap().record.is_none(), "wire {wire}");

        // A document of another program is reported, not misread.
        let raw = s.database().collection::<bson::Document>(c.as_str());
        raw.insert_one(doc! { "_id": "bad", "fence": "seven" }).await.unwrap();
        let e = s.get(&c, &Key::new("bad").unwrap()).await.unwrap_err();
        assert!(matches!(e, StoreError::Malformed { .. }), "wire {wire}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_before_4_4_are_refused_naming_the_version() {
    let Some(s) = test_store("before_4_4").await else { return };
    let e = assuming_wire_version(s, 8).unwrap_err();
    assert_eq!(e.fault_kind(), Some(FaultKind::Permanent), "{e}");
    assert!(e.to_string().contains("MongoDB 4.4 or newer"), "{e}");
}

/// The form is learned from one `hello`: before the first `get` of a store
/// made from a database handle, and never again; and the old form is one
/// command too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_version_is_learned_once() {
    let Some((s, seen, _)) = monitored("version_learned_once").await else { return };
    take(&seen); // the harness's dropDatabase
    let (c, k) = (Collection::new("locks").unwrap(), Key::new("k").unwrap());
    s.get(&c, &k).await.unwrap();
    assert_eq!(take(&seen), ["hello", "aggregate"], "first get");
    s.get(&c, &k).await.unwrap();
    assert_eq!(take(&seen), ["aggregate"], "later gets");
    let old = assuming_wire_version(s, 13).unwrap();
    old.get(&c, &k).await.unwrap();
    assert_eq!(take(&seen), ["aggregate"], "the form of MongoDB 5.0");
}

/// The conformance tests that read through `get` (directly, or a rejected
/// `delete`), in the form of MongoDB 5.0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_of_get_before_5_1() {
    let Some(h) = MongoHarness::get().await else { return };
    let h = h.assuming_wire_version(13);
    leases::cases::now_advances(&h).await;
    leases::cases::get_absent_and_present(&h).await;
    leases::cases::live_lease_is_never_taken(&h).await;
    leases::cases::lease_expires_on_store_clock(&h).await;
    writes::cases::conditional_delete(&h).await;
    documents::cases::foreign_documents_are_readable(&h).await;
}
