//! Clock trouble on the in-memory store under paused time: a store clock that
//! jumps ahead or runs fast (an NTP step on the server, a failover to a member
//! whose clock is ahead), and a host suspend (the wall clock moves on, the
//! monotonic clock does not). The lost signal's bound is in the crate docs,
//! "Clocks".

use std::time::Duration;

use mongolock::{Acquire, Lock, LockGuard};
use store_memory::MemoryStore;
use store_test::Partitionable;
use store_test::TestClock;
use store_trait::{Collection, Key, Store, StoreTime};

const TTL: Duration = Duration::from_secs(3);
// With a ttl of 3 s: a safety margin of 300 ms, renewals every second.
const MARGIN_MS: i64 = 300;

fn store_with_clock() -> (MemoryStore, TestClock) {
    let clock = TestClock::starting_at(StoreTime::from_millis(1_700_000_000_000));
    (MemoryStore::builder().clock(clock.clone()).build(), clock)
}

fn lock<S: Store + Clone>(store: S) -> Lock<S> {
    Lock::builder(store, "job").ttl(TTL).build().unwrap()
}

/// The lease as the store has it now: whether `g` holds it, and the store's time.
fn held_by<S: Store + Clone>(store: &MemoryStore, g: &LockGuard<S>) -> (bool, StoreTime) {
    let snap = store.peek(&Collection::new("mongolocker").unwrap(), &Key::new("job").unwrap()).unwrap();
    let held = snap.record.is_some_and(|r| r.is_held_by_at(g.owner(), snap.now) && r.fence() == g.fence());
    (held, snap.now)
}

#[tokio::test(start_paused = true)]
async fn a_store_clock_step_beyond_the_margin_is_reported_at_the_next_renewal() {
    let (store, clock) = store_with_clock();
    let (a, b) = (lock(store.clone()), lock(store.clone()));
    let g = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    // Renewed at 1 s; the next renewal is due at 2 s.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let expires = g.expires();
    // The server's clock steps 1.2 s ahead: the lease now ends 1.2 s early in real
    // time (at 2.8 s), inside the holder's deadline (3.7 s).
    let step = 4 * MARGIN_MS;
    clock.jump(step);
    assert!(b.try_acquire().await.unwrap().is_none(), "still held right after the step");
    let stepped_at = tokio::time::Instant::now();
    tokio::time::timeout(TTL, g.lost()).await.expect("the holder reports the step as a loss");
    // Reported at the next renewal, while its lease was still live on the store:
    // before anyone else could be granted the lock.
    assert!(stepped_at.elapsed() <= Duration::from_secs(1), "reported {:?} after the step", stepped_at.elapsed());
    let (_, now) = held_by(&store, &g);
    assert!(now < expires, "reported after the stepped lease lapsed: {now} >= {expires}");
    let m = a.metrics();
    assert_eq!((m.store_clock_jumps, m.local_clock_gaps, m.losses), (1, 0, 1), "{m:?}");
    assert!(g.is_lost());
    // Not released behind the holder's back; once it lets go, the other client
    // gets the lock at once.
    assert!(b.try_acquire().await.unwrap().is_none());
    let old = g.fence();
    let _ = g.release().await;
    let g2 = b.acquire_timeout(Duration::from_millis(100)).await.unwrap();
    assert!(g2.fence() > old);
}

#[tokio::test(start_paused = true)]
async fn small_and_backward_store_clock_steps_change_nothing() {
    let (store, clock) = store_with_clock();
    let a = lock(store.clone());
    let g = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // Absorbed by the margin.
    clock.jump(MARGIN_MS / 4);
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Back: leases last longer than the holder assumes, which is safe.
    clock.jump(-10_000);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!g.is_lost());
    assert!(held_by(&store, &g).0);
    assert_eq!(a.metrics().losses, 0);
}

/// A store clock running fast ends every lease early. Without the store-clock
/// check, the holder renews once, is cut off, and still believes it holds the lock
/// when the lease lapses on the store and another client takes it.
#[tokio::test(start_paused = true)]
async fn a_fast_store_clock_is_caught_before_a_partition_lets_a_second_holder_in() {
    let (store, clock) = store_with_clock();
    let gate = store.client();
    let (a, b) = (lock(gate.clone()), lock(store.clone()));
    let g = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    clock.set_rate(1.5).unwrap();
    // The first renewal (at 1 s) sees 1.5 s of store time pass in one second.
    tokio::time::sleep(Duration::from_millis(1_050)).await;
    gate.set_partitioned(true);
    let mut second = None;
    for _ in 0..100 {
        if let Some(g2) = b.try_acquire().await.unwrap() {
            second = Some(g2);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let g2 = second.expect("the lease lapses on the fast store clock");
    assert!(g.is_lost(), "two holders: {} still believes it holds while {} was granted", g.fence(), g2.fence());
    assert_eq!(a.metrics().store_clock_jumps, 1);
}

/// A host suspend: the wall clock moves on, tokio's monotonic clock (on Linux,
/// `CLOCK_MONOTONIC`) does not, and neither do the keeper's timers. The server saw
/// the time pass.
#[tokio::test(start_paused = true)]
async fn a_suspend_fires_the_lost_signal_before_the_next_renewal() {
    let (store, store_clock) = store_with_clock();
    let wall = TestClock::starting_at(StoreTime::from_millis(1_700_000_000_000));
    let a = Lock::builder(store.clone(), "job").ttl(TTL).clock(wall.clone()).build().unwrap();
    let g = a.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let expires = g.expires();
    let ops = store.operation_count();
    // Suspended for 1.2 s: the lease now ends at 2.3 s of tokio time, before the
    // holder's deadline (3.7 s).
    store_clock.jump(4 * MARGIN_MS);
    wall.jump(4 * MARGIN_MS);
    assert!(g.is_lost(), "known at once, before the keeper runs");
    tokio::time::timeout(Duration::from_secs(1), g.lost()).await.expect("the keeper fires the signal when it wakes");
    let (_, now) = held_by(&store, &g);
    assert!(now < expires, "signalled after the lease lapsed: {now} >= {expires}");
    let m = a.metrics();
    assert_eq!((m.local_clock_gaps, m.store_clock_jumps, m.losses), (1, 0, 1), "{m:?}");
    // Found without a renewal: the only operation since is the release.
    assert!(store.operation_count() <= ops + 1, "{} operations", store.operation_count() - ops);
}

/// A wall-clock step forward without a suspend looks the same to the holder, and
/// is treated the same (conservatively); a step back changes nothing.
#[tokio::test(start_paused = true)]
async fn a_wall_clock_step_forward_counts_as_a_gap_and_back_does_not() {
    let store = MemoryStore::new();
    let wall = TestClock::starting_at(StoreTime::from_millis(1_700_000_000_000));
    let a = Lock::builder(store.clone(), "job").ttl(TTL).clock(wall.clone()).build().unwrap();
    // Without auto-renew: its deadline is 2.7 s, and the keeper still wakes every
    // second to check the clocks.
    let g = a.acquire_with(Acquire::new()).await.unwrap();
    wall.jump(-3_600_000);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!g.is_lost(), "a step back is harmless");
    wall.jump(3_600_000 + MARGIN_MS / 4);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!g.is_lost(), "a small step is absorbed by the margin");
    wall.jump(MARGIN_MS);
    assert!(g.is_lost());
    tokio::time::timeout(Duration::from_millis(500), g.lost()).await.expect("the keeper wakes to check the clocks");
    assert_eq!(a.metrics().local_clock_gaps, 1);
}

/// A process that was paused (a `SIGSTOP`, a VM pause) and resumes past its
/// lease's deadline learns from `is_lost` before its keeper task has run
/// again: the check reads the deadline itself. Here the runtime is not driven
/// at all while the deadline passes (a real sleep outside it), so the keeper
/// cannot have run.
#[test]
fn is_lost_answers_before_the_keeper_runs_again() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let ttl = Duration::from_millis(60);
    let lock = Lock::builder(MemoryStore::new(), "job").ttl(ttl).build().unwrap();
    let g = rt.block_on(lock.acquire()).unwrap();
    let validity = g.validity();
    std::thread::sleep(ttl);
    assert!(!g.cancellation().is_cancelled(), "the keeper has not run: nothing drives the runtime");
    assert!(g.is_lost(), "past the deadline");
    assert!(validity.is_lost());
    assert_eq!(validity.remaining(), Duration::ZERO);
    rt.block_on(async move { drop(g) });
}
