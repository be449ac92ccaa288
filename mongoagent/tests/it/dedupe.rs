//! Dedupe scopes, every backend: a key blocks for ever (the default), until
//! its task ended, or for a window after its enqueue; a blocked enqueue
//! returns the task holding the key, and once the key is free exactly one
//! of many racing producers inserts the next task.

use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, AgentError, DedupeScope, NewTask, Processed, Queue, Task};
use store_trait::testing::{Harness, Needs};
use store_trait::{Collection, Key, Query, Store};

#[macro_export]
macro_rules! dedupe_suite {
    ($harness:path, #[$attr:meta]) => {
        $crate::dedupe_suite!(@each $harness, #[$attr],
            a_key_until_ended_is_free_once_its_task_ended, a_key_for_a_window_is_free_after_it,
            a_key_for_ever_stays_taken, racing_producers_insert_one_task_per_free_key, scopes_need_a_key_and_a_window
        );
    };
    (@each $harness:path, #[$attr:meta], $($name:ident),* $(,)?) => {
        $(
            #[$attr]
            async fn $name() {
                let Some(h) = $harness().await else { return };
                $crate::dedupe::$name(&h).await;
            }
        )*
    };
}

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
    assert!(got.iter().all(|(k, _)| k == inserted[0] && *k != first), "every racer names the one new task: {got:?}");
    assert_eq!(holders(&s, "k").await, 1);
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
    for f in ["dedupe_scope", "dedupe_until", "dedupe_key_retired"] {
        let e = q.enqueue(NewTask::new("d", doc! { f: "x" })).await.unwrap_err();
        assert!(matches!(e, AgentError::ReservedField { .. }), "{f}: {e}");
    }
}
