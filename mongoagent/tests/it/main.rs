//! Integration tests of the agents: one behavioural suite on the in-memory store
//! (paused time, with and without change notifications) and on a real server,
//! and a deterministic simulation with crashes, partitions and faults.
#![allow(clippy::unwrap_used, missing_docs)]

mod simulation;
mod suite;

use std::time::Duration;

use store_memory::MemoryStore;
use store_trait::testing::Harness;

#[derive(Debug)]
pub(crate) struct Memory {
    pub(crate) change_streams: bool,
}

#[async_trait::async_trait]
impl Harness for Memory {
    type Store = MemoryStore;
    async fn store(&self, _test: &str) -> MemoryStore {
        MemoryStore::builder().change_streams(self.change_streams).build()
    }
    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }
    fn change_streams_expected(&self) -> bool {
        self.change_streams
    }
}

mod memory {
    async fn harness() -> Option<super::Memory> {
        Some(super::Memory { change_streams: true })
    }
    crate::agent_suite!(harness, #[tokio::test(start_paused = true)]);
}

mod memory_polling {
    async fn harness() -> Option<super::Memory> {
        Some(super::Memory { change_streams: false })
    }
    crate::agent_suite!(harness, #[tokio::test(start_paused = true)]);
}

mod mongo {
    async fn harness() -> Option<store_mongo::testing::MongoHarness> {
        store_mongo::testing::MongoHarness::get().await
    }
    crate::agent_suite!(harness, #[tokio::test(flavor = "multi_thread", worker_threads = 2)]);
}
