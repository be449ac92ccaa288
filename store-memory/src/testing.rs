//! The in-memory backend's harness for `store_trait`'s conformance suite and the
//! behaviour suites of the crates above.

use std::time::Duration;

use crate::MemoryStore;

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
impl store_trait::testing::Harness for MemoryHarness {
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
