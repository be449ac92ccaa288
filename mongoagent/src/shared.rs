//! State that the clones of one [`Queue`](crate::queue::Queue) share on behalf
//! of the machinery built on it, each part by its own type.
//!
//! Why a slot and not a field per part: agents built on clones of one
//! `Queue` take turns claiming (their claim gate) and share one view of the
//! pause state (the control task), so that state must travel with the
//! queue's clones; but it is the agents', not the producer's. A typed slot
//! keeps the queue free of the agent's types (the queue sits below the agent
//! and never names it), as `http::Extensions` keeps a request free of its
//! middleware's.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// One value per type, created on first use, shared by every clone.
#[derive(Clone, Default)]
pub(crate) struct Shared {
    parts: Arc<Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("parts", &self.parts.lock().len()).finish()
    }
}

impl Shared {
    /// The clones' one `T`, made with `T::default()` by the first caller.
    pub(crate) fn get<T: Any + Send + Sync + Default>(&self) -> Arc<T> {
        let mut parts = self.parts.lock();
        let part = parts.entry(TypeId::of::<T>()).or_insert_with(|| Arc::new(T::default()));
        match Arc::clone(part).downcast::<T>() {
            Ok(t) => t,
            // The map is keyed by the value's own `TypeId`: unreachable, but
            // a fresh, unshared value is the safe answer all the same.
            Err(_) => Arc::new(T::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Counter(std::sync::atomic::AtomicU32);

    #[test]
    fn clones_share_one_value_per_type() {
        let a = Shared::default();
        let b = a.clone();
        a.get::<Counter>().0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(b.get::<Counter>().0.load(std::sync::atomic::Ordering::Relaxed), 1);
        let other = Shared::default();
        assert_eq!(other.get::<Counter>().0.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}
