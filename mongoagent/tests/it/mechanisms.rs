//! One deterministic test per agent safety mechanism that the suite and the
//! simulation do not pin down on their own (see ARCHITECTURE.md, "Testing"):
//! each fails when its mechanism is removed.

use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use mongoagent::{Agent, NewTask, Outcome, Processed, Queue, Task};
use store_memory::MemoryStore;
use store_trait::{Collection, Key};
use tokio::sync::Notify;

fn coll() -> Collection {
    Collection::new("tasks").unwrap()
}

async fn data(s: &MemoryStore, id: &Key) -> bson::Document {
    s.peek(&coll(), id).unwrap().record.unwrap().into_data()
}

/// Fence check: an agent cut off for longer than its lease finishes its handler
/// after another agent took the task over and completed it. Its late outcome is
/// rejected, whatever order the two finish in.
#[tokio::test(start_paused = true)]
async fn a_late_outcome_of_a_lapsed_claim_is_rejected() {
    for newer_finishes_first in [true, false] {
        let store = MemoryStore::new();
        let (id, _) = Queue::new(store.clone(), "tasks").unwrap().enqueue(NewTask::new("w", doc! {})).await.unwrap();
        let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let slow = store.client();
        let old = Agent::builder(slow.clone(), "w", "tasks").lease(Duration::from_secs(3)).build().unwrap();
        let old_run = tokio::spawn({
            let (started, finish) = (started.clone(), finish.clone());
            async move {
                let handler = move |_t: Task| {
                    let (started, finish) = (started.clone(), finish.clone());
                    async move {
                        started.notify_one();
                        finish.notified().await;
                        Outcome::done_with(doc! {"by": "old"})
                    }
                };
                old.process(handler).await.map(|p| (p, old.log()))
            }
        });
        started.notified().await;
        // Cut off past the lease: the claim lapses on the store.
        slow.set_partitioned(true);
        tokio::time::sleep(Duration::from_secs(4)).await;

        let new = Agent::builder(store.client(), "w", "tasks").lease(Duration::from_secs(3)).build().unwrap();
        let new_started = Arc::new(Notify::new());
        let new_run = tokio::spawn({
            let (new, new_started) = (new.clone(), new_started.clone());
            let release = if newer_finishes_first { None } else { Some(finish.clone()) };
            async move {
                let handler = move |t: Task| {
                    let (new_started, release) = (new_started.clone(), release.clone());
                    async move {
                        assert_eq!(t.attempt(), 2);
                        new_started.notify_one();
                        if let Some(r) = release {
                            // The old agent finishes while this one still runs.
                            r.notify_one();
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        Outcome::done_with(doc! {"by": "new"})
                    }
                };
                new.process(handler).await
            }
        });
        new_started.notified().await;
        slow.set_partitioned(false);
        if newer_finishes_first {
            assert_eq!(new_run.await.unwrap().unwrap(), Some(Processed::Completed(id.clone())));
            finish.notify_one();
            let (old_processed, old_log) = old_run.await.unwrap().unwrap();
            assert_eq!(old_processed, Some(Processed::Stale(id.clone())), "the late outcome is rejected");
            assert_eq!((old_log.completed, old_log.stale_rejected), (0, 1));
        } else {
            let (old_processed, old_log) = old_run.await.unwrap().unwrap();
            assert_eq!(old_processed, Some(Processed::Stale(id.clone())), "the late outcome is rejected");
            assert_eq!((old_log.completed, old_log.stale_rejected), (0, 1));
            assert_eq!(new_run.await.unwrap().unwrap(), Some(Processed::Completed(id.clone())));
        }
        let d = data(&store, &id).await;
        assert_eq!((d.get_str("by").unwrap(), d.get_bool("complete").unwrap()), ("new", true), "{d}");
    }
}
