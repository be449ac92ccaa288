//! Reaching the server: where to connect (the flags, else the
//! environment), the connection itself, and the clients' shutdown before
//! the runtime's.

use store_mongo::{ConnectionConfig, MongoStore};

use crate::error::CliError;

/// The URI the flags give: `--uri`, with a warning when it carries a secret
/// (every user of the host can read a command line), or `--uri-file`'s first
/// line.
pub(crate) fn uri_from_flags(uri: Option<String>, file: Option<&std::path::Path>) -> Result<Option<String>, CliError> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::io(format!("cannot read --uri-file {}", path.display()), e))?;
        let line = text.lines().next().unwrap_or_default().trim().to_owned();
        if line.is_empty() {
            return Err(CliError::invalid(format!("--uri-file {} holds no URI", path.display())));
        }
        return Ok(Some(line));
    }
    if let Some(u) = &uri {
        if store_mongo::redact_uri(u) != *u {
            eprintln!(
                "mongocoord: warning: --uri carries a password or secret option, which every user of this host can read in /proc; use $MONGODB_URI or --uri-file"
            );
        }
    }
    Ok(uri)
}

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
    CLIENTS.keep_store(&store);
    Ok(store)
}

/// The clients this run connected, shut down before the runtime is
/// ([`close_clients`], see [`store_mongo::Clients`]).
static CLIENTS: store_mongo::Clients = store_mongo::Clients::new();

/// Shuts down every client [`connect_to`] made, at once: nothing of this
/// run's is left to wait for.
pub(crate) async fn close_clients() {
    CLIENTS.close().await;
}
