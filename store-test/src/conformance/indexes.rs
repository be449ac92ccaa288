//! Conformance: indexes: unique keys and the TTL index that collects garbage.

#[crate::suite(__conformance_indexes, crate::conformance::indexes::cases, export)]
pub mod cases {
    use crate::conformance::*;

    pub async fn unique_index_dedupes<H: Harness>(h: &H) {
        let s = h.store("unique_index_dedupes").await;
        let c = coll("tasks");
        let idx = IndexSpec::new("dedupe", vec![("dedupe_key".into(), Order::Asc)]).unique().sparse();
        s.ensure_indexes(&c, std::slice::from_ref(&idx)).await.unwrap();
        s.ensure_indexes(&c, &[idx]).await.unwrap();
        let out = s
            .insert_many(
                &c,
                vec![
                    doc! {"_id": "1", "dedupe_key": "x"},
                    doc! {"_id": "2", "dedupe_key": "x"},
                    doc! {"_id": "3"},
                    doc! {"_id": "4"},
                ],
            )
            .await
            .unwrap();
        assert_eq!(
            out,
            vec![
                InsertOutcome::Inserted(key("1")),
                InsertOutcome::Duplicate(key("2")),
                InsertOutcome::Inserted(key("3")),
                InsertOutcome::Inserted(key("4"))
            ]
        );
        let clash = Write::new(Condition::Always, Mutation::new().set("dedupe_key", "x"));
        match s.write(&c, &key("3"), &clash).await {
            Err(StoreError::DuplicateKey { .. }) => {}
            other => panic!("a write violating a unique index: {other:?}"),
        }
        let doc3 = s.get(&c, &key("3")).await.unwrap().record.unwrap();
        assert!(doc3.data().get("dedupe_key").is_none(), "nothing half-written");
        s.ensure_indexes(&c, &[IndexSpec::gc()]).await.unwrap();
    }

    /// A document marked for collection is deleted by a TTL pass; one whose mark was
    /// cleared (a task made ready again after it ended) is not.
    pub async fn gc_at_is_set_and_cleared<H: Harness>(h: &H) {
        let s = h.store("gc_at_is_set_and_cleared").await;
        let c = coll("tasks");
        s.ensure_indexes(&c, &[IndexSpec::gc()]).await.unwrap();
        s.insert_many(&c, vec![doc! {"_id": "ended"}, doc! {"_id": "revived"}, doc! {"_id": "never"}]).await.unwrap();
        let mark = Write::new(
            Condition::Always,
            Mutation::new().set("complete", true).gc_after(ttl_of(Duration::from_millis(1))),
        );
        for k in ["ended", "revived"] {
            applied(s.write(&c, &key(k), &mark).await.unwrap());
        }
        let revive = Write::new(Condition::Always, Mutation::new().set("complete", false).clear_gc());
        let r = applied(s.write(&c, &key("revived"), &revive).await.unwrap());
        assert!(r.data().get("gc_at").is_none());
        // Clearing a mark that is not there changes nothing else.
        applied(s.write(&c, &key("never"), &revive).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
        h.prune_ttl(&s).await;
        assert!(s.get(&c, &key("ended")).await.unwrap().record.is_none(), "a marked document is collected");
        for k in ["revived", "never"] {
            assert!(s.get(&c, &key(k)).await.unwrap().record.is_some(), "{k} must survive the TTL pass");
        }
        let both = Write::new(Condition::Always, Mutation::new().gc_after(ttl_of(Duration::from_secs(1))).clear_gc());
        assert!(matches!(s.write(&c, &key("never"), &both).await, Err(StoreError::InvalidInput { .. })));
    }

    /// A unique key is free again once its document no longer holds it: after a
    /// write removes the field, and after one changes its value (the new value
    /// is then taken). A dedupe key retired by a write (mongoagent's dedupe
    /// scopes) relies on it.
    ///
    /// # Cancel safety
    ///
    /// A test body on a store of its own, as every conformance test: dropped
    /// half-way, it leaves that store half-written and nothing else.
    pub async fn unique_key_is_released_by_a_write<H: Harness>(h: &H) {
        let test = "unique_key_is_released_by_a_write";
        let s = h.store(test).await;
        if !h.has(test, Needs::UniqueKeyRelease).await {
            return;
        }
        let c = coll("tasks");
        let idx = IndexSpec::new("dedupe", vec![("dedupe_key".into(), Order::Asc)]).unique().sparse();
        s.ensure_indexes(&c, &[idx]).await.unwrap();
        let docs = vec![doc! {"_id": "1", "dedupe_key": "x"}, doc! {"_id": "2", "dedupe_key": "y"}];
        s.insert_many(&c, docs).await.unwrap();
        let retire = Mutation::new().unset("dedupe_key").set("dedupe_key_retired", "x");
        assert!(s.write(&c, &key("1"), &Write::new(Condition::Always, retire)).await.unwrap().is_applied());
        let change = Mutation::new().set("dedupe_key", "z");
        assert!(s.write(&c, &key("2"), &Write::new(Condition::Always, change)).await.unwrap().is_applied());
        let out = s
            .insert_many(
                &c,
                vec![
                    doc! {"_id": "3", "dedupe_key": "x"},
                    doc! {"_id": "4", "dedupe_key": "y"},
                    doc! {"_id": "5", "dedupe_key": "z"},
                ],
            )
            .await
            .unwrap();
        assert_eq!(
            out,
            vec![
                InsertOutcome::Inserted(key("3")),
                InsertOutcome::Inserted(key("4")),
                InsertOutcome::Duplicate(key("5"))
            ],
            "x removed and y changed are free again; z is taken"
        );
    }
}
