//! The elector's errors.

use mongolock::{ConfigError, LockError};
use store_trait::StoreError;

/// Errors of the elector.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ElectorError {
    /// The configuration was rejected, with the error that rejected it where
    /// there is one. Nothing was written.
    #[error("invalid elector configuration: {0}")]
    Config(ConfigError),
    /// A lock operation failed. Never `LockError::Store`: a store fault
    /// under a lock operation is [`ElectorError::Store`], so one fault has
    /// one variant.
    #[error(transparent)]
    Lock(LockError),
    /// The store failed (under a lock operation too).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<LockError> for ElectorError {
    fn from(e: LockError) -> Self {
        match e {
            LockError::Store(e) => ElectorError::Store(e),
            e => ElectorError::Lock(e),
        }
    }
}

/// A status document that could not be read as a [`crate::status::NodeReport`]: written
/// by something else, or by hand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("status document {id}: field `{field}` {problem}")]
pub struct MalformedReport {
    /// The document's `_id`.
    pub id: String,
    /// The first field that could not be read.
    pub field: &'static str,
    /// What is wrong with it: missing, of another type, or out of range.
    pub problem: &'static str,
}
