//! Change notifications: one server-side change stream per collection and
//! store, shared by every watcher in the process.
//!
//! A change stream occupies a pooled connection for as long as its `getMore`
//! waits on the server (up to [`AWAIT`] when nothing changes), and the driver
//! keeps that `getMore`, with its connection, inside the stream object: a
//! watcher that stops polling (a `select!` took another branch; an agent is busy
//! with its tasks) holds the connection until it polls again. One stream per
//! watcher therefore costs one connection per watcher, and a process with more
//! watchers than `maxPoolSize` (default 10) stalls every operation, or deadlocks
//! when the watchers wait for those operations (seen: the demo, with 5 agents,
//! 3 electors and 4 lock waiters). Here one pump task per collection (and
//! server-side filter: a `$match` stage, `Store::watch_filtered`) polls the
//! stream without pause and fans its events out on a broadcast channel; each
//! watcher filters by key on its side. A watcher that falls behind gets a
//! [`ChangeKind::Resync`]. The pump ends when its last watcher is gone.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use bson::Document;
use mongodb::change_stream::event::{ChangeStreamEvent, OperationType};
use store_trait::{fields, ChangeEvent, ChangeKind, ChangeStream, Key, StoreError, StoreResult};
use tokio::sync::broadcast;

use crate::{is_change_streams_unsupported, map_err};

/// Events a watcher may have waiting before it is told to resync.
const BUFFER: usize = 256;

/// How long the server holds a `getMore` with nothing to report. The
/// server's default, a second, makes every idle stream send 60 commands a
/// minute; events still come back the moment they happen, so a long wait
/// costs nothing but the connection the pump holds anyway. Two minutes
/// stay under the idle timeouts of the usual load balancers and NATs (four
/// minutes and more), and make an idle stream's cost half a command a
/// minute.
const AWAIT: Duration = Duration::from_secs(120);

/// How long past [`AWAIT`] a `getMore` may go unanswered before its stream is
/// taken for stalled and dropped ([`pump`]).
const STALL: Duration = Duration::from_secs(30);

/// How often a pump checks whether anyone still watches.
const CHECK: Duration = Duration::from_secs(1);

type DriverStream = mongodb::change_stream::ChangeStream<ChangeStreamEvent<Document>>;

/// What a pump serves: a collection's name, and its `$match` stage as extended
/// JSON (empty for every change).
type Pump = (String, String);

pub(crate) struct Hub {
    /// Open pumps by collection and filter ([`Pump`]); weak, so a pump that
    /// ended (or whose runtime was shut down) is found gone.
    pumps: Mutex<HashMap<Pump, broadcast::WeakSender<ChangeEvent>>>,
    /// Serialises opening, so two first watchers open one stream.
    opening: tokio::sync::Mutex<()>,
    /// The runtime the store was made on (the driver's own tasks run there).
    runtime: Option<tokio::runtime::Handle>,
    /// Set when the process shuts its clients down ([`Hub::close`]): the
    /// pumps end quietly, before their `getMore` fails for want of a client.
    closing: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open: Vec<Pump> = self.pumps.lock().keys().cloned().collect();
        f.debug_struct("Hub").field("open", &open).finish_non_exhaustive()
    }
}

impl Hub {
    pub(crate) fn new() -> Hub {
        Hub {
            pumps: Mutex::default(),
            opening: tokio::sync::Mutex::default(),
            runtime: tokio::runtime::Handle::try_current().ok(),
            closing: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Ends every pump, and any opened later, without a word: the client is
    /// about to be shut down ([`crate::Clients::close`]), and a stream that
    /// then fails is no fault to report. Watchers' streams end.
    pub(crate) fn close(&self) {
        self.closing.send_replace(true);
    }

    fn is_closing(&self) -> bool {
        *self.closing.borrow()
    }

    /// A stream of changes to `coll` (to the document `key` only, if given;
    /// those `stage` lets through only, if given) from now on: the server-side
    /// stream is open when this returns.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        coll: mongodb::Collection<Document>,
        key: Option<Key>,
        stage: Option<Document>,
    ) -> StoreResult<ChangeStream> {
        let name: Pump = (coll.name().to_owned(), stage.as_ref().map(ToString::to_string).unwrap_or_default());
        let rx = match self.existing(&name) {
            Some(rx) => rx,
            None => {
                let _one = self.opening.lock().await;
                match self.existing(&name) {
                    Some(rx) => rx,
                    None => self.open(coll, name, stage).await?,
                }
            }
        };
        Ok(filtered(rx, key))
    }

    fn existing(&self, name: &Pump) -> Option<broadcast::Receiver<ChangeEvent>> {
        let pumps = self.pumps.lock();
        pumps.get(name).and_then(broadcast::WeakSender::upgrade).map(|tx| tx.subscribe())
    }

    async fn open(
        self: &Arc<Self>,
        coll: mongodb::Collection<Document>,
        name: Pump,
        stage: Option<Document>,
    ) -> StoreResult<broadcast::Receiver<ChangeEvent>> {
        let stream = match coll.watch().pipeline(stage).max_await_time(AWAIT).await {
            Ok(s) => s,
            Err(e) if is_change_streams_unsupported(&e) => {
                return Err(StoreError::Unsupported { feature: "change streams", reason: e.to_string() })
            }
            Err(e) => return Err(map_err(e)),
        };
        let (tx, rx) = broadcast::channel(BUFFER);
        self.pumps.lock().insert(name.clone(), tx.downgrade());
        tracing::debug!(collection = %name.0, filter = %name.1, "change stream opened");
        let pump = pump(self.clone(), name, stream, tx);
        match &self.runtime {
            Some(rt) => drop(rt.spawn(pump)),
            None => drop(tokio::spawn(pump)),
        }
        Ok(rx)
    }

    /// Forgets the pump `tx` if nobody watches through it; true if so. Under the
    /// registry's lock, so no watcher can join it after this says yes.
    fn retire_if_unwatched(&self, name: &Pump, tx: &broadcast::Sender<ChangeEvent>) -> bool {
        let mut pumps = self.pumps.lock();
        if tx.receiver_count() > 0 {
            return false;
        }
        Self::forget(&mut pumps, name, tx);
        true
    }

    fn retire(&self, name: &Pump, tx: &broadcast::Sender<ChangeEvent>) {
        Self::forget(&mut self.pumps.lock(), name, tx);
    }

    fn forget(
        pumps: &mut HashMap<Pump, broadcast::WeakSender<ChangeEvent>>,
        name: &Pump,
        tx: &broadcast::Sender<ChangeEvent>,
    ) {
        if pumps.get(name).and_then(broadcast::WeakSender::upgrade).is_none_or(|t| t.same_channel(tx)) {
            pumps.remove(name);
        }
    }
}

/// Polls the driver's stream without pause (so its `getMore` never holds a
/// connection idle) and broadcasts the events, until nobody watches, the
/// stream fails, or it stalls; then the watchers' streams end.
///
/// Stalled: no reply, not even an empty one, for [`STALL`] past [`AWAIT`].
/// A `getMore` that the server never answers (a connection half gone behind
/// a NAT, a server that hangs) would otherwise keep its watchers waiting for
/// ever on notifications that cannot come; ended, they subscribe again, and
/// poll meanwhile.
async fn pump(hub: Arc<Hub>, name: Pump, mut stream: DriverStream, tx: broadcast::Sender<ChangeEvent>) {
    let mut check = tokio::time::interval(CHECK);
    let mut closing = hub.closing.subscribe();
    loop {
        // One reply: an event, or `None` for an empty batch (`AWAIT` passed).
        let item = {
            let next = stream.next_if_any();
            tokio::pin!(next);
            let stalled = tokio::time::sleep(AWAIT + STALL);
            tokio::pin!(stalled);
            loop {
                tokio::select! {
                    item = &mut next => break item,
                    _ = &mut stalled => {
                        tracing::warn!(collection = %name.0, filter = %name.1, waited = ?(AWAIT + STALL), "change stream stalled: no reply; watchers subscribe again, and poll meanwhile");
                        hub.retire(&name, &tx);
                        return;
                    }
                    _ = closing.wait_for(|c| *c) => {
                        tracing::debug!(collection = %name.0, "change stream closed: the client is shutting down");
                        hub.retire(&name, &tx);
                        return;
                    }
                    _ = check.tick() => {
                        if hub.retire_if_unwatched(&name, &tx) {
                            tracing::debug!(collection = %name.0, "change stream closed: no watchers");
                            return;
                        }
                    }
                }
            }
        };
        match item {
            Ok(Some(ev)) => {
                let _ = tx.send(event(ev));
            }
            Ok(None) if stream.is_alive() => {}
            Ok(None) => break,
            Err(e) if hub.is_closing() => {
                tracing::debug!(collection = %name.0, error = %map_err(e), "change stream ended: the client is shutting down");
                break;
            }
            Err(e) => {
                tracing::warn!(collection = %name.0, filter = %name.1, error = %map_err(e), "change stream failed; watchers fall back to polling");
                break;
            }
        }
    }
    hub.retire(&name, &tx);
}

fn event(ev: ChangeStreamEvent<Document>) -> ChangeEvent {
    let key = ev.document_key.as_ref().and_then(|d| d.get(fields::ID)).cloned().and_then(|b| Key::from_bson(b).ok());
    let kind = match ev.operation_type {
        OperationType::Insert => ChangeKind::Insert,
        OperationType::Update => match &ev.update_description {
            Some(u) if u.truncated_arrays.as_ref().is_none_or(Vec::is_empty) => ChangeKind::of_update(
                u.updated_fields.keys().map(String::as_str),
                u.removed_fields.iter().map(String::as_str),
            ),
            _ => ChangeKind::Update,
        },
        OperationType::Replace => ChangeKind::Update,
        OperationType::Delete => ChangeKind::Delete,
        _ => ChangeKind::Resync,
    };
    ChangeEvent { key: if kind == ChangeKind::Resync { None } else { key }, kind }
}

/// The watcher's side: its key's events (and resyncs), a resync when it fell
/// behind, and the end when the pump ends.
fn filtered(rx: broadcast::Receiver<ChangeEvent>, key: Option<Key>) -> ChangeStream {
    let stream = futures::stream::unfold((rx, key), |(mut rx, key)| async move {
        loop {
            match rx.recv().await {
                Ok(ev) if key.is_none() || ev.key.is_none() || ev.key == key => return Some((Ok(ev), (rx, key))),
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    return Some((Ok(ChangeEvent { key: None, kind: ChangeKind::Resync }), (rx, key)))
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Box::pin(stream)
}
