//! Integration tests of the agents: one behavioural suite on the in-memory store
//! (paused time, with and without change notifications) and on a real server,
//! and a deterministic simulation with crashes, partitions and faults.
#![allow(clippy::unwrap_used, missing_docs)]

mod dedupe;
mod events;
mod fencing;
mod group_sources;
mod groups;
mod hold_back;
mod input;
mod limits;
mod mechanisms;
mod mongo_agent_spec;
#[cfg(feature = "otel")]
mod otel;
mod outbox;
mod overlap_change;
mod reserved;
mod review_debounce;
mod review_dedupe;
mod review_group_runs;
mod review_groups;
mod review_groups3;
mod review_groups4;
mod review_groups5;
mod review_groups6;
mod review_groups7;
mod review_idle;
mod review_otel;
#[cfg(feature = "otel")]
mod review_otel2;
mod review_refactor;
mod review_retain;
mod review_skip;
mod review_timeouts;
mod schedule_support;
mod schedules;
mod simulation;
mod skip_check;
mod subscriber;
mod suite;
mod timeouts;
mod wait;

store_test::on_all_backends!(crate::suite::agent_suite, std::time::Duration::from_secs(2));

mod schedule_backends {
    //! The schedule suite on every backend (on the real server, a one-second interval).
    store_test::on_all_backends!(crate::schedules::schedule_suite, std::time::Duration::from_secs(2));
}

mod reserved_backends {
    //! User data against the reserved fields, on every backend.
    store_test::on_all_backends!(crate::reserved::reserved_suite, std::time::Duration::from_secs(2));
}

mod mongo_agent_spec_backends {
    //! The Ruby `mongo_agent` gem's spec, ported one example to one test, on every backend.
    store_test::on_all_backends!(crate::mongo_agent_spec::mongo_agent_spec_suite, std::time::Duration::from_secs(2));
}

mod timeout_backends {
    //! Execution timeouts on every backend.
    store_test::on_all_backends!(crate::timeouts::timeouts_suite, std::time::Duration::from_secs(2));
}

mod wait_backends {
    //! Waiting for a task to end, on every backend.
    store_test::on_all_backends!(crate::wait::wait_suite, std::time::Duration::from_secs(2));
}

mod group_backends {
    //! Groups: a cap per group, enqueue order, repair, on every backend.
    store_test::on_all_backends!(crate::groups::groups_suite, std::time::Duration::from_secs(2));
}

mod group_sources_backends {
    //! Groups for fan-in tasks and schedules' ticks, and chains of waits, on every backend.
    store_test::on_all_backends!(crate::group_sources::group_sources_suite, std::time::Duration::from_secs(2));
}

mod dedupe_backends {
    //! Dedupe scopes on every backend.
    store_test::on_all_backends!(crate::dedupe::dedupe_suite, std::time::Duration::from_secs(2));
}

mod review_debounce_backends {
    //! Review of debounce (#33): the README's example run, batches, fan-in
    //! tasks with a scope, odd keys and data, on every backend.
    store_test::on_all_backends!(crate::review_debounce::review_debounce_suite, std::time::Duration::from_secs(2));
}

mod review_dedupe_backends {
    //! Review of dedupe scopes and waiting (#33), on every backend.
    store_test::on_all_backends!(crate::review_dedupe::review_dedupe_suite, std::time::Duration::from_secs(2));
}

mod review_groups_backends {
    //! Review of groups (#33): the cap, the order and nothing lost under
    //! operators, races, crashes and odd data, on every backend.
    store_test::on_all_backends!(crate::review_groups::review_groups_suite, std::time::Duration::from_secs(2));
}

mod review_group_runs_backends {
    //! Second review of groups (#33): runs that go on after their task
    //! changed under them, and inserts that land late, on every backend.
    store_test::on_all_backends!(crate::review_group_runs::review_group_runs_suite, std::time::Duration::from_secs(2));
}

mod review_groups3_backends {
    //! Third review of groups (#33): ids used again in their own group,
    //! handlers in a timeout's grace whose claim is lost, silent nudges,
    //! foreign slot data, on every backend.
    store_test::on_all_backends!(crate::review_groups3::review_groups3_suite, std::time::Duration::from_secs(2));
}

mod review_groups4_backends {
    //! Fourth review of groups (#33): the slot's version, the announce and
    //! landed counters, ids used again, the sweep's deferral, on every backend.
    store_test::on_all_backends!(crate::review_groups4::review_groups4_suite, std::time::Duration::from_secs(2));
}

mod review_groups5_backends {
    //! Fifth review of groups: grouped follow-ups under stale runs and
    //! failed activations, a reused id beside its deleted run, on every backend.
    store_test::on_all_backends!(crate::review_groups5::review_groups5_suite, std::time::Duration::from_secs(2));
}

mod review_groups6_backends {
    //! Sixth review of groups: debounced, prepared and follow-up tasks in
    //! groups, on every backend.
    store_test::on_all_backends!(crate::review_groups6::review_groups6_suite, std::time::Duration::from_secs(2));
}

mod review_groups7_backends {
    //! Seventh review of groups: grouped fan-in tasks, chains, grouped ticks.
    store_test::on_all_backends!(crate::review_groups7::review_groups7_suite, std::time::Duration::from_secs(2));
}

mod event_backends {
    //! The event stream suite on every backend.
    store_test::on_all_backends!(crate::events::events_suite, std::time::Duration::from_secs(2));
}

mod faults {
    //! `configureFailPoint` against the real server: a dropped connection on the
    //! claim, an error on the completion. Nothing is lost; nothing applied twice.

    use std::time::Duration;

    use bson::doc;
    use mongoagent::{Agent, NewTask, Outcome, Processed, Queue, Task};
    use store_trait::{Collection, Key, Store};

    async fn fail_point(admin: &store_mongo::mongodb::Client, data: bson::Document, times: i32) {
        admin
            .database("admin")
            .run_command(doc! { "configureFailPoint": "failCommand", "mode": { "times": times }, "data": data })
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mongo_faults_lose_nothing() {
        let Some(store) = store_test::mongo::test_store_as("ag_failpoints", "agfp").await else { return };
        let Some(admin) = store_test::mongo::admin_client("ag_failpoints").await else { return };
        let q = Queue::new(store.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("t1")).await.unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("t2")).await.unwrap();
        let a = Agent::builder(store.clone(), "w", "tasks").ttl(Duration::from_secs(2)).build().unwrap();

        // The claim's connection drops: the driver retries once by itself, or the
        // agent reports a transient error; either way the task is not lost.
        fail_point(&admin, doc! { "failCommands": ["findAndModify"], "closeConnection": true, "appName": "agfp" }, 1)
            .await;
        let first = a.process(|_t: Task| async { true }).await;
        if let Err(e) = &first {
            assert!(e.to_string().contains("transient") || e.to_string().contains("connection"), "{e}");
        }

        // The completion (a group commit: an `update` command) fails with an
        // error the driver does not retry: the outcome is not recorded, the claim lapses, and the task runs again.
        admin
            .database("admin")
            .run_command(doc! { "configureFailPoint": "failCommand", "mode": { "times": 1 },
            "data": { "failCommands": ["update"], "errorCode": 2, "appName": "agfp" } })
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
        assert_eq!((st.completed, st.ready, st.running, st.lapsed), (2, 0, 0, 0), "{st:?}");
        let attempts: Vec<i64> =
            q.tasks(doc! {}, None).await.unwrap().iter().map(|r| r.data().get_i64("attempts").unwrap()).collect();
        assert!(attempts.iter().any(|&n| n >= 2), "the task whose completion failed ran again: {attempts:?}");
    }

    /// The last follow-up's outcome is written, then the server fails the count
    /// that would wake the waiting task: the follow-up is not run again, and the
    /// next agent to claim it (once its claim is given back) wakes the waiter.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mongo_fan_in_survives_a_failed_wake_up() {
        let Some(store) = store_test::mongo::test_store_as("ag_failpoint_fan_in", "agfpf").await else { return };
        let Some(admin) = store_test::mongo::admin_client("ag_failpoint_fan_in").await else { return };
        let q = Queue::new(store.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("split", doc! {}).id("job")).await.unwrap();
        let split = Agent::builder(store.clone(), "split", "tasks").build().unwrap();
        let part = Agent::builder(store.clone(), "part", "tasks").ttl(Duration::from_secs(2)).build().unwrap();
        let split_job = |t: Task| async move {
            match t.round() {
                0 => Outcome::done().follow_up(NewTask::new("part", doc! {})).wait_for_follow_ups(),
                _ => Outcome::done_with(doc! {"children": t.children().len() as i64}),
            }
        };
        assert_eq!(split.process(split_job).await.unwrap(), Some(Processed::Waiting(Key::new("job").unwrap())));
        fail_point(&admin, doc! { "failCommands": ["aggregate"], "errorCode": 2, "appName": "agfpf" }, 1).await;
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let count_runs = {
            let runs = runs.clone();
            move |_t: Task| {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { true }
            }
        };
        let failed = part.process(count_runs.clone()).await;
        assert!(failed.is_err(), "the wake-up count hit the failpoint: {failed:?}");
        let d = store.get(&Collection::new("tasks").unwrap(), &Key::new("job/0").unwrap()).await.unwrap();
        let d = d.record.unwrap().into_data();
        assert_eq!((d.get_bool("complete").unwrap(), d.get_bool("claimed").unwrap()), (true, true), "{d}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let recovered = loop {
            match part.process(count_runs.clone()).await.unwrap() {
                Some(p) => break p,
                None if std::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
                None => panic!("the follow-up's claim was never given back"),
            }
        };
        assert_eq!(recovered, Processed::Recovered(Key::new("job/0").unwrap()));
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1, "the follow-up's handler ran once");
        assert_eq!(split.process(split_job).await.unwrap(), Some(Processed::Completed(Key::new("job").unwrap())));
        let job = store.get(&Collection::new("tasks").unwrap(), &Key::new("job").unwrap()).await.unwrap();
        assert_eq!(job.record.unwrap().data().get_i64("children").unwrap(), 1);
    }
}
