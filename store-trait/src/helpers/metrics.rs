//! The figures the helpers emit through the [`metrics`](https://docs.rs/metrics)
//! facade: an application that installs a `metrics` recorder (a Prometheus
//! exporter, say) gets them; without one they cost next to nothing. Every
//! name starts with `store_`; [`describe`] gives the recorder their help
//! texts.
//!
//! | name | kind | labels | counts |
//! |---|---|---|---|
//! | [`WATCHER_RESYNCS`] | counter | `collection` | change subscriptions of a [`Watcher`](super::Watcher) made again after a failure (changes may have been missed) |

use crate::Collection;

/// `store_watcher_resyncs_total{collection}`: a [`Watcher`](super::Watcher)
/// subscribed again after its stream failed, and reported a
/// [`ChangeKind::Resync`](crate::ChangeKind::Resync).
pub const WATCHER_RESYNCS: &str = "store_watcher_resyncs_total";

/// Tells the installed recorder what each figure means (its help text). Call
/// it once after installing the recorder; figures are emitted without it too.
pub fn describe() {
    ::metrics::describe_counter!(
        WATCHER_RESYNCS,
        "Change subscriptions made again after a failure (changes may have been missed)"
    );
}

pub(crate) fn resync(coll: &Collection) {
    ::metrics::counter!(WATCHER_RESYNCS, "collection" => coll.to_string()).increment(1);
}
