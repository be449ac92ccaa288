//! Absurd configuration is a typed error, never a panic or a hang: every
//! duration a user can write, from zero to `Duration::MAX`.

use std::time::Duration;

use mongolock::{Acquire, Lock, LockError, Semaphore};
use proptest::prelude::*;
use store_memory::MemoryStore;

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(Duration::from_nanos(1)),
        (0_u64..=u64::MAX, 0_u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0_u64..100_000).prop_map(Duration::from_millis),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The builder accepts or rejects any timing; what it accepts keeps
    /// `renew_every + margin < ttl`.
    #[test]
    fn builder_never_panics(ttl in duration(), renew in duration(), margin in duration(), step in duration()) {
        let b = Lock::builder(MemoryStore::new(), "k").ttl(ttl).renew_every(renew).safety_margin(margin).poll_interval(step);
        match b.build() {
            Ok(lock) => prop_assert!(lock.ttl() > renew + margin),
            Err(e) => prop_assert!(matches!(e, LockError::Config(_)), "{e}"),
        }
    }
}

/// A timeout too large for the clock waits like no timeout; it never panics.
#[tokio::test(start_paused = true)]
async fn huge_timeouts_are_no_timeouts() {
    let store = MemoryStore::new();
    let lock = Lock::builder(store.clone(), "k").ttl(Duration::from_secs(1)).build().unwrap();
    let held = lock.acquire_with(Acquire::new().auto_renew()).await.unwrap();
    let other = Lock::builder(store.clone(), "k").ttl(Duration::from_secs(1)).build().unwrap();
    let waiter = tokio::spawn(async move { other.acquire_with(Acquire::new().timeout(Duration::MAX)).await });
    tokio::time::sleep(Duration::from_secs(5)).await;
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(60), waiter).await.unwrap().unwrap();
    assert!(got.is_ok(), "{got:?}");
    let sem = Semaphore::new(Lock::builder(store, "s").ttl(Duration::from_secs(1)), 1).unwrap();
    let permit = sem.acquire_with(Acquire::new().timeout(Duration::MAX)).await;
    assert!(permit.is_ok());
}

/// A timeout on a single try is a typed error, not silently ignored.
#[tokio::test(start_paused = true)]
async fn a_single_try_takes_no_timeout() {
    let lock = Lock::builder(MemoryStore::new(), "k").build().unwrap();
    let r = lock.acquire_with(Acquire::try_once().timeout(Duration::from_secs(1))).await;
    assert!(matches!(r, Err(LockError::Config(_))), "{r:?}");
    assert!(!lock.locked().await.unwrap(), "nothing was acquired");
}

/// Two permit counts on one key (a limit changed while old processes still
/// run): the slot ids the new count would create are taken by the old
/// count's documents. A try on the new count gives up after a round that
/// created nothing, in a few store operations, instead of going round again
/// and again; a batch likewise.
#[tokio::test(start_paused = true)]
async fn slots_of_another_permit_count_end_the_rounds() {
    let store = MemoryStore::new();
    let old = Semaphore::new(Lock::builder(store.clone(), "k").ttl(Duration::from_secs(60)), 10).unwrap();
    let held = old.try_acquire_many(10).await.unwrap();
    assert_eq!(held.len(), 10);
    let new = Semaphore::new(Lock::builder(store.clone(), "k").ttl(Duration::from_secs(60)), 20).unwrap();
    let before = store.operation_count();
    assert!(new.try_acquire().await.unwrap().is_none());
    let single = store.operation_count() - before;
    let before = store.operation_count();
    assert!(new.try_acquire_many(4).await.unwrap().is_empty());
    let batch = store.operation_count() - before;
    assert!(single <= 8 && batch <= 8, "operations: {single} for one try, {batch} for a batch");
}
