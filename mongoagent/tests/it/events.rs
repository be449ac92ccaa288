//! The lifecycle event stream ([`Queue::events`]) on every backend: each
//! task's events in order, lapses and recoveries, operator actions, and a
//! `Resync` for a subscriber that falls behind. On the memory store without
//! change notifications the same events come from polling.

use std::collections::HashMap;
use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, EventFilter, EventKind, EventStream, NewTask, Outcome, Queue, QueueEvent, Task};
use store_test::Harness;
use store_trait::{Claim, Collection, Mutation, Query, Store, Ttl};

const WAIT: Duration = Duration::from_secs(60);

/// Polls often, so a test on a real server does not wait long.
fn filter() -> EventFilter {
    EventFilter::all().poll_every(Duration::from_millis(200))
}

/// Events by task id, as names, until `done` holds (or the wait ends).
async fn collect(
    events: &mut EventStream,
    seen: &mut HashMap<String, Vec<&'static str>>,
    done: impl Fn(&HashMap<String, Vec<&'static str>>) -> bool,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(seen) {
        match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(QueueEvent::Task(ev))) => seen.entry(ev.task.to_string()).or_default().push(ev.kind.name()),
            Ok(Some(other)) => panic!("unexpected {other:?}; so far {seen:?}"),
            Ok(None) => panic!("the stream ended; so far {seen:?}"),
            Err(_) => panic!("timed out; so far {seen:?}"),
        }
    }
}

fn ended_with(last: &'static str, id: &'static str) -> impl Fn(&HashMap<String, Vec<&'static str>>) -> bool {
    move |seen| seen.get(id).and_then(|v| v.last()) == Some(&last)
}

/// Whether `got` is `want` with some steps left out, in the same order (a
/// run may report progress more than once).
fn in_order(got: &[&str], want: &[&str]) -> bool {
    let mut got = got.to_vec();
    got.dedup_by(|a, b| *a == "progress" && *b == "progress");
    let mut rest = want.iter();
    got.iter().all(|g| rest.any(|w| w == g))
}

/// Runs `agent` until every task of agent name `name` has ended.
async fn drain<S: Store + Clone, H>(q: &Queue<S>, agent: &Agent<S>, name: &str, handler: H)
where
    H: mongoagent::Handler + Clone,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if agent.process(handler.clone()).await.unwrap().is_some() {
            continue;
        }
        let tasks = q.tasks(doc! {"agent_name": name}, None).await.unwrap();
        let open: Vec<_> = tasks.iter().filter(|r| r.get_bool("complete") != Some(true)).map(|r| r.key()).collect();
        if open.is_empty() {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "tasks left: {open:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn agent<S: Store + Clone>(s: &S, name: &str) -> Agent<S> {
    Agent::builder(s.clone(), name, "tasks")
        .backoff(Duration::from_millis(100), Duration::from_millis(200))
        .ttl(Duration::from_secs(4))
        .build()
        .unwrap()
}

/// Events by task id until `done` holds (or the wait ends).
async fn next_events(
    events: &mut EventStream,
    seen: &mut HashMap<String, Vec<EventKind>>,
    done: impl Fn(&HashMap<String, Vec<EventKind>>) -> bool,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(seen) {
        match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(QueueEvent::Task(ev))) => seen.entry(ev.task.to_string()).or_default().push(ev.kind),
            other => panic!("{other:?}; so far {seen:?}"),
        }
    }
}

/// The suite (`events_suite`): each `pub(crate) async fn` over a `Harness` here
/// is one test on every backend, registered by being written.
#[store_test::suite(events_suite, crate::events::cases)]
pub(crate) mod cases {
    use super::*;

    pub(crate) async fn each_task_s_events_come_in_order<H: Harness>(h: &H) {
        let s = h.store("ev_order").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let mut events = q.events(filter()).await.unwrap();
        for id in ["ok", "flaky", "bad"] {
            q.enqueue(NewTask::new("w", doc! {}).id(id)).await.unwrap();
        }
        q.enqueue(NewTask::new("split", doc! {}).id("job")).await.unwrap();
        let work = |t: Task| async move {
            let id = t.id().to_string();
            t.progress(doc! {"done": 1}).await.unwrap();
            match id.as_str() {
                "flaky" if t.attempt() == 1 => Outcome::failed("try again"),
                "bad" => Outcome::failed_permanently("no"),
                _ => Outcome::done(),
            }
        };
        drain(&q, &agent(&s, "w"), "w", work).await;
        let split = |t: Task| async move {
            match t.round() {
                0 => Outcome::done().follow_up(NewTask::new("part", doc! {})).wait_for_follow_ups(),
                _ => Outcome::done(),
            }
        };
        let (split_agent, part_agent) = (agent(&s, "split"), agent(&s, "part"));
        assert!(split_agent.process(split).await.unwrap().is_some());
        let mut seen = HashMap::new();
        collect(&mut events, &mut seen, |seen| {
            ["ok", "flaky"].iter().all(|id| ended_with("completed", id)(seen)) && ended_with("failed", "bad")(seen)
        })
        .await;
        // Every step of these is proved by the state that follows it, so none is
        // left out, whichever reads the feed made.
        assert_eq!(seen["ok"], ["enqueued", "claimed", "progress", "completed"], "{seen:?}");
        assert_eq!(seen["bad"], ["enqueued", "claimed", "progress", "failed"], "{seen:?}");
        let flaky = ["enqueued", "claimed", "progress", "retrying", "claimed", "progress", "completed"];
        assert!(in_order(&seen["flaky"], &flaky), "{seen:?}");
        // The waiting task is woken once its follow-up ends.
        collect(&mut events, &mut seen, |seen| seen.get("job").is_some_and(|v| v.contains(&"waiting"))).await;
        drain(&q, &part_agent, "part", |_t: Task| async { true }).await;
        collect(&mut events, &mut seen, |seen| seen.get("job").is_some_and(|v| v.contains(&"woken"))).await;
        drain(&q, &split_agent, "split", split).await;
        collect(&mut events, &mut seen, ended_with("completed", "job")).await;
        let job = ["enqueued", "claimed", "waiting", "woken", "claimed", "completed"];
        assert_eq!(seen["job"], job, "{seen:?}");
        let part = seen.iter().find(|(id, _)| id.starts_with("job/")).map(|(_, v)| v);
        assert_eq!(part.unwrap(), &["enqueued", "claimed", "completed"], "{seen:?}");
    }

    pub(crate) async fn lapsed_claims_are_reported_and_recovered<H: Harness>(h: &H) {
        let s = h.store("ev_lapse").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("t")).await.unwrap();
        let mut events = q.events(filter()).await.unwrap();
        // An agent claims it and dies: its lease lapses with no write at all.
        let dead = Claim {
            query: Query::eq(doc! {"_id": "t"}),
            mutation: Mutation::new()
                .grant("dead-agent", Ttl::new(Duration::from_millis(1500)).unwrap())
                .bump_fence()
                .set("ready", false)
                .set("claimed", true),
        };
        assert!(s.claim(&Collection::new("tasks").unwrap(), &dead).await.unwrap().is_some());
        let mut seen = HashMap::new();
        collect(&mut events, &mut seen, ended_with("lapsed", "t")).await;
        let a = agent(&s, "w");
        drain(&q, &a, "w", |_t: Task| async { true }).await;
        collect(&mut events, &mut seen, ended_with("completed", "t")).await;
        assert_eq!(seen["t"], ["claimed", "lapsed", "recovered", "completed"], "{seen:?}");
    }

    pub(crate) async fn operator_actions_are_events<H: Harness>(h: &H) {
        let s = h.store("ev_ops").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let mut events = q.events(filter().agent("w")).await.unwrap();
        q.enqueue(NewTask::new("other", doc! {}).id("not-mine")).await.unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("c")).await.unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("f")).await.unwrap();
        let mut seen = HashMap::new();
        collect(&mut events, &mut seen, |seen| seen.len() == 2).await;
        q.cancel(doc! {"_id": "c"}).await.unwrap();
        collect(&mut events, &mut seen, ended_with("cancelled", "c")).await;
        drain(&q, &agent(&s, "w"), "w", |_t: Task| async { Outcome::failed_permanently("no") }).await;
        collect(&mut events, &mut seen, ended_with("failed", "f")).await;
        assert_eq!(q.requeue(doc! {"_id": "f"}).await.unwrap().len(), 1);
        collect(&mut events, &mut seen, ended_with("requeued", "f")).await;
        assert_eq!(q.delete(doc! {"_id": "f"}).force(true).await.unwrap().len(), 1);
        collect(&mut events, &mut seen, ended_with("deleted", "f")).await;
        assert_eq!(seen["c"], ["enqueued", "cancelled"], "{seen:?}");
        assert_eq!(seen["f"], ["enqueued", "claimed", "failed", "requeued", "deleted"], "{seen:?}");
        assert!(!seen.contains_key("not-mine"), "another agent's task: {seen:?}");
    }

    pub(crate) async fn a_slow_subscriber_gets_a_resync<H: Harness>(h: &H) {
        let s = h.store("ev_resync").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let mut events = q.events(filter().buffer(4)).await.unwrap();
        let many: Vec<NewTask> = (0..20).map(|i| NewTask::new("w", doc! {}).id(format!("t{i}"))).collect();
        q.enqueue_all(&many).await.unwrap();
        // The subscriber reads nothing while the feed reports 20 events.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let first = tokio::time::timeout(WAIT, events.next()).await.unwrap();
        assert!(matches!(first, Some(QueueEvent::Resync { missed }) if missed > 0), "{first:?}");
        // The stream goes on: the last events kept, then new ones. (On a fast
        // server the feed may still be reporting the burst when the first
        // `Resync` is read, so it may fall behind again: more `Resync`s may
        // come first, never the end of the stream.)
        q.enqueue(NewTask::new("w", doc! {}).id("after")).await.unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(Some(QueueEvent::Task(ev))) if ev.task.to_string() == "after" => {
                    assert_eq!(ev.kind.name(), "enqueued");
                    break;
                }
                Ok(Some(QueueEvent::Task(_) | QueueEvent::Resync { .. })) => {}
                Ok(Some(other)) => panic!("unexpected {other:?}"),
                Ok(None) => panic!("the stream ended"),
                Err(_) => panic!("timed out before the new task's event"),
            }
        }
    }

    /// `EventFilter::remember_ended`: a long-lived feed forgets the earliest
    /// ended tasks; a forgotten task is not told again by a later read (the poll
    /// reads the latest ended tasks every tick), and comes back as `Enqueued`.
    pub(crate) async fn a_feed_forgets_ended_tasks_beyond_its_bound_and_never_retells_them<H: Harness>(h: &H) {
        let s = h.store("ev_forget").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let mut events = q.events(filter().remember_ended(2)).await.unwrap();
        let ids = ["a", "b", "c", "d"];
        for id in ids {
            q.enqueue(NewTask::new("w", doc! {}).id(id)).await.unwrap();
        }
        drain(&q, &agent(&s, "w"), "w", |_t: Task| async { Outcome::failed_permanently("no") }).await;
        let mut seen = HashMap::new();
        collect(&mut events, &mut seen, |seen| {
            ids.iter().all(|id| seen.get(*id).and_then(|v| v.last()) == Some(&"failed"))
        })
        .await;
        // Several polls read the ended tasks again: none is news.
        let quiet = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
        assert!(quiet.is_err(), "an ended task told again: {quiet:?}; before: {seen:?}");
        assert_eq!(q.requeue(doc! {"agent_name": "w"}).await.unwrap().len(), 4);
        let mut again = HashMap::new();
        collect(&mut events, &mut again, |seen| seen.len() == ids.len()).await;
        let firsts: Vec<&str> = ids.iter().map(|id| again[*id][0]).collect();
        assert!(firsts.iter().all(|f| *f == "enqueued" || *f == "requeued"), "{again:?}");
        let forgotten = firsts.iter().filter(|f| **f == "enqueued").count();
        assert!(forgotten >= 2, "two of four ended tasks are kept, the others forgotten: {again:?}");
    }

    /// An attempt past its timeout is `TimedOut` (with the attempt and the
    /// timeout), told before what its failure led to: the retry, the failure for
    /// good with no attempt left, or, for a handler that ignored its
    /// cancellation, the lapse of the claim it was abandoned with and the next
    /// claim.
    pub(crate) async fn a_timed_out_attempt_is_told_before_what_follows<H: Harness>(h: &H) {
        let s = h.store("ev_timeout").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let mut events = q.events(filter()).await.unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("slow")).await.unwrap();
        q.enqueue(NewTask::new("w", doc! {}).id("last").max_attempts(1)).await.unwrap();
        q.enqueue(NewTask::new("hung", doc! {}).id("hung")).await.unwrap();
        let limit = Duration::from_millis(300);
        let build = |name: &str| {
            Agent::builder(s.clone(), name, "tasks")
                .backoff(Duration::from_millis(10), Duration::from_millis(20))
                .ttl(h.ttl())
                .timeout(limit)
                .timeout_grace(Duration::from_millis(200))
                .build()
                .unwrap()
        };
        // Stops at its cancellation on its first attempt, completes the second.
        let stops = |t: Task| async move {
            if t.attempt() == 1 {
                t.cancellation().cancelled().await;
            }
            Outcome::done()
        };
        let w = build("w");
        for _ in ["last", "slow"] {
            let got = w.process(stops).await.unwrap();
            assert!(
                matches!(got, Some(mongoagent::Processed::Failed(_) | mongoagent::Processed::Retried(_))),
                "{got:?}"
            );
        }
        // The retry is seen before the next attempt runs: a poll that read only
        // after it would see neither the retry nor the timeout (the next
        // outcome clears the mark), as it sees no retry of any other failure.
        let mut seen: HashMap<String, Vec<EventKind>> = HashMap::new();
        let told = |seen: &HashMap<String, Vec<EventKind>>| {
            seen.get("slow").is_some_and(|v| v.iter().any(|k| k.name() == "retrying"))
        };
        next_events(&mut events, &mut seen, told).await;
        drain(&q, &w, "w", stops).await;
        // Ignores its cancellation on its first attempt: aborted, its claim left
        // to lapse; the next claim, after the lease's end, completes it.
        let hung = build("hung");
        let ignores = |t: Task| async move {
            if t.attempt() == 1 {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Outcome::done()
        };
        assert!(matches!(hung.process(ignores).await.unwrap(), Some(mongoagent::Processed::Abandoned(_))));
        tokio::time::sleep(h.ttl() + Duration::from_millis(500)).await;
        drain(&q, &hung, "hung", ignores).await;

        let done = |seen: &HashMap<String, Vec<EventKind>>| {
            let last = |id: &str| seen.get(id).and_then(|v| v.last()).map(EventKind::name);
            last("slow") == Some("completed") && last("last") == Some("failed") && last("hung") == Some("completed")
        };
        next_events(&mut events, &mut seen, done).await;
        let names = |id: &str| seen[id].iter().map(EventKind::name).collect::<Vec<_>>();
        let told = EventKind::TimedOut { attempt: 1, timeout: limit };
        for id in ["slow", "last", "hung"] {
            assert_eq!(seen[id].iter().filter(|k| **k == told).count(), 1, "{id}: {seen:?}");
        }
        // Every step of these is proved by the state that follows it.
        assert_eq!(names("slow"), ["enqueued", "claimed", "timed_out", "retrying", "claimed", "completed"], "{seen:?}");
        assert_eq!(names("last"), ["enqueued", "claimed", "timed_out", "failed"], "{seen:?}");
        assert_eq!(names("hung"), ["enqueued", "claimed", "timed_out", "lapsed", "recovered", "completed"], "{seen:?}");
        let failed = seen["last"].last().unwrap();
        assert!(
            matches!(failed, EventKind::Failed { attempt: 1, error } if error == "timed out after 300 ms"),
            "{failed:?}"
        );
    }
}
