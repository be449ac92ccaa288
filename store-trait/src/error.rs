//! The one error type of the store contract.

use std::fmt;

use crate::Key;

/// How a backend fault should be treated by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultKind {
    /// A network blip, a primary stepping down, a retryable server error: trying
    /// again may succeed. **The operation may or may not have been applied**; callers
    /// that need to know must read back (owner, fence) before they assume either.
    Transient,
    /// No server could be reached or selected within the configured timeout.
    Unreachable,
    /// The operation did not finish within its deadline; it may still be applied.
    Timeout,
    /// The server refused the operation for a reason retrying will not fix
    /// (authorization, invalid command, unsupported server version, …).
    Permanent,
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultKind::Transient => "transient",
            FaultKind::Unreachable => "unreachable",
            FaultKind::Timeout => "timeout",
            FaultKind::Permanent => "permanent",
        })
    }
}

/// Everything a store operation can fail with.
///
/// A condition that did not hold is **not** an error: conditional writes return
/// [`WriteOutcome::Rejected`](crate::WriteOutcome::Rejected) carrying the current
/// record (who holds it, until when, with which fence).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An argument was rejected before anything was sent: an empty key, an invalid
    /// collection name, a zero TTL, a field name the store reserves, …
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// Which argument.
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// A stored document cannot be read as a record: a reserved field has the
    /// wrong type. Nothing was changed.
    #[error("document {key} in {collection} is malformed: {reason}")]
    Malformed {
        /// The collection.
        collection: String,
        /// The document's key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A write would violate a unique index.
    #[error("duplicate key in {collection}: {key}")]
    DuplicateKey {
        /// The collection.
        collection: String,
        /// The key (or index value) that already exists.
        key: String,
    },
    /// The backend cannot do this here, e.g. change streams on a standalone
    /// `mongod`. Callers fall back (to polling, for change streams).
    #[error("not supported by this store: {feature} ({reason})")]
    Unsupported {
        /// The feature asked for.
        feature: &'static str,
        /// Why it is not available.
        reason: String,
    },
    /// The backend failed. See [`FaultKind`] for what to do about it.
    #[error("{kind} store fault{}: {message}", code.map(|c| format!(" (code {c})")).unwrap_or_default())]
    Backend {
        /// Transient, unreachable, timeout or permanent.
        kind: FaultKind,
        /// The server's error code, where there is one.
        code: Option<i32>,
        /// A description from the backend.
        message: String,
        /// The backend's own error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
}

impl StoreError {
    /// An [`StoreError::InvalidInput`].
    pub fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        StoreError::InvalidInput { what, reason: reason.into() }
    }

    /// A [`StoreError::Backend`] without a source error.
    pub fn backend(kind: FaultKind, message: impl Into<String>) -> Self {
        StoreError::Backend { kind, code: None, message: message.into(), source: None }
    }

    /// A [`StoreError::Malformed`] for a document.
    pub fn malformed(collection: &str, key: &Key, reason: impl Into<String>) -> Self {
        StoreError::Malformed { collection: collection.to_owned(), key: key.to_string(), reason: reason.into() }
    }

    /// The fault kind, for backend errors.
    pub fn fault_kind(&self) -> Option<FaultKind> {
        match self {
            StoreError::Backend { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// True when trying again may succeed (transient faults, timeouts and an
    /// unreachable server). Input errors and permanent faults are not retryable.
    pub fn is_retryable(&self) -> bool {
        matches!(self.fault_kind(), Some(FaultKind::Transient | FaultKind::Timeout | FaultKind::Unreachable))
    }

    /// True when the operation may have been applied even though it failed
    /// (transient faults and timeouts): the caller must read back to know.
    pub fn is_ambiguous(&self) -> bool {
        matches!(self.fault_kind(), Some(FaultKind::Transient | FaultKind::Timeout))
    }
}

/// Results of store operations.
pub type StoreResult<T> = Result<T, StoreError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let e = StoreError::backend(FaultKind::Transient, "boom");
        assert!(e.is_retryable() && e.is_ambiguous());
        assert_eq!(e.to_string(), "transient store fault: boom");
        let e = StoreError::Backend {
            kind: FaultKind::Permanent,
            code: Some(13),
            message: "unauthorized".into(),
            source: None,
        };
        assert!(!e.is_retryable());
        assert_eq!(e.to_string(), "permanent store fault (code 13): unauthorized");
        assert!(!StoreError::invalid("key", "empty").is_retryable());
        assert!(StoreError::backend(FaultKind::Unreachable, "x").is_retryable());
        assert!(!StoreError::backend(FaultKind::Unreachable, "x").is_ambiguous());
    }
}
