//! Conformance: conditional writes: nonces, compare-and-set, deletes, races for
//! one key, data mutations, typed input errors, rejected writes, batches of
//! writes.

#[crate::suite(__conformance_writes, crate::conformance::writes::cases, export)]
pub mod cases {
    use crate::conformance::*;

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
        let stale = Write::new(
            Condition::OwnedBy("a".into()).and(Condition::FenceIs(r.fence() + 1)),
            Mutation::new().set("v", 1),
        );
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
}
