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
