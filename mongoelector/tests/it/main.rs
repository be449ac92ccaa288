//! Integration tests of the elector: one behavioural suite on the in-memory store
//! (paused time, with and without change notifications) and on a real server; a
//! deterministic one-hour simulation; crash failover on the real server.
#![allow(clippy::unwrap_used, missing_docs)]

mod crash;
mod executor;
mod simulation;
mod suite;

mod memory {
    async fn harness() -> Option<store_memory::testing::MemoryHarness> {
        Some(store_memory::testing::MemoryHarness::new(std::time::Duration::from_secs(3)))
    }
    crate::elector_suite!(harness, #[tokio::test(start_paused = true)]);
}

mod memory_polling {
    async fn harness() -> Option<store_memory::testing::MemoryHarness> {
        Some(store_memory::testing::MemoryHarness::polling(std::time::Duration::from_secs(3)))
    }
    crate::elector_suite!(harness, #[tokio::test(start_paused = true)]);
}

mod mongo {
    async fn harness() -> Option<store_mongo::testing::MongoHarness> {
        store_mongo::testing::MongoHarness::get().await
    }
    crate::elector_suite!(harness, #[tokio::test(flavor = "multi_thread", worker_threads = 2)]);
}
