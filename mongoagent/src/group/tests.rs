//! Unit tests of groups: numbering, the sweep's deferral, and what a
//! requeue voids.

use std::time::Duration;

use bson::doc;
use store_trait::{Collection, Store};

use super::{Groups, SWEEP};
use crate::queue::Queue;
use crate::task::NewTask;

/// A group whose task runs long is as its tasks say at every sweep:
/// the first sweep that finds it so passes it over for the other
/// agents' sweeps until the next [`SWEEP`], and sweeps it again then.
#[tokio::test(start_paused = true)]
async fn an_unchanged_slot_is_swept_once_per_sweep_interval_across_agents() {
    let store = store_memory::MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    queue.enqueue(NewTask::new("a", doc! {}).group("g")).await.unwrap();
    let groups = Groups::new(store, Collection::new("tasks").unwrap(), Collection::new("tasks_groups").unwrap());
    // An agent's first sweep lets the task through; it then runs long.
    assert_eq!(groups.sweep("a", 1, true).await.unwrap(), 1);
    let later = SWEEP + Duration::from_secs(1);
    tokio::time::advance(later).await;
    // Agent A's periodic sweep finds the slot as its task says...
    assert_eq!(groups.sweep("a", 1, false).await.unwrap(), 1);
    // ...so agent B's, a moment later, passes it over,
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(groups.sweep("a", 1, false).await.unwrap(), 0);
    // until the next interval.
    tokio::time::advance(later).await;
    assert_eq!(groups.sweep("a", 1, false).await.unwrap(), 1);
}

/// A deferral over a lost nudge and a crash strands nothing: a sweep
/// reads the slot while "a" runs; a producer numbers and inserts "c"
/// and its nudge is lost; "a" ends and its agent dies before its
/// settle; the deferral then applies (no settle wrote the slot), and
/// the periodic sweep after the next interval lets "c" through. (The
/// fourth review's test of this drove the deferral through
/// `Agent::process`, whose sweeps of every slot no longer defer.)
#[tokio::test(start_paused = true)]
async fn a_deferral_over_a_lost_nudge_and_a_crash_strands_nothing() {
    let store = store_memory::MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    let (a, _) = queue.enqueue(NewTask::new("w", doc! {}).group("g")).await.unwrap();
    let (tasks, slots) = (Collection::new("tasks").unwrap(), Collection::new("tasks_groups").unwrap());
    let groups = Groups::new(store.clone(), tasks.clone(), slots.clone());
    groups.sweep("w", 1, true).await.unwrap();
    tokio::time::advance(SWEEP + Duration::from_secs(1)).await;
    let key = super::slot_key("w", "g").unwrap();
    let read = store.get(&slots, &key).await.unwrap().record.unwrap();
    // "c": numbered and inserted; its nudge lost.
    let mut docs = vec![NewTask::new("w", doc! {}).group("g").id("c").to_document().unwrap()];
    groups.number(&mut docs).await.unwrap();
    store.insert_many(&tasks, docs).await.unwrap();
    // "a" ends; its agent dies before its settle.
    let done = store_trait::Mutation::new()
        .set(crate::schema::fields::COMPLETE, true)
        .set(crate::schema::fields::READY, false);
    let w = store_trait::Write::new(store_trait::Condition::Always, done);
    assert!(store.write(&tasks, &a, &w).await.unwrap().is_applied());
    groups.defer_sweep(&read).await.unwrap();
    assert_eq!(groups.sweep("w", 1, false).await.unwrap(), 0, "deferred");
    tokio::time::advance(SWEEP + Duration::from_secs(1)).await;
    assert_eq!(groups.sweep("w", 1, false).await.unwrap(), 1);
    let c = store.get(&tasks, &store_trait::Key::new("c").unwrap()).await.unwrap().record.unwrap();
    assert_eq!(c.get_bool(crate::schema::fields::READY), Some(true), "\"c\" let through: {:?}", c.data());
}

/// A requeue's announcement between a sweep's read of a slot and its
/// deferral voids the deferral (it bumps `version`): the slot stays
/// due, and the requeued task is let through by the next sweep. (The
/// fourth review's test of this drove it through `Agent::process`,
/// whose sweeps of every slot no longer defer.)
#[tokio::test(start_paused = true)]
async fn a_requeue_between_a_sweeps_read_and_its_deferral_voids_it() {
    let store = store_memory::MemoryStore::new();
    let queue = Queue::new(store.clone(), "tasks").unwrap();
    queue.enqueue(NewTask::new("a", doc! {}).group("g")).await.unwrap();
    let slots = Collection::new("tasks_groups").unwrap();
    let groups = Groups::new(store.clone(), Collection::new("tasks").unwrap(), slots.clone());
    groups.sweep("a", 1, true).await.unwrap();
    tokio::time::advance(SWEEP + Duration::from_secs(1)).await;
    let key = super::slot_key("a", "g").unwrap();
    let read = store.get(&slots, &key).await.unwrap().record.unwrap();
    groups.announce("a", "g", None).await.unwrap();
    groups.defer_sweep(&read).await.unwrap();
    let after = store.get(&slots, &key).await.unwrap().record.unwrap();
    assert_eq!(after.get_time(super::slot_fields::SWEEP_AFTER), read.get_time(super::slot_fields::SWEEP_AFTER));
    assert_eq!(groups.sweep("a", 1, false).await.unwrap(), 1, "still due");
}
