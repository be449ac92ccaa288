//! Integration tests of the agents: one behavioural suite on the in-memory store
//! (paused time, with and without change notifications) and on a real server,
//! and a deterministic simulation with crashes, partitions and faults.
#![allow(clippy::unwrap_used, missing_docs)]

mod simulation;
mod suite;

store_trait::on_all_backends!(crate::agent_suite, std::time::Duration::from_secs(2));

mod faults {
    //! `configureFailPoint` against the real server: a dropped connection on the
    //! claim, an error on the completion. Nothing is lost; nothing applied twice.

    use std::time::Duration;

    use bson::doc;
    use mongoagent::{Agent, NewTask, Processed, Queue, Task};

    async fn fail_point(admin: &store_mongo::mongodb::Client, data: bson::Document, times: i32) {
        admin
            .database("admin")
            .run_command(doc! { "configureFailPoint": "failCommand", "mode": { "times": times }, "data": data })
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mongo_faults_lose_nothing() {
        let Some(store) = store_mongo::testing::test_store_as("ag_failpoints", "agfp").await else { return };
        let Some(admin) = store_mongo::testing::admin_client().await else { return };
        let q = Queue::new(store.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("t1")).await.unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("t2")).await.unwrap();
        let a = Agent::builder(store.clone(), "w", "tasks").lease(Duration::from_secs(2)).build().unwrap();

        // The claim's connection drops: the driver retries once by itself, or the
        // agent reports a transient error; either way the task is not lost.
        fail_point(&admin, doc! { "failCommands": ["findAndModify"], "closeConnection": true, "appName": "agfp" }, 1)
            .await;
        let first = a.process(|_t: Task| async { true }).await;
        if let Err(e) = &first {
            assert!(e.to_string().contains("transient") || e.to_string().contains("connection"), "{e}");
        }

        // The completion fails with an error the driver does not retry: the
        // outcome is not recorded, the claim lapses, and the task runs again.
        admin
            .database("admin")
            .run_command(doc! { "configureFailPoint": "failCommand", "mode": { "skip": 1 },
            "data": { "failCommands": ["findAndModify"], "errorCode": 2, "appName": "agfp" } })
            .await
            .unwrap();
        let failed = a.process(|_t: Task| async { true }).await;
        admin.database("admin").run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" }).await.unwrap();
        assert!(failed.is_err(), "the completion hit the failpoint: {failed:?}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while q.stats("w").await.unwrap().completed < 2 && std::time::Instant::now() < deadline {
            match a.process(|t: Task| async move { t.attempt() >= 1 }).await {
                Ok(Some(Processed::Completed(_))) | Ok(None) | Err(_) => {}
                Ok(other) => panic!("{other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let st = q.stats("w").await.unwrap();
        assert_eq!((st.completed, st.ready, st.running, st.stuck), (2, 0, 0, 0), "{st:?}");
        let attempts: Vec<i64> =
            q.tasks(doc! {}, None).await.unwrap().iter().map(|r| r.data().get_i64("attempts").unwrap()).collect();
        assert!(attempts.iter().any(|&n| n >= 2), "the task whose completion failed ran again: {attempts:?}");
    }
}
