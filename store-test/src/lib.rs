//! The workspace's test support, kept out of the product as sqlx keeps
//! `sqlx-test`: unpublished, and a dev-dependency only.
//!
//! - [`conformance`]: the conformance suite every backend runs in full, one
//!   file per topic, generated into a backend's tests by
//!   [`conformance_tests!`] with the backend's [`Harness`];
//! - [`memory`] and [`mongo`]: the harnesses of the two backends (the memory
//!   store under paused time; a real server, found or started for the test
//!   run, one database per test), and [`on_all_backends!`], which runs a
//!   behaviour suite on both;
//! - [`secantus`]: the pinned SecantusDB the Mongo harness starts when it
//!   finds no server (the pin is shared with `xtask`);
//! - [`suite`]: the attribute that turns a module of test bodies into a suite,
//!   each test registered by being written;
//! - [`Intercepted`]: one store wrapper that forwards every call, for tests
//!   that count, hold back or change some of them ([`Intercept`]);
//! - [`TestClock`]: a clock a test can step and skew.
//!
//! Run suites from integration tests: `store-memory` and `store-mongo`
//! dev-depend on this crate, which depends on them, so their unit tests
//! would see two copies of their own types.

mod clock;
pub mod conformance;
mod harness;
mod intercept;
mod machine;
pub mod memory;
pub mod mongo;
mod partition;
pub mod secantus;

pub use clock::TestClock;
pub use harness::{Harness, Needs};
pub use intercept::{Call, Intercept, Intercepted};
pub use machine::{free_port, target_dir, wait_for_port};
pub use partition::{Client, Partition, Partitionable};
pub use store_test_macros::suite;

/// Generates one test per conformance test, on the backend `$harness` gives:
/// a path to an `async fn() -> Option<impl Harness>` (`None` skips: the
/// backend reports why); `$attr` is the test attribute to use.
///
/// ```text
/// async fn harness() -> Option<MyHarness> { Some(MyHarness::new()) }
/// store_test::conformance_tests!(harness, #[tokio::test(start_paused = true)]);
/// ```
///
/// The tests are those of the topics of [`conformance`], each registered by
/// its module ([`suite`]): a test added to a topic runs on every backend.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:path, #[$attr:meta]) => {
        $crate::__conformance_leases!($harness, #[$attr]);
        $crate::__conformance_writes!($harness, #[$attr]);
        $crate::__conformance_claims!($harness, #[$attr]);
        $crate::__conformance_claim_many!($harness, #[$attr]);
        $crate::__conformance_documents!($harness, #[$attr]);
        $crate::__conformance_indexes!($harness, #[$attr]);
        $crate::__conformance_watch!($harness, #[$attr]);
    };
}

/// Runs a behaviour suite (a macro taking `(harness_fn, #[test_attr])`, as
/// [`suite`] generates) on every backend: the memory store under paused time
/// with and without change notifications (lease `$ttl`), and a real MongoDB
/// server ([`mongo::MongoHarness`]), in modules `memory`, `memory_polling`
/// and `mongo`.
#[macro_export]
macro_rules! on_all_backends {
    ($suite:path, $ttl:expr) => {
        mod memory {
            async fn harness() -> Option<$crate::memory::MemoryHarness> {
                Some($crate::memory::MemoryHarness::new($ttl))
            }
            $suite!(harness, #[tokio::test(start_paused = true)]);
        }
        mod memory_polling {
            async fn harness() -> Option<$crate::memory::MemoryHarness> {
                Some($crate::memory::MemoryHarness::polling($ttl))
            }
            $suite!(harness, #[tokio::test(start_paused = true)]);
        }
        mod mongo {
            async fn harness() -> Option<$crate::mongo::MongoHarness> {
                $crate::mongo::MongoHarness::get().await
            }
            $suite!(harness, #[tokio::test(flavor = "multi_thread", worker_threads = 2)]);
        }
    };
}
