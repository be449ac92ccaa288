//! Errors of the lock.

use std::time::Duration;

use store_trait::{Key, Record, StoreError};

use crate::info::{foreign_fields, LockInfo};

/// Everything a lock operation can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// A non-blocking acquire found the lock held by someone else.
    #[error("lock {key} is held by {} until {} (fence {})", holder.owner, holder.expires, holder.fence)]
    Held {
        /// The lock's key.
        key: String,
        /// Who holds it, until when, with which fence.
        holder: Box<LockInfo>,
    },
    /// A blocking acquire gave up after its timeout.
    #[error("timed out after {waited:?} waiting for lock {key}{}", holder.as_ref().map(|h| format!(" (held by {} until {})", h.owner, h.expires)).unwrap_or_default())]
    Timeout {
        /// The lock's key.
        key: String,
        /// How long it waited.
        waited: Duration,
        /// The holder when it gave up, if known.
        holder: Option<Box<LockInfo>>,
    },
    /// This acquisition no longer holds the lock: its lease lapsed, was taken by
    /// force, or was released. `current` is the lock as the store has it now.
    #[error("lock {key} (fence {fence}) was lost{}", current.as_ref().map(|h| format!("; now held by {} (fence {})", h.owner, h.fence)).unwrap_or_default())]
    Lost {
        /// The lock's key.
        key: String,
        /// The fence of the acquisition that lost it.
        fence: u64,
        /// The current holder, if any.
        current: Option<Box<LockInfo>>,
    },
    /// The operation needs a held lock and this instance holds none.
    #[error("lock {key} is not held by this instance")]
    NotHeld {
        /// The lock's key.
        key: String,
    },
    /// The lock's document was written by another program's lock: the Python
    /// `MongoLocker` (`uuid`, `locked`, `ts_expire`). It has no lease this crate
    /// can read, so it would look free, and that program deletes documents whose
    /// `ts_expire` passed, which would reset this lock's fence. It is never taken
    /// nor reported free; the two programs must not share a key.
    #[error("lock {key} is a document of another program's lock (fields {}); it is never taken", fields.join(", "))]
    Foreign {
        /// The lock's key.
        key: String,
        /// The foreign lock fields the document has.
        fields: Vec<&'static str>,
    },
    /// A write through a lock's guard asked to mark the lock's document for
    /// garbage collection. Lock documents never get a `gc_at`, so no TTL index
    /// can delete one and reset its fence (only guards of task leases, kept
    /// through [`LeasesBuilder::allow_gc`](crate::unstable::LeasesBuilder::allow_gc), may). Nothing was
    /// written by this call.
    #[error("lock {key}: a lock document is never marked for garbage collection")]
    GcOnLock {
        /// The lock's key.
        key: String,
    },
    /// The configuration was rejected (empty key, ttl zero or too large, renew
    /// interval not below the ttl, …), with the error that rejected it where
    /// there is one. Nothing was written.
    #[error("invalid lock configuration: {0}")]
    Config(ConfigError),
    /// The store failed. See [`StoreError::is_retryable`].
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl LockError {
    /// Whether trying again later may succeed (held, timed out, transient store faults).
    pub fn is_retryable(&self) -> bool {
        match self {
            LockError::Held { .. } | LockError::Timeout { .. } => true,
            LockError::Store(e) => e.is_retryable(),
            _ => false,
        }
    }
}

/// Why a configuration was rejected: what is wrong and, where another error
/// rejected it (an invalid key, collection name or ttl from `store_trait`, the
/// lease of a lock the configuration builds), that error as its
/// [`source`](std::error::Error::source).
///
/// The `Config` variant of [`LockError`], `mongoelector::ElectorError` and
/// `mongoagent::AgentError` carries one. Its message is the reason, the
/// source's own message when there is a source, so a caller that prints only
/// the error's message (as the CLI does) loses nothing.
///
/// ```
/// use std::error::Error as _;
/// use mongolock::{ConfigError, LockError};
///
/// let e = LockError::Config(ConfigError::caused_by(store_trait::Key::new("").unwrap_err()));
/// assert!(e.to_string().starts_with("invalid lock configuration: invalid key"));
/// let LockError::Config(c) = &e else { unreachable!() };
/// assert!(c.source().unwrap().downcast_ref::<store_trait::StoreError>().is_some());
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct ConfigError {
    reason: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl ConfigError {
    /// A rejection that no other error caused: `reason` says what is wrong.
    pub fn new(reason: impl Into<String>) -> Self {
        ConfigError { reason: reason.into(), source: None }
    }

    /// A rejection by another error, which it keeps as its source; its
    /// message is the reason.
    pub fn caused_by(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        ConfigError { reason: source.to_string(), source: Some(Box::new(source)) }
    }

    /// This rejection, caused by `source` (which `reason` may quote).
    #[must_use]
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// What is wrong.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl From<String> for ConfigError {
    fn from(reason: String) -> Self {
        ConfigError::new(reason)
    }
}

impl From<&str> for ConfigError {
    fn from(reason: &str) -> Self {
        ConfigError::new(reason)
    }
}

impl From<StoreError> for ConfigError {
    fn from(source: StoreError) -> Self {
        ConfigError::caused_by(source)
    }
}

/// `Err(Foreign)` when `record` is another program's lock document.
pub(crate) fn check_native(key: &Key, record: Option<&Record>) -> Result<(), LockError> {
    match record.map(|r| foreign_fields(r.data())) {
        Some(fields) if !fields.is_empty() => Err(LockError::Foreign { key: key.to_string(), fields }),
        _ => Ok(()),
    }
}
