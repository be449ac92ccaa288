//! Leader election on a shared store: the Rust counterpart of the Python
//! `MongoElector`, built on [`mongolock`]'s leases.
//!
//! - **Handover in milliseconds**: `stop`, `release` and dropping the last handle
//!   release the lease at once, and a waiting follower is woken by a change
//!   notification (or polls every `step` where there are none).
//! - **Failover at the lease limit**: after a leader crashes, a follower takes over
//!   as soon as the lease expires on the store clock — it sleeps until the observed
//!   expiry, not a fixed poll interval.
//! - **Leader-scoped work stops in time**: each term has a cancellation token that
//!   fires *before* the lease can lapse when renewal cannot be confirmed.
//! - **Callbacks off the renewal path**: `on_master`, `on_master_loss` and `on_loop`
//!   run in order on a blocking thread; a slow or panicking callback cannot delay
//!   renewal or kill the loop.
//!
//! ```
//! use mongoelector::Elector;
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), mongoelector::ElectorError> {
//! let store = store_memory::MemoryStore::new(); // or mongoelector::mongo::MongoStore::connect(uri, "coolproj")
//! let elector = Elector::builder(store, "CleverName")
//!     .ttl(Duration::from_secs(15))
//!     .on_master(|| println!("Elected master, starting task scheduler"))
//!     .on_master_loss(|| println!("Master lost, shutting down task scheduler"))
//!     .build()?;
//! elector.start()?;
//! let mut changes = elector.leadership();
//! changes.wait_for(|l| l.is_me).await.expect("elector running");
//! assert!(elector.is_master());
//! assert!(elector.master_exists().await?);
//! elector.stop().await; // surrenders leadership at once
//! assert!(!elector.is_master());
//! # Ok(()) }
//! ```
//!
//! | `MongoElector` | here |
//! |---|---|
//! | `MongoElector(key, dbconn, dbname, ttl, onmaster, onmasterloss, onloop, report_status)` | [`Elector::builder`] |
//! | `start(blocking=False)` / `start(blocking=True)` | [`Elector::start`] / [`Elector::run`] |
//! | `stop()`, `release()`, `poll()` | [`Elector::stop`], [`Elector::release`], [`Elector::poll`] |
//! | `ismaster`, `master_exists`, `running` | [`Elector::is_master`], [`Elector::master_exists`], [`Elector::running`] |
//! | `cluster_detail`, `node_status`, `report_status()` | [`Elector::cluster_detail`], [`Elector::node_status`], [`Elector::report_status`] |

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::doc;
use mongolock::{Acquire, Identity, Lock, LockError, LockGuard, LockInfo};
use store_trait::{Collection, Condition, Key, Mutation, Order, Query, Store, StoreError, StoreTime, Ttl, Write};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

pub use mongolock;

/// The MongoDB backend, re-exported for convenience.
#[cfg(feature = "mongo")]
pub use store_mongo as mongo;

/// The collection holding election leases unless configured otherwise.
pub const DEFAULT_COLLECTION: &str = "electorlocks";
/// The collection holding node status reports unless configured otherwise.
pub const DEFAULT_STATUS_COLLECTION: &str = "electorstatus";
/// The lease length unless configured otherwise (as in `MongoElector`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

/// Errors of the elector.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ElectorError {
    /// The configuration was rejected. Nothing was written.
    #[error("invalid elector configuration: {0}")]
    Config(String),
    /// A lock operation failed.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A callback.
pub type Callback = Arc<dyn Fn() + Send + Sync>;

/// This node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// It holds the leadership lease.
    Master,
    /// It does not.
    Follower,
}

/// Who leads, as this node last observed it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leadership {
    /// The leader, if any (owner, host, pid, since, expiry, fencing token).
    pub leader: Option<LockInfo>,
    /// Whether this node is the leader.
    pub is_me: bool,
}

/// This node's own status (the seed's `node_status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// The election key.
    pub key: String,
    /// This node's identity (`host/pid/instance`).
    pub node: String,
    /// Whether the background loop runs.
    pub running: bool,
    /// Whether this node leads.
    pub is_master: bool,
    /// This node's current term's fencing token, when leading.
    pub term_token: Option<u64>,
    /// The leader as last observed.
    pub leader: Option<LockInfo>,
    /// Elections won by this node.
    pub terms_won: u64,
}

/// One node as reported in the status collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReport {
    /// The node's identity.
    pub node: String,
    /// Its host.
    pub host: String,
    /// Its process id.
    pub pid: i64,
    /// Its software version.
    pub version: String,
    /// Whether it reported itself master.
    pub is_master: bool,
    /// When it last reported (store clock).
    pub last_poll: StoreTime,
}

/// All recently reporting nodes and who leads since when (the seed's `cluster_detail`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDetail {
    /// The election key.
    pub key: String,
    /// The store's time when read.
    pub now: StoreTime,
    /// The live leader, if any.
    pub master: Option<LockInfo>,
    /// Nodes that reported within the last three ttls.
    pub nodes: Vec<NodeReport>,
}

/// Configures an [`Elector`].
pub struct ElectorBuilder<S> {
    store: S,
    key: String,
    ttl: Duration,
    collection: String,
    status_collection: String,
    step: Option<Duration>,
    renew_every: Option<Duration>,
    identity: Option<Identity>,
    on_master: Option<Callback>,
    on_master_loss: Option<Callback>,
    on_loop: Option<Callback>,
    report_status: bool,
}

impl<S> std::fmt::Debug for ElectorBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectorBuilder").field("key", &self.key).field("ttl", &self.ttl).finish_non_exhaustive()
    }
}

impl<S: Store + Clone> ElectorBuilder<S> {
    /// The lease length (default [`DEFAULT_TTL`]): a silently crashed leader is
    /// replaced after at most this long.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The lease collection (default [`DEFAULT_COLLECTION`]).
    pub fn collection(mut self, name: impl Into<String>) -> Self {
        self.collection = name.into();
        self
    }

    /// The status collection (default [`DEFAULT_STATUS_COLLECTION`]).
    pub fn status_collection(mut self, name: impl Into<String>) -> Self {
        self.status_collection = name.into();
        self
    }

    /// How often the leader renews, `on_loop` runs and status is reported (default
    /// a third of the ttl).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// A follower's poll interval where the store has no change notifications
    /// (default: the renew interval).
    pub fn step(mut self, step: Duration) -> Self {
        self.step = Some(step);
        self
    }

    /// The identity recorded for this node (default [`Identity::current`]).
    pub fn identity(mut self, id: Identity) -> Self {
        self.identity = Some(id);
        self
    }

    /// Runs every time this node becomes master.
    pub fn on_master(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_master = Some(Arc::new(f));
        self
    }

    /// Runs every time this node stops being master (lost, released or stopped).
    pub fn on_master_loss(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_master_loss = Some(Arc::new(f));
        self
    }

    /// Runs on every loop (every renew interval), whatever the role.
    pub fn on_loop(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_loop = Some(Arc::new(f));
        self
    }

    /// Whether each node upserts a status document every loop (default `true`).
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
            .step(self.step.unwrap_or(renew_every).max(Duration::from_millis(1)))
            .identity(identity.clone())
            .build()
            .map_err(|e| ElectorError::Config(e.to_string()))?;
        let status_coll = Collection::new(self.status_collection).map_err(|e| ElectorError::Config(e.to_string()))?;
        let lifetime = CancellationToken::new();
        let (cb_tx, cb_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            key: self.key,
            lock,
            store: self.store,
            status_coll,
            renew_every,
            report: self.report_status,
            identity,
            callbacks: Callbacks {
                on_master: self.on_master,
                on_master_loss: self.on_master_loss,
                on_loop: self.on_loop,
            },
            cb_tx,
            cb_rx: Mutex::new(Some(cb_rx)),
            lifetime: lifetime.clone(),
            run: Mutex::new(None),
            running: AtomicBool::new(false),
            term: tokio::sync::Mutex::new(None),
            term_token: Mutex::new(None),
            leadership: watch::channel(Leadership::default()).0,
            changed: Notify::new(),
            terms_won: AtomicU64::new(0),
        });
        Ok(Elector { inner, _drop: Arc::new(lifetime.drop_guard()) })
    }
}

struct Callbacks {
    on_master: Option<Callback>,
    on_master_loss: Option<Callback>,
    on_loop: Option<Callback>,
}

#[derive(Debug)]
enum Event {
    Master,
    MasterLoss,
    Loop,
    /// Answered once every earlier callback has run.
    Flush(tokio::sync::oneshot::Sender<()>),
}

struct RunState {
    stop: CancellationToken,
    main: JoinHandle<()>,
}

/// A leadership term held by this node.
struct Term<S: Store + Clone> {
    guard: LockGuard<S>,
    token: CancellationToken,
}

struct Inner<S: Store + Clone> {
    key: String,
    lock: Lock<S>,
    store: S,
    status_coll: Collection,
    renew_every: Duration,
    report: bool,
    identity: Identity,
    callbacks: Callbacks,
    cb_tx: mpsc::UnboundedSender<Event>,
    cb_rx: Mutex<Option<mpsc::UnboundedReceiver<Event>>>,
    lifetime: CancellationToken,
    run: Mutex<Option<RunState>>,
    running: AtomicBool,
    term: tokio::sync::Mutex<Option<Term<S>>>,
    /// The current term's token, readable without awaiting (`is_master`).
    term_token: Mutex<Option<(CancellationToken, u64, mongolock::Validity)>>,
    leadership: watch::Sender<Leadership>,
    changed: Notify,
    terms_won: AtomicU64,
}

/// A leader-election participant. Cheap to clone; when the last clone is dropped
/// the background loop stops and leadership is released.
#[derive(Clone)]
pub struct Elector<S: Store + Clone> {
    inner: Arc<Inner<S>>,
    _drop: Arc<DropGuard>,
}

impl<S: Store + Clone> std::fmt::Debug for Elector<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("key", &self.inner.key)
            .field("node", &self.inner.identity.to_string())
            .field("is_master", &self.is_master())
            .finish_non_exhaustive()
    }
}

fn lock_poisoned<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<S: Store + Clone> Elector<S> {
    /// Configures an elector for election `key` on `store`.
    pub fn builder(store: S, key: impl Into<String>) -> ElectorBuilder<S> {
        ElectorBuilder {
            store,
            key: key.into(),
            ttl: DEFAULT_TTL,
            collection: DEFAULT_COLLECTION.into(),
            status_collection: DEFAULT_STATUS_COLLECTION.into(),
            step: None,
            renew_every: None,
            identity: None,
            on_master: None,
            on_master_loss: None,
            on_loop: None,
            report_status: true,
        }
    }

    /// The election key.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// This node's identity.
    pub fn identity(&self) -> &Identity {
        &self.inner.identity
    }

    /// Starts the background loop (campaign as follower, renew as leader) and
    /// returns. Idempotent. Must be called inside a tokio runtime.
    pub fn start(&self) -> Result<(), ElectorError> {
        let mut run = lock_poisoned(&self.inner.run);
        if run.is_some() {
            return Ok(());
        }
        let stop = self.inner.lifetime.child_token();
        let main = tokio::spawn(main_loop(self.inner.clone(), stop.clone()));
        tokio::spawn(observer(self.inner.clone(), stop.clone()));
        tokio::spawn(ticker(self.inner.clone(), stop.clone()));
        self.inner.running.store(true, Ordering::SeqCst);
        tracing::info!(key = %self.inner.key, node = %self.inner.identity, "elector started");
        *run = Some(RunState { stop, main });
        Ok(())
    }

    /// Starts and returns only after [`Elector::stop`] (from elsewhere) — the seed's
    /// `start(blocking=True)`.
    pub async fn run(&self) -> Result<(), ElectorError> {
        self.start()?;
        let stop = lock_poisoned(&self.inner.run).as_ref().map(|r| r.stop.clone());
        if let Some(stop) = stop {
            stop.cancelled().await;
        }
        Ok(())
    }

    /// Stops the background loop and surrenders leadership at once; returns when
    /// the lease is released (or the release failed and the lease will lapse).
    pub async fn stop(&self) {
        let run = lock_poisoned(&self.inner.run).take();
        if let Some(run) = run {
            run.stop.cancel();
            let _ = run.main.await;
        }
        self.inner.step_down("stopped", true).await;
        self.inner.running.store(false, Ordering::SeqCst);
        // Return only after `on_master_loss` (and every earlier callback) ran.
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.inner.send(Event::Flush(tx));
        let _ = rx.await;
        tracing::info!(key = %self.inner.key, node = %self.inner.identity, "elector stopped");
    }

    /// Releases leadership if held (calling `on_master_loss`), letting another node
    /// take over; the loop keeps running and campaigns again after a renew interval.
    pub async fn release(&self) -> Result<bool, ElectorError> {
        Ok(self.inner.step_down("released", true).await)
    }

    /// One round of lock maintenance — renew if leading, else try once to become
    /// leader — then `on_loop`. For driving the elector by hand instead of `start`.
    pub async fn poll(&self) -> Result<Role, ElectorError> {
        let inner = &self.inner;
        let lost = matches!(inner.term.lock().await.as_ref(), Some(t) if t.token.is_cancelled());
        if lost {
            inner.step_down("lost", false).await;
        }
        let role = {
            let mut term = inner.term.lock().await;
            match term.as_ref() {
                Some(t) => match t.guard.touch().await {
                    Ok(_) => Role::Master,
                    Err(LockError::Lost { .. }) => Role::Follower,
                    Err(e) => return Err(e.into()),
                },
                None => match inner.lock.try_acquire().await? {
                    Some(guard) => {
                        inner.become_master(&mut term, guard);
                        Role::Master
                    }
                    None => Role::Follower,
                },
            }
        };
        if role == Role::Follower {
            inner.step_down("lost", false).await;
        }
        inner.send(Event::Loop);
        if inner.report {
            inner.report_status().await?;
        }
        Ok(role)
    }

    /// Whether this node leads now. False as soon as the lease could not be
    /// confirmed in time, before it can lapse on the store.
    pub fn is_master(&self) -> bool {
        self.inner.is_master()
    }

    /// Whether any node leads now (store clock).
    pub async fn master_exists(&self) -> Result<bool, ElectorError> {
        Ok(self.inner.lock.locked().await?)
    }

    /// Whether the background loop runs.
    pub fn running(&self) -> bool {
        self.inner.running.load(Ordering::SeqCst)
    }

    /// A channel of leadership changes (who leads, with which token), for leaders
    /// and followers alike. Followers learn of a new leader by change notification
    /// where the store has them, else within a renew interval.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.inner.leadership.subscribe()
    }

    /// The current term's cancellation token: cancelled when leadership ends (lost
    /// before the lease can lapse, released, or stopped). `None` when not leading.
    pub fn term_token(&self) -> Option<CancellationToken> {
        lock_poisoned(&self.inner.term_token)
            .as_ref()
            .filter(|(t, _, v)| !t.is_cancelled() && !v.is_lost())
            .map(|(t, _, _)| t.clone())
    }

    /// The current term's [`mongolock::Validity`]: how long its lease is confirmed
    /// ([`mongolock::Validity::expiring`]). `None` when not leading.
    pub fn term_validity(&self) -> Option<mongolock::Validity> {
        lock_poisoned(&self.inner.term_token)
            .as_ref()
            .filter(|(t, _, v)| !t.is_cancelled() && !v.is_lost())
            .map(|(_, _, v)| v.clone())
    }

    /// Waits until this node leads, then runs `work(term_token)` until it finishes
    /// (`Some(output)`) or leadership ends first (`None`; the future is dropped).
    pub async fn while_master<F, Fut>(&self, work: F) -> Option<Fut::Output>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future,
    {
        let mut rx = self.leadership();
        let token = loop {
            if let Some(t) = self.term_token() {
                break t;
            }
            if rx.changed().await.is_err() {
                return None;
            }
        };
        // Biased: work that finishes in the same instant leadership ends does not
        // count as done while leader.
        tokio::select! {
            biased;
            _ = token.cancelled() => None,
            out = work(token.clone()) => Some(out),
        }
    }

    /// This node's status.
    pub fn node_status(&self) -> NodeStatus {
        let term = lock_poisoned(&self.inner.term_token)
            .as_ref()
            .filter(|(t, _, v)| !t.is_cancelled() && !v.is_lost())
            .map(|(_, n, _)| *n);
        NodeStatus {
            key: self.inner.key.clone(),
            node: self.inner.identity.to_string(),
            running: self.running(),
            is_master: term.is_some(),
            term_token: term,
            leader: self.inner.leadership.borrow().leader.clone(),
            terms_won: self.inner.terms_won.load(Ordering::Relaxed),
        }
    }

    /// Upserts this node's status document now.
    pub async fn report_status(&self) -> Result<(), ElectorError> {
        self.inner.report_status().await
    }

    /// All nodes that reported within the last three ttls, and the leader.
    pub async fn cluster_detail(&self) -> Result<ClusterDetail, ElectorError> {
        let inner = &self.inner;
        let status = inner.lock.status().await?;
        let q = Query::eq(doc! { "election": &inner.key }).sort("node", Order::Asc);
        let horizon = status.now.as_millis() - 3 * i64::try_from(inner.lock.ttl().as_millis()).unwrap_or(i64::MAX / 4);
        let nodes = inner
            .store
            .find(&inner.status_coll, &q)
            .await?
            .into_iter()
            .filter_map(|r| {
                let d = r.data();
                let last_poll = d.get_datetime("last_poll").ok()?.timestamp_millis();
                (last_poll >= horizon).then(|| NodeReport {
                    node: d.get_str("node").unwrap_or_default().to_owned(),
                    host: d.get_str("host").unwrap_or_default().to_owned(),
                    pid: d.get("pid").and_then(store_trait::semantics::as_i64).unwrap_or_default(),
                    version: d.get_str("version").unwrap_or_default().to_owned(),
                    is_master: d.get_bool("is_master").unwrap_or(false),
                    last_poll: StoreTime::from_millis(last_poll),
                })
            })
            .collect();
        Ok(ClusterDetail { key: inner.key.clone(), now: status.now, master: status.holder, nodes })
    }
}

impl<S: Store + Clone> Inner<S> {
    fn is_master(&self) -> bool {
        lock_poisoned(&self.term_token).as_ref().is_some_and(|(t, _, v)| !t.is_cancelled() && !v.is_lost())
    }

    fn send(self: &Arc<Self>, ev: Event) {
        // The dispatcher starts with the first event, whether the elector runs its
        // own loop or is driven by `poll`.
        if let Some(rx) = lock_poisoned(&self.cb_rx).take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn(dispatch_callbacks(Arc::downgrade(self), rx))),
                Err(_) => *lock_poisoned(&self.cb_rx) = Some(rx),
            }
        }
        let _ = self.cb_tx.send(ev);
    }

    /// Records a won election (the caller holds the term mutex).
    fn become_master(self: &Arc<Self>, slot: &mut Option<Term<S>>, guard: LockGuard<S>) {
        let token = guard.lost_token();
        *lock_poisoned(&self.term_token) = Some((token.clone(), guard.token(), guard.validity()));
        self.terms_won.fetch_add(1, Ordering::Relaxed);
        tracing::info!(key = %self.key, node = %self.identity, token = guard.token(), "elected master");
        *slot = Some(Term { guard, token });
        self.send(Event::Master);
        self.changed.notify_one();
    }

    /// Ends this node's term, if any: cancels the term token first (leader-only
    /// work stops), then releases the lease when `release` is set. Returns whether
    /// there was a term.
    async fn step_down(self: &Arc<Self>, why: &str, release: bool) -> bool {
        let Some(term) = self.term.lock().await.take() else { return false };
        term.token.cancel();
        *lock_poisoned(&self.term_token) = None;
        let token = term.guard.token();
        if release && !term.guard.is_lost() {
            if let Err(e) = term.guard.release().await {
                tracing::warn!(key = %self.key, token, error = %e, "releasing leadership failed; it lapses at expiry");
            }
        } else {
            drop(term.guard);
        }
        tracing::info!(key = %self.key, node = %self.identity, token, why, "master status ended");
        self.send(Event::MasterLoss);
        self.changed.notify_one();
        true
    }

    async fn report_status(&self) -> Result<(), ElectorError> {
        let id = Key::new(format!("{}/{}", self.key, self.identity))?;
        let gc = Ttl::new((self.lock.ttl() * 10).max(Duration::from_secs(60)))?;
        let m = Mutation::new()
            .set("election", self.key.as_str())
            .set("node", self.identity.to_string())
            .set("host", self.identity.host())
            .set("pid", i64::from(self.identity.pid()))
            .set("version", env!("CARGO_PKG_VERSION"))
            .set("is_master", self.is_master())
            .set_now("last_poll")
            .gc_after(gc);
        self.store.write(&self.status_coll, &id, &Write::new(Condition::Always, m).upsert()).await?;
        Ok(())
    }

    /// Reads who leads and publishes it if it changed.
    async fn refresh(&self) {
        let leader = match self.lock.get_current().await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "cannot read leadership");
                return;
            }
        };
        let is_me = self.is_master() && leader.as_ref().is_some_and(|l| self.identity.is_mine(&l.owner));
        let next = Leadership { leader, is_me };
        self.leadership.send_if_modified(|cur| {
            // Expiry moves with every renewal; publish changes of who and which term.
            let same = cur.is_me == next.is_me
                && cur.leader.as_ref().map(|l| (&l.owner, l.token))
                    == next.leader.as_ref().map(|l| (&l.owner, l.token));
            *cur = next;
            !same
        });
    }
}

/// Campaigns as follower, leads until the term ends, again, until stopped.
async fn main_loop<S: Store + Clone>(inner: Arc<Inner<S>>, stop: CancellationToken) {
    let mut backoff = Duration::from_millis(50);
    while !stop.is_cancelled() {
        // Campaign: the blocking acquire wakes on a change notification (release)
        // or at the observed expiry (crash), and polls only without notifications.
        let acquired = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            r = inner.lock.acquire_with(Acquire::new().auto_renew()) => r,
        };
        let guard = match acquired {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(key = %inner.key, error = %e, "campaign failed; retrying");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(inner.renew_every);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        let token = {
            let mut slot = inner.term.lock().await;
            inner.become_master(&mut slot, guard);
            slot.as_ref().map(|t| t.token.clone())
        };
        let Some(token) = token else { continue };
        tokio::select! {
            biased;
            _ = stop.cancelled() => {
                inner.step_down("stopped", true).await;
                break;
            }
            _ = token.cancelled() => {
                // Lost (the lease could not be confirmed) or released by `release()`.
                let released = !inner.step_down("lost", false).await;
                if released {
                    // Let another node take over before campaigning again.
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(inner.renew_every) => {}
                    }
                }
            }
        }
    }
}

/// Keeps the published leadership current: on change notifications for the key,
/// on local transitions, and every renew interval.
async fn observer<S: Store + Clone>(inner: Arc<Inner<S>>, stop: CancellationToken) {
    let (store, coll, key) = (inner.lock.store().clone(), inner.lock.collection().clone(), inner.lock.key().clone());
    // Re-subscribes by itself after the stream ends (a server restart).
    // Renewals change nothing it publishes that the timer below does not refresh.
    let mut events = store_trait::Watcher::open(store, coll, Some(key), inner.renew_every).await.ignore_renewals();
    loop {
        inner.refresh().await;
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = inner.changed.notified() => {}
            _ = tokio::time::sleep(inner.renew_every) => {}
            _ = events.changed() => {}
        }
    }
    inner.refresh().await;
}

/// Every renew interval: `on_loop` and the status report.
async fn ticker<S: Store + Clone>(inner: Arc<Inner<S>>, stop: CancellationToken) {
    loop {
        inner.send(Event::Loop);
        if inner.report {
            if let Err(e) = inner.report_status().await {
                tracing::debug!(key = %inner.key, error = %e, "status report failed");
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(inner.renew_every) => {}
        }
    }
}

/// Runs callbacks one at a time, in order, on a blocking thread: never on the
/// renewal path, and a panic is logged, not fatal.
async fn dispatch_callbacks<S: Store + Clone>(
    inner: std::sync::Weak<Inner<S>>,
    mut rx: mpsc::UnboundedReceiver<Event>,
) {
    while let Some(ev) = rx.recv().await {
        let Some(strong) = inner.upgrade() else { break };
        let cb = match &ev {
            Event::Master => strong.callbacks.on_master.clone(),
            Event::MasterLoss => strong.callbacks.on_master_loss.clone(),
            Event::Loop => strong.callbacks.on_loop.clone(),
            Event::Flush(_) => None,
        };
        if let Event::Flush(done) = ev {
            let _ = done.send(());
            continue;
        }
        let key = strong.key.clone();
        drop(strong);
        if let Some(cb) = cb {
            if let Err(e) = tokio::task::spawn_blocking(move || cb()).await {
                tracing::error!(key, event = ?ev, error = %e, "elector callback panicked");
            }
        }
    }
}
