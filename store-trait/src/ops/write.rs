//! Conditional writes, their outcomes, and the nonce a retry reuses.

use crate::{Condition, Mutation, Record, StoreError, StoreResult};

/// A conditional write to one document: "if `condition` holds now, apply
/// `mutation`", optionally creating the document.
///
/// ```
/// use store_trait::{Condition, Mutation, Write, Ttl};
/// use std::time::Duration;
///
/// let ttl = Ttl::new(Duration::from_secs(15)).unwrap();
/// let acquire = Write::new(
///     Condition::Free.or(Condition::HeldBy("me".into())),
///     Mutation::new().grant("me", ttl).bump_fence(),
/// )
/// .upsert();
/// assert!(acquire.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    /// When to apply.
    pub condition: Condition,
    /// What to apply.
    pub mutation: Mutation,
    /// Create the document when it does not exist (the condition must then hold
    /// for an absent document).
    pub upsert: bool,
    /// The caller's name for this write, kept across its retries (see
    /// [`Write::with_nonce`]).
    pub nonce: Option<Nonce>,
}

impl Write {
    /// A write of `mutation` guarded by `condition`, not creating documents.
    pub fn new(condition: Condition, mutation: Mutation) -> Self {
        Write { condition, mutation, upsert: false, nonce: None }
    }

    /// Creates the document if it does not exist.
    #[must_use]
    pub fn upsert(mut self) -> Self {
        self.upsert = true;
        self
    }

    /// Names this write with `nonce`, so that a retry of it (the same `Write`,
    /// sent again after an ambiguous error) can tell whether an earlier attempt
    /// was applied: the store records the nonce of every applied write in
    /// [`fields::LAST_OP`](crate::fields::LAST_OP), and
    /// [`WriteOutcome::applied_with`] reads it back. Only the last applied write
    /// is recorded: a write applied by someone else since then hides an earlier
    /// application, which the caller must then treat as unknown, never as done.
    ///
    /// ```
    /// use store_trait::{Condition, Mutation, Nonce, Write};
    ///
    /// let nonce = Nonce::generate();
    /// let release = Write::new(Condition::FenceIs(7), Mutation::new().release()).with_nonce(nonce.clone());
    /// assert_eq!(release.nonce, Some(nonce));
    /// ```
    #[must_use]
    pub fn with_nonce(mut self, nonce: Nonce) -> Self {
        self.nonce = Some(nonce);
        self
    }

    /// The value an attempt of this write stamps into
    /// [`fields::LAST_OP`](crate::fields::LAST_OP): the write's nonce, if any,
    /// and the backend's `attempt` nonce (unique per call, without `/`), so that
    /// the attempt itself is recognisable too.
    pub fn stamp(&self, attempt: &str) -> String {
        match &self.nonce {
            Some(n) => format!("{}/{attempt}", n.0),
            None => attempt.to_owned(),
        }
    }

    /// Checks the parts, and that an upsert's condition holds for an absent
    /// document (otherwise it could never create one).
    pub fn validate(&self) -> StoreResult<()> {
        self.condition.validate()?;
        self.mutation.validate()?;
        if self.upsert && !crate::backend::semantics::eval(&self.condition, None, crate::StoreTime::from_millis(0)) {
            return Err(StoreError::invalid(
                "write",
                "upsert with a condition that can never hold for an absent document",
            ));
        }
        Ok(())
    }
}

/// What a conditional write did.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOutcome {
    /// The condition held; this is the document after the write.
    Applied(Record),
    /// The condition did not hold; nothing changed. This is the current document
    /// (`None` when it does not exist) — who holds it, until when, which fence.
    Rejected(Option<Record>),
}

impl WriteOutcome {
    /// Whether the write was applied.
    pub fn is_applied(&self) -> bool {
        matches!(self, WriteOutcome::Applied(_))
    }

    /// The record, applied or current.
    pub fn record(&self) -> Option<&Record> {
        match self {
            WriteOutcome::Applied(r) => Some(r),
            WriteOutcome::Rejected(r) => r.as_ref(),
        }
    }

    /// Whether the last write applied to the document carries `nonce`: this
    /// write, or an earlier attempt of it (see [`Write::with_nonce`]). `false`
    /// says nothing about an earlier attempt when another write was applied
    /// after it.
    pub fn applied_with(&self, nonce: &Nonce) -> bool {
        self.record().is_some_and(|r| r.last_nonce() == Some(nonce.as_str()))
    }
}

/// What one write of a batch ([`Store::write_many`](crate::Store::write_many)) did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum BatchOutcome {
    /// The condition held and the mutation was applied. (A batch does not read
    /// applied documents back.)
    Applied,
    /// The condition did not hold; nothing changed. This is the document as
    /// read after the batch (`None` when it does not exist), so a retry can
    /// recognise an earlier attempt of the same write by its nonce.
    Rejected(Option<Box<Record>>),
}

impl BatchOutcome {
    /// Whether the write was applied.
    pub fn is_applied(&self) -> bool {
        matches!(self, BatchOutcome::Applied)
    }
}

impl From<WriteOutcome> for BatchOutcome {
    fn from(o: WriteOutcome) -> Self {
        match o {
            WriteOutcome::Applied(_) => BatchOutcome::Applied,
            WriteOutcome::Rejected(r) => BatchOutcome::Rejected(r.map(Box::new)),
        }
    }
}

/// A caller-chosen name for one logical write, reused across its retries (see
/// [`Write::with_nonce`]). Never contains `/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Nonce(String);

impl Nonce {
    /// A fresh nonce, unique across processes (an `ObjectId`'s hex).
    pub fn generate() -> Nonce {
        Nonce(bson::oid::ObjectId::new().to_hex())
    }

    /// A nonce of the caller's choosing: non-empty, at most 128 bytes, no `/`.
    pub fn new(s: impl Into<String>) -> StoreResult<Nonce> {
        let s = s.into();
        if s.is_empty() || s.len() > 128 || s.contains('/') {
            return Err(StoreError::invalid("nonce", format!("{s:?}: must be 1 to 128 bytes without '/'")));
        }
        Ok(Nonce(s))
    }

    /// The nonce as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Nonce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a conditional delete did.
#[derive(Debug, Clone, PartialEq)]
pub enum DeleteOutcome {
    /// Deleted; this was the document.
    Deleted(Record),
    /// The condition did not hold (or the document did not exist); this is the
    /// current document, if any.
    Rejected(Option<Record>),
}
