//! Queries, claims, inserts and indexes.

use std::time::Duration;

use bson::{Bson, Document};

use crate::{check_field_name, fields, Condition, Key, Mutation, StoreError, StoreResult};

/// Sort direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Order {
    /// Smallest first.
    Asc,
    /// Largest first.
    Desc,
}

impl Order {
    /// `1` or `-1`, as MongoDB writes it.
    pub fn as_i32(self) -> i32 {
        match self {
            Order::Asc => 1,
            Order::Desc => -1,
        }
    }
}

/// A selection of documents: equality on fields (index-friendly; `null` matches
/// missing too, and an array field matches when it contains the value, as in
/// MongoDB) and a [`Condition`] evaluated on the store clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// Field equality (fields may include `_id` and `lease_owner`).
    pub filter: Document,
    /// A further condition.
    pub condition: Condition,
    /// Sort order; ties fall back to store order.
    pub sort: Vec<(String, Order)>,
    /// At most this many documents.
    pub limit: Option<u32>,
    /// When set, only documents whose `_id` is one of these keys (served by
    /// the `_id` index): what a claim by id from a list of candidates uses.
    pub keys: Option<Vec<Key>>,
}

impl Query {
    /// All documents.
    pub fn all() -> Self {
        Query { filter: Document::new(), condition: Condition::Always, sort: Vec::new(), limit: None, keys: None }
    }

    /// Documents whose fields equal `filter`.
    pub fn eq(filter: Document) -> Self {
        Query { filter, ..Self::all() }
    }

    /// Adds a condition.
    #[must_use]
    pub fn when(mut self, c: Condition) -> Self {
        self.condition = std::mem::replace(&mut self.condition, Condition::Always).and(c);
        self
    }

    /// Adds a sort field.
    #[must_use]
    pub fn sort(mut self, field: impl Into<String>, order: Order) -> Self {
        self.sort.push((field.into(), order));
        self
    }

    /// Limits the number of results.
    #[must_use]
    pub fn limit(mut self, n: u32) -> Self {
        self.limit = Some(n);
        self
    }

    /// Only documents whose `_id` is one of `keys` (none, when `keys` is empty).
    ///
    /// ```
    /// use store_trait::{Key, Query};
    ///
    /// let q = Query::all().keys([Key::new("a").unwrap(), Key::new("b").unwrap()]);
    /// assert_eq!(q.keys.map(|k| k.len()), Some(2));
    /// ```
    #[must_use]
    pub fn keys(mut self, keys: impl IntoIterator<Item = Key>) -> Self {
        self.keys = Some(keys.into_iter().collect());
        self
    }

    /// Checks field names.
    pub fn validate(&self) -> StoreResult<()> {
        for (k, v) in &self.filter {
            check_filter_field(k)?;
            if !is_equality_value(v) {
                return Err(StoreError::invalid("filter", format!("{k}: operators are not allowed, only equality")));
            }
        }
        for (k, _) in &self.sort {
            check_filter_field(k)?;
        }
        self.condition.validate()
    }
}

/// Whether MongoDB reads `v`, as a filter's value, as equality with it: not a
/// document of operators, and not a value a find filter matches some other
/// way (a regular expression matches by pattern; code and the legacy types
/// are no values a task holds). Within arrays and embedded documents, values
/// are compared whole, so only the top level decides.
fn is_equality_value(v: &Bson) -> bool {
    match v {
        Bson::Document(d) => !d.keys().any(|k| k.starts_with('$')),
        Bson::RegularExpression(_)
        | Bson::JavaScriptCode(_)
        | Bson::JavaScriptCodeWithScope(_)
        | Bson::Symbol(_)
        | Bson::DbPointer(_)
        | Bson::MinKey
        | Bson::MaxKey
        | Bson::Undefined => false,
        _ => true,
    }
}

fn check_filter_field(name: &str) -> StoreResult<()> {
    if matches!(name, fields::ID | fields::LEASE_OWNER | fields::FENCE | fields::REV | fields::LEASE_UNTIL) {
        return Ok(());
    }
    check_field_name(name)
}

/// Find the first document matching `query` (in its sort order) and apply
/// `mutation` to it, atomically, in one round trip: what a task queue's claim is.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// Which documents are candidates, and in which order.
    pub query: Query,
    /// What to do to the one claimed.
    pub mutation: Mutation,
}

impl Claim {
    /// Checks the parts.
    pub fn validate(&self) -> StoreResult<()> {
        self.query.validate()?;
        self.mutation.validate()
    }

    /// Checks a claim for [`Store::claim_many`](crate::Store::claim_many): as
    /// [`Claim::validate`], and the mutation grants a lease and bumps the fence,
    /// so that documents a lost batch changed lapse and are claimed again under
    /// a higher fence.
    pub fn validate_batch(&self) -> StoreResult<()> {
        self.validate()?;
        if !matches!(self.mutation.lease, crate::LeaseOp::Grant { .. }) || !self.mutation.bump_fence {
            return Err(crate::StoreError::invalid("claim", "a batch claim must grant a lease and bump the fence"));
        }
        Ok(())
    }
}

/// Per-document result of [`Store::insert_many`](crate::Store::insert_many).
#[derive(Debug, Clone, PartialEq)]
pub enum InsertOutcome {
    /// Inserted under this key.
    Inserted(Key),
    /// A document with this key (or the same value of a unique index) exists;
    /// nothing was changed.
    Duplicate(Key),
}

/// An index the caller needs.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexSpec {
    /// Its name.
    pub name: String,
    /// Indexed fields.
    pub keys: Vec<(String, Order)>,
    /// Reject a second document with the same values.
    pub unique: bool,
    /// Only index documents that have the fields (with `unique`: many documents
    /// may lack them).
    pub sparse: bool,
    /// Garbage-collect documents once the (date) field is older than this. For
    /// garbage collection only, never correctness: deletion may run a minute late.
    pub expire_after: Option<Duration>,
}

impl IndexSpec {
    /// A plain index.
    pub fn new(name: impl Into<String>, keys: Vec<(String, Order)>) -> Self {
        IndexSpec { name: name.into(), keys, unique: false, sparse: false, expire_after: None }
    }

    /// Makes it unique.
    #[must_use]
    pub fn unique(mut self) -> Self {
        self.unique = true;
        self
    }

    /// Makes it sparse.
    #[must_use]
    pub fn sparse(mut self) -> Self {
        self.sparse = true;
        self
    }

    /// A TTL index on [`fields::GC_AT`](crate::fields::GC_AT), deleting documents once their `gc_at` is past.
    pub fn gc() -> Self {
        IndexSpec {
            name: "gc_at_ttl".into(),
            keys: vec![(fields::GC_AT.into(), Order::Asc)],
            unique: false,
            sparse: false,
            expire_after: Some(Duration::ZERO),
        }
    }

    /// Checks the spec.
    pub fn validate(&self) -> StoreResult<()> {
        if self.name.is_empty() || self.keys.is_empty() {
            return Err(StoreError::invalid("index", "an index needs a name and at least one field"));
        }
        for (k, _) in &self.keys {
            if k.is_empty() || k.starts_with('$') || k.contains('\0') {
                return Err(StoreError::invalid("index", format!("bad field {k:?}")));
            }
        }
        if self.expire_after.is_some() && self.keys.len() != 1 {
            return Err(StoreError::invalid("index", "a TTL index has exactly one field"));
        }
        Ok(())
    }
}
