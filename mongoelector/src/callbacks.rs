//! The callback dispatcher: user callbacks run off the renewal path, on blocking
//! threads, in two lanes so that nothing the user does in one callback can hold
//! back the report that leadership ended.
//!
//! - The **term lane** runs `on_leader` and `on_leader_loss`, one at a time. A
//!   pending loss goes before a pending `on_leader` (which can only belong to a
//!   later term). A term that ends before its `on_leader` started is not reported
//!   at all: its pending `on_leader` is dropped and no loss follows, so the user
//!   never hears "leader" for a term that is already over, and for one node the
//!   two callbacks still strictly alternate, leader first. Without an
//!   `on_leader`, every term's loss is reported.
//! - The **info lane** runs `on_new_leader` and `on_loop`, each coalesced: at most
//!   one of each is pending, with the latest leader. A slow `on_loop` delays
//!   neither lane's other work nor a loss.
//!
//! A callback that is already running is never interrupted: a loss waits for a
//! running `on_leader` (which gets the term's cancellation token to return in
//! time). Panics are logged, never fatal.

use std::sync::Arc;

use parking_lot::Mutex;

use mongolock::LockInfo;
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

/// A callback without arguments.
pub type Callback = Arc<dyn Fn() + Send + Sync>;
/// A callback given the term's cancellation token.
pub(crate) type TermCallback = Arc<dyn Fn(CancellationToken) + Send + Sync>;
/// A callback given the new leader.
pub(crate) type LeaderCallback = Arc<dyn Fn(LockInfo) + Send + Sync>;

/// The user's callbacks.
#[derive(Default, Clone)]
pub(crate) struct Handlers {
    pub(crate) on_leader: Option<TermCallback>,
    pub(crate) on_leader_loss: Option<Callback>,
    pub(crate) on_loop: Option<Callback>,
    pub(crate) on_new_leader: Option<LeaderCallback>,
}

/// What is pending, per lane.
#[derive(Debug, Default)]
struct Pending {
    /// A term whose `on_leader` has not started; its cancellation token.
    leader: Option<CancellationToken>,
    /// The current term's `on_leader` started and its loss is not queued yet.
    reported: bool,
    /// An `on_leader_loss` to run.
    loss: bool,
    /// A term-lane callback runs now.
    term_running: bool,
    /// Answered once the term lane has nothing pending or running.
    flushes: Vec<oneshot::Sender<()>>,
    /// The latest leader not yet reported to `on_new_leader`.
    new_leader: Option<LockInfo>,
    /// An `on_loop` to run.
    round: bool,
    /// The elector is gone: the term lane delivers what is pending and ends; the
    /// info lane ends.
    closed: bool,
    /// The lanes were spawned.
    spawned: bool,
}

/// The next job of a lane.
enum Job {
    Leader(CancellationToken),
    Loss,
    NewLeader(LockInfo),
    Round,
}

impl Pending {
    fn term_idle(&self) -> bool {
        !self.loss && self.leader.is_none() && !self.term_running
    }

    fn answer_flushes(&mut self) {
        if self.term_idle() {
            for f in self.flushes.drain(..) {
                let _ = f.send(());
            }
        }
    }

    /// The term lane's next job: a loss first, then an `on_leader` whose term has
    /// not ended yet (one that has is dropped, and its loss will not be reported).
    fn next_term_job(&mut self) -> Option<Job> {
        if self.loss {
            self.loss = false;
            return Some(Job::Loss);
        }
        let cancel = self.leader.take()?;
        if cancel.is_cancelled() {
            return None;
        }
        self.reported = true;
        Some(Job::Leader(cancel))
    }

    fn next_info_job(&mut self) -> Option<Job> {
        if let Some(l) = self.new_leader.take() {
            return Some(Job::NewLeader(l));
        }
        std::mem::take(&mut self.round).then_some(Job::Round)
    }

    fn push_leader(&mut self, term: CancellationToken) {
        self.leader = Some(term);
    }

    fn push_loss(&mut self) {
        if self.leader.take().is_some() {
            // The term ended before its `on_leader` started: report neither.
        } else if std::mem::take(&mut self.reported) {
            self.loss = true;
        }
    }
}

struct Shared {
    key: String,
    handlers: Handlers,
    pending: Mutex<Pending>,
    term_wake: Notify,
    info_wake: Notify,
}

impl Shared {
    fn pending(&self) -> parking_lot::MutexGuard<'_, Pending> {
        self.pending.lock()
    }
}

/// The elector's side of the dispatcher. Dropping it lets the lanes end once the
/// term lane has delivered what is pending.
pub(crate) struct Dispatcher {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher").field("key", &self.shared.key).finish_non_exhaustive()
    }
}

impl Dispatcher {
    pub(crate) fn new(key: String, handlers: Handlers) -> Self {
        let shared = Shared {
            key,
            handlers,
            pending: Mutex::new(Pending::default()),
            term_wake: Notify::new(),
            info_wake: Notify::new(),
        };
        Dispatcher { shared: Arc::new(shared) }
    }

    /// Changes the pending work and wakes the lanes, spawning them on the first
    /// call made inside a runtime (whether the elector runs its own loop or is
    /// driven by `poll`).
    fn update(&self, f: impl FnOnce(&mut Pending)) {
        let mut p = self.shared.pending();
        f(&mut p);
        if !p.spawned {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                p.spawned = true;
                drop(rt.spawn(term_lane(self.shared.clone())));
                drop(rt.spawn(info_lane(self.shared.clone())));
            }
        }
        drop(p);
        self.shared.term_wake.notify_one();
        self.shared.info_wake.notify_one();
    }

    /// This node became leader of the term cancelled by `term`. Without an
    /// `on_leader` there is nothing to start: the term counts as reported at
    /// once, so that its loss is always reported, however short the term.
    pub(crate) fn leader(&self, term: CancellationToken) {
        if self.shared.handlers.on_leader.is_some() {
            self.update(|p| p.push_leader(term));
        } else {
            self.update(|p| p.reported = true);
        }
    }

    /// This node's term ended.
    pub(crate) fn loss(&self) {
        self.update(Pending::push_loss);
    }

    /// One round passed: `on_loop` is due (coalesced).
    pub(crate) fn round_passed(&self) {
        if self.shared.handlers.on_loop.is_some() {
            self.update(|p| p.round = true);
        }
    }

    /// A new leader was observed (coalesced: the latest one is reported).
    pub(crate) fn new_leader(&self, leader: LockInfo) {
        if self.shared.handlers.on_new_leader.is_some() {
            self.update(|p| p.new_leader = Some(leader));
        }
    }

    /// Waits until the term lane has nothing pending or running (every
    /// `on_leader` and `on_leader_loss` reported so far has returned).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future only stops waiting.
    pub(crate) async fn flush(&self) {
        // Events pushed outside a runtime have no lanes yet.
        self.update(|_| {});
        let rx = {
            let mut p = self.shared.pending();
            if p.term_idle() {
                return;
            }
            let (tx, rx) = oneshot::channel();
            p.flushes.push(tx);
            rx
        };
        let _ = rx.await;
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        self.shared.pending().closed = true;
        self.shared.term_wake.notify_one();
        self.shared.info_wake.notify_one();
    }
}

/// Runs one callback on a blocking thread; a panic is logged.
async fn run(shared: &Shared, job: Job) {
    let h = &shared.handlers;
    let (what, f): (&str, Option<Box<dyn FnOnce() + Send>>) = match job {
        Job::Leader(term) => ("on_leader", h.on_leader.clone().map(|f| Box::new(move || f(term)) as _)),
        Job::Loss => ("on_leader_loss", h.on_leader_loss.clone().map(|f| Box::new(move || f()) as _)),
        Job::NewLeader(l) => ("on_new_leader", h.on_new_leader.clone().map(|f| Box::new(move || f(l)) as _)),
        Job::Round => ("on_loop", h.on_loop.clone().map(|f| Box::new(move || f()) as _)),
    };
    let Some(f) = f else { return };
    if let Err(e) = tokio::task::spawn_blocking(f).await {
        tracing::error!(key = %shared.key, callback = what, error = %e, "elector callback panicked");
    }
}

/// `on_leader` and `on_leader_loss`, in order, a loss first.
async fn term_lane(shared: Arc<Shared>) {
    loop {
        let job = {
            let mut p = shared.pending();
            match p.next_term_job() {
                Some(job) => {
                    p.term_running = true;
                    Some(job)
                }
                None => {
                    p.answer_flushes();
                    if p.closed && p.term_idle() {
                        return;
                    }
                    None
                }
            }
        };
        match job {
            Some(job) => {
                run(&shared, job).await;
                let mut p = shared.pending();
                p.term_running = false;
                p.answer_flushes();
            }
            None => shared.term_wake.notified().await,
        }
    }
}

/// `on_new_leader` and `on_loop`, coalesced.
async fn info_lane(shared: Arc<Shared>) {
    loop {
        let job = {
            let mut p = shared.pending();
            if p.closed {
                return;
            }
            p.next_info_job()
        };
        match job {
            Some(job) => run(&shared, job).await,
            None => shared.info_wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(j: Option<Job>) -> &'static str {
        match j {
            Some(Job::Leader(_)) => "leader",
            Some(Job::Loss) => "loss",
            Some(Job::NewLeader(_)) => "leader",
            Some(Job::Round) => "round",
            None => "-",
        }
    }

    #[test]
    fn rounds_coalesce() {
        let mut p = Pending::default();
        for _ in 0..5 {
            p.round = true;
        }
        assert_eq!(kind(p.next_info_job()), "round");
        assert_eq!(kind(p.next_info_job()), "-");
    }

    #[test]
    fn a_term_that_ended_before_its_on_leader_started_is_not_reported() {
        let mut p = Pending::default();
        p.push_leader(CancellationToken::new());
        p.push_loss();
        assert_eq!(kind(p.next_term_job()), "-");
        assert!(p.term_idle());
    }

    #[test]
    fn a_loss_goes_before_the_next_terms_on_leader() {
        let mut p = Pending::default();
        p.push_leader(CancellationToken::new());
        assert_eq!(kind(p.next_term_job()), "leader");
        // While `on_leader` runs, the term ends and the next one begins.
        p.push_loss();
        p.push_leader(CancellationToken::new());
        assert_eq!(kind(p.next_term_job()), "loss");
        assert_eq!(kind(p.next_term_job()), "leader");
        p.push_loss();
        assert_eq!(kind(p.next_term_job()), "loss");
        assert_eq!(kind(p.next_term_job()), "-");
    }

    #[tokio::test]
    async fn without_an_on_leader_a_short_terms_loss_is_reported() {
        let losses = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let l = losses.clone();
        let on_loss: Callback = Arc::new(move || {
            l.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let d = Dispatcher::new("k".into(), Handlers { on_leader_loss: Some(on_loss), ..Handlers::default() });
        // The term ends before any lane ran.
        d.leader(CancellationToken::new());
        d.loss();
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while losses.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the loss was reported");
    }

    #[test]
    fn an_on_leader_whose_term_was_cancelled_is_skipped() {
        let mut p = Pending::default();
        let t = CancellationToken::new();
        p.push_leader(t.clone());
        t.cancel();
        assert_eq!(kind(p.next_term_job()), "-");
        p.push_loss();
        assert_eq!(kind(p.next_term_job()), "-", "no loss for a term never reported");
    }
}
