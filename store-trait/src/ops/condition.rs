//! Conditions: predicates on one document's current state, evaluated by the
//! store at its own time.

use bson::Bson;

use crate::{check_field_name, StoreError, StoreResult};

/// A predicate on the current state of one document, evaluated by the store at
/// its own current time, atomically with the write it guards.
///
/// ```
/// use store_trait::Condition;
///
/// // "if absent, or its lease has expired on the store clock, or I am its owner"
/// let acquire = Condition::Free.or(Condition::OwnedBy("me".into()));
/// # let _ = acquire;
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Condition {
    /// Always true.
    Always,
    /// The document does not exist (or exists without store metadata, i.e. was never
    /// written through the store).
    Absent,
    /// Nobody holds a live lease: the document is absent, released, or its lease has
    /// lapsed on the store clock.
    Free,
    /// `owner` holds a **live** lease.
    HeldBy(String),
    /// `owner` is recorded as the lease owner, live or lapsed (not released).
    OwnedBy(String),
    /// The fencing counter equals this value.
    FenceIs(u64),
    /// The revision equals this value (plain compare-and-set).
    RevIs(u64),
    /// A user field is present and equals this value (numbers compare by value).
    FieldEq(String, Bson),
    /// A user field is present and not null.
    Exists(String),
    /// A user field holding a date or epoch milliseconds is at or before the store's
    /// current time; a missing, null or unreadable value counts as due.
    DueBy(String),
    /// A user field is missing, null, or a number at most this value; any other
    /// value fails. What fences an external resource: "write only if the last
    /// fence written is not newer than mine".
    AtMost(String, i64),
    /// Negation.
    Not(Box<Condition>),
    /// Conjunction (true when empty).
    All(Vec<Condition>),
    /// Disjunction (false when empty).
    Any(Vec<Condition>),
}

impl Condition {
    /// `self AND other`.
    #[must_use]
    pub fn and(self, other: Condition) -> Condition {
        match self {
            Condition::All(mut v) => {
                v.push(other);
                Condition::All(v)
            }
            Condition::Always => other,
            c => Condition::All(vec![c, other]),
        }
    }

    /// `self OR other`.
    #[must_use]
    pub fn or(self, other: Condition) -> Condition {
        match self {
            Condition::Any(mut v) => {
                v.push(other);
                Condition::Any(v)
            }
            c => Condition::Any(vec![c, other]),
        }
    }

    /// `NOT self`.
    #[must_use]
    pub fn negate(self) -> Condition {
        Condition::Not(Box::new(self))
    }

    /// Checks field names and values.
    pub fn validate(&self) -> StoreResult<()> {
        match self {
            Condition::HeldBy(o) | Condition::OwnedBy(o) if o.is_empty() => {
                Err(StoreError::invalid("owner", "an owner identity must not be empty"))
            }
            Condition::FenceIs(n) | Condition::RevIs(n) if i64::try_from(*n).is_err() => {
                Err(StoreError::invalid("counter", format!("{n} does not fit in an i64")))
            }
            Condition::FieldEq(f, v) => {
                check_field_name(f)?;
                if matches!(v, Bson::Null) {
                    return Err(StoreError::invalid(
                        "condition",
                        format!("FieldEq({f:?}, null): use Exists({f:?}).negate() for null-or-missing"),
                    ));
                }
                Ok(())
            }
            Condition::Exists(f) | Condition::DueBy(f) | Condition::AtMost(f, _) => check_field_name(f),
            Condition::Not(c) => c.validate(),
            Condition::All(cs) | Condition::Any(cs) => cs.iter().try_for_each(Condition::validate),
            _ => Ok(()),
        }
    }
}
