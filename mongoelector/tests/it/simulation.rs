//! A deterministic simulation on the in-memory store under paused time: five
//! electors over a simulated hour with random crashes, partitions longer than the
//! ttl, clean stops, restarts, store faults (failed before apply, applied and
//! then failed, slow, change streams ended) and steps of the store clock
//! (back by up to a ttl; forward by up to 1.2 s, four times the safety margin,
//! which the leader reports as a loss at its next renewal). A forward step is only
//! made while no leader is cut off, and no node is cut off until the leader has
//! renewed once after it: a leader that cannot reach the store cannot learn of
//! the step, the window the lost signal's bound leaves to fencing (see
//! `mongolock`'s docs, "Clocks"). Checked at every step:
//! - never two nodes believe they are leader, and a node that believes it is
//!   leader holds the live lease on the store clock;
//! - each node's callbacks strictly alternate leader / loss;
//! - while a healthy node runs, the store is never without a live leader for more
//!   than one renew interval, plus the forward steps of the store clock in the
//!   last ttl (waiters sleep until an expiry that such a step brought closer), so
//!   leadership is regained within ttl + one renew interval after a crash.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongoelector::{Elector, DEFAULT_COLLECTION};
use store_memory::MemoryStore;
use store_test::memory::FaultSchedule;
use store_test::TestClock;
use store_test::{Client, Partitionable};
use store_trait::{Collection, Key, StoreTime};

const NODES: usize = 5;
const TTL: Duration = Duration::from_secs(3);

struct Node {
    client: Client,
    elector: Option<Elector<Client>>,
    partitioned: bool,
    /// The callback log of the node's current process.
    log: Arc<Mutex<Vec<&'static str>>>,
}

fn elector(client: &Client, log: &Arc<Mutex<Vec<&'static str>>>) -> Elector<Client> {
    let (a, b) = (log.clone(), log.clone());
    Elector::builder(client.clone(), "scheduler")
        .ttl(TTL)
        .report_status(false)
        .on_leader(move || a.lock().unwrap().push("leader"))
        .on_leader_loss(move || b.lock().unwrap().push("loss"))
        .build()
        .unwrap()
}

async fn simulate(seed: u64, minutes: u64) -> (usize, usize, usize) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let clock = TestClock::starting_at(StoreTime::from_millis(1_700_000_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let (coll, key) = (Collection::new(DEFAULT_COLLECTION).unwrap(), Key::new("scheduler").unwrap());
    let mut nodes: Vec<Node> = (0..NODES)
        .map(|_| {
            let client = store.client();
            let log = Arc::new(Mutex::new(Vec::new()));
            let e = elector(&client, &log);
            e.start().unwrap();
            Node { client, elector: Some(e), partitioned: false, log }
        })
        .collect();
    let mut logs: Vec<Arc<Mutex<Vec<&'static str>>>> = nodes.iter().map(|n| n.log.clone()).collect();
    let renew = TTL / 3;
    let slack = Duration::from_millis(100);
    let end = tokio::time::Instant::now() + Duration::from_secs(60 * minutes);
    let mut leaderless_since: Option<tokio::time::Instant> = None;
    let (mut steps, mut terms) = (0, 0);
    let mut injected = FaultSchedule::default();
    let mut last_fence = 0;
    // After a forward step of the store clock: no partition until the leader has
    // renewed once, and no other forward step.
    let mut quiet_until = tokio::time::Instant::now();
    let mut forward_steps: Vec<(tokio::time::Instant, Duration)> = Vec::new();
    // A leader (node, term's fence) that must have reported a forward step beyond
    // the safety margin (a tenth of the ttl) by the given time.
    let mut must_report: Option<(usize, u64, tokio::time::Instant)> = None;
    let mut reported = 0;
    while tokio::time::Instant::now() < end {
        steps += 1;
        let i = rng.usize(..NODES);
        match rng.u32(..100) {
            0..=2 => {
                // Crash: the process is gone without a release; it restarts later.
                nodes[i].client.set_partitioned(true);
                nodes[i].partitioned = true;
                if let Some(e) = nodes[i].elector.take() {
                    std::mem::forget(e);
                }
                nodes[i].client = store.client();
                nodes[i].partitioned = false;
                // A new process keeps a new log; the dead one's may end on "leader".
                nodes[i].log = Arc::new(Mutex::new(Vec::new()));
                logs.push(nodes[i].log.clone());
            }
            3..=5 => {
                // Partition (or a pause) for longer than the ttl, or heal.
                let cut = !nodes[i].partitioned;
                if !cut || tokio::time::Instant::now() >= quiet_until {
                    nodes[i].client.set_partitioned(cut);
                    nodes[i].partitioned = cut;
                }
            }
            6..=8 => {
                if let Some(e) = nodes[i].elector.take() {
                    e.stop().await;
                }
            }
            9..=14 if nodes[i].elector.is_none() => {
                let e = elector(&nodes[i].client, &nodes[i].log);
                e.start().unwrap();
                nodes[i].elector = Some(e);
            }
            15..=16 => store.faults().fail_next(u64::from(rng.u32(1..3))),
            17..=18 => {
                // The store clock steps back (an NTP step, a failover to a member
                // whose clock is behind): leases last longer, which is safe.
                clock.jump(-rng.i64(1..=3_000));
            }
            19..=20 => {
                // The store clock steps forward: the leader's lease ends early.
                let now = tokio::time::Instant::now();
                let leader_cut =
                    nodes.iter().any(|n| n.partitioned && n.elector.as_ref().is_some_and(|e| e.is_leader()));
                if !leader_cut && now >= quiet_until {
                    let ms = rng.u64(1..=1_200);
                    clock.jump(i64::try_from(ms).unwrap());
                    quiet_until = now + renew + Duration::from_millis(800);
                    forward_steps.push((now, Duration::from_millis(ms)));
                    let leader = (0..NODES).find(|&n| nodes[n].elector.as_ref().is_some_and(|e| e.is_leader()));
                    if let (Some(m), true) = (leader, Duration::from_millis(ms) > TTL / 10) {
                        let fence = nodes[m].elector.as_ref().unwrap().node_status().fence.unwrap();
                        must_report = Some((m, fence, quiet_until));
                    }
                }
            }
            21..=25 => injected.inject(&store, &mut rng),
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(10..1500))).await;

        // Invariants.
        let snap = store.peek(&coll, &key).unwrap();
        let live = snap.record.as_ref().and_then(|r| r.holder_at(snap.now).map(|l| (l.owner.clone(), r.fence())));
        let leaders: Vec<usize> =
            (0..NODES).filter(|&n| nodes[n].elector.as_ref().is_some_and(|e| e.is_leader())).collect();
        assert!(leaders.len() <= 1, "step {steps}: two leaders {leaders:?}");
        if let [m] = leaders[..] {
            let e = nodes[m].elector.as_ref().unwrap();
            let fence = e.node_status().fence.unwrap();
            assert_eq!(
                live.as_ref().map(|l| l.1),
                Some(fence),
                "step {steps}: node {m} believes it leads with fence {fence}; store: {live:?}"
            );
        }
        if let Some((m, fence, by)) = must_report {
            if tokio::time::Instant::now() >= by {
                let still = nodes[m].elector.as_ref().is_some_and(|e| e.node_status().fence == Some(fence));
                assert!(!still, "step {steps}: node {m} leads on with fence {fence} after a store clock jump");
                must_report = None;
                reported += 1;
            }
        }
        if let Some((_, fence)) = &live {
            if *fence > last_fence {
                terms += 1;
                last_fence = *fence;
            }
        }
        let healthy = nodes.iter().any(|n| n.elector.is_some() && !n.partitioned);
        match (&live, healthy) {
            (None, true) => {
                let since = *leaderless_since.get_or_insert_with(tokio::time::Instant::now);
                let stepped: Duration =
                    forward_steps.iter().filter(|(at, _)| at.elapsed() <= TTL + renew).map(|(_, d)| *d).sum();
                assert!(
                    since.elapsed() <= renew + slack + stepped,
                    "step {steps}: leaderless for {:?} (store clock stepped forward {stepped:?})",
                    since.elapsed()
                );
            }
            _ => leaderless_since = None,
        }
    }
    for n in &nodes {
        if let Some(e) = &n.elector {
            e.stop().await;
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (i, log) in logs.iter().enumerate() {
        let log = log.lock().unwrap();
        for (j, ev) in log.iter().enumerate() {
            let want = if j % 2 == 0 { "leader" } else { "loss" };
            assert_eq!(*ev, want, "process {i}: callbacks do not alternate: {log:?}");
        }
    }
    assert!(
        injected.after_apply > 0 && injected.latency > 0 && injected.streams_ended > 0,
        "store faults happened: {injected:?}"
    );
    (steps, terms, reported)
}

#[tokio::test(start_paused = true)]
async fn five_electors_for_a_simulated_hour() {
    let (steps, terms, reported) = simulate(7, 60).await;
    assert!(steps > 3_000, "{steps} steps");
    assert!(terms > 50, "leadership changed hands {terms} times");
    assert!(reported > 20, "{reported} store clock jumps reported by the leader");
}

#[tokio::test(start_paused = true)]
async fn other_seeds_for_ten_minutes() {
    for seed in [1, 2, 3] {
        simulate(seed, 10).await;
    }
}
