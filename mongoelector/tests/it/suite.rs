//! Elector behaviour every backend must show.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongoelector::{Elector, ElectorError, Leadership, Role};
use store_test::Harness;

const WAIT: Duration = Duration::from_secs(30);

fn ttl<H: Harness>(h: &H) -> Duration {
    h.ttl() * 2
}

/// Electors that, where the store has change notifications, would take an hour
/// to notice a release by polling: a prompt handover proves the notification path.
fn step<H: Harness>(h: &H) -> Duration {
    if h.change_streams_expected() {
        Duration::from_secs(3600)
    } else {
        ttl(h) / 3
    }
}

pub(crate) async fn wait_leader<S: store_trait::Store + Clone>(electors: &[Elector<S>]) -> usize {
    tokio::time::timeout(WAIT, async {
        loop {
            let leaders: Vec<usize> = (0..electors.len()).filter(|&i| electors[i].is_leader()).collect();
            assert!(leaders.len() <= 1, "two leaders: {leaders:?}");
            if let [i] = leaders[..] {
                return i;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a leader is elected")
}

async fn nodes<H: Harness>(h: &H, test: &str, n: usize) -> Vec<Elector<H::Store>> {
    nodes_with(h, test, n, ttl(h)).await
}

async fn nodes_with<H: Harness>(h: &H, test: &str, n: usize, ttl: Duration) -> Vec<Elector<H::Store>> {
    let store = h.store(test).await;
    (0..n)
        .map(|_| Elector::builder(store.clone(), "scheduler").ttl(ttl).poll_interval(step(h)).build().unwrap())
        .collect()
}

/// The suite (`elector_suite`): each `pub(crate) async fn` over a `Harness` here
/// is one test on every backend, registered by being written.
#[store_test::suite(elector_suite, crate::suite::cases)]
pub(crate) mod cases {
    use super::*;

    pub(crate) async fn one_leader_among_three<H: Harness>(h: &H) {
        // "The leader keeps renewing" must not depend on a loaded machine answering
        // within the safety margin of a short lease: four times the suite's lease.
        let long = ttl(h) * 4;
        let electors = nodes_with(h, "el_one_leader", 3, long).await;
        for e in &electors {
            e.start().unwrap();
            assert!(e.running());
        }
        let leader = wait_leader(&electors).await;
        for e in &electors {
            assert!(e.leader_exists().await.unwrap());
            let mut rx = e.leadership();
            let seen = tokio::time::timeout(WAIT, rx.wait_for(|l: &Leadership| l.leader.is_some()))
                .await
                .unwrap()
                .unwrap()
                .clone();
            let l = seen.leader.unwrap();
            assert_eq!(l.fence, electors[leader].node_status().fence.unwrap(), "every node observes the same term");
        }
        tokio::time::sleep(long * 2).await;
        assert!(electors[leader].is_leader(), "the leader keeps renewing");
        assert_eq!(wait_leader(&electors).await, leader);
        for e in &electors {
            e.stop().await;
            assert!(!e.running());
        }
    }

    pub(crate) async fn handover_on_stop<H: Harness>(h: &H) {
        let electors = nodes(h, "el_handover", 3).await;
        for e in &electors {
            e.start().unwrap();
        }
        let first = wait_leader(&electors).await;
        let old_fence = electors[first].node_status().fence.unwrap();
        electors[first].stop().await;
        assert!(!electors[first].is_leader());
        let rest: Vec<_> = electors.iter().enumerate().filter(|(i, _)| *i != first).map(|(_, e)| e.clone()).collect();
        let next = wait_leader(&rest).await;
        assert!(rest[next].node_status().fence.unwrap() > old_fence);
        for e in &rest {
            e.stop().await;
        }
    }

    pub(crate) async fn release_hands_over_and_calls_back<H: Harness>(h: &H) {
        let store = h.store("el_release").await;
        let losses = Arc::new(AtomicUsize::new(0));
        let l2 = losses.clone();
        let a =
            Elector::builder(store.clone(), "scheduler").ttl(ttl(h)).poll_interval(step(h)).on_leader_loss(move || {
                l2.fetch_add(1, Ordering::SeqCst);
            });
        let a = a.build().unwrap();
        a.start().unwrap();
        wait_leader(std::slice::from_ref(&a)).await;
        let b = Elector::builder(store.clone(), "scheduler").ttl(ttl(h)).poll_interval(step(h)).build().unwrap();
        b.start().unwrap();
        assert!(a.release().await.unwrap());
        assert!(!a.is_leader());
        let pair = [a.clone(), b.clone()];
        assert_eq!(wait_leader(&pair).await, 1, "the other node takes over after a release");
        tokio::time::timeout(WAIT, async {
            while losses.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("on_leader_loss ran");
        assert!(!a.release().await.unwrap(), "nothing to release");
        a.stop().await;
        b.stop().await;
    }

    pub(crate) async fn callbacks_alternate_and_panics_are_contained<H: Harness>(h: &H) {
        let store = h.store("el_callbacks").await;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (l1, l2, l3) = (log.clone(), log.clone(), Arc::new(AtomicUsize::new(0)));
        let loops = l3.clone();
        let a = Elector::builder(store.clone(), "scheduler")
            .ttl(ttl(h))
            .poll_interval(step(h))
            .on_leader(move || {
                l1.lock().unwrap().push("leader");
                panic!("a buggy on_leader callback");
            })
            .on_leader_loss(move || {
                // A slow callback: it must not delay renewal.
                std::thread::sleep(Duration::from_millis(50));
                l2.lock().unwrap().push("loss");
            })
            .on_loop(move || {
                l3.fetch_add(1, Ordering::SeqCst);
            })
            .build()
            .unwrap();
        // A term that ends before its `on_leader` started is not reported at all, so
        // each term waits for its `on_leader` before it ends.
        let logged = |n: usize| {
            let log = log.clone();
            async move {
                tokio::time::timeout(WAIT, async {
                    while log.lock().unwrap().len() < n {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
                .await
                .unwrap_or_else(|_| panic!("{n} callbacks ran"));
            }
        };
        a.start().unwrap();
        for term in 0..3 {
            wait_leader(std::slice::from_ref(&a)).await;
            logged(2 * term + 1).await;
            tokio::time::sleep(ttl(h)).await;
            assert!(a.is_leader(), "panicking callbacks do not cost the lease");
            a.release().await.unwrap();
        }
        wait_leader(std::slice::from_ref(&a)).await;
        logged(7).await;
        a.stop().await;
        logged(8).await;
        let log = log.lock().unwrap().clone();
        assert_eq!(log, ["leader", "loss", "leader", "loss", "leader", "loss", "leader", "loss"]);
        assert!(loops.load(Ordering::SeqCst) >= 3);
    }

    pub(crate) async fn leader_work_is_cancelled_on_loss<H: Harness>(h: &H) {
        let store = h.store("el_leader_work").await;
        let a = Elector::builder(store.clone(), "scheduler").ttl(ttl(h)).poll_interval(step(h)).build().unwrap();
        a.start().unwrap();
        let started = Arc::new(AtomicUsize::new(0));
        let s2 = started.clone();
        let worker = {
            let a = a.clone();
            tokio::spawn(async move {
                a.while_leader(|term| async move {
                    s2.fetch_add(1, Ordering::SeqCst);
                    term.cancelled().await;
                    "unreachable: the select returns first"
                })
                .await
            })
        };
        wait_leader(std::slice::from_ref(&a)).await;
        let cancel = a.term_cancellation().unwrap();
        // Another process takes over by force: the term ends at the next renewal.
        let other = mongolock::Lock::builder(store.clone(), "scheduler")
            .collection(mongoelector::DEFAULT_COLLECTION)
            .ttl(ttl(h))
            .build()
            .unwrap();
        let _forced = other.acquire_with(mongolock::Acquire::new().force().auto_renew()).await.unwrap();
        tokio::time::timeout(WAIT, cancel.cancelled()).await.expect("term cancelled");
        assert_eq!(worker.await.unwrap(), None, "leader-only work was stopped");
        assert_eq!(started.load(Ordering::SeqCst), 1);
        assert!(!a.is_leader());
        a.stop().await;
    }

    pub(crate) async fn cluster_detail_lists_nodes<H: Harness>(h: &H) {
        let electors = nodes(h, "el_cluster_detail", 3).await;
        for e in &electors {
            e.start().unwrap();
        }
        let leader = wait_leader(&electors).await;
        for e in &electors {
            e.report_status().await.unwrap();
        }
        let detail = electors[0].cluster_detail().await.unwrap();
        assert_eq!(detail.nodes.len(), 3);
        let holder = detail.leader.unwrap();
        assert_eq!(Some(holder.fence), electors[leader].node_status().fence);
        let reported_leaders: Vec<_> = detail.nodes.iter().filter(|n| n.is_leader).collect();
        assert_eq!(reported_leaders.len(), 1);
        assert_eq!(reported_leaders[0].node, electors[leader].identity().to_string());
        assert!(detail.nodes.iter().all(|n| n.pid == std::process::id() && !n.version.is_empty()));
        let status = electors[leader].node_status();
        assert!(status.is_leader && status.running && status.terms_won == 1);
        for e in &electors {
            e.stop().await;
        }
    }

    pub(crate) async fn manual_poll<H: Harness>(h: &H) {
        let store = h.store("el_manual_poll").await;
        let make = || Elector::builder(store.clone(), "scheduler").ttl(ttl(h)).build().unwrap();
        let (a, b) = (make(), make());
        assert_eq!(a.poll().await.unwrap(), Role::Leader);
        assert_eq!(b.poll().await.unwrap(), Role::Follower);
        tokio::time::sleep(ttl(h) / 3).await;
        assert_eq!(a.poll().await.unwrap(), Role::Leader, "poll renews");
        assert!(a.is_leader() && !b.is_leader());
        a.stop().await;
        assert_eq!(b.poll().await.unwrap(), Role::Leader);
        b.stop().await;
        // Stopped, neither campaigns again by `poll` (the seed's `poll` checks its
        // shutdown flag), yet each still runs its round's `on_loop`; `start`
        // clears the stop.
        let loops = Arc::new(AtomicUsize::new(0));
        let (l, won) = (loops.clone(), Arc::new(AtomicUsize::new(0)));
        let w = won.clone();
        let c = Elector::builder(store.clone(), "scheduler")
            .ttl(ttl(h))
            .on_leader(move || {
                w.fetch_add(1, Ordering::SeqCst);
            })
            .on_loop(move || {
                l.fetch_add(1, Ordering::SeqCst);
            })
            .build()
            .unwrap();
        c.stop().await;
        for e in [&a, &b, &c] {
            assert_eq!(e.poll().await.unwrap(), Role::Follower, "a stopped elector's poll does not campaign");
            assert!(!e.is_leader());
        }
        assert!(!a.leader_exists().await.unwrap(), "no node leads after every one stopped");
        c.start().unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        while !c.is_leader() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(ttl(h) / 10).await;
        }
        assert!(c.is_leader(), "started again, it campaigns");
        c.stop().await;
        assert!(loops.load(Ordering::SeqCst) >= 1, "the stopped poll ran on_loop");
        assert_eq!(won.load(Ordering::SeqCst), 1, "on_leader only for the term won after start");
    }

    pub(crate) async fn dropping_the_handle_releases<H: Harness>(h: &H) {
        let mut electors = nodes(h, "el_drop", 2).await;
        for e in &electors {
            e.start().unwrap();
        }
        let first = wait_leader(&electors).await;
        let fence = electors[first].node_status().fence.unwrap();
        drop(electors.remove(first));
        let next = wait_leader(&electors).await;
        assert!(electors[next].node_status().fence.unwrap() > fence);
        electors[next].stop().await;
    }

    pub(crate) async fn bad_config_is_rejected<H: Harness>(h: &H) {
        let store = h.store("el_bad_config").await;
        let bad = |r: Result<Elector<H::Store>, ElectorError>, what: &str| {
            assert!(matches!(r, Err(ElectorError::Config(_))), "{what}: {r:?}");
        };
        bad(Elector::builder(store.clone(), "").build(), "empty key");
        bad(Elector::builder(store.clone(), "k").ttl(Duration::ZERO).build(), "zero ttl");
        bad(
            Elector::builder(store.clone(), "k")
                .ttl(Duration::from_secs(3))
                .renew_every(Duration::from_secs(3))
                .build(),
            "renew >= ttl",
        );
        bad(Elector::builder(store.clone(), "k").status_collection("").build(), "empty status collection");
    }
}
