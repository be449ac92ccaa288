//! Integration tests of the MongoDB store against a real server: the whole
//! conformance suite, plus what only a real server can show (one command per
//! operation, failpoints).
#![allow(clippy::unwrap_used)]

mod batches;
mod claim_many;
mod filters;
mod lag;
mod pool;
mod reference;
mod round_trips;
mod versions;

use store_test::mongo::MongoHarness;

async fn harness() -> Option<MongoHarness> {
    MongoHarness::get().await
}

store_test::conformance_tests!(harness, #[tokio::test(flavor = "multi_thread", worker_threads = 2)]);
