//! Where to connect: the URI and database from flags or the environment (as
//! the Ruby `mongo_agent` read them), and connection strings shown without
//! their secrets.

use std::fmt;
use std::time::Duration;

use mongodb::error::Error as MongoError;
use mongodb::options::{ClientOptions, ConnectionString};
use store_trait::{StoreError, StoreResult};

use crate::{MongoStore, DEFAULT_CONNECT_TIMEOUT, DEFAULT_OPERATION_TIMEOUT};

/// The database used when none is configured, by the libraries and the
/// `mongocoord` tool alike (the Ruby `mongo_agent` had no default; it required
/// `MONGO_DB`).
pub const DEFAULT_DATABASE: &str = "mongocoord";

/// Connection options whose values are secrets, redacted by [`redact_uri`].
const SECRET_OPTIONS: [&str; 4] =
    ["authmechanismproperties", "tlscertificatekeyfilepassword", "sslpemkeypassword", "password"];

/// A MongoDB URI and a database name. Its `Debug` and `Display` never show a
/// password.
///
/// ```
/// use store_mongo::ConnectionConfig;
///
/// let env = |k: &str| match k {
///     "MONGO_HOST" => Some("db1:27018".to_owned()),
///     "MONGO_DB" => Some("jobs".to_owned()),
///     _ => None,
/// };
/// let c = ConnectionConfig::resolve(None, None, env).unwrap();
/// assert_eq!((c.uri(), c.database()), ("mongodb://db1:27018", "jobs"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionConfig {
    uri: String,
    database: String,
}

impl ConnectionConfig {
    /// A URI and a database, as given.
    pub fn new(uri: impl Into<String>, database: impl Into<String>) -> Self {
        ConnectionConfig { uri: uri.into(), database: database.into() }
    }

    /// Resolves where to connect: `uri` and `database` when given (command-line
    /// flags), else `MONGODB_URI`, else `MONGO_HOST` (any form `mongod`
    /// accepts: `host`, `host:port`, or a URI); the database is `MONGO_DB`, else
    /// [`DEFAULT_DATABASE`]. `env` reads a variable (empty counts as unset).
    pub fn resolve(
        uri: Option<&str>,
        database: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> StoreResult<Self> {
        let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let database =
            database.map(str::to_owned).or_else(|| env("MONGO_DB")).unwrap_or_else(|| DEFAULT_DATABASE.to_owned());
        let uri = match (uri.map(str::to_owned).or_else(|| env("MONGODB_URI")), env("MONGO_HOST")) {
            (Some(uri), _) => uri,
            (None, Some(host)) if host.starts_with("mongodb://") || host.starts_with("mongodb+srv://") => host,
            (None, Some(host)) => format!("mongodb://{host}"),
            (None, None) => {
                return Err(StoreError::invalid(
                    "connection",
                    "no server given: pass a URI, or set MONGODB_URI, or MONGO_HOST (and MONGO_DB)",
                ))
            }
        };
        Ok(ConnectionConfig { uri, database })
    }

    /// [`ConnectionConfig::resolve`] from the process environment alone.
    pub fn from_env() -> StoreResult<Self> {
        Self::resolve(None, None, |k| std::env::var(k).ok())
    }

    /// The URI (with its password: never print it; see [`redact_uri`]).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The database name.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// Connects (one round trip, so a wrong address fails here).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: nothing is written.
    pub async fn connect(&self) -> StoreResult<MongoStore> {
        MongoStore::connect(&self.uri, &self.database).await
    }
}

impl fmt::Debug for ConnectionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionConfig")
            .field("uri", &redact_uri(&self.uri))
            .field("database", &self.database)
            .finish()
    }
}

impl fmt::Display for ConnectionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (database {})", redact_uri(&self.uri), self.database)
    }
}

/// The URI with its password and secret option values replaced by `***`,
/// split the way the driver splits it: the credentials run from the scheme to
/// the **last** `@` before the options, and the password from the first `:` of
/// the credentials (so `u:p@ss@host` hides all of `p@ss`).
///
/// ```
/// use store_mongo::redact_uri;
/// assert_eq!(redact_uri("mongodb://u:p@ss@127.0.0.1:1/"), "mongodb://u:***@127.0.0.1:1/");
/// assert_eq!(
///     redact_uri("mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:abc"),
///     "mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=***"
/// );
/// assert_eq!(redact_uri("mongodb://host:27017"), "mongodb://host:27017");
/// ```
pub fn redact_uri(uri: &str) -> String {
    let Some(scheme_end) = uri.find("://").map(|i| i + 3) else {
        // Not a URI: it may be anything, a password among it.
        return "***".to_owned();
    };
    let (scheme, rest) = uri.split_at(scheme_end);
    let (before_options, options) = match rest.find('?') {
        Some(q) => (&rest[..q], Some(&rest[q + 1..])),
        None => (rest, None),
    };
    let mut out = String::from(scheme);
    match before_options.rfind('@') {
        Some(at) => {
            let (creds, hosts) = before_options.split_at(at);
            match creds.find(':') {
                Some(colon) => {
                    out.push_str(&creds[..colon]);
                    out.push_str(":***");
                }
                None => out.push_str(creds),
            }
            out.push_str(hosts);
        }
        None => out.push_str(before_options),
    }
    if let Some(options) = options {
        out.push('?');
        let redacted: Vec<String> = options
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if SECRET_OPTIONS.contains(&name.to_ascii_lowercase().as_str()) => {
                    format!("{name}=***")
                }
                _ => pair.to_owned(),
            })
            .collect();
        out.push_str(&redacted.join("&"));
    }
    out
}

/// The secrets of a URI, for checking that a message does not quote them.
fn secrets(uri: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let Some(scheme_end) = uri.find("://").map(|i| i + 3) else { return vec![uri] };
    let rest = &uri[scheme_end..];
    let (before_options, options) = rest.split_once('?').map_or((rest, None), |(b, o)| (b, Some(o)));
    if let Some(at) = before_options.rfind('@') {
        if let Some((_, password)) = before_options[..at].split_once(':') {
            out.push(password);
        }
    }
    for pair in options.unwrap_or_default().split('&') {
        if let Some((name, value)) = pair.split_once('=') {
            if SECRET_OPTIONS.contains(&name.to_ascii_lowercase().as_str()) {
                out.push(value);
            }
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// A driver message about `uri`, or a stand-in when the message quotes one of
/// its secrets: never a message with the secret cut out by string replacement
/// (which also mangles the rest of the text).
pub(crate) fn driver_message(message: &str, uri: &str) -> String {
    if secrets(uri).iter().any(|s| message.contains(s)) {
        "the driver's message is withheld because it may quote the credentials".to_owned()
    } else {
        message.to_owned()
    }
}

/// The client options [`MongoStore::connect`] uses for `uri`, and the operation
/// timeout (`socketTimeoutMS`, which the driver rejects, or the default).
pub(crate) async fn client_options(uri: &str) -> StoreResult<(ClientOptions, Duration)> {
    let bad_uri = |e: MongoError| StoreError::InvalidInput {
        what: "MongoDB URI",
        reason: format!("{}: {}", redact_uri(uri), driver_message(&e.to_string(), uri)),
    };
    let mut parsed = ConnectionString::parse(uri).map_err(bad_uri)?;
    #[allow(deprecated)]
    let op_timeout = parsed.socket_timeout.take().filter(|d| !d.is_zero()).unwrap_or(DEFAULT_OPERATION_TIMEOUT);
    let mut opts = ClientOptions::parse(parsed).await.map_err(bad_uri)?;
    if opts.app_name.is_none() {
        opts.app_name = Some("mongocoord".into());
    }
    if opts.server_selection_timeout.is_none() {
        opts.server_selection_timeout = Some(DEFAULT_CONNECT_TIMEOUT);
    }
    if opts.connect_timeout.is_none() {
        opts.connect_timeout = Some(DEFAULT_CONNECT_TIMEOUT);
    }
    Ok((opts, op_timeout))
}

pub(crate) fn check_db_name(db: &str) -> StoreResult<&str> {
    if db.is_empty() || db.len() > 63 || db.contains(['/', '\\', '.', ' ', '"', '$', '\0']) {
        return Err(StoreError::invalid("database name", format!("{db:?} is not a valid MongoDB database name")));
    }
    Ok(db)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_the_way_the_driver_splits() {
        for (uri, shown) in [
            ("mongodb://user:s3cr%40t@host:27017/db", "mongodb://user:***@host:27017/db"),
            ("mongodb://u:p@ss@127.0.0.1:1/", "mongodb://u:***@127.0.0.1:1/"),
            ("mongodb+srv://u:a:b@c@cluster.example/?w=1", "mongodb+srv://u:***@cluster.example/?w=1"),
            ("mongodb://user@host/", "mongodb://user@host/"),
            ("mongodb://host", "mongodb://host"),
            ("mongodb://h/?tlsCertificateKeyFilePassword=pw&w=1", "mongodb://h/?tlsCertificateKeyFilePassword=***&w=1"),
            ("not a uri u:p@h", "***"),
        ] {
            assert_eq!(redact_uri(uri), shown, "{uri}");
        }
    }

    #[test]
    fn driver_messages_are_kept_or_withheld_whole() {
        let uri = "mongodb://u:p@ss@127.0.0.1:1/";
        // The old redaction replaced every "p": "***rovided".
        assert_eq!(driver_message("no password provided", "mongodb://u:xyz@h/"), "no password provided");
        assert!(driver_message("bad credentials u:p@ss", uri).contains("withheld"));
        assert!(!driver_message("connection refused", "mongodb://u:secret@h/").contains("withheld"));
    }

    #[test]
    fn resolution_order() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
        };
        let c = ConnectionConfig::resolve(None, None, vars(&[("MONGO_HOST", "db1:27018"), ("MONGO_DB", "jobs")]));
        assert_eq!(c.unwrap(), ConnectionConfig::new("mongodb://db1:27018", "jobs"));
        let c = ConnectionConfig::resolve(None, None, vars(&[("MONGO_HOST", "mongodb://x")])).unwrap();
        assert_eq!(c.database(), DEFAULT_DATABASE);
        let c = ConnectionConfig::resolve(None, None, vars(&[("MONGODB_URI", "mongodb://u"), ("MONGO_HOST", "h")]));
        assert_eq!(c.unwrap().uri(), "mongodb://u");
        let c = ConnectionConfig::resolve(Some("mongodb://flag"), Some("d"), vars(&[("MONGODB_URI", "mongodb://u")]));
        assert_eq!(c.unwrap(), ConnectionConfig::new("mongodb://flag", "d"));
        assert!(ConnectionConfig::resolve(None, None, vars(&[("MONGO_HOST", " ")])).is_err());
        let shown = format!(
            "{:?} {}",
            ConnectionConfig::new("mongodb://u:pw@h", "d"),
            ConnectionConfig::new("mongodb://u:pw@h", "d")
        );
        assert!(!shown.contains("pw"), "{shown}");
    }

    #[tokio::test]
    async fn timeouts_default_and_keep_uri_values() {
        let (opts, op) = client_options("mongodb://h:1/").await.unwrap();
        assert_eq!(
            (opts.connect_timeout, opts.server_selection_timeout),
            (Some(DEFAULT_CONNECT_TIMEOUT), Some(DEFAULT_CONNECT_TIMEOUT))
        );
        assert_eq!(op, DEFAULT_OPERATION_TIMEOUT);
        let uri = "mongodb://h:1/?connectTimeoutMS=1500&serverSelectionTimeoutMS=2500&socketTimeoutMS=3500";
        let (opts, op) = client_options(uri).await.unwrap();
        assert_eq!(opts.connect_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(opts.server_selection_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(op, Duration::from_millis(3500));
    }

    #[test]
    fn db_names() {
        assert!(check_db_name("coolproj").is_ok());
        for bad in ["", "a.b", "a b", "x".repeat(64).as_str()] {
            assert!(check_db_name(bad).is_err(), "{bad}");
        }
    }
}
