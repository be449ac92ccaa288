//! Held ticks left when a schedule changes from `Overlap::Queue` to another
//! policy: they are not stranded. Under `Skip` they are let through one at a
//! time, as under `Queue`; under `Allow`, which lets ticks overlap, all at
//! once, however long the ticks enqueued since then run. Whether or not a
//! tick was let through under Queue before the change, and when the
//! schedule is deleted and created again. And a pass of another policy that
//! inserts late, after a change to `Skip`, does not hide its tick.

use std::time::Duration;

use mongoagent::{
    schedule::{Overlap, Schedules},
    Agent, Processed, Task,
};
use store_memory::MemoryStore;
use store_trait::{Key, Store};

use crate::schedule_support::{
    complete_one, memory, minutely, start_held, unfinished, unfinished_while_held, Race, Running, MINUTE,
};

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

/// Under Skip a tick runs long; the schedule changes to Queue, and two ticks
/// are enqueued held (none let through: they wait for the Skip tick, and no
/// `running` mark is set); it changes back to Skip before that tick ends.
/// The held ticks still run, one at a time, and Skip then ticks again.
#[tokio::test(start_paused = true)]
async fn ticks_held_before_any_was_let_through_run_after_a_change_back_to_skip() {
    let store = memory();
    let s = Schedules::new(store.clone(), "cron").unwrap();
    s.upsert(&minutely("b", Overlap::Skip)).await.unwrap();
    let agent = Agent::builder(store.clone(), "b", "cron").ttl(Duration::from_secs(3600)).build().unwrap();
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    let (hold, running) = start_held(&agent).await;
    s.upsert(&minutely("b", Overlap::Queue)).await.unwrap();
    for _ in 0..2 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
    }
    assert!(!marked(&s, &store, "b").await, "nothing was let through under Queue");
    s.upsert(&minutely("b", Overlap::Skip)).await.unwrap();
    hold.notify_one();
    running.await.unwrap().unwrap();
    drains_then_ticks(&s, &agent, "b").await;
}

/// A Queue schedule with held ticks is deleted (they stay held) and created
/// again under its name with Skip: its ticks are let through one at a time,
/// and then it ticks again.
#[tokio::test(start_paused = true)]
async fn ticks_held_by_a_deleted_schedule_run_under_its_successor() {
    let (s, agent, _store, (hold, running)) = held_then_changed("d", Overlap::Queue).await;
    assert!(s.delete("d").await.unwrap());
    s.upsert(&minutely("d", Overlap::Skip)).await.unwrap();
    hold.notify_one();
    running.await.unwrap().unwrap();
    drains_then_ticks(&s, &agent, "d").await;
}

/// The schedule has two held ticks and nothing running: the next passes let
/// them through one at a time, and then Skip enqueues ticks again.
async fn drains_then_ticks(s: &Schedules<MemoryStore>, agent: &Agent<MemoryStore>, name: &str) {
    for n in 1..=2 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
        let started = tokio::time::timeout(Duration::from_secs(600), start_held(agent)).await;
        let (next, running) = started.unwrap_or_else(|_| panic!("held tick {n} is let through"));
        assert!(!run_one_if_ready(agent).await, "held tick {n} runs alone");
        next.notify_one();
        running.await.unwrap().unwrap();
    }
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    assert!(run_one_if_ready(agent).await, "then Skip enqueues ticks again");
    assert!(unfinished(s, name).await.is_empty());
}

/// An Allow pass held before its insert; meanwhile the schedule changes to
/// Skip and a Skip pass enqueues the next tick and names it (`only_open`).
/// The late insert lands (that tick starts beside the other: a stall the
/// check cannot see) and its record is refused. The Skip tick ends; while
/// the late one runs, later passes must still see it.
#[tokio::test(start_paused = true)]
async fn a_late_insert_of_another_policy_is_not_hidden_from_skip() {
    let r = Race::new("l", Overlap::Allow).await;
    let (s, agent) = (&r.on_time, &r.agent);
    tokio::time::sleep(MINUTE).await;
    let pass = r.held_pass("cron", "insert").await;
    s.upsert(&minutely("l", Overlap::Skip)).await.unwrap();
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    r.release();
    pass.await.unwrap().unwrap();
    // Tick 1 (the late one) starts and runs on; tick 2 (Skip's) runs and ends.
    let both = unfinished(s, "l").await;
    assert_eq!(both.len(), 2, "{both:?}");
    let held_one = start_held(agent).await;
    complete_one(agent).await;
    assert_eq!(unfinished(s, "l").await, both[..1], "the late tick, the older, runs on");
    for _ in 0..2 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
    }
    let open = unfinished_while_held(s, "l", held_one).await;
    assert_eq!(open.len(), 1, "nothing enqueued while the late tick runs: {open:?}");
}

/// An Allow pass held before its insert while the schedule changes to Queue
/// and two ticks are enqueued held (an Allow tick still runs): when it goes
/// on, it lets through by the policy the definition has now, Queue, not by
/// the one it read: nothing is let through beside the Allow ticks.
#[tokio::test(start_paused = true)]
async fn a_late_allow_pass_lets_nothing_of_a_later_queue_period_through() {
    let r = Race::new("q", Overlap::Allow).await;
    let (s, agent) = (&r.on_time, &r.agent);
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    let first = start_held(agent).await;
    tokio::time::sleep(MINUTE).await;
    let pass = r.held_pass("cron", "insert").await;
    s.upsert(&minutely("q", Overlap::Queue)).await.unwrap();
    for _ in 0..2 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
    }
    r.release();
    pass.await.unwrap().unwrap();
    let still_held = s.queue().tasks(bson::doc! { "schedule": "q", "overlap_held": true }, None).await.unwrap();
    let (hold, running) = first;
    hold.notify_one();
    running.await.unwrap().unwrap();
    assert_eq!(still_held.len(), 2, "the Queue period's ticks wait for the Allow ticks");
}
