//! Reaching the server: where to connect (the flags, else the
//! environment), the connection itself, and the clients' shutdown before
//! the runtime's.

use store_mongo::{ConnectionConfig, MongoStore};

use crate::error::CliError;

/// Where to connect: the flags, else the environment (`MONGODB_URI`, else
/// `MONGO_HOST`; `MONGO_DB`), by the one set of rules in `store_mongo`.
pub(crate) fn resolve_connection(uri: Option<&str>, db: Option<&str>) -> Result<ConnectionConfig, CliError> {
    Ok(ConnectionConfig::resolve(uri, db, |k| std::env::var(k).ok())?)
}

/// The store the flags and the environment name, reached: an unreachable
/// server is [`CliError::Connect`] (status 2), its URI shown without secrets.
pub(crate) async fn connect(uri: Option<&str>, db: Option<&str>) -> Result<MongoStore, CliError> {
    connect_to(&resolve_connection(uri, db)?).await
}

/// [`connect`] to a connection already resolved.
pub(crate) async fn connect_to(c: &ConnectionConfig) -> Result<MongoStore, CliError> {
    let store = c.connect().await.map_err(|source| CliError::Connect { target: c.to_string(), source })?;
    CLIENTS.lock().push(store.database().client().clone());
    Ok(store)
}

/// The clients this run connected, shut down before the runtime is
/// ([`close_clients`]). Dropped with the runtime instead, a client's pool
/// may still be ending its sessions as the runtime's tasks go, which the
/// driver reports as a panic on stderr.
static CLIENTS: parking_lot::Mutex<Vec<store_mongo::mongodb::Client>> = parking_lot::const_mutex(Vec::new());

/// Shuts down every client [`connect_to`] made, at once: nothing of this
/// run's is left to wait for.
pub(crate) async fn close_clients() {
    let clients = std::mem::take(&mut *CLIENTS.lock());
    for c in clients {
        c.shutdown().immediate(true).await;
    }
}
