//! Callbacks cannot delay a loss: a slow `on_loop` and a blocking `on_leader`
//! neither hold back `on_leader_loss` nor keep `stop` from returning.
//!
//! Paused time does not move by itself here: tokio stops auto-advancing while a
//! callback runs on a blocking thread (which keeps callback tests deterministic),
//! so these tests advance it by hand, and wait for callback threads in real time
//! with a bound that only a failure reaches.

use std::future::Future;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongoelector::{Elector, DEFAULT_COLLECTION};
use store_memory::MemoryStore;
use store_test::Partitionable;
use store_trait::{Collection, Key};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(3);
/// The lock's default safety margin for this ttl (a tenth).
const MARGIN: Duration = Duration::from_millis(300);
const STEP: Duration = Duration::from_millis(10);

type Log = Arc<Mutex<Vec<&'static str>>>;

/// Waits in real time for what a callback sends; ten seconds means it never will.
async fn recv<T: Send + 'static>(rx: &Arc<Mutex<Receiver<T>>>, what: &str) -> T {
    let rx = rx.clone();
    let got = tokio::task::spawn_blocking(move || rx.lock().unwrap().recv_timeout(Duration::from_secs(10)));
    got.await.unwrap().unwrap_or_else(|_| panic!("not within 10 s of real time: {what}"))
}

async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Advances paused time in small steps until `done`; returns the simulated time
/// it took, or panics after `limit`.
async fn advance_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    settle().await;
    while !done() {
        assert!(start.elapsed() <= limit, "not within {limit:?} of simulated time: {what}");
        tokio::time::advance(STEP).await;
        settle().await;
    }
    start.elapsed()
}

/// Runs `fut` to completion while advancing paused time in small steps; returns
/// the simulated time it took, or `None` after `limit`.
async fn drive(limit: Duration, fut: impl Future<Output = ()>) -> Option<Duration> {
    let start = Instant::now();
    tokio::pin!(fut);
    loop {
        tokio::select! {
            biased;
            () = &mut fut => return Some(start.elapsed()),
            () = settle() => {}
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::advance(STEP).await;
    }
}

fn push(log: &Log, what: &'static str) {
    log.lock().unwrap().push(what);
}

#[tokio::test(start_paused = true)]
async fn a_slow_on_loop_and_a_blocking_on_leader_do_not_delay_the_loss() {
    let store = MemoryStore::new();
    let client = store.client();
    let log: Log = Arc::default();
    let (loop_tx, loops) = channel();
    let (leader_tx, leaders) = channel();
    let (loss_tx, losses) = channel();
    let (loops, leaders, losses) =
        (Arc::new(Mutex::new(loops)), Arc::new(Mutex::new(leaders)), Arc::new(Mutex::new(losses)));
    // `on_loop` blocks until the test drops the gate: slower than any lease.
    let (gate, gate_rx) = channel::<()>();
    let gate_rx = Mutex::new(gate_rx);
    let (l1, l2) = (log.clone(), log.clone());
    let a = Elector::builder(client.clone(), "scheduler")
        .ttl(TTL)
        .report_status(false)
        .on_loop(move || {
            let _ = loop_tx.send(());
            let _ = gate_rx.lock().unwrap().recv();
        })
        // A blocking `on_leader` that runs the leader's work until the term ends.
        .on_leader_term(move |term| {
            push(&l1, "leader");
            let _ = leader_tx.send(());
            tokio::runtime::Handle::current().block_on(term.cancelled());
        })
        .on_leader_loss(move || {
            push(&l2, "loss");
            let _ = loss_tx.send(Instant::now());
        })
        .build()
        .unwrap();
    a.start().unwrap();
    recv(&loops, "on_loop started").await;
    recv(&leaders, "on_leader started while on_loop blocks").await;
    assert!(a.is_leader());
    // Rounds go by while both callbacks block: renewal goes on.
    let end = Instant::now() + TTL * 2;
    advance_until(TTL * 3, "two ttls pass", || Instant::now() >= end).await;
    assert!(a.is_leader(), "blocked callbacks do not cost the lease");

    // The leader is cut off: its term ends before the lease can lapse.
    client.set_partitioned(true);
    advance_until(TTL, "the term ends", || !a.is_leader()).await;
    let ended = Instant::now();
    let delivered = recv(&losses, "on_leader_loss while on_loop still blocks").await;
    assert!(delivered - ended <= MARGIN, "the loss was delivered {:?} after the term ended", delivered - ended);
    let snap = store.peek(&Collection::new(DEFAULT_COLLECTION).unwrap(), &Key::new("scheduler").unwrap()).unwrap();
    assert!(
        snap.record.as_ref().and_then(|r| r.holder_at(snap.now)).is_some(),
        "reported before the lease could lapse, so before another node can lead"
    );

    // `stop` does not wait for the blocked `on_loop`: it would return only at its
    // timeout (the ttl). It does wait for `on_leader_loss` to return, which takes
    // real time, while `drive` goes on advancing simulated time.
    let took = drive(TTL * 3, a.stop()).await.expect("stop returns while on_loop blocks");
    assert!(took < TTL, "stop took {took:?}, as if it waited for on_loop");
    drop(gate);
    assert_eq!(*log.lock().unwrap(), ["leader", "loss"]);
}

#[tokio::test(start_paused = true)]
async fn stop_is_bounded_when_on_leader_ignores_its_term() {
    let store = MemoryStore::new();
    let log: Log = Arc::default();
    let (leader_tx, leaders) = channel();
    let (loss_tx, losses) = channel();
    let (leaders, losses) = (Arc::new(Mutex::new(leaders)), Arc::new(Mutex::new(losses)));
    let (gate, gate_rx) = channel::<()>();
    let gate_rx = Mutex::new(gate_rx);
    let (l1, l2) = (log.clone(), log.clone());
    let limit = Duration::from_secs(2);
    let a = Elector::builder(store.clone(), "scheduler")
        .ttl(TTL)
        .report_status(false)
        .stop_timeout(limit)
        .on_leader(move || {
            push(&l1, "leader");
            let _ = leader_tx.send(());
            let _ = gate_rx.lock().unwrap().recv();
        })
        .on_leader_loss(move || {
            push(&l2, "loss");
            let _ = loss_tx.send(());
        })
        .build()
        .unwrap();
    a.start().unwrap();
    recv(&leaders, "on_leader started").await;
    let took = drive(limit * 10, a.stop()).await.expect("stop returns while on_leader blocks");
    assert!(took >= limit && took <= limit + 2 * STEP, "stop waited {took:?} for a blocked on_leader");
    assert!(!a.is_leader());
    let lock = mongolock::Lock::builder(store.clone(), "scheduler").collection(DEFAULT_COLLECTION).build().unwrap();
    assert!(!lock.locked().await.unwrap(), "the lease was released at once");
    assert_eq!(*log.lock().unwrap(), ["leader"], "the loss waits for on_leader");
    gate.send(()).unwrap();
    recv(&losses, "on_leader_loss after on_leader returned").await;
    assert_eq!(*log.lock().unwrap(), ["leader", "loss"]);
}
