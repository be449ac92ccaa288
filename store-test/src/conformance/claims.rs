//! Conformance: claims: the order, leases and due times they respect, claims by
//! key, and documents they pass over.

#[crate::suite(__conformance_claims, crate::conformance::claims::cases, export)]
pub mod cases {
    use crate::conformance::*;

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
        // A head of unreadable documents longer than the limit starves no
        // list, and a list shorter than its limit leaves them out too.
        for bad in ["bad2", "bad3"] {
            let unreadable = doc! { "_id": bad, "agent_name": "a", "ready": true, "priority": 10, "rev": -1 };
            h.insert_raw(&s, &c, unreadable).await;
        }
        let listed = s.find_keys(&c, &claim_for("w", ttl).query.limit(2)).await.unwrap();
        assert_eq!(listed, [key("k3"), key("k2")]);
        let listed = s.find_keys(&c, &claim_for("w", ttl).query.limit(50)).await.unwrap();
        assert_eq!(listed, [key("k3"), key("k2"), oid_key_of(oid), key("k4"), key("k1")]);
        let listed = s.find_keys(&c, &claim_for("w", ttl).query).await.unwrap();
        assert_eq!(listed, [key("k3"), key("k2"), oid_key_of(oid), key("k4"), key("k1")]);
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
        let good_keys: Vec<Key> = good.iter().map(|d| Key::from_bson(d.get("_id").unwrap().clone()).unwrap()).collect();
        // Lists of candidates leave every kind out: read whole, read up to
        // a limit the unreadable head fills many times over, and read for a
        // batch claimed behind that head.
        let list = claim.query.clone();
        assert_eq!(s.find_keys(&c, &list).await.unwrap(), good_keys);
        let five = u32::try_from(good.len()).unwrap();
        assert_eq!(s.find_keys(&c, &list.clone().limit(five)).await.unwrap(), good_keys);
        assert_eq!(s.find_keys(&c, &list.clone().limit(2)).await.unwrap(), good_keys[..2]);
        let batch = s.claim_many(&c, &claim, 2).await.unwrap();
        assert_eq!(batch.iter().map(|r| r.key().clone()).collect::<Vec<_>>(), good_keys[..2]);
        let mut claimed: Vec<Key> = batch.iter().map(|r| r.key().clone()).collect();
        while let Some(r) = s.claim(&c, &claim).await.unwrap() {
            claimed.push(r.key().clone());
            assert!(claimed.len() <= good.len(), "claimed an unreadable document: {claimed:?}");
        }
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
        let name =
            |id: &Bson| Key::from_bson(id.clone()).map_or_else(|_| store_trait::render_raw_id(id), |k| k.to_string());
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
}
