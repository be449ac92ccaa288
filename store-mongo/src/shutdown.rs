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

use std::sync::Arc;

use mongodb::Client;

use crate::{watch::Hub, MongoStore};

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
    /// flight is waited for), and forgets them.
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
            c.shutdown().immediate(true).await;
        }
    }
}
