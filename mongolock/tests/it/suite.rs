//! Lock behaviour every backend must show.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use mongolock::{Acquire, Lock, LockError, Semaphore};
use store_trait::testing::Harness;
use store_trait::{Collection, Condition, Key, Mutation, Store, TokioClock, Ttl, Write};

#[macro_export]
macro_rules! lock_suite {
    ($harness:path, #[$attr:meta]) => {
        $crate::lock_suite!(@each $harness, #[$attr],
            parity_basics, tokens_increase_across_release_expiry_and_force, lost_signal_fires_before_expiry,
            auto_renew_keeps_the_lock, waiter_wakes_on_release, waiter_wakes_at_expiry_of_a_crashed_holder,
            acquire_times_out_with_the_holder, bad_input_is_rejected, dropped_guard_releases,
            racers_32_one_holder, semaphore_admits_n, clock_skew_changes_nothing, forced_release_signals_the_holder
        );
    };
    (@each $harness:path, #[$attr:meta], $($name:ident),* $(,)?) => {
        $(
            #[$attr]
            async fn $name() {
                let Some(h) = $harness().await else { return };
                $crate::suite::$name(&h).await;
            }
        )*
    };
}

fn ttl<H: Harness>(h: &H) -> Duration {
    h.ttl() * 2
}

/// Waits for `g`'s lost signal, which must come within the lease: a test fails
/// instead of hanging when it never fires.
pub(crate) async fn lost_within_lease<S: Store + Clone>(g: &mongolock::LockGuard<S>, ttl: Duration) {
    tokio::time::timeout(ttl, g.lost()).await.expect("the lost signal fired within the lease");
}

async fn lock<H: Harness>(h: &H, test: &str) -> (H::Store, impl Fn() -> Lock<H::Store>) {
    let store = h.store(test).await;
    let s = store.clone();
    let t = ttl(h);
    (store, move || Lock::builder(s.clone(), "job").ttl(t).build().unwrap())
}

pub(crate) async fn parity_basics<H: Harness>(h: &H) {
    let (_, make) = lock(h, "lock_parity_basics").await;
    let (a, b) = (make(), make());
    assert!(!a.locked().await.unwrap());
    assert!(a.get_current().await.unwrap().is_none());
    let g = a.acquire().await.unwrap();
    assert!(a.locked().await.unwrap() && b.locked().await.unwrap());
    assert!(a.owned().await.unwrap());
    assert!(!b.owned().await.unwrap(), "owned() is per instance");
    let cur = b.get_current().await.unwrap().unwrap();
    assert_eq!((cur.owner.as_str(), cur.token), (g.owner(), g.token()));
    assert_eq!(cur.pid, Some(std::process::id()));
    assert_eq!(cur.host.as_deref(), Some(a.identity().host()));
    assert!(cur.expires > cur.since);
    match b.acquire_with(Acquire::try_once()).await {
        Err(LockError::Held { holder, .. }) => assert_eq!(holder.owner, g.owner()),
        other => panic!("a held lock: {other:?}"),
    }
    assert!(b.try_acquire().await.unwrap().is_none());
    assert!(matches!(b.release(false).await, Err(LockError::NotHeld { .. })));
    let status = a.status().await.unwrap();
    assert!(status.owned && status.holder.is_some());
    assert_eq!(status.last_token, g.token());
    let before = g.expires();
    let after = a.touch().await.unwrap();
    assert!(after >= before, "touch returns the new expiry");
    assert!(a.release(false).await.unwrap(), "the seed's release() releases this instance's lock");
    assert!(!a.locked().await.unwrap());
    assert!(matches!(a.release(false).await, Err(LockError::NotHeld { .. })));
    assert!(matches!(g.release().await, Err(LockError::NotHeld { .. })), "released once only");
    let m = a.metrics();
    assert_eq!((m.acquisitions, m.losses), (1, 0));
}

pub(crate) async fn tokens_increase_across_release_expiry_and_force<H: Harness>(h: &H) {
    let (_, make) = lock(h, "lock_tokens").await;
    let (a, b) = (make(), make());
    let mut tokens = Vec::new();
    let g = a.acquire().await.unwrap();
    tokens.push(g.token());
    g.release().await.unwrap();
    let g = b.acquire().await.unwrap();
    tokens.push(g.token());
    // Let it lapse: no renewal.
    lost_within_lease(&g, ttl(h)).await;
    tokio::time::sleep(ttl(h) / 4).await;
    let g2 = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    tokens.push(g2.token());
    drop(g);
    let forced = b.acquire_with(Acquire::new().force().auto_renew()).await.unwrap();
    tokens.push(forced.token());
    assert_eq!(b.metrics().steals, 1);
    tokio::time::timeout(Duration::from_secs(10), g2.lost()).await.expect("the forced-out holder learns it lost");
    assert!(b.release(true).await.unwrap());
    let g = a.acquire().await.unwrap();
    tokens.push(g.token());
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens strictly increase: {tokens:?}");
    assert!(matches!(forced.release().await, Err(LockError::Lost { .. })), "the force-released guard cannot release");
    g.release().await.unwrap();
}

pub(crate) async fn lost_signal_fires_before_expiry<H: Harness>(h: &H) {
    let (store, make) = lock(h, "lock_lost_before_expiry").await;
    let a = make();
    let g = a.acquire().await.unwrap();
    lost_within_lease(&g, ttl(h)).await;
    // The two "before its expiry" checks below are exact on the paused clock of
    // the memory store. On a real server each needs a round trip to finish within
    // the safety margin (120 ms here), which a loaded machine does not promise:
    // there the signal and the release are checked, not their timing. (That the
    // server's expiry is the grant's `$$NOW` plus the ttl, so never before the
    // holder's deadline, is the conformance suite's.)
    let exact = store.backend_name() == "memory";
    // When the holder is told, its lease is still valid on the store clock: it was
    // warned before anyone else could take the lock.
    let now = store.now().await.unwrap();
    assert!(!exact || now < g.expires(), "lost fired after the lease lapsed: now {now}, expiry {}", g.expires());
    assert!(g.is_lost());
    // Then the lost holder frees the lock at once instead of at expiry.
    let (coll, key) = (Collection::new("mongolocker").unwrap(), Key::new("job").unwrap());
    let mut freed = None;
    for _ in 0..1000 {
        let snap = store.get(&coll, &key).await.unwrap();
        if snap.record.as_ref().is_some_and(|r| r.lease().is_none()) {
            freed = Some(snap.now);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let freed = freed.expect("the lost holder released the lock");
    assert!(!exact || freed < g.expires(), "released before its expiry: at {freed}, expiry {}", g.expires());
    assert_eq!(a.metrics().losses, 1);
    assert!(matches!(g.touch().await, Err(LockError::Lost { .. })));
}

pub(crate) async fn auto_renew_keeps_the_lock<H: Harness>(h: &H) {
    let (_, make) = lock(h, "lock_auto_renew").await;
    let (a, b) = (make(), make());
    let g = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    let first_expiry = g.expires();
    tokio::time::sleep(ttl(h) * 3).await;
    assert!(!g.is_lost());
    assert!(g.expires() > first_expiry, "renewed");
    assert!(b.try_acquire().await.unwrap().is_none());
    let cur = b.get_current().await.unwrap().unwrap();
    assert_eq!(cur.token, g.token(), "renewal keeps the token");
    g.renew_now();
    g.release().await.unwrap();
    assert!(b.try_acquire().await.unwrap().is_some());
}

pub(crate) async fn waiter_wakes_on_release<H: Harness>(h: &H) {
    let store = h.store("lock_waiter_wakes_on_release").await;
    // A long lease and, with change notifications, a step so long that only a
    // notification can wake the waiter in time.
    let step = if h.change_streams_expected() { Duration::from_secs(3600) } else { Duration::from_millis(100) };
    let make = || Lock::builder(store.clone(), "job").ttl(Duration::from_secs(3600)).step(step).build().unwrap();
    let (a, b) = (make(), make());
    let g = a.acquire().await.unwrap();
    let waiter = tokio::spawn(async move { b.acquire_timeout(Duration::from_secs(30)).await.map(|g| g.token()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    let held = g.token();
    g.release().await.unwrap();
    let got = waiter.await.unwrap().expect("the waiter gets the lock after release");
    assert!(got > held);
}

pub(crate) async fn waiter_wakes_at_expiry_of_a_crashed_holder<H: Harness>(h: &H) {
    let store = h.store("lock_waiter_after_crash").await;
    let (coll, key) = (Collection::new("mongolocker").unwrap(), Key::new("job").unwrap());
    // A holder in another process takes the lock and dies without releasing.
    let crashed =
        Write::new(Condition::Free, Mutation::new().grant("dead-host/1/x/1", Ttl::new(ttl(h)).unwrap()).bump_fence())
            .upsert();
    let rec = store.write(&coll, &key, &crashed).await.unwrap();
    let dead_until = rec.record().unwrap().lease().unwrap().until;
    let b = Lock::builder(store.clone(), "job").ttl(ttl(h)).step(Duration::from_secs(3600)).build().unwrap();
    let g = b.acquire_timeout(Duration::from_secs(30)).await.expect("taken over at expiry, not after a step");
    assert!(g.since() >= dead_until, "never before the dead holder's lease lapsed: {} < {dead_until}", g.since());
    assert_eq!(g.token(), 2);
    assert_eq!(b.metrics().contention_waits, 1);
}

pub(crate) async fn acquire_times_out_with_the_holder<H: Harness>(h: &H) {
    let (_, make) = lock(h, "lock_timeout").await;
    let (a, b) = (make(), make());
    let g = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    match b.acquire_timeout(ttl(h) / 2).await {
        Err(LockError::Timeout { holder: Some(holder), waited, .. }) => {
            assert_eq!(holder.owner, g.owner());
            assert!(waited >= ttl(h) / 2);
        }
        other => panic!("expected a timeout: {other:?}"),
    }
    g.release().await.unwrap();
}

pub(crate) async fn bad_input_is_rejected<H: Harness>(h: &H) {
    let store = h.store("lock_bad_input").await;
    let config = |r: Result<Lock<H::Store>, LockError>, what: &str| match r {
        Err(LockError::Config(_)) => {}
        other => panic!("{what}: expected a configuration error, got {other:?}"),
    };
    config(Lock::builder(store.clone(), "").build(), "empty key");
    config(Lock::builder(store.clone(), "k").ttl(Duration::ZERO).build(), "zero ttl");
    config(Lock::builder(store.clone(), "k").ttl_secs(-5.0).build(), "negative ttl");
    config(Lock::builder(store.clone(), "k").ttl_secs(f64::NAN).build(), "NaN ttl");
    config(Lock::builder(store.clone(), "k").ttl(Duration::from_secs(10 * 366 * 86400)).build(), "absurd ttl");
    config(
        Lock::builder(store.clone(), "k").ttl(Duration::from_secs(10)).renew_every(Duration::from_secs(10)).build(),
        "renew >= ttl",
    );
    config(Lock::builder(store.clone(), "k").step(Duration::ZERO).build(), "zero step");
    config(Lock::builder(store.clone(), "k").collection("bad$name").build(), "bad collection");
    assert!(matches!(Semaphore::new(Lock::builder(store.clone(), "k"), 0), Err(LockError::Config(_))));
    let l = Lock::builder(store.clone(), "k").build().unwrap();
    assert!(matches!(l.touch().await, Err(LockError::NotHeld { .. })));
    assert!(!l.release(true).await.unwrap(), "force-releasing a free lock releases nothing");
    assert_eq!(
        store.count(&Collection::new("mongolocker").unwrap(), &store_trait::Query::all()).await.unwrap(),
        0,
        "nothing written"
    );
}

pub(crate) async fn dropped_guard_releases<H: Harness>(h: &H) {
    let store = h.store("lock_dropped_guard").await;
    let make = || Lock::builder(store.clone(), "job").ttl(Duration::from_secs(3600)).build().unwrap();
    let a = make();
    let g = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    drop(g);
    let b = make();
    let g = b
        .acquire_timeout(Duration::from_secs(20))
        .await
        .expect("a dropped guard frees the lock long before its 1 h lease");
    assert_eq!(g.token(), 2);
    assert_eq!(a.metrics().losses, 0, "a drop is not a loss");
}

pub(crate) async fn racers_32_one_holder<H: Harness>(h: &H) {
    let store = h.store("lock_racers_32").await;
    let locks: Vec<_> =
        (0..32).map(|_| Lock::builder(store.clone(), "job").ttl(Duration::from_secs(60)).build().unwrap()).collect();
    let results = join_all(locks.iter().map(|l| l.try_acquire())).await;
    let winners: Vec<_> = results.into_iter().filter_map(Result::unwrap).collect();
    assert_eq!(winners.len(), 1);
    assert_eq!(winners[0].token(), 1);
}

pub(crate) async fn semaphore_admits_n<H: Harness>(h: &H) {
    let store = h.store("lock_semaphore").await;
    let sems: Vec<_> = (0..16)
        .map(|_| Semaphore::new(Lock::builder(store.clone(), "exports").ttl(Duration::from_secs(60)), 3).unwrap())
        .collect();
    let results = join_all(sems.iter().map(|s| s.try_acquire())).await;
    let mut held: Vec<_> = results.into_iter().filter_map(Result::unwrap).collect();
    assert_eq!(held.len(), 3, "exactly N holders");
    let mut keys: Vec<String> = held.iter().map(|g| g.key().to_string()).collect();
    keys.sort();
    assert_eq!(keys, ["exports#0", "exports#1", "exports#2"]);
    let freed = held.pop().unwrap();
    let (freed_key, freed_token) = (freed.key().clone(), freed.token());
    freed.release().await.unwrap();
    let next = sems[5].acquire_with(Some(Duration::from_secs(10)), false).await.unwrap();
    assert_eq!(next.key(), &freed_key);
    assert!(next.token() > freed_token, "each permit's token grows");
    assert!(sems[6].try_acquire().await.unwrap().is_none());
}

pub(crate) async fn clock_skew_changes_nothing<H: Harness>(h: &H) {
    let store = h.store("lock_clock_skew").await;
    let mut traces = Vec::new();
    let mut offsets = Vec::new();
    for (i, skew) in [-3_600_000_i64, 0, 3_600_000].into_iter().enumerate() {
        let key = format!("job-{i}");
        let server_now = store.now().await.unwrap().as_millis();
        let clock = TokioClock::starting_at(store_trait::StoreTime::from_millis(server_now + skew));
        let make = || Lock::builder(store.clone(), key.clone()).ttl(ttl(h)).clock(clock.clone()).build().unwrap();
        let (a, b) = (make(), make());
        let mut trace = Vec::new();
        let g = a.acquire().await.unwrap();
        trace.push(b.try_acquire().await.unwrap().is_some());
        trace.push(a.owned().await.unwrap());
        lost_within_lease(&g, ttl(h)).await;
        // Past the lease on the store clock (a fixed sleep would assume the grant
        // had come back quickly).
        loop {
            let now = store.now().await.unwrap();
            if now > g.expires() {
                break;
            }
            tokio::time::sleep(now.until(g.expires()) + Duration::from_millis(5)).await;
        }
        trace.push(b.try_acquire().await.unwrap().is_some());
        traces.push(trace);
        offsets.push(a.clock_offset_ms().await.unwrap() - skew);
    }
    assert!(traces.iter().all(|t| t == &traces[0]), "{traces:?}");
    assert_eq!(traces[0], [false, true, true]);
    // Only the diagnostic sees the skew.
    assert!(offsets.iter().all(|o| o.abs() < 1_000), "offset minus skew: {offsets:?}");
}

pub(crate) async fn forced_release_signals_the_holder<H: Harness>(h: &H) {
    let (_, make) = lock(h, "lock_forced_release").await;
    let (a, b) = (make(), make());
    let g = Arc::new(a.acquire_with(Acquire::new().auto_renew()).await.unwrap());
    assert!(b.release(true).await.unwrap());
    tokio::time::timeout(Duration::from_secs(10), g.lost()).await.expect("the holder learns at its next renewal");
    assert_eq!(a.metrics().losses, 1);
}
