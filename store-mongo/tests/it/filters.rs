//! Filters against the expressions they stand for: `filter::select` decides a
//! condition's plain equalities with query operators and everything else with
//! an `$expr`, and the two languages differ on arrays, nulls and types. A
//! `Not` is never translated, so on every document exactly one of a condition
//! and its negation must select it, over values no record could hold
//! (arrays, `undefined`, decimals, dates, NaN; not symbols, which one test
//! server cannot read in an `$expr`: docs/test-servers.md): the reference test
//! cannot write those, as it reads every document back.

use bson::{doc, Bson, Document};
use store_mongo::MongoStore;
use store_test::mongo::test_store;
use store_trait::{fields, Collection, Condition, Key, Query, Store};

/// Values of every kind where a query's `$eq` and an aggregation's may part.
fn values() -> Vec<Option<Bson>> {
    let decimal = |s: &str| Bson::Decimal128(s.parse().unwrap());
    vec![
        None,
        Some(Bson::Null),
        Some(Bson::Undefined),
        Some(Bson::Int32(0)),
        Some(Bson::Int32(1)),
        Some(Bson::Int64(1)),
        Some(Bson::Double(1.0)),
        Some(Bson::Double(-0.0)),
        Some(Bson::Double(1.5)),
        Some(Bson::Double(f64::NAN)),
        Some(Bson::Double(9_007_199_254_740_992.0)),
        Some(Bson::Int64(9_007_199_254_740_993)),
        Some(decimal("1")),
        Some(Bson::DateTime(bson::DateTime::from_millis(1))),
        Some(Bson::Boolean(true)),
        Some(Bson::String("a".into())),
        Some(Bson::String("$a".into())),
        Some(Bson::Array(vec![])),
        Some(Bson::Array(vec![Bson::Int32(1)])),
        Some(Bson::Array(vec![Bson::String("a".into())])),
        Some(Bson::Array(vec![Bson::Null])),
        Some(Bson::Array(vec![Bson::Array(vec![Bson::Int32(1)])])),
        Some(Bson::Document(doc! { "a": 1 })),
    ]
}

fn conditions() -> Vec<Condition> {
    vec![
        Condition::FenceIs(0),
        Condition::FenceIs(1),
        Condition::RevIs(1),
        Condition::RevIs(9_007_199_254_740_993),
        Condition::OwnedBy("a".into()),
        Condition::OwnedBy("$a".into()),
        Condition::FieldEq("x".into(), Bson::Int32(1)),
        Condition::FieldEq("x".into(), Bson::Int64(9_007_199_254_740_993)),
        Condition::FieldEq("x".into(), Bson::Boolean(true)),
        Condition::FieldEq("x".into(), Bson::String("a".into())),
        Condition::FieldEq("x".into(), Bson::String("$a".into())),
        Condition::OwnedBy("a".into()).and(Condition::FenceIs(1)),
    ]
}

async fn selects(store: &MongoStore, c: &Collection, key: &Key, cond: Condition) -> u64 {
    match store.count(c, &Query::all().keys([key.clone()]).when(cond.clone())).await {
        Ok(n) => n,
        Err(e) => panic!("{cond:?} on {key}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_operators_select_as_the_expressions_they_stand_for() {
    let Some(store) = test_store("query_operators_select_as_their_expressions").await else { return };
    let c = Collection::new("filters").unwrap();
    let raw = store.database().collection::<Document>("filters");
    let mut docs = Vec::new();
    for (i, v) in values().into_iter().enumerate() {
        for f in [fields::FENCE, fields::REV, fields::LEASE_OWNER, "x"] {
            let mut d = doc! { "_id": format!("{f}-{i}") };
            if let Some(v) = v.clone() {
                d.insert(f, v);
            }
            docs.push(d);
        }
    }
    raw.insert_many(docs.clone()).await.unwrap();
    for cond in conditions() {
        for d in &docs {
            let key = Key::from_bson(d.get("_id").unwrap().clone()).unwrap();
            let yes = selects(&store, &c, &key, cond.clone()).await;
            let no = selects(&store, &c, &key, cond.clone().negate()).await;
            assert_eq!(yes + no, 1, "{cond:?} and its negation on {d}: {yes} and {no}");
        }
    }
}
