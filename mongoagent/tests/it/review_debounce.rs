//! Review of dedupe scopes and debounce (#33): what the README promises ("a
//! burst of enqueues runs once, with the last data"; "the latest data is
//! never dropped"), attacked through the README's own example, batches,
//! fan-in tasks and operator-like data. The runs of one key are not ordered
//! (README, "Dedupe scopes"), which the review also showed.

use std::time::Duration;

use bson::{doc, Document};
use mongoagent::{Agent, AgentError, DedupeScope, NewTask, Outcome, Processed, Queue, Task};
use store_test::{Harness, Needs};

use crate::dedupe::{holder_of, user_data};
use store_trait::{Collection, Key, Store};

fn coll() -> Collection {
    Collection::new("tasks").unwrap()
}

fn debounced(key: &str, data: Document, d: Duration) -> NewTask {
    NewTask::new("d", data).dedupe_key(key).debounce(d)
}

/// The suite (`review_debounce_suite`): each `pub(crate) async fn` over a
/// `Harness` here is one test on every backend.
#[store_test::suite(review_debounce_suite, crate::review_debounce::cases)]
pub(crate) mod cases {
    use super::*;

    /// The README's debounce example, word for word ("Three edits in a
    /// burst: one reindex, with the last edit, 5 s after it"), run: the
    /// README's doctest only compiles it. Its data once had a field `rev`,
    /// the store's revision field, and the first enqueue was
    /// `AgentError::ReservedField`.
    pub(crate) async fn the_readme_debounce_example_runs<H: Harness>(h: &H) {
        let s = h.store("rv33_debounce_readme").await;
        let queue = Queue::new(s.clone(), "tasks").unwrap();
        let mut said = Vec::new();
        for edit in 1..=3 {
            let t = NewTask::new("reindex", bson::doc! { "doc": 42, "edit": edit })
                .dedupe_key("reindex/42")
                .debounce(Duration::from_secs(5));
            let got = queue.enqueue(t).await;
            assert!(got.is_ok(), "enqueue {edit} of the README's example: {got:?}");
            said.push(got.unwrap().1);
        }
        assert_eq!(said, vec![true, false, false]);
    }

    /// `Queue::enqueue_all` with two debounced tasks: one whose key a task of
    /// another scope holds (refused: `KeyHeldByAnother`), and one whose key a
    /// waiting debounced task holds (a replace). The call is the first's
    /// error, and the second's replace is made all the same (it was lost
    /// silently, on every retry of the batch).
    pub(crate) async fn a_refused_debounce_in_a_batch_leaves_the_other_debounces_applied<H: Harness>(h: &H) {
        let s = h.store("rv33_debounce_batch").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let minute = Duration::from_secs(60);
        q.enqueue(NewTask::new("d", doc! { "n": 0 }).dedupe_key("a")).await.unwrap();
        let (b, new) = q.enqueue(debounced("b", doc! { "n": 1 }, minute)).await.unwrap();
        assert!(new);
        let batch = [debounced("a", doc! { "n": 9 }, minute), debounced("b", doc! { "n": 2 }, minute)];
        for _ in 0..2 {
            let e = q.enqueue_all(&batch).await.unwrap_err();
            assert!(matches!(&e, AgentError::KeyHeldByAnother { dedupe_key, .. } if dedupe_key == "a"), "{e}");
        }
        let t = holder_of(&s, "b").await;
        assert_eq!(t.key(), &b);
        assert_eq!(
            user_data(&t),
            doc! { "n": 2 },
            "the batch's debounce of key b was never applied, though only key a was refused"
        );
    }

    /// Operator-like values in debounced data (strings that read as field
    /// paths or variables, documents that read as expressions) are stored as
    /// given, on the insert and on the replace; the replace removes the
    /// first enqueue's fields. (Expected to hold: the MongoDB backend wraps
    /// such values in `$literal`.)
    pub(crate) async fn operator_like_values_in_debounced_data_are_kept_as_given<H: Harness>(h: &H) {
        let s = h.store("rv33_debounce_values").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let minute = Duration::from_secs(60);
        let first = doc! { "s": "$agent_name", "v": "$$REMOVE", "e": { "add": ["$fence", 1] }, "gone": "$$ROOT" };
        let (id, _) = q.enqueue(debounced("$k.x", first.clone(), minute)).await.unwrap();
        assert_eq!(user_data(&holder_of(&s, "$k.x").await), first);
        let second = doc! {
            "s": "$dedupe_key", "v": "$$NOW", "e": ["$ready", { "x": "$$CURRENT" }], "n": bson::Bson::Null, "empty": ""
        };
        assert_eq!(q.enqueue(debounced("$k.x", second.clone(), minute)).await.unwrap(), (id, false));
        let t = holder_of(&s, "$k.x").await;
        assert_eq!(user_data(&t), second, "the replace's data, as given");
        assert_eq!(t.get_str("agent_name"), Some("d"));
    }

    /// Odd dedupe keys (a long one, one with a NUL, one with a dot and a
    /// dollar, one of spaces) debounce like any other: the second enqueue
    /// replaces the first's data, and a plain enqueue with the key is its
    /// duplicate. (Expected to hold.)
    pub(crate) async fn odd_dedupe_keys_debounce_like_any_other<H: Harness>(h: &H) {
        let s = h.store("rv33_debounce_odd_keys").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let minute = Duration::from_secs(60);
        for key in ["x".repeat(20_000), "a\0b".to_owned(), "$where.x".to_owned(), "   ".to_owned()] {
            let short: String = key.chars().take(12).collect();
            let (id, new) = q.enqueue(debounced(&key, doc! { "version": 1 }, minute)).await.unwrap();
            assert!(new, "{short:?}");
            let again = q.enqueue(debounced(&key, doc! { "version": 2 }, minute)).await.unwrap();
            assert_eq!(again, (id.clone(), false), "{short:?}");
            assert_eq!(user_data(&holder_of(&s, &key).await), doc! { "version": 2 }, "{short:?}");
            let plain = q.enqueue(NewTask::new("d", doc! { "version": 3 }).dedupe_key(key.as_str())).await.unwrap();
            assert_eq!(plain, (id, false), "{short:?}");
        }
    }

    /// `Outcome::then` with a task that has a dedupe key and a scope (the
    /// key of a sum to compute once per batch, say): the fan-in task's id
    /// keeps it once, and its key and scope are dropped together (with the
    /// scope kept, it was "a dedupe scope without a dedupe key", and the
    /// parent failed for good after its follow-ups were enqueued).
    pub(crate) async fn a_then_task_with_a_dedupe_scope_does_not_fail_its_parent<H: Harness>(h: &H) {
        let s = h.store("rv33_then_scope").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (job, _) = q.enqueue(NewTask::new("split", doc! {})).await.unwrap();
        let split = Agent::builder(s.clone(), "split", "tasks").ttl(h.ttl()).build().unwrap();
        let got = split
            .process(|_t: Task| async {
                let sum = NewTask::new("sum", doc! {}).dedupe_key("sum/7").dedupe_scope(DedupeScope::UntilEnded);
                Outcome::done().follow_up(NewTask::new("part", doc! {})).then(sum)
            })
            .await
            .unwrap();
        let t = s.get(&coll(), &job).await.unwrap().record.unwrap();
        assert!(
            !matches!(got, Some(Processed::Failed(_))),
            "the parent failed for good: {:?}",
            t.get_str("last_error")
        );
    }

    /// Huge data: the first enqueue's 9 MB field and the replace's 9 MB
    /// field of another name would make a 18 MB document if merged; the
    /// replace must leave the second enqueue's data alone, whole (and an
    /// empty document after that). (Expected to hold on the memory store;
    /// a server may refuse the merged intermediate.)
    pub(crate) async fn huge_data_of_other_fields_debounces_whole<H: Harness>(h: &H) {
        let s = h.store("rv33_debounce_huge").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let minute = Duration::from_secs(60);
        let big = "x".repeat(9 * 1024 * 1024);
        let (id, _) = q.enqueue(debounced("k", doc! { "a": big.as_str() }, minute)).await.unwrap();
        let second = q.enqueue(debounced("k", doc! { "b": big.as_str() }, minute)).await;
        assert_eq!(second.unwrap(), (id.clone(), false));
        let data = user_data(&holder_of(&s, "k").await);
        assert_eq!(
            (data.len(), data.get_str("b").ok().map(str::len)),
            (1, Some(big.len())),
            "the second enqueue's data, whole"
        );
        assert_eq!(q.enqueue(debounced("k", doc! {}, minute)).await.unwrap(), (id, false));
        assert_eq!(user_data(&holder_of(&s, "k").await), doc! {}, "empty data replaces too");
    }

    /// A debounced key given back by an operator: the task that took the
    /// latest data is cancelled while it waits; the next debounced enqueue
    /// is a new task (the key does not stay held by the cancelled task).
    /// (Expected to hold: a cancel bumps the fence.)
    pub(crate) async fn a_cancelled_waiting_debounced_task_frees_its_key<H: Harness>(h: &H) {
        let s = h.store("rv33_debounce_cancel").await;
        if !h.has("a_cancelled_waiting_debounced_task_frees_its_key", Needs::UniqueKeyRelease).await {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let minute = Duration::from_secs(60);
        let (first, _) = q.enqueue(debounced("k", doc! { "version": 1 }, minute)).await.unwrap();
        assert_eq!(q.cancel_ids(std::slice::from_ref(&first)).await.unwrap(), vec![first.clone()]);
        let (second, new) = q.enqueue(debounced("k", doc! { "version": 2 }, minute)).await.unwrap();
        assert!(new && second != first, "a new task after the cancel");
        let t: Key = holder_of(&s, "k").await.key().clone();
        assert_eq!(t, second);
    }
}
