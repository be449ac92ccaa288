//! Fault injection: failures and latency the crates above must survive.

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

/// Fault injection for a [`MemoryStore`](crate::MemoryStore): failures and latency that the crates
/// above must survive. All counters are shared by clones of the store.
#[derive(Debug)]
pub struct Faults {
    pub(crate) fail_before: AtomicU64,
    pub(crate) fail_after: AtomicU64,
    pub(crate) latency_ms: AtomicU64,
    pub(crate) unreachable: std::sync::atomic::AtomicBool,
    /// Bumped to end every open change stream.
    pub(crate) streams: tokio::sync::watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            fail_before: AtomicU64::new(0),
            fail_after: AtomicU64::new(0),
            latency_ms: AtomicU64::new(0),
            unreachable: std::sync::atomic::AtomicBool::new(false),
            streams: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Faults {
    /// The next `n` operations fail with a transient error **without** being applied.
    pub fn fail_next(&self, n: u64) {
        self.fail_before.store(n, AtomicOrdering::SeqCst);
    }

    /// The next `n` operations are **applied** and then report a transient error, as
    /// when a connection drops after the server committed: the ambiguous case.
    pub fn fail_next_after_apply(&self, n: u64) {
        self.fail_after.store(n, AtomicOrdering::SeqCst);
    }

    /// Every operation takes this long (on tokio time) before it is applied.
    pub fn set_latency(&self, d: Duration) {
        self.latency_ms.store(u64::try_from(d.as_millis()).unwrap_or(u64::MAX), AtomicOrdering::SeqCst);
    }

    /// While set, every operation fails with [`FaultKind::Unreachable`](store_trait::FaultKind::Unreachable).
    pub fn set_unreachable(&self, on: bool) {
        self.unreachable.store(on, AtomicOrdering::SeqCst);
    }

    /// Ends every open change stream, as a server restart or a dropped
    /// connection does; new subscriptions work.
    pub fn end_change_streams(&self) {
        self.streams.send_modify(|g| *g += 1);
    }

    /// Clears all faults.
    pub fn clear(&self) {
        self.fail_next(0);
        self.fail_next_after_apply(0);
        self.set_latency(Duration::ZERO);
        self.set_unreachable(false);
    }

    pub(crate) fn take(counter: &AtomicU64) -> bool {
        counter.fetch_update(AtomicOrdering::SeqCst, AtomicOrdering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}
