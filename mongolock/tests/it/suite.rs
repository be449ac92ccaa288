//! Lock behaviour every backend must show.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use mongolock::unstable::Leases;
use mongolock::{Acquire, Lock, LockError, Semaphore};
use store_test::Harness;
use store_test::TestClock;
use store_trait::{Collection, Condition, Key, Mutation, Store, StoreTime, Ttl, Write};

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

/// The suite (`lock_suite`): each `pub(crate) async fn` over a `Harness` here
/// is one test on every backend, registered by being written.
#[store_test::suite(lock_suite, crate::suite::cases)]
pub(crate) mod cases {
    use super::*;

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
        assert_eq!((cur.owner.as_str(), cur.fence), (g.owner(), g.fence()));
        assert_eq!(cur.pid, Some(std::process::id()));
        assert_eq!(cur.host.as_deref(), Some(a.identity().host()));
        assert!(cur.expires > cur.since);
        match b.acquire_with(Acquire::try_once()).await {
            Err(LockError::Held { holder, .. }) => assert_eq!(holder.owner, g.owner()),
            other => panic!("a held lock: {other:?}"),
        }
        assert!(b.try_acquire().await.unwrap().is_none());
        assert!(matches!(b.release().await, Err(LockError::NotHeld { .. })));
        let status = a.status().await.unwrap();
        assert!(status.owned && status.holder.is_some());
        assert_eq!(status.last_fence, g.fence());
        let before = g.expires();
        let after = a.touch().await.unwrap();
        assert!(after >= before, "touch returns the new expiry");
        a.release().await.unwrap(); // the seed's release() releases this instance's lock
        assert!(!a.locked().await.unwrap());
        assert!(matches!(a.release().await, Err(LockError::NotHeld { .. })));
        assert!(matches!(g.release().await, Err(LockError::NotHeld { .. })), "released once only");
        let m = a.metrics();
        assert_eq!((m.acquisitions, m.losses), (1, 0));
    }

    pub(crate) async fn fences_increase_across_release_expiry_and_force<H: Harness>(h: &H) {
        let (_, make) = lock(h, "lock_fences").await;
        let (a, b) = (make(), make());
        let mut fences = Vec::new();
        let g = a.acquire().await.unwrap();
        fences.push(g.fence());
        g.release().await.unwrap();
        let g = b.acquire().await.unwrap();
        fences.push(g.fence());
        // Let it lapse: no renewal.
        lost_within_lease(&g, ttl(h)).await;
        tokio::time::sleep(ttl(h) / 4).await;
        let g2 = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
        fences.push(g2.fence());
        drop(g);
        let forced = b.acquire_with(Acquire::new().force().auto_renew()).await.unwrap();
        fences.push(forced.fence());
        assert_eq!(b.metrics().steals, 1);
        tokio::time::timeout(Duration::from_secs(10), g2.lost()).await.expect("the forced-out holder learns it lost");
        assert!(b.release_by_force().await.unwrap());
        let g = a.acquire().await.unwrap();
        fences.push(g.fence());
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences strictly increase: {fences:?}");
        assert!(
            matches!(forced.release().await, Err(LockError::Lost { .. })),
            "the force-released guard cannot release"
        );
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
        // The lock is not released behind the holder's back (its work may still be
        // stopping): on the memory store's exact clock, it is still held now.
        let (coll, key) = (Collection::new("mongolocker").unwrap(), Key::new("job").unwrap());
        let snap = store.get(&coll, &key).await.unwrap();
        let held = snap.record.as_ref().and_then(|r| r.holder_at(snap.now)).is_some_and(|l| l.owner == g.owner());
        assert!(!exact || held, "released before the holder let go: {:?}", snap.record);
        // Once its work has stopped, the holder lets go, and the lock is free at
        // once instead of at expiry (on a slow server it may have lapsed already).
        assert_eq!(a.metrics().losses, 1);
        assert!(matches!(g.touch().await, Err(LockError::Lost { .. })));
        let released = g.release().await;
        assert!(released.is_ok() || matches!(released, Err(LockError::Lost { .. })), "{released:?}");
        let snap = store.get(&coll, &key).await.unwrap();
        assert!(snap.record.as_ref().and_then(|r| r.holder_at(snap.now)).is_none(), "free after the release");
    }

    pub(crate) async fn auto_renew_keeps_the_lock<H: Harness>(h: &H) {
        // Renewals must not depend on a loaded machine answering within the safety
        // margin of a short lease: four times the suite's lease, renewed thrice over.
        let store = h.store("lock_auto_renew").await;
        let long = ttl(h) * 4;
        let make = || Lock::builder(store.clone(), "job").ttl(long).build().unwrap();
        let (a, b) = (make(), make());
        let g = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
        let first_expiry = g.expires();
        tokio::time::sleep(long * 2).await;
        assert!(!g.is_lost());
        assert!(g.expires() > first_expiry, "renewed");
        assert!(b.try_acquire().await.unwrap().is_none());
        let cur = b.get_current().await.unwrap().unwrap();
        assert_eq!(cur.fence, g.fence(), "renewal keeps the fence");
        g.renew_now();
        g.release().await.unwrap();
        assert!(b.try_acquire().await.unwrap().is_some());
    }

    pub(crate) async fn waiter_wakes_on_release<H: Harness>(h: &H) {
        let store = h.store("lock_waiter_wakes_on_release").await;
        // A long lease and, with change notifications, a step so long that only a
        // notification can wake the waiter in time.
        let step = if h.change_streams_expected() { Duration::from_secs(3600) } else { Duration::from_millis(100) };
        let make =
            || Lock::builder(store.clone(), "job").ttl(Duration::from_secs(3600)).poll_interval(step).build().unwrap();
        let (a, b) = (make(), make());
        let g = a.acquire().await.unwrap();
        let waiter = tokio::spawn(async move { b.acquire_timeout(Duration::from_secs(30)).await.map(|g| g.fence()) });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished());
        let held = g.fence();
        g.release().await.unwrap();
        let got = waiter.await.unwrap().expect("the waiter gets the lock after release");
        assert!(got > held);
    }

    pub(crate) async fn waiter_wakes_at_expiry_of_a_crashed_holder<H: Harness>(h: &H) {
        let store = h.store("lock_waiter_after_crash").await;
        let (coll, key) = (Collection::new("mongolocker").unwrap(), Key::new("job").unwrap());
        // A holder in another process takes the lock and dies without releasing.
        let crashed = Write::new(
            Condition::Free,
            Mutation::new().grant("dead-host/1/x/1", Ttl::new(ttl(h)).unwrap()).bump_fence(),
        )
        .upsert();
        let rec = store.write(&coll, &key, &crashed).await.unwrap();
        let dead_until = rec.record().unwrap().lease().unwrap().until;
        let b =
            Lock::builder(store.clone(), "job").ttl(ttl(h)).poll_interval(Duration::from_secs(3600)).build().unwrap();
        let g = b.acquire_timeout(Duration::from_secs(30)).await.expect("taken over at expiry, not after a step");
        assert!(g.since() >= dead_until, "never before the dead holder's lease lapsed: {} < {dead_until}", g.since());
        assert_eq!(g.fence(), 2);
        assert_eq!(b.metrics().contention_waits, 1);
    }

    pub(crate) async fn acquire_times_out_with_the_holder<H: Harness>(h: &H) {
        // The holder's lease is long enough that a loaded machine cannot make it
        // lapse while the other client waits half a short lease.
        let store = h.store("lock_timeout").await;
        let make = || Lock::builder(store.clone(), "job").ttl(ttl(h) * 4).build().unwrap();
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
        config(Lock::builder(store.clone(), "k").poll_interval(Duration::ZERO).build(), "zero step");
        config(Lock::builder(store.clone(), "k").collection("bad$name").build(), "bad collection");
        assert!(matches!(Semaphore::new(Lock::builder(store.clone(), "k"), 0), Err(LockError::Config(_))));
        let l = Lock::builder(store.clone(), "k").build().unwrap();
        assert!(matches!(l.touch().await, Err(LockError::NotHeld { .. })));
        assert!(!l.release_by_force().await.unwrap(), "force-releasing a free lock releases nothing");
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
        assert_eq!(g.fence(), 2);
        assert_eq!(a.metrics().losses, 0, "a drop is not a loss");
    }

    pub(crate) async fn racers_32_one_holder<H: Harness>(h: &H) {
        let store = h.store("lock_racers_32").await;
        let locks: Vec<_> = (0..32)
            .map(|_| Lock::builder(store.clone(), "job").ttl(Duration::from_secs(60)).build().unwrap())
            .collect();
        let results = join_all(locks.iter().map(|l| l.try_acquire())).await;
        let winners: Vec<_> = results.into_iter().filter_map(Result::unwrap).collect();
        assert_eq!(winners.len(), 1);
        assert_eq!(winners[0].fence(), 1);
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
        let (freed_key, freed_fence) = (freed.key().clone(), freed.fence());
        freed.release().await.unwrap();
        let next = sems[5].acquire_with(mongolock::Acquire::new().timeout(Duration::from_secs(10))).await.unwrap();
        assert_eq!(next.key(), &freed_key);
        assert!(next.fence() > freed_fence, "each permit's fence grows");
        assert!(sems[6].try_acquire().await.unwrap().is_none());
    }

    /// Slot documents are created as holders need them; racers on a semaphore
    /// whose slots are missing all get what they ask for while permits are free
    /// (a racer whose slots another created and took goes round again): a limit
    /// that does not bind never turns a caller away.
    pub(crate) async fn semaphore_racers_on_missing_slots_are_not_refused<H: Harness>(h: &H) {
        let store = h.store("lock_semaphore_missing_slots").await;
        let sem = || Semaphore::new(Lock::builder(store.clone(), "wide").ttl(Duration::from_secs(60)), 1000).unwrap();
        let (many, single): (Vec<_>, Vec<_>) = ((0..6).map(|_| sem()).collect(), (0..4).map(|_| sem()).collect());
        let (batches, singles) = futures::join!(
            join_all(many.iter().map(|s| s.try_acquire_many(4))),
            join_all(single.iter().map(|s| s.try_acquire()))
        );
        let batches: Vec<usize> = batches.into_iter().map(|r| r.unwrap().len()).collect();
        assert_eq!(batches, [4; 6], "a batch was refused free permits");
        assert!(singles.into_iter().all(|r| r.unwrap().is_some()), "a single acquisition was refused a free permit");
    }

    /// A document at a slot's id that is no slot of this semaphore (a plain lease
    /// another program wrote there, or a slot of another permit count on the
    /// same key, left by a change of the limit) is adopted once free: it
    /// blocked that permit for ever, since it could be neither claimed nor
    /// created. A held one is left until it is free; its fence never goes back.
    pub(crate) async fn semaphore_adopts_documents_at_its_slot_ids<H: Harness>(h: &H) {
        let store = h.store("lock_semaphore_adopts").await;
        let coll = Collection::new("mongolocker").unwrap();
        let grant = |owner: &str, ttl: Duration| {
            Write::new(Condition::Free, Mutation::new().grant(owner, Ttl::new(ttl).unwrap()).bump_fence()).upsert()
        };
        // A plain lease, lapsed, at the one slot's id.
        store
            .write(&coll, &Key::new("one#0").unwrap(), &grant("other-program", Duration::from_millis(1)))
            .await
            .unwrap();
        // A live one at the other semaphore's second slot, and a slot of a
        // three-permit limit at its first.
        store.write(&coll, &Key::new("two#1").unwrap(), &grant("other-program", ttl(h) * 2)).await.unwrap();
        let old_limit = Semaphore::new(Lock::builder(store.clone(), "two").ttl(ttl(h)), 3).unwrap();
        drop(old_limit.try_acquire_many(1).await.unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let one = Semaphore::new(Lock::builder(store.clone(), "one").ttl(Duration::from_secs(60)), 1).unwrap();
        let got = one.try_acquire().await.unwrap().expect("the lapsed document at the slot's id is adopted");
        assert!(got.fence() >= 2, "the fence goes on from the adopted document's: {}", got.fence());
        let two = Semaphore::new(Lock::builder(store.clone(), "two").ttl(Duration::from_secs(60)), 2).unwrap();
        let first = two.try_acquire_many(2).await.unwrap();
        assert_eq!(first.len(), 1, "the old limit's slot is adopted; the live lease is not taken");
        let deadline = tokio::time::Instant::now() + ttl(h) * 4;
        loop {
            if two.try_acquire().await.unwrap().is_some() {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "adopted once its lease lapsed");
            tokio::time::sleep(ttl(h) / 4).await;
        }
    }

    /// A waiter for a permit wakes when one is released, as a lock's waiter does:
    /// with change notifications the step is an hour and the permit's lease too, so
    /// only the notification can wake it in time.
    pub(crate) async fn semaphore_waiter_wakes_on_release<H: Harness>(h: &H) {
        let store = h.store("lock_semaphore_waiter").await;
        let step = if h.change_streams_expected() { Duration::from_secs(3600) } else { Duration::from_millis(100) };
        let make = || {
            let config = Lock::builder(store.clone(), "exports").ttl(Duration::from_secs(3600)).poll_interval(step);
            Semaphore::new(config, 1).unwrap()
        };
        let (a, b) = (make(), make());
        let held = a.acquire().await.unwrap();
        // No timeout of its own: at a timeout a waiter tries once more, and would
        // get the permit without having been woken.
        let waiter = tokio::spawn(async move { b.acquire().await.map(|g| g.fence()) });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "one permit, held");
        let fence = held.fence();
        held.release().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(30), waiter).await.expect("woken by the release");
        assert!(got.unwrap().expect("the waiter gets the released permit") > fence);
    }

    /// A client's wall clock an hour off changes nothing about leases: they are
    /// granted and checked on the store clock. Each assertion would break if leases
    /// were computed on the client clock, or if the holder compared its wall clock
    /// with store times.
    pub(crate) async fn client_clock_skew_leaves_leases_alone<H: Harness>(h: &H) {
        let store = h.store("lock_client_clock_skew").await;
        let server_now = store.now().await.unwrap().as_millis();
        let hour = 3_600_000_i64;
        let make = |skew: i64| {
            let clock = TestClock::starting_at(StoreTime::from_millis(server_now + skew));
            Lock::builder(store.clone(), "job").ttl(ttl(h)).clock(clock).build().unwrap()
        };
        let (behind, ahead) = (make(-hour), make(hour));
        let g = behind.acquire().await.unwrap();
        // Granted on the store clock: a ttl from the store's now, not from the
        // holder's clock an hour behind.
        let ttl_ms = i64::try_from(ttl(h).as_millis()).unwrap();
        assert_eq!(g.expires().as_millis() - g.since().as_millis(), ttl_ms);
        assert!((g.since().as_millis() - server_now).abs() < 60_000, "since {} vs store {server_now}", g.since());
        // On the clock of a client an hour ahead, that lease ended an hour ago; it is
        // still held.
        assert!(ahead.try_acquire().await.unwrap().is_none(), "taken while the lease was live");
        // On the holder's clock, an hour is left; it is told before the store lease
        // ends, not an hour later, and not at once either (an hour of skew is no gap).
        tokio::time::sleep(ttl(h) / 2).await;
        assert!(!g.is_lost(), "a constant skew is not time passed unseen");
        lost_within_lease(&g, ttl(h)).await;
        let now = store.now().await.unwrap();
        assert!(now < g.expires(), "told after the lease lapsed: now {now}, expiry {}", g.expires());
        let m = behind.metrics();
        assert_eq!((m.losses, m.local_clock_gaps, m.store_clock_jumps), (1, 0, 0), "{m:?}");
        // The client an hour ahead takes over and keeps the lock renewed, its
        // clock notwithstanding.
        let g2 = ahead.acquire_with(Acquire::new().auto_renew().timeout(ttl(h) * 2)).await.unwrap();
        assert!(g2.fence() > g.fence());
        tokio::time::sleep(ttl(h) * 2).await;
        assert!(!g2.is_lost());
        assert!(behind.try_acquire().await.unwrap().is_none());
        // Only the diagnostic sees the skew.
        let offset = ahead.clock_offset_ms().await.unwrap();
        assert!((offset - hour).abs() < 1_000, "offset {offset}");
        assert_eq!(ahead.metrics().losses, 0);
        g2.release().await.unwrap();
    }

    pub(crate) async fn forced_release_signals_the_holder<H: Harness>(h: &H) {
        let (_, make) = lock(h, "lock_forced_release").await;
        let (a, b) = (make(), make());
        let g = Arc::new(a.acquire_with(Acquire::new().auto_renew()).await.unwrap());
        assert!(b.release_by_force().await.unwrap());
        tokio::time::timeout(Duration::from_secs(10), g.lost()).await.expect("the holder learns at its next renewal");
        assert_eq!(a.metrics().losses, 1);
    }

    /// A lock document the Python `MongoLocker` wrote under the same key: it has no
    /// lease this crate can read, so it would look free; it is a typed error instead,
    /// for every way of taking or reading the lock, and it is left as it was.
    pub(crate) async fn foreign_lock_documents_are_never_taken<H: Harness>(h: &H) {
        let (store, make) = lock(h, "lock_foreign").await;
        let c = Collection::new(mongolock::DEFAULT_COLLECTION).unwrap();
        let past = bson::DateTime::from_millis(1_000);
        for (id, locked) in [("job", true), ("released", false)] {
            let doc = bson::doc! {"_id": id, "locked": locked, "host": "py-host", "uuid": "5f0c9a1e-0000-4000-8000-000000000000",
            "ts_created": past, "ts_expire": past};
            h.insert_raw(&store, &c, doc).await;
        }
        let foreign = |r: Result<(), LockError>, what: &str| match r {
            Err(LockError::Foreign { key, fields }) => {
                assert!(key == "job" || key == "released", "{what}: {key}");
                assert_eq!(fields, mongolock::FOREIGN_LOCK_FIELDS, "{what}");
            }
            other => panic!("{what}: expected Foreign, got {other:?}"),
        };
        let a = make();
        foreign(a.acquire_with(Acquire::try_once()).await.map(drop), "try_once");
        foreign(a.acquire_with(Acquire::new().timeout(ttl(h))).await.map(drop), "blocking");
        foreign(a.acquire_with(Acquire::try_once().force()).await.map(drop), "forced");
        foreign(a.locked().await.map(drop), "locked");
        foreign(a.get_current().await.map(drop), "get_current");
        foreign(a.status().await.map(drop), "status");
        let released = Lock::builder(store.clone(), "released").ttl(ttl(h)).build().unwrap();
        foreign(released.acquire_with(Acquire::try_once()).await.map(drop), "a released foreign lock");
        let r = store.get(&c, &Key::new("job").unwrap()).await.unwrap().record.unwrap();
        assert!(r.lease().is_none() && r.fence() == 0 && r.rev() == 0, "left as it was: {r:?}");
        assert_eq!(r.data().get_str("uuid").unwrap(), "5f0c9a1e-0000-4000-8000-000000000000");
    }

    /// A lock's guard never marks its document for garbage collection (a TTL index
    /// deleting it would reset the fence); a task lease's guard (`allow_gc`) may.
    pub(crate) async fn lock_documents_never_get_gc_at<H: Harness>(h: &H) {
        let (store, make) = lock(h, "lock_no_gc").await;
        let gc = Ttl::new(Duration::from_millis(1)).unwrap();
        let a = make();
        let g = a.acquire().await.unwrap();
        match g.write(Mutation::new().set("x", 1).gc_after(gc)).await {
            Err(LockError::GcOnLock { key }) => assert_eq!(key, "job"),
            other => panic!("write with gc on a lock: {other:?}"),
        }
        assert!(g.write(Mutation::new().set("y", 1)).await.is_ok(), "the guard still holds the lock");
        match g.release_with(Mutation::new().gc_after(gc)).await {
            Err(LockError::GcOnLock { .. }) => {}
            other => panic!("release_with gc on a lock: {other:?}"),
        }
        let c = Collection::new(mongolock::DEFAULT_COLLECTION).unwrap();
        let r = store.get(&c, &Key::new("job").unwrap()).await.unwrap().record.unwrap();
        assert!(r.data().get("x").is_none(), "nothing of the rejected write was applied");
        // The document is never collected.
        store.ensure_indexes(&c, &[store_trait::IndexSpec::gc()]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        h.prune_ttl(&store).await;
        assert!(store.get(&c, &Key::new("job").unwrap()).await.unwrap().record.is_some());
        // A task lease, kept through leases that allow it, may be marked.
        let tasks = Leases::builder(store.clone(), "tasks").ttl(ttl(h)).allow_gc().build().unwrap();
        let grant =
            Write::new(Condition::Free, Mutation::new().grant("worker", Ttl::new(ttl(h)).unwrap()).bump_fence());
        let sent = tokio::time::Instant::now();
        let granted = store.write(tasks.collection(), &Key::new("task").unwrap(), &grant.upsert()).await.unwrap();
        let g = tasks.keep(granted.record().unwrap(), sent).unwrap();
        assert!(g.release_with(Mutation::new().gc_after(gc)).await.is_ok(), "a task lease may be marked");
    }
}
