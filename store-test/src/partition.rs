//! One client's view of a shared store, which a test can cut off (a network
//! partition, or a paused or dead process) while other clients go on: an
//! [`Intercept`] like any other, so no store is forwarded by hand.

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use store_memory::MemoryStore;
use store_trait::{Collection, FaultKind, Store, StoreError, StoreResult};

use crate::intercept::{Call, Intercept, Intercepted};

/// One client's connection to a shared [`MemoryStore`], with its own
/// partition switch ([`Partitionable::client`]).
pub type Client = Intercepted<MemoryStore, Partition>;

/// A partition switch: while it is on, every call fails as
/// [`FaultKind::Unreachable`] before it reaches the store.
#[derive(Debug, Default)]
pub struct Partition(AtomicBool);

#[async_trait]
impl<S: Store> Intercept<S> for Partition {
    async fn before(&self, _coll: Option<&Collection>, _call: Call<'_>) -> StoreResult<()> {
        if self.0.load(Ordering::SeqCst) {
            return Err(StoreError::backend(FaultKind::Unreachable, "injected: client partitioned"));
        }
        Ok(())
    }
}

impl<S> Intercepted<S, Partition> {
    /// Cuts this client off from the store (every operation fails as
    /// [`FaultKind::Unreachable`]) or reconnects it.
    pub fn set_partitioned(&self, cut: bool) {
        self.0.store(cut, Ordering::SeqCst);
    }
}

/// A new client of a store, with a partition switch of its own.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use store_test::Partitionable;
/// use store_trait::Store;
/// let store = store_memory::MemoryStore::new();
/// let a = store.client();
/// a.set_partitioned(true);
/// assert!(a.now().await.unwrap_err().is_retryable());
/// assert!(store.now().await.is_ok(), "others still reach the store");
/// # }
/// ```
pub trait Partitionable: Store + Clone + Sized {
    /// A new client view of this store, with its own partition switch.
    fn client(&self) -> Intercepted<Self, Partition> {
        Intercepted::new(self.clone())
    }
}

impl<S: Store + Clone> Partitionable for S {}
