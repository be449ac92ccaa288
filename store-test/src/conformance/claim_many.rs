//! Conformance: batch claims: fences in order, abandoned batches, racers.

#[crate::suite(__conformance_claim_many, crate::conformance::claim_many::cases, export)]
pub mod cases {
    use crate::conformance::*;

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
}
