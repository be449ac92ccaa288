//! Mutations: what a write changes, lease and fence included.

use std::time::Duration;

use bson::{Bson, Document};

use crate::{check_field_name, StoreError, StoreResult, Ttl};

/// What a successful write does to the lease.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LeaseOp {
    /// Leave the lease as it is.
    #[default]
    Keep,
    /// Grant (or renew) a lease to `owner` until store-now + `ttl`. `lease_since` is
    /// kept when the same owner renews a live lease, else set to store-now.
    Grant {
        /// The new holder.
        owner: String,
        /// The lease length, from the store's current time.
        ttl: Ttl,
    },
    /// Release: clear owner, since and until. The fencing counter is kept.
    Release,
}

/// The changes a write applies when its condition holds. Applied atomically on the
/// store in one round trip.
///
/// ```
/// use store_trait::{Mutation, Ttl};
/// use std::time::Duration;
///
/// let m = Mutation::new()
///     .grant("worker-1", Ttl::new(Duration::from_secs(30)).unwrap())
///     .bump_fence()
///     .set("ready", false)
///     .set_now("started_at")
///     .inc("attempts", 1);
/// assert!(m.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct Mutation {
    /// The lease change.
    pub lease: LeaseOp,
    /// Whether the fencing counter grows by one.
    pub bump_fence: bool,
    /// User fields to set.
    pub set: Document,
    /// User fields to remove.
    pub unset: Vec<String>,
    /// User fields set to store-now plus the given milliseconds (BSON dates).
    pub set_time: Vec<(String, i64)>,
    /// User fields incremented by the given amount.
    pub inc: Vec<(String, i64)>,
    /// When set, `gc_at` becomes store-now plus this.
    pub gc: Option<Ttl>,
    /// When set, `gc_at` is removed: the document is live again and no TTL
    /// index may delete it. Exclusive with [`Mutation::gc`].
    pub clear_gc: bool,
}

impl Mutation {
    /// A mutation that changes nothing but the revision.
    pub fn new() -> Self {
        Self::default()
    }

    /// Grants (or renews) the lease to `owner` for `ttl` from store-now.
    #[must_use]
    pub fn grant(mut self, owner: impl Into<String>, ttl: Ttl) -> Self {
        self.lease = LeaseOp::Grant { owner: owner.into(), ttl };
        self
    }

    /// Releases the lease (keeps the fencing counter).
    #[must_use]
    pub fn release(mut self) -> Self {
        self.lease = LeaseOp::Release;
        self
    }

    /// Increments the fencing counter by one.
    #[must_use]
    pub fn bump_fence(mut self) -> Self {
        self.bump_fence = true;
        self
    }

    /// Sets a user field.
    #[must_use]
    pub fn set(mut self, field: impl Into<String>, value: impl Into<Bson>) -> Self {
        self.set.insert(field.into(), value.into());
        self
    }

    /// Sets several user fields.
    #[must_use]
    pub fn set_all(mut self, doc: Document) -> Self {
        self.set.extend(doc);
        self
    }

    /// Removes a user field.
    #[must_use]
    pub fn unset(mut self, field: impl Into<String>) -> Self {
        self.unset.push(field.into());
        self
    }

    /// Sets a user field to the store's current time (a BSON date).
    #[must_use]
    pub fn set_now(self, field: impl Into<String>) -> Self {
        self.set_time_after(field, Duration::ZERO)
    }

    /// Sets a user field to the store's current time plus `delay` (a BSON date).
    #[must_use]
    pub fn set_time_after(mut self, field: impl Into<String>, delay: Duration) -> Self {
        let ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        self.set_time.push((field.into(), ms));
        self
    }

    /// Adds `by` to a numeric user field (a missing field counts as 0).
    #[must_use]
    pub fn inc(mut self, field: impl Into<String>, by: i64) -> Self {
        self.inc.push((field.into(), by));
        self
    }

    /// Marks the document for garbage collection by a TTL index on
    /// [`fields::GC_AT`](crate::fields::GC_AT) after `ttl` from store-now. Never relied on for correctness.
    #[must_use]
    pub fn gc_after(mut self, ttl: Ttl) -> Self {
        self.gc = Some(ttl);
        self
    }

    /// Removes [`fields::GC_AT`](crate::fields::GC_AT): the document is live again (a task made ready
    /// after it ended), so a TTL index must not delete it. Every write that
    /// brings a document back from "may be collected" carries this.
    #[must_use]
    pub fn clear_gc(mut self) -> Self {
        self.clear_gc = true;
        self
    }

    /// Checks field names and owner; catches a field both set and unset.
    pub fn validate(&self) -> StoreResult<()> {
        if let LeaseOp::Grant { owner, .. } = &self.lease {
            if owner.is_empty() {
                return Err(StoreError::invalid("owner", "an owner identity must not be empty"));
            }
        }
        if self.gc.is_some() && self.clear_gc {
            return Err(StoreError::invalid("mutation", "gc_after and clear_gc together"));
        }
        let mut names: Vec<&str> = Vec::new();
        let all = self
            .set
            .keys()
            .map(String::as_str)
            .chain(self.unset.iter().map(String::as_str))
            .chain(self.set_time.iter().map(|(f, _)| f.as_str()))
            .chain(self.inc.iter().map(|(f, _)| f.as_str()));
        for name in all {
            check_field_name(name)?;
            if names.contains(&name) {
                return Err(StoreError::invalid("mutation", format!("field {name:?} is changed twice")));
            }
            names.push(name);
        }
        Ok(())
    }
}
