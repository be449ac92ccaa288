//! Integration tests of the in-memory store: the whole conformance suite under
//! paused tokio time, plus fault injection and clock behaviour.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bson::doc;
use store_memory::MemoryStore;
use store_trait::{
    Collection, Condition, Key, Mutation, Nonce, Store, StoreTime, TokioClock, Ttl, Write, WriteOutcome,
};

use store_test::memory::MemoryHarness;

const TTL: Duration = Duration::from_secs(3);

async fn harness() -> Option<MemoryHarness> {
    Some(MemoryHarness::new(TTL))
}

store_test::conformance_tests!(harness, #[tokio::test(start_paused = true)]);

mod without_change_streams {
    async fn harness() -> Option<super::MemoryHarness> {
        Some(super::MemoryHarness::polling(super::TTL))
    }
    store_test::conformance_tests!(harness, #[tokio::test(start_paused = true)]);
}

mod multi_thread {
    // The same suite with real threads racing on the store's mutex.
    async fn harness() -> Option<super::MemoryHarness> {
        Some(super::MemoryHarness::new(super::TTL))
    }
    store_test::conformance_tests!(harness, #[tokio::test(flavor = "multi_thread", worker_threads = 4)]);
}

fn acquire(owner: &str) -> Write {
    let ttl = Ttl::new(Duration::from_secs(10)).unwrap();
    Write::new(Condition::Free.or(Condition::HeldBy(owner.into())), Mutation::new().grant(owner, ttl).bump_fence())
        .upsert()
}

#[tokio::test(start_paused = true)]
async fn fail_before_apply_changes_nothing() {
    let s = MemoryStore::new();
    let (c, k) = (Collection::new("l").unwrap(), Key::new("k").unwrap());
    s.faults().fail_next(2);
    for _ in 0..2 {
        let e = s.write(&c, &k, &acquire("a")).await.unwrap_err();
        assert!(e.is_retryable() && e.is_ambiguous(), "{e}");
    }
    assert!(s.get(&c, &k).await.unwrap().record.is_none());
    assert!(s.write(&c, &k, &acquire("a")).await.unwrap().is_applied());
    assert_eq!(s.operation_count(), 4);
}

#[tokio::test(start_paused = true)]
async fn fail_after_apply_is_ambiguous_but_applied() {
    let s = MemoryStore::new();
    let (c, k) = (Collection::new("l").unwrap(), Key::new("k").unwrap());
    s.faults().fail_next_after_apply(1);
    assert!(s.write(&c, &k, &acquire("a")).await.unwrap_err().is_ambiguous());
    let r = s.get(&c, &k).await.unwrap().record.unwrap();
    assert_eq!(r.lease().unwrap().owner, "a", "the write was applied although it reported an error");
    // Retrying the same acquire is safe: the owner still holds it, with a new fence.
    match s.write(&c, &k, &acquire("a")).await.unwrap() {
        WriteOutcome::Applied(r) => assert_eq!((r.fence(), r.lease().unwrap().owner.as_str()), (2, "a")),
        other => panic!("{other:?}"),
    }
}

/// A fenced write applied but reported as an error is recognised by its retry
/// (same nonce); one that failed before it applied is not, even when a release by
/// someone else in between left the same "no lease" picture.
#[tokio::test(start_paused = true)]
async fn retry_after_ambiguous_error_knows_by_nonce() {
    let s = MemoryStore::new();
    let (c, k) = (Collection::new("l").unwrap(), Key::new("k").unwrap());
    let fence = s.write(&c, &k, &acquire("a")).await.unwrap().record().unwrap().fence();
    let release = |n: &Nonce| {
        Write::new(Condition::OwnedBy("a".into()).and(Condition::FenceIs(fence)), Mutation::new().release())
            .with_nonce(n.clone())
    };
    let applied = Nonce::generate();
    s.faults().fail_next_after_apply(1);
    assert!(s.write(&c, &k, &release(&applied)).await.unwrap_err().is_ambiguous());
    let retry = s.write(&c, &k, &release(&applied)).await.unwrap();
    assert!(!retry.is_applied() && retry.applied_with(&applied), "{retry:?}");

    let fence = s.write(&c, &k, &acquire("a")).await.unwrap().record().unwrap().fence();
    let lost = Nonce::generate();
    let release = Write::new(Condition::OwnedBy("a".into()).and(Condition::FenceIs(fence)), Mutation::new().release())
        .with_nonce(lost.clone());
    s.faults().fail_next(1);
    assert!(s.write(&c, &k, &release).await.unwrap_err().is_ambiguous());
    // Someone else releases it in between (a force release without a fence bump).
    let force = Write::new(Condition::Free.negate(), Mutation::new().release());
    assert!(s.write(&c, &k, &force).await.unwrap().is_applied());
    let retry = s.write(&c, &k, &release).await.unwrap();
    let cur = retry.record().unwrap();
    assert!(cur.lease().is_none() && cur.fence() == fence, "the picture the old check took for success");
    assert!(!retry.is_applied() && !retry.applied_with(&lost), "{retry:?}");
}

#[tokio::test(start_paused = true)]
async fn unreachable_and_latency() {
    let s = MemoryStore::new();
    s.faults().set_unreachable(true);
    let e = s.now().await.unwrap_err();
    assert_eq!(e.fault_kind(), Some(store_trait::FaultKind::Unreachable));
    s.faults().clear();
    s.faults().set_latency(Duration::from_millis(250));
    let start = tokio::time::Instant::now();
    s.now().await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(250));
}

#[tokio::test(start_paused = true)]
async fn store_clock_offsets_change_nothing() {
    // Leases are relative to the store's own clock: a store whose clock is an hour
    // ahead or behind behaves identically.
    let mut results = Vec::new();
    for offset in [-3_600_000_i64, 0, 3_600_000] {
        let s = MemoryStore::builder().clock(TokioClock::from_system_with_offset(offset)).build();
        let (c, k) = (Collection::new("l").unwrap(), Key::new("k").unwrap());
        let mut trace = Vec::new();
        for step in 0..6 {
            let who = if step % 2 == 0 { "a" } else { "b" };
            trace.push(s.write(&c, &k, &acquire(who)).await.unwrap().is_applied());
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
        results.push(trace);
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[1], results[2]);
    // a takes it at 0 s, renews at 8 s and 16 s (ttl 10 s); b never gets it.
    assert_eq!(results[0], [true, false, true, false, true, false]);
}

#[tokio::test(start_paused = true)]
async fn ttl_prune_deletes_only_expired() {
    let s = MemoryStore::builder().clock(TokioClock::starting_at(StoreTime::from_millis(1_000_000))).build();
    let c = Collection::new("status").unwrap();
    s.ensure_indexes(&c, &[store_trait::IndexSpec::gc()]).await.unwrap();
    let gc = |secs| {
        Write::new(Condition::Always, Mutation::new().gc_after(Ttl::new(Duration::from_secs(secs)).unwrap())).upsert()
    };
    s.write(&c, &Key::new("short").unwrap(), &gc(1)).await.unwrap();
    s.write(&c, &Key::new("long").unwrap(), &gc(100)).await.unwrap();
    s.insert_many(&c, vec![doc! {"_id": "none"}]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(s.prune_ttl(), 1);
    assert!(s.get(&c, &Key::new("short").unwrap()).await.unwrap().record.is_none());
    assert!(s.get(&c, &Key::new("long").unwrap()).await.unwrap().record.is_some());
}

/// `store_trait::helpers::Watcher` reports a resync when its stream ends (as
/// a server restart ends it), so a caller falls back to its poll at once;
/// subscribes again after its retry interval and reports a resync then; and
/// stays silent on a store without notifications.
#[tokio::test(start_paused = true)]
async fn watcher_comes_back_after_its_stream_ends() {
    use store_trait::{helpers::Watcher, ChangeKind};
    let store = MemoryStore::new();
    let coll = Collection::new("watched").unwrap();
    let put = |k: &str| {
        let (store, coll, k) = (store.clone(), coll.clone(), Key::new(k).unwrap());
        async move {
            let w = Write::new(Condition::Exists("x".into()).negate(), Mutation::new().set("x", 1)).upsert();
            store.write(&coll, &k, &w).await.unwrap();
        }
    };
    let mut w = Watcher::open(store.clone(), coll.clone(), None, Duration::from_secs(1)).await;
    assert!(w.is_live());
    put("a").await;
    assert_eq!(w.changed().await.key, Some(Key::new("a").unwrap()));

    store.faults().end_change_streams();
    let ended = tokio::time::Instant::now();
    let ev = w.changed().await;
    assert_eq!(ev.kind, ChangeKind::Resync, "lost, and changes may have been missed");
    assert!(ended.elapsed() < Duration::from_secs(1), "told at once, not at the retry");
    assert!(!w.is_live());
    let ev = w.changed().await;
    assert_eq!(ev.kind, ChangeKind::Resync, "back, and changes may have been missed");
    assert!(ended.elapsed() >= Duration::from_secs(1), "not before the retry interval");
    assert!(w.is_live());
    put("b").await;
    assert_eq!(w.changed().await.key, Some(Key::new("b").unwrap()));
    put("c").await;
    put("d").await;
    tokio::task::yield_now().await;
    assert!(w.drain_ready(), "two waiting notifications taken at once");
    assert!(!w.drain_ready());

    // Ignoring renewals: a holder renewing its lease wakes nobody; a release does.
    let k = Key::new("lease").unwrap();
    let mut holders =
        Watcher::open(store.clone(), coll.clone(), Some(k.clone()), Duration::from_secs(1)).await.ignore_renewals();
    let ttl = Ttl::new(Duration::from_secs(30)).unwrap();
    let grant = Write::new(Condition::Free.or(Condition::HeldBy("a".into())), Mutation::new().grant("a", ttl)).upsert();
    store.write(&coll, &k, &grant).await.unwrap();
    assert_eq!(holders.changed().await.kind, store_trait::ChangeKind::Insert);
    for _ in 0..2 {
        tokio::time::advance(Duration::from_secs(1)).await;
        store.write(&coll, &k, &grant).await.unwrap();
    }
    tokio::task::yield_now().await;
    assert!(!holders.drain_ready(), "renewals are passed over");
    store.write(&coll, &k, &Write::new(Condition::OwnedBy("a".into()), Mutation::new().release())).await.unwrap();
    assert_eq!(holders.changed().await.kind, store_trait::ChangeKind::Update, "the release wakes it");

    let polling = MemoryStore::builder().change_streams(false).build();
    let mut silent = Watcher::open(polling, coll, None, Duration::from_secs(1)).await;
    assert!(!silent.is_live());
    assert!(tokio::time::timeout(Duration::from_secs(3600), silent.changed()).await.is_err());
}

/// A batch claim applied whose reply was lost (a crash between the update and
/// the read back): the caller never learns the tasks, which stay stamped for
/// the batch's owner until the lease lapses; then they are claimed again, each
/// at its next fence.
#[tokio::test(start_paused = true)]
async fn a_lost_batch_claim_lapses_and_is_claimed_again() {
    let store = MemoryStore::new();
    let coll = Collection::new("tasks").unwrap();
    store.insert_many(&coll, (0..3).map(|i| doc! {"_id": format!("t{i}"), "ready": true}).collect()).await.unwrap();
    let ttl = Ttl::new(TTL).unwrap();
    let claim = |owner: &str| store_trait::Claim {
        query: store_trait::Query::all().when(
            Condition::FieldEq("ready".into(), true.into())
                .or(Condition::Exists("claimed".into()).and(Condition::Free)),
        ),
        mutation: Mutation::new().grant(owner, ttl).bump_fence().set("ready", false).set("claimed", true),
    };
    store.faults().fail_next_after_apply(1);
    assert!(store.claim_many(&coll, &claim("lost"), 3).await.is_err(), "the reply is lost");
    for i in 0..3 {
        let r = store.get(&coll, &Key::new(format!("t{i}")).unwrap()).await.unwrap().record.unwrap();
        assert_eq!((r.fence(), r.lease().map(|l| l.owner.as_str())), (1, Some("lost")), "applied, unknown to anyone");
    }
    assert!(store.claim_many(&coll, &claim("early"), 3).await.unwrap().is_empty(), "still leased");
    tokio::time::sleep(TTL + Duration::from_millis(1)).await;
    let again = store.claim_many(&coll, &claim("next"), 3).await.unwrap();
    assert_eq!(
        again.iter().map(|r| (r.key().to_string(), r.fence())).collect::<Vec<_>>(),
        [("t0".to_owned(), 2), ("t1".to_owned(), 2), ("t2".to_owned(), 2)]
    );
}

/// The store's clock steps and runs fast; leases follow it.
#[tokio::test(start_paused = true)]
async fn leases_follow_a_stepped_and_fast_store_clock() {
    let clock = store_test::TestClock::starting_at(StoreTime::from_millis(1_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let (coll, key) = (Collection::new("locks").unwrap(), Key::new("job").unwrap());
    let ttl = Ttl::new(Duration::from_secs(10)).unwrap();
    let take = |who: &str| Write::new(Condition::Free, Mutation::new().grant(who, ttl).bump_fence()).upsert();
    assert!(store.write(&coll, &key, &take("a")).await.unwrap().is_applied());
    assert_eq!(store.now().await.unwrap().as_millis(), 1_000_000);
    // A step forward lapses the lease at once, with no tokio time passing.
    clock.jump(10_000);
    assert!(store.write(&coll, &key, &take("b")).await.unwrap().is_applied());
    // A step back makes it live again: "b" holds until 1_020_000.
    clock.jump(-5_000);
    assert!(!store.write(&coll, &key, &take("c")).await.unwrap().is_applied());
    assert_eq!(store.now().await.unwrap().as_millis(), 1_005_000);
    // Twice as fast: the rest of b's 15 s of store time lapses in 7.5 s.
    clock.set_rate(2.0).unwrap();
    tokio::time::advance(Duration::from_millis(7_400)).await;
    assert!(!store.write(&coll, &key, &take("c")).await.unwrap().is_applied());
    tokio::time::advance(Duration::from_millis(100)).await;
    assert!(store.write(&coll, &key, &take("c")).await.unwrap().is_applied());
    let snap = store.peek(&coll, &key).unwrap();
    assert_eq!(snap.now.as_millis(), 1_020_000);
    assert_eq!(snap.record.unwrap().fence(), 3);
}
