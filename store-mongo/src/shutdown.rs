//! A process's clients, shut down before its runtime ends.
//!
//! A `mongodb::Client` dropped with the runtime it runs on may still have
//! its pool's worker answering a connection request as the runtime's tasks
//! go; the driver then panics on stderr (an `unwrap` on a closed channel in
//! its connection requester). Shutting every client down first, while the
//! runtime still runs, ends its pools in order.
//!
//! A store's change streams are ended first: a stream whose client is shut
//! under it fails, and that failure, reported as a fault, would be a false
//! alarm at every clean exit.
//!
//! A client's shutdown is bounded ([`SHUTDOWN_LIMIT`]): it waits for every
//! background task of the driver to end, and once in CI a `mongocoord
//! tasks --list` hung there for good with no connection left open. An exit
//! must never hang; past the bound the process goes on without it.

use std::sync::Arc;
use std::time::Duration;

use mongodb::Client;

use crate::{watch::Hub, MongoStore};

/// How long one client's shutdown may take before [`Clients::close`] goes on
/// without it.
pub const SHUTDOWN_LIMIT: Duration = Duration::from_secs(10);

/// The clients a process made, to shut down together before its runtime
/// ends; meant for a `static`.
///
/// ```
/// use store_mongo::{Clients, MongoStore};
///
/// static CLIENTS: Clients = Clients::new();
///
/// async fn main_body(store: MongoStore) {
///     CLIENTS.keep_store(&store);
///     // ... the process's work, which may leave tasks holding the store ...
///     CLIENTS.close().await;
/// }
/// ```
#[derive(Debug, Default)]
pub struct Clients(parking_lot::Mutex<Kept>);

#[derive(Debug, Default)]
struct Kept {
    clients: Vec<Client>,
    /// The change streams of the stores kept, ended before their clients.
    hubs: Vec<Arc<Hub>>,
}

impl Clients {
    /// No client yet.
    pub const fn new() -> Clients {
        Clients(parking_lot::const_mutex(Kept { clients: Vec::new(), hubs: Vec::new() }))
    }

    /// Keeps `client` (a handle on it: clients are shared) to close later.
    pub fn keep(&self, client: &Client) {
        self.0.lock().clients.push(client.clone());
    }

    /// Keeps the client behind `store`, and the store's change streams, which
    /// [`close`](Self::close) ends quietly before it shuts the client down.
    pub fn keep_store(&self, store: &MongoStore) {
        self.keep(store.database().client());
        self.0.lock().hubs.push(store.hub.clone());
    }

    /// Ends the kept stores' change streams (their watchers' streams end;
    /// no failure is reported), then shuts down every client kept so far, at
    /// once (`immediate`: the process is ending, nothing it still has in
    /// flight is waited for), and forgets them. A shutdown that has not
    /// ended after [`SHUTDOWN_LIMIT`] is given up with a warning.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: the clients are taken first, so those not yet shut
    /// down when the future is dropped are left to be dropped as before.
    pub async fn close(&self) {
        let Kept { clients, hubs } = std::mem::take(&mut *self.0.lock());
        for hub in hubs {
            hub.close();
        }
        for c in clients {
            if tokio::time::timeout(SHUTDOWN_LIMIT, c.shutdown().immediate(true)).await.is_err() {
                tracing::warn!(limit = ?SHUTDOWN_LIMIT, "a MongoDB client's shutdown did not end; going on without it");
            }
        }
    }
}
