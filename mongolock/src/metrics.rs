//! The figures `mongolock` emits through the [`metrics`](https://docs.rs/metrics)
//! facade, so an application that installs a `metrics` recorder (a Prometheus
//! exporter, say) gets them without the CLI; without one they cost next to
//! nothing. Every name starts with `mongolock_`; [`describe`] gives the
//! recorder their help texts. They are process-local: each process reports
//! the leases it took, and a scrape of every process adds up to the cluster.
//!
//! | name | kind | labels | counts |
//! |---|---|---|---|
//! | [`ACQUISITIONS`] | counter | `collection` | leases this process was granted (a lock's, or an agent's claim of a task: those count under the queue's collection) |
//! | [`LOSSES`] | counter | `collection` | leases that ended lost instead of released (see [`LockGuard::lost`](crate::LockGuard::lost)) |
//!
//! The key is no label: task claims are leases too, one key per task.

use store_trait::Collection;

/// `mongolock_acquisitions_total{collection}`: a lease granted to this
/// process (counted where [`LockMetrics::acquisitions`](crate::LockMetrics::acquisitions) is).
pub const ACQUISITIONS: &str = "mongolock_acquisitions_total";

/// `mongolock_losses_total{collection}`: a lease of this process that ended
/// lost (counted where [`LockMetrics::losses`](crate::LockMetrics::losses) is).
pub const LOSSES: &str = "mongolock_losses_total";

/// Tells the installed recorder what each figure means (its help text). Call
/// it once after installing the recorder; figures are emitted without it too.
pub fn describe() {
    ::metrics::describe_counter!(ACQUISITIONS, "Leases granted to this process (locks, and task claims)");
    ::metrics::describe_counter!(LOSSES, "Leases of this process that ended lost instead of released");
}

pub(crate) fn acquired(coll: &Collection) {
    ::metrics::counter!(ACQUISITIONS, "collection" => coll.to_string()).increment(1);
}

pub(crate) fn lost(coll: &Collection) {
    ::metrics::counter!(LOSSES, "collection" => coll.to_string()).increment(1);
}
