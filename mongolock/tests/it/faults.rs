//! Fault injection: the in-memory store's faults, and `configureFailPoint` on a
//! real server. The holder must see its lost-lock signal before its lease can
//! lapse, nobody else may hold the lock early, and no operation reports success
//! for work it did not do.

use std::time::Duration;

use bson::doc;
use mongolock::{Acquire, Lock, LockError};
use store_memory::MemoryStore;
use store_trait::{Collection, Key, Store};

#[tokio::test(start_paused = true)]
async fn ambiguous_acquire_is_resolved_by_reading_back() {
    let store = MemoryStore::new();
    let lock = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(10)).build().unwrap();
    store.faults().fail_next_after_apply(1);
    let g = lock.try_acquire().await.unwrap().expect("applied although the reply was lost");
    assert_eq!(g.fence(), 1);
    assert!(lock.owned().await.unwrap());
    g.release().await.unwrap();
    // Failed before apply: the blocking acquire retries.
    store.faults().fail_next(2);
    let g = lock.acquire_timeout(Duration::from_secs(5)).await.unwrap();
    assert_eq!(g.fence(), 2);
}

/// An acquire whose outcome is in doubt reads the lock back; a lease found
/// there that is another client's is not taken for its own (which would make
/// two holders of one fence).
#[tokio::test(start_paused = true)]
async fn an_ambiguous_acquire_never_adopts_another_holders_lease() {
    let store = MemoryStore::new();
    let make = || Lock::builder(store.clone(), "job").ttl(Duration::from_secs(10)).build().unwrap();
    let (a, b) = (make(), make());
    let held = a.acquire().await.unwrap();
    // Failed before it was applied, reported as transient: in doubt.
    store.faults().fail_next(1);
    let out = b.try_acquire().await;
    assert!(matches!(&out, Err(LockError::Store(e)) if e.is_ambiguous()), "{out:?}");
    let rec = store.peek(&Collection::new("mongolocker").unwrap(), &Key::new("job").unwrap()).unwrap().record.unwrap();
    assert_eq!((rec.lease().map(|l| l.owner.as_str()), rec.fence()), (Some(held.owner()), held.fence()));
    held.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn transient_renewal_failures_are_retried_inside_the_lease() {
    let store = MemoryStore::new();
    let lock = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(9)).build().unwrap();
    let g = lock.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2_900)).await;
    store.faults().fail_next(3);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(!g.is_lost());
    assert_eq!(lock.metrics().renew_failures, 3);
    assert!(lock.owned().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn unreachable_store_signals_loss_before_expiry() {
    let store = MemoryStore::new();
    let lock = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(6)).build().unwrap();
    let g = lock.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    store.faults().set_unreachable(true);
    crate::suite::lost_within_lease(&g, Duration::from_secs(6)).await;
    let snap = store.peek(&Collection::new("mongolocker").unwrap(), &Key::new("job").unwrap()).unwrap();
    assert!(snap.record.unwrap().is_held_by_at(g.owner(), snap.now), "signalled while the lease was still valid");
    store.faults().set_unreachable(false);
    let other = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(6)).build().unwrap();
    // The lost holder frees the lock in the background once it can; the other
    // client gets it, never before the first lease lapsed or was released.
    let g2 = other.acquire_timeout(Duration::from_secs(10)).await.unwrap();
    assert!(g2.fence() > g.fence());
    assert!(matches!(g.release().await, Err(LockError::Lost { .. })));
}

/// A release whose reply was lost (applied, reported as an error) is recognised
/// by its retry.
#[tokio::test(start_paused = true)]
async fn release_applied_before_its_error_is_recognised() {
    let store = MemoryStore::new();
    let lock = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(10)).build().unwrap();
    let g = lock.acquire().await.unwrap();
    store.faults().fail_next_after_apply(1);
    g.release().await.unwrap();
    assert!(!lock.locked().await.unwrap());
}

/// A release that failed before it applied is not taken for done when someone
/// released the lock by force before the retry: the retry finds no lease and
/// (before forced releases bumped the fence) the same fence, which the old check
/// read as "my earlier attempt applied".
#[tokio::test(start_paused = true)]
async fn release_retry_is_not_fooled_by_a_forced_release() {
    let store = MemoryStore::new();
    let lock = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(10)).build().unwrap();
    let g = lock.acquire().await.unwrap();
    let fence = g.fence();
    store.faults().fail_next(1);
    let release = tokio::spawn(g.release_with(store_trait::Mutation::new().set("outcome", "done")));
    // The release failed once and backs off; an operator forces the lock free.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let other = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(10)).build().unwrap();
    assert!(other.release_by_force().await.unwrap());
    let out = release.await.unwrap();
    assert!(matches!(out, Err(LockError::Lost { .. })), "the outcome was never written: {out:?}");
    let r = store.peek(&Collection::new("mongolocker").unwrap(), &Key::new("job").unwrap()).unwrap().record.unwrap();
    assert!(r.data().get("outcome").is_none());
    assert_eq!(r.fence(), fence + 1, "a forced release bumps the fence");
}

/// A store that never answers (a black-holed primary) does not hold an acquire
/// with a timeout past it: neither the subscription, nor the attempt, nor the
/// clock read while waiting for a holder.
#[tokio::test(start_paused = true)]
async fn acquire_timeout_holds_when_the_store_never_answers() {
    let store = MemoryStore::new();
    let lock = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(10)).build().unwrap();
    store.faults().set_latency(Duration::from_secs(24 * 3600));
    let start = tokio::time::Instant::now();
    let out = lock.acquire_with(Acquire::new().timeout(Duration::from_secs(5))).await;
    assert!(matches!(out, Err(LockError::Timeout { .. })), "{out:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(5));

    // Held by someone else; the store stops answering while the waiter waits.
    store.faults().clear();
    let holder = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(60)).build().unwrap();
    let _held = holder.acquire().await.unwrap();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire_with(Acquire::new().timeout(Duration::from_secs(5))).await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    store.faults().set_latency(Duration::from_secs(24 * 3600));
    let start = tokio::time::Instant::now();
    let out = waiter.await.unwrap();
    assert!(matches!(out, Err(LockError::Timeout { .. })), "{out:?}");
    assert!(start.elapsed() <= Duration::from_secs(5), "{:?}", start.elapsed());
}

/// Fence check on writes made while holding: once the lease lapsed and another
/// holder took the lock, the old guard's write is rejected and changes nothing;
/// so is one on a lapsed lease nobody took yet.
#[tokio::test(start_paused = true)]
async fn fenced_writes_of_a_lapsed_holder_are_rejected() {
    let store = MemoryStore::new();
    let (coll, key) = (Collection::new("mongolocker").unwrap(), Key::new("job").unwrap());
    let make = || Lock::builder(store.clone(), "job").ttl(Duration::from_secs(3)).build().unwrap();
    let (a, b) = (make(), make());
    let g = a.acquire().await.unwrap();
    g.write(store_trait::Mutation::new().set("by", "a")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(matches!(g.write(store_trait::Mutation::new().set("by", "a-late")).await, Err(LockError::Lost { .. })));
    let g2 = b.try_acquire().await.unwrap().expect("the lease lapsed");
    assert!(matches!(g.write(store_trait::Mutation::new().set("by", "a-stale")).await, Err(LockError::Lost { .. })));
    let rec = store.peek(&coll, &key).unwrap().record.unwrap();
    assert_eq!((rec.data().get_str("by").unwrap(), rec.fence()), ("a", g2.fence()));
}

async fn fail_point(admin: &store_mongo::mongodb::Client, data: bson::Document) {
    admin
        .database("admin")
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": { "times": 1 }, "data": data })
        .await
        .unwrap();
}

async fn clear_fail_point(admin: &store_mongo::mongodb::Client) {
    admin.database("admin").run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" }).await.unwrap();
}

/// All failpoint scenarios in one test: a failpoint is server-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongo_failpoints() {
    // A failpoint is server-wide: it only matches this test's application name.
    let Some(store) = store_test::mongo::test_store_as("lock_failpoints", "lockfp").await else { return };
    let Some(admin) = store_test::mongo::admin_client("lock_failpoints").await else { return };
    let ttl = Duration::from_millis(1500);
    let make = || Lock::builder(store.clone(), "job").ttl(ttl).build().unwrap();

    // An error code on acquire: a clear error, nothing held.
    fail_point(&admin, doc! { "failCommands": ["findAndModify"], "errorCode": 2, "appName": "lockfp" }).await;
    let a = make();
    match a.try_acquire().await {
        Err(LockError::Store(e)) => assert!(!e.is_retryable(), "{e}"),
        other => panic!("an injected BadValue: {other:?}"),
    }
    assert!(!a.locked().await.unwrap(), "nothing half-written");

    // A dropped connection on acquire: the driver retries once by itself, or the
    // lock reads back; either way the caller learns the truth.
    fail_point(&admin, doc! { "failCommands": ["findAndModify"], "closeConnection": true, "appName": "lockfp" }).await;
    let outcome = a.try_acquire().await;
    let holds = a.owned().await.unwrap();
    match outcome {
        Ok(Some(g)) => {
            assert!(holds);
            g.release().await.unwrap();
        }
        Ok(None) => panic!("nobody else holds it"),
        Err(e) => assert!(!holds, "reported failure but holds the lock: {e}"),
    }

    // A renewal blocked longer than the lease: the holder is told before its lease
    // can lapse, then frees the lock; the blocked renewal, applied late, must not
    // take it back from the next holder.
    let g = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    admin
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand", "mode": { "times": 1 },
            "data": { "failCommands": ["findAndModify"], "blockConnection": true, "blockTimeMS": 4000, "appName": "lockfp" }
        })
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), g.lost()).await.expect("lost signal while the renewal hangs");
    let b = make();
    let g2 = b.acquire_with(Acquire::new().timeout(Duration::from_secs(15)).auto_renew()).await.unwrap();
    assert!(g.is_lost(), "the first holder was told before the second got the lock");
    assert!(g2.fence() > g.fence());
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    let cur = b.get_current().await.unwrap().expect("still held");
    assert_eq!((cur.owner.as_str(), cur.fence), (g2.owner(), g2.fence()), "the late renewal was rejected");
    assert!(!g2.is_lost());
    clear_fail_point(&admin).await;
    g2.release().await.unwrap();
    let _ = store.now().await.unwrap();
}

/// A lease whose loss was signalled while it is still live on the store (here:
/// time passed unseen, a suspend) is not released behind the holder's back:
/// the work under it may still be stopping (a runner killing its command's
/// process tree). It stays held until the holder releases it or it lapses.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_is_not_released_before_its_holder_lets_go() {
    use store_test::TestClock;
    use store_trait::StoreTime;
    let store = MemoryStore::new();
    let wall = TestClock::starting_at(StoreTime::from_millis(1_700_000_000_000));
    let make = |clock: Option<TestClock>| {
        let b = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(10));
        match clock {
            Some(c) => b.clock(c).build().unwrap(),
            None => b.build().unwrap(),
        }
    };
    let (a, b) = (make(Some(wall.clone())), make(None));
    let g = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    // A second of wall-clock time passed that the monotonic clock did not see.
    wall.jump(1_000);
    tokio::time::timeout(Duration::from_secs(5), g.lost()).await.expect("the loss is signalled");
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(b.try_acquire().await.unwrap().is_none(), "released behind the holder's back");
    // The holder's work has stopped: it lets go, and the next holder gets in.
    let _ = g.release().await;
    assert!(b.try_acquire().await.unwrap().is_some());
}

/// The same for a guard dropped after its loss was signalled.
#[tokio::test(start_paused = true)]
async fn a_lost_guard_dropped_leaves_the_lease_to_lapse() {
    use store_test::TestClock;
    use store_trait::StoreTime;
    let store = MemoryStore::new();
    let wall = TestClock::starting_at(StoreTime::from_millis(1_700_000_000_000));
    let a = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(10)).clock(wall.clone()).build().unwrap();
    let b = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(10)).build().unwrap();
    let g = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    wall.jump(1_000);
    tokio::time::timeout(Duration::from_secs(5), g.lost()).await.expect("the loss is signalled");
    drop(g);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(b.try_acquire().await.unwrap().is_none(), "released behind the holder's back");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(b.try_acquire().await.unwrap().is_some(), "it lapses by itself");
}

/// Once its loss was signalled, a lease is never extended again: `touch` and
/// `renew` refuse without writing, so the lease lapses as it was, at least the
/// safety margin after the signal.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_is_not_renewed_again() {
    let store = MemoryStore::new();
    let (coll, key) = (Collection::new("mongolocker").unwrap(), Key::new("job").unwrap());
    let lock = Lock::builder(store.clone(), "job").ttl(Duration::from_secs(3)).build().unwrap();
    let g = lock.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    store.faults().set_unreachable(true);
    tokio::time::timeout(Duration::from_secs(3), g.lost()).await.expect("the loss is signalled");
    store.faults().set_unreachable(false);
    let until = || store.peek(&coll, &key).unwrap().record.unwrap().lease().unwrap().until;
    let before = until();
    assert!(matches!(g.touch().await, Err(LockError::Lost { .. })));
    assert!(matches!(g.renew().await, Err(LockError::Lost { .. })));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(until(), before, "the lost lease was extended");
}

/// A racer whose claim was sent before another racer created a semaphore's
/// slots, and whose count came after, claims once more: the count finds no
/// slot missing, yet its claim never saw them. Every store call takes 10 ms,
/// so the interleaving is fixed: `a` claims (none), counts (0), creates the
/// three slots at 30 ms and takes one; `b`, 15 ms behind, claims at 25 ms
/// (none yet) and counts at 35 ms (all three). Refusing `b` there would turn
/// a caller away from a semaphore with two permits free.
#[tokio::test(start_paused = true)]
async fn a_claim_that_missed_the_slots_being_created_claims_again() {
    let store = MemoryStore::new();
    store.faults().set_latency(Duration::from_millis(10));
    let sem = || mongolock::Semaphore::new(Lock::builder(store.clone(), "exports"), 3).unwrap();
    let (a, b) = (sem(), sem());
    let later = async {
        tokio::time::sleep(Duration::from_millis(15)).await;
        b.try_acquire().await
    };
    let (got_a, got_b) = futures::join!(a.try_acquire(), later);
    let (got_a, got_b) = (got_a.unwrap().expect("the first racer"), got_b.unwrap().expect("the second racer"));
    assert_ne!(got_a.key(), got_b.key());
    // Once `b` has seen every slot, a full semaphore costs it a claim and a
    // count, not a third call.
    let _third = sem().try_acquire().await.unwrap().expect("the last permit");
    store.faults().set_latency(Duration::ZERO);
    let before = store.operation_count();
    assert!(b.try_acquire().await.unwrap().is_none());
    assert_eq!(store.operation_count() - before, 2, "a claim and a count");
}
