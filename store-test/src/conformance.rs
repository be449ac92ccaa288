//! The conformance suite: one set of behavioural tests every backend runs in
//! full, one file per topic.
//!
//! A backend implements [`Harness`] and invokes
//! [`conformance_tests!`](crate::conformance_tests) once in its integration
//! tests:
//!
//! ```text
//! async fn harness() -> Option<MyHarness> { Some(MyHarness::new()) }
//! store_test::conformance_tests!(harness, #[tokio::test(start_paused = true)]);
//! ```
//!
//! Each topic's `cases` module is a [`suite`](crate::suite): its `pub async
//! fn`s over a harness are its tests, and nothing else lists them.
//!
//! Nothing here is backend-specific except time control: the suite waits with
//! `tokio::time::sleep`, which a paused runtime (memory) skips through instantly
//! and a real server (MongoDB) waits out with short leases.
//!
//! # Cancel safety
//!
//! The `async fn`s here are test bodies, each on a store of its own
//! ([`Harness::store`]): dropped half-way, one leaves that store half-written
//! and nothing else.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

pub mod claim_many;
pub mod claims;
pub mod documents;
pub mod indexes;
pub mod leases;
pub mod watch;
pub mod writes;

pub(crate) use std::time::Duration;

pub(crate) use bson::{doc, Bson, Document};
pub(crate) use store_trait::{
    BatchOutcome, ChangeKind, Claim, Collection, Condition, DeleteOutcome, IndexSpec, InsertOutcome, Key, Mutation,
    Nonce, Order, Query, Record, Store, StoreError, StoreTime, Ttl, Write, WriteOutcome,
};

pub(crate) use crate::{Harness, Needs};

pub(crate) fn coll(name: &str) -> Collection {
    Collection::new(name).unwrap()
}

pub(crate) fn key(k: &str) -> Key {
    Key::new(k).unwrap()
}

pub(crate) fn ttl_of(d: Duration) -> Ttl {
    Ttl::new(d).unwrap()
}

pub(crate) fn acquire(owner: &str, ttl: Ttl) -> Write {
    Write::new(Condition::Free.or(Condition::HeldBy(owner.into())), Mutation::new().grant(owner, ttl).bump_fence())
        .upsert()
}

pub(crate) fn release(owner: &str) -> Write {
    Write::new(Condition::OwnedBy(owner.into()), Mutation::new().release())
}

pub(crate) fn applied(o: WriteOutcome) -> Record {
    match o {
        WriteOutcome::Applied(r) => r,
        WriteOutcome::Rejected(r) => panic!("expected the write to apply, it was rejected; current: {r:?}"),
    }
}

pub(crate) fn rejected(o: WriteOutcome) -> Option<Record> {
    match o {
        WriteOutcome::Rejected(r) => r,
        WriteOutcome::Applied(r) => panic!("expected the write to be rejected, it applied: {r:?}"),
    }
}

pub(crate) fn task(id: &str, priority: i32, run_at_ms: i64) -> bson::Document {
    doc! { "_id": id, "agent_name": "a", "ready": true, "priority": priority, "run_at": bson::DateTime::from_millis(run_at_ms) }
}

pub(crate) fn claim_for(owner: &str, ttl: Ttl) -> Claim {
    let claimable = Condition::FieldEq("ready".into(), Bson::Boolean(true)).or(Condition::Exists("complete".into())
        .negate()
        .and(Condition::Exists("claimed".into()))
        .and(Condition::Free));
    Claim {
        query: Query::eq(doc! { "agent_name": "a" })
            .when(claimable)
            .when(Condition::DueBy("run_at".into()))
            .sort("priority", Order::Desc)
            .sort("run_at", Order::Asc)
            .sort("_id", Order::Asc),
        mutation: Mutation::new()
            .grant(owner, ttl)
            .bump_fence()
            .set("ready", false)
            .set("claimed", true)
            .inc("attempts", 1),
    }
}
