//! Conformance: leases on the store clock: granted, renewed, released, lapsed;
//! fences that only grow.

#[crate::suite(__conformance_leases, crate::conformance::leases::cases, export)]
pub mod cases {
    use crate::conformance::*;

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
}
