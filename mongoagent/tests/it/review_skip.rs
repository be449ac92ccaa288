//! Review: attacks on the schedules' overlap promises (`Overlap::Skip` and
//! its shortcut, the definition's `only_open`; `Overlap::Queue`), on the
//! memory store under paused time. Each test asserts the promise; each but
//! `wrong_types_fall_back_to_the_count` FAILED on the reviewed commit, and
//! was fixed:
//! - a pass that skipped for a tick it found unfinished recorded it as
//!   handled without naming it as the one that may run on (after one failed
//!   record, or with two schedulers at one tick and no fault at all): now a
//!   pass that checked names the one tick it found unfinished, and removes
//!   the mark when it found more;
//! - a resume or a change of the definition moved `since` past a tick whose
//!   record was lost: both now remove the mark, and the ticks read run from
//!   `last_tick`, not `since`;
//! - one schedule's bad `only_open` or `running` stopped every schedule:
//!   such a schedule is now skipped with a warning;
//! - a change to Queue let a held tick through beside a tick enqueued under
//!   another policy: with none let through yet, Queue now waits for those.
//!
//! Two more, documented rather than fixed (`Overlap`'s docs): a tick
//! cancelled while its handler runs counts as ended at once, and a Queue
//! tick revived by `requeue` runs beside the tick let through.

use std::time::Duration;

use bson::{doc, Bson};
use mongoagent::{
    schedule::{Overlap, Schedule, Schedules},
    Agent, NewTask,
};
use store_memory::MemoryStore;
use store_test::Intercepted;
use store_trait::{Key, Mutation, Store, Write};

use crate::schedule_support::{
    complete_one, memory, minutely, settled, start_held, ticks, unfinished_while_held, FailRecord, MINUTE,
};

/// FOUND, fixed. Tick 2 is enqueued and its record fails; the scheduler's retry
/// (its next pass, 50 ms later in `run`; a minute later here) finds tick 2
/// unfinished and "skips" it: it records `last_tick` = tick 2 but keeps
/// tick 1 as the one that may run on. From then on tick 2 was neither that
/// nor after `last_tick`: tick 4 started beside it.
#[tokio::test(start_paused = true)]
async fn a_skip_of_an_unrecorded_tick_forgets_it() {
    let store = memory();
    let failing: Intercepted<MemoryStore, FailRecord> = Intercepted::new(store.clone());
    let s = Schedules::new(failing.clone(), "cron").unwrap();
    s.upsert(&minutely("u", Overlap::Skip)).await.unwrap();
    let agent = Agent::builder(store.clone(), "u", "cron").ttl(Duration::from_secs(3600)).build().unwrap();
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    complete_one(&agent).await;
    tokio::time::sleep(MINUTE).await;
    *failing.0.lock().unwrap() = true;
    assert!(s.scheduler().pass().await.is_err(), "the record failed");
    *failing.0.lock().unwrap() = false;
    let held = start_held(&agent).await;
    // The retry, at tick 3: skipped (tick 2 runs), and tick 2 recorded as handled.
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    assert_eq!(ticks(&s, "u").await.len(), 2);
    // Tick 4: tick 2 still runs.
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    let un = unfinished_while_held(&s, "u", held).await;
    assert_eq!(un.len(), 1, "Skip: no tick enqueued while tick 2 runs, but: {un:?}");
}

/// FOUND, fixed, with no fault: two schedulers wake at tick 2. A inserts tick 2
/// and is slow to record it; B reads the schedule, finds tick 2 (unrecorded,
/// pending) unfinished, skips and records `last_tick` = tick 2 without
/// `last_task`; A's record (conditional on `last_tick` < tick 2) is then
/// rejected. Tick 2 is forgotten: tick 3 is enqueued while it runs.
#[tokio::test(start_paused = true)]
async fn two_schedulers_at_one_tick_forget_the_running_tick() {
    let r = settled("c").await;
    // Tick 2: A inserts it, and stalls before its record.
    tokio::time::sleep(MINUTE).await;
    let pass_a = r.held_pass("cron_schedules", "record").await;
    // B's pass at the same tick.
    r.on_time.scheduler().pass().await.unwrap();
    r.release();
    pass_a.await.unwrap().unwrap();
    assert_eq!(ticks(&r.on_time, "c").await.len(), 2);
    let held = start_held(&r.agent).await;
    tokio::time::sleep(MINUTE).await;
    r.on_time.scheduler().pass().await.unwrap();
    let un = unfinished_while_held(&r.on_time, "c", held).await;
    assert_eq!(un.len(), 1, "Skip: no tick enqueued while tick 2 runs, but: {un:?}");
}

/// FOUND, fixed. A scheduler inserts tick 2 and dies before its record (here: the
/// record fails and nobody retries); the schedule is paused and resumed.
/// `resume` moves `since` past tick 2, so the unrecorded ticks a settled pass
/// reads start after it: tick 3 is enqueued while tick 2 runs.
#[tokio::test(start_paused = true)]
async fn a_resume_after_a_lost_record_forgets_the_running_tick() {
    let store = memory();
    let failing: Intercepted<MemoryStore, FailRecord> = Intercepted::new(store.clone());
    let s = Schedules::new(failing.clone(), "cron").unwrap();
    s.upsert(&minutely("r", Overlap::Skip)).await.unwrap();
    let agent = Agent::builder(store.clone(), "r", "cron").ttl(Duration::from_secs(3600)).build().unwrap();
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    complete_one(&agent).await;
    tokio::time::sleep(MINUTE).await;
    *failing.0.lock().unwrap() = true;
    assert!(s.scheduler().pass().await.is_err(), "the record failed");
    *failing.0.lock().unwrap() = false;
    let held = start_held(&agent).await;
    assert!(s.pause("r").await.unwrap());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(s.resume("r").await.unwrap());
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    let un = unfinished_while_held(&s, "r", held).await;
    assert_eq!(un.len(), 1, "Skip: no tick enqueued while tick 2 runs, but: {un:?}");
}

/// FOUND, fixed, with no fault: an upsert (here only the task's data changes) lands
/// between a pass's insert of tick 2 and its record; the record, conditional
/// on the version it read, is rejected, and the upsert keeps
/// the mark and moves `since` past tick 2. Tick 3 was enqueued
/// while tick 2 runs.
#[tokio::test(start_paused = true)]
async fn an_upsert_racing_a_pass_forgets_the_running_tick() {
    let r = settled("v").await;
    tokio::time::sleep(MINUTE).await;
    let pass_a = r.held_pass("cron_schedules", "record").await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let changed = Schedule::every("v", MINUTE, NewTask::new("v", doc! {"x": 1})).unwrap();
    r.on_time.upsert(&changed).await.unwrap();
    r.release();
    pass_a.await.unwrap().unwrap();
    assert_eq!(ticks(&r.on_time, "v").await.len(), 2);
    let held = start_held(&r.agent).await;
    tokio::time::sleep(MINUTE).await;
    r.on_time.scheduler().pass().await.unwrap();
    let un = unfinished_while_held(&r.on_time, "v", held).await;
    assert_eq!(un.len(), 1, "Skip: no tick enqueued while tick 2 runs, but: {un:?}");
}

/// FOUND, fixed. A hand-edited `only_open: ""` on a settled schedule: the pass's
/// `Key::new("")` is a configuration error, which ends the pass (and `run`,
/// which stops on a non-retryable error) for every schedule of the
/// collection, where a schedule that cannot be parsed is only skipped.
#[tokio::test(start_paused = true)]
async fn an_empty_only_open_stops_no_schedule() {
    let store = memory();
    let s = Schedules::new(store.clone(), "cron").unwrap();
    s.upsert(&minutely("a-broken", Overlap::Skip)).await.unwrap();
    s.upsert(&minutely("b-fine", Overlap::Skip)).await.unwrap();
    let agent_a = Agent::builder(store.clone(), "a-broken", "cron").build().unwrap();
    let agent_b = Agent::builder(store.clone(), "b-fine", "cron").build().unwrap();
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    complete_one(&agent_a).await;
    complete_one(&agent_b).await;
    let coll = s.collection().clone();
    let w = Write::new(store_trait::Condition::Always, Mutation::new().set("only_open", ""));
    assert!(store.write(&coll, &Key::new("a-broken").unwrap(), &w).await.unwrap().is_applied());
    let handle = s.scheduler().spawn();
    tokio::time::sleep(MINUTE + Duration::from_secs(1)).await;
    let finished = handle.is_finished();
    let b_ticks = ticks(&s, "b-fine").await.len();
    let ended = handle.stop().await;
    assert!(!finished, "the scheduler keeps running, but it ended with {ended:?}");
    assert_eq!(b_ticks, 2, "the other schedule still ticks");
}

/// FOUND, fixed. A foreign `running` field (a double) on a Skip schedule: the pass
/// calls `let_through` for it, whose `Key::from_bson` fails, and the whole
/// scheduler stops.
#[tokio::test(start_paused = true)]
async fn a_foreign_running_field_stops_no_other_schedule() {
    let store = memory();
    let s = Schedules::new(store.clone(), "cron").unwrap();
    s.upsert(&minutely("a-broken", Overlap::Skip)).await.unwrap();
    s.upsert(&minutely("b-fine", Overlap::Skip)).await.unwrap();
    let coll = s.collection().clone();
    let w = Write::new(store_trait::Condition::Always, Mutation::new().set("running", 1.5_f64));
    assert!(store.write(&coll, &Key::new("a-broken").unwrap(), &w).await.unwrap().is_applied());
    let handle = s.scheduler().spawn();
    tokio::time::sleep(MINUTE + Duration::from_secs(1)).await;
    let finished = handle.is_finished();
    let b_ticks = ticks(&s, "b-fine").await.len();
    let ended = handle.stop().await;
    assert!(!finished, "the scheduler keeps running, but it ended with {ended:?}");
    assert_eq!(b_ticks, 1, "the other schedule still ticks");
}

/// HELD: wrong types for `last_task` and `only_open` fall back to the
/// count, which sees the running tick.
#[tokio::test(start_paused = true)]
async fn wrong_types_fall_back_to_the_count() {
    for (i, bad) in [
        doc! {"last_task": 42_i64, "only_open": 1.5_f64},
        doc! {"only_open": Bson::Null},
        doc! {"only_open": {"$gt": ""}},
    ]
    .into_iter()
    .enumerate()
    {
        let store = memory();
        let s = Schedules::new(store.clone(), "cron").unwrap();
        s.upsert(&minutely("t", Overlap::Skip)).await.unwrap();
        let agent = Agent::builder(store.clone(), "t", "cron").ttl(Duration::from_secs(3600)).build().unwrap();
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
        let held = start_held(&agent).await;
        let mut m = Mutation::new();
        for (k, v) in bad {
            m = m.set(k.as_str(), v);
        }
        let w = Write::new(store_trait::Condition::Always, m);
        assert!(store.write(s.collection(), &Key::new("t").unwrap(), &w).await.unwrap().is_applied());
        tokio::time::sleep(MINUTE).await;
        s.scheduler().pass().await.unwrap();
        let un = unfinished_while_held(&s, "t", held).await;
        assert_eq!(un.len(), 1, "case {i}: {un:?}");
    }
}

/// FOUND, fixed (Queue). Tick 1 was enqueued under Skip (the default) and runs; the
/// schedule changes to Queue; tick 2 is enqueued held, and `let_through`,
/// finding no `running`, lets it through at once: tick 2 runs beside tick 1.
/// (A change to Skip waits for the ticks Allow enqueued; a change to Queue
/// waits for nothing.)
#[tokio::test(start_paused = true)]
async fn a_change_to_queue_lets_a_tick_beside_the_running_one() {
    let store = memory();
    let s = Schedules::new(store.clone(), "cron").unwrap();
    s.upsert(&minutely("sq", Overlap::Skip)).await.unwrap();
    let agent = Agent::builder(store.clone(), "sq", "cron").ttl(Duration::from_secs(3600)).build().unwrap();
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    let (hold, running) = start_held(&agent).await;
    s.upsert(&minutely("sq", Overlap::Queue)).await.unwrap();
    tokio::time::sleep(MINUTE).await;
    s.scheduler().pass().await.unwrap();
    let other = Agent::builder(store.clone(), "sq", "cron").ttl(Duration::from_secs(3600)).build().unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), start_held(&other)).await;
    hold.notify_one();
    let _ = running.await;
    if let Ok((h2, r2)) = second {
        h2.notify_one();
        let _ = r2.await;
        panic!("Queue: tick 2 was let through while tick 1 (enqueued under Skip) ran");
    }
}
