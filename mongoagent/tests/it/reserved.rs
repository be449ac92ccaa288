//! User data against the schema, every backend: a task's data, a follow-up's
//! and a handler's merge that name a field the queue keeps for itself (or a
//! malformed or operator-like one) are refused with a typed error, or fail the
//! outcome for good saying why: never silently dropped, and never completed
//! without the work. Adversarial data is generated, and every task is either
//! run once and ended, or refused.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, Document};
use mongoagent::{fields, Agent, AgentError, NewTask, Outcome, Processed, Queue, Task};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use store_test::Harness;
use store_trait::{Collection, Key, Query, Store, StoreError};

fn coll() -> Collection {
    Collection::new("tasks").unwrap()
}

fn agent<S: Store + Clone>(s: &S, name: &str) -> Agent<S> {
    Agent::builder(s.clone(), name, "tasks")
        .backoff(Duration::from_millis(100), Duration::from_millis(400))
        .ttl(Duration::from_secs(4))
        .build()
        .unwrap()
}

async fn doc_of<S: Store>(s: &S, id: &str) -> Document {
    s.get(&coll(), &Key::new(id).unwrap()).await.unwrap().record.unwrap().into_data()
}

/// One `process` of `name`'s agent with a handler that completes, and how
/// many times that handler ran.
async fn process_counting_runs<S: Store + Clone>(s: &S, name: &str) -> (Option<Processed>, u32) {
    let ran = Arc::new(AtomicU32::new(0));
    let r = ran.clone();
    let got = agent(s, name)
        .process(move |_t: Task| {
            r.fetch_add(1, Ordering::SeqCst);
            async { true }
        })
        .await
        .unwrap();
    (got, ran.load(Ordering::SeqCst))
}

async fn count<S: Store>(s: &S, filter: Document) -> u64 {
    s.count(&coll(), &Query::eq(filter)).await.unwrap()
}

/// A field name: reserved, near-reserved, malformed or plain.
fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(fields::RESERVED.to_vec()).prop_map(str::to_owned),
        proptest::sample::select(vec![
            "follow_ups_fence",
            "follow_ups_finish",
            "$set",
            "$where",
            "a.b",
            "_id.x",
            "Ready",
            "ready ",
            "fence2",
            "_ID",
            "\u{0}x",
        ])
        .prop_map(str::to_owned),
        "[a-z]{1,6}",
    ]
}

/// A value: plain, or shaped like an operator or a field path.
fn value() -> impl Strategy<Value = Bson> {
    prop_oneof![
        any::<i64>().prop_map(Bson::Int64),
        "[a-z$.]{0,8}".prop_map(Bson::String),
        Just(Bson::Document(doc! { "$gt": 1 })),
        Just(Bson::Document(doc! { "$toLong": "$$NOW" })),
        Just(Bson::String("$ready".into())),
        Just(Bson::Array(vec![Bson::Document(doc! { "$literal": 1 })])),
    ]
}

fn data() -> impl Strategy<Value = Document> {
    proptest::collection::vec((field_name(), value()), 0..4).prop_map(|kv| kv.into_iter().collect())
}

/// A task's data, its handler's merge, and its follow-ups' data.
#[derive(Debug, Clone)]
struct Case {
    task: Document,
    merge: Document,
    follow_ups: Vec<Document>,
}

fn case() -> impl Strategy<Value = Case> {
    (data(), data(), proptest::collection::vec(data(), 0..3)).prop_map(|(task, merge, follow_ups)| Case {
        task,
        merge,
        follow_ups,
    })
}

fn is_typed_refusal(e: &AgentError) -> bool {
    matches!(e, AgentError::ReservedField { .. } | AgentError::Store(StoreError::InvalidInput { .. }))
}

/// The suite (`reserved_suite`): each `pub(crate) async fn` over a `Harness` here
/// is one test on every backend, registered by being written.
#[store_test::suite(reserved_suite, crate::reserved::cases)]
pub(crate) mod cases {
    use super::*;

    /// Every reserved field in a new task's data is `AgentError::ReservedField`
    /// naming it, `_id` and the pending marks included: a task enqueued with
    /// `follow_ups_fence` was completed without its handler running, and one with
    /// `pending_parent_fence` could not be cancelled.
    pub(crate) async fn reserved_fields_in_task_data_are_refused<H: Harness>(h: &H) {
        let s = h.store("ag_reserved_data").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        for f in fields::RESERVED.iter().chain(&["follow_ups_fence", "follow_ups_finish"]) {
            let e = q.enqueue(NewTask::new("c", doc! { *f: 1_i64 })).await.unwrap_err();
            assert!(matches!(&e, AgentError::ReservedField { field } if field == f), "{f}: {e}");
            assert!(e.to_string().contains(f), "the error names the field: {e}");
        }
        for f in ["$where", "a.b", ""] {
            let e = q.enqueue(NewTask::new("c", doc! { f: 1_i64 })).await.unwrap_err();
            assert!(matches!(e, AgentError::Store(StoreError::InvalidInput { .. })), "{f:?}: {e}");
        }
        assert_eq!(count(&s, doc! {}).await, 0, "nothing was enqueued");
        // A plain task still runs, and its handler does.
        let (id, _) = q.enqueue(NewTask::new("c", doc! { "follow_ups": 1 })).await.unwrap();
        assert_eq!(process_counting_runs(&s, "c").await, (Some(Processed::Completed(id)), 1));
    }

    /// A follow-up whose data names a reserved field fails its parent for good,
    /// saying which, and leaves no follow-up behind. With `_id` set to its
    /// parent's own id, the follow-up was taken as settled by the parent itself:
    /// the parent completed and the follow-up never existed.
    pub(crate) async fn a_follow_up_naming_a_reserved_field_fails_its_parent_for_good<H: Harness>(h: &H) {
        let s = h.store("ag_reserved_follow_up").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let a = agent(&s, "a");
        for (i, f) in ["_id", "follow_ups_fence", "pending_parent_fence", "fence", "ready", "join"].iter().enumerate() {
            let parent = format!("p{i}");
            q.enqueue(NewTask::new("a", doc! {}).id(parent.clone())).await.unwrap();
            let (field, own) = (f.to_string(), parent.clone());
            let got = a
                .process(move |_t: Task| {
                    let (field, own) = (field.clone(), own.clone());
                    async move {
                        Outcome::done()
                            .follow_up(NewTask::new("b", doc! { "fine": 1 }))
                            .follow_up(NewTask::new("b", doc! { field: own }))
                    }
                })
                .await
                .unwrap();
            assert_eq!(got, Some(Processed::Failed(Key::new(parent.clone()).unwrap())), "{f}");
            let d = doc_of(&s, &parent).await;
            let why = d.get_str("last_error").unwrap();
            assert!(why.contains(f) && why.contains("follow-up 1"), "{f}: {why}");
            // Also as the fan-in step's follow-up.
            let waiter = format!("w{i}");
            q.enqueue(NewTask::new("a", doc! {}).id(waiter.clone())).await.unwrap();
            let (field, own) = (f.to_string(), waiter.clone());
            let got = a
                .process(move |_t: Task| {
                    let (field, own) = (field.clone(), own.clone());
                    async move { Outcome::done().follow_up(NewTask::new("b", doc! { field: own })).wait_for_follow_ups() }
                })
                .await
                .unwrap();
            assert_eq!(got, Some(Processed::Failed(Key::new(waiter).unwrap())), "{f}");
        }
        assert_eq!(count(&s, doc! { "agent_name": "b" }).await, 0, "no follow-up, pending or not, was left");
    }

    /// A follow-up's id is derived from its parent; a task enqueued by hand with
    /// that id is not the follow-up, and is never taken for it: the parent fails
    /// for good, saying so, where before it completed and the follow-up was lost.
    pub(crate) async fn a_follow_up_whose_id_is_another_tasks_fails_its_parent_for_good<H: Harness>(h: &H) {
        let s = h.store("ag_follow_up_id_taken").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        q.enqueue(NewTask::new("a", doc! {}).id("p")).await.unwrap();
        // Not claimable by "a"'s agent: another name, delayed.
        q.enqueue(NewTask::new("squatter", doc! {}).id("p/0").delay(Duration::from_secs(3600))).await.unwrap();
        let got =
            agent(&s, "a").process(|_t: Task| async { Outcome::done().follow_up(NewTask::new("b", doc! {})) }).await;
        assert_eq!(got.unwrap(), Some(Processed::Failed(Key::new("p").unwrap())));
        let why = doc_of(&s, "p").await.get_str("last_error").unwrap().to_owned();
        assert!(why.contains("taken by a task of another parent"), "{why}");
        assert_eq!(doc_of(&s, "p/0").await.get_str("agent_name").unwrap(), "squatter", "the other task is left alone");
    }

    /// A follow-up whose dedupe key an active task holds is that task, as any
    /// enqueue's duplicate is: the parent completes, one task carries the key.
    /// One something waits for must be its own task: that parent fails for good.
    pub(crate) async fn a_follow_up_deduplicated_against_an_active_task_is_settled<H: Harness>(h: &H) {
        let s = h.store("ag_follow_up_dedupe").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (existing, _) = q.enqueue(NewTask::new("b", doc! {}).dedupe_key("once")).await.unwrap();
        q.enqueue(NewTask::new("a", doc! {}).id("p")).await.unwrap();
        q.enqueue(NewTask::new("a", doc! {}).id("w")).await.unwrap();
        let a = agent(&s, "a");
        let dedupe = || NewTask::new("b", doc! {}).dedupe_key("once");
        let got = a.process(move |_t: Task| async move { Outcome::done().follow_up(dedupe()) }).await.unwrap();
        assert_eq!(got, Some(Processed::Completed(Key::new("p").unwrap())));
        assert_eq!(count(&s, doc! { "dedupe_key": "once" }).await, 1);
        assert!(s.get(&coll(), &existing).await.unwrap().record.is_some());
        let got =
            a.process(move |_t: Task| async move { Outcome::done().follow_up(dedupe()).wait_for_follow_ups() }).await;
        assert_eq!(got.unwrap(), Some(Processed::Failed(Key::new("w").unwrap())));
        let why = doc_of(&s, "w").await.get_str("last_error").unwrap().to_owned();
        assert!(why.contains("dedupe key"), "{why}");
    }

    /// A task another program wrote with the mark of a parent whose outcome was
    /// written (`follow_ups_fence`) is not completed as if it had run: the mark
    /// is not below its claim's fence, so no claim of it wrote it, and the task
    /// fails for good saying so.
    pub(crate) async fn a_pending_mark_written_past_the_queue_is_no_outcome<H: Harness>(h: &H) {
        let s = h.store("ag_forged_mark").await;
        let raw =
            doc! { "_id": "forged", "agent_name": "c", "ready": true, "priority": 0_i64, "follow_ups_fence": 1_i64 };
        h.insert_raw(&s, &coll(), raw).await;
        let got = process_counting_runs(&s, "c").await;
        assert_eq!(got, (Some(Processed::Failed(Key::new("forged").unwrap())), 0), "failed without running");
        let d = doc_of(&s, "forged").await;
        assert!(d.get_str("last_error").unwrap().contains("follow_ups_fence"), "{d}");
    }

    /// Two parents can derive one follow-up id (`job` in round 1 and `job@1` in
    /// round 0 both give `job@1/0`). Fences count one parent's claims, so another
    /// parent's pending copy is never removed for a smaller fence: the second
    /// parent fails for good, saying so, and the first keeps its follow-up.
    pub(crate) async fn another_parents_pending_follow_up_is_never_removed<H: Harness>(h: &H) {
        let s = h.store("ag_pending_other_parent").await;
        // The pending follow-up of parent `job@1`'s claim with fence 1.
        let theirs = doc! { "_id": "job@1/0", "agent_name": "b", "parent": "job@1", "ready": false, "priority": 0_i64,
        "pending_parent_fence": 1_i64, "pending_fields": { "ready": true } };
        h.insert_raw(&s, &coll(), theirs).await;
        // Parent `job`, in its second round, at a larger fence.
        let job =
            doc! { "_id": "job", "agent_name": "a", "ready": true, "priority": 0_i64, "round": 1_i64, "fence": 5_i64 };
        h.insert_raw(&s, &coll(), job).await;
        let got =
            agent(&s, "a").process(|_t: Task| async { Outcome::done().follow_up(NewTask::new("b", doc! {})) }).await;
        assert_eq!(got.unwrap(), Some(Processed::Failed(Key::new("job").unwrap())));
        let kept = doc_of(&s, "job@1/0").await;
        assert_eq!((kept.get_str("parent").ok(), kept.get_i64("pending_parent_fence").ok()), (Some("job@1"), Some(1)));
    }

    /// Generated adversarial data (a fixed seed, so every backend runs the same
    /// cases): each task is refused at enqueue with a typed error, or its handler
    /// runs exactly once and it ends, completed with every follow-up enqueued, or
    /// failed for good saying why; a refused follow-up or merge leaves no
    /// follow-up behind.
    pub(crate) async fn adversarial_data_runs_once_or_is_refused<H: Harness>(h: &H) {
        let s = h.store("ag_adversarial").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let a = agent(&s, "adv");
        let mut runner = TestRunner::deterministic();
        let strategy = case();
        let (mut refused, mut completed, mut failed) = (0, 0, 0);
        for i in 0..48 {
            let case = strategy.new_tree(&mut runner).unwrap().current();
            let id = format!("t{i}");
            if let Err(e) = q.enqueue(NewTask::new("adv", case.task.clone()).id(id.clone())).await {
                assert!(is_typed_refusal(&e), "case {i} {case:?}: {e}");
                refused += 1;
                continue;
            }
            let ran = Arc::new(AtomicU32::new(0));
            let (r, c) = (ran.clone(), case.clone());
            let got = a
                .process(move |_t: Task| {
                    r.fetch_add(1, Ordering::SeqCst);
                    let c = c.clone();
                    async move {
                        let children = c.follow_ups.iter().map(|d| NewTask::new("child", d.clone()));
                        children.fold(Outcome::done_with(c.merge.clone()), Outcome::follow_up)
                    }
                })
                .await
                .unwrap();
            assert_eq!(ran.load(Ordering::SeqCst), 1, "case {i}: the handler ran once");
            let d = doc_of(&s, &id).await;
            assert_eq!(d.get_bool("complete").ok(), Some(true), "case {i} ended: {d}");
            let children = count(&s, doc! { "parent": &id }).await;
            match got {
                Some(Processed::Completed(_)) => {
                    completed += 1;
                    assert_eq!(children, case.follow_ups.len() as u64, "case {i}: every follow-up enqueued");
                    for (k, v) in &case.merge {
                        assert_eq!(d.get(k), Some(v), "case {i}: the merge applied as given");
                    }
                }
                Some(Processed::Failed(_)) => {
                    failed += 1;
                    assert_eq!(children, 0, "case {i}: a refused outcome leaves no follow-up");
                    let why = d.get_str("last_error").unwrap();
                    assert!(why.contains("merged") || why.contains("follow-up"), "case {i}: {why}");
                }
                other => panic!("case {i} {case:?}: {other:?}"),
            }
        }
        assert!(refused > 0 && completed > 0 && failed > 0, "cases of each kind: {refused} {completed} {failed}");
    }
}
