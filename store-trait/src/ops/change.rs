//! Change notifications.

use futures_core::Stream;

use crate::{Key, StoreResult};

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

/// Which changes a subscription delivers ([`Store::watch_filtered`](crate::Store::watch_filtered)):
/// decided where the changes happen (on MongoDB a `$match` stage of the change
/// stream, so a filtered-out change never leaves the server), to spare a
/// watcher the notifications it would only discard.
///
/// Replacements (a whole document written by another program: what changed is
/// unknown) and [`ChangeKind::Resync`]s are always delivered. Inserts and
/// deletes are delivered if asked for; an update if it matches one of the
/// [`UpdateClause`]s, by what it set and removed (a field written with the
/// value it already had is not set).
///
/// ```
/// use store_trait::{fields, ChangeFilter, UpdateClause};
///
/// // What may make a task claimable: a new one, one made ready, a lease let go
/// // without the task being finished in the same write.
/// let claimable = ChangeFilter::new()
///     .inserts()
///     .update(UpdateClause::sets("ready", true))
///     .update(UpdateClause::sets(fields::LEASE_OWNER, bson::Bson::Null).unless_sets("complete", true));
/// assert!(claimable.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct ChangeFilter {
    /// Whether inserts are delivered.
    pub inserts: bool,
    /// Whether deletes are delivered.
    pub deletes: bool,
    /// The updates delivered: those matching any of these.
    pub updates: Vec<UpdateClause>,
}

/// One kind of update a [`ChangeFilter`] delivers: every condition holds.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct UpdateClause {
    /// Fields the update sets to these values.
    pub sets: Vec<(String, bson::Bson)>,
    /// Fields the update sets (to any value) or removes.
    pub touches: Vec<String>,
    /// Fields the update does not set to these values.
    pub not_sets: Vec<(String, bson::Bson)>,
}

impl ChangeFilter {
    /// A filter delivering only replacements and resyncs; add what to deliver.
    pub fn new() -> Self {
        Self::default()
    }

    /// The changes a lease's waiters wait for: the lease handed to another
    /// holder or let go. Inserts, deletes, and the updates that touch its
    /// owner (a grant to another, a release) or its fence (every grant bumps
    /// it, even to the owner it had); a renewal touches neither, so an idle
    /// waiter's subscription stays quiet while the holder renews.
    ///
    /// ```
    /// use store_trait::ChangeFilter;
    /// assert!(ChangeFilter::lease_changes().validate().is_ok());
    /// ```
    pub fn lease_changes() -> Self {
        use crate::fields::{FENCE, LEASE_OWNER};
        Self::new().inserts().deletes().update(UpdateClause::touches(LEASE_OWNER)).update(UpdateClause::touches(FENCE))
    }

    /// Delivers inserts too.
    #[must_use]
    pub fn inserts(mut self) -> Self {
        self.inserts = true;
        self
    }

    /// Delivers deletes too.
    #[must_use]
    pub fn deletes(mut self) -> Self {
        self.deletes = true;
        self
    }

    /// Delivers the updates matching `clause` too.
    #[must_use]
    pub fn update(mut self, clause: UpdateClause) -> Self {
        self.updates.push(clause);
        self
    }

    /// Checks the filter: plain top-level field names (the rule of
    /// [`check_field_name`](crate::check_field_name), but reserved names
    /// allowed: a filter may name the lease fields), and values that are
    /// neither arrays nor documents (equality of those is not the same on
    /// every backend).
    pub fn validate(&self) -> crate::StoreResult<()> {
        for c in &self.updates {
            if c.sets.is_empty() && c.touches.is_empty() {
                return Err(crate::StoreError::invalid(
                    "change filter",
                    "an update clause needs a field it sets or touches (else it matches every update)",
                ));
            }
            let named = c.sets.iter().chain(&c.not_sets).map(|(f, _)| f).chain(&c.touches);
            for f in named {
                if f.is_empty() || f.starts_with('$') || f.contains('.') || f.contains('\0') {
                    return Err(crate::StoreError::invalid(
                        "change filter",
                        format!("{f:?} is not a plain top-level field name"),
                    ));
                }
            }
            for (f, v) in c.sets.iter().chain(&c.not_sets) {
                if matches!(v, bson::Bson::Array(_) | bson::Bson::Document(_)) {
                    return Err(crate::StoreError::invalid(
                        "change filter",
                        format!("the value for {f:?} is an array or a document"),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl UpdateClause {
    /// Updates that set `field` to `value`.
    pub fn sets(field: impl Into<String>, value: impl Into<bson::Bson>) -> Self {
        UpdateClause { sets: vec![(field.into(), value.into())], ..Self::default() }
    }

    /// Updates that set `field` to any value, or remove it.
    pub fn touches(field: impl Into<String>) -> Self {
        UpdateClause { touches: vec![field.into()], ..Self::default() }
    }

    /// Only those that do not also set `field` to `value`.
    #[must_use]
    pub fn unless_sets(mut self, field: impl Into<String>, value: impl Into<bson::Bson>) -> Self {
        self.not_sets.push((field.into(), value.into()));
        self
    }
}

/// What a change did, as a [`ChangeFilter`] sees it: for backends that filter
/// on their side (`backend::semantics::change_admitted`); it is
/// `store_trait::backend::ChangeDetail`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ChangeDetail {
    /// A document was inserted.
    Insert,
    /// A document was updated: the fields it set (with their new values) and removed.
    Update {
        /// Fields whose value changed or that were added, with their new values.
        set: bson::Document,
        /// Fields removed.
        removed: Vec<String>,
    },
    /// A document was replaced by another program's whole document.
    Replace,
    /// A document was deleted.
    Delete,
}
