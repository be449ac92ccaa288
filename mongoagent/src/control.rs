//! Pausing an agent name cluster-wide: one control document per agent name in
//! the queue's control collection (`<queue>_control`), which agents consult
//! when they claim. A paused agent claims nothing; tasks it runs finish.
//!
//! How agents learn the state without a read per claim: one task per [`Queue`]
//! (running while an agent on that queue is idle, shared by all of them)
//! subscribes to change notifications on the control collection, then reads the
//! paused names (one `find`), and reads them again after every notification of
//! a pause document (not of the permits and rate limits the collection also
//! holds) and every new subscription; idle agents wake only when the paused
//! names changed. While that subscription is live the agents use what
//! it read, and a pause or resume wakes the idle ones; without one (every agent
//! busy, a store without change notifications, a standalone `mongod`, a stream
//! that ended and is not back yet) each agent reads its own document again
//! once per [`CONTROL_REFRESH`].
//!
//! A notification may come late, or not at all from a stream that stalls
//! without ending (a loaded server, a connection half gone). So what the task
//! read is trusted for [`CONTROL_REFRESH`] only, and an agent about to claim
//! that finds the view older than that reads its own document instead. A
//! pause is seen within [`CONTROL_REFRESH`] of being written, whatever the
//! notifications do. To keep the view fresh, the task reads again when no
//! notification made it read for [`REREAD`], but only while that read is
//! worth something: while some agent name is paused (a resume must reach
//! its idle agents within the bound), or while tasks flow (within [`QUIET`]
//! of the last claim that got a task, so a herd of agents woken by one
//! insert claims on the shared read, not on a read each). A queue idle for
//! longer, with nothing paused, costs no read at all; its first claim after
//! the quiet spell reads its own document, and starts the rereads again if
//! it gets a task or finds its name paused. A claim that finds nothing (an idle agent's periodic
//! check, a wake-up another agent won) starts none: forty reads to serve a
//! herd that is not there would cost an idle agent more than its check.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use bson::{doc, Bson};
use mongolock::ConfigError;
use store_trait::{ChangeEvent, ChangeKind, Collection, Key, Query, Store, StoreError};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::AgentError;
use crate::queue::Queue;

/// How long an agent trusts what it last read of its control document before
/// it reads it again: a pause is seen within this long of being written, and
/// a busy agent reads it at most once per period, not once per claim.
pub const CONTROL_REFRESH: Duration = Duration::from_secs(1);

/// How long the control task goes without reading the paused names (when no
/// notification made it read), while it rereads at all: under
/// [`CONTROL_REFRESH`], so that its view is never too old to trust.
const REREAD: Duration = Duration::from_millis(750);
const _: () = assert!(REREAD.as_millis() < CONTROL_REFRESH.as_millis());

/// How long after agents last needed the view fresh ([`ControlWatch::needed`])
/// the control task keeps rereading, when nothing is paused.
const QUIET: Duration = Duration::from_secs(30);

/// The key of an agent name's control document is this and the name.
pub(crate) const KEY_PREFIX: &str = "agent:";

/// The field of a control document that says its agent name is paused.
pub(crate) const PAUSED: &str = "paused";

/// The paused agent names as read after the last notification, while the
/// control collection's subscription is live; `None` when agents must read on a
/// timer (no subscription, or nothing read since it opened).
pub(crate) type ControlView = Option<Arc<HashSet<String>>>;

/// A queue's view of its control collection, shared by its clones: the
/// sending end of the control task's [`ControlView`]s while the task runs.
/// The task runs while an agent of the queue holds a view (its agents hold one
/// only while idle), so a busy queue holds no subscription: on a server that
/// answers a waiting change-stream `getMore` at every write to the database
/// (SecantusDB does), a subscription held while busy costs more commands than
/// the timed read.
#[derive(Debug, Clone, Default)]
pub(crate) struct ControlWatch {
    task: Arc<Mutex<Option<watch::Sender<ControlView>>>>,
    /// When the read behind the published view was sent: the view is trusted
    /// until [`CONTROL_REFRESH`] after it.
    read_at: Arc<Mutex<Option<Instant>>>,
    /// When agents last needed the view fresh ([`ControlWatch::needed`]),
    /// and the control task's wake-up from a quiet spell.
    looked: Arc<Looked>,
}

/// When agents last needed the view fresh: [`ControlWatch::needed`] marks it, the
/// control task rereads only within [`QUIET`] of it (or while something is
/// paused), and is woken from a quiet spell by it.
#[derive(Debug, Default)]
struct Looked {
    at: Mutex<Option<Instant>>,
    wake: tokio::sync::Notify,
}

impl Looked {
    fn mark(&self) {
        *self.at.lock() = Some(Instant::now());
        self.wake.notify_waiters();
    }

    fn recent(&self) -> bool {
        (*self.at.lock()).is_some_and(|at| at.elapsed() < QUIET)
    }
}

impl ControlWatch {
    /// A view, starting the control task if none runs (inside a runtime).
    pub(crate) fn view<S: Store + Clone>(
        &self,
        store: &S,
        coll: Result<Collection, AgentError>,
    ) -> watch::Receiver<ControlView> {
        let mut slot = self.task.lock();
        if let Some(tx) = slot.as_ref() {
            return tx.subscribe();
        }
        let (tx, rx) = watch::channel(None);
        if let Ok(coll) = coll {
            tokio::spawn(follow(store.clone(), coll, tx.clone(), self.clone()));
            *slot = Some(tx);
        }
        rx
    }

    /// What the running control task last published, with when that read
    /// was sent, without holding a view; `None` (read your own document)
    /// when its read is [`CONTROL_REFRESH`] old.
    pub(crate) fn peek(&self) -> Option<(Instant, Arc<HashSet<String>>)> {
        let at = (*self.read_at.lock()).filter(|at| at.elapsed() < CONTROL_REFRESH)?;
        let names = self.task.lock().as_ref().and_then(|tx| tx.borrow().clone())?;
        Some((at, names))
    }

    /// Marks that agents need the view fresh for a while: an agent's claim
    /// got a task (tasks flow: the next claims, the herd's and the busy
    /// agent's, read what the control task read instead of a document
    /// each), or an agent's own read found its name paused (the control
    /// task then rereads while it stays paused, so the resume reaches the
    /// idle agent within the bound, though notifications stall). The control
    /// task rereads for [`QUIET`] from now.
    pub(crate) fn needed(&self) {
        self.looked.mark();
    }

    /// Returns once nobody holds a view, having forgotten the task's sender
    /// (under the lock, so no view can be taken from a task that ends).
    async fn unwatched(&self, tx: &watch::Sender<ControlView>) {
        loop {
            tx.closed().await;
            let mut slot = self.task.lock();
            if tx.receiver_count() == 0 {
                *slot = None;
                return;
            }
        }
    }
}

/// The control task: subscribe, read the paused names, read them again after
/// each notification of a pause document (a burst read once) and after
/// [`REREAD`] without one while it rereads at all (the module's docs); when the stream ends or a read fails, tell the agents to read on their
/// timer, and subscribe again after [`CONTROL_REFRESH`]. Ends when no agent
/// holds a view.
async fn follow<S: Store + Clone>(store: S, coll: Collection, tx: watch::Sender<ControlView>, control: ControlWatch) {
    loop {
        match store.watch(&coll, None).await {
            Ok(mut stream) => {
                // Read after subscribing: a change after this read is a notification.
                let mut read = true;
                // Whether the last read found any name paused.
                let mut any_paused = false;
                loop {
                    if read {
                        let sent = Instant::now();
                        match paused_names(&store, &coll).await {
                            Ok(names) => {
                                any_paused = !names.is_empty();
                                publish(&tx, names);
                                *control.read_at.lock() = Some(sent);
                            }
                            Err(e) => {
                                tracing::warn!(collection = %coll, error = %e, "reading the control documents failed; agents read them on a timer");
                                break;
                            }
                        }
                    }
                    let rereading = any_paused || control.looked.recent();
                    let reread_at = (*control.read_at.lock()).map_or_else(Instant::now, |at| at + REREAD);
                    let next = tokio::select! {
                        _ = control.unwatched(&tx) => return,
                        ev = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)) => ev,
                        _ = tokio::time::sleep_until(reread_at), if rereading => {
                            // Past the quiet spell, this read is skipped and
                            // the rereads wait for the next look.
                            read = any_paused || control.looked.recent();
                            continue;
                        }
                        // A look after a quiet spell: read now, so the agents'
                        // next claims use the view (this one read its own).
                        _ = control.looked.wake.notified(), if !rereading => {
                            read = true;
                            continue;
                        }
                    };
                    let Some(Ok(ev)) = next else {
                        tracing::debug!(collection = %coll, "control notifications ended; agents read on a timer");
                        break;
                    };
                    // Take the rest of a burst: one read answers all of it, and
                    // only a change of a pause document needs one (the
                    // collection also holds permits and rate limits, written
                    // at every task start).
                    read = about_pause(&ev);
                    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                    while let std::task::Poll::Ready(Some(Ok(ev))) = stream.as_mut().poll_next(&mut cx) {
                        read |= about_pause(&ev);
                    }
                }
            }
            Err(StoreError::Unsupported { .. }) => {
                tracing::debug!(collection = %coll, "no change notifications: agents read the control document on a timer");
                tx.send_replace(None);
                control.unwatched(&tx).await;
                return;
            }
            Err(e) => tracing::debug!(collection = %coll, error = %e, "cannot watch the control collection yet"),
        }
        tx.send_replace(None);
        tokio::select! {
            _ = control.unwatched(&tx) => return,
            _ = tokio::time::sleep(CONTROL_REFRESH) => {}
        }
    }
}

/// Whether a notification may change the paused names: a pause document's,
/// or one that names no document.
fn about_pause(ev: &ChangeEvent) -> bool {
    ev.kind == ChangeKind::Resync || ev.key.as_ref().is_none_or(|k| k.to_string().starts_with(KEY_PREFIX))
}

/// Publishes the paused names read, changed or not: a view's holder (an idle
/// agent) claims only when its own name's state differs from what it last
/// saw (`work.rs`), which may have come from its own read while this view
/// was too old to trust.
fn publish(tx: &watch::Sender<ControlView>, names: HashSet<String>) {
    tx.send_replace(Some(Arc::new(names)));
}

/// The paused agent names: one `find` of the control documents that say so.
pub(crate) async fn paused_names<S: Store>(store: &S, coll: &Collection) -> Result<HashSet<String>, StoreError> {
    let found = store.find(coll, &Query::eq(doc! { PAUSED: Bson::Boolean(true) })).await?;
    Ok(found.iter().filter_map(|r| r.key().to_string().strip_prefix(KEY_PREFIX).map(str::to_owned)).collect())
}

pub(crate) fn control_key(agent: &str) -> Result<Key, AgentError> {
    // No agent has an empty name (`AgentBuilder::build` refuses it).
    if agent.is_empty() {
        return Err(AgentError::Config("an agent name must not be empty".into()));
    }
    Key::new(format!("{KEY_PREFIX}{agent}")).map_err(|e| AgentError::Config(ConfigError::caused_by(e)))
}

impl<S: Store + Clone> Queue<S> {
    /// The control collection: `<queue>_control`.
    pub fn control_collection(&self) -> Result<Collection, AgentError> {
        Collection::new(format!("{}_control", self.coll)).map_err(|e| AgentError::Config(ConfigError::caused_by(e)))
    }
}
