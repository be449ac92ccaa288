//! Stale agents change nothing: a lapsed claim's late outcome is never taken for
//! done (memory store, paused time, fault injection).

use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, NewTask, Outcome, Processed, Queue, Task};
use store_memory::MemoryStore;
use store_trait::{Collection, Key};

fn record(store: &MemoryStore, id: &str) -> store_trait::Record {
    store.peek(&Collection::new("tasks").unwrap(), &Key::new(id).unwrap()).unwrap().record.unwrap()
}

/// The agent's claim lapses while its handler runs; its outcome write fails
/// before it applies, and the task is requeued before the retry. The retry finds
/// no lease and (before requeue bumped the fence) the same fence: the old check
/// took that for "my earlier attempt applied" and reported the task completed,
/// although its outcome was never written and it runs again.
#[tokio::test(start_paused = true)]
async fn a_requeue_between_retries_is_not_taken_for_done() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("w", doc! {}).id("t")).await.unwrap();
    let a = Agent::builder(store.clone(), "w", "tasks").lease(Duration::from_secs(2)).build().unwrap();
    let handler = {
        let (store, q) = (store.clone(), q.clone());
        move |_t: Task| {
            let (store, q) = (store.clone(), q.clone());
            async move {
                // Cut off until the claim lapses.
                store.faults().set_unreachable(true);
                tokio::time::sleep(Duration::from_secs(3)).await;
                store.faults().set_unreachable(false);
                // The outcome write fails before it applies; an operator requeues
                // the stuck task while the agent backs off.
                store.faults().fail_next(1);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    assert_eq!(q.requeue(doc! {"_id": "t"}, false).await.unwrap().len(), 1);
                });
                Outcome::done_with(doc! {"result": "first run"})
            }
        }
    };
    let token = record(&store, "t").fence() + 1;
    let out = a.process(handler).await.unwrap();
    assert_eq!(out, Some(Processed::Stale(Key::new("t").unwrap())), "the outcome was never written");
    assert_eq!(a.log().completed, 0);
    let r = record(&store, "t");
    assert_eq!((r.data().get_bool("ready").unwrap(), r.data().get_bool("complete").unwrap()), (true, false));
    assert!(r.data().get("result").is_none());
    assert_eq!(r.fence(), token + 1, "a requeue bumps the fence");
}
