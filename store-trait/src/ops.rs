//! The vocabulary of store operations: conditions, mutations, claims, queries.
//!
//! Every type here is plain data. The reference meaning of each one is the Rust
//! evaluator in [`crate::semantics`]; the MongoDB backend compiles the same data
//! into one aggregation-pipeline update evaluated on the server clock.

use std::time::Duration;

use bson::{Bson, Document};
use futures_core::Stream;

use crate::{check_field_name, fields, Key, Record, StoreError, StoreResult, Ttl};

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
    /// token written is not newer than mine".
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
    pub fn grant(mut self, owner: impl Into<String>, ttl: Ttl) -> Self {
        self.lease = LeaseOp::Grant { owner: owner.into(), ttl };
        self
    }

    /// Releases the lease (keeps the fencing counter).
    pub fn release(mut self) -> Self {
        self.lease = LeaseOp::Release;
        self
    }

    /// Increments the fencing counter by one.
    pub fn bump_fence(mut self) -> Self {
        self.bump_fence = true;
        self
    }

    /// Sets a user field.
    pub fn set(mut self, field: impl Into<String>, value: impl Into<Bson>) -> Self {
        self.set.insert(field.into(), value.into());
        self
    }

    /// Sets several user fields.
    pub fn set_all(mut self, doc: Document) -> Self {
        self.set.extend(doc);
        self
    }

    /// Removes a user field.
    pub fn unset(mut self, field: impl Into<String>) -> Self {
        self.unset.push(field.into());
        self
    }

    /// Sets a user field to the store's current time (a BSON date).
    pub fn set_now(self, field: impl Into<String>) -> Self {
        self.set_time_after(field, Duration::ZERO)
    }

    /// Sets a user field to the store's current time plus `delay` (a BSON date).
    pub fn set_time_after(mut self, field: impl Into<String>, delay: Duration) -> Self {
        let ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        self.set_time.push((field.into(), ms));
        self
    }

    /// Adds `by` to a numeric user field (a missing field counts as 0).
    pub fn inc(mut self, field: impl Into<String>, by: i64) -> Self {
        self.inc.push((field.into(), by));
        self
    }

    /// Marks the document for garbage collection by a TTL index on
    /// [`fields::GC_AT`] after `ttl` from store-now. Never relied on for correctness.
    pub fn gc_after(mut self, ttl: Ttl) -> Self {
        self.gc = Some(ttl);
        self
    }

    /// Removes [`fields::GC_AT`]: the document is live again (a task made ready
    /// after it ended), so a TTL index must not delete it. Every write that
    /// brings a document back from "may be collected" carries this.
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
        if self.upsert && !crate::semantics::eval(&self.condition, None, crate::StoreTime::from_millis(0)) {
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
    /// (`None` when it does not exist) — who holds it, until when, which token.
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
}

impl Query {
    /// All documents.
    pub fn all() -> Self {
        Query { filter: Document::new(), condition: Condition::Always, sort: Vec::new(), limit: None }
    }

    /// Documents whose fields equal `filter`.
    pub fn eq(filter: Document) -> Self {
        Query { filter, ..Self::all() }
    }

    /// Adds a condition.
    pub fn when(mut self, c: Condition) -> Self {
        self.condition = std::mem::replace(&mut self.condition, Condition::Always).and(c);
        self
    }

    /// Adds a sort field.
    pub fn sort(mut self, field: impl Into<String>, order: Order) -> Self {
        self.sort.push((field.into(), order));
        self
    }

    /// Limits the number of results.
    pub fn limit(mut self, n: u32) -> Self {
        self.limit = Some(n);
        self
    }

    /// Checks field names.
    pub fn validate(&self) -> StoreResult<()> {
        for (k, v) in &self.filter {
            check_filter_field(k)?;
            if let Bson::Document(d) = v {
                if d.keys().any(|k| k.starts_with('$')) {
                    return Err(StoreError::invalid(
                        "filter",
                        format!("{k}: operators are not allowed, only equality"),
                    ));
                }
            }
        }
        for (k, _) in &self.sort {
            check_filter_field(k)?;
        }
        self.condition.validate()
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
    pub fn unique(mut self) -> Self {
        self.unique = true;
        self
    }

    /// Makes it sparse.
    pub fn sparse(mut self) -> Self {
        self.sparse = true;
        self
    }

    /// A TTL index on [`fields::GC_AT`], deleting documents once their `gc_at` is past.
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

/// What kind of change happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChangeKind {
    /// A document was created.
    Insert,
    /// A document was changed or replaced.
    Update,
    /// A document was deleted.
    Delete,
    /// Changes may have been missed (the stream lagged or was reset): re-read.
    Resync,
    /// A document was changed, but at most its lease's expiry (besides the
    /// revision and write stamp every write sets): its holder renewed. Nothing a
    /// waiter waits for; backends that cannot tell report [`ChangeKind::Update`].
    Renewed,
}

impl ChangeKind {
    /// `Renewed` if an update set only the fields a renewal sets and removed
    /// none, else `Update`.
    ///
    /// ```
    /// use store_trait::{fields, ChangeKind};
    /// assert_eq!(ChangeKind::of_update([fields::LEASE_UNTIL, fields::REV, fields::LAST_OP], []), ChangeKind::Renewed);
    /// assert_eq!(ChangeKind::of_update([fields::LEASE_UNTIL, fields::LEASE_OWNER], []), ChangeKind::Update);
    /// assert_eq!(ChangeKind::of_update(["status"], []), ChangeKind::Update);
    /// assert_eq!(ChangeKind::of_update([fields::REV], [fields::GC_AT]), ChangeKind::Update);
    /// ```
    pub fn of_update<'a>(
        set: impl IntoIterator<Item = &'a str>,
        removed: impl IntoIterator<Item = &'a str>,
    ) -> ChangeKind {
        use crate::fields::{LAST_OP, LEASE_UNTIL, REV};
        let renewal_only = set.into_iter().all(|f| matches!(f, LEASE_UNTIL | REV | LAST_OP));
        if renewal_only && removed.into_iter().next().is_none() {
            ChangeKind::Renewed
        } else {
            ChangeKind::Update
        }
    }
}

/// One change notification. It is a hint to re-read, never the state itself.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeEvent {
    /// Which document changed (`None` for [`ChangeKind::Resync`]).
    pub key: Option<Key>,
    /// How it changed.
    pub kind: ChangeKind,
}

/// A stream of change notifications. It ends (or yields an error) when the
/// backend drops the subscription; callers then re-subscribe or poll.
pub type ChangeStream = std::pin::Pin<Box<dyn Stream<Item = StoreResult<ChangeEvent>> + Send>>;
