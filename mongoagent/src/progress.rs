//! Progress reports: a running task's fenced write of how far it got.

use bson::{Bson, Document};
use store_trait::{Condition, Mutation, Store, Write, WriteOutcome};

use crate::error::AgentError;
use crate::schema::{fields, not_complete};
use crate::task::Task;

/// The largest progress value accepted, as BSON: progress is written on every
/// report, so it stays small (a counter and a few fields, not a result).
pub const MAX_PROGRESS_BYTES: usize = 16 * 1024;

impl Task {
    /// Records how far the handler got: `value` (a number, or a small document,
    /// or a document holding both) replaces the task's `progress` field and
    /// `progress_at` is set (store clock). Readers see it in
    /// [`Queue::tasks`](crate::Queue::tasks) and `mongocoord tasks --list`.
    ///
    /// The write is **fenced** by this run's claim: once the task was claimed
    /// again (this run's lease lapsed), cancelled, requeued, or it ended, the
    /// report is rejected with [`AgentError::ClaimLost`] and nothing changes;
    /// the handler should stop. It changes neither `ready` nor the lease, so
    /// it makes no task claimable.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped half-way, the report may or may not have been
    /// written (reporting again overwrites it).
    pub async fn progress(&self, value: impl Into<Bson>) -> Result<(), AgentError> {
        let value = checked_progress(value.into())?;
        let w = Write::new(
            Condition::FenceIs(self.fence).and(not_complete()),
            Mutation::new().set(fields::PROGRESS, value).set_now(fields::PROGRESS_AT),
        );
        match self.writes.store.write(&self.writes.coll, &self.key, &w).await? {
            WriteOutcome::Applied(_) => {
                tracing::debug!(task = %self.key, fence = self.fence, "progress recorded");
                Ok(())
            }
            WriteOutcome::Rejected(current) => {
                let current = current.map(|r| r.fence());
                tracing::warn!(task = %self.key, fence = self.fence, ?current, "progress of a stale run rejected");
                Err(AgentError::ClaimLost { task: self.key.to_string(), fence: self.fence, current })
            }
        }
    }
}

/// A number, or a document (whose field names the store accepts), of at most
/// [`MAX_PROGRESS_BYTES`].
fn checked_progress(value: Bson) -> Result<Bson, AgentError> {
    let bad = |why: String| Err(AgentError::InvalidProgress(why));
    match &value {
        Bson::Int32(_) | Bson::Int64(_) => {}
        Bson::Double(f) if f.is_finite() => {}
        Bson::Document(d) => {
            for k in d.keys() {
                if let Err(e) = store_trait::check_field_name(k) {
                    return bad(format!("bad field in the progress document: {e}"));
                }
            }
            let mut probe = Document::new();
            probe.insert("p", value.clone());
            let size = bson::serialize_to_vec(&probe).map_err(|e| AgentError::InvalidProgress(e.to_string()))?.len();
            if size > MAX_PROGRESS_BYTES {
                return bad(format!("{size} bytes; at most {MAX_PROGRESS_BYTES}"));
            }
        }
        other => return bad(format!("a finite number or a document, not {other}")),
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn progress_values() {
        assert!(checked_progress(Bson::Int64(3)).is_ok());
        assert!(checked_progress(Bson::Double(0.5)).is_ok());
        assert!(checked_progress(Bson::Document(doc! {"done": 3, "of": 10})).is_ok());
        assert!(checked_progress(Bson::Double(f64::NAN)).is_err());
        assert!(checked_progress(Bson::String("half".into())).is_err());
        assert!(checked_progress(Bson::Document(doc! {"$set": 1})).is_err());
        let big = "x".repeat(MAX_PROGRESS_BYTES);
        assert!(matches!(checked_progress(Bson::Document(doc! {"note": big})), Err(AgentError::InvalidProgress(_))));
    }
}
