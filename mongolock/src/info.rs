//! The lock document as readers see it: who holds it, until when, with which
//! fence; the counters; and documents of other programs (the Python
//! `MongoLocker`) that must never be taken for a free lock.

use std::sync::atomic::{AtomicU64, Ordering};

use store_trait::{Record, StoreTime};

/// Data fields the lock writes beside the lease, for operators.
pub(crate) mod data {
    pub(crate) const HOST: &str = "holder_host";
    pub(crate) const PID: &str = "holder_pid";
    pub(crate) const INSTANCE: &str = "holder_instance";
}

/// The fields of a document written by the Python `MongoLocker`: a lock in
/// another program's format, never taken nor reported free
/// ([`LockError::Foreign`](crate::LockError::Foreign)).
pub const FOREIGN_LOCK_FIELDS: [&str; 3] = ["uuid", "locked", "ts_expire"];

/// The foreign lock fields `data` has (present and not null).
pub(crate) fn foreign_fields(data: &bson::Document) -> Vec<&'static str> {
    FOREIGN_LOCK_FIELDS.into_iter().filter(|f| data.get(f).is_some_and(|v| !matches!(v, bson::Bson::Null))).collect()
}

/// Who holds a lock, since and until when (store clock), with which fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// The holder's owner string (`host/pid/instance/seq`).
    pub owner: String,
    /// The holder's host, when recorded.
    pub host: Option<String>,
    /// The holder's process id, when recorded.
    pub pid: Option<u32>,
    /// When this holder took the lock.
    pub since: StoreTime,
    /// When the lease lapses unless renewed.
    pub expires: StoreTime,
    /// The fence of this acquisition.
    #[doc(alias = "token")]
    pub fence: u64,
}

impl LockInfo {
    /// The holder of `record` at store time `now`, if its lease is live; with `now`
    /// `None`, the last lease recorded, live or not.
    pub fn from_record(record: &Record, now: Option<StoreTime>) -> Option<LockInfo> {
        let lease = match now {
            Some(now) => record.holder_at(now)?,
            None => record.lease()?,
        };
        Some(LockInfo {
            owner: lease.owner.clone(),
            host: record.get_str(data::HOST).map(str::to_owned),
            pid: record.get_i64(data::PID).and_then(|p| u32::try_from(p).ok()),
            since: lease.since,
            expires: lease.until,
            fence: record.fence(),
        })
    }
}

/// Counters a user can read, shared by all clones of a [`Lock`](crate::Lock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockMetrics {
    /// Successful acquisitions.
    pub acquisitions: u64,
    /// Acquisitions that had to wait for another holder.
    pub contention_waits: u64,
    /// Renewals that failed with a store error (and were retried).
    pub renew_failures: u64,
    /// Acquisitions that ended lost instead of released.
    pub losses: u64,
    /// Forced acquisitions and releases.
    pub steals: u64,
    /// Losses reported because the store clock jumped ahead of the local
    /// monotonic clock between two confirmed grants (an NTP step on the server, a
    /// failover to a member whose clock is ahead, a clock running fast).
    pub store_clock_jumps: u64,
    /// Losses reported because the client's wall clock advanced beyond its
    /// monotonic companion: time passed unseen (a host suspend), or the wall clock
    /// was stepped forward.
    pub local_clock_gaps: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) acquisitions: AtomicU64,
    pub(crate) contention_waits: AtomicU64,
    pub(crate) renew_failures: AtomicU64,
    pub(crate) losses: AtomicU64,
    pub(crate) steals: AtomicU64,
    pub(crate) store_clock_jumps: AtomicU64,
    pub(crate) local_clock_gaps: AtomicU64,
}

impl Metrics {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A status report: the Python `MongoLocker`'s `status`, plus diagnostics.
#[derive(Debug, Clone, PartialEq)]
pub struct LockStatus {
    /// The lock's key.
    pub key: String,
    /// The store's time when read.
    pub now: StoreTime,
    /// The live holder, if any.
    pub holder: Option<LockInfo>,
    /// Whether this instance holds it.
    pub owned: bool,
    /// The largest fence granted so far.
    #[doc(alias = "last_token")]
    pub last_fence: u64,
    /// Counters.
    pub metrics: LockMetrics,
}
