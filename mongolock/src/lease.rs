//! The one way a granted lease is kept: `Leases`, the configuration every kept
//! lease of one collection shares (store, collection, ttl, renewal interval,
//! safety margin, identity, client clock, whether its documents may be marked
//! for garbage collection, the counters), and the start of a kept lease from the
//! record a grant returned. A lock's acquisition, a semaphore's permit and a
//! queue's task claim all go through [`Leases::keep`] or its crate-internal
//! form, so each is renewed, signals its loss and fences its writes the same way.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use store_trait::{Clock, Collection, Record, Store, SystemClock};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{ConfigError, LockError};
use crate::guard::LockGuard;
use crate::identity::Identity;
use crate::info::{LockMetrics, Metrics};
use crate::keeper::keeper;
use crate::kept::{Confirmed, Current, KeptLease, KeptState, LeaseConfig};
use crate::timing::LeaseTiming;

/// Configures [`Leases`].
#[derive(Debug)]
pub struct LeasesBuilder<S> {
    pub(crate) store: S,
    pub(crate) collection: String,
    pub(crate) ttl: Duration,
    pub(crate) renew_every: Option<Duration>,
    pub(crate) safety_margin: Option<Duration>,
    pub(crate) identity: Option<Identity>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) allow_gc: bool,
}

impl<S: Store + Clone> LeasesBuilder<S> {
    /// The lease length: the ttl every grant kept by these leases was made with
    /// (default [`DEFAULT_TTL`](crate::DEFAULT_TTL)).
    #[doc(alias = "lease")]
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How often a kept lease is renewed (default a third of the ttl). Must
    /// leave room for the safety margin below the ttl.
    #[must_use]
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// How long before a lease could lapse on the server its holder is told it
    /// lost it, when renewal could not be confirmed (default a tenth of the ttl,
    /// between 5 ms and 2 s).
    #[must_use]
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = Some(margin);
        self
    }

    /// The identity of the holder (default [`Identity::current`]).
    #[must_use]
    pub fn identity(mut self, id: Identity) -> Self {
        self.identity = Some(id);
        self
    }

    /// The client's wall clock (default [`SystemClock`]), compared with its
    /// monotonic companion to notice time that passed unseen (a host suspend),
    /// which counts as a loss. Leases never depend on it otherwise.
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Lets writes through the guards of these leases mark their documents for
    /// garbage collection ([`store_trait::Mutation::gc_after`]): for task leases
    /// (a queue's claims), whose document ends with the task. Without it such a
    /// write fails with [`LockError::GcOnLock`]: a lock document never gets a
    /// `gc_at`, so no TTL index can delete it and reset its fence.
    #[must_use]
    pub fn allow_gc(mut self) -> Self {
        self.allow_gc = true;
        self
    }

    /// Validates the configuration (the collection name, and the timing through
    /// [`LeaseTiming`]).
    pub fn build(self) -> Result<Leases<S>, LockError> {
        let coll = Collection::new(self.collection).map_err(|e| LockError::Config(ConfigError::caused_by(e)))?;
        let timing = LeaseTiming::new(self.ttl, self.renew_every, self.safety_margin)?;
        Ok(Leases {
            config: Arc::new(LeaseConfig {
                store: self.store,
                coll,
                ttl: timing.ttl(),
                renew_every: timing.renew_every(),
                safety_margin: timing.safety_margin(),
                identity: self.identity.unwrap_or_else(Identity::current),
                clock: self.clock,
                allow_gc: self.allow_gc,
                metrics: Metrics::default(),
            }),
        })
    }
}

/// Keeps leases granted on documents of one collection: renews each (in the
/// background), signals its loss before it can lapse on the store, and fences
/// writes and the release by its owner and fence. What turns a granted
/// [`Record`] into a [`LockGuard`], for locks, semaphore permits and task
/// claims alike. Build it once and keep it: clones share the configuration and
/// the counters.
///
/// ```
/// use mongolock::store_trait::{Claim, Collection, Mutation, Query, Store, Ttl};
/// use mongolock::unstable::Leases;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = store_memory::MemoryStore::new();
/// let ttl = Duration::from_secs(30);
/// let leases = Leases::builder(store.clone(), "jobs").ttl(ttl).allow_gc().build()?;
/// let coll = Collection::new("jobs")?;
/// store.insert_many(&coll, vec![bson::doc! { "_id": "job-1", "ready": true }]).await?;
/// // Any grant made with the same ttl: here one atomic claim.
/// let claim = Claim {
///     query: Query::eq(bson::doc! { "ready": true }),
///     mutation: Mutation::new().grant("worker-1", Ttl::new(ttl)?).bump_fence().set("ready", false),
/// };
/// let sent = tokio::time::Instant::now();
/// let record = store.claim(&coll, &claim).await?.expect("a ready job");
/// let guard = leases.keep(&record, sent)?;
/// assert_eq!(guard.fence(), 1);
/// guard.release_with(Mutation::new().gc_after(Ttl::new(Duration::from_secs(60))?)).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Leases<S> {
    pub(crate) config: Arc<LeaseConfig<S>>,
}

impl<S> Clone for Leases<S> {
    fn clone(&self) -> Self {
        Leases { config: self.config.clone() }
    }
}

impl<S: Store + Clone> Leases<S> {
    /// Configures the keeping of leases granted on documents of `collection`.
    pub fn builder(store: S, collection: impl Into<String>) -> LeasesBuilder<S> {
        LeasesBuilder {
            store,
            collection: collection.into(),
            ttl: crate::timing::DEFAULT_TTL,
            renew_every: None,
            safety_margin: None,
            identity: None,
            clock: Arc::new(SystemClock),
            allow_gc: false,
        }
    }

    /// Takes charge of a lease granted by another operation (a queue's claim,
    /// say) on `record`, a document of this collection, with this ttl: the guard
    /// renews it in the background, signals its loss and fences writes exactly as
    /// a lock's acquisition does. `sent` is when the granting request was sent,
    /// on tokio's clock: the lease cannot lapse on the store before `sent` plus
    /// the ttl. [`LockError::NotHeld`] when `record` carries no lease;
    /// [`LockError::Config`] when its lease is shorter than this ttl (a grant made
    /// with a shorter ttl could lapse before the holder is told).
    pub fn keep(&self, record: &Record, sent: Instant) -> Result<LockGuard<S>, LockError> {
        // A fresh grant lasts exactly its ttl on the store clock; one renewed for
        // the same owner keeps its start and lasts longer. Shorter is a grant with
        // a shorter ttl than this keeper's deadlines assume.
        if let Some(lease) = record.lease() {
            let granted = lease.until.as_millis().saturating_sub(lease.since.as_millis());
            if granted < self.config.ttl.as_millis() {
                return Err(LockError::Config(
                    format!(
                        "the lease of {} lasts {granted} ms, less than the ttl {:?} it would be kept with",
                        record.key(),
                        self.ttl()
                    )
                    .into(),
                ));
            }
        }
        self.start(record, sent, true, None)
    }

    /// Starts keeping the lease of `record` (its request sent at `sent`):
    /// renewed by the keeper task with `auto_renew`, else only watched; tracked
    /// in `current` when it belongs to a lock instance.
    pub(crate) fn start(
        &self,
        record: &Record,
        sent: Instant,
        auto_renew: bool,
        current: Option<Arc<Current<S>>>,
    ) -> Result<LockGuard<S>, LockError> {
        let Some(lease) = record.lease() else {
            return Err(LockError::NotHeld { key: record.key().to_string() });
        };
        let config = &self.config;
        // The reply is in hand now; the wall clock pair is read now too (a
        // suspend during the grant's round trip shows at the first renewal, as
        // a store clock that advanced more than ours).
        let confirmed = Confirmed {
            sent,
            replied: Instant::now(),
            stamp: lease.until.as_millis().saturating_sub(config.ttl.as_millis()),
            wall: config.clock.now(),
            wall_mono: config.clock.monotonic(),
        };
        let round_trip = confirmed.replied.saturating_duration_since(sent);
        let kept = Arc::new(KeptLease {
            leases: config.clone(),
            key: record.key().clone(),
            current,
            owner: lease.owner.clone(),
            fence: record.fence(),
            since: lease.since,
            state: Arc::new(Mutex::new(KeptState {
                deadline: sent + config.ttl.as_duration() - config.safety_margin,
                expires: lease.until,
                confirmed,
                clock: config.clock.clone(),
                gap_limit: config.safety_margin / 2,
            })),
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
            wake: Notify::new(),
            released: AtomicBool::new(false),
            lost_marked: AtomicBool::new(false),
        });
        Metrics::bump(&config.metrics.acquisitions);
        crate::metrics::acquired(&config.coll);
        tracing::info!(key = %kept.key, owner = %kept.owner, fence = kept.fence, auto_renew, "lock acquired");
        if let Some(c) = &kept.current {
            c.set(Some(&kept));
        }
        // A reply that came after the lease could lapse: lost at once, and
        // said so (not as a renewal that failed): the store's round trips are
        // too slow for this ttl, which only a longer ttl or a faster store mends.
        if round_trip >= config.ttl.as_duration().saturating_sub(config.safety_margin) {
            kept.mark_lost(&format!(
                "the grant's reply took {round_trip:?}, past the point its lease ({:?}, margin {:?}) could lapse: \
                 the ttl is too short for the store's round trips",
                config.ttl.as_duration(),
                config.safety_margin
            ));
        }
        tokio::spawn(keeper(kept.clone(), auto_renew));
        Ok(LockGuard { kept })
    }

    /// The collection.
    pub fn collection(&self) -> &Collection {
        &self.config.coll
    }

    /// The lease length.
    #[doc(alias = "lease")]
    pub fn ttl(&self) -> Duration {
        self.config.ttl.as_duration()
    }

    /// The identity of the holder.
    pub fn identity(&self) -> &Identity {
        &self.config.identity
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.config.store
    }

    /// The counters of every lease kept through these leases (and their clones).
    pub fn metrics(&self) -> LockMetrics {
        let m = &self.config.metrics;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LockMetrics {
            acquisitions: get(&m.acquisitions),
            contention_waits: get(&m.contention_waits),
            renew_failures: get(&m.renew_failures),
            losses: get(&m.losses),
            steals: get(&m.steals),
            store_clock_jumps: get(&m.store_clock_jumps),
            local_clock_gaps: get(&m.local_clock_gaps),
        }
    }
}
