//! Conformance: inserts and reads: duplicates, queries and conditions on
//! fields, distinct values, foreign documents.

#[crate::suite(__conformance_documents, crate::conformance::documents::cases, export)]
pub mod cases {
    use crate::conformance::*;

    pub async fn insert_many_reports_duplicates<H: Harness>(h: &H) {
        let s = h.store("insert_many_reports_duplicates").await;
        let c = coll("tasks");
        let out = s.insert_many(&c, vec![doc! {"_id": "a", "n": 1}, doc! {"_id": "b"}]).await.unwrap();
        assert_eq!(out, vec![InsertOutcome::Inserted(key("a")), InsertOutcome::Inserted(key("b"))]);
        let out = s
            .insert_many(&c, vec![doc! {"_id": "a", "n": 2}, doc! {"_id": "c"}, doc! {"_id": "c"}, doc! {"x": 1}])
            .await
            .unwrap();
        assert_eq!(out.len(), 4);
        assert_eq!(out[0], InsertOutcome::Duplicate(key("a")));
        assert_eq!(out[1], InsertOutcome::Inserted(key("c")));
        assert_eq!(out[2], InsertOutcome::Duplicate(key("c")));
        let generated = match &out[3] {
            InsertOutcome::Inserted(k) => k.clone(),
            other => panic!("generated id: {other:?}"),
        };
        let a = s.get(&c, &key("a")).await.unwrap().record.unwrap();
        assert_eq!(a.data().get("n"), Some(&Bson::Int32(1)), "a duplicate never overwrites");
        assert_eq!((a.rev(), a.fence()), (1, 0));
        assert!(s.get(&c, &generated).await.unwrap().record.is_some());
        assert_eq!(s.count(&c, &Query::all()).await.unwrap(), 4);
    }

    pub async fn find_and_count<H: Harness>(h: &H) {
        let s = h.store("find_and_count").await;
        let c = coll("tasks");
        let docs = (0..10)
            .map(|i| doc! {"_id": format!("t{i}"), "agent_name": if i % 2 == 0 { "even" } else { "odd" }, "n": i})
            .collect();
        s.insert_many(&c, docs).await.unwrap();
        let q = Query::eq(doc! {"agent_name": "even"}).sort("n", Order::Desc).limit(3);
        let got: Vec<String> = s.find(&c, &q).await.unwrap().iter().map(|r| r.key().to_string()).collect();
        assert_eq!(got, ["t8", "t6", "t4"]);
        assert_eq!(s.count(&c, &q).await.unwrap(), 5);
        let q = Query::all().when(Condition::FieldEq("n".into(), Bson::Int64(3)));
        assert_eq!(s.count(&c, &q).await.unwrap(), 1);
        applied(s.write(&c, &key("t1"), &acquire("w", ttl_of(Duration::from_secs(30)))).await.unwrap());
        let held = Query::all().when(Condition::Free.negate());
        let got = s.find(&c, &held).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].key().to_string(), "t1");
        let by_owner = Query::eq(doc! {"lease_owner": "w"});
        assert_eq!(s.count(&c, &by_owner).await.unwrap(), 1);
    }

    pub async fn field_conditions<H: Harness>(h: &H) {
        let s = h.store("field_conditions").await;
        let (c, k) = (coll("tasks"), key("t"));
        s.insert_many(&c, vec![doc! {"_id": "t", "n": 1_i32, "s": "$notAnOperator", "z": null}]).await.unwrap();
        let cases = [
            (Condition::FieldEq("n".into(), Bson::Int64(1)), true),
            (Condition::FieldEq("n".into(), Bson::Double(1.0)), true),
            (Condition::FieldEq("n".into(), Bson::String("1".into())), false),
            (Condition::FieldEq("s".into(), Bson::String("$notAnOperator".into())), true),
            (Condition::FieldEq("missing".into(), Bson::Int32(1)), false),
            (Condition::Exists("z".into()), false),
            (Condition::Exists("missing".into()), false),
            (Condition::Exists("n".into()), true),
            (Condition::Exists("z".into()).negate(), true),
            (Condition::Any(vec![]), false),
            (Condition::All(vec![]), true),
            (Condition::Absent, false),
            (Condition::Free, true),
            (Condition::AtMost("n".into(), 1), true),
            (Condition::AtMost("n".into(), 0), false),
            (Condition::AtMost("z".into(), -1), true),
            (Condition::AtMost("missing".into(), i64::MIN), true),
            (Condition::AtMost("s".into(), i64::MAX), false),
        ];
        for (cond, expect) in cases {
            let w = Write::new(cond.clone(), Mutation::new());
            let got = s.write(&c, &k, &w).await.unwrap().is_applied();
            assert_eq!(got, expect, "{cond:?}");
        }
    }

    pub async fn due_by_tolerates_malformed_values<H: Harness>(h: &H) {
        let s = h.store("due_by_tolerates_malformed_values").await;
        let c = coll("tasks");
        let now = s.now().await.unwrap().as_millis();
        s.insert_many(
            &c,
            vec![
                doc! {"_id": "text", "run_at": "soon"},
                doc! {"_id": "missing"},
                doc! {"_id": "null", "run_at": null},
                doc! {"_id": "future-ms", "run_at": now + 3_600_000},
                doc! {"_id": "past-ms", "run_at": now - 1},
                doc! {"_id": "future-date", "run_at": bson::DateTime::from_millis(now + 3_600_000)},
            ],
        )
        .await
        .unwrap();
        let q = Query::all().when(Condition::DueBy("run_at".into())).sort("_id", Order::Asc);
        let got: Vec<String> = s.find(&c, &q).await.unwrap().iter().map(|r| r.key().to_string()).collect();
        assert_eq!(got, ["missing", "null", "past-ms", "text"]);
    }

    /// The distinct string values of a field over the readable documents a
    /// query matches, sorted: other types, missing fields and unreadable
    /// documents are left out; a reserved or malformed field is refused.
    pub async fn distinct_strings_of_a_field<H: Harness>(h: &H) {
        let s = h.store("distinct_strings_of_a_field").await;
        let c = coll("tasks");
        let docs = vec![
            doc! {"_id": "1", "agent_name": "resize", "ready": true},
            doc! {"_id": "2", "agent_name": "convert", "ready": true},
            doc! {"_id": "3", "agent_name": "resize", "ready": false},
            doc! {"_id": "4", "agent_name": 7, "ready": true},
            doc! {"_id": "5", "ready": true},
        ];
        s.insert_many(&c, docs).await.unwrap();
        h.insert_raw(&s, &c, doc! {"_id": "bad", "agent_name": "foreign", "fence": "1"}).await;
        let all = s.distinct_strings(&c, "agent_name", &Query::all()).await.unwrap();
        assert_eq!(all, ["convert", "resize"]);
        let ready = s.distinct_strings(&c, "agent_name", &Query::eq(doc! {"ready": false})).await.unwrap();
        assert_eq!(ready, ["resize"]);
        for bad in ["fence", "$x", "a.b"] {
            let r = s.distinct_strings(&c, bad, &Query::all()).await;
            assert!(matches!(r, Err(StoreError::InvalidInput { .. })), "{bad}: {r:?}");
        }
    }

    pub async fn foreign_documents_are_readable<H: Harness>(h: &H) {
        // Tasks written by the original mongo_agent carry ObjectId ids and no store
        // metadata; they must read, claim and complete like any other.
        let s = h.store("foreign_documents_are_readable").await;
        let c = coll("queue");
        let oid = bson::oid::ObjectId::new();
        s.insert_many(&c, vec![doc! {"_id": oid, "agent_name": "a", "ready": true}]).await.unwrap();
        let claim = Claim {
            query: Query::eq(doc! {"agent_name": "a", "ready": true}),
            mutation: Mutation::new().grant("w", ttl_of(Duration::from_secs(30))).bump_fence().set("ready", false),
        };
        let r = s.claim(&c, &claim).await.unwrap().expect("claimed");
        assert_eq!(r.key().as_bson(), &Bson::ObjectId(oid));
        let done = Write::new(
            Condition::HeldBy("w".into()).and(Condition::FenceIs(r.fence())),
            Mutation::new().release().set("complete", true),
        );
        let r = applied(s.write(&c, r.key(), &done).await.unwrap());
        assert_eq!(r.data().get("complete"), Some(&Bson::Boolean(true)));
        assert!(StoreTime::from_millis(0) < s.now().await.unwrap());
    }
}
