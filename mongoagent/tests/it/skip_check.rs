//! The `Overlap::Skip` check on the memory store under paused time: once a
//! pass has checked every tick, later passes read only the tick it named
//! and those from `last_tick` on, by `_id`, however many ended ticks are
//! kept; and that shortcut never lets a tick start beside an unfinished one
//! it could miss (a tick whose record failed, a tick enqueued under
//! `Overlap::Allow` before a change to `Skip`). More attacks on it, from an
//! outside review, are in `review_skip.rs`.

use std::sync::Mutex;
use std::time::Duration;

use mongoagent::schedule::{Overlap, Schedules};
use mongoagent::{Agent, Processed};
use store_memory::MemoryStore;
use store_test::{Call, Intercept, Intercepted};
use store_trait::{Collection, StoreResult};

use crate::schedule_support::{
    complete_one, memory, minutely, settled, start_held, ticks, unfinished_while_held, FailRecord, MINUTE,
};

/// Records the schedule's checks on the queue: how many ticks each read by
/// `_id` (`None`: every tick of the schedule).
#[derive(Debug, Default)]
struct Checks(Mutex<Vec<Option<usize>>>);

#[async_trait::async_trait]
impl<S: store_trait::Store> Intercept<S> for Checks {
    async fn before(&self, coll: Option<&Collection>, call: Call<'_>) -> StoreResult<()> {
        if let (Some("cron"), Call::Find(q)) = (coll.map(Collection::as_str), call) {
            if q.filter.contains_key("schedule") {
                self.0.lock().unwrap().push(q.keys.as_ref().map(Vec::len));
            }
        }
        Ok(())
    }
}

/// A minute-by-minute Skip schedule whose ticks all end: its first check
/// reads the schedule's unfinished ticks, every later one a few ids, while the
/// ended ticks kept grow to a hundred; and each tick is still enqueued.
#[tokio::test(start_paused = true)]
async fn a_settled_schedule_reads_a_few_ticks_by_id() {
    let store = memory();
    let counting: Intercepted<MemoryStore, Checks> = Intercepted::new(store.clone());
    let s = Schedules::new(counting.clone(), "cron").unwrap();
    s.upsert(&minutely("m", Overlap::Skip)).await.unwrap();
    let agent = Agent::builder(store.clone(), "m", "cron").build().unwrap();
    for _ in 0..100 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
        complete_one(&agent).await;
    }
    let checks = counting.0.lock().unwrap().clone();
    assert_eq!(ticks(&s, "m").await.len(), 100, "every tick ran");
    assert_eq!(checks.len(), 100, "one check a pass: {checks:?}");
    assert_eq!(checks[0], None, "the first check reads the schedule's ticks");
    assert!(checks[1..].iter().all(|k| matches!(k, Some(n) if *n <= 2)), "later ones a few ids: {checks:?}");
}

/// A tick enqueued by a pass whose record of it failed, and still running,
/// is waited for: the next tick, a minute later, is skipped.
#[tokio::test(start_paused = true)]
async fn an_unrecorded_running_tick_is_waited_for() {
    let store = memory();
    let failing: Intercepted<MemoryStore, FailRecord> = Intercepted::new(store.clone());
    let s = Schedules::new(failing.clone(), "cron").unwrap();
    s.upsert(&minutely("u", Overlap::Skip)).await.unwrap();
    let agent = Agent::builder(store.clone(), "u", "cron").ttl(Duration::from_secs(600)).build().unwrap();
    // Tick 1 runs and ends: the schedule is settled.
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    complete_one(&agent).await;
    // Tick 2 is enqueued, its record fails, and it starts (and keeps running).
    tokio::time::sleep(MINUTE).await;
    *failing.0.lock().unwrap() = true;
    assert!(s.scheduler().pass().await.is_err(), "the record failed");
    *failing.0.lock().unwrap() = false;
    let (hold, running) = start_held(&agent).await;
    assert_eq!(ticks(&s, "u").await.len(), 2);
    // A minute later: tick 3 is due, and tick 2 has not ended.
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    assert_eq!(ticks(&s, "u").await.len(), 2, "tick 3 was skipped while tick 2 runs");
    hold.notify_one();
    assert!(matches!(running.await.unwrap().unwrap(), Some(Processed::Completed(_))));
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    assert_eq!(ticks(&s, "u").await.len(), 3, "tick 4 runs once tick 2 ended");
}

/// A tick enqueued under `Overlap::Allow` and still running when the
/// schedule changes to `Skip` is waited for, though the schedule had been
/// settled under `Skip` before and the last tick enqueued has ended.
#[tokio::test(start_paused = true)]
async fn a_change_to_skip_waits_for_the_ticks_allow_enqueued() {
    let store = memory();
    let s = Schedules::new(store.clone(), "cron").unwrap();
    s.upsert(&minutely("a", Overlap::Skip)).await.unwrap();
    let agent = Agent::builder(store.clone(), "a", "cron").build().unwrap();
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    complete_one(&agent).await;
    // Under Allow, two ticks are enqueued and not run.
    s.upsert(&minutely("a", Overlap::Allow)).await.unwrap();
    for _ in 0..2 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
    }
    assert_eq!(ticks(&s, "a").await.len(), 3);
    // The first of them runs on; the second (the last enqueued) ends.
    let (hold, running) = start_held(&agent).await;
    complete_one(&agent).await;
    // Back to Skip: nothing starts while the first runs.
    s.upsert(&minutely("a", Overlap::Skip)).await.unwrap();
    for _ in 0..3 {
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
    }
    assert_eq!(ticks(&s, "a").await.len(), 3, "no tick while an Allow tick runs");
    hold.notify_one();
    assert!(matches!(running.await.unwrap().unwrap(), Some(Processed::Completed(_))));
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    assert_eq!(ticks(&s, "a").await.len(), 4, "the next tick once it ended");
}

/// A pass that reached the schedule late (held before its check) while
/// another, later, enqueued and recorded a newer tick, reads the schedule
/// again before its check, and enqueues nothing beside that tick.
#[tokio::test(start_paused = true)]
async fn a_pass_that_reaches_the_schedule_late_reads_it_again() {
    let r = settled("x").await;
    // B's pass at tick 2 is held before it reads the schedule again.
    tokio::time::sleep(MINUTE).await;
    let pass_b = r.held_pass("cron_schedules", "get").await;
    // C, a minute later, enqueues tick 3, which starts.
    tokio::time::sleep(MINUTE).await;
    r.on_time.scheduler().pass().await.unwrap();
    let held = start_held(&r.agent).await;
    r.release();
    pass_b.await.unwrap().unwrap();
    let open = unfinished_while_held(&r.on_time, "x", held).await;
    assert_eq!(open.len(), 1, "nothing enqueued beside tick 3: {open:?}");
}

/// A pass held between its check and its insert (a stall the check cannot
/// see) inserts tick 2 after another pass enqueued and recorded tick 3: its
/// record is refused, and it withdraws the schedule's `only_open`, so that
/// while tick 2 runs, later passes (which would read only tick 3 and what
/// follows) read every unfinished tick and skip.
#[tokio::test(start_paused = true)]
async fn a_tick_inserted_late_is_not_hidden_from_later_passes() {
    let r = settled("y").await;
    tokio::time::sleep(MINUTE).await;
    let pass_b = r.held_pass("cron", "insert").await;
    // C enqueues tick 3, which runs and ends.
    tokio::time::sleep(MINUTE).await;
    r.on_time.scheduler().pass().await.unwrap();
    complete_one(&r.agent).await;
    // B's insert of tick 2 lands; tick 2 starts.
    r.release();
    pass_b.await.unwrap().unwrap();
    let held = start_held(&r.agent).await;
    for _ in 0..2 {
        tokio::time::sleep(MINUTE).await;
        r.on_time.scheduler().pass().await.unwrap();
    }
    let open = unfinished_while_held(&r.on_time, "y", held).await;
    assert_eq!(open.len(), 1, "nothing enqueued while tick 2 runs: {open:?}");
}

/// A pass that read a schedule which is then deleted and created again under
/// its name (version 1 again) records nothing on the new one: its record is
/// for the definition it read.
#[tokio::test(start_paused = true)]
async fn a_pass_of_a_deleted_schedule_records_nothing_on_its_successor() {
    let r = settled("z").await;
    tokio::time::sleep(MINUTE).await;
    let pass = r.held_pass("cron", "insert").await;
    assert!(r.on_time.delete("z").await.unwrap());
    tokio::time::sleep(Duration::from_millis(10)).await;
    r.on_time.upsert(&minutely("z", Overlap::Skip)).await.unwrap();
    r.release();
    pass.await.unwrap().unwrap();
    let now = r.on_time.get("z").await.unwrap().unwrap();
    assert_eq!((now.version, now.last_tick, now.last_task), (1, None, None), "the new schedule is untouched");
}
