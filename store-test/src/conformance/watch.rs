//! Conformance: change notifications: all of them, filtered on the backend's
//! side, and lease changes without renewals.

#[crate::suite(__conformance_watch, crate::conformance::watch::cases, export)]
pub mod cases {
    use crate::conformance::*;

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
        let renew =
            Write::new(Condition::HeldBy("a".into()), Mutation::new().grant("a", ttl_of(Duration::from_secs(60))));
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
        use store_trait::{fields, ChangeFilter, UpdateClause};
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
        filter: &store_trait::ChangeFilter,
    ) -> Option<store_trait::ChangeStream> {
        match (s.watch_filtered(c, filter).await, h.change_streams_expected()) {
            (Err(StoreError::Unsupported { .. }), false) => None,
            (Ok(stream), true) => Some(stream),
            (Err(e), _) => panic!("a filtered watch: {e}"),
            (Ok(_), false) => panic!("change streams reported where none were expected"),
        }
    }

    /// The events of documents (resyncs passed over) that `stream` delivers
    /// before one of `end`, each within 10 s of the last.
    async fn events_until(stream: &mut store_trait::ChangeStream, end: &Key) -> Vec<store_trait::ChangeEvent> {
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

    /// [`ChangeFilter::lease_changes`](store_trait::ChangeFilter::lease_changes), what
    /// lock waiters and followers subscribe to: a lease granted, handed over, let
    /// go or removed is delivered; its renewals, and writes that leave the lease
    /// alone, are not.
    pub async fn lease_changes_pass_over_renewals<H: Harness>(h: &H) {
        use store_trait::ChangeFilter;
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
}
