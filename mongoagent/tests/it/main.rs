//! Integration tests of the agents: one behavioural suite on the in-memory store
//! (paused time, with and without change notifications) and on a real server,
//! and a deterministic simulation with crashes, partitions and faults.
#![allow(clippy::unwrap_used, missing_docs)]

mod simulation;
mod suite;

mod memory {
    async fn harness() -> Option<store_memory::testing::MemoryHarness> {
        Some(store_memory::testing::MemoryHarness::new(std::time::Duration::from_secs(2)))
    }
    crate::agent_suite!(harness, #[tokio::test(start_paused = true)]);
}

mod memory_polling {
    async fn harness() -> Option<store_memory::testing::MemoryHarness> {
        Some(store_memory::testing::MemoryHarness::polling(std::time::Duration::from_secs(2)))
    }
    crate::agent_suite!(harness, #[tokio::test(start_paused = true)]);
}

mod mongo {
    async fn harness() -> Option<store_mongo::testing::MongoHarness> {
        store_mongo::testing::MongoHarness::get().await
    }
    crate::agent_suite!(harness, #[tokio::test(flavor = "multi_thread", worker_threads = 2)]);
}
