//! The conformance suite: one set of behavioural tests every backend runs in full.
//!
//! A backend implements [`Harness`] and invokes [`conformance_tests!`](crate::conformance_tests)
//! once in its integration tests:
//!
//! ```text
//! async fn harness() -> Option<MyHarness> { Some(MyHarness::new()) }
//! store_trait::conformance_tests!(harness, #[tokio::test(start_paused = true)]);
//! ```
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

use std::time::Duration;

use bson::{doc, Bson, Document};

use crate::{
    BatchOutcome, ChangeKind, Claim, Collection, Condition, DeleteOutcome, IndexSpec, InsertOutcome, Key, Mutation,
    Nonce, Order, Query, Record, Store, StoreError, StoreTime, Ttl, Write, WriteOutcome,
};

/// What a backend provides to run the suite.
#[async_trait::async_trait]
pub trait Harness: Send + Sync + 'static {
    /// The store under test.
    type Store: Store + Clone;
    /// A store isolated from every other test (own database or own instance),
    /// named from the test.
    async fn store(&self, test: &str) -> Self::Store;
    /// A lease length that is short but reliably longer than a few round trips.
    fn ttl(&self) -> Duration;
    /// Whether this backend must support change notifications (the suite fails if
    /// it reports `Unsupported` when they were expected, and vice versa).
    fn change_streams_expected(&self) -> bool;
    /// Inserts `doc` exactly as given, past every check of the contract: what
    /// another program writes (a UUID `_id`, a string `fence`).
    async fn insert_raw(&self, store: &Self::Store, coll: &Collection, doc: Document);
    /// Runs a TTL pass now: documents whose TTL-indexed date is past are deleted,
    /// as the server's TTL monitor does about once a minute.
    async fn prune_ttl(&self, store: &Self::Store);
    /// Whether the backend keeps `need`, a part of the contract some servers
    /// are known to break. When it does not, the harness reports `test`
    /// (skipped, naming the servers it runs on, or failed) and the test
    /// returns. Every backend of this workspace keeps it but for the servers
    /// `docs/test-servers.md` lists.
    async fn has(&self, test: &str, need: Needs) -> bool {
        let _ = (test, need);
        true
    }
}

/// A part of the contract that some servers are known to break: a test that
/// relies on it asks [`Harness::has`] first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Needs {
    /// A unique index lets go of a key once its document no longer holds it
    /// (a write changed or removed the field), so another document can take
    /// it. SecantusDB's Rust server keeps the key until the document is
    /// deleted.
    UniqueKeyRelease,
}

mod indexes;
pub use indexes::unique_key_is_released_by_a_write;

/// Generates one `#[test]` function per conformance test. `$harness` is a path to
/// an `async fn() -> Option<impl Harness>` (`None` skips: the backend reports why);
/// `$attr` the test attribute to use.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:path, #[$attr:meta]) => {
        $crate::__conformance_tests!($harness, #[$attr],
            now_advances, get_absent_and_present, absent_key_is_created_with_fence_one,
            live_lease_is_never_taken, lease_expires_on_store_clock, owner_renews_and_keeps_since,
            renew_needs_a_live_lease, release_keeps_the_fence, fence_grows_over_1000_cycles,
            compare_and_set_on_fence_and_rev, conditional_delete, racers_32_fresh_key_one_winner,
            racers_32_expired_lease_one_winner, claim_orders_by_priority_then_time,
            claim_respects_leases_and_due_times, claim_on_empty_queue, insert_many_reports_duplicates,
            unique_index_dedupes, data_mutations_on_store_clock, find_and_count, field_conditions,
            due_by_tolerates_malformed_values, watch_or_clean_absence, watch_filtered_delivers_what_it_admits,
            lease_changes_pass_over_renewals, bad_inputs_are_typed_errors,
            foreign_documents_are_readable, gc_at_is_set_and_cleared, claims_pass_over_unreadable_documents,
            retried_write_recognises_its_nonce, claim_many_bumps_each_fence_in_order,
            claim_many_abandoned_batch_is_reclaimed, claim_many_racers_share_nothing,
            claim_many_racers_each_fill_their_batch, claims_by_keys_take_only_those_keys,
            write_many_reports_each_write, rejected_writes_remove_nothing, distinct_strings_of_a_field,
            unique_key_is_released_by_a_write
        );
    };
}

/// Runs a behaviour suite (a macro taking `(harness_fn, #[test_attr])`, such as
/// `lock_suite!`) on every backend: the memory store under paused time with and
/// without change notifications (lease `$ttl`), and a real MongoDB server. The
/// calling crate depends on `store-memory` and `store-mongo`, both with their
/// `testing` feature (the paths below resolve where the macro is used).
#[macro_export]
macro_rules! on_all_backends {
    ($suite:path, $ttl:expr) => {
        mod memory {
            async fn harness() -> Option<::store_memory::testing::MemoryHarness> {
                Some(::store_memory::testing::MemoryHarness::new($ttl))
            }
            $suite!(harness, #[tokio::test(start_paused = true)]);
        }
        mod memory_polling {
            async fn harness() -> Option<::store_memory::testing::MemoryHarness> {
                Some(::store_memory::testing::MemoryHarness::polling($ttl))
            }
            $suite!(harness, #[tokio::test(start_paused = true)]);
        }
        mod mongo {
            async fn harness() -> Option<::store_mongo::testing::MongoHarness> {
                ::store_mongo::testing::MongoHarness::get().await
            }
            $suite!(harness, #[tokio::test(flavor = "multi_thread", worker_threads = 2)]);
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($harness:path, #[$attr:meta], $($name:ident),* $(,)?) => {
        $(
            #[$attr]
            async fn $name() {
                let Some(h) = $harness().await else { return };
                $crate::testing::$name(&h).await;
            }
        )*
    };
}

fn coll(name: &str) -> Collection {
    Collection::new(name).unwrap()
}

fn key(k: &str) -> Key {
    Key::new(k).unwrap()
}

fn ttl_of(d: Duration) -> Ttl {
    Ttl::new(d).unwrap()
}

fn acquire(owner: &str, ttl: Ttl) -> Write {
    Write::new(Condition::Free.or(Condition::HeldBy(owner.into())), Mutation::new().grant(owner, ttl).bump_fence())
        .upsert()
}

fn release(owner: &str) -> Write {
    Write::new(Condition::OwnedBy(owner.into()), Mutation::new().release())
}

fn applied(o: WriteOutcome) -> Record {
    match o {
        WriteOutcome::Applied(r) => r,
        WriteOutcome::Rejected(r) => panic!("expected the write to apply, it was rejected; current: {r:?}"),
    }
}

fn rejected(o: WriteOutcome) -> Option<Record> {
    match o {
        WriteOutcome::Rejected(r) => r,
        WriteOutcome::Applied(r) => panic!("expected the write to be rejected, it applied: {r:?}"),
    }
}

pub async fn now_advances<H: Harness>(h: &H) {
    let s = h.store("now_advances").await;
    let a = s.now().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let b = s.now().await.unwrap();
    assert!(b.as_millis() >= a.as_millis() + 40, "store clock did not advance: {a} -> {b}");
    let snap = s.get(&coll("c"), &key("nothing")).await.unwrap();
    assert!(snap.now >= b, "get() returns the store's time: {} < {b}", snap.now);
}

pub async fn get_absent_and_present<H: Harness>(h: &H) {
    let s = h.store("get_absent_and_present").await;
    let (c, k) = (coll("locks"), key("k"));
    assert!(s.get(&c, &k).await.unwrap().record.is_none());
    // A long lease: the read must find it live however slow the server is.
    applied(s.write(&c, &k, &acquire("a", ttl_of(Duration::from_secs(60)))).await.unwrap());
    let snap = s.get(&c, &k).await.unwrap();
    let r = snap.record.expect("record exists");
    assert_eq!(r.key(), &k);
    assert!(r.is_held_by_at("a", snap.now));
}

pub async fn absent_key_is_created_with_fence_one<H: Harness>(h: &H) {
    let s = h.store("absent_key_is_created_with_fence_one").await;
    let before = s.now().await.unwrap();
    let ttl = ttl_of(Duration::from_secs(30));
    let r = applied(s.write(&coll("locks"), &key("k"), &acquire("a", ttl)).await.unwrap());
    let after = s.now().await.unwrap();
    assert_eq!((r.fence(), r.rev()), (1, 1));
    let lease = r.lease().expect("leased");
    assert_eq!(lease.owner, "a");
    assert!(lease.since >= before && lease.since <= after, "since {} not in [{before}, {after}]", lease.since);
    assert_eq!(lease.until.as_millis() - lease.since.as_millis(), 30_000);
    // Without upsert nothing is created.
    let w = Write::new(Condition::Free, Mutation::new().grant("a", ttl));
    assert_eq!(rejected(s.write(&coll("locks"), &key("other"), &w).await.unwrap()), None);
    assert!(s.get(&coll("locks"), &key("other")).await.unwrap().record.is_none());
}

/// The test that catches a server comparing dates wrongly: a live lease must never
/// be granted to someone else.
pub async fn live_lease_is_never_taken<H: Harness>(h: &H) {
    let s = h.store("live_lease_is_never_taken").await;
    let (c, k) = (coll("locks"), key("k"));
    let held = applied(s.write(&c, &k, &acquire("a", ttl_of(Duration::from_secs(60)))).await.unwrap());
    for other in ["b", "c"] {
        let cur = rejected(s.write(&c, &k, &acquire(other, ttl_of(Duration::from_secs(60)))).await.unwrap())
            .expect("current record is returned");
        let lease = cur.lease().expect("still leased");
        assert_eq!(lease.owner, "a");
        assert_eq!(lease.until, held.lease().unwrap().until);
        assert_eq!(cur.fence(), 1);
    }
    let free = Write::new(Condition::Free, Mutation::new().set("x", 1));
    rejected(s.write(&c, &k, &free).await.unwrap());
}

pub async fn lease_expires_on_store_clock<H: Harness>(h: &H) {
    let s = h.store("lease_expires_on_store_clock").await;
    let (c, k) = (coll("locks"), key("k"));
    let ttl = ttl_of(h.ttl());
    let r = applied(s.write(&c, &k, &acquire("a", ttl)).await.unwrap());
    // (That a live lease is not granted to another is `live_lease_is_never_taken`,
    // with a lease long enough for any server's speed.)
    // Wait until the store clock is past the lease.
    let until = r.lease().unwrap().until;
    loop {
        let now = s.now().await.unwrap();
        if now > until {
            break;
        }
        tokio::time::sleep(now.until(until) + Duration::from_millis(5)).await;
    }
    let snap = s.get(&c, &k).await.unwrap();
    assert!(snap.record.as_ref().unwrap().holder_at(snap.now).is_none(), "lapsed lease reads as free");
    let b = applied(s.write(&c, &k, &acquire("b", ttl)).await.unwrap());
    assert_eq!(b.lease().unwrap().owner, "b");
    assert_eq!(b.fence(), 2, "a new holder gets a larger fence");
}

pub async fn owner_renews_and_keeps_since<H: Harness>(h: &H) {
    let s = h.store("owner_renews_and_keeps_since").await;
    let (c, k) = (coll("locks"), key("k"));
    let ttl = ttl_of(Duration::from_secs(30));
    let first = applied(s.write(&c, &k, &acquire("a", ttl)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let renew = Write::new(Condition::HeldBy("a".into()), Mutation::new().grant("a", ttl));
    let second = applied(s.write(&c, &k, &renew).await.unwrap());
    assert!(second.lease().unwrap().until > first.lease().unwrap().until);
    assert_eq!(second.lease().unwrap().since, first.lease().unwrap().since);
    assert_eq!(second.fence(), first.fence(), "renewal does not bump the fence");
    assert_eq!(second.rev(), first.rev() + 1);
    // Re-acquiring through the acquire path while live is also a renewal of the same term.
    let third = applied(s.write(&c, &k, &acquire("a", ttl)).await.unwrap());
    assert_eq!(third.lease().unwrap().since, first.lease().unwrap().since);
    // Handed over under the holder's live lease, the lease is the new owner's
    // own: it starts now.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let hand_over = Write::new(Condition::HeldBy("a".into()), Mutation::new().grant("b", ttl).bump_fence());
    let fourth = applied(s.write(&c, &k, &hand_over).await.unwrap());
    assert!(fourth.lease().unwrap().since > first.lease().unwrap().since, "a new owner's lease starts anew");
}

pub async fn renew_needs_a_live_lease<H: Harness>(h: &H) {
    let s = h.store("renew_needs_a_live_lease").await;
    let (c, k) = (coll("locks"), key("k"));
    let ttl = ttl_of(h.ttl());
    let renew = |o: &str| Write::new(Condition::HeldBy(o.into()), Mutation::new().grant(o, ttl));
    assert_eq!(rejected(s.write(&c, &k, &renew("a")).await.unwrap()), None);
    applied(s.write(&c, &k, &acquire("a", ttl)).await.unwrap());
    let cur = rejected(s.write(&c, &k, &renew("b")).await.unwrap()).unwrap();
    assert_eq!(cur.lease().unwrap().owner, "a");
    tokio::time::sleep(ttl.as_duration() + Duration::from_millis(100)).await;
    rejected(s.write(&c, &k, &renew("a")).await.unwrap());
}

pub async fn release_keeps_the_fence<H: Harness>(h: &H) {
    let s = h.store("release_keeps_the_fence").await;
    let (c, k) = (coll("locks"), key("k"));
    let ttl = ttl_of(Duration::from_secs(30));
    applied(s.write(&c, &k, &acquire("a", ttl)).await.unwrap());
    let cur = rejected(s.write(&c, &k, &release("b")).await.unwrap()).unwrap();
    assert_eq!(cur.lease().unwrap().owner, "a", "only the owner releases");
    let r = applied(s.write(&c, &k, &release("a")).await.unwrap());
    assert!(r.lease().is_none());
    assert_eq!(r.fence(), 1);
    let b = applied(s.write(&c, &k, &acquire("b", ttl)).await.unwrap());
    assert_eq!(b.fence(), 2);
    // Releasing twice: the second is rejected, nothing changes.
    applied(s.write(&c, &k, &release("b")).await.unwrap());
    let cur = rejected(s.write(&c, &k, &release("b")).await.unwrap()).unwrap();
    assert_eq!(cur.fence(), 2);
}

pub async fn fence_grows_over_1000_cycles<H: Harness>(h: &H) {
    let s = h.store("fence_grows_over_1000_cycles").await;
    let (c, k) = (coll("locks"), key("k"));
    let ttl = ttl_of(Duration::from_secs(30));
    let mut last = 0;
    for i in 0..1000 {
        let owner = if i % 2 == 0 { "a" } else { "b" };
        let r = applied(s.write(&c, &k, &acquire(owner, ttl)).await.unwrap());
        assert!(r.fence() > last, "cycle {i}: fence {} after {last}", r.fence());
        last = r.fence();
        applied(s.write(&c, &k, &release(owner)).await.unwrap());
    }
    assert_eq!(last, 1000);
}

/// A write sent again with the same nonce (a retry after an ambiguous error)
/// recognises that an earlier attempt was applied, is itself reported as
/// rejected, and recognises nothing once another write was applied since, or
/// when no attempt ever applied.
pub async fn retried_write_recognises_its_nonce<H: Harness>(h: &H) {
    let s = h.store("retried_write_recognises_its_nonce").await;
    let (c, k) = (coll("locks"), key("k"));
    let ttl = ttl_of(Duration::from_secs(30));
    let r = applied(s.write(&c, &k, &acquire("a", ttl)).await.unwrap());
    let nonce = Nonce::generate();
    let fenced = Condition::OwnedBy("a".into()).and(Condition::FenceIs(r.fence()));
    let release = Write::new(fenced.clone(), Mutation::new().release()).with_nonce(nonce.clone());
    let first = s.write(&c, &k, &release).await.unwrap();
    assert!(first.applied_with(&nonce), "an applied write carries its nonce: {first:?}");
    assert_eq!(first.record().unwrap().last_nonce(), Some(nonce.as_str()));
    // The retry: rejected (nothing changed), and recognised as applied before.
    let retry = s.write(&c, &k, &release).await.unwrap();
    let cur = rejected(retry.clone()).unwrap();
    assert_eq!(cur.rev(), first.record().unwrap().rev(), "the retry changed nothing");
    assert!(retry.applied_with(&nonce), "the retry recognises its earlier application");
    assert_eq!(s.get(&c, &k).await.unwrap().record.unwrap().last_nonce(), Some(nonce.as_str()));
    // Another write's nonce is not ours, and a write without a nonce has none.
    let other = Nonce::generate();
    assert!(!retry.applied_with(&other));
    applied(s.write(&c, &k, &acquire("b", ttl)).await.unwrap());
    let after = s.write(&c, &k, &release).await.unwrap();
    assert!(!after.is_applied());
    assert!(!after.applied_with(&nonce), "a write applied since hides the earlier one");
    assert_eq!(after.record().unwrap().last_nonce(), None);
    // A write none of whose attempts applied is never recognised.
    let never = Write::new(fenced, Mutation::new().release()).with_nonce(other.clone());
    for _ in 0..2 {
        let o = s.write(&c, &k, &never).await.unwrap();
        assert!(!o.is_applied() && !o.applied_with(&other), "{o:?}");
    }
    // An idempotent write whose condition still holds applies again.
    let mark = Write::new(Condition::Always, Mutation::new().set("v", 1)).with_nonce(other.clone());
    applied(s.write(&c, &k, &mark).await.unwrap());
    let again = s.write(&c, &k, &mark).await.unwrap();
    assert!(again.is_applied() && again.applied_with(&other));
}

pub async fn compare_and_set_on_fence_and_rev<H: Harness>(h: &H) {
    let s = h.store("compare_and_set_on_fence_and_rev").await;
    let (c, k) = (coll("locks"), key("k"));
    let r = applied(s.write(&c, &k, &acquire("a", ttl_of(Duration::from_secs(30)))).await.unwrap());
    let stale =
        Write::new(Condition::OwnedBy("a".into()).and(Condition::FenceIs(r.fence() + 1)), Mutation::new().set("v", 1));
    rejected(s.write(&c, &k, &stale).await.unwrap());
    let good =
        Write::new(Condition::OwnedBy("a".into()).and(Condition::FenceIs(r.fence())), Mutation::new().set("v", 1));
    let r2 = applied(s.write(&c, &k, &good).await.unwrap());
    assert_eq!(r2.data().get("v"), Some(&Bson::Int32(1)));
    let old_rev = Write::new(Condition::RevIs(r.rev()), Mutation::new().set("v", 2));
    rejected(s.write(&c, &k, &old_rev).await.unwrap());
    let cur_rev = Write::new(Condition::RevIs(r2.rev()), Mutation::new().set("v", 2));
    assert_eq!(applied(s.write(&c, &k, &cur_rev).await.unwrap()).rev(), r2.rev() + 1);
}

pub async fn conditional_delete<H: Harness>(h: &H) {
    let s = h.store("conditional_delete").await;
    let (c, k) = (coll("locks"), key("k"));
    match s.delete(&c, &k, &Condition::Always).await.unwrap() {
        DeleteOutcome::Rejected(None) => {}
        other => panic!("deleting an absent document: {other:?}"),
    }
    let r = applied(s.write(&c, &k, &acquire("a", ttl_of(Duration::from_secs(30)))).await.unwrap());
    let wrong = Condition::OwnedBy("a".into()).and(Condition::FenceIs(r.fence() + 1));
    match s.delete(&c, &k, &wrong).await.unwrap() {
        DeleteOutcome::Rejected(Some(cur)) => assert_eq!(cur.fence(), r.fence()),
        other => panic!("stale delete: {other:?}"),
    }
    let right = Condition::OwnedBy("a".into()).and(Condition::FenceIs(r.fence()));
    match s.delete(&c, &k, &right).await.unwrap() {
        DeleteOutcome::Deleted(old) => assert_eq!(old.fence(), r.fence()),
        other => panic!("delete: {other:?}"),
    }
    assert!(s.get(&c, &k).await.unwrap().record.is_none());
}

async fn race<S: Store + Clone>(s: &S, c: &Collection, k: &Key, n: usize, ttl: Ttl) -> Vec<WriteOutcome> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (s, c, k) = (s.clone(), c.clone(), k.clone());
            tokio::spawn(async move { s.write(&c, &k, &acquire(&format!("racer-{i}"), ttl)).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in futures::future::join_all(tasks).await {
        out.push(t.expect("racer task").expect("racer write"));
    }
    out
}

fn one_winner(outcomes: &[WriteOutcome], expected_fence: u64) {
    let winners: Vec<&Record> = outcomes
        .iter()
        .filter_map(|o| match o {
            WriteOutcome::Applied(r) => Some(r),
            WriteOutcome::Rejected(_) => None,
        })
        .collect();
    assert_eq!(winners.len(), 1, "exactly one racer wins, got {}", winners.len());
    let winner = winners[0].lease().unwrap().owner.clone();
    assert_eq!(winners[0].fence(), expected_fence);
    for o in outcomes {
        if let WriteOutcome::Rejected(cur) = o {
            let cur = cur.as_ref().expect("losers see the current record");
            assert_eq!(cur.lease().unwrap().owner, winner, "losers see the winner");
        }
    }
}

pub async fn racers_32_fresh_key_one_winner<H: Harness>(h: &H) {
    let s = h.store("racers_32_fresh_key_one_winner").await;
    let out = race(&s, &coll("locks"), &key("fresh"), 32, ttl_of(Duration::from_secs(60))).await;
    one_winner(&out, 1);
}

pub async fn racers_32_expired_lease_one_winner<H: Harness>(h: &H) {
    let s = h.store("racers_32_expired_lease_one_winner").await;
    let (c, k) = (coll("locks"), key("k"));
    let ttl = ttl_of(h.ttl());
    applied(s.write(&c, &k, &acquire("old", ttl)).await.unwrap());
    tokio::time::sleep(ttl.as_duration() + Duration::from_millis(100)).await;
    let out = race(&s, &c, &k, 32, ttl_of(Duration::from_secs(60))).await;
    one_winner(&out, 2);
}

fn task(id: &str, priority: i32, run_at_ms: i64) -> bson::Document {
    doc! { "_id": id, "agent_name": "a", "ready": true, "priority": priority, "run_at": bson::DateTime::from_millis(run_at_ms) }
}

fn claim_for(owner: &str, ttl: Ttl) -> Claim {
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

pub async fn claim_orders_by_priority_then_time<H: Harness>(h: &H) {
    let s = h.store("claim_orders_by_priority_then_time").await;
    let c = coll("tasks");
    let t0 = s.now().await.unwrap().as_millis() - 10_000;
    let docs = vec![
        task("low-old", 0, t0),
        task("high-new", 5, t0 + 3),
        task("high-old", 5, t0 + 1),
        task("mid", 1, t0),
        task("low-new", 0, t0 + 5),
        doc! { "_id": "other-agent", "agent_name": "b", "ready": true, "priority": 9, "run_at": bson::DateTime::from_millis(t0) },
    ];
    s.insert_many(&c, docs).await.unwrap();
    let ttl = ttl_of(Duration::from_secs(60));
    let mut order = Vec::new();
    while let Some(r) = s.claim(&c, &claim_for("w", ttl)).await.unwrap() {
        assert_eq!(r.lease().unwrap().owner, "w");
        assert_eq!(r.fence(), 1);
        assert_eq!(r.data().get("ready"), Some(&Bson::Boolean(false)));
        assert_eq!(r.data().get("attempts"), Some(&Bson::Int64(1)));
        order.push(r.key().to_string());
        assert!(order.len() <= 5, "claimed too many: {order:?}");
    }
    assert_eq!(order, ["high-old", "high-new", "mid", "low-old", "low-new"]);
}

/// A query with [`Query::keys`] selects only those `_id`s (of every kind a
/// key has), still under its filter and condition, in its order: what a claim
/// by id from a list of candidates relies on, so a candidate another caller
/// took in between is passed over.
pub async fn claims_by_keys_take_only_those_keys<H: Harness>(h: &H) {
    let s = h.store("claims_by_keys_take_only_those_keys").await;
    let c = coll("tasks");
    let t0 = s.now().await.unwrap().as_millis() - 10_000;
    let oid = bson::oid::ObjectId::new();
    let mut docs = vec![task("k1", 0, t0), task("k2", 5, t0), task("k3", 9, t0), task("k4", 1, t0)];
    docs.push(
        doc! { "_id": oid, "agent_name": "a", "ready": true, "priority": 3, "run_at": bson::DateTime::from_millis(t0) },
    );
    docs.push(doc! { "_id": 7_i64, "agent_name": "b", "ready": true, "priority": 3 });
    s.insert_many(&c, docs).await.unwrap();
    let key = |k: &str| Key::new(k).unwrap();
    let ttl = ttl_of(Duration::from_secs(60));
    let by_keys = |owner: &str, keys: Vec<Key>| {
        let mut claim = claim_for(owner, ttl);
        claim.query = claim.query.keys(keys);
        claim
    };
    // The candidates in claim order, unreadable documents left out.
    let unreadable = doc! { "_id": "bad", "agent_name": "a", "ready": true, "priority": 9, "fence": "x" };
    h.insert_raw(&s, &c, unreadable).await;
    let listed = s.find_keys(&c, &claim_for("w", ttl).query.limit(3)).await.unwrap();
    assert_eq!(listed, [key("k3"), key("k2"), oid_key_of(oid)]);
    // No keys: nothing, though every document matches otherwise.
    assert!(s.claim(&c, &by_keys("w", vec![])).await.unwrap().is_none());
    assert_eq!(s.find(&c, &Query::all().keys([])).await.unwrap().len(), 0);
    // The highest priority among the keys, not among the collection (k3).
    let got = s.claim(&c, &by_keys("w", vec![key("k1"), key("k2")])).await.unwrap().expect("k2");
    assert_eq!(got.key(), &key("k2"));
    // Taken: a second claim of the same key passes it over.
    assert!(s.claim(&c, &by_keys("w2", vec![key("k2")])).await.unwrap().is_none());
    // An ObjectId key, and an integer key whose document fails the filter.
    let oid_key = oid_key_of(oid);
    let int_key = Key::from_bson(Bson::Int64(7)).unwrap();
    let got = s.claim(&c, &by_keys("w", vec![int_key.clone(), oid_key.clone()])).await.unwrap().expect("the oid");
    assert_eq!(got.key(), &oid_key);
    assert!(s.claim(&c, &by_keys("w", vec![int_key.clone()])).await.unwrap().is_none());
    assert_eq!(s.count(&c, &Query::all().keys([int_key])).await.unwrap(), 1);
    // More keys than the batch's limit: the first in order among them.
    let one = s.claim_many(&c, &by_keys("w5", vec![key("k1"), key("k3"), key("k4")]), 1).await.unwrap();
    assert_eq!(one.iter().map(|r| r.key().to_string()).collect::<Vec<_>>(), ["k3"]);
    // A batch among keys: in order, only those still claimable, each fenced.
    let batch = s.claim_many(&c, &by_keys("w3", vec![key("k1"), key("k2"), key("k3")]), 5).await.unwrap();
    let got: Vec<String> = batch.iter().map(|r| r.key().to_string()).collect();
    assert_eq!(got, ["k1"]);
    assert!(batch.iter().all(|r| r.fence() == 1));
    // k4 was never among the keys: still claimable.
    let left = s.claim(&c, &claim_for("w4", ttl)).await.unwrap().expect("k4");
    assert_eq!(left.key(), &key("k4"));
}

fn oid_key_of(oid: bson::oid::ObjectId) -> Key {
    Key::from_bson(Bson::ObjectId(oid)).unwrap()
}

pub async fn claim_respects_leases_and_due_times<H: Harness>(h: &H) {
    let s = h.store("claim_respects_leases_and_due_times").await;
    let c = coll("tasks");
    let now = s.now().await.unwrap().as_millis();
    s.insert_many(&c, vec![task("now", 0, now - 1000), task("later", 0, now + 3_600_000)]).await.unwrap();
    let ttl = ttl_of(h.ttl());
    let first = s.claim(&c, &claim_for("w1", ttl)).await.unwrap().expect("a due task");
    assert_eq!(first.key().to_string(), "now");
    let first_until = first.lease().unwrap().until;
    // A leased task and a future task are not claimable. Judged on the store
    // clock: a server slower than the lease may let the claim lapse first.
    let again = match s.claim(&c, &claim_for("w2", ttl)).await.unwrap() {
        None => {
            tokio::time::sleep(ttl.as_duration() + Duration::from_millis(100)).await;
            s.claim(&c, &claim_for("w2", ttl)).await.unwrap().expect("an expired claim is claimable again")
        }
        Some(r) => {
            let since = r.lease().unwrap().since;
            assert!(since >= first_until, "a live claim was taken: at {since}, held until {first_until}");
            r
        }
    };
    assert_eq!(again.key().to_string(), "now");
    assert_eq!(again.fence(), 2);
    assert_eq!(again.data().get("attempts"), Some(&Bson::Int64(2)));
    // The stale claimant's completion, fenced by its claim, is rejected.
    let complete = |owner: &str, fence: u64| {
        Write::new(
            Condition::OwnedBy(owner.into()).and(Condition::FenceIs(fence)),
            Mutation::new().release().set("complete", true),
        )
    };
    rejected(s.write(&c, first.key(), &complete("w1", first.fence())).await.unwrap());
    applied(s.write(&c, first.key(), &complete("w2", again.fence())).await.unwrap());
}

pub async fn claim_on_empty_queue<H: Harness>(h: &H) {
    let s = h.store("claim_on_empty_queue").await;
    assert!(s.claim(&coll("tasks"), &claim_for("w", ttl_of(h.ttl()))).await.unwrap().is_none());
}

pub async fn insert_many_reports_duplicates<H: Harness>(h: &H) {
    let s = h.store("insert_many_reports_duplicates").await;
    let c = coll("tasks");
    let out = s.insert_many(&c, vec![doc! {"_id": "a", "n": 1}, doc! {"_id": "b"}]).await.unwrap();
    assert_eq!(out, vec![InsertOutcome::Inserted(key("a")), InsertOutcome::Inserted(key("b"))]);
    let out = s
        .insert_many(&c, vec![doc! {"_id": "a", "n": 2}, doc! {"_id": "c"}, doc! {"_id": "c"}, doc! {"x": 1}])
        .await
        .unwrap();
    assert_eq!(out.len(), 4);
    assert_eq!(out[0], InsertOutcome::Duplicate(key("a")));
    assert_eq!(out[1], InsertOutcome::Inserted(key("c")));
    assert_eq!(out[2], InsertOutcome::Duplicate(key("c")));
    let generated = match &out[3] {
        InsertOutcome::Inserted(k) => k.clone(),
        other => panic!("generated id: {other:?}"),
    };
    let a = s.get(&c, &key("a")).await.unwrap().record.unwrap();
    assert_eq!(a.data().get("n"), Some(&Bson::Int32(1)), "a duplicate never overwrites");
    assert_eq!((a.rev(), a.fence()), (1, 0));
    assert!(s.get(&c, &generated).await.unwrap().record.is_some());
    assert_eq!(s.count(&c, &Query::all()).await.unwrap(), 4);
}

pub async fn unique_index_dedupes<H: Harness>(h: &H) {
    let s = h.store("unique_index_dedupes").await;
    let c = coll("tasks");
    let idx = IndexSpec::new("dedupe", vec![("dedupe_key".into(), Order::Asc)]).unique().sparse();
    s.ensure_indexes(&c, std::slice::from_ref(&idx)).await.unwrap();
    s.ensure_indexes(&c, &[idx]).await.unwrap();
    let out = s
        .insert_many(
            &c,
            vec![
                doc! {"_id": "1", "dedupe_key": "x"},
                doc! {"_id": "2", "dedupe_key": "x"},
                doc! {"_id": "3"},
                doc! {"_id": "4"},
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        out,
        vec![
            InsertOutcome::Inserted(key("1")),
            InsertOutcome::Duplicate(key("2")),
            InsertOutcome::Inserted(key("3")),
            InsertOutcome::Inserted(key("4"))
        ]
    );
    let clash = Write::new(Condition::Always, Mutation::new().set("dedupe_key", "x"));
    match s.write(&c, &key("3"), &clash).await {
        Err(StoreError::DuplicateKey { .. }) => {}
        other => panic!("a write violating a unique index: {other:?}"),
    }
    let doc3 = s.get(&c, &key("3")).await.unwrap().record.unwrap();
    assert!(doc3.data().get("dedupe_key").is_none(), "nothing half-written");
    s.ensure_indexes(&c, &[IndexSpec::gc()]).await.unwrap();
}

pub async fn data_mutations_on_store_clock<H: Harness>(h: &H) {
    let s = h.store("data_mutations_on_store_clock").await;
    let (c, k) = (coll("tasks"), key("t"));
    s.insert_many(&c, vec![doc! {"_id": "t", "drop": 1, "n": 5_i32}]).await.unwrap();
    let before = s.now().await.unwrap();
    let m = Mutation::new()
        .set("added", "yes")
        .unset("drop")
        .set_now("started_at")
        .set_time_after("retry_at", Duration::from_secs(10))
        .inc("n", 2)
        .inc("fresh", 1)
        .gc_after(ttl_of(Duration::from_secs(60)));
    let r = applied(s.write(&c, &k, &Write::new(Condition::Always, m)).await.unwrap());
    let after = s.now().await.unwrap();
    let d = r.data();
    assert_eq!(d.get_str("added").unwrap(), "yes");
    assert!(d.get("drop").is_none());
    assert_eq!((r.get_i64("n"), r.get_i64("fresh")), (Some(7), Some(1)));
    let started = r.get_time("started_at").unwrap();
    assert!(started >= before && started <= after, "set_now uses the store clock");
    assert_eq!(r.get_time("retry_at").unwrap().as_millis(), started.as_millis() + 10_000);
    assert!(d.get("gc_at").is_none(), "reserved fields are not user data");
}

pub async fn find_and_count<H: Harness>(h: &H) {
    let s = h.store("find_and_count").await;
    let c = coll("tasks");
    let docs = (0..10)
        .map(|i| doc! {"_id": format!("t{i}"), "agent_name": if i % 2 == 0 { "even" } else { "odd" }, "n": i})
        .collect();
    s.insert_many(&c, docs).await.unwrap();
    let q = Query::eq(doc! {"agent_name": "even"}).sort("n", Order::Desc).limit(3);
    let got: Vec<String> = s.find(&c, &q).await.unwrap().iter().map(|r| r.key().to_string()).collect();
    assert_eq!(got, ["t8", "t6", "t4"]);
    assert_eq!(s.count(&c, &q).await.unwrap(), 5);
    let q = Query::all().when(Condition::FieldEq("n".into(), Bson::Int64(3)));
    assert_eq!(s.count(&c, &q).await.unwrap(), 1);
    applied(s.write(&c, &key("t1"), &acquire("w", ttl_of(Duration::from_secs(30)))).await.unwrap());
    let held = Query::all().when(Condition::Free.negate());
    let got = s.find(&c, &held).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].key().to_string(), "t1");
    let by_owner = Query::eq(doc! {"lease_owner": "w"});
    assert_eq!(s.count(&c, &by_owner).await.unwrap(), 1);
}

pub async fn field_conditions<H: Harness>(h: &H) {
    let s = h.store("field_conditions").await;
    let (c, k) = (coll("tasks"), key("t"));
    s.insert_many(&c, vec![doc! {"_id": "t", "n": 1_i32, "s": "$notAnOperator", "z": null}]).await.unwrap();
    let cases = [
        (Condition::FieldEq("n".into(), Bson::Int64(1)), true),
        (Condition::FieldEq("n".into(), Bson::Double(1.0)), true),
        (Condition::FieldEq("n".into(), Bson::String("1".into())), false),
        (Condition::FieldEq("s".into(), Bson::String("$notAnOperator".into())), true),
        (Condition::FieldEq("missing".into(), Bson::Int32(1)), false),
        (Condition::Exists("z".into()), false),
        (Condition::Exists("missing".into()), false),
        (Condition::Exists("n".into()), true),
        (Condition::Exists("z".into()).negate(), true),
        (Condition::Any(vec![]), false),
        (Condition::All(vec![]), true),
        (Condition::Absent, false),
        (Condition::Free, true),
        (Condition::AtMost("n".into(), 1), true),
        (Condition::AtMost("n".into(), 0), false),
        (Condition::AtMost("z".into(), -1), true),
        (Condition::AtMost("missing".into(), i64::MIN), true),
        (Condition::AtMost("s".into(), i64::MAX), false),
    ];
    for (cond, expect) in cases {
        let w = Write::new(cond.clone(), Mutation::new());
        let got = s.write(&c, &k, &w).await.unwrap().is_applied();
        assert_eq!(got, expect, "{cond:?}");
    }
}

pub async fn due_by_tolerates_malformed_values<H: Harness>(h: &H) {
    let s = h.store("due_by_tolerates_malformed_values").await;
    let c = coll("tasks");
    let now = s.now().await.unwrap().as_millis();
    s.insert_many(
        &c,
        vec![
            doc! {"_id": "text", "run_at": "soon"},
            doc! {"_id": "missing"},
            doc! {"_id": "null", "run_at": null},
            doc! {"_id": "future-ms", "run_at": now + 3_600_000},
            doc! {"_id": "past-ms", "run_at": now - 1},
            doc! {"_id": "future-date", "run_at": bson::DateTime::from_millis(now + 3_600_000)},
        ],
    )
    .await
    .unwrap();
    let q = Query::all().when(Condition::DueBy("run_at".into())).sort("_id", Order::Asc);
    let got: Vec<String> = s.find(&c, &q).await.unwrap().iter().map(|r| r.key().to_string()).collect();
    assert_eq!(got, ["missing", "null", "past-ms", "text"]);
}

pub async fn watch_or_clean_absence<H: Harness>(h: &H) {
    use futures::StreamExt;
    let s = h.store("watch_or_clean_absence").await;
    let (c, k) = (coll("locks"), key("k"));
    let stream = s.watch(&c, Some(&k)).await;
    let mut all = s.watch(&c, None).await;
    match (&stream, h.change_streams_expected()) {
        (Err(StoreError::Unsupported { .. }), false) => return,
        (Ok(_), true) => {}
        (Err(e), true) => panic!("change streams expected: {e}"),
        (Ok(_), false) => panic!("change streams reported where none were expected"),
        (Err(e), false) => panic!("absence must be reported as Unsupported, got {e}"),
    }
    let mut stream = stream.unwrap();
    let mut all_stream = all.as_mut().map(|s| s.as_mut()).ok();
    s.write(&c, &key("other"), &acquire("a", ttl_of(Duration::from_secs(30)))).await.unwrap();
    s.write(&c, &k, &acquire("a", ttl_of(Duration::from_secs(30)))).await.unwrap();
    // A renewal moves only the expiry: waiters need not wake for it.
    let renew = Write::new(Condition::HeldBy("a".into()), Mutation::new().grant("a", ttl_of(Duration::from_secs(60))));
    assert!(s.write(&c, &k, &renew).await.unwrap().is_applied());
    s.write(&c, &k, &release("a")).await.unwrap();
    s.delete(&c, &k, &Condition::Always).await.unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 4 {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a change event within 10 s")
            .expect("stream open")
            .expect("event");
        if ev.kind == ChangeKind::Resync {
            continue;
        }
        assert_eq!(ev.key.as_ref(), Some(&k), "a key watch sees only its key");
        kinds.push(ev.kind);
    }
    assert_eq!(kinds, [ChangeKind::Insert, ChangeKind::Renewed, ChangeKind::Update, ChangeKind::Delete]);
    let all_stream = all_stream.as_mut().expect("collection watch");
    let first = tokio::time::timeout(Duration::from_secs(10), all_stream.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.key, Some(key("other")), "a collection watch sees every key");
}

/// A filtered subscription delivers the changes its filter admits, in order,
/// and none of the others: decided on the server by MongoDB, by the reference
/// rule (`semantics::change_admitted`) in memory. The filter is the queue's
/// (inserts, tasks made ready, leases let go without finishing, due times moved).
pub async fn watch_filtered_delivers_what_it_admits<H: Harness>(h: &H) {
    use crate::{fields, ChangeFilter, UpdateClause};
    let s = h.store("watch_filtered_delivers_what_it_admits").await;
    let c = coll("tasks");
    let filter = ChangeFilter::new()
        .inserts()
        .update(UpdateClause::sets("ready", true))
        .update(UpdateClause::sets(fields::LEASE_OWNER, Bson::Null).unless_sets("complete", true))
        .update(UpdateClause::touches("run_at"));
    let Some(mut stream) = filtered_watch(h, &s, &c, &filter).await else { return };
    let ttl = ttl_of(Duration::from_secs(30));
    let w = |m: Mutation| Write::new(Condition::Always, m);
    let (a, b) = (key("a"), key("b"));
    // Each write, and whether the filter admits it.
    let writes: Vec<(&Key, Write, bool)> = vec![
        (&a, w(Mutation::new().set("ready", false)).upsert(), true),
        (&a, w(Mutation::new().set("ready", true)), true),
        // Written with the value it has: not set, so not admitted.
        (&a, w(Mutation::new().set("ready", true).set("note", 1)), false),
        // A claim, a renewal, a finish: none makes anything claimable.
        (&a, w(Mutation::new().grant("x", ttl).set("ready", false)), false),
        (&a, w(Mutation::new().grant("x", ttl)), false),
        (&a, w(Mutation::new().release().set("complete", true)), false),
        (&b, w(Mutation::new().set("ready", false)).upsert(), true),
        (&b, w(Mutation::new().grant("x", ttl)), false),
        // Let go without finishing: admitted.
        (&b, w(Mutation::new().release()), true),
        (&b, w(Mutation::new().set("run_at", 5_i64)), true),
        (&b, w(Mutation::new().unset("run_at")), true),
        (&b, w(Mutation::new().set("other", "x")), false),
    ];
    let mut expected = Vec::new();
    for (i, (k, write, admitted)) in writes.iter().enumerate() {
        assert!(s.write(&c, k, write).await.unwrap().is_applied(), "write {i}");
        if *admitted {
            expected.push(((*k).clone(), i));
        }
    }
    s.delete(&c, &b, &Condition::Always).await.unwrap();
    let end = key("end");
    s.write(&c, &end, &w(Mutation::new().set("ready", false)).upsert()).await.unwrap();
    let got: Vec<Key> = events_until(&mut stream, &end).await.into_iter().filter_map(|ev| ev.key).collect();
    let want: Vec<Key> = expected.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(got, want, "admitted writes (by index): {:?}", expected.iter().map(|(_, i)| i).collect::<Vec<_>>());
    // An invalid filter is a typed error, never a subscription to everything.
    let bad = ChangeFilter::new().update(UpdateClause::sets("a.b", true));
    assert!(matches!(s.watch_filtered(&c, &bad).await, Err(StoreError::InvalidInput { .. })));
}

/// A filtered subscription, or `None` on a backend that has no change
/// notifications (and says so, as its harness expects).
async fn filtered_watch<H: Harness>(
    h: &H,
    s: &H::Store,
    c: &Collection,
    filter: &crate::ChangeFilter,
) -> Option<crate::ChangeStream> {
    match (s.watch_filtered(c, filter).await, h.change_streams_expected()) {
        (Err(StoreError::Unsupported { .. }), false) => None,
        (Ok(stream), true) => Some(stream),
        (Err(e), _) => panic!("a filtered watch: {e}"),
        (Ok(_), false) => panic!("change streams reported where none were expected"),
    }
}

/// The events of documents (resyncs passed over) that `stream` delivers
/// before one of `end`, each within 10 s of the last.
async fn events_until(stream: &mut crate::ChangeStream, end: &Key) -> Vec<crate::ChangeEvent> {
    use futures::StreamExt;
    let mut got = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a change event within 10 s")
            .expect("stream open")
            .expect("event");
        match &ev.key {
            None => continue,
            Some(k) if k == end => return got,
            Some(_) => got.push(ev),
        }
    }
}

/// [`ChangeFilter::lease_changes`](crate::ChangeFilter::lease_changes), what
/// lock waiters and followers subscribe to: a lease granted, handed over, let
/// go or removed is delivered; its renewals, and writes that leave the lease
/// alone, are not.
pub async fn lease_changes_pass_over_renewals<H: Harness>(h: &H) {
    use crate::ChangeFilter;
    let s = h.store("lease_changes_pass_over_renewals").await;
    let c = coll("locks");
    let Some(mut stream) = filtered_watch(h, &s, &c, &ChangeFilter::lease_changes()).await else { return };
    let ttl = ttl_of(Duration::from_secs(30));
    let w = |m: Mutation| Write::new(Condition::Always, m);
    let l = key("l");
    // Each write, and whether a waiter is told of it.
    let writes: Vec<(Write, bool)> = vec![
        (w(Mutation::new().grant("a", ttl).bump_fence()).upsert(), true),
        (w(Mutation::new().grant("a", ttl)), false),
        (w(Mutation::new().grant("a", ttl)), false),
        (w(Mutation::new().set("note", 1)), false),
        (w(Mutation::new().release()), true),
        (w(Mutation::new().grant("b", ttl).bump_fence()), true),
        (w(Mutation::new().grant("b", ttl)), false),
        // The same owner granted again (after its lease lapsed): a new fence.
        (w(Mutation::new().grant("b", ttl).bump_fence()), true),
        (w(Mutation::new().grant("c", ttl)), true),
    ];
    let mut want = Vec::new();
    for (i, (write, told)) in writes.iter().enumerate() {
        assert!(s.write(&c, &l, write).await.unwrap().is_applied(), "write {i}");
        if *told {
            want.push(i);
        }
    }
    s.delete(&c, &l, &Condition::Always).await.unwrap();
    let end = key("end");
    s.write(&c, &end, &w(Mutation::new().set("x", 1)).upsert()).await.unwrap();
    let kinds: Vec<ChangeKind> = events_until(&mut stream, &end).await.into_iter().map(|ev| ev.kind).collect();
    let got = kinds.len();
    assert_eq!(got, want.len() + 1, "told of writes {want:?} and the delete; got {kinds:?}");
    assert!(!kinds.contains(&ChangeKind::Renewed), "no renewal delivered: {kinds:?}");
    assert_eq!(kinds.last(), Some(&ChangeKind::Delete));
}

pub async fn bad_inputs_are_typed_errors<H: Harness>(h: &H) {
    let s = h.store("bad_inputs_are_typed_errors").await;
    let c = coll("locks");
    let k = key("k");
    let invalid = |r: Result<(), StoreError>, what: &str| match r {
        Err(StoreError::InvalidInput { .. }) => {}
        other => panic!("{what}: expected InvalidInput, got {other:?}"),
    };
    invalid(Key::new("").map(drop), "empty key");
    invalid(Collection::new("").map(drop), "empty collection");
    invalid(Ttl::new(Duration::ZERO).map(drop), "zero ttl");
    invalid(Ttl::from_secs_f64(-3.0).map(drop), "negative ttl");
    invalid(Ttl::new(Duration::from_secs(u64::MAX)).map(drop), "overflowing ttl");
    let ttl = ttl_of(Duration::from_secs(1));
    let bad_writes = [
        Write::new(Condition::OwnedBy("a".into()), Mutation::new()).upsert(),
        Write::new(Condition::Always, Mutation::new().set("lease_owner", "me")),
        Write::new(Condition::Always, Mutation::new().set("$set", 1)),
        Write::new(Condition::Always, Mutation::new().set("a.b", 1)),
        Write::new(Condition::Always, Mutation::new().set("x", 1).unset("x")),
        Write::new(Condition::Always, Mutation::new().grant("", ttl)),
        Write::new(Condition::FieldEq("x".into(), Bson::Null), Mutation::new()),
        Write::new(Condition::FenceIs(u64::MAX), Mutation::new()),
    ];
    for w in &bad_writes {
        invalid(s.write(&c, &k, w).await.map(drop), &format!("{w:?}"));
    }
    invalid(s.insert_many(&c, vec![doc! {"_id": "x", "fence": 3}]).await.map(drop), "reserved field on insert");
    invalid(s.insert_many(&c, vec![doc! {"_id": 1.5}]).await.map(drop), "float id");
    invalid(s.insert_many(&c, vec![doc! {"_id": ""}]).await.map(drop), "empty id");
    invalid(s.find(&c, &Query::eq(doc! {"n": {"$gt": 1}})).await.map(drop), "operator in filter");
    // Read from JSON as a regular expression, which a find filter matches by
    // pattern: an "equality" filter that would select every agent name.
    let regex = Bson::RegularExpression(bson::Regex {
        pattern: ".*".to_owned().try_into().unwrap(),
        options: String::new().try_into().unwrap(),
    });
    invalid(s.find(&c, &Query::eq(doc! {"agent_name": regex.clone()})).await.map(drop), "regex in filter");
    invalid(s.count(&c, &Query::eq(doc! {"agent_name": regex})).await.map(drop), "regex in count filter");
    invalid(s.find(&c, &Query::eq(doc! {"n": Bson::MinKey})).await.map(drop), "min key in filter");
    invalid(s.ensure_indexes(&c, &[IndexSpec::new("", vec![])]).await, "empty index");
    let claim = Claim { query: Query::all(), mutation: Mutation::new().set("_id", 1) };
    invalid(s.claim(&c, &claim).await.map(drop), "claim changing _id");
    // Nothing was written by any of the rejected calls.
    assert_eq!(s.count(&c, &Query::all()).await.unwrap(), 0);
}

/// A rejected write changes nothing, removals included, whatever fields the
/// document holds: a field named like a backend's own working field (the
/// MongoDB backend once marked a written document with `__mc_ok`, which a
/// user's field of that name faked) must not make a rejected write remove.
pub async fn rejected_writes_remove_nothing<H: Harness>(h: &H) {
    let s = h.store("rejected_writes_remove_nothing").await;
    let c = coll("tasks");
    let k = key("k");
    let d = doc! { "_id": "k", "__mc_ok": true, "ok": true, "written": true, "a": 1, "b": 2 };
    s.insert_many(&c, vec![d]).await.unwrap();
    let w = Write::new(Condition::FenceIs(99), Mutation::new().set("c", 3).unset("a").unset("b").clear_gc());
    assert!(!s.write(&c, &k, &w).await.unwrap().is_applied());
    let after = s.get(&c, &k).await.unwrap().record.unwrap();
    assert_eq!((after.get_i64("a"), after.get_i64("b"), after.get_i64("c")), (Some(1), Some(2), None), "{after:?}");
    let w = Write::new(Condition::FenceIs(0), Mutation::new().unset("a"));
    assert!(s.write(&c, &k, &w).await.unwrap().is_applied());
    let after = s.get(&c, &k).await.unwrap().record.unwrap();
    assert_eq!((after.get_i64("a"), after.get_i64("b")), (None, Some(2)), "an applied write removes: {after:?}");
}

/// The distinct string values of a field over the readable documents a
/// query matches, sorted: other types, missing fields and unreadable
/// documents are left out; a reserved or malformed field is refused.
pub async fn distinct_strings_of_a_field<H: Harness>(h: &H) {
    let s = h.store("distinct_strings_of_a_field").await;
    let c = coll("tasks");
    let docs = vec![
        doc! {"_id": "1", "agent_name": "resize", "ready": true},
        doc! {"_id": "2", "agent_name": "convert", "ready": true},
        doc! {"_id": "3", "agent_name": "resize", "ready": false},
        doc! {"_id": "4", "agent_name": 7, "ready": true},
        doc! {"_id": "5", "ready": true},
    ];
    s.insert_many(&c, docs).await.unwrap();
    h.insert_raw(&s, &c, doc! {"_id": "bad", "agent_name": "foreign", "fence": "1"}).await;
    let all = s.distinct_strings(&c, "agent_name", &Query::all()).await.unwrap();
    assert_eq!(all, ["convert", "resize"]);
    let ready = s.distinct_strings(&c, "agent_name", &Query::eq(doc! {"ready": false})).await.unwrap();
    assert_eq!(ready, ["resize"]);
    for bad in ["fence", "$x", "a.b"] {
        let r = s.distinct_strings(&c, bad, &Query::all()).await;
        assert!(matches!(r, Err(StoreError::InvalidInput { .. })), "{bad}: {r:?}");
    }
}

pub async fn foreign_documents_are_readable<H: Harness>(h: &H) {
    // Tasks written by the original mongo_agent carry ObjectId ids and no store
    // metadata; they must read, claim and complete like any other.
    let s = h.store("foreign_documents_are_readable").await;
    let c = coll("queue");
    let oid = bson::oid::ObjectId::new();
    s.insert_many(&c, vec![doc! {"_id": oid, "agent_name": "a", "ready": true}]).await.unwrap();
    let claim = Claim {
        query: Query::eq(doc! {"agent_name": "a", "ready": true}),
        mutation: Mutation::new().grant("w", ttl_of(Duration::from_secs(30))).bump_fence().set("ready", false),
    };
    let r = s.claim(&c, &claim).await.unwrap().expect("claimed");
    assert_eq!(r.key().as_bson(), &Bson::ObjectId(oid));
    let done = Write::new(
        Condition::HeldBy("w".into()).and(Condition::FenceIs(r.fence())),
        Mutation::new().release().set("complete", true),
    );
    let r = applied(s.write(&c, r.key(), &done).await.unwrap());
    assert_eq!(r.data().get("complete"), Some(&Bson::Boolean(true)));
    assert!(StoreTime::from_millis(0) < s.now().await.unwrap());
}

/// A document marked for collection is deleted by a TTL pass; one whose mark was
/// cleared (a task made ready again after it ended) is not.
pub async fn gc_at_is_set_and_cleared<H: Harness>(h: &H) {
    let s = h.store("gc_at_is_set_and_cleared").await;
    let c = coll("tasks");
    s.ensure_indexes(&c, &[IndexSpec::gc()]).await.unwrap();
    s.insert_many(&c, vec![doc! {"_id": "ended"}, doc! {"_id": "revived"}, doc! {"_id": "never"}]).await.unwrap();
    let mark =
        Write::new(Condition::Always, Mutation::new().set("complete", true).gc_after(ttl_of(Duration::from_millis(1))));
    for k in ["ended", "revived"] {
        applied(s.write(&c, &key(k), &mark).await.unwrap());
    }
    let revive = Write::new(Condition::Always, Mutation::new().set("complete", false).clear_gc());
    let r = applied(s.write(&c, &key("revived"), &revive).await.unwrap());
    assert!(r.data().get("gc_at").is_none());
    // Clearing a mark that is not there changes nothing else.
    applied(s.write(&c, &key("never"), &revive).await.unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    h.prune_ttl(&s).await;
    assert!(s.get(&c, &key("ended")).await.unwrap().record.is_none(), "a marked document is collected");
    for k in ["revived", "never"] {
        assert!(s.get(&c, &key(k)).await.unwrap().record.is_some(), "{k} must survive the TTL pass");
    }
    let both = Write::new(Condition::Always, Mutation::new().gc_after(ttl_of(Duration::from_secs(1))).clear_gc());
    assert!(matches!(s.write(&c, &key("never"), &both).await, Err(StoreError::InvalidInput { .. })));
}

/// Documents another program wrote, that the store cannot read as records: a
/// claim passes over them (it never hands out, or changes, one), `find_each`
/// reports each as a typed error naming its raw `_id` and returns the others,
/// `find` and `get` fail with the same typed error.
pub async fn claims_pass_over_unreadable_documents<H: Harness>(h: &H) {
    let s = h.store("claims_pass_over_unreadable_documents").await;
    let c = coll("queue");
    let uuid = bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![0xab; 16] };
    let task = |id: Bson, p: i32| doc! {"_id": id, "agent_name": "a", "ready": true, "priority": p};
    let with = |mut d: Document, extra: Document| {
        d.extend(extra);
        d
    };
    let bad = [
        task(Bson::Binary(uuid), 9),
        task(Bson::Double(1.5), 9),
        with(task("string-fence".into(), 9), doc! {"fence": "1"}),
        with(task("negative-fence".into(), 9), doc! {"fence": -1_i64}),
        with(task("fraction-rev".into(), 9), doc! {"rev": 1.5}),
        with(task("nan-rev".into(), 9), doc! {"rev": f64::NAN}),
        with(task("huge-since".into(), 9), doc! {"lease_since": 1.0e16}),
        with(task("decimal-fence".into(), 9), doc! {"fence": bson::Decimal128::from_bytes([0; 16])}),
        with(task("nul\0id".into(), 9), doc! {}),
        with(task("number-owner".into(), 9), doc! {"lease_owner": 7, "lease_until": 0_i64}),
        with(task("owner-without-until".into(), 9), doc! {"lease_owner": "x"}),
        with(task("text-until".into(), 9), doc! {"lease_owner": "x", "lease_until": "soon"}),
        // A fence no claim can bump without overflowing: a claim of it failed
        // with a malformed reply, and stopped an agent.
        with(task("max-fence".into(), 9), doc! {"fence": i64::MAX}),
        with(task("over-counter-rev".into(), 9), doc! {"rev": 9_000_000_000_000_001_i64}),
    ];
    let good = [
        with(task("double-fence".into(), 5), doc! {"fence": 2.0, "rev": 1_i32}),
        with(
            task("lapsed".into(), 4),
            doc! {"lease_owner": "x", "lease_until": bson::DateTime::from_millis(1), "fence": 3_i64},
        ),
        task(Bson::ObjectId(bson::oid::ObjectId::new()), 3),
        task(Bson::Int64(42), 2),
        with(task("negative-zero-fence".into(), 1), doc! {"fence": -0.0, "lease_since": 5.0}),
    ];
    for d in bad.iter().chain(good.iter()) {
        h.insert_raw(&s, &c, d.clone()).await;
    }
    let claim = Claim {
        query: Query::eq(doc! {"agent_name": "a", "ready": true}).sort("priority", Order::Desc),
        mutation: Mutation::new().grant("w", ttl_of(Duration::from_secs(30))).bump_fence().set("ready", false),
    };
    let mut claimed = Vec::new();
    while let Some(r) = s.claim(&c, &claim).await.unwrap() {
        claimed.push(r.key().clone());
        assert!(claimed.len() <= good.len(), "claimed an unreadable document: {claimed:?}");
    }
    let good_keys: Vec<Key> = good.iter().map(|d| Key::from_bson(d.get("_id").unwrap().clone()).unwrap()).collect();
    assert_eq!(claimed, good_keys, "every readable task, in order, and nothing else");

    let each = s.find_each(&c, &Query::all()).await.unwrap();
    assert_eq!(each.len(), bad.len() + good.len());
    let mut named = Vec::new();
    for r in &each {
        match r {
            Ok(r) => assert!(good_keys.contains(r.key()), "{r:?}"),
            Err(StoreError::Malformed { collection, key, .. }) => {
                assert_eq!(collection, "queue");
                named.push(key.clone());
            }
            Err(e) => panic!("expected Malformed, got {e}"),
        }
    }
    named.sort();
    // A key is named as such; a raw `_id` that is no key in extended JSON (a UUID
    // as `$binary`).
    let name = |id: &Bson| Key::from_bson(id.clone()).map_or_else(|_| crate::render_raw_id(id), |k| k.to_string());
    let mut want: Vec<String> = bad.iter().map(|d| name(d.get("_id").unwrap())).collect();
    want.sort();
    assert_eq!(named, want);
    assert!(named.iter().any(|k| k.contains("$binary")), "{named:?}");
    match s.find(&c, &Query::all()).await {
        Err(StoreError::Malformed { .. }) => {}
        other => panic!("find over unreadable documents: {other:?}"),
    }
    match s.get(&c, &key("string-fence")).await {
        Err(StoreError::Malformed { key, .. }) => assert_eq!(key, "string-fence"),
        other => panic!("get of an unreadable document: {other:?}"),
    }
    let readable = Query::eq(doc! {"_id": "double-fence"});
    assert_eq!(s.find(&c, &readable).await.unwrap().len(), 1, "a query that matches only readable documents reads");
}

/// A batch claim takes up to `limit` claimable documents in the claim's order,
/// bumps each one's own fence (a document claimed before gets its next fence,
/// not the batch's), passes over held ones, and refuses a mutation that would
/// leave a lost batch unreclaimable.
pub async fn claim_many_bumps_each_fence_in_order<H: Harness>(h: &H) {
    let s = h.store("claim_many_bumps_each_fence_in_order").await;
    let c = coll("tasks");
    let t0 = s.now().await.unwrap().as_millis() - 10_000;
    let docs = vec![task("p1", 1, t0), task("p5", 5, t0), task("p3", 3, t0), task("p0", 0, t0), task("p4", 4, t0)];
    s.insert_many(&c, docs).await.unwrap();
    let ttl = ttl_of(Duration::from_secs(60));
    // "p3" has been claimed twice and given back: its fence is 2.
    for round in 1..=2 {
        let taken = Claim { query: Query::eq(doc! {"_id": "p3"}), ..claim_for("before", ttl) };
        let r = s.claim(&c, &taken).await.unwrap().expect("p3");
        assert_eq!(r.fence(), round);
        applied(
            s.write(&c, r.key(), &Write::new(Condition::Always, Mutation::new().release().set("ready", true)))
                .await
                .unwrap(),
        );
    }
    // "p4" is held.
    let held = Claim { query: Query::eq(doc! {"_id": "p4"}), ..claim_for("holder", ttl) };
    assert_eq!(s.claim(&c, &held).await.unwrap().expect("p4").fence(), 1);

    let batch = s.claim_many(&c, &claim_for("batch-1", ttl), 3).await.unwrap();
    let got: Vec<(String, u64)> = batch.iter().map(|r| (r.key().to_string(), r.fence())).collect();
    assert_eq!(got, [("p5".to_owned(), 1), ("p3".to_owned(), 3), ("p1".to_owned(), 1)]);
    for r in &batch {
        assert_eq!(r.lease().unwrap().owner, "batch-1");
        assert_eq!(r.data().get("ready"), Some(&Bson::Boolean(false)));
        let stored = s.get(&c, r.key()).await.unwrap().record.unwrap();
        assert_eq!((stored.fence(), stored.lease().unwrap().owner.as_str()), (r.fence(), "batch-1"));
    }
    let rest = s.claim_many(&c, &claim_for("batch-2", ttl), 10).await.unwrap();
    assert_eq!(rest.iter().map(|r| r.key().to_string()).collect::<Vec<_>>(), ["p0"]);
    assert!(s.claim_many(&c, &claim_for("batch-3", ttl), 10).await.unwrap().is_empty());
    assert!(s.claim_many(&coll("empty"), &claim_for("batch-4", ttl), 0).await.unwrap().is_empty());

    let unfenced = Claim { mutation: Mutation::new().grant("w", ttl).set("ready", false), ..claim_for("w", ttl) };
    let unleased = Claim { mutation: Mutation::new().bump_fence().set("ready", false), ..claim_for("w", ttl) };
    for bad in [unfenced, unleased] {
        match s.claim_many(&c, &bad, 1).await {
            Err(StoreError::InvalidInput { .. }) => {}
            other => panic!("a batch claim without a lease and a fence bump: {other:?}"),
        }
    }
}

/// A batch whose caller never learned what it claimed (it crashed between the
/// update and the read back, or the reply was lost) holds nothing forever: its
/// documents lapse at the lease's end and are claimed again with a higher
/// fence, and the lost batch's fenced writes are rejected.
pub async fn claim_many_abandoned_batch_is_reclaimed<H: Harness>(h: &H) {
    let s = h.store("claim_many_abandoned_batch_is_reclaimed").await;
    let c = coll("tasks");
    let t0 = s.now().await.unwrap().as_millis() - 10_000;
    s.insert_many(&c, vec![task("a", 0, t0), task("b", 0, t0 + 1), task("c", 0, t0 + 2)]).await.unwrap();
    let ttl = ttl_of(h.ttl());
    let lost = s.claim_many(&c, &claim_for("lost", ttl), 3).await.unwrap();
    assert_eq!(lost.len(), 3);
    let lost_until = lost.iter().map(|r| r.lease().unwrap().until).max().unwrap();
    // Judged on the store clock: a server slower than the lease may let the
    // batch lapse before the next call.
    let early = s.claim_many(&c, &claim_for("early", ttl), 3).await.unwrap();
    for r in &early {
        let since = r.lease().unwrap().since;
        assert!(since >= lost_until, "a live batch claim was taken: at {since}, held until {lost_until}");
    }
    if early.is_empty() {
        tokio::time::sleep(ttl.as_duration() + Duration::from_millis(100)).await;
    }
    let again = if early.is_empty() { s.claim_many(&c, &claim_for("next", ttl), 3).await.unwrap() } else { early };
    let mut keys: Vec<(String, u64)> = again.iter().map(|r| (r.key().to_string(), r.fence())).collect();
    keys.sort();
    assert_eq!(keys, [("a".to_owned(), 2), ("b".to_owned(), 2), ("c".to_owned(), 2)]);
    for r in &lost {
        let complete = Write::new(
            Condition::OwnedBy("lost".into()).and(Condition::FenceIs(r.fence())),
            Mutation::new().release().set("complete", true),
        );
        rejected(s.write(&c, r.key(), &complete).await.unwrap());
    }
}

/// Concurrent batch claims never hand one document to two callers.
pub async fn claim_many_racers_share_nothing<H: Harness>(h: &H) {
    let s = h.store("claim_many_racers_share_nothing").await;
    let c = coll("tasks");
    let t0 = s.now().await.unwrap().as_millis() - 10_000;
    let docs: Vec<Document> = (0..12).map(|i| task(&format!("t{i:02}"), 0, t0 + i)).collect();
    s.insert_many(&c, docs).await.unwrap();
    let ttl = ttl_of(Duration::from_secs(60));
    let mut racers = Vec::new();
    for i in 0..4 {
        let (s, c) = (s.clone(), c.clone());
        racers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = s.claim_many(&c, &claim_for(&format!("r{i}"), ttl), 3).await.unwrap();
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|r| (r.key().to_string(), r.fence())));
            }
        }));
    }
    let mut all = Vec::new();
    for r in racers {
        all.extend(r.await.unwrap());
    }
    all.sort();
    let want: Vec<(String, u64)> = (0..12).map(|i| (format!("t{i:02}"), 1)).collect();
    assert_eq!(all, want, "every task claimed exactly once, at fence 1");
}

/// Batch claims racing for one head of the queue do not come back short
/// while claimable documents remain: four callers start together, each asks
/// for 3 of 12, and each gets 3 (a caller that lost candidates to another goes
/// on with the next ones instead of returning what it has).
pub async fn claim_many_racers_each_fill_their_batch<H: Harness>(h: &H) {
    let s = h.store("claim_many_racers_each_fill_their_batch").await;
    let c = coll("tasks");
    let t0 = s.now().await.unwrap().as_millis() - 10_000;
    let ttl = ttl_of(Duration::from_secs(60));
    for round in 0..3 {
        let docs: Vec<Document> = (0..12).map(|i| task(&format!("r{round}-t{i:02}"), 0, t0 + i)).collect();
        s.insert_many(&c, docs).await.unwrap();
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(4));
        let mut racers = Vec::new();
        for i in 0..4 {
            let (s, c, start) = (s.clone(), c.clone(), start.clone());
            racers.push(tokio::spawn(async move {
                start.wait().await;
                s.claim_many(&c, &claim_for(&format!("round{round}-r{i}"), ttl), 3).await.unwrap()
            }));
        }
        let mut all = Vec::new();
        for r in racers {
            let got = r.await.unwrap();
            assert_eq!(got.len(), 3, "round {round}: a racer came back short: {got:?}");
            all.extend(got.into_iter().map(|r| r.key().to_string()));
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 12, "round {round}: every document claimed once");
    }
}

/// A batch of fenced writes: each write's outcome is its own (a stale fence in
/// the batch is rejected, with the current document, while the others apply),
/// the applied ones changed their documents, and a retry of the same batch
/// recognises its earlier attempts by their nonces.
pub async fn write_many_reports_each_write<H: Harness>(h: &H) {
    let s = h.store("write_many_reports_each_write").await;
    let c = coll("locks");
    let ttl = ttl_of(Duration::from_secs(30));
    let mut writes = Vec::new();
    let mut nonces = Vec::new();
    for (i, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
        let k = key(name);
        let r = applied(s.write(&c, &k, &acquire(name, ttl)).await.unwrap());
        // The third write's fence is stale (one behind the document's).
        let fence = if i == 2 { r.fence() - 1 } else { r.fence() };
        let nonce = Nonce::generate();
        let w = Write::new(
            Condition::OwnedBy(name.into()).and(Condition::FenceIs(fence)),
            Mutation::new().release().set("done", true).set_time_after("retry_at", Duration::from_secs(3600)),
        )
        .with_nonce(nonce.clone());
        writes.push((k, w));
        nonces.push(nonce);
    }
    assert!(s.write_many(&c, &[]).await.unwrap().is_empty());
    let out = s.write_many(&c, &writes).await.unwrap();
    assert_eq!(out.len(), 4);
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o.is_applied(), i != 2, "write {i}: {o:?}");
    }
    match &out[2] {
        BatchOutcome::Rejected(Some(cur)) => {
            assert_eq!(cur.lease().unwrap().owner, "c", "the stale write changed nothing");
            assert!(cur.data().get("done").is_none());
        }
        o => panic!("the stale write is rejected with the current document: {o:?}"),
    }
    let now = s.now().await.unwrap();
    for (i, (k, _)) in writes.iter().enumerate() {
        let r = s.get(&c, k).await.unwrap().record.unwrap();
        if i != 2 {
            let at = r.get_time("retry_at").unwrap();
            assert!(at.as_millis() > now.as_millis() + 3_000_000, "times are on the store clock: {at:?} {now:?}");
        }
        assert_eq!(r.data().get_bool("done").is_ok(), i != 2, "document {i}");
        assert_eq!(r.lease().is_none(), i != 2, "document {i}");
    }
    // The same batch again (a retry): nothing applies now; the earlier
    // attempts are recognised by their nonces, the stale write's is not.
    let retry = s.write_many(&c, &writes).await.unwrap();
    for (i, o) in retry.iter().enumerate() {
        match o {
            BatchOutcome::Rejected(Some(r)) => {
                assert_eq!(r.last_nonce() == Some(nonces[i].as_str()), i != 2, "write {i}: {r:?}")
            }
            o => panic!("write {i} of the retry: {o:?}"),
        }
    }
}
