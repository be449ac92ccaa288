//! The in-memory backend's harness for the conformance suite and the behaviour
//! suites of the crates above, and a random schedule of its faults.

use std::time::Duration;

use store_memory::MemoryStore;

/// A fresh memory store per test; with or without change notifications.
#[derive(Debug, Clone, Copy)]
pub struct MemoryHarness {
    /// Whether the stores have change notifications.
    pub change_streams: bool,
    /// The lease length suites use.
    pub ttl: Duration,
}

impl MemoryHarness {
    /// With change notifications and a lease of `ttl`.
    pub fn new(ttl: Duration) -> Self {
        MemoryHarness { change_streams: true, ttl }
    }

    /// Without change notifications (callers must poll), lease `ttl`.
    pub fn polling(ttl: Duration) -> Self {
        MemoryHarness { change_streams: false, ttl }
    }
}

#[async_trait::async_trait]
impl crate::Harness for MemoryHarness {
    type Store = MemoryStore;
    async fn store(&self, _test: &str) -> MemoryStore {
        MemoryStore::builder().change_streams(self.change_streams).build()
    }
    fn ttl(&self) -> Duration {
        self.ttl
    }
    fn change_streams_expected(&self) -> bool {
        self.change_streams
    }
    async fn insert_raw(&self, store: &MemoryStore, coll: &store_trait::Collection, doc: bson::Document) {
        store.insert_raw(coll, doc);
    }
    async fn prune_ttl(&self, store: &MemoryStore) {
        store.prune_ttl();
    }
}

/// A random schedule of the store's faults beyond "fail before apply", for
/// simulations, counting how many of each it injected (so a simulation can
/// assert that each kind happened).
#[derive(Debug, Default)]
pub struct FaultSchedule {
    /// "Applied, then an error" injections.
    pub after_apply: u32,
    /// Latency windows.
    pub latency: u32,
    /// Times every change stream was ended.
    pub streams_ended: u32,
}

impl FaultSchedule {
    /// Injects one fault, chosen with `rng`: the next one or two operations are
    /// applied and then fail (the caller cannot tell whether they happened); or
    /// every operation is slow (20–400 ms) for 0.5–5 s; or every change stream
    /// ends, so watchers must subscribe again. Needs a tokio runtime.
    pub fn inject(&mut self, store: &MemoryStore, rng: &mut fastrand::Rng) {
        match rng.u32(..3) {
            0 => {
                store.faults().fail_next_after_apply(u64::from(rng.u32(1..3)));
                self.after_apply += 1;
            }
            1 => {
                store.faults().set_latency(Duration::from_millis(rng.u64(20..400)));
                let (store, d) = (store.clone(), Duration::from_millis(rng.u64(500..5_000)));
                tokio::spawn(async move {
                    tokio::time::sleep(d).await;
                    store.faults().set_latency(Duration::ZERO);
                });
                self.latency += 1;
            }
            _ => {
                store.faults().end_change_streams();
                self.streams_ended += 1;
            }
        }
    }
}
