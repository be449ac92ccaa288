//! Agent behaviour every backend must show.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson};
use mongoagent::{Agent, AgentError, NewTask, Outcome, Processed, Queue, Task};
use store_test::Harness;
use store_trait::{Claim, Collection, Condition, Key, Mutation, Query, Store, Ttl, Write};

const WAIT: Duration = Duration::from_secs(60);

fn coll() -> Collection {
    Collection::new("tasks").unwrap()
}

async fn get<S: Store>(s: &S, id: &Key) -> bson::Document {
    s.get(&coll(), id).await.unwrap().record.unwrap().into_data()
}

fn agent<S: Store + Clone>(s: &S, name: &str) -> mongoagent::AgentBuilder<S> {
    Agent::builder(s.clone(), name, "tasks")
        .backoff(Duration::from_millis(100), Duration::from_millis(400))
        .ttl(Duration::from_secs(4))
}

fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

/// The `count` stage of the fan-in tests: part 1 fails for good, the others
/// report `n = part * 10`.
async fn count_part(t: Task) -> Outcome {
    match t.data().get_i64("part").unwrap() {
        1 => Outcome::failed_permanently("bad part"),
        p => Outcome::done_with(doc! {"n": p * 10}),
    }
}

/// The `split` stage: waits on three parts, then on one more, then sums.
async fn split_job(t: Task) -> Outcome {
    let ids: Vec<String> = t.children().iter().map(|c| c.id().to_string()).collect();
    match t.round() {
        0 => {
            assert!(ids.is_empty());
            (0..3_i64)
                .fold(Outcome::done(), |o, p| o.follow_up(NewTask::new("count", doc! {"part": p})))
                .merge(doc! {"phase": "split"})
                .wait_for_follow_ups()
        }
        1 => {
            assert_eq!(ids, ["job/0", "job/1", "job/2"]);
            let failed: Vec<_> = t.children().iter().filter_map(|c| c.error()).collect();
            assert_eq!(failed, ["bad part"]);
            let sum: i64 = t.children().iter().filter_map(|c| c.data().get_i64("n").ok()).sum();
            Outcome::done()
                .follow_up(NewTask::new("count", doc! {"part": 5_i64}))
                .merge(doc! {"sum": sum})
                .wait_for_follow_ups()
        }
        2 => {
            assert_eq!(ids, ["job@1/0"], "only the last round's follow-ups");
            let extra = t.children()[0].data().get_i64("n").unwrap();
            Outcome::done_with(doc! {"total": t.data().get_i64("sum").unwrap() + extra})
        }
        r => panic!("round {r}"),
    }
}

/// The claim a crashed agent leaves on `id`: held by a dead owner until it
/// lapses, with `changes` applied.
async fn dead_claim<S: Store>(s: &S, id: &str, changes: Mutation) {
    let dead = Claim {
        query: Query::eq(doc! {"_id": id}),
        mutation: changes
            .grant("dead-agent", Ttl::new(Duration::from_millis(1500)).unwrap())
            .bump_fence()
            .set("ready", false)
            .set("claimed", true),
    };
    assert!(s.claim(&coll(), &dead).await.unwrap().is_some());
}

/// A TTL pass after a while: what the server's TTL monitor does about once a minute.
async fn ttl_pass<H: Harness>(h: &H, s: &H::Store) {
    tokio::time::sleep(Duration::from_millis(30)).await;
    h.prune_ttl(s).await;
}

async fn exists<S: Store>(s: &S, id: &str) -> bool {
    s.get(&coll(), &key(id)).await.unwrap().record.is_some()
}

/// The suite (`agent_suite`): each `pub(crate) async fn` over a `Harness` here
/// is one test on every backend, registered by being written.
#[store_test::suite(agent_suite, crate::suite::cases)]
pub(crate) mod cases {
    use super::*;

    pub(crate) async fn seed_shaped_tasks_are_processed<H: Harness>(h: &H) {
        let s = h.store("ag_seed_shape").await;
        let (ok, bad) = (bson::oid::ObjectId::new(), bson::oid::ObjectId::new());
        // Written by a producer of the original mongo_agent: no priority, no store metadata.
        s.insert_many(
            &coll(),
            vec![
                doc! {"_id": ok, "agent_name": "convert", "ready": true, "file": "a"},
                doc! {"_id": bad, "agent_name": "convert", "ready": true, "file": "b"},
            ],
        )
        .await
        .unwrap();
        // The default attempt limit: a handler's `false` fails the task for good at
        // once, as the original's did (no retry).
        let a = agent(&s, "convert").build().unwrap();
        let handler = |t: Task| async move { t.data().get_str("file").unwrap() == "a" };
        assert_eq!(
            a.process(handler).await.unwrap(),
            Some(Processed::Completed(Key::from_bson(Bson::ObjectId(ok)).unwrap()))
        );
        assert_eq!(
            a.process(handler).await.unwrap(),
            Some(Processed::Failed(Key::from_bson(Bson::ObjectId(bad)).unwrap()))
        );
        assert_eq!(a.process(handler).await.unwrap(), None);
        let d = get(&s, &Key::from_bson(Bson::ObjectId(ok)).unwrap()).await;
        assert_eq!(
            (d.get_bool("ready").unwrap(), d.get_bool("complete").unwrap(), d.get_bool("error_encountered").unwrap()),
            (false, true, false)
        );
        assert!(d.get_datetime("started_at").is_ok() && d.get_datetime("completed_at").is_ok());
        assert_eq!(d.get_str("agent_host").unwrap(), mongolock::Identity::current().host());
        let d = get(&s, &Key::from_bson(Bson::ObjectId(bad)).unwrap()).await;
        assert_eq!((d.get_bool("complete").unwrap(), d.get_bool("error_encountered").unwrap()), (true, true));
        assert_eq!(d.get_str("last_error").unwrap(), "the handler reported failure");
        let log = a.counters();
        assert_eq!((log.tasks_processed, log.failed_tasks), (2, 1));
    }

    pub(crate) async fn claims_follow_priority_then_time<H: Harness>(h: &H) {
        let s = h.store("ag_order").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        for (id, p) in [("low-1", 0), ("high-1", 9), ("low-2", 0), ("mid", 5), ("high-2", 9)] {
            q.enqueue(NewTask::new("w", doc! {}).id(id).priority(p)).await.unwrap();
        }
        let a = agent(&s, "w").build().unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..5 {
            let o = order.clone();
            a.process(move |t: Task| {
                let o = o.clone();
                async move {
                    o.lock().unwrap().push(t.id().to_string());
                    true
                }
            })
            .await
            .unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["high-1", "high-2", "mid", "low-1", "low-2"]);
    }

    pub(crate) async fn get_tasks_lists_ready_tasks<H: Harness>(h: &H) {
        let s = h.store("ag_get_tasks").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! {"n": 1}).id("a")).await.unwrap();
        q.enqueue(NewTask::new("w", doc! {"n": 2}).id("b")).await.unwrap();
        q.enqueue(NewTask::new("other", doc! {}).id("c")).await.unwrap();
        let a = agent(&s, "w").build().unwrap();
        assert_eq!(a.get_tasks(None).await.unwrap().len(), 2);
        a.process(|_t: Task| async { true }).await.unwrap();
        assert_eq!(a.get_tasks(None).await.unwrap().len(), 1);
        assert_eq!(a.get_tasks(Some(doc! {"n": 1})).await.unwrap().len(), 1);
        assert_eq!(a.get_tasks(Some(doc! {"complete": true})).await.unwrap().len(), 1);
    }

    pub(crate) async fn retries_then_fails_for_good<H: Harness>(h: &H) {
        let s = h.store("ag_retries").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
        let a = agent(&s, "w")
            .max_attempts(3)
            .poll_interval(Duration::from_millis(200))
            .process_while(|log| log.tasks_processed < 3)
            .build()
            .unwrap();
        let log = tokio::time::timeout(
            WAIT,
            a.work(|t: Task| async move { Outcome::failed(format!("boom {}", t.attempt())) }),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!((log.tasks_processed, log.retried, log.failed_permanently), (3, 2, 1));
        let d = get(&s, &id).await;
        assert_eq!((d.get_bool("complete").unwrap(), d.get_bool("error_encountered").unwrap()), (true, true));
        assert_eq!(d.get_str("last_error").unwrap(), "boom 3");
        assert_eq!(d.get_i64("attempts").unwrap(), 3);
        assert!(
            a.process(|_t: Task| async { true }).await.unwrap().is_none(),
            "a task failed for good is not claimed again"
        );
    }

    pub(crate) async fn handler_outcomes<H: Harness>(h: &H) {
        let s = h.store("ag_outcomes").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        for id in ["perm", "later", "typed-bad", "merge-bad", "panics", "merge-ok"] {
            q.enqueue(NewTask::new("w", doc! {"kind": id}).id(id)).await.unwrap();
        }
        #[derive(serde::Deserialize)]
        #[allow(dead_code)]
        struct Typed {
            kind: String,
            size: u64,
        }
        // A backoff far longer than the test: the panicking task is not due again
        // before the last claim, however slow the server.
        let a = agent(&s, "w").backoff(Duration::from_secs(60), Duration::from_secs(120)).build().unwrap();
        let mut results = HashMap::new();
        for _ in 0..6 {
            let r = a
                .process(|t: Task| async move {
                    match t.data().get_str("kind").unwrap() {
                        "perm" => Outcome::failed_permanently("no way"),
                        "later" => Outcome::retry_after("busy", Duration::from_secs(3600)),
                        "typed-bad" => t.parse::<Typed>().map(|_| Outcome::done()).into(),
                        "merge-bad" => Outcome::done_with(doc! {"complete": false}),
                        "panics" => panic!("handler bug"),
                        _ => Outcome::done_with(doc! {"result": 42}),
                    }
                })
                .await
                .unwrap()
                .unwrap();
            let (Processed::Completed(k) | Processed::Failed(k) | Processed::Retried(k) | Processed::Stale(k)) = &r
            else {
                unreachable!()
            };
            results.insert(k.to_string(), r);
        }
        assert!(matches!(results["perm"], Processed::Failed(_)));
        assert!(matches!(results["later"], Processed::Retried(_)));
        assert!(
            matches!(results["typed-bad"], Processed::Failed(_)),
            "a malformed task is failed for good, not retried forever"
        );
        assert!(get(&s, &Key::new("typed-bad").unwrap())
            .await
            .get_str("last_error")
            .unwrap()
            .contains("cannot be read"));
        assert!(matches!(results["merge-bad"], Processed::Failed(_)));
        assert!(matches!(results["panics"], Processed::Retried(_)));
        assert!(get(&s, &Key::new("panics").unwrap()).await.get_str("last_error").unwrap().contains("panicked"));
        assert!(matches!(results["merge-ok"], Processed::Completed(_)));
        assert_eq!(get(&s, &Key::new("merge-ok").unwrap()).await.get_i32("result").unwrap(), 42);
        let extra = a.process(|_t: Task| async { true }).await.unwrap();
        assert!(extra.is_none(), "the retry waits an hour; the panicking task waits its backoff: {extra:?}");
    }

    pub(crate) async fn dedupe_keys_yield_one_task<H: Harness>(h: &H) {
        let s = h.store("ag_dedupe").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (_, new1) =
            q.enqueue(NewTask::new("w", doc! {"v": 1}).id("d1").dedupe_key("report-2026-11-30")).await.unwrap();
        let (_, new2) = q.enqueue(NewTask::new("w", doc! {"v": 2}).dedupe_key("report-2026-11-30")).await.unwrap();
        assert!(new1 && !new2);
        let (_, again) = q.enqueue(NewTask::new("w", doc! {"v": 3}).id("d1")).await.unwrap();
        assert!(!again, "same id: duplicate");
        assert_eq!(get(&s, &Key::new("d1").unwrap()).await.get_i32("v").unwrap(), 1, "the first one stays");
        assert_eq!(s.count(&coll(), &Query::eq(doc! {"dedupe_key": "report-2026-11-30"})).await.unwrap(), 1);
    }

    pub(crate) async fn delayed_tasks_wait<H: Harness>(h: &H) {
        let s = h.store("ag_delayed").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(NewTask::new("w", doc! {}).delay(Duration::from_millis(1500))).await.unwrap();
        let a = agent(&s, "w")
            .poll_interval(Duration::from_secs(3600))
            .process_while(|l| l.tasks_processed < 1)
            .build()
            .unwrap();
        // Not before run_at, judged on the store clock: a server slower than the
        // delay may be past it already.
        if a.process(|_t: Task| async { true }).await.unwrap().is_some() {
            let d = get(&s, &id).await;
            let (run_at, started) = (d.get_datetime("run_at").unwrap(), d.get_datetime("started_at").unwrap());
            assert!(started >= run_at, "claimed at {started}, before its run_at {run_at}");
            return;
        }
        // An idle agent sleeps until the task is due, even with a one-hour poll interval.
        let log = tokio::time::timeout(WAIT, a.work(|_t: Task| async { true })).await.expect("woken when due").unwrap();
        assert_eq!(log.completed, 1);
    }

    pub(crate) async fn crashed_claims_are_recovered_and_stale_outcomes_rejected<H: Harness>(h: &H) {
        let s = h.store("ag_crash").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
        // Another agent claims it and dies: its lease stays until it lapses.
        let dead = Claim {
            query: Query::eq(doc! {"agent_name": "w", "ready": true}),
            mutation: Mutation::new()
                .grant("dead-agent", Ttl::new(Duration::from_millis(1500)).unwrap())
                .bump_fence()
                .set("ready", false)
                .set("claimed", true),
        };
        let claimed = s.claim(&coll(), &dead).await.unwrap().unwrap();
        let a = agent(&s, "w")
            .poll_interval(Duration::from_secs(3600))
            .process_while(|l| l.tasks_processed < 1)
            .build()
            .unwrap();
        // A live claim is not taken, judged on the store clock: a server slower than
        // the dead claim's lease may be past it already.
        let handler = |t: Task| async move { t.attempt() == 2 };
        if a.process(handler).await.unwrap().is_some() {
            let started = get(&s, &id).await.get_datetime("started_at").unwrap().timestamp_millis();
            let until = claimed.lease().unwrap().until.as_millis();
            assert!(started >= until, "a live claim was taken: at {started}, held until {until}");
        } else {
            let log = tokio::time::timeout(WAIT, a.work(handler)).await.expect("recovered at lease expiry").unwrap();
            assert_eq!(log.completed, 1);
        }
        assert_eq!(get(&s, &id).await.get_bool("error_encountered").ok(), Some(false), "the second attempt completed");
        // The dead agent's late completion, fenced by its claim's fence, is rejected.
        let late = Write::new(
            Condition::OwnedBy("dead-agent".into()).and(Condition::FenceIs(claimed.fence())),
            Mutation::new().release().set("complete", true).set("error_encountered", true),
        );
        assert!(!s.write(&coll(), &id, &late).await.unwrap().is_applied());
        assert!(!get(&s, &id).await.get_bool("error_encountered").unwrap());
    }

    pub(crate) async fn idle_agent_is_woken_by_a_new_task<H: Harness>(h: &H) {
        let s = h.store("ag_push").await;
        let sleep = if h.change_streams_expected() { Duration::from_secs(3600) } else { Duration::from_millis(200) };
        let a = agent(&s, "w").poll_interval(sleep).process_while(|l| l.tasks_processed < 1).build().unwrap();
        let worker = tokio::spawn({
            let a = a.clone();
            async move { a.work(|_t: Task| async { true }).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        Queue::new(s.clone(), "tasks").unwrap().enqueue(NewTask::new("w", doc! {})).await.unwrap();
        let log = tokio::time::timeout(WAIT, worker).await.expect("the idle agent was woken").unwrap().unwrap();
        assert_eq!(log.completed, 1);
    }

    pub(crate) async fn many_agents_process_each_task_once<H: Harness>(h: &H) {
        let s = h.store("ag_many").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let n: u64 = 60;
        let tasks: Vec<_> = (0..n).map(|i| NewTask::new("w", doc! {"i": i as i64}).id(format!("t{i:03}"))).collect();
        q.enqueue_all(&tasks).await.unwrap();
        let seen = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
        let agents: Vec<_> = (0..4)
            .map(|_| agent(&s, "w").concurrency(3).poll_interval(Duration::from_millis(100)).build().unwrap())
            .collect();
        let workers: Vec<_> = agents
            .iter()
            .map(|a| {
                let (a, seen) = (a.clone(), seen.clone());
                tokio::spawn(async move {
                    a.work(move |t: Task| {
                        let seen = seen.clone();
                        async move {
                            *seen.lock().unwrap().entry(t.id().to_string()).or_default() += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            Outcome::done().follow_up(NewTask::new("next", doc! {}))
                        }
                    })
                    .await
                })
            })
            .collect();
        tokio::time::timeout(WAIT, async {
            while q.stats("w").await.unwrap().completed < n {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("all tasks completed");
        for a in &agents {
            a.shutdown();
        }
        let mut completed = 0;
        for w in workers {
            completed += tokio::time::timeout(WAIT, w).await.unwrap().unwrap().unwrap().completed;
        }
        assert_eq!(completed, n, "each task completed once");
        assert!(seen.lock().unwrap().values().all(|&c| c == 1), "no task ran twice");
        assert_eq!(seen.lock().unwrap().len(), n as usize);
        assert_eq!(q.stats("next").await.unwrap().ready, n, "one follow-up per task");
    }

    pub(crate) async fn drain_gives_claims_back<H: Harness>(h: &H) {
        let s = h.store("ag_drain").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue_all(&[
            NewTask::new("w", doc! {"slow": false}).id("fast"),
            NewTask::new("w", doc! {"slow": true}).id("slow"),
        ])
        .await
        .unwrap();
        // Stopped through the application's own token (a signal handler's, say).
        let stop = tokio_util::sync::CancellationToken::new();
        let a =
            agent(&s, "w").concurrency(2).drain_timeout(Duration::from_millis(300)).shutdown_on(&stop).build().unwrap();
        let worker = tokio::spawn({
            let a = a.clone();
            async move {
                a.work(|t: Task| async move {
                    if t.data().get_bool("slow").unwrap() {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    true
                })
                .await
            }
        });
        tokio::time::timeout(WAIT, async {
            while q.stats("w").await.unwrap().completed < 1 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap();
        stop.cancel();
        let log = tokio::time::timeout(WAIT, worker).await.unwrap().unwrap().unwrap();
        assert_eq!(log.completed, 1);
        // The slow task was given back: claimable at once by another agent.
        let b = agent(&s, "w").build().unwrap();
        let got = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(p) = b.process(|_t: Task| async { true }).await.unwrap() {
                    return p;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap();
        assert_eq!(got, Processed::Completed(Key::new("slow").unwrap()));
    }

    pub(crate) async fn bad_input_is_rejected<H: Harness>(h: &H) {
        let s = h.store("ag_bad_input").await;
        let cfg = |r: Result<Agent<H::Store>, AgentError>| assert!(matches!(r, Err(AgentError::Config(_))), "{r:?}");
        cfg(Agent::builder(s.clone(), "", "tasks").build());
        cfg(Agent::builder(s.clone(), "w", "").build());
        cfg(Agent::builder(s.clone(), "w", "tasks").concurrency(0).build());
        cfg(Agent::builder(s.clone(), "w", "tasks").prefetch(1001).build());
        // The default prefetch follows a large concurrency only up to its bound.
        assert!(Agent::builder(s.clone(), "w", "tasks").concurrency(5000).build().is_ok());
        cfg(Agent::builder(s.clone(), "w", "tasks").max_attempts(0).build());
        cfg(Agent::builder(s.clone(), "w", "tasks").ttl(Duration::ZERO).build());
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let invalid =
            |r: Result<(Key, bool), AgentError>| assert!(matches!(r, Err(AgentError::InvalidTask(_))), "{r:?}");
        invalid(q.enqueue(NewTask::new("", doc! {})).await);
        let reserved = q.enqueue(NewTask::new("w", doc! {"ready": false})).await;
        assert!(matches!(&reserved, Err(AgentError::ReservedField { field }) if field == "ready"), "{reserved:?}");
        q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
        let reserved = q.enqueue(NewTask::new("w", doc! {"lease_owner": "x"})).await;
        assert!(
            matches!(&reserved, Err(AgentError::ReservedField { field }) if field == "lease_owner"),
            "{reserved:?}"
        );
        // A document in the queue without an agent_name is never claimed and blocks nothing.
        s.insert_many(&coll(), vec![doc! {"_id": "orphan", "ready": true}]).await.unwrap();
        let a = agent(&s, "w").build().unwrap();
        assert!(a.process(|_t: Task| async { true }).await.unwrap().is_some());
        assert!(a.process(|_t: Task| async { true }).await.unwrap().is_none());
    }

    pub(crate) async fn queue_stats<H: Harness>(h: &H) {
        let s = h.store("ag_stats").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue_all(&[
            NewTask::new("w", doc! {}).id("r1"),
            NewTask::new("w", doc! {}).id("r2"),
            NewTask::new("w", doc! {}).id("d1").delay(Duration::from_secs(3600)),
            NewTask::new("w", doc! {"fail": true}).id("f1").priority(9),
        ])
        .await
        .unwrap();
        let a = agent(&s, "w").max_attempts(1).build().unwrap();
        a.process(|t: Task| async move { !t.data().get_bool("fail").unwrap_or(false) }).await.unwrap();
        a.process(|_t: Task| async { true }).await.unwrap();
        let st = q.stats("w").await.unwrap();
        assert_eq!((st.ready, st.delayed, st.running, st.lapsed, st.completed, st.failed), (1, 1, 0, 0, 1, 1));
        let requeued = q.requeue(doc! {"agent_name": "w"}).dry_run(true).await.unwrap();
        assert_eq!(requeued, [Key::new("f1").unwrap()]);
        assert_eq!(q.stats("w").await.unwrap().failed, 1, "dry run changes nothing");
        q.requeue(doc! {"agent_name": "w"}).await.unwrap();
        assert_eq!(q.stats("w").await.unwrap().ready, 2);
    }

    pub(crate) async fn fan_in_resumes_the_waiting_task<H: Harness>(h: &H) {
        let s = h.store("ag_fan_in").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("split", doc! {}).id("job")).await.unwrap();
        let split = agent(&s, "split").build().unwrap();
        let count = agent(&s, "count").build().unwrap();
        assert_eq!(split.process(split_job).await.unwrap(), Some(Processed::Waiting(key("job"))));
        let d = get(&s, &key("job")).await;
        assert_eq!((d.get_i64("waiting").unwrap(), d.get_bool("ready").unwrap()), (0, false), "{d}");
        assert_eq!((d.get_str("phase").unwrap(), d.get_bool("complete").ok()), ("split", None));
        assert!(d.get("lease_owner").is_none_or(|o| o == &Bson::Null), "the claim is let go while waiting: {d}");
        assert_eq!(q.stats("split").await.unwrap().waiting, 1);
        assert_eq!(split.counters().waiting, 1);

        assert!(matches!(count.process(count_part).await.unwrap(), Some(Processed::Completed(_))));
        assert!(matches!(count.process(count_part).await.unwrap(), Some(Processed::Failed(_))));
        assert!(split.process(split_job).await.unwrap().is_none(), "not ready while a follow-up is open");
        assert!(matches!(count.process(count_part).await.unwrap(), Some(Processed::Completed(_))));
        let d = get(&s, &key("job")).await;
        assert_eq!((d.get_bool("ready").unwrap(), d.get_i64("round").unwrap(), d.get("waiting")), (true, 1, None));

        // Round 1 waits again, on one more follow-up; round 2 finishes.
        assert_eq!(split.process(split_job).await.unwrap(), Some(Processed::Waiting(key("job"))));
        assert_eq!(get(&s, &key("job")).await.get_i64("sum").unwrap(), 20);
        assert!(split.process(split_job).await.unwrap().is_none());
        assert_eq!(count.process(count_part).await.unwrap(), Some(Processed::Completed(key("job@1/0"))));
        assert_eq!(split.process(split_job).await.unwrap(), Some(Processed::Completed(key("job"))));
        let d = get(&s, &key("job")).await;
        assert_eq!(
            (d.get_i64("total").unwrap(), d.get_i64("round").unwrap(), d.get_bool("complete").unwrap()),
            (70, 2, true)
        );
        assert_eq!(q.stats("split").await.unwrap().waiting, 0);
        assert!(
            split.process(split_job).await.unwrap().is_none() && count.process(count_part).await.unwrap().is_none()
        );

        // A retried handler whose follow-ups (from its first run, whose outcome was
        // lost) have all ended already: nothing is left to wake it, so it wakes itself.
        s.insert_many(
            &coll(),
            vec![
                doc! {"_id": "early", "agent_name": "split", "ready": true},
                doc! {"_id": "early/0", "agent_name": "count", "ready": false, "complete": true,
                "error_encountered": false, "parent": "early", "join": "early", "join_round": 0_i64},
            ],
        )
        .await
        .unwrap();
        let once = |t: Task| async move {
            match t.round() {
                0 => Outcome::done().follow_up(NewTask::new("count", doc! {"part": 0_i64})).wait_for_follow_ups(),
                _ => Outcome::done(),
            }
        };
        assert_eq!(split.process(once).await.unwrap(), Some(Processed::Waiting(key("early"))));
        assert_eq!(split.process(once).await.unwrap(), Some(Processed::Completed(key("early"))), "woken at once");

        // A handler that waits for nothing would wait forever: failed for good.
        q.enqueue(NewTask::new("split", doc! {}).id("empty")).await.unwrap();
        let none = |_t: Task| async { Outcome::done().wait_for_follow_ups() };
        assert_eq!(split.process(none).await.unwrap(), Some(Processed::Failed(key("empty"))));
    }

    pub(crate) async fn fan_in_task_runs_after_every_follow_up<H: Harness>(h: &H) {
        let s = h.store("ag_fan_in_then").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        // `outer` waits for `inner`; `inner` fans out to two parts and a `sum` task.
        // The wait on `inner` extends to its `sum` task.
        q.enqueue(NewTask::new("outer", doc! {}).id("outer")).await.unwrap();
        let outer = agent(&s, "outer").build().unwrap();
        let inner = agent(&s, "inner").build().unwrap();
        let count = agent(&s, "count").build().unwrap();
        let sum = agent(&s, "sum").build().unwrap();
        let outer_job = |t: Task| async move {
            if t.round() == 0 {
                return Outcome::done().follow_up(NewTask::new("inner", doc! {})).wait_for_follow_ups();
            }
            let ids: Vec<_> = t.children().iter().map(|c| c.id().to_string()).collect();
            assert_eq!(ids, ["outer/0", "outer/0/then"], "the wait on inner extended to its fan-in task");
            Outcome::done()
        };
        let inner_job = |_t: Task| async {
            Outcome::done()
                .follow_up(NewTask::new("count", doc! {"part": 2_i64}))
                .follow_up(NewTask::new("count", doc! {"part": 3_i64}))
                .then(NewTask::new("sum", doc! {"label": "total"}).dedupe_key("ignored").id("ignored"))
        };
        let sum_job = |t: Task| async move {
            assert_eq!(t.round(), 1);
            let ids: Vec<_> = t.children().iter().map(|c| c.id().to_string()).collect();
            assert_eq!(ids, ["outer/0/0", "outer/0/1"]);
            let n: i64 = t.children().iter().map(|c| c.data().get_i64("n").unwrap()).sum();
            Outcome::done_with(doc! {"sum": n})
        };
        assert_eq!(outer.process(outer_job).await.unwrap(), Some(Processed::Waiting(key("outer"))));
        assert_eq!(inner.process(inner_job).await.unwrap(), Some(Processed::Completed(key("outer/0"))));
        let then = get(&s, &key("outer/0/then")).await;
        assert_eq!((then.get_bool("ready").unwrap(), then.get_i64("waiting").unwrap()), (false, 0), "{then}");
        assert_eq!(then.get_str("join").unwrap(), "outer", "the wait on inner extends to its fan-in task");
        assert!(sum.process(sum_job).await.unwrap().is_none(), "not before the parts end");
        assert!(outer.process(outer_job).await.unwrap().is_none(), "outer waits for the fan-in task too");
        count.process(count_part).await.unwrap();
        assert!(sum.process(sum_job).await.unwrap().is_none(), "one part still open");
        count.process(count_part).await.unwrap();
        assert!(outer.process(outer_job).await.unwrap().is_none());
        assert_eq!(sum.process(sum_job).await.unwrap(), Some(Processed::Completed(key("outer/0/then"))));
        assert_eq!(get(&s, &key("outer/0/then")).await.get_i64("sum").unwrap(), 50);
        assert_eq!(outer.process(outer_job).await.unwrap(), Some(Processed::Completed(key("outer"))));
        assert_eq!(s.count(&coll(), &Query::all()).await.unwrap(), 5, "no duplicate tasks");
    }

    pub(crate) async fn fan_in_recovers_from_a_crash_mid_step<H: Harness>(h: &H) {
        let s = h.store("ag_fan_in_crash").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("split", doc! {}).id("job")).await.unwrap();
        let split = agent(&s, "split").poll_interval(Duration::from_secs(3600)).build().unwrap();
        let count = agent(&s, "count").poll_interval(Duration::from_secs(3600)).build().unwrap();
        split.process(split_job).await.unwrap();
        count.process(count_part).await.unwrap();
        count.process(count_part).await.unwrap();
        // The agent of the last part recorded its outcome and died before telling
        // the waiting task.
        dead_claim(&s, "job/2", Mutation::new().set("complete", true).set("error_encountered", false).set("n", 20_i64))
            .await;
        assert!(!get(&s, &key("job")).await.get_bool("ready").unwrap());
        tokio::time::sleep(Duration::from_millis(1600)).await;
        let st = q.stats("count").await.unwrap();
        assert_eq!((st.lapsed, st.completed, st.failed), (1, 2, 1), "ended, and its claim lapsed: {st:?}");
        let recover = agent(&s, "count").poll_interval(Duration::from_secs(3600)).process_while(|l| l.recovered < 1);
        let log =
            tokio::time::timeout(WAIT, recover.build().unwrap().work(count_part)).await.expect("recovered").unwrap();
        assert_eq!((log.recovered, log.tasks_processed), (1, 0), "no handler ran again");
        let d = get(&s, &key("job")).await;
        assert_eq!((d.get_bool("ready").unwrap(), d.get_i64("round").unwrap()), (true, 1));
        let part = get(&s, &key("job/2")).await;
        assert_eq!((part.get_bool("claimed").unwrap(), part.get_i64("n").unwrap()), (false, 20));

        // The waiting task's agent died after marking it waiting, before settling,
        // and the parts had all ended by then.
        s.insert_many(
            &coll(),
            vec![
                doc! {"_id": "p2", "agent_name": "merge", "ready": true},
                doc! {"_id": "p2/0", "agent_name": "count", "ready": false, "complete": true,
                "error_encountered": false, "n": 7, "join": "p2", "join_round": 0_i64},
            ],
        )
        .await
        .unwrap();
        dead_claim(&s, "p2", Mutation::new().set("waiting", 0_i64)).await;
        let merge = agent(&s, "merge").poll_interval(Duration::from_secs(3600));
        let recover = merge.process_while(|l| l.recovered < 1).build().unwrap();
        let log =
            tokio::time::timeout(WAIT, recover.work(|_t: Task| async { true })).await.expect("recovered").unwrap();
        assert_eq!((log.recovered, log.tasks_processed), (1, 0));
        let d = get(&s, &key("p2")).await;
        assert_eq!((d.get_bool("ready").unwrap(), d.get_i64("round").unwrap(), d.get("waiting")), (true, 1, None));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = {
            let seen = seen.clone();
            move |t: Task| {
                seen.lock()
                    .unwrap()
                    .extend(t.children().iter().map(|c| (c.id().to_string(), c.data().get_i32("n").ok())));
                async { true }
            }
        };
        assert_eq!(recover.process(record).await.unwrap(), Some(Processed::Completed(key("p2"))));
        assert_eq!(*seen.lock().unwrap(), [("p2/0".to_string(), Some(7))]);
    }

    pub(crate) async fn requeued_tasks_are_not_collected<H: Harness>(h: &H) {
        let s = h.store("ag_requeue_gc").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("done")).await.unwrap();
        q.enqueue(NewTask::new("w", doc! {"fail": true}).id("failed")).await.unwrap();
        let a = agent(&s, "w").max_attempts(1).retain_finished(Duration::from_millis(1)).build().unwrap();
        let handler = |t: Task| async move { !t.data().get_bool("fail").unwrap_or(false) };
        assert_eq!(a.process(handler).await.unwrap(), Some(Processed::Completed(key("done"))));
        assert_eq!(a.process(handler).await.unwrap(), Some(Processed::Failed(key("failed"))));
        // Requeued after it failed, collected later: the mark it got when it failed
        // must not delete it now that it is ready again.
        assert_eq!(q.requeue(doc! {"agent_name": "w"}).await.unwrap(), [key("failed")]);
        ttl_pass(h, &s).await;
        assert!(!exists(&s, "done").await, "a finished task is collected");
        assert!(exists(&s, "failed").await, "a requeued task is live again and must not be collected");
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(key("failed"))));
    }

    pub(crate) async fn follow_ups_are_kept_until_their_waiter_ends<H: Harness>(h: &H) {
        let s = h.store("ag_fan_in_gc").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("split", doc! {}).id("job")).await.unwrap();
        let retain = Duration::from_millis(1);
        let split = agent(&s, "split").retain_finished(retain).build().unwrap();
        let count = agent(&s, "count").retain_finished(retain).build().unwrap();
        let waiter = |t: Task| async move {
            match t.round() {
                0 => (0..3_i64)
                    .fold(Outcome::done(), |o, p| o.follow_up(NewTask::new("count", doc! {"part": p})))
                    .wait_for_follow_ups(),
                _ => Outcome::done_with(doc! {"seen": t.children().len() as i64}),
            }
        };
        assert_eq!(split.process(waiter).await.unwrap(), Some(Processed::Waiting(key("job"))));
        for _ in 0..3 {
            assert!(count.process(count_part).await.unwrap().is_some());
        }
        // The follow-ups ended, but their waiter has not read them yet.
        ttl_pass(h, &s).await;
        for id in ["job/0", "job/1", "job/2"] {
            assert!(exists(&s, id).await, "{id} was collected before its waiter read it");
        }
        assert_eq!(split.process(waiter).await.unwrap(), Some(Processed::Completed(key("job"))));
        assert_eq!(get(&s, &key("job")).await.get_i64("seen").unwrap(), 3, "the waiter saw every follow-up");
        // Once the waiter ended, it and its follow-ups are collected.
        ttl_pass(h, &s).await;
        for id in ["job", "job/0", "job/1", "job/2"] {
            assert!(!exists(&s, id).await, "{id} is kept after its waiter ended");
        }
    }

    pub(crate) async fn foreign_tasks_never_stop_an_agent<H: Harness>(h: &H) {
        let s = h.store("ag_foreign").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("ok")).await.unwrap();
        // Tasks another program inserted: a UUID `_id`, a string `fence`. Neither can
        // be read as a record; both sort first.
        let uuid = bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![1; 16] };
        h.insert_raw(&s, &coll(), doc! {"_id": uuid, "agent_name": "w", "ready": true, "priority": 9}).await;
        h.insert_raw(
            &s,
            &coll(),
            doc! {"_id": "bad-fence", "agent_name": "w", "ready": true, "priority": 9, "fence": "3"},
        )
        .await;
        let a = agent(&s, "w").poll_interval(Duration::from_millis(200)).build().unwrap();
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(key("ok"))));
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), None, "unreadable tasks are never claimed");
        // The work loop goes on past them too.
        q.enqueue(NewTask::new("w", doc! {}).id("later")).await.unwrap();
        let worker = agent(&s, "w")
            .poll_interval(Duration::from_millis(200))
            .process_while(|log| log.completed < 1)
            .build()
            .unwrap();
        let log = tokio::time::timeout(WAIT, worker.work(|_t: Task| async { true })).await.unwrap().unwrap();
        assert_eq!(log.completed, 1);
        // Listing reads what it can and names what it cannot.
        let listed = q.tasks_each(doc! {"agent_name": "w"}, None).await.unwrap();
        assert_eq!(listed.len(), 4);
        let bad: Vec<String> = listed
            .iter()
            .filter_map(|r| match r {
                Err(store_trait::StoreError::Malformed { key, .. }) => Some(key.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(bad.len(), 2, "{listed:?}");
        assert!(bad.iter().any(|k| k == "bad-fence") && bad.iter().any(|k| k.contains("$binary")), "{bad:?}");
        assert_eq!(q.stats("w").await.unwrap().completed, 2);
        assert!(q.requeue(doc! {"agent_name": "w"}).dry_run(true).await.unwrap().is_empty());
    }

    pub(crate) async fn progress_is_fenced_by_the_claim<H: Harness>(h: &H) {
        let s = h.store("ag_progress").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("p")).await.unwrap();
        let a = agent(&s, "w").build().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (store, log) = (s.clone(), seen.clone());
        let r = a
            .process(move |t: Task| {
                let (store, log) = (store.clone(), log.clone());
                async move {
                    t.progress(doc! {"done": 1, "of": 3}).await.unwrap();
                    let d = get(&store, t.id()).await;
                    log.lock().unwrap().push(format!("ready={}", d.get_bool("ready").unwrap()));
                    // The task is claimed again (this run's lease lapsed, say): its
                    // fence grows, and this run's reports are rejected.
                    let bump = Write::new(Condition::Always, Mutation::new().bump_fence());
                    assert!(store.write(&coll(), t.id(), &bump).await.unwrap().is_applied());
                    match t.progress(2_i64).await {
                        Err(AgentError::ClaimLost { fence, current, .. }) => {
                            log.lock().unwrap().push(format!("rejected {fence} now {current:?}"));
                        }
                        other => panic!("a stale run's progress must be rejected: {other:?}"),
                    }
                    true
                }
            })
            .await
            .unwrap();
        assert_eq!(r, Some(Processed::Stale(key("p"))));
        assert_eq!(*seen.lock().unwrap(), ["ready=false", "rejected 1 now Some(2)"], "progress sets no ready");
        let listed = q.tasks(doc! {"_id": "p"}, None).await.unwrap();
        let d = listed[0].data();
        assert_eq!(d.get_document("progress").unwrap(), &doc! {"done": 1, "of": 3}, "the stale report changed nothing");
        assert!(d.get_datetime("progress_at").is_ok());
        assert!(matches!(
            q.enqueue(NewTask::new("w", doc! {"progress": 5})).await,
            Err(AgentError::ReservedField { .. })
        ));
    }

    pub(crate) async fn cancel_ends_pending_and_running_tasks<H: Harness>(h: &H) {
        let s = h.store("ag_cancel").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("done").priority(9)).await.unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("run").priority(5)).await.unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("pend")).await.unwrap();
        let a = agent(&s, "w").build().unwrap();
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(key("done"))));
        let started = Arc::new(tokio::sync::Notify::new());
        let running = tokio::spawn({
            let (a, started) = (a.clone(), started.clone());
            async move {
                a.process(move |t: Task| {
                    let started = started.clone();
                    async move {
                        started.notify_one();
                        // Ends only when the cancel has taken the claim away.
                        t.cancellation().cancelled().await;
                        let late = t.progress(1_i64).await;
                        assert!(matches!(late, Err(AgentError::ClaimLost { .. })), "{late:?}");
                        true
                    }
                })
                .await
            }
        });
        started.notified().await;
        let mut would: Vec<String> =
            q.cancel(doc! {}).dry_run(true).await.unwrap().iter().map(ToString::to_string).collect();
        would.sort();
        assert_eq!(would, ["pend", "run"], "a dry run lists the tasks not ended");
        assert_eq!(get(&s, &key("pend")).await.get_bool("cancelled").ok(), None, "a dry run changes nothing");
        assert_eq!(q.cancel_ids(&[key("pend"), key("done")]).await.unwrap(), [key("pend")]);
        assert_eq!(q.cancel(doc! {"_id": "run"}).await.unwrap(), [key("run")]);
        let r = tokio::time::timeout(WAIT, running).await.unwrap().unwrap().unwrap();
        assert_eq!(r, Some(Processed::Stale(key("run"))), "the running holder's outcome is rejected");
        for id in ["pend", "run"] {
            let d = get(&s, &key(id)).await;
            assert_eq!(
                (d.get_bool("complete").unwrap(), d.get_bool("cancelled").unwrap(), d.get_bool("claimed").unwrap()),
                (true, true, false),
                "{id}: {d}"
            );
        }
        assert!(get(&s, &key("done")).await.get_bool("cancelled").is_err(), "an ended task is not cancelled");
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), None, "a cancelled task is never claimed");
        assert!(q.requeue(doc! {}).await.unwrap().is_empty(), "requeue leaves cancelled tasks alone");
    }

    pub(crate) async fn delete_removes_ended_tasks_unless_forced<H: Harness>(h: &H) {
        let s = h.store("ag_delete").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("done").priority(9)).await.unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("live")).await.unwrap();
        let a = agent(&s, "w").build().unwrap();
        a.process(|_t: Task| async { true }).await.unwrap();
        assert_eq!(q.delete(doc! {}).dry_run(true).await.unwrap(), [key("done")]);
        assert!(exists(&s, "done").await, "a dry run deletes nothing");
        assert_eq!(q.delete(doc! {}).await.unwrap(), [key("done")]);
        assert!(!exists(&s, "done").await && exists(&s, "live").await, "a task not ended is kept");
        assert_eq!(q.delete(doc! {"_id": "live"}).force(true).await.unwrap(), [key("live")]);
        assert!(!exists(&s, "live").await, "forced, it goes too");
    }

    pub(crate) async fn a_paused_agent_name_claims_nothing<H: Harness>(h: &H) {
        let s = h.store("ag_pause").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("t1").priority(9)).await.unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("t2")).await.unwrap();
        q.enqueue(NewTask::new("other", doc! {}).id("o1")).await.unwrap();
        let a = agent(&s, "w").build().unwrap();
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(key("t1"))));
        q.set_paused("w", true).await.unwrap();
        assert!(q.is_paused("w").await.unwrap() && !q.is_paused("other").await.unwrap());
        assert_eq!(q.paused_agents().await.unwrap(), ["w"]);
        // A fresh agent reads the pause on its first claim; one that read it
        // before sees it within CONTROL_REFRESH.
        let b = agent(&s, "w").build().unwrap();
        assert_eq!(b.process(|_t: Task| async { true }).await.unwrap(), None, "paused: nothing claimed");
        tokio::time::sleep(mongoagent::CONTROL_REFRESH + Duration::from_millis(100)).await;
        assert_eq!(a.process(|_t: Task| async { true }).await.unwrap(), None, "the pause is seen");
        let other = agent(&s, "other").build().unwrap();
        assert!(other.process(|_t: Task| async { true }).await.unwrap().is_some(), "other names are not paused");
        q.set_paused("w", false).await.unwrap();
        tokio::time::sleep(mongoagent::CONTROL_REFRESH + Duration::from_millis(100)).await;
        assert_eq!(b.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(key("t2"))));
        assert!(q.paused_agents().await.unwrap().is_empty());
    }

    /// Follow-ups an older claim left pending (its run crashed before it could
    /// remove them) are removed once a later claim of the parent writes its
    /// outcome, even one with no follow-ups: nothing could ever activate them,
    /// and they would stay for ever. A newer claim's pending copy is left.
    pub(crate) async fn stale_pending_follow_ups_are_collected_when_their_parent_ends<H: Harness>(h: &H) {
        let s = h.store("ag_pending_debris").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("p", doc! {}).id("p")).await.unwrap();
        let a = agent(&s, "p").max_attempts(3).build().unwrap();
        let first = a.process(|_t: Task| async { Outcome::failed("again") }).await.unwrap();
        assert_eq!(first, Some(Processed::Retried(Key::new("p").unwrap())));
        // What a first run that crashed after enqueueing its follow-ups leaves.
        let debris = |id: &str, fence: i64| {
            doc! { "_id": id, "agent_name": "c", "parent": "p", "ready": false, "priority": 0_i64,
            "pending_parent_fence": fence, "pending_fields": { "ready": true } }
        };
        s.insert_many(&coll(), vec![debris("p/0", 1), debris("p/9", 99)]).await.unwrap();
        let done = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(p) = a.process(|_t: Task| async { true }).await.unwrap() {
                    return p;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap();
        assert_eq!(done, Processed::Completed(Key::new("p").unwrap()));
        assert!(s.get(&coll(), &Key::new("p/0").unwrap()).await.unwrap().record.is_none(), "the older claim's is gone");
        assert!(s.get(&coll(), &Key::new("p/9").unwrap()).await.unwrap().record.is_some(), "a newer fence's is left");
        // A parent whose claim lapsed, cancelled by an operator: its crashed run's pending
        // follow-up goes with it, and no longer holds its dedupe key.
        q.enqueue(NewTask::new("p", doc! {}).id("lapsed")).await.unwrap();
        let claim = Claim {
            query: Query::eq(doc! {"_id": "lapsed"}),
            mutation: Mutation::new().grant("gone", Ttl::new(Duration::from_millis(1)).unwrap()).bump_fence(),
        };
        s.claim(&coll(), &claim).await.unwrap().unwrap();
        let mut orphan = debris("lapsed/0", 1);
        orphan.insert("parent", "lapsed");
        orphan.insert("dedupe_key", "once");
        s.insert_many(&coll(), vec![orphan]).await.unwrap();
        assert_eq!(q.cancel_ids(&[Key::new("lapsed").unwrap()]).await.unwrap().len(), 1);
        assert!(
            s.get(&coll(), &Key::new("lapsed/0").unwrap()).await.unwrap().record.is_none(),
            "removed with its parent"
        );
        let (_, inserted) = q.enqueue(NewTask::new("c", doc! {}).dedupe_key("once")).await.unwrap();
        assert!(inserted, "the dedupe key is free again");
    }
}
