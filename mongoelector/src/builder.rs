//! Configuration of an elector.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use mongolock::{ConfigError, Identity, Lock, LockInfo};
use store_trait::{Collection, Store};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::callbacks::{Dispatcher, Handlers};
use crate::elector::Elector;
use crate::error::ElectorError;
use crate::inner::Inner;
use crate::leadership::Leadership;

/// The collection holding election leases unless configured otherwise.
pub const DEFAULT_COLLECTION: &str = "electorlocks";
/// The collection holding node status reports unless configured otherwise.
pub const DEFAULT_STATUS_COLLECTION: &str = "electorstatus";
/// The lease length unless configured otherwise (as in `MongoElector`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

// Beside the builder, so that the handle's module never names it.
impl<S: Store + Clone> Elector<S> {
    /// Configures an elector for election `key` on `store`.
    pub fn builder(store: S, key: impl Into<String>) -> ElectorBuilder<S> {
        ElectorBuilder::new(store, key.into())
    }
}

/// Configures an [`Elector`].
pub struct ElectorBuilder<S> {
    store: S,
    key: String,
    ttl: Duration,
    collection: String,
    status_collection: String,
    poll_interval: Option<Duration>,
    renew_every: Option<Duration>,
    identity: Option<Identity>,
    version: String,
    handlers: Handlers,
    stop_timeout: Option<Duration>,
    report_status: bool,
}

impl<S> std::fmt::Debug for ElectorBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectorBuilder").field("key", &self.key).field("ttl", &self.ttl).finish_non_exhaustive()
    }
}

impl<S: Store + Clone> ElectorBuilder<S> {
    pub(crate) fn new(store: S, key: String) -> Self {
        ElectorBuilder {
            store,
            key,
            ttl: DEFAULT_TTL,
            collection: DEFAULT_COLLECTION.into(),
            status_collection: DEFAULT_STATUS_COLLECTION.into(),
            poll_interval: None,
            renew_every: None,
            identity: None,
            version: env!("CARGO_PKG_VERSION").into(),
            handlers: Handlers::default(),
            stop_timeout: None,
            report_status: true,
        }
    }

    /// The lease length (default [`DEFAULT_TTL`]): a silently crashed leader is
    /// replaced after at most this long.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The lease collection (default [`DEFAULT_COLLECTION`]).
    #[must_use]
    pub fn collection(mut self, name: impl Into<String>) -> Self {
        self.collection = name.into();
        self
    }

    /// The status collection (default [`DEFAULT_STATUS_COLLECTION`]).
    #[must_use]
    pub fn status_collection(mut self, name: impl Into<String>) -> Self {
        self.status_collection = name.into();
        self
    }

    /// How often a round runs (default a third of the ttl): the leader renews,
    /// then `on_loop` runs and status is reported.
    #[must_use]
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// A follower's poll interval where the store has no change notifications
    /// (default: the renew interval).
    #[doc(alias = "step")]
    #[must_use]
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = Some(every);
        self
    }

    /// The identity recorded for this node (default [`Identity::current`]).
    #[must_use]
    pub fn identity(mut self, id: Identity) -> Self {
        self.identity = Some(id);
        self
    }

    /// The application's version, reported in status documents and
    /// [`Elector::node_status`] (default: this crate's version). The Python `MongoElector`'s
    /// `app_version`.
    #[doc(alias = "app_version")]
    #[must_use]
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// Runs every time this node becomes leader, on a blocking thread. It should
    /// return promptly: `on_leader_loss` for this term cannot run before it
    /// returns. Long-running leader work belongs in [`Elector::while_leader`], or
    /// in [`ElectorBuilder::on_leader_term`], which is told when the term ends.
    /// Replaces an earlier `on_leader` or `on_leader_term`.
    #[doc(alias = "onmaster", alias = "on_master")]
    #[must_use]
    pub fn on_leader(self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_leader_term(move |_| f())
    }

    /// Runs every time this node becomes leader, on a blocking thread, with the
    /// term's cancellation token: it is cancelled when the term ends (lost before
    /// the lease can lapse, released, or stopped), so a callback that runs leader
    /// work itself can return in time. `on_leader_loss` runs after it returns.
    /// Cancelling it yourself does not end the term. A term that ends
    /// before its `on_leader` could start is not reported at all (neither
    /// `on_leader` nor `on_leader_loss`). Replaces an earlier `on_leader`.
    #[must_use]
    pub fn on_leader_term(mut self, f: impl Fn(CancellationToken) + Send + Sync + 'static) -> Self {
        self.handlers.on_leader = Some(Arc::new(f));
        self
    }

    /// Runs every time this node stops being leader (lost, released or stopped),
    /// after that term's `on_leader` returned, and ahead of an `on_leader` that is
    /// waiting.
    #[doc(alias = "onmasterloss", alias = "on_master_loss")]
    #[must_use]
    pub fn on_leader_loss(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.handlers.on_leader_loss = Some(Arc::new(f));
        self
    }

    /// Runs every round (every renew interval) after its lease maintenance,
    /// whatever the role, on its own blocking thread: while it runs, further rounds
    /// are coalesced into one pending call, and it never delays `on_leader` or
    /// `on_leader_loss` (which may therefore run at the same time).
    #[doc(alias = "onloop")]
    #[must_use]
    pub fn on_loop(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.handlers.on_loop = Some(Arc::new(f));
        self
    }

    /// Runs when this node observes a new leader (another owner or term than the
    /// last one it reported, itself included), as client-go's `OnNewLeader`. It
    /// runs in `on_loop`'s lane, coalesced: when leadership changes faster than
    /// the callback returns, only the latest leader is reported. The same
    /// information as [`Elector::leadership`], pushed instead of watched.
    #[must_use]
    pub fn on_new_leader(mut self, f: impl Fn(LockInfo) + Send + Sync + 'static) -> Self {
        self.handlers.on_new_leader = Some(Arc::new(f));
        self
    }

    /// How long [`Elector::stop`] waits at most (default: the ttl) for the lease
    /// release and the callbacks of the ending term (`on_leader` still running,
    /// then `on_leader_loss`). Callbacks still running then finish in the
    /// background, in order.
    #[must_use]
    pub fn stop_timeout(mut self, timeout: Duration) -> Self {
        self.stop_timeout = Some(timeout);
        self
    }

    /// Whether each node upserts a status document every round (default `true`).
    #[must_use]
    pub fn report_status(mut self, on: bool) -> Self {
        self.report_status = on;
        self
    }

    /// Validates the configuration.
    pub fn build(self) -> Result<Elector<S>, ElectorError> {
        let renew_every = self.renew_every.unwrap_or(self.ttl / 3);
        let identity = self.identity.unwrap_or_else(Identity::current);
        let lock = Lock::builder(self.store.clone(), self.key.clone())
            .collection(self.collection)
            .ttl(self.ttl)
            .renew_every(renew_every)
            .poll_interval(self.poll_interval.unwrap_or(renew_every).max(Duration::from_millis(1)))
            .identity(identity.clone())
            .build()
            .map_err(|e| ElectorError::Config(ConfigError::caused_by(e)))?;
        let status_coll =
            Collection::new(self.status_collection).map_err(|e| ElectorError::Config(ConfigError::caused_by(e)))?;
        let lifetime = CancellationToken::new();
        let inner = Arc::new(Inner {
            key: self.key.clone(),
            lock,
            store: self.store,
            status_coll,
            renew_every,
            report: self.report_status,
            version: self.version,
            identity,
            stop_timeout: self.stop_timeout.unwrap_or(self.ttl),
            callbacks: Dispatcher::new(self.key, self.handlers),
            lifetime: lifetime.clone(),
            run: Mutex::new(None),
            running: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            term: tokio::sync::Mutex::new(None),
            snapshot: Mutex::new(None),
            leadership: watch::channel(Leadership::default()).0,
            changed: Notify::new(),
            terms_won: AtomicU64::new(0),
            reporting: tokio::sync::Mutex::new(false),
            last_round: Mutex::new(None),
        });
        Ok(Elector::from_inner(inner, lifetime))
    }
}
