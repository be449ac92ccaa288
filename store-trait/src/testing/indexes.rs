//! Conformance tests of unique indexes beyond `unique_index_dedupes`.

use bson::doc;

use super::{coll, key, Harness, Needs};
use crate::{Condition, IndexSpec, InsertOutcome, Mutation, Order, Store, Write};

/// A unique key is free again once its document no longer holds it: after a
/// write removes the field, and after one changes its value (the new value
/// is then taken). A dedupe key retired by a write (mongoagent's dedupe
/// scopes) relies on it.
///
/// # Cancel safety
///
/// A test body on a store of its own, as every conformance test: dropped
/// half-way, it leaves that store half-written and nothing else.
pub async fn unique_key_is_released_by_a_write<H: Harness>(h: &H) {
    let test = "unique_key_is_released_by_a_write";
    let s = h.store(test).await;
    if !h.has(test, Needs::UniqueKeyRelease).await {
        return;
    }
    let c = coll("tasks");
    let idx = IndexSpec::new("dedupe", vec![("dedupe_key".into(), Order::Asc)]).unique().sparse();
    s.ensure_indexes(&c, &[idx]).await.unwrap();
    let docs = vec![doc! {"_id": "1", "dedupe_key": "x"}, doc! {"_id": "2", "dedupe_key": "y"}];
    s.insert_many(&c, docs).await.unwrap();
    let retire = Mutation::new().unset("dedupe_key").set("dedupe_key_retired", "x");
    assert!(s.write(&c, &key("1"), &Write::new(Condition::Always, retire)).await.unwrap().is_applied());
    let change = Mutation::new().set("dedupe_key", "z");
    assert!(s.write(&c, &key("2"), &Write::new(Condition::Always, change)).await.unwrap().is_applied());
    let out = s
        .insert_many(
            &c,
            vec![
                doc! {"_id": "3", "dedupe_key": "x"},
                doc! {"_id": "4", "dedupe_key": "y"},
                doc! {"_id": "5", "dedupe_key": "z"},
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        out,
        vec![InsertOutcome::Inserted(key("3")), InsertOutcome::Inserted(key("4")), InsertOutcome::Duplicate(key("5"))],
        "x removed and y changed are free again; z is taken"
    );
}
