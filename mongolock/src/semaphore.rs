//! A counting semaphore: up to N holders of one key, each with its own lease and
//! fence, with the lock's guarantees per permit.
//!
//! The N permits are N slot documents (`key#0` … `key#N-1`) in the lock
//! collection, created as holders need them (eight or more at a time, never
//! beyond N); acquiring a permit is one `claim` (find a free slot and lease
//! it, atomically), so N holders can never become N+1.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bson::doc;
use store_trait::helpers::Watcher;
use store_trait::{ChangeFilter, Claim, Condition, Mutation, Order, Query, Record, Store, StoreError};
use tokio::time::Instant;

use crate::acquire::Acquire;
use crate::error::{ConfigError, LockError};
use crate::guard::LockGuard;
use crate::info::data;
use crate::info::LockMetrics;
use crate::kept::LeaseConfig;
use crate::lock::{Lock, LockBuilder};

/// The fewest slot documents created at once when every existing one is held.
const SLOT_CHUNK: u32 = 8;

/// Rounds of "create slots, claim again" one acquisition makes at most while
/// slots are missing. Racers that count the same slots create the same ones
/// (all but one insert are duplicates) and the first to claim takes them: a
/// racer that lost goes round again, so a free permit is never refused for a
/// slot another racer was creating. The rounds stop when a round added no
/// slot (slot ids taken by documents of another permit count on the same key,
/// say during a rolling change of the limit): nothing more can be created.
const SLOT_ROUNDS: u32 = 16;

/// Fields of a slot document.
mod slot {
    pub(super) const SEMAPHORE: &str = "semaphore";
    pub(super) const SLOT: &str = "slot";
    pub(super) const PERMITS: &str = "permits";
}

/// Up to `permits` concurrent holders of one key.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), mongolock::LockError> {
/// let store = store_memory::MemoryStore::new();
/// let sem = mongolock::Semaphore::new(mongolock::Lock::builder(store, "exports"), 2)?;
/// let a = sem.acquire().await?;
/// let b = sem.acquire().await?;
/// assert!(sem.try_acquire().await?.is_none(), "a third holder must wait");
/// assert_ne!(a.key(), b.key());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Semaphore<S> {
    key: String,
    permits: u32,
    /// The semaphore as one lock configuration: its leases keep every permit
    /// (one counter set, one renewal configuration), its poll interval paces waiters.
    lock: Lock<S>,
    /// Whether a count has seen every slot document: from then on a claim
    /// that finds no free slot is not one that missed slots being created.
    all_slots_seen: AtomicBool,
}

impl<S: Store + Clone> Semaphore<S> {
    /// A semaphore with `permits` permits, configured like a lock (store, key, ttl,
    /// collection, …).
    pub fn new(config: LockBuilder<S>, permits: u32) -> Result<Semaphore<S>, LockError> {
        if permits == 0 {
            return Err(LockError::Config("a semaphore needs at least one permit".into()));
        }
        let lock: Lock<S> = config.build()?;
        let key = lock.key().to_string();
        // Every slot key must be a valid key: rejected here, not at the first claim.
        store_trait::Key::new(format!("{key}#{}", permits - 1))
            .map_err(|e| LockError::Config(ConfigError::caused_by(e)))?;
        Ok(Semaphore { key, permits, lock, all_slots_seen: AtomicBool::new(false) })
    }

    /// The number of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The counters of every permit acquired through this semaphore.
    pub fn metrics(&self) -> LockMetrics {
        self.lock.metrics()
    }

    fn config(&self) -> &LeaseConfig<S> {
        self.lock.inner.config()
    }

    /// Creates up to `more` slot documents after the `existing` ones (never
    /// beyond the number of permits; a slot another process created first is
    /// a duplicate, passed over). Slots are created as holders need them, so
    /// a large semaphore that is never full keeps few documents (on some
    /// servers every write costs time in proportion to the collection's size).
    /// Returns whether it went up to the last slot.
    async fn ensure_slots(&self, existing: u64, more: u32) -> Result<bool, StoreError> {
        let from = u32::try_from(existing).unwrap_or(u32::MAX).min(self.permits);
        let to = from.saturating_add(more.max(SLOT_CHUNK)).min(self.permits);
        let docs = (from..to)
            .map(|i| {
                doc! { "_id": format!("{}#{i}", self.key), slot::SEMAPHORE: &self.key, slot::SLOT: i64::from(i), slot::PERMITS: i64::from(self.permits) }
            })
            .collect();
        self.config().store.insert_many(&self.config().coll, docs).await?;
        Ok(to == self.permits)
    }

    /// Tries once for a free permit.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`Semaphore::acquire_with`].
    pub async fn try_acquire(&self) -> Result<Option<LockGuard<S>>, LockError> {
        self.try_once(false).await
    }

    /// Blocks until a permit is free.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`Semaphore::acquire_with`].
    pub async fn acquire(&self) -> Result<LockGuard<S>, LockError> {
        self.acquire_with(Acquire::new()).await
    }

    /// Acquires a permit as `opts` says: blocking (at most its timeout) or a
    /// single try (then `Err(Timeout)` when none is free), renewed in the
    /// background with `auto_renew`. A semaphore has no forced acquisition.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a permit granted to an attempt whose caller stopped waiting
    /// is released again (its guard is dropped).
    pub async fn acquire_with(&self, opts: Acquire) -> Result<LockGuard<S>, LockError> {
        opts.check()?;
        if opts.force {
            return Err(LockError::Config("a semaphore permit cannot be taken by force".into()));
        }
        let (timeout, auto_renew) = (if opts.blocking { opts.timeout } else { Some(Duration::ZERO) }, opts.auto_renew);
        let start = Instant::now();
        let (first, poll_interval) = (self.config(), self.lock.inner.poll_interval);
        // Renewals of held permits free nothing: they wake no waiter (kept
        // back on the server where the backend can, else passed over here).
        let mut events = Watcher::open_filtered(
            first.store.clone(),
            first.coll.clone(),
            ChangeFilter::lease_changes(),
            poll_interval,
        )
        .await
        .ignore_renewals();
        loop {
            if let Some(g) = self.try_once(auto_renew).await? {
                return Ok(g);
            }
            let mut wait = poll_interval;
            if events.is_live() {
                // Until the earliest lease of a slot lapses, unless a change comes first.
                let now = first.store.now().await?;
                let q = Query::eq(doc! { slot::SEMAPHORE: &self.key, slot::PERMITS: i64::from(self.permits) });
                let soonest =
                    first.store.find(&first.coll, &q).await?.iter().filter_map(|r| r.lease().map(|l| l.until)).min();
                wait = soonest.map_or(poll_interval, |t| now.until(t)) + Duration::from_millis(fastrand::u64(0..=5));
            }
            let mut until = Instant::now() + wait;
            if let Some(t) = timeout {
                if start.elapsed() >= t {
                    return Err(LockError::Timeout { key: self.key.clone(), waited: start.elapsed(), holder: None });
                }
                if let Some(end) = start.checked_add(t) {
                    until = until.min(end);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = events.changed() => {}
            }
        }
    }

    /// Tries once for up to `n` free permits and returns those it got (none
    /// when none is free), each renewed in the background like a lock's
    /// acquisition. More than one is taken with one batch claim
    /// ([`Store::claim_many`]: three commands on MongoDB whatever `n`) from
    /// three on, fewer with single claims: a caller with `n` free slots pays
    /// no round trip per permit.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), mongolock::LockError> {
    /// let store = store_memory::MemoryStore::new();
    /// let sem = mongolock::Semaphore::new(mongolock::Lock::builder(store, "exports"), 5)?;
    /// let first = sem.try_acquire_many(3).await?;
    /// let rest = sem.try_acquire_many(4).await?;
    /// assert_eq!((first.len(), rest.len()), (3, 2), "never more than the free permits");
    /// assert!(sem.try_acquire_many(2).await?.is_empty());
    /// drop(first); // released (in the background)
    /// # tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    /// assert_eq!(sem.try_acquire_many(4).await?.len(), 3);
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in effect: dropped after the claim, the permits it granted
    /// are held by no guard and lapse at their expiry (a ttl later), as a
    /// crashed holder's do.
    pub async fn try_acquire_many(&self, n: usize) -> Result<Vec<LockGuard<S>>, LockError> {
        let sent = Instant::now();
        let records = self.claim_slots(n).await?;
        // Each permit is kept like a lock's acquisition; a failure drops (and so
        // releases) the ones already kept.
        records.iter().map(|r| self.lock.inner.leases.start(r, sent, true, None)).collect()
    }

    /// Claims up to `n` free slots. While fewer are free and slots are
    /// missing, creates some and claims again, round after round
    /// ([`SLOT_ROUNDS`]), until a round creates none.
    ///
    /// A claim sent before another racer created the slots finds none free,
    /// and the count after it finds none missing: those slots, which that
    /// claim never saw, are claimed once more. Once this semaphore has seen
    /// every slot, a claim that finds none free means they are all held.
    async fn claim_slots(&self, n: usize) -> Result<Vec<Record>, StoreError> {
        // Whether every slot existed when the last claim was sent.
        let mut claimed_on_all = self.all_slots_seen.load(Ordering::Acquire);
        let mut records = self.claim_free(n).await?;
        let mut counted = None;
        for _ in 0..SLOT_ROUNDS {
            if records.len() >= n {
                break;
            }
            let Some(existing) = self.missing_slots().await? else {
                if !claimed_on_all {
                    records.extend(self.claim_free(n - records.len()).await?);
                }
                break;
            };
            if counted.replace(existing) == Some(existing) {
                // No slot could be created: its id is another document's.
                if self.adopt_slots().await? == 0 {
                    break;
                }
                records.extend(self.claim_free(n - records.len()).await?);
                continue;
            }
            let more = u32::try_from(n - records.len()).unwrap_or(u32::MAX);
            claimed_on_all = self.ensure_slots(existing, more).await?;
            records.extend(self.claim_free(n - records.len()).await?);
        }
        Ok(records)
    }

    /// Claims up to `n` of the existing free slots: one batch from three on
    /// (three commands on MongoDB whatever `n`), else single claims (one
    /// command each, each with an owner of its own).
    async fn claim_free(&self, n: usize) -> Result<Vec<Record>, StoreError> {
        let first = self.config();
        if n >= 3 {
            return first.store.claim_many(&first.coll, &self.slot_claim(), n).await;
        }
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            match first.store.claim(&first.coll, &self.slot_claim()).await? {
                Some(r) => got.push(r),
                None => break,
            }
        }
        Ok(got)
    }

    /// The claim of one free slot (the lowest first), for a fresh owner.
    fn slot_claim(&self) -> Claim {
        let first = self.config();
        let owner = self.lock.inner.next_owner();
        Claim {
            query: Query::eq(doc! { slot::SEMAPHORE: &self.key, slot::PERMITS: i64::from(self.permits) })
                .when(Condition::Free)
                .sort(slot::SLOT, Order::Asc),
            mutation: Mutation::new()
                .grant(owner, first.ttl)
                .bump_fence()
                .set(data::HOST, first.identity.host())
                .set(data::PID, i64::from(first.identity.pid()))
                .set(data::INSTANCE, first.identity.instance()),
        }
    }

    async fn try_once(&self, auto_renew: bool) -> Result<Option<LockGuard<S>>, LockError> {
        let sent = Instant::now();
        let Some(record) = self.claim_slots(1).await?.pop() else { return Ok(None) };
        // A permit is kept like a lock's acquisition, by the one keeper: renewed,
        // its loss signalled, its writes fenced. It is no lock instance's
        // current acquisition.
        self.lock.inner.leases.start(&record, sent, auto_renew, None).map(Some)
    }

    /// Makes ours the documents at our slot ids that are no slot of this
    /// semaphore (written by another program, or a slot of another permit
    /// count on the same key, left by a change of the limit), which would
    /// otherwise block that permit for ever: a slot can be neither claimed
    /// (the claim matches on the slot fields) nor created (the id is taken).
    /// Each is adopted only while free and unchanged since it was read (one
    /// conditional write, keeping its fence, which never decreases); a
    /// foreign lock document (the Python `MongoLocker`'s) is never adopted.
    /// Returns how many were adopted. Off the hot path: only when a round
    /// could create no slot.
    async fn adopt_slots(&self) -> Result<u64, StoreError> {
        let first = self.config();
        let mut keys = Vec::new();
        for i in 0..self.permits {
            keys.push(store_trait::Key::new(format!("{}#{i}", self.key))?);
        }
        let found = first.store.find_each(&first.coll, &Query::all().keys(keys)).await?;
        let strangers: Vec<Record> = found
            .into_iter()
            .flatten()
            .filter(|r| {
                let ours = r.get_str(slot::SEMAPHORE) == Some(self.key.as_str())
                    && r.get_i64(slot::PERMITS) == Some(i64::from(self.permits));
                !ours && crate::info::foreign_fields(r.data()).is_empty()
            })
            .collect();
        if strangers.is_empty() {
            return Ok(0);
        }
        let now = first.store.now().await?;
        let mut adopted = 0;
        for r in strangers {
            if r.lease().is_some_and(|l| l.is_live_at(now)) {
                continue;
            }
            let Some(i) = r.key().to_string().rsplit('#').next().and_then(|i| i.parse::<u32>().ok()) else { continue };
            let w = store_trait::Write::new(
                Condition::Free.and(Condition::FenceIs(r.fence())).and(Condition::RevIs(r.rev())),
                Mutation::new()
                    .set(slot::SEMAPHORE, self.key.as_str())
                    .set(slot::SLOT, i64::from(i))
                    .set(slot::PERMITS, i64::from(self.permits)),
            );
            if first.store.write(&first.coll, r.key(), &w).await?.is_applied() {
                tracing::warn!(collection = %first.coll, slot = %r.key(), permits = self.permits, "adopted a document at a slot id that was no slot of this semaphore");
                adopted += 1;
            }
        }
        Ok(adopted)
    }

    /// The number of slot documents when fewer than the permits exist.
    async fn missing_slots(&self) -> Result<Option<u64>, StoreError> {
        let first = self.config();
        let q = Query::eq(doc! { slot::SEMAPHORE: &self.key, slot::PERMITS: i64::from(self.permits) });
        let existing = first.store.count(&first.coll, &q).await?;
        let all = existing >= u64::from(self.permits);
        self.all_slots_seen.store(all, Ordering::Release);
        Ok((!all).then_some(existing))
    }
}
