//! What a backend provides to run the suites ([`Harness`]), and the parts of
//! the contract some servers break ([`Needs`]).

use std::time::Duration;

use bson::Document;
use store_trait::{Collection, Store};

/// What a backend provides to run the suite.
///
/// # Cancel safety
///
/// Test set-up, never raced: a dropped call may leave its store, document or
/// TTL pass half made, and the test that dropped it is over anyway.
#[async_trait::async_trait]
pub trait Harness: Send + Sync + 'static {
    /// The store under test.
    type Store: Store + Clone;
    /// A store isolated from every other test (own database or own instance),
    /// named from the test.
    async fn store(&self, test: &str) -> Self::Store;
    /// A lease length that is short but reliably longer than a few round trips.
    fn ttl(&self) -> Duration;
    /// Whether this backend must support change notifications (the suite fails if
    /// it reports `Unsupported` when they were expected, and vice versa).
    fn change_streams_expected(&self) -> bool;
    /// Inserts `doc` exactly as given, past every check of the contract: what
    /// another program writes (a UUID `_id`, a string `fence`).
    async fn insert_raw(&self, store: &Self::Store, coll: &Collection, doc: Document);
    /// Runs a TTL pass now: documents whose TTL-indexed date is past are deleted,
    /// as the server's TTL monitor does about once a minute.
    async fn prune_ttl(&self, store: &Self::Store);
    /// Whether the backend keeps `need`, a part of the contract some servers
    /// are known to break. When it does not, the harness reports `test`
    /// (skipped, naming the servers it runs on, or failed) and the test
    /// returns. Every backend of this workspace keeps it but for the servers
    /// `docs/test-servers.md` lists.
    async fn has(&self, test: &str, need: Needs) -> bool {
        let _ = (test, need);
        true
    }
}

/// A part of the contract that some servers are known to break: a test that
/// relies on it asks [`Harness::has`] first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Needs {
    /// A unique index lets go of a key once its document no longer holds it
    /// (a write changed or removed the field), so another document can take
    /// it. SecantusDB's Rust server keeps the key until the document is
    /// deleted.
    UniqueKeyRelease,
}
