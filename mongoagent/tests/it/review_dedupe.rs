//! Review of dedupe scopes and `Queue::wait_for` (#33): interleavings and
//! states the feature's own tests leave out.

use std::time::Duration;

use bson::{doc, Bson};
use mongoagent::{Agent, DedupeScope, NewTask, Outcome, Processed, Queue, Task};
use store_test::{Call, Harness, Intercept, Intercepted, Needs};
use store_trait::{Collection, Condition, Key, Query, Store, StoreResult};

use crate::hold_back::{HoldBack, Op};

fn coll() -> Collection {
    Collection::new("tasks").unwrap()
}

fn until_ended() -> NewTask {
    NewTask::new("d", doc! {}).dedupe_key("k").dedupe_scope(DedupeScope::UntilEnded)
}

/// Tasks not ended that were enqueued with key `k` (holding it, or with it retired).
async fn live_with_key<S: Store>(s: &S, k: &str) -> Vec<Key> {
    let mut out = Vec::new();
    for f in ["dedupe_key", "dedupe_key_retired"] {
        let q = Query::eq(doc! { f: k }).when(Condition::FieldEq("complete".into(), Bson::Boolean(true)).negate());
        out.extend(s.find(&coll(), &q).await.unwrap().into_iter().map(|r| r.key().clone()));
    }
    out
}

async fn fail_one<S: Store + Clone>(s: &S, ttl: Duration) -> Option<Processed> {
    let a = Agent::builder(s.clone(), "d", "tasks").ttl(ttl).max_attempts(1).build().unwrap();
    a.process(|_t: Task| async { Outcome::failed("no") }).await.unwrap()
}

/// The retire write is conditioned on the key alone: a requeue of the holder
/// between the enqueue's read (it no longer blocks) and that write leaves the
/// holder live and a second task with the key inserted.
#[tokio::test(start_paused = true)]
async fn a_retire_racing_a_requeue_leaves_one_live_task() {
    let s = HoldBack::new(store_memory::MemoryStore::new());
    let q = Queue::new(s.clone(), "tasks").unwrap();
    let (a, _) = q.enqueue(until_ended()).await.unwrap();
    fail_one(&s, Duration::from_secs(2)).await;
    s.hold_next(|_, op| matches!(op, Op::Write(w) if format!("{:?}", w.mutation).contains("dedupe_key_retired")));
    let producer = tokio::spawn({
        let q = q.clone();
        async move { q.enqueue(until_ended()).await }
    });
    s.reached().await;
    assert_eq!(q.requeue_ids(std::slice::from_ref(&a)).await.unwrap(), vec![a.clone()]);
    s.open();
    let got = producer.await.unwrap().unwrap();
    let live = live_with_key(&s, "k").await;
    assert_eq!(live.len(), 1, "two live tasks with one key: {live:?}, producer got {got:?}");
    assert_eq!(got, (a, false), "the requeued holder stands for the enqueue");
}

/// A waiter whose change notifications end falls back to reading, and still
/// returns when the task ends; an idle wait reads the task rarely.
#[tokio::test(start_paused = true)]
async fn waiting_survives_ended_notifications_and_does_not_poll_when_watched() {
    let mem = store_memory::MemoryStore::new();
    let counted = Counting::new(mem.clone());
    let q = Queue::new(counted.clone(), "tasks").unwrap();
    let (id, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let waiter = tokio::spawn({
        let (q, id) = (q.clone(), id.clone());
        async move { q.wait_for(&id).await }
    });
    tokio::time::sleep(Duration::from_secs(600)).await;
    let gets = counted.gets();
    assert!(gets <= 25, "an idle watched wait read the task {gets} times in ten minutes");
    mem.faults().end_change_streams();
    tokio::time::sleep(Duration::from_millis(100)).await;
    q.cancel_ids(std::slice::from_ref(&id)).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap().unwrap();
    assert!(ended.cancelled());
}

/// A store that counts `get`s.
type Counting = Intercepted<store_memory::MemoryStore, Gets>;

/// The `get`s a [`Counting`] store was sent.
#[derive(Debug, Default)]
struct Gets(std::sync::atomic::AtomicU64);

impl Gets {
    fn gets(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl<S: Store> Intercept<S> for Gets {
    async fn before(&self, _coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        if matches!(call, Call::Get(_)) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }
}

/// A holder written past the queue with a `dedupe_scope` or `dedupe_until`
/// of the wrong type blocks (a scope it cannot read is for ever), and the
/// enqueue names it.
#[tokio::test(start_paused = true)]
async fn a_foreign_holder_with_malformed_scope_fields_blocks() {
    let s = store_memory::MemoryStore::new();
    let q = Queue::new(s.clone(), "tasks").unwrap();
    q.ensure_indexes().await.unwrap();
    for (i, extra) in
        [doc! { "dedupe_scope": 5 }, doc! { "dedupe_scope": "window", "dedupe_until": "soon" }].into_iter().enumerate()
    {
        let k = format!("f{i}");
        let mut d = doc! { "_id": format!("foreign{i}"), "agent_name": "d", "ready": false, "complete": true, "dedupe_key": &k };
        d.extend(extra);
        s.insert_many(&coll(), vec![d]).await.unwrap();
        let t = NewTask::new("d", doc! {}).dedupe_key(k.as_str()).dedupe_scope(DedupeScope::UntilEnded);
        let got = q.enqueue(t).await.unwrap();
        assert_eq!(got, (Key::new(format!("foreign{i}")).unwrap(), false));
    }
}

/// The suite (`review_dedupe_suite`): each `pub(crate) async fn` over a `Harness` here
/// is one test on every backend, registered by being written.
#[store_test::suite(review_dedupe_suite, crate::review_dedupe::cases)]
pub(crate) mod cases {
    use super::*;

    /// UntilEnded: A failed for good, so B took the key (A's is retired). A
    /// requeue of A must not make two live tasks with the key while B is live:
    /// B stands for A.
    pub(crate) async fn a_requeued_task_whose_key_was_retired_is_no_second_live_task<H: Harness>(h: &H) {
        let s = h.store("rv_dedupe_requeue_live").await;
        if !h.has("a_requeued_task_whose_key_was_retired_is_no_second_live_task", Needs::UniqueKeyRelease).await {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (a, _) = q.enqueue(until_ended()).await.unwrap();
        assert_eq!(fail_one(&s, h.ttl()).await, Some(Processed::Failed(a.clone())));
        let (b, new) = q.enqueue(until_ended()).await.unwrap();
        assert!(new && b != a);
        let _ = q.requeue_ids(std::slice::from_ref(&a)).await.unwrap();
        let live = live_with_key(&s, "k").await;
        assert_eq!(live, vec![b], "one live task per key, not the requeued one too: {live:?}");
    }

    /// UntilEnded: once B ended too, a requeue of A revives it, and it holds the
    /// key again: the next enqueue with the key is its duplicate.
    pub(crate) async fn a_requeued_task_takes_its_freed_key_back<H: Harness>(h: &H) {
        let s = h.store("rv_dedupe_requeue_back").await;
        if !h.has("a_requeued_task_takes_its_freed_key_back", Needs::UniqueKeyRelease).await {
            return;
        }
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (a, _) = q.enqueue(until_ended()).await.unwrap();
        fail_one(&s, h.ttl()).await;
        let (b, _) = q.enqueue(until_ended()).await.unwrap();
        assert_eq!(fail_one(&s, h.ttl()).await, Some(Processed::Failed(b.clone())));
        let done = q.requeue_ids(std::slice::from_ref(&a)).await.unwrap();
        assert_eq!(done, vec![a.clone()]);
        let again = q.enqueue(until_ended()).await.unwrap();
        assert_eq!(again, (a.clone(), false), "the requeued task holds the key");
        assert_eq!(live_with_key(&s, "k").await, vec![a]);
    }

    /// `wait_for` does not return on a failed attempt that will be retried, nor
    /// while the task waits for its follow-ups; it returns with the last round.
    pub(crate) async fn waiting_skips_retries_and_a_round_of_follow_ups<H: Harness>(h: &H) {
        let s = h.store("rv_wait_rounds").await;
        let q = Queue::new(s.clone(), "tasks").unwrap();
        let (id, _) = q.enqueue(NewTask::new("p", doc! {})).await.unwrap();
        let waiter = tokio::spawn({
            let (q, id) = (q.clone(), id.clone());
            async move { q.wait_for(&id).await }
        });
        let a = Agent::builder(s.clone(), "p", "tasks")
            .ttl(h.ttl())
            .backoff(Duration::from_millis(10), Duration::from_millis(20))
            .build()
            .unwrap();
        let c = Agent::builder(s.clone(), "c", "tasks").ttl(h.ttl()).build().unwrap();
        let handler = |t: Task| async move {
            match (t.round(), t.attempt()) {
                (0, 1) => Outcome::failed("first try"),
                (0, _) => Outcome::done().follow_up(NewTask::new("c", doc! {})).wait_for_follow_ups(),
                _ => Outcome::done_with(doc! { "rounds": 2 }),
            }
        };
        assert!(matches!(a.process(handler).await.unwrap(), Some(Processed::Retried(_))));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "returned on a retried attempt");
        assert!(matches!(a.process(handler).await.unwrap(), Some(Processed::Waiting(_))));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "returned while the task waits for its follow-ups");
        assert!(matches!(c.process(|_t: Task| async { true }).await.unwrap(), Some(Processed::Completed(_))));
        let mut last = None;
        for _ in 0..50 {
            last = a.process(handler).await.unwrap();
            if last.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(last, Some(Processed::Completed(id.clone())));
        let ended = tokio::time::timeout(Duration::from_secs(20), waiter).await.unwrap().unwrap().unwrap();
        assert!(ended.completed(), "{ended:?}");
        assert_eq!(ended.data().get_i32("rounds").unwrap(), 2);
    }
}
