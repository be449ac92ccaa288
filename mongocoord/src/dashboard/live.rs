//! Live updates: one watcher per watched collection for the whole server,
//! fanned out to every browser tab through one broadcast channel; the tabs
//! receive section names over server-sent events and re-fetch that section.
//!
//! Many tabs never mean many change streams: a tab subscribes to the
//! broadcast channel, never to the store. Where the store has no change
//! notifications (or a stream is down and not yet back), each pump announces
//! its section once per poll interval instead.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use store_trait::helpers::Watcher;
use store_trait::{ChangeKind, Collection, Store};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// What a pump sends when everything must be re-read (a tab fell behind).
pub(crate) const ALL: &str = "*";

/// Counters of the live machinery, shown in `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct LiveCounters {
    /// Watchers opened on the store (one per watched collection).
    pub(crate) watchers: AtomicU64,
    /// Change notifications that said "re-read everything" (a stream came back
    /// after a failure, or lagged).
    pub(crate) resyncs: AtomicU64,
    /// Browser tabs connected to `/events` now.
    pub(crate) clients: AtomicU64,
}

/// The fan-out hub: the pumps send section names, the `/events` streams
/// receive them.
#[derive(Debug)]
pub(crate) struct Live {
    tx: broadcast::Sender<Arc<str>>,
    pub(crate) counters: Arc<LiveCounters>,
    stop: CancellationToken,
    /// One permit per open stream (`Limits::live_clients`).
    slots: Arc<tokio::sync::Semaphore>,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Live {
    /// Starts one pump per `(collection, section)`; they stop when the hub is
    /// dropped.
    pub(crate) fn start<S: Store + Clone + 'static>(
        store: &S,
        watched: Vec<(Collection, String)>,
        poll: Duration,
        max_clients: usize,
    ) -> Live {
        let (tx, _) = broadcast::channel(256);
        let counters = Arc::new(LiveCounters::default());
        let stop = CancellationToken::new();
        for (coll, section) in watched {
            let pump = Pump { store: store.clone(), coll, section: section.into(), tx: tx.clone(), poll };
            let (counters, stop) = (counters.clone(), stop.clone());
            tokio::spawn(async move { stop.run_until_cancelled(pump.run(&counters)).await });
        }
        Live { tx, counters, stop, slots: Arc::new(tokio::sync::Semaphore::new(max_clients)) }
    }

    /// A tab's stream of section names, as server-sent events, or `None`
    /// when as many tabs as allowed have one open. The stream ends when
    /// `shutdown` is cancelled.
    pub(crate) fn events(
        &self,
        shutdown: CancellationToken,
    ) -> Option<Sse<impl Stream<Item = Result<Event, std::convert::Infallible>>>> {
        let slot = self.slots.clone().try_acquire_owned().ok()?;
        let rx = self.tx.subscribe();
        let client = Client::new(self.counters.clone(), slot);
        let stream = futures::stream::unfold((rx, client), |(mut rx, client)| async move {
            let section = match rx.recv().await {
                Ok(s) => s,
                // The tab fell behind: everything may have changed.
                Err(broadcast::error::RecvError::Lagged(_)) => ALL.into(),
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            Some((Ok(Event::default().data(&*section)), (rx, client)))
        });
        Some(Sse::new(stream.take_until(shutdown.cancelled_owned())).keep_alive(KeepAlive::default()))
    }
}

/// Counts a connected tab, and holds its slot, for as long as its stream
/// lives.
#[derive(Debug)]
struct Client {
    counters: Arc<LiveCounters>,
    /// Returned when the stream ends.
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Client {
    fn new(counters: Arc<LiveCounters>, slot: tokio::sync::OwnedSemaphorePermit) -> Client {
        counters.clients.fetch_add(1, Ordering::Relaxed);
        Client { counters, _slot: slot }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.counters.clients.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One collection's watcher and the section it announces.
struct Pump<S> {
    store: S,
    coll: Collection,
    section: Arc<str>,
    tx: broadcast::Sender<Arc<str>>,
    poll: Duration,
}

impl<S: Store + Clone> Pump<S> {
    async fn run(self, counters: &LiveCounters) {
        // `Watcher` subscribes again after a failure (then reports a Resync)
        // and stays silent on a store without change notifications.
        let mut w = Watcher::open(self.store.clone(), self.coll.clone(), None, self.poll).await;
        counters.watchers.fetch_add(1, Ordering::Relaxed);
        tracing::info!(collection = %self.coll, live = w.is_live(), "dashboard watching");
        loop {
            let polling = !w.is_live();
            tokio::select! {
                ev = w.changed() => {
                    if ev.kind == ChangeKind::Resync {
                        counters.resyncs.fetch_add(1, Ordering::Relaxed);
                    }
                    // A burst of changes is one re-render.
                    w.drain_ready();
                }
                _ = tokio::time::sleep(self.poll), if polling => {}
            }
            // No tab listening is not an error.
            let _ = self.tx.send(self.section.clone());
            // At most a few announcements a second per collection.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
