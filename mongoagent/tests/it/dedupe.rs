//! Dedupe scopes, every backend: a key blocks for ever (the default), until
//! its task ended, or for a window after its enqueue; a blocked enqueue
//! returns the task holding the key, and once the key is free exactly one
//! of many racing producers inserts the next task. A debounced key gives its
//! never-claimed task the latest enqueue's data and start.

use std::time::Duration;

use bson::{doc, Document};
use mongoagent::{Agent, AgentError, DedupeScope, NewTask, Processed, Queue, Task};
use store_test::{Harness, Needs};
use store_trait::{Collection, Key, Query, Record, Store};

async fn holders<S: Store>(s: &S, key: &str) -> u64 {
    s.count(&Collection::new("tasks").unwrap(), &Query::eq(doc! { "dedupe_key": key })).await.unwrap()
}

async fn run_one<S: Store + Clone>(s: &S, ttl: Duration) -> Option<Processed> {
    let a = Agent::builder(s.clone(), "d", "tasks").ttl(ttl).build().unwrap();
    a.process(|_t: Task| async { true }).await.unwrap()
}

fn task(scope: DedupeScope) -> NewTask {
    NewTask::new("d", doc! {}).dedupe_key("k").dedupe_scope(scope)
}

fn debounced(data: Document, d: Duration) -> NewTask {
    NewTask::new("d", data).dedupe_key("k").debounce(d)
}

/// The task holding key `k`.
async fn holder<S: Store>(s: &S) -> Record {
    holder_of(s, "k").await
}

/// The task of collection `tasks` holding dedupe key `key`.
pub(crate) async fn holder_of<S: Store>(s: &S, key: &str) -> Record {
    let found = s.find(&Collection::new("tasks").unwrap(), &Query::eq(doc! { "dedupe_key": key })).await.unwrap();
    assert_eq!(found.len(), 1, "one task holds the key: {found:?}");
    found.into_iter().next().unwrap()
}

/// The task's own fields: its data, without the queue's.
pub(crate) fn user_data(r: &Record) -> Document {
    r.data().iter().filter(|(k, _)| !mongoagent::fields::is_reserved(k)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The suite (`dedupe_suite`): each `pub(crate) async fn` over a `Harness` here
/// is one test on every backend, registered by being written.
#[store_test::suite(dedupe_suite, crate::dedupe::cases)]
pub(crate) mod cases {
    use super::*;

    /// While its task is pending, the key is taken: the second enqueue returns
    /// the first task. Once it completed, the next enqueue inserts a new task and
    /// the old one keeps its key as `dedupe_key_retired`.
    pub(crate) async fn a_key_until_ended_is_free_once_its_task_ended<H: Harness>(h: &H) {
        let s = h.store("ag_dedupe_until_ended").await;
        if !h.has("a_key_until_ended_is_free_once_its_task_ended", Needs::UniqueKeyRelease).await {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (first, new) = q.enqueue(task(DedupeScope::UntilEnded)).await.unwrap();
        assert!(new);
        assert_eq!(
            q.enqueue(task(DedupeScope::UntilEnded)).await.unwrap(),
            (first.clone(), false),
            "the holder stands for it"
        );
        assert_eq!(run_one(&s, h.ttl()).await, Some(Processed::Completed(first.clone())));
        let (second, new) = q.enqueue(task(DedupeScope::UntilEnded)).await.unwrap();
        assert!(new && second != first, "a new task once the first ended");
        assert_eq!(holders(&s, "k").await, 1);
        let old = s.get(&Collection::new("tasks").unwrap(), &first).await.unwrap().record.unwrap();
        assert_eq!(old.get_str("dedupe_key_retired"), Some("k"));
        assert_eq!(q.enqueue(task(DedupeScope::UntilEnded)).await.unwrap(), (second, false));
    }

    /// A window blocks for its length after the enqueue, whether or not the task
    /// has ended.
    pub(crate) async fn a_key_for_a_window_is_free_after_it<H: Harness>(h: &H) {
        let s = h.store("ag_dedupe_window").await;
        if !h.has("a_key_for_a_window_is_free_after_it", Needs::UniqueKeyRelease).await {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let window = DedupeScope::For(Duration::from_millis(1500));
        let (first, _) = q.enqueue(task(window)).await.unwrap();
        assert_eq!(q.enqueue(task(window)).await.unwrap(), (first.clone(), false));
        tokio::time::sleep(Duration::from_millis(2000)).await;
        let (second, new) = q.enqueue(task(window)).await.unwrap();
        assert!(new && second != first, "the window has passed, though the first never ran");
        assert_eq!(holders(&s, "k").await, 1);
    }

    /// Without a scope the key blocks for as long as its task's document exists.
    pub(crate) async fn a_key_for_ever_stays_taken<H: Harness>(h: &H) {
        let s = h.store("ag_dedupe_forever").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (first, _) = q.enqueue(NewTask::new("d", doc! {}).dedupe_key("k")).await.unwrap();
        assert_eq!(run_one(&s, h.ttl()).await, Some(Processed::Completed(first.clone())));
        let again = q.enqueue(NewTask::new("d", doc! {}).dedupe_key("k")).await.unwrap();
        assert_eq!(again, (first, false));
    }

    /// Sixteen producers race once the key is free: one task is inserted, and
    /// every other enqueue returns it.
    pub(crate) async fn racing_producers_insert_one_task_per_free_key<H: Harness>(h: &H) {
        let s = h.store("ag_dedupe_race").await;
        if !h.has("racing_producers_insert_one_task_per_free_key", Needs::UniqueKeyRelease).await {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (first, _) = q.enqueue(task(DedupeScope::UntilEnded)).await.unwrap();
        run_one(&s, h.ttl()).await;
        let mut racers = Vec::new();
        for _ in 0..16 {
            let q = q.clone();
            racers.push(tokio::spawn(async move { q.enqueue(task(DedupeScope::UntilEnded)).await }));
        }
        let mut got: Vec<(Key, bool)> = Vec::new();
        for r in racers {
            got.push(r.await.unwrap().unwrap());
        }
        let inserted: Vec<&Key> = got.iter().filter(|(_, new)| *new).map(|(k, _)| k).collect();
        assert_eq!(inserted.len(), 1, "{got:?}");
        assert!(
            got.iter().all(|(k, _)| k == inserted[0] && *k != first),
            "every racer names the one new task: {got:?}"
        );
        assert_eq!(holders(&s, "k").await, 1);
    }

    /// A debounced enqueue whose key a task of another scope holds (for ever)
    /// is told so, not told it was a duplicate: its data would not run.
    pub(crate) async fn a_debounce_against_another_scope_is_told_its_data_will_not_run<H: Harness>(h: &H) {
        let s = h.store("ag_debounce_other_scope").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (holder, _) = q.enqueue(NewTask::new("d", doc! { "n": 1 }).dedupe_key("k")).await.unwrap();
        let e = q.enqueue(debounced(doc! { "n": 2 }, Duration::from_secs(1))).await.unwrap_err();
        assert!(
            matches!(&e, AgentError::KeyHeldByAnother { dedupe_key, holder: h } if dedupe_key == "k" && *h == holder.to_string()),
            "{e}"
        );
        assert_eq!(user_data(&self::holder(&s).await), doc! { "n": 1 }, "untouched");
    }

    /// A scope without a key, and a window out of range, are refused.
    pub(crate) async fn scopes_need_a_key_and_a_window<H: Harness>(h: &H) {
        let s = h.store("ag_dedupe_bad").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let e = q.enqueue(NewTask::new("d", doc! {}).dedupe_scope(DedupeScope::UntilEnded)).await.unwrap_err();
        assert!(matches!(e, AgentError::InvalidTask(_)), "{e}");
        for w in [Duration::ZERO, mongoagent::MAX_TIMEOUT * 2] {
            let e = q.enqueue(task(DedupeScope::For(w))).await.unwrap_err();
            assert!(matches!(e, AgentError::InvalidTask(_)), "{w:?}: {e}");
        }
        let debounce = |d| NewTask::new("d", doc! {}).dedupe_key("k").debounce(d);
        for w in [Duration::ZERO, Duration::from_micros(999), mongoagent::MAX_TIMEOUT * 2] {
            let e = q.enqueue(debounce(w)).await.unwrap_err();
            assert!(matches!(e, AgentError::InvalidTask(_)), "{w:?}: {e}");
        }
        let second = Duration::from_secs(1);
        for bad in [
            NewTask::new("d", doc! {}).debounce(second),
            debounce(second).id("fixed"),
            debounce(second).run_at(store_trait::StoreTime::from_millis(0)),
        ] {
            let e = q.enqueue(bad.clone()).await.unwrap_err();
            assert!(matches!(e, AgentError::InvalidTask(_)), "{bad:?}: {e}");
        }
        for f in ["dedupe_scope", "dedupe_until", "dedupe_key_retired"] {
            let e = q.enqueue(NewTask::new("d", doc! { f: "x" })).await.unwrap_err();
            assert!(matches!(e, AgentError::ReservedField { .. }), "{f}: {e}");
        }
    }

    /// Three debounced enqueues while the task waits: the later two return the
    /// first task's id as not new, each replaces its data whole (a field only the
    /// first had is gone) and options, and pushes its start to a debounce after
    /// it on the store clock. The task is not claimable before, and runs once,
    /// with the last data. An enqueue of another scope does not replace it.
    pub(crate) async fn a_debounced_task_runs_once_with_the_latest_data<H: Harness>(h: &H) {
        let s = h.store("ag_debounce_latest").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let debounce = Duration::from_millis(1500);
        let (first, new) = q
            .enqueue(debounced(doc! { "n": 1, "only_first": true }, debounce).priority(3).max_attempts(2))
            .await
            .unwrap();
        assert!(new);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(q.enqueue(debounced(doc! { "n": 2 }, debounce)).await.unwrap(), (first.clone(), false));
        let before_last = s.now().await.unwrap();
        assert_eq!(q.enqueue(debounced(doc! { "n": 3 }, debounce)).await.unwrap(), (first.clone(), false));
        let after_last = s.now().await.unwrap();
        let plain = NewTask::new("d", doc! { "n": 4 }).dedupe_key("k");
        assert_eq!(q.enqueue(plain).await.unwrap(), (first.clone(), false), "another scope is a duplicate");
        let other = NewTask::new("other", doc! { "n": 5 }).dedupe_key("k").debounce(debounce);
        let e = q.enqueue(other).await.unwrap_err();
        assert!(
            matches!(&e, AgentError::KeyHeldByAnother { holder, .. } if *holder == first.to_string()),
            "another agent name's debounce cannot take the key: {e}"
        );

        let t = holder(&s).await;
        assert_eq!(t.key(), &first);
        assert_eq!(user_data(&t), doc! { "n": 3 }, "the latest data, whole");
        assert_eq!((t.get_i64("priority"), t.data().contains_key("max_attempts")), (Some(0), false), "its options too");
        let start = t.get_time("run_at").unwrap().as_millis();
        let (lo, hi) = (before_last.as_millis() + 1500, after_last.as_millis() + 1500);
        assert!((lo..=hi).contains(&start), "starts a debounce after the latest enqueue: {start} not in {lo}..={hi}");

        // 1 s after the first enqueue plus 1 s: past the first's start, before the last's.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        if s.now().await.unwrap().as_millis() < start {
            assert_eq!(run_one(&s, h.ttl()).await, None, "not before a debounce after the latest enqueue");
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        let ran = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let a = Agent::builder(s.clone(), "d", "tasks").ttl(h.ttl()).build().unwrap();
        let seen = ran.clone();
        let handler = move |t: Task| {
            seen.lock().push(t.data().get_i32("n").unwrap());
            async { true }
        };
        assert_eq!(a.process(handler.clone()).await.unwrap(), Some(Processed::Completed(first)));
        assert_eq!(a.process(handler).await.unwrap(), None);
        assert_eq!(*ran.lock(), vec![3], "once, with the latest data");
    }

    /// Once the debounced task is claimed, the next enqueue is a new task with
    /// its own debounce (the running one keeps its data); the one after that
    /// replaces the new task's data. Each runs once.
    pub(crate) async fn a_claimed_debounced_task_leaves_the_next_enqueue_a_new_task<H: Harness>(h: &H) {
        let s = h.store("ag_debounce_claimed").await;
        if !h.has("a_claimed_debounced_task_leaves_the_next_enqueue_a_new_task", Needs::UniqueKeyRelease).await {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let debounce = Duration::from_millis(200);
        let (first, _) = q.enqueue(debounced(doc! { "n": 1 }, debounce)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        let a = Agent::builder(s.clone(), "d", "tasks").ttl(h.ttl()).build().unwrap();
        let release = std::sync::Arc::new(tokio::sync::Notify::new());
        let (started, mut running) = tokio::sync::mpsc::unbounded_channel::<i32>();
        let slow = tokio::spawn({
            let (a, release) = (a.clone(), release.clone());
            async move {
                a.process(move |t: Task| {
                    let (started, release) = (started.clone(), release.clone());
                    async move {
                        started.send(t.data().get_i32("n").unwrap()).unwrap();
                        release.notified().await;
                        true
                    }
                })
                .await
                .unwrap()
            }
        });
        assert_eq!(running.recv().await, Some(1));
        let (second, new) = q.enqueue(debounced(doc! { "n": 2 }, debounce)).await.unwrap();
        assert!(new && second != first, "a running task takes no new data: a new task does");
        assert_eq!(q.enqueue(debounced(doc! { "n": 3 }, debounce)).await.unwrap(), (second.clone(), false));
        assert_eq!(user_data(&holder(&s).await), doc! { "n": 3 });
        release.notify_one();
        assert_eq!(slow.await.unwrap(), Some(Processed::Completed(first.clone())));
        let old = s.get(&Collection::new("tasks").unwrap(), &first).await.unwrap().record.unwrap();
        assert_eq!((user_data(&old), old.get_str("dedupe_key_retired")), (doc! { "n": 1 }, Some("k")));
        tokio::time::sleep(Duration::from_millis(400)).await;
        let got = std::sync::Arc::new(parking_lot::Mutex::new(None));
        let seen = got.clone();
        let handler = move |t: Task| {
            *seen.lock() = t.data().get_i32("n").ok();
            async { true }
        };
        assert_eq!(a.process(handler).await.unwrap(), Some(Processed::Completed(second)));
        assert_eq!(*got.lock(), Some(3));
        let (third, new) = q.enqueue(debounced(doc! { "n": 4 }, debounce)).await.unwrap();
        assert!(new && holders(&s, "k").await == 1, "ended: a new task again ({third})");
    }

    /// Sixteen producers race on a waiting debounced task, each with a field of
    /// its own: one task, every producer told its id, and its data is one
    /// producer's, whole (the removal of the fields read and the setting of
    /// one's own are one write on the revision read). Each write arrives late,
    /// after every racer has read the task.
    pub(crate) async fn racing_debounced_producers_leave_one_enqueues_data_whole<H: Harness>(h: &H) {
        let s = h.store("ag_debounce_race").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let debounce = Duration::from_secs(60);
        let (first, _) = q.enqueue(debounced(doc! { "n": -1, "p-1": true }, debounce)).await.unwrap();
        // Every racer's write arrives after the others' reads, on every backend.
        let late = crate::hold_back::HoldBack::new(s.clone());
        late.delay_writes("tasks", Duration::from_millis(100));
        let q = Queue::new(late, "tasks").unwrap();
        let mut racers = Vec::new();
        for i in 0..16 {
            let q = q.clone();
            let data = doc! { "n": i, format!("p{i}"): true };
            racers.push(tokio::spawn(async move { q.enqueue(debounced(data, debounce)).await }));
        }
        for r in racers {
            assert_eq!(r.await.unwrap().unwrap(), (first.clone(), false));
        }
        let data = user_data(&holder(&s).await);
        let n = data.get_i32("n").unwrap();
        assert!((0..16).contains(&n), "a racer's data: {data}");
        assert_eq!(data, doc! { "n": n, format!("p{n}"): true }, "one producer's data, whole");
    }

    /// Two debounced enqueues race after their key's task was claimed: both
    /// move the key off it (one move applies), both insert, one insert wins,
    /// and the other enqueue is superseded by the winner at once. It is told
    /// the winner's id, and writes nothing more: the winner's data is its own,
    /// never replaced (no `debounced_at`). Each racer's writes arrive after
    /// both have read the claimed task.
    pub(crate) async fn an_enqueue_that_loses_the_insert_race_is_superseded_at_once<H: Harness>(h: &H) {
        let s = h.store("ag_debounce_superseded").await;
        if !h.has("an_enqueue_that_loses_the_insert_race_is_superseded_at_once", Needs::UniqueKeyRelease).await {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (first, _) = q.enqueue(debounced(doc! { "n": 0 }, Duration::from_millis(1))).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let ran = loop {
            match run_one(&s, h.ttl()).await {
                Some(p) => break p,
                None if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(20)).await,
                None => panic!("the first task never ran"),
            }
        };
        assert_eq!(ran, Processed::Completed(first.clone()));
        let late = crate::hold_back::HoldBack::new(s.clone());
        late.delay_writes("tasks", Duration::from_millis(100));
        let q = Queue::new(late, "tasks").unwrap();
        let racers: Vec<_> = (1..=2)
            .map(|n| {
                let q = q.clone();
                tokio::spawn(async move { q.enqueue(debounced(doc! { "n": n }, Duration::from_secs(60))).await })
            })
            .collect();
        let mut told = Vec::new();
        for r in racers {
            told.push(r.await.unwrap().unwrap());
        }
        let won = holder(&s).await;
        assert_ne!(won.key(), &first);
        assert!(told.iter().all(|(id, _)| id == won.key()), "both told the winner's id: {told:?}");
        assert_eq!(told.iter().filter(|(_, new)| *new).count(), 1, "one inserted: {told:?}");
        assert!(!won.data().contains_key("debounced_at"), "the loser replaced the winner's data: {won:?}");
        assert!([doc! { "n": 1 }, doc! { "n": 2 }].contains(&user_data(&won)), "{won:?}");
    }

    /// Producers enqueue a debounce of 1 ms while two agents claim as fast as
    /// they can. Whatever interleaving: no task runs twice, one task at most
    /// holds the key, and the last enqueue's data (after every racer) runs: an
    /// enqueue that met a claim went into a new task.
    pub(crate) async fn debounced_producers_racing_agents_lose_no_latest_data<H: Harness>(h: &H) {
        let s = h.store("ag_debounce_claims").await;
        if !h.has("debounced_producers_racing_agents_lose_no_latest_data", Needs::UniqueKeyRelease).await {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let debounce = Duration::from_millis(1);
        let ran = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<(Key, i32)>::new()));
        let stop = mongoagent::CancellationToken::new();
        let mut agents = Vec::new();
        for _ in 0..2 {
            let a = Agent::builder(s.clone(), "d", "tasks").ttl(h.ttl()).build().unwrap();
            let (ran, stop) = (ran.clone(), stop.clone());
            agents.push(tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let ran = ran.clone();
                    let handler = move |t: Task| {
                        ran.lock().push((t.id().clone(), t.data().get_i32("n").unwrap()));
                        async { true }
                    };
                    if a.process(handler).await.unwrap().is_none() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }));
        }
        let mut producers = Vec::new();
        for p in 0..8 {
            let q = q.clone();
            producers.push(tokio::spawn(async move {
                for i in 0..6 {
                    q.enqueue(debounced(doc! { "n": p * 10 + i }, debounce)).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
            }));
        }
        for p in producers {
            p.await.unwrap();
        }
        assert!(holders(&s, "k").await <= 1);
        q.enqueue(debounced(doc! { "n": 999 }, debounce)).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let last_ran = |ran: &[(Key, i32)]| ran.iter().filter(|(_, n)| *n == 999).count();
        while last_ran(&ran.lock()) == 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        for a in agents {
            a.await.unwrap();
        }
        let ran = ran.lock().clone();
        assert_eq!(last_ran(&ran), 1, "the last enqueue's data ran, once: {ran:?}");
        let mut ids: Vec<String> = ran.iter().map(|(k, _)| k.to_string()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), ran.len(), "no task ran twice: {ran:?}");
        let st = q.stats("d").await.unwrap();
        assert_eq!((st.ready, st.delayed, st.running), (0, 0, 0), "{st:?}");
    }

    /// An agent idle in `work` (woken by notifications, or polling) runs a
    /// burst's task once, with the last data, no sooner than a debounce after
    /// the last enqueue on the store clock: a replace that pushes the start
    /// moves the agent's wake-up with it.
    pub(crate) async fn an_idle_agent_runs_a_debounced_task_once_after_the_last_enqueue<H: Harness>(h: &H) {
        let s = h.store("ag_debounce_idle").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let ran = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let stop = mongoagent::CancellationToken::new();
        let a = Agent::builder(s.clone(), "d", "tasks").ttl(h.ttl()).shutdown_on(&stop).build().unwrap();
        let (seen, clock) = (ran.clone(), s.clone());
        let working = tokio::spawn(async move {
            a.work(move |t: Task| {
                let (seen, clock) = (seen.clone(), clock.clone());
                async move {
                    let at = clock.now().await.unwrap();
                    seen.lock().push((t.data().get_i32("n").unwrap(), at));
                    true
                }
            })
            .await
        });
        // Enqueues 300 ms apart, ten times within the debounce: a loaded
        // machine that stretched a gap past it would rightly split the burst.
        let debounce = Duration::from_millis(3000);
        let mut before_last = None;
        for n in 1..=3 {
            before_last = Some(s.now().await.unwrap());
            q.enqueue(debounced(doc! { "n": n }, debounce)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while ran.lock().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.cancel();
        working.await.unwrap().unwrap();
        let ran = ran.lock().clone();
        assert_eq!(ran.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![3], "once, with the last data");
        let earliest = before_last.unwrap().as_millis() + 3000;
        assert!(ran[0].1.as_millis() >= earliest, "not before the last enqueue's debounce ({earliest}): {ran:?}");
    }

    /// A delay far beyond the debounce (a century; `secantusd-py` stores no
    /// date past the year 9999): the later of the two applies, on the first
    /// enqueue and on the replace.
    pub(crate) async fn a_debounce_with_a_huge_delay_starts_after_both<H: Harness>(h: &H) {
        let s = h.store("ag_debounce_delay").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let century = Duration::from_secs(100 * 365 * 24 * 3600);
        let task = || debounced(doc! {}, Duration::from_secs(1)).delay(century);
        let (first, _) = q.enqueue(task()).await.unwrap();
        assert_eq!(q.enqueue(task()).await.unwrap(), (first, false));
        let start = holder(&s).await.get_time("run_at").unwrap().as_millis();
        let (now, century) = (s.now().await.unwrap().as_millis(), i64::try_from(century.as_millis()).unwrap());
        assert!((now + century - 60_000..=now + century).contains(&start), "{start}: the delay, from the replace");
        assert_eq!(run_one(&s, h.ttl()).await, None);
    }
}
