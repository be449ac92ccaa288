//! Schedules on the memory store under paused time, from a chosen date on a
//! [`TestClock`]: a simulated week of five scheduler processes that crash and
//! restart, daylight-saving transitions in Europe/Berlin, an outage per
//! missed-tick policy, the overlap policy. The suite at the end runs on every
//! backend, the real server included, with a one-second interval.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::doc;
use mongoagent::{
    schedule::{Missed, Overlap, Schedule, Schedules, Upserted},
    Agent, NewTask, Task,
};
use store_memory::MemoryStore;
use store_test::Harness;
use store_test::TestClock;
use store_trait::{Store, StoreTime};

use crate::hold_back::{HoldBack, Op};

fn at(rfc3339: &str) -> StoreTime {
    StoreTime::from_millis(chrono::DateTime::parse_from_rfc3339(rfc3339).unwrap().timestamp_millis())
}

fn memory_at(start: &str) -> (MemoryStore, TestClock) {
    let clock = TestClock::starting_at(at(start));
    (MemoryStore::builder().clock(clock.clone()).build(), clock)
}

/// Ticks of the schedule's tasks (their `scheduled_for`), checking each task's
/// id and run_at against it.
async fn ticks_of<S: Store + Clone>(s: &Schedules<S>, name: &str) -> Vec<i64> {
    let mut out: Vec<i64> = Vec::new();
    for r in s.queue().tasks(doc! { "schedule": name }, None).await.unwrap() {
        let tick = r.data().get_datetime("scheduled_for").unwrap().timestamp_millis();
        assert_eq!(r.key().to_string(), format!("sched/{name}/{tick}"), "the id is derived from name and tick");
        out.push(tick);
    }
    out.sort_unstable();
    out
}

fn run_at_of(d: &bson::Document) -> i64 {
    d.get_datetime("run_at").unwrap().timestamp_millis()
}

/// Advances paused time by `d` (every sleeping task runs as its timers fire).
async fn pass_time(d: Duration) {
    tokio::time::sleep(d).await;
}

/// One process's time up: which, from, until (store clock, epoch ms).
type Up = (usize, i64, Option<i64>);

const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;

/// Five scheduler processes over a simulated week, each crashing (its
/// scheduler dropped at a random instant, mid-pass included, with store latency)
/// and restarting after a random time; the store also fails some writes after
/// applying them. Checked at the end:
/// - a five-minute interval with `Missed::All` has every tick exactly once, even
///   across the times when all five were down;
/// - an hourly cron with `Missed::Skip` has each tick at most once, every tick
///   some process was up for, and none that no process was up for within its
///   starting deadline;
/// - each task runs at its tick and records its schedule.
#[tokio::test(start_paused = true)]
async fn a_week_of_five_crashing_schedulers() {
    let (store, clock) = memory_at("2026-03-02T00:00:00.250Z");
    let start = clock.now_ms();
    store.faults().set_latency(Duration::from_millis(3));
    let s = Schedules::new(store.clone(), "jobs").unwrap();
    let five = Schedule::every("five", Duration::from_secs(300), NewTask::new("w", doc! {"k": 1}))
        .unwrap()
        .overlap(Overlap::Allow)
        .missed(Missed::All(u32::MAX));
    let hourly = Schedule::cron("hourly", "0 0 * * * *", "Europe/Berlin", NewTask::new("w", doc! {}))
        .unwrap()
        .overlap(Overlap::Allow);
    assert_eq!(s.upsert(&five).await.unwrap(), Upserted::Created);
    assert_eq!(s.upsert(&hourly).await.unwrap(), Upserted::Created);

    let end = start + 7 * 24 * HOUR;
    let up: Arc<Mutex<Vec<Up>>> = Arc::default();
    let mut procs = Vec::new();
    for p in 0..5_usize {
        let (s, clock, up, store) = (s.clone(), clock.clone(), up.clone(), store.clone());
        procs.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(7 + p as u64);
            loop {
                let now = clock.now_ms();
                if now >= end {
                    break;
                }
                let handle = s.scheduler().poll_every(Duration::from_secs(30)).spawn();
                let i = {
                    let mut up = up.lock().unwrap();
                    up.push((p, now, None));
                    up.len() - 1
                };
                // Up for 10 minutes to half a day; a third of the crashes land right
                // on a tick (mid-pass, with the store's latency).
                let mut life = rng.i64(10 * MIN..12 * HOUR);
                if rng.u8(0..3) == 0 {
                    let t = now + life;
                    life = (t - t.rem_euclid(5 * MIN)) + rng.i64(0..12) - now;
                }
                pass_time(Duration::from_millis(life.max(1) as u64)).await;
                // Store faults are retried: a scheduler never dies of them.
                assert!(!handle.is_finished(), "process {p}'s scheduler ended by itself");
                drop(handle);
                let down = clock.now_ms();
                up.lock().unwrap()[i].2 = Some(down);
                if rng.u8(0..4) == 0 {
                    store.faults().fail_next_after_apply(1);
                }
                pass_time(Duration::from_millis(rng.u64(1_000..(12 * HOUR) as u64))).await;
            }
        }));
    }
    for p in procs {
        p.await.unwrap();
    }
    // A last scheduler catches up on whatever fell in the final outage.
    let last = clock.now_ms();
    s.scheduler().pass().await.unwrap();

    let five_ticks = ticks_of(&s, "five").await;
    let first = start + (5 * MIN - start.rem_euclid(5 * MIN));
    let expected: Vec<i64> = (0..).map(|k| first + k * 5 * MIN).take_while(|&t| t <= last).collect();
    assert_eq!(five_ticks.len(), expected.len(), "every five-minute tick once");
    assert_eq!(five_ticks, expected);

    let ups = up.lock().unwrap().clone();
    let alive_within = |from: i64, to: i64| ups.iter().any(|&(_, a, b)| a <= to && b.unwrap_or(i64::MAX) >= from);
    let hourly_ticks: BTreeSet<i64> = ticks_of(&s, "hourly").await.into_iter().collect();
    let (mut required, mut run) = (0, 0);
    let mut t = start + (HOUR - start.rem_euclid(HOUR));
    while t <= end {
        if ups.iter().any(|&(_, a, b)| a < t - 1_000 && b.unwrap_or(i64::MAX) > t + 1_000) {
            required += 1;
            assert!(hourly_ticks.contains(&t), "tick {t} fell while a scheduler was up");
        }
        if !alive_within(t - 1_000, t + MIN + 1_000) {
            assert!(!hourly_ticks.contains(&t), "tick {t} was missed by every scheduler: Missed::Skip");
        }
        run += i32::from(hourly_ticks.contains(&t));
        t += HOUR;
    }
    assert!(required > 80 && run >= required, "{required} required, {run} run");
    assert!(hourly_ticks.iter().all(|t| t.rem_euclid(HOUR) == 0));
    // Outages where every process was down happened, or the test proves little.
    let all_down = (0..7 * 24).any(|h| !alive_within(start + h * HOUR + 1_000, start + h * HOUR + 1_001));
    assert!(all_down, "the crashes never took every scheduler down at once: choose other seeds");

    for r in s.queue().tasks(doc! {}, None).await.unwrap() {
        let d = r.data();
        assert_eq!(run_at_of(d), d.get_datetime("scheduled_for").unwrap().timestamp_millis());
        assert_eq!(d.get_str("agent_name").unwrap(), "w");
    }
    let info = s.get("five").await.unwrap().unwrap();
    assert_eq!(info.last_tick.map(StoreTime::as_millis), expected.last().copied());
    assert_eq!(info.version, 1);
}

trait NowMs {
    fn now_ms(&self) -> i64;
}

impl NowMs for TestClock {
    fn now_ms(&self) -> i64 {
        store_trait::Clock::now(self).as_millis()
    }
}

/// Runs one scheduler from the clock's current time for `d`.
async fn run_for<S: Store + Clone>(s: &Schedules<S>, d: Duration) {
    let h = s.scheduler().spawn();
    pass_time(d).await;
    h.stop().await.unwrap();
}

/// Spring forward (29 March 2026, 02:00 CET becomes 03:00 CEST) and fall back
/// (25 October 2026, 03:00 CEST becomes 02:00 CET) in Europe/Berlin, per
/// croner's documented rules: a fixed-time job whose time falls in the gap runs
/// right after it, and once in the repeated hour; a wildcard job skips the gap's
/// times and runs in both passes of the repeated hour.
#[tokio::test(start_paused = true)]
async fn daylight_saving_in_berlin() {
    for (start, fixed_expected, wild_count) in [
        (
            "2026-03-28T00:00:00Z",
            // 02:30 CET (01:30Z); then 03:00 CEST right after the gap (01:00Z); then 02:30 CEST (00:30Z).
            ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
            // The 23-hour day: 46 half-hours.
            46,
        ),
        (
            "2026-10-24T00:00:00Z",
            // 02:30 CEST (00:30Z); on the 25th only the first 02:30 (00:30Z, not 01:30Z); then 02:30 CET (01:30Z).
            ["2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
            // The 25-hour day: 50 half-hours.
            50,
        ),
    ] {
        let (store, _clock) = memory_at(start);
        let s = Schedules::new(store, "jobs").unwrap();
        let task = || NewTask::new("w", doc! {});
        s.upsert(&Schedule::cron("fixed", "0 30 2 * * *", "Europe/Berlin", task()).unwrap().overlap(Overlap::Allow))
            .await
            .unwrap();
        s.upsert(&Schedule::cron("wild", "0 */30 * * * *", "Europe/Berlin", task()).unwrap().overlap(Overlap::Allow))
            .await
            .unwrap();
        run_for(&s, Duration::from_secs(3 * 24 * 3600)).await;
        let fixed: Vec<i64> = fixed_expected.iter().map(|t| at(t).as_millis()).collect();
        assert_eq!(ticks_of(&s, "fixed").await, fixed, "from {start}");
        // The transition day, in local time: from local midnight to the next.
        let wild = ticks_of(&s, "wild").await;
        let day = start.replace("24T", "25T").replace("28T", "29T");
        let local_midnight = at(&day).as_millis() - if start.starts_with("2026-03") { HOUR } else { 2 * HOUR };
        let next_midnight = local_midnight + 24 * HOUR + if start.starts_with("2026-03") { -HOUR } else { HOUR };
        let on_the_day = wild.iter().filter(|&&t| t >= local_midnight && t < next_midnight).count();
        assert_eq!(on_the_day, wild_count, "from {start}: {wild:?}");
        assert!(wild.windows(2).all(|w| w[1] - w[0] == 30 * MIN), "half-hours in real time, none doubled or lost");
    }
}

/// The one scheduler is down from 10:30 to 13:30 under an hourly interval:
/// the ticks at 11:00, 12:00 and 13:00 are missed (older than the 60-second
/// starting deadline when noticed). Per policy: none run, the latest once, the
/// latest two, or all three; 10:00 and 14:00 run on time in every case.
#[tokio::test(start_paused = true)]
async fn a_three_hour_outage_per_missed_tick_policy() {
    for (policy, caught_up) in [
        (Missed::Skip, vec![]),
        (Missed::Once, vec!["13"]),
        (Missed::All(2), vec!["12", "13"]),
        (Missed::All(10), vec!["11", "12", "13"]),
    ] {
        let (store, clock) = memory_at("2026-05-04T09:59:00Z");
        let s = Schedules::new(store, "jobs").unwrap();
        let hourly = Schedule::every("hourly", Duration::from_secs(3600), NewTask::new("w", doc! {}))
            .unwrap()
            .overlap(Overlap::Allow)
            .missed(policy);
        s.upsert(&hourly).await.unwrap();
        run_for(&s, Duration::from_secs(31 * 60)).await; // to 10:30
        pass_time(Duration::from_secs(3 * 3600)).await; // down until 13:30
        assert_eq!(clock.now_ms(), at("2026-05-04T13:30:00Z").as_millis());
        run_for(&s, Duration::from_secs(31 * 60)).await; // to 14:01
        let mut expected = vec!["10".to_owned()];
        expected.extend(caught_up.iter().map(|h| (*h).to_owned()));
        expected.push("14".into());
        let expected: Vec<i64> = expected.iter().map(|h| at(&format!("2026-05-04T{h}:00:00Z")).as_millis()).collect();
        assert_eq!(ticks_of(&s, "hourly").await, expected, "{policy:?}");
        let info = s.get("hourly").await.unwrap().unwrap();
        assert_eq!(info.last_tick, Some(at("2026-05-04T14:00:00Z")), "missed ticks are recorded as handled");
        assert_eq!(info.next_tick, Some(at("2026-05-04T15:00:00Z")));
    }
}

/// Every minute, with a handler that takes 150 s and agents that would run
/// several at once. With `Overlap::Skip` a tick whose previous task has not
/// ended is skipped, and no two runs ever overlap; with `Overlap::Queue` every
/// tick's task is enqueued and they run one after another, in tick order (with
/// change notifications and without); with `Overlap::Allow` they overlap.
#[tokio::test(start_paused = true)]
async fn the_overlap_policy_holds() {
    for (policy, push) in
        [(Overlap::Skip, true), (Overlap::Allow, true), (Overlap::Queue, true), (Overlap::Queue, false)]
    {
        let clock = TestClock::starting_at(at("2026-06-01T12:00:30Z"));
        let store = MemoryStore::builder().clock(clock.clone()).change_streams(push).build();
        let s = Schedules::new(store.clone(), "jobs").unwrap();
        let sched =
            Schedule::every("slow", Duration::from_secs(60), NewTask::new("slow", doc! {})).unwrap().overlap(policy);
        s.upsert(&sched).await.unwrap();
        let active = Arc::new(Mutex::new((0_u32, 0_u32)));
        let runs: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
        let order: Arc<Mutex<Vec<(i64, i64)>>> = Arc::default();
        let agent =
            Agent::builder(store.clone(), "slow", "jobs").concurrency(4).ttl(Duration::from_secs(20)).build().unwrap();
        let handler = {
            let (active, runs, order, clock) = (active.clone(), runs.clone(), order.clone(), clock.clone());
            move |t: Task| {
                let (active, runs, order, clock) = (active.clone(), runs.clone(), order.clone(), clock.clone());
                async move {
                    *runs.lock().unwrap().entry(t.id().to_string()).or_default() += 1;
                    let tick = t.data().get_datetime("scheduled_for").unwrap().timestamp_millis();
                    order.lock().unwrap().push((tick, clock.now_ms()));
                    {
                        let mut a = active.lock().unwrap();
                        a.0 += 1;
                        a.1 = a.1.max(a.0);
                    }
                    tokio::time::sleep(Duration::from_secs(150)).await;
                    active.lock().unwrap().0 -= 1;
                    true
                }
            }
        };
        let work = {
            let agent = agent.clone();
            tokio::spawn(async move { agent.work(handler).await })
        };
        run_for(&s, Duration::from_secs(20 * 60)).await;
        agent.shutdown();
        work.await.unwrap().unwrap();
        let ticks = ticks_of(&s, "slow").await;
        let max_active = active.lock().unwrap().1;
        assert!(runs.lock().unwrap().values().all(|&n| n == 1), "each task ran once: {runs:?}");
        match policy {
            Overlap::Skip => {
                assert_eq!(max_active, 1, "runs never overlap");
                // A run takes 150 s: the two ticks after each run's tick are skipped.
                assert!(ticks.windows(2).all(|w| w[1] - w[0] == 3 * MIN), "{ticks:?}");
                assert!((6..=7).contains(&ticks.len()), "{ticks:?}");
            }
            Overlap::Queue => {
                assert_eq!(max_active, 1, "runs never overlap (push: {push})");
                assert_eq!(ticks.len(), 20, "every tick is enqueued: {ticks:?}");
                let (order, starts): (Vec<i64>, Vec<i64>) = order.lock().unwrap().iter().copied().unzip();
                assert_eq!(order, ticks[..order.len()].to_vec(), "held ticks run one after another, in order");
                // Each run takes 150 s and the next starts when it ends (push), or
                // within a poll of the scheduler (5 s) without notifications.
                let slack = if push { 1_000 } else { 6_000 };
                assert!(starts.windows(2).all(|w| w[1] - w[0] <= 150_000 + slack), "push: {push}, {starts:?}");
                assert!(order.len() >= 7, "{order:?}");
            }
            _ => {
                assert!(max_active >= 3, "runs overlap: {max_active}");
                assert_eq!(ticks.len(), 20, "{ticks:?}");
            }
        }
    }
}

/// `last_tick` only moves forward: a pass that read the clock before a tick
/// and writes after another pass recorded that tick leaves it alone (else the
/// next pass plans the tick again, and runs it twice once its task was
/// collected). Store calls take 5 ms; a scheduler of every schedule, whose
/// pass writes "q" only after its work on "a", reads the clock 5 ms before a
/// tick; a scheduler of "q" alone starts 0 to 39 ms later.
#[tokio::test(start_paused = true)]
async fn last_tick_never_moves_back() {
    for offset in 0..40 {
        let (store, _clock) = memory_at("2026-05-04T10:00:00Z");
        let s = Schedules::new(store.clone(), "jobs").unwrap();
        for (name, overlap) in [("a", Overlap::Skip), ("q", Overlap::Allow)] {
            let every_second = Schedule::every(name, Duration::from_secs(1), NewTask::new(name, doc! {})).unwrap();
            s.upsert(&every_second.overlap(overlap)).await.unwrap();
        }
        s.queue().ensure_indexes().await.unwrap();
        tokio::time::sleep(Duration::from_millis(4_985)).await;
        store.faults().set_latency(Duration::from_millis(5));
        let all = tokio::spawn({
            let all = s.scheduler();
            async move { all.pass().await }
        });
        tokio::time::sleep(Duration::from_millis(offset)).await;
        s.scheduler().only("q").pass().await.unwrap();
        all.await.unwrap().unwrap();
        store.faults().set_latency(Duration::ZERO);
        let newest = *ticks_of(&s, "q").await.last().unwrap();
        let last_tick = s.get("q").await.unwrap().unwrap().last_tick.unwrap();
        assert_eq!(last_tick.as_millis(), newest, "the scheduler of q alone started {offset} ms later");
    }
}

/// A held tick cancelled while it waits its turn never runs, and is not
/// waiting any more: a cancel ends its hold (`cancel.rs`), so the overlap
/// policy never lets it through (`ready: true` on an ended task). A claim
/// takes only tasks not ended besides: with the hold kept and without that
/// clause of the claim filter, the cancelled tick runs; with the hold kept,
/// a cancelled tick is made ready.
#[tokio::test(start_paused = true)]
async fn a_held_tick_cancelled_while_it_waits_never_runs() {
    let (store, _clock) = memory_at("2026-05-04T10:00:00.500Z");
    let s = Schedules::new(store.clone(), "jobs").unwrap();
    let sched =
        Schedule::every("q", Duration::from_secs(1), NewTask::new("q", doc! {})).unwrap().overlap(Overlap::Queue);
    s.upsert(&sched).await.unwrap();
    let scheduler = s.scheduler();
    // A tick a second: the first is let through, the next two are held.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        scheduler.pass().await.unwrap();
    }
    let ticks = ticks_of(&s, "q").await;
    assert_eq!(ticks.len(), 3, "{ticks:?}");
    let held = s.queue().cancel(doc! { "overlap_held": true }).await.unwrap();
    assert_eq!(held.len(), 2, "the two held ticks are cancelled");
    let agent = Agent::builder(store.clone(), "q", "jobs").build().unwrap();
    let ran: Arc<Mutex<Vec<String>>> = Arc::default();
    let handler = {
        let ran = ran.clone();
        move |t: Task| {
            ran.lock().unwrap().push(t.id().to_string());
            async { true }
        }
    };
    assert!(agent.process(handler.clone()).await.unwrap().is_some(), "the tick let through runs");
    let jobs = store_trait::Collection::new("jobs").unwrap();
    for _ in 0..2 {
        scheduler.pass().await.unwrap();
        assert_eq!(agent.process(handler.clone()).await.unwrap(), None, "a cancelled tick is never claimed");
        let cancelled = store.find(&jobs, &store_trait::Query::eq(doc! { "cancelled": true })).await.unwrap();
        assert_eq!(cancelled.len(), 2);
        for t in &cancelled {
            assert_eq!(t.get_bool("ready"), Some(false), "a cancelled tick let through: {:?}", t.data());
        }
    }
    assert_eq!(ran.lock().unwrap().len(), 1, "ran {:?}", ran.lock().unwrap());
}

/// A scheduler pass over `store` (of the "jobs" schedules) that another
/// process runs, started now and held back at its first write that sets
/// `field`: returns once it waits there; [`HoldBack::open`] lets it go on.
async fn a_pass_held_at_its_write_of(
    store: &MemoryStore,
    field: &'static str,
) -> (HoldBack<MemoryStore>, tokio::task::JoinHandle<Result<(), mongoagent::AgentError>>) {
    let held = HoldBack::new(store.clone());
    let other = Schedules::new(held.clone(), "jobs").unwrap().scheduler();
    held.hold_next(move |_, op| matches!(op, Op::Write(w) if w.mutation.set.contains_key(field)));
    let pass = tokio::spawn(async move { other.pass().await.map(drop) });
    held.reached().await;
    (held, pass)
}

/// One held tick at a time across schedulers: under [`Overlap::Queue`] a
/// pass moves the schedule's `running` from an ended tick to the next by a
/// compare-and-set (`Schedules::let_through`). Here scheduler B read
/// `running` (tick 1, ended) and its move to tick 2 is held back while
/// scheduler A lets tick 2 through, tick 2 runs and ends, and A lets tick 3
/// through. B's stale move then lands: without the compare-and-set it sets
/// `running` back to tick 2, which has ended, and the next pass lets tick 4
/// through while tick 3 has not run.
#[tokio::test(start_paused = true)]
async fn a_stale_let_through_never_lets_a_second_tick_out() {
    let (store, _clock) = memory_at("2026-05-04T10:00:00.500Z");
    let a = Schedules::new(store.clone(), "jobs").unwrap();
    let sched =
        Schedule::every("q", Duration::from_secs(1), NewTask::new("q", doc! {})).unwrap().overlap(Overlap::Queue);
    a.upsert(&sched).await.unwrap();
    // A tick a second: the first is let through, the next three are held.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        a.scheduler().pass().await.unwrap();
    }
    let agent = Agent::builder(store.clone(), "q", "jobs").build().unwrap();
    let run_one = || agent.process(|_: Task| async { true });
    assert!(run_one().await.unwrap().is_some(), "tick 1 runs");
    let (held, stale) = a_pass_held_at_its_write_of(&store, "running").await;
    a.scheduler().pass().await.unwrap();
    assert!(run_one().await.unwrap().is_some(), "tick 2 runs");
    a.scheduler().pass().await.unwrap();
    held.open();
    stale.await.unwrap().unwrap();
    a.scheduler().pass().await.unwrap();
    let out: Vec<String> = a
        .queue()
        .tasks(doc! { "schedule": "q" }, None)
        .await
        .unwrap()
        .iter()
        .filter(|t| t.get_bool("complete") != Some(true) && t.get_bool("overlap_held") != Some(true))
        .map(|t| t.key().to_string())
        .collect();
    let tick = |s: u32| format!("sched/q/{}", at(&format!("2026-05-04T10:00:0{s}Z")).as_millis());
    assert_eq!(out, vec![tick(3)], "let through and not ended: only tick 3");
}

/// A pass records `last_tick` only over the definition it read (the version
/// in `scheduler.rs`'s write condition). Here a pass read an every-second
/// schedule and its record of tick 5 is held back while the schedule is
/// changed to a one-off tick at 4.5, due already: the change keeps
/// `last_tick` (1), so the one-off tick is to run. Without the version in the
/// condition the stale pass records 5 over the new definition, and the
/// one-off tick, older than that, never runs.
#[tokio::test(start_paused = true)]
async fn a_pass_over_an_old_definition_does_not_record_its_tick_on_the_new_one() {
    let (store, _clock) = memory_at("2026-05-04T10:00:00Z");
    let a = Schedules::new(store.clone(), "jobs").unwrap();
    let task = NewTask::new("s", doc! {});
    a.upsert(&Schedule::every("s", Duration::from_secs(1), task.clone()).unwrap().overlap(Overlap::Allow))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.scheduler().pass().await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (held, stale) = a_pass_held_at_its_write_of(&store, "last_tick").await;
    let once = at("2026-05-04T10:00:04.500Z");
    let changed = a.upsert(&Schedule::at("s", once, task).unwrap().overlap(Overlap::Allow)).await.unwrap();
    assert!(matches!(changed, Upserted::Changed(2)), "{changed:?}");
    held.open();
    stale.await.unwrap().unwrap();
    a.scheduler().pass().await.unwrap();
    let ticks = ticks_of(&a, "s").await;
    assert!(ticks.contains(&once.as_millis()), "the one-off tick never ran: {ticks:?}");
}

/// Paused for two hours under an hourly interval with `Missed::All`: the ticks
/// that fell while paused are not run after resuming; a changed definition
/// (every 30 minutes) starts from the change, without backfilling.
#[tokio::test(start_paused = true)]
async fn pause_resume_and_a_changed_definition() {
    let (store, _clock) = memory_at("2026-05-04T09:59:00Z");
    let s = Schedules::new(store, "jobs").unwrap();
    let task = || NewTask::new("w", doc! {});
    let hourly = Schedule::every("h", Duration::from_secs(3600), task())
        .unwrap()
        .overlap(Overlap::Allow)
        .missed(Missed::All(10));
    s.upsert(&hourly).await.unwrap();
    let h = s.scheduler().spawn();
    pass_time(Duration::from_secs(30 * 60)).await; // 10:29
    assert!(s.pause("h").await.unwrap());
    pass_time(Duration::from_secs(2 * 3600)).await; // 12:29
    assert!(s.resume("h").await.unwrap());
    pass_time(Duration::from_secs(3600)).await; // 13:29
    let half = Schedule::every("h", Duration::from_secs(1800), task())
        .unwrap()
        .overlap(Overlap::Allow)
        .missed(Missed::All(10));
    assert_eq!(s.upsert(&half).await.unwrap(), Upserted::Changed(2));
    pass_time(Duration::from_secs(3600)).await; // 14:29
    drop(h);
    let hours = ["10:00", "13:00", "13:30", "14:00"];
    let expected: Vec<i64> = hours.iter().map(|h| at(&format!("2026-05-04T{h}:00Z")).as_millis()).collect();
    assert_eq!(ticks_of(&s, "h").await, expected);
}

/// Jitter delays each tick's task by a pseudo-random amount within the bound
/// (two schedulers; that every process computes the same amount is a unit test).
#[tokio::test(start_paused = true)]
async fn jitter_is_bounded() {
    let (store, _clock) = memory_at("2026-05-04T00:00:00Z");
    let (a, b) = (Schedules::new(store.clone(), "jobs").unwrap(), Schedules::new(store.clone(), "jobs").unwrap());
    let sched = Schedule::every("j", Duration::from_secs(60), NewTask::new("w", doc! {}))
        .unwrap()
        .overlap(Overlap::Allow)
        .jitter(Duration::from_secs(10));
    a.upsert(&sched).await.unwrap();
    let (ha, hb) = (a.scheduler().spawn(), b.scheduler().spawn());
    pass_time(Duration::from_secs(3600)).await;
    drop((ha, hb));
    let tasks = a.queue().tasks(doc! {"schedule": "j"}, None).await.unwrap();
    assert_eq!(tasks.len(), 60);
    let delays: BTreeSet<i64> = tasks
        .iter()
        .map(|r| run_at_of(r.data()) - r.data().get_datetime("scheduled_for").unwrap().timestamp_millis())
        .collect();
    assert!(delays.iter().all(|d| (0..=10_000).contains(d)), "{delays:?}");
    assert!(delays.len() > 30, "spread out: {delays:?}");
}

/// A scheduler stops at once when asked, even in the middle of a slow pass, and
/// a dropped handle's scheduler enqueues nothing more.
#[tokio::test(start_paused = true)]
async fn a_scheduler_stops_promptly_and_dies_with_its_handle() {
    let (store, _clock) = memory_at("2026-05-04T00:00:00Z");
    let s = Schedules::new(store.clone(), "jobs").unwrap();
    let sched = Schedule::every("m", Duration::from_secs(60), NewTask::new("w", doc! {})).unwrap();
    s.upsert(&sched).await.unwrap();
    let h = s.scheduler().spawn();
    pass_time(Duration::from_secs(90)).await;
    assert_eq!(ticks_of(&s, "m").await.len(), 1);
    store.faults().set_latency(Duration::from_secs(3600));
    pass_time(Duration::from_secs(31)).await; // into the pass of the 2-minute tick
    let asked = tokio::time::Instant::now();
    h.stop().await.unwrap();
    assert!(asked.elapsed() < Duration::from_secs(1), "stopped mid-pass at once: {:?}", asked.elapsed());
    store.faults().set_latency(Duration::ZERO);

    let h = s.scheduler().spawn();
    pass_time(Duration::from_secs(60)).await;
    let before = ticks_of(&s, "m").await.len();
    drop(h);
    pass_time(Duration::from_secs(600)).await;
    assert_eq!(ticks_of(&s, "m").await.len(), before, "nothing after the handle was dropped");
}

/// `NewTask::run_at` is absolute on the store clock; with a delay too, the later wins.
#[tokio::test(start_paused = true)]
async fn run_at_is_absolute() {
    let (store, _clock) = memory_at("2026-05-04T00:00:00Z");
    let q = mongoagent::Queue::new(store.clone(), "jobs").unwrap();
    let t0 = at("2026-05-04T00:00:00Z").as_millis();
    let (a, _) = q.enqueue(NewTask::new("w", doc! {}).run_at(at("2026-05-04T06:00:00Z"))).await.unwrap();
    let later = NewTask::new("w", doc! {}).run_at(at("2026-05-04T00:00:01Z")).delay(Duration::from_secs(60));
    let (b, _) = q.enqueue(later).await.unwrap();
    let earlier = NewTask::new("w", doc! {}).run_at(at("2026-05-04T06:00:00Z")).delay(Duration::from_secs(60));
    let (c, _) = q.enqueue(earlier).await.unwrap();
    let run_at = |k: &store_trait::Key| {
        let store = store.clone();
        let k = k.clone();
        async move {
            let coll = store_trait::Collection::new("jobs").unwrap();
            run_at_of(store.get(&coll, &k).await.unwrap().record.unwrap().data())
        }
    };
    assert_eq!(run_at(&a).await, t0 + 6 * HOUR);
    assert_eq!(run_at(&b).await, t0 + MIN);
    assert_eq!(run_at(&c).await, t0 + 6 * HOUR);
}

/// A scheduler limited to one schedule (`Scheduler::only`, as each
/// `mongocoord cron` process runs) enqueues that schedule's ticks and none of
/// another's in the same collection, whose processes may all be down.
#[tokio::test(start_paused = true)]
async fn a_scheduler_for_one_schedule_leaves_the_others_alone() {
    let (store, _clock) = memory_at("2026-05-04T00:00:00Z");
    let s = Schedules::new(store.clone(), "jobs").unwrap();
    for name in ["mine", "theirs"] {
        let sched = Schedule::every(name, Duration::from_secs(60), NewTask::new(name, doc! {})).unwrap();
        s.upsert(&sched.overlap(Overlap::Allow)).await.unwrap();
    }
    let h = s.scheduler().only("mine").spawn();
    pass_time(Duration::from_secs(600)).await;
    h.stop().await.unwrap();
    assert_eq!(ticks_of(&s, "mine").await.len(), 10);
    assert_eq!(ticks_of(&s, "theirs").await, Vec::<i64>::new());
}

/// The suite (`schedule_suite`): each `pub(crate) async fn` over a `Harness` here
/// is one test on every backend, registered by being written.
#[store_test::suite(schedule_suite, crate::schedules::cases)]
pub(crate) mod cases {
    use super::*;

    pub(crate) async fn definitions_are_upserted_versioned_paused_and_deleted<H: Harness>(h: &H) {
        let store = h.store("sched_defs").await;
        let s = Schedules::new(store.clone(), "jobs").unwrap();
        let task = NewTask::new("w", doc! {"x": 1}).priority(2);
        let def = Schedule::cron("nightly", "0 0 3 * * *", "UTC", task.clone()).unwrap();
        assert_eq!(s.upsert(&def).await.unwrap(), Upserted::Created);
        assert_eq!(s.upsert(&def).await.unwrap(), Upserted::Unchanged(1), "redeploying is idempotent");
        let changed = Schedule::cron("nightly", "0 0 4 * * *", "UTC", task.clone()).unwrap();
        assert_eq!(s.upsert(&changed).await.unwrap(), Upserted::Changed(2));
        assert_eq!(s.upsert(&changed).await.unwrap(), Upserted::Unchanged(2));
        let once = Schedule::at("once", StoreTime::from_millis(0), task.clone()).unwrap().missed(Missed::Once);
        assert_eq!(s.upsert(&once).await.unwrap(), Upserted::Created);

        let list = s.list().await.unwrap();
        assert_eq!(list.iter().map(|i| i.schedule.name()).collect::<Vec<_>>(), ["nightly", "once"]);
        assert_eq!(list[0].schedule, changed, "the definition reads back as written");
        assert_eq!(list[0].version, 2);
        let next = list[0].next_tick.unwrap().as_millis();
        assert_eq!(next.rem_euclid(24 * HOUR), 4 * HOUR, "the next 04:00 UTC");

        // A one-off time in the past runs once (Missed::Once), then never again.
        let sch = s.scheduler();
        sch.pass().await.unwrap();
        sch.pass().await.unwrap();
        assert_eq!(ticks_of(&s, "once").await, vec![0]);
        let t = s.queue().tasks(doc! {"schedule": "once"}, None).await.unwrap();
        assert_eq!(t[0].data().get_i64("priority").unwrap(), 2);
        assert_eq!(t[0].data().get_i32("x").unwrap(), 1);
        assert_eq!(s.get("once").await.unwrap().unwrap().next_tick, None);

        assert!(s.pause("nightly").await.unwrap());
        assert!(s.get("nightly").await.unwrap().unwrap().paused);
        assert_eq!(s.get("nightly").await.unwrap().unwrap().next_tick, None);
        assert!(s.resume("nightly").await.unwrap());
        assert!(!s.get("nightly").await.unwrap().unwrap().paused);
        assert!(!s.pause("nope").await.unwrap());
        assert!(s.delete("nightly").await.unwrap());
        assert!(!s.delete("nightly").await.unwrap());
        assert!(s.get("nightly").await.unwrap().is_none());

        assert!(Schedule::cron("bad", "not cron", "UTC", task.clone()).is_err());
        assert!(Schedule::cron("bad", "* * * * *", "Nowhere/Special", task.clone()).is_err());
        assert!(Schedule::every("bad", Duration::ZERO, task.clone()).is_err());
        assert!(Schedule::every("", Duration::from_secs(1), task).is_err());
        assert!(Schedule::every("bad", Duration::from_secs(1), NewTask::new("w", doc! {"ready": 1})).is_err());
    }

    /// Two schedulers on a one-second interval for a few seconds: every second has
    /// exactly one task, none missing between the first and the last.
    pub(crate) async fn two_schedulers_enqueue_each_second_once<H: Harness>(h: &H) {
        let store = h.store("sched_two").await;
        let s = Schedules::new(store.clone(), "jobs").unwrap();
        let sched = Schedule::every("tick", Duration::from_secs(1), NewTask::new("w", doc! {}))
            .unwrap()
            .overlap(Overlap::Allow);
        s.upsert(&sched).await.unwrap();
        let (a, b) = (s.scheduler().poll_every(Duration::from_millis(200)).spawn(), s.scheduler().spawn());
        tokio::time::sleep(Duration::from_millis(5_500)).await;
        a.stop().await.unwrap();
        b.stop().await.unwrap();
        let ticks = ticks_of(&s, "tick").await;
        assert!(ticks.len() >= 4, "{ticks:?}");
        assert!(ticks.windows(2).all(|w| w[1] - w[0] == 1_000), "one task per second, none missing: {ticks:?}");
        assert!(ticks.iter().all(|t| t % 1_000 == 0));
        let now = store.now().await.unwrap().as_millis();
        assert!(*ticks.last().unwrap() > now - 2_000, "the last ticks are there: {ticks:?} at {now}");
    }

    /// `Overlap::Queue` on a one-second interval, with a handler that takes 1.5 s
    /// and an agent that would run three at once: runs never overlap, in tick order.
    pub(crate) async fn held_ticks_run_one_at_a_time<H: Harness>(h: &H) {
        let store = h.store("sched_queue").await;
        let s = Schedules::new(store.clone(), "jobs").unwrap();
        let sched =
            Schedule::every("q", Duration::from_secs(1), NewTask::new("q", doc! {})).unwrap().overlap(Overlap::Queue);
        s.upsert(&sched).await.unwrap();
        let log: Arc<Mutex<(u32, u32, Vec<i64>)>> = Arc::default();
        // Without notifications, an agent finds a task made ready by polling.
        let agent = Agent::builder(store.clone(), "q", "jobs")
            .concurrency(3)
            .poll_interval(Duration::from_millis(200))
            .build()
            .unwrap();
        let handler = {
            let log = log.clone();
            move |t: Task| {
                let log = log.clone();
                async move {
                    {
                        let mut l = log.lock().unwrap();
                        l.0 += 1;
                        l.1 = l.1.max(l.0);
                        l.2.push(t.data().get_datetime("scheduled_for").unwrap().timestamp_millis());
                    }
                    tokio::time::sleep(Duration::from_millis(1_500)).await;
                    log.lock().unwrap().0 -= 1;
                    true
                }
            }
        };
        let work = {
            let agent = agent.clone();
            tokio::spawn(async move { agent.work(handler).await })
        };
        let (a, b) = (s.scheduler().poll_every(Duration::from_millis(200)).spawn(), s.scheduler().spawn());
        tokio::time::sleep(Duration::from_millis(6_500)).await;
        a.stop().await.unwrap();
        b.stop().await.unwrap();
        agent.shutdown();
        work.await.unwrap().unwrap();
        let (_, max_active, order) = log.lock().unwrap().clone();
        let ticks = ticks_of(&s, "q").await;
        assert_eq!(max_active, 1, "held ticks never overlap");
        assert!(order.len() >= 2 && ticks.len() > order.len(), "ran {order:?} of {ticks:?}");
        assert_eq!(order, ticks[..order.len()].to_vec(), "in tick order");
    }
}
