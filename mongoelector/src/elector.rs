//! The elector handle: each method delegates to the machinery in the sibling
//! modules, which work on the state the handle and its tasks share (`inner.rs`).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mongolock::{Identity, LockError};
use store_trait::Store;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::campaign;
use crate::error::ElectorError;
use crate::inner::{Inner, RunState};
use crate::leadership::{Leadership, Role};
use crate::observer;
use crate::round;
use crate::status::{ClusterDetail, NodeStatus};

/// A leader-election participant. Cheap to clone; when the last clone is dropped
/// its background tasks stop and leadership is released.
#[derive(Clone)]
pub struct Elector<S: Store + Clone> {
    pub(crate) inner: Arc<Inner<S>>,
    _drop: Arc<DropGuard>,
}

impl<S: Store + Clone> std::fmt::Debug for Elector<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("key", &self.inner.key)
            .field("node", &self.inner.identity.to_string())
            .field("is_leader", &self.is_leader())
            .finish_non_exhaustive()
    }
}

impl<S: Store + Clone> Elector<S> {
    pub(crate) fn from_inner(inner: Arc<Inner<S>>, lifetime: CancellationToken) -> Self {
        Elector { inner, _drop: Arc::new(lifetime.drop_guard()) }
    }

    /// The election key.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// This node's identity.
    pub fn identity(&self) -> &Identity {
        &self.inner.identity
    }

    /// Starts the background tasks (the campaign, the rounds, the observer) and
    /// returns. Idempotent. Must be called inside a tokio runtime.
    pub fn start(&self) -> Result<(), ElectorError> {
        let mut run = self.inner.run.lock();
        if run.is_some() {
            return Ok(());
        }
        self.inner.stopped.store(false, Ordering::SeqCst);
        let stop = self.inner.lifetime.child_token();
        let main = tokio::spawn(campaign::run(self.inner.clone(), stop.clone()));
        tokio::spawn(observer::observer(self.inner.clone(), stop.clone()));
        tokio::spawn(round::rounds(self.inner.clone(), stop.clone()));
        self.inner.running.store(true, Ordering::SeqCst);
        tracing::info!(key = %self.inner.key, node = %self.inner.identity, "elector started");
        *run = Some(RunState { stop, main });
        Ok(())
    }

    /// Starts and returns only after [`Elector::stop`] (from elsewhere) — the Python `MongoElector`'s
    /// `start(blocking=True)`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future only stops waiting; the elector keeps
    /// running until [`Elector::stop`] or the last handle is dropped.
    pub async fn run(&self) -> Result<(), ElectorError> {
        self.start()?;
        let stop = self.inner.run.lock().as_ref().map(|r| r.stop.clone());
        if let Some(stop) = stop {
            stop.cancelled().await;
        }
        Ok(())
    }

    /// Stops the background tasks and surrenders leadership at once; returns once
    /// the lease is released and `on_leader_loss` has run, or after the stop
    /// timeout ([`ElectorBuilder::stop_timeout`](crate::ElectorBuilder::stop_timeout), default the ttl), whichever
    /// comes first. It never waits for `on_loop`. After the timeout, a release
    /// still in flight and callbacks still running (an `on_leader` that ignores
    /// its cancellation token, then `on_leader_loss`) finish in the background.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe once polled: the campaign has been told to stop and the release
    /// runs on a task of its own, so dropping the future only stops waiting for
    /// the release and the callbacks.
    pub async fn stop(&self) {
        let inner = &self.inner;
        let deadline = tokio::time::Instant::now() + inner.stop_timeout;
        let run = inner.run.lock().take();
        inner.stopped.store(true, Ordering::SeqCst);
        inner.running.store(false, Ordering::SeqCst);
        if let Some(run) = run {
            run.stop.cancel();
            // The campaign releases the lease as it ends.
            if tokio::time::timeout_at(deadline, run.main).await.is_err() {
                tracing::warn!(key = %inner.key, "releasing leadership takes longer than the stop timeout");
            }
        }
        // Not running its own tasks (driven by `poll`): release here, on a task of
        // its own, so the timeout never drops a store call half-way.
        let step_down = tokio::spawn({
            let inner = inner.clone();
            async move { inner.step_down("stopped", true).await }
        });
        let _ = tokio::time::timeout_at(deadline, step_down).await;
        if tokio::time::timeout_at(deadline, inner.callbacks.flush()).await.is_err() {
            tracing::warn!(key = %inner.key, "stopped before the leader callbacks returned; they finish in the background");
        }
        tracing::info!(key = %inner.key, node = %inner.identity, "elector stopped");
    }

    /// Releases leadership if held (calling `on_leader_loss`), letting another node
    /// take over; the campaign goes on and tries again after a renew interval.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in effect: once polled, the term has ended and its loss is
    /// reported; dropped before the release write completes, the lease is released
    /// in the background instead (and the result is not known).
    pub async fn release(&self) -> Result<bool, ElectorError> {
        Ok(self.inner.step_down("released", true).await)
    }

    /// One round by hand instead of `start`, as the Python `MongoElector`'s `poll()`: lease
    /// maintenance — renew if leading, else try once to become leader — then
    /// `on_loop`, then the status report. After [`Elector::stop`] (until the
    /// next [`Elector::start`]) it never tries to become leader, as the seed's
    /// `poll` checks its shutdown flag: it still runs `on_loop` and reports.
    ///
    /// # Cancel safety
    ///
    /// A renewal dropped half-way completes on its own task. A campaign attempt
    /// dropped after its write was sent may win a lease that no guard holds: it
    /// lapses at its expiry, so other nodes take over after at most a ttl.
    pub async fn poll(&self) -> Result<Role, ElectorError> {
        let inner = &self.inner;
        let lost = matches!(inner.term.lock().await.as_ref(), Some(t) if t.cancel.is_cancelled());
        if lost {
            inner.step_down("lost", false).await;
        }
        let role = {
            let mut term = inner.term.lock().await;
            match term.as_ref() {
                Some(t) => match t.guard.touch().await {
                    Ok(_) => Role::Leader,
                    Err(LockError::Lost { .. }) => Role::Follower,
                    Err(e) => return Err(e.into()),
                },
                None if inner.stopped.load(Ordering::SeqCst) => Role::Follower,
                None => match inner.lock.try_acquire().await? {
                    Some(guard) => {
                        inner.become_leader(&mut term, guard);
                        Role::Leader
                    }
                    None => Role::Follower,
                },
            }
        };
        if role == Role::Follower {
            inner.step_down("lost", false).await;
        }
        inner.callbacks.round_passed();
        if inner.report {
            inner.report_status().await?;
        }
        Ok(role)
    }

    /// Whether this node leads now. False as soon as the lease could not be
    /// confirmed in time, before it can lapse on the store.
    #[doc(alias = "ismaster", alias = "is_master")]
    pub fn is_leader(&self) -> bool {
        self.inner.is_leader()
    }

    /// Whether any node leads now (store clock).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a read.
    #[doc(alias = "master_exists")]
    pub async fn leader_exists(&self) -> Result<bool, ElectorError> {
        Ok(self.inner.lock.locked().await?)
    }

    /// Whether the background tasks run.
    pub fn running(&self) -> bool {
        self.inner.running.load(Ordering::SeqCst)
    }

    /// A channel of leadership changes (who leads, with which fence), for leaders
    /// and followers alike. Followers learn of a new leader by change notification
    /// where the store has them, else within a renew interval. To be called back
    /// instead, see [`ElectorBuilder::on_new_leader`](crate::ElectorBuilder::on_new_leader).
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.inner.leadership.subscribe()
    }

    /// The current term's cancellation token: cancelled when leadership ends (lost
    /// before the lease can lapse, released, or stopped). `None` when not leading.
    pub fn term_cancellation(&self) -> Option<CancellationToken> {
        self.inner.live_term().map(|t| t.cancel().clone())
    }

    /// The current term's [`mongolock::Validity`]: how long its lease is
    /// confirmed ([`mongolock::Validity::expiring`]). `None` when not leading.
    pub fn term_validity(&self) -> Option<mongolock::Validity> {
        self.inner.live_term().map(|t| t.validity().clone())
    }

    /// Waits until this node leads, then runs `work(term_cancellation)` until it finishes
    /// (`Some(output)`) or leadership ends first (`None`; the future is dropped).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe as far as the elector is concerned (it changes nothing);
    /// dropping it drops `work`'s future, so `work` decides what a drop means.
    #[doc(alias = "while_master")]
    pub async fn while_leader<F, Fut>(&self, work: F) -> Option<Fut::Output>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future,
    {
        let mut rx = self.leadership();
        let cancel = loop {
            if let Some(t) = self.term_cancellation() {
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
            _ = cancel.cancelled() => None,
            out = work(cancel.clone()) => Some(out),
        }
    }

    /// This node's status (the Python `MongoElector`'s `node_status`).
    pub fn node_status(&self) -> NodeStatus {
        let inner = &self.inner;
        let fence = inner.live_term().map(|t| t.fence());
        NodeStatus {
            key: inner.key.clone(),
            node: inner.identity.to_string(),
            host: inner.identity.host().to_owned(),
            pid: inner.identity.pid(),
            version: inner.version.clone(),
            running: self.running(),
            is_leader: fence.is_some(),
            fence,
            leader: inner.leadership.borrow().leader.clone(),
            terms_won: inner.terms_won.load(Ordering::Relaxed),
            last_round: *inner.last_round.lock(),
        }
    }

    /// Upserts this node's status document now.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the upsert is idempotent; a dropped one may or may not apply.
    pub async fn report_status(&self) -> Result<(), ElectorError> {
        self.inner.report_status().await
    }

    /// All nodes that reported within the last three ttls, and the leader (the
    /// Python `MongoElector`'s `cluster_detail`). Status documents that cannot be read are logged
    /// and left out.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: reads only.
    pub async fn cluster_detail(&self) -> Result<ClusterDetail, ElectorError> {
        self.inner.cluster_detail().await
    }
}
