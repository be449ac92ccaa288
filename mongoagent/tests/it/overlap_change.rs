//! Held ticks left when a schedule changes from `Overlap::Queue` to another
//! policy: they are not stranded. Under `Skip` they are let through one at a
//! time, as under `Queue`; under `Allow`, which lets ticks overlap, all at
//! once, however long the ticks enqueued since then run.

use std::time::Duration;

use mongoagent::{
    schedule::{Overlap, Schedules},
    Agent, Processed, Task,
};
use store_memory::MemoryStore;
use store_trait::{Key, Store};

use crate::schedule_support::{memory, minutely, start_held, unfinished, Running, MINUTE};

/// A Queue schedule `name` whose first tick runs (held) and whose next two
/// wait held; then its policy is changed to `to`.
async fn held_then_changed(
    name: &str,
    to: Overlap,
) -> (Schedules<MemoryStore>, Agent<MemoryStore>, MemoryStore, (std::sync::Arc<tokio::sync::Notify>, Running)) {
    let store = memory();
    let s = Schedules::new(store.clone(), "cron").unwrap();
    s.upsert(&minutely(name, Overlap::Queue)).await.unwrap();
    let agent = Agent::builder(store.clone(), name, "cron").ttl(Duration::from_secs(3600)).build().unwrap();
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    let first = start_held(&agent).await;
    for _ in 0..2 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
    }
    assert_eq!(unfinished(&s, name).await.len(), 3, "one running, two held");
    s.upsert(&minutely(name, to)).await.unwrap();
    (s, agent, store, first)
}

/// Whether the definition still carries the `running` mark (which makes
/// every pass look for held ticks).
async fn marked(s: &Schedules<MemoryStore>, store: &MemoryStore, name: &str) -> bool {
    let got = store.get(s.collection(), &Key::new(name).unwrap()).await.unwrap();
    got.record.unwrap().data().contains_key("running")
}

/// Claims a ready tick, if one is, and runs it to completion.
async fn run_one_if_ready(agent: &Agent<MemoryStore>) -> bool {
    let got = tokio::time::timeout(Duration::from_secs(1), agent.process(|_: Task| async { true })).await;
    matches!(got, Ok(Ok(Some(Processed::Completed(_)))))
}

#[tokio::test(start_paused = true)]
async fn after_a_change_to_skip_held_ticks_run_one_at_a_time() {
    let (s, agent, store, (hold, running)) = held_then_changed("s", Overlap::Skip).await;
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    assert!(!run_one_if_ready(&agent).await, "nothing let through while the first tick runs");
    hold.notify_one();
    running.await.unwrap().unwrap();
    for n in 2..=3 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
        let (next, running) = start_held(&agent).await;
        assert!(!run_one_if_ready(&agent).await, "held tick {n} runs alone");
        next.notify_one();
        running.await.unwrap().unwrap();
    }
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    assert!(run_one_if_ready(&agent).await, "then Skip enqueues ticks again");
    assert!(unfinished(&s, "s").await.is_empty());
    assert!(!marked(&s, &store, "s").await, "with none held, the mark is removed");
}

#[tokio::test(start_paused = true)]
async fn after_a_change_to_allow_held_ticks_run_though_allow_ticks_never_end() {
    let (s, agent, store, (hold, running)) = held_then_changed("a", Overlap::Allow).await;
    // Allow ticks that never end, one a minute, from now on.
    let mut never = Vec::new();
    for _ in 0..2 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
        never.push(start_held(&agent).await);
    }
    hold.notify_one();
    running.await.unwrap().unwrap();
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    // The Allow tick of this pass and both held ticks are ready.
    let mut ran = 0;
    while run_one_if_ready(&agent).await {
        ran += 1;
    }
    for (h, r) in never {
        h.notify_one();
        r.await.unwrap().unwrap();
    }
    assert_eq!(ran, 3, "both held ticks ran beside the Allow ticks, with this pass's own");
    assert!(!marked(&s, &store, "a").await, "with none held, the mark is removed");
}
