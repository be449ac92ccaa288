//! One seam keeps every lease: a lock's acquisition, a semaphore's permit and a
//! lease granted elsewhere (a task claim, kept through `Leases::keep`) are
//! renewed, signal their loss before it can lapse, are not released behind the
//! holder's back after that signal, and fence their writes, all the same way
//! (memory store, paused time).

use std::time::Duration;

use mongolock::unstable::Leases;
use mongolock::{Acquire, Lock, LockError, LockGuard, LockMetrics, Semaphore};
use store_memory::MemoryStore;
use store_trait::{Collection, Condition, Mutation, Store, Ttl, Write};

const TTL: Duration = Duration::from_secs(3);

/// How a kept lease was made, and where its counters are.
enum Kind {
    Lock(Lock<MemoryStore>),
    Permit(Semaphore<MemoryStore>),
    Kept(Leases<MemoryStore>),
}

impl Kind {
    fn metrics(&self) -> LockMetrics {
        match self {
            Kind::Lock(l) => l.metrics(),
            Kind::Permit(s) => s.metrics(),
            Kind::Kept(l) => l.metrics(),
        }
    }

    async fn take(&self, store: &MemoryStore, key: &str) -> (LockGuard<MemoryStore>, Collection) {
        match self {
            Kind::Lock(l) => {
                (l.acquire_with(Acquire::new().auto_renew()).await.unwrap(), Collection::new("mongolocker").unwrap())
            }
            Kind::Permit(s) => {
                (s.acquire_with(Acquire::new().auto_renew()).await.unwrap(), Collection::new("mongolocker").unwrap())
            }
            Kind::Kept(leases) => {
                // A grant made by another operation, as a queue's claim is.
                let grant =
                    Write::new(Condition::Free, Mutation::new().grant(key, Ttl::new(TTL).unwrap()).bump_fence());
                let sent = tokio::time::Instant::now();
                let key = store_trait::Key::new(key).unwrap();
                let out = store.write(leases.collection(), &key, &grant.upsert()).await.unwrap();
                (leases.keep(out.record().unwrap(), sent).unwrap(), leases.collection().clone())
            }
        }
    }
}

fn kinds(store: &MemoryStore) -> Vec<(&'static str, Kind)> {
    let lock = |key: &str| Lock::builder(store.clone(), key).ttl(TTL);
    vec![
        ("lock", Kind::Lock(lock("job").build().unwrap())),
        ("permit", Kind::Permit(Semaphore::new(lock("exports"), 2).unwrap())),
        ("kept", Kind::Kept(Leases::builder(store.clone(), "tasks").ttl(TTL).build().unwrap())),
    ]
}

/// Cut off from the store, each kind of lease signals its loss while its lease
/// is still live on the store, and is not released behind the holder's back
/// after the signal; while reachable it is renewed beyond its ttl.
#[tokio::test(start_paused = true)]
async fn every_kept_lease_signals_its_loss_before_it_lapses() {
    let store = MemoryStore::new();
    for (what, kind) in kinds(&store) {
        let (guard, coll) = kind.take(&store, &format!("{what}-cut")).await;
        tokio::time::sleep(TTL * 2).await;
        assert!(!guard.is_lost(), "{what}: renewed in the background");
        let snap = store.peek(&coll, guard.key()).unwrap();
        assert!(snap.record.unwrap().is_held_by_at(guard.owner(), snap.now), "{what}: still held after two ttls");
        store.faults().set_unreachable(true);
        tokio::time::timeout(TTL, guard.lost()).await.expect("the lost signal fired");
        let snap = store.peek(&coll, guard.key()).unwrap();
        let record = snap.record.unwrap();
        assert!(record.is_held_by_at(guard.owner(), snap.now), "{what}: signalled before the lease lapsed");
        store.faults().set_unreachable(false);
        // Neither the keeper nor a drop releases a lost lease: work under it may
        // still be stopping.
        drop(guard);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let snap = store.peek(&coll, record.key()).unwrap();
        assert!(snap.record.unwrap().holder_at(snap.now).is_some(), "{what}: not released behind the holder's back");
        assert_eq!(kind.metrics().losses, 1, "{what}: the loss is counted");
        assert_eq!(kind.metrics().acquisitions, 1, "{what}");
    }
}

/// Taken by someone else with a greater fence, each kind of lease has its
/// fenced writes rejected and its loss signalled.
#[tokio::test(start_paused = true)]
async fn every_kept_lease_fences_its_writes() {
    let store = MemoryStore::new();
    for (what, kind) in kinds(&store) {
        let (guard, coll) = kind.take(&store, &format!("{what}-fenced")).await;
        guard.write(Mutation::new().set("by", "holder")).await.unwrap();
        let steal = Write::new(Condition::Always, Mutation::new().grant("thief", Ttl::new(TTL).unwrap()).bump_fence());
        store.write(&coll, guard.key(), &steal).await.unwrap();
        match guard.write(Mutation::new().set("by", "stale")).await {
            Err(LockError::Lost { fence, current, .. }) => {
                assert_eq!(fence, guard.fence(), "{what}");
                assert_eq!(current.unwrap().fence, guard.fence() + 1, "{what}");
            }
            other => panic!("{what}: a stale fenced write: {other:?}"),
        }
        assert!(guard.is_lost(), "{what}: a rejected fenced write signals the loss");
        let record = store.peek(&coll, guard.key()).unwrap().record.unwrap();
        assert_eq!(record.data().get_str("by").unwrap(), "holder", "{what}: the stale write changed nothing");
        assert!(matches!(guard.release().await, Err(LockError::Lost { .. })), "{what}: the thief keeps it");
    }
}

/// Taken over by someone else, each kind of lease learns it at its next
/// renewal (a third of the ttl), not only at its deadline: a rejected renewal
/// fires the lost signal at once, from the keeper and from `touch` alike.
#[tokio::test(start_paused = true)]
async fn a_rejected_renewal_fires_the_lost_signal_at_once() {
    let store = MemoryStore::new();
    for (what, kind) in kinds(&store) {
        let (guard, coll) = kind.take(&store, &format!("{what}-taken")).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let steal = Write::new(Condition::Always, Mutation::new().grant("thief", Ttl::new(TTL).unwrap()).bump_fence());
        store.write(&coll, guard.key(), &steal).await.unwrap();
        // The keeper renews a second after the grant; the deadline is 2.7 s.
        tokio::time::timeout(TTL / 3, guard.lost()).await.expect("signalled at the next renewal");
        assert_eq!(kind.metrics().losses, 1, "{what}");
    }
    let lock = Lock::builder(store.clone(), "touched").ttl(TTL).build().unwrap();
    let guard = lock.acquire().await.unwrap();
    let steal = Write::new(Condition::Always, Mutation::new().grant("thief", Ttl::new(TTL).unwrap()).bump_fence());
    store.write(&Collection::new("mongolocker").unwrap(), guard.key(), &steal).await.unwrap();
    assert!(matches!(guard.touch().await, Err(LockError::Lost { .. })));
    assert!(guard.is_lost(), "a rejected touch signals the loss");
    assert!(guard.cancellation().is_cancelled());
}

/// Only leases built with `allow_gc` may mark their documents for collection:
/// a lock's and a permit's never.
#[tokio::test(start_paused = true)]
async fn only_task_leases_may_be_collected() {
    let store = MemoryStore::new();
    let gc = Ttl::new(Duration::from_secs(60)).unwrap();
    for (what, kind) in kinds(&store) {
        let (guard, _) = kind.take(&store, &format!("{what}-gc")).await;
        let out = guard.write(Mutation::new().gc_after(gc)).await;
        assert!(matches!(out, Err(LockError::GcOnLock { .. })), "{what}: {out:?}");
    }
    let tasks = Leases::builder(store.clone(), "gc-tasks").ttl(TTL).allow_gc().build().unwrap();
    let (guard, _) = Kind::Kept(tasks).take(&store, "task").await;
    guard.release_with(Mutation::new().gc_after(gc)).await.unwrap();
}

/// `renew` (the renewal an elector's rounds use) retries transient failures as
/// the keeper does, until confirmed; cut off, it ends in a loss signalled while
/// the lease is still live on the store.
#[tokio::test(start_paused = true)]
async fn renew_retries_until_confirmed_or_lost() {
    let store = MemoryStore::new();
    let lock = Lock::builder(store.clone(), "term").ttl(TTL).build().unwrap();
    let guard = lock.acquire().await.unwrap();
    store.faults().fail_next(2);
    let before = guard.expires();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let expires = lock.renew().await.unwrap();
    assert!(expires > before, "confirmed after the failures");
    assert_eq!(lock.metrics().renew_failures, 2);
    assert!(!guard.is_lost());
    store.faults().set_unreachable(true);
    let start = tokio::time::Instant::now();
    assert!(matches!(guard.renew().await, Err(LockError::Lost { .. })));
    assert!(start.elapsed() < TTL, "given up before the lease could lapse");
    assert!(guard.is_lost(), "the loss is signalled");
    let snap = store.peek(&Collection::new("mongolocker").unwrap(), guard.key()).unwrap();
    assert!(snap.record.unwrap().is_held_by_at(guard.owner(), snap.now), "and the lease has not lapsed yet");
}

/// A renewal that fails for good (here the document was rewritten into one the
/// store cannot read) is a loss at once, not retried until the deadline.
#[tokio::test(start_paused = true)]
async fn a_permanent_renewal_failure_is_a_loss_at_once() {
    let store = MemoryStore::new();
    let lock = Lock::builder(store.clone(), "broken").ttl(TTL).build().unwrap();
    let guard = lock.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    let coll = Collection::new("mongolocker").unwrap();
    store.insert_raw(&coll, bson::doc! { "_id": "broken", "lease_owner": guard.owner(), "fence": "one" });
    // The keeper renews after a second; the deadline is 2.7 s.
    tokio::time::timeout(TTL / 2, guard.lost()).await.expect("lost at the first failed renewal");
    assert_eq!(lock.metrics().renew_failures, 1);
}

/// `renew_now` renews at once, not at the keeper's next interval.
#[tokio::test(start_paused = true)]
async fn renew_now_renews_at_once() {
    let store = MemoryStore::new();
    let lock = Lock::builder(store.clone(), "now").ttl(TTL).build().unwrap();
    let guard = lock.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = guard.expires();
    guard.renew_now();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(guard.expires() > before, "renewed before the next interval (1 s)");
}

/// A lease granted with a shorter ttl than the keeper's is refused: its
/// deadlines would come after the lease lapsed.
#[tokio::test(start_paused = true)]
async fn a_grant_shorter_than_the_ttl_is_not_kept() {
    let store = MemoryStore::new();
    let leases = Leases::builder(store.clone(), "tasks").ttl(TTL).build().unwrap();
    let short = Write::new(Condition::Free, Mutation::new().grant("w", Ttl::new(TTL / 2).unwrap()).bump_fence());
    let sent = tokio::time::Instant::now();
    let key = store_trait::Key::new("short").unwrap();
    let out = store.write(leases.collection(), &key, &short.upsert()).await.unwrap();
    assert!(matches!(leases.keep(out.record().unwrap(), sent), Err(LockError::Config(_))));
    assert_eq!(leases.metrics().acquisitions, 0);
}
