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

/// Words that make a connection option's value a secret, matched
/// case-insensitively anywhere in its name: `proxyPassword`,
/// `tlsCertificateKeyFilePassword`, `authMechanismProperties` (which may hold
/// `AWS_SESSION_TOKEN`), and any option a later driver adds along those lines.
const SECRET_WORDS: [&str; 7] =
    ["password", "secret", "token", "key", "credential", "sessiontoken", "authmechanismproperties"];

fn is_secret_option(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| name.contains(w))
}

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

/// The URI with its password and secret option values replaced by `***`.
///
/// A URI the driver parses is split the way the driver splits it: the
/// credentials run from the scheme to the **last** `@` before the options, the
/// password from the first `:` of the credentials; the value of every option
/// whose name contains `password`, `secret`, `token`, `key` or `credential`
/// (or is `authMechanismProperties`) is hidden. A URI the driver cannot parse
/// may be split anywhere (a `?` or `@` in a password), so only its scheme and
/// hosts are shown, the hosts only when they look like hosts: the credentials
/// and everything after the hosts become `***`.
///
/// ```
/// use store_mongo::redact_uri;
/// assert_eq!(redact_uri("mongodb://u:p%40ss@127.0.0.1:1/"), "mongodb://u:***@127.0.0.1:1/");
/// assert_eq!(
///     redact_uri("mongodb://h/?tls=true&tlsCertificateKeyFile=/etc/k.pem&w=1"),
///     "mongodb://h/?tls=true&tlsCertificateKeyFile=***&w=1"
/// );
/// // Unparsable: an unescaped `?` in the password.
/// assert_eq!(redact_uri("mongodb://u:pa?ss@h:1/"), "mongodb://***@h:1/***");
/// assert_eq!(redact_uri("mongodb://host:27017"), "mongodb://host:27017");
/// ```
pub fn redact_uri(uri: &str) -> String {
    Split::of(uri).shown
}

/// A URI as it may be shown, and what no message about it may quote.
struct Split {
    shown: String,
    /// Text a message may not contain.
    secrets: Vec<String>,
    /// Text a message may not contain as a whole word (between characters
    /// that are not letters or digits).
    words: Vec<String>,
}

impl Split {
    fn of(uri: &str) -> Split {
        let Some((scheme, rest)) = uri.split_once("://") else {
            // Not a URI: it may be anything, a password among it.
            return Split { shown: "***".to_owned(), secrets: with_decoded(vec![uri.to_owned()]), words: Vec::new() };
        };
        if ConnectionString::parse(uri).is_err() {
            return Split::unparsable(scheme, rest);
        }
        let mut shown = format!("{scheme}://");
        let mut secrets = Vec::new();
        let (before_options, options) = rest.split_once('?').map_or((rest, None), |(b, o)| (b, Some(o)));
        match before_options.rsplit_once('@') {
            Some((creds, hosts)) => {
                match creds.split_once(':') {
                    Some((user, password)) => {
                        shown.push_str(user);
                        shown.push_str(":***");
                        secrets.push(password.to_owned());
                    }
                    None => shown.push_str(creds),
                }
                shown.push('@');
                shown.push_str(hosts);
            }
            None => shown.push_str(before_options),
        }
        if let Some(options) = options {
            let redacted: Vec<String> = options
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, value)) if is_secret_option(name) => {
                        secrets.push(value.to_owned());
                        format!("{name}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            shown.push('?');
            shown.push_str(&redacted.join("&"));
        }
        Split { shown, secrets: with_decoded(secrets), words: Vec::new() }
    }

    /// `scheme://***@hosts/***`: the credentials, when there is an `@`, run to
    /// the last one; the hosts are shown only when each is `name[:port]` or
    /// `[address][:port]`; whatever follows them is hidden. A message may
    /// quote none of what is hidden: no three characters of the URI in a row
    /// that touch it, and no piece of it between delimiters as a word.
    fn unparsable(scheme: &str, rest: &str) -> Split {
        let creds_end = rest.rfind('@');
        let hosts_start = creds_end.map_or(0, |at| at + 1);
        let hosts_end = rest[hosts_start..].find(['/', '?']).map_or(rest.len(), |i| hosts_start + i);
        let hosts = &rest[hosts_start..hosts_end];
        let hosts_ok = !hosts.is_empty() && hosts.split(',').all(looks_like_host);
        let mut shown = format!("{scheme}://");
        let mut hidden = Vec::new();
        if let Some(at) = creds_end {
            shown.push_str("***@");
            hidden.push(0..at);
        }
        if hosts_ok {
            shown.push_str(hosts);
        } else {
            shown.push_str("***");
            hidden.push(hosts_start..hosts_end);
        }
        if hosts_end < rest.len() {
            shown.push_str("/***");
            hidden.push(hosts_end..rest.len());
        }
        let starts: Vec<usize> = rest.char_indices().map(|(i, _)| i).chain([rest.len()]).collect();
        let windows = starts.windows(4).map(|w| w[0]..w[3]);
        let touching = windows.filter(|w| hidden.iter().any(|h| w.start < h.end && h.start < w.end));
        let secrets = touching.map(|w| rest[w].to_owned()).collect();
        let pieces = hidden.iter().flat_map(|h| rest[h.clone()].split([':', '/', '?', '@', '&', '=', ',', ';']));
        Split { shown, secrets: with_decoded(secrets), words: with_decoded(pieces.map(str::to_owned).collect()) }
    }

    /// Whether `message` quotes something this URI's shown form hides.
    fn quoted_in(&self, message: &str) -> bool {
        let word_at = |w: &str| {
            message.match_indices(w).any(|(i, _)| {
                let before = message[..i].chars().next_back();
                let after = message[i + w.len()..].chars().next();
                !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
            })
        };
        self.secrets.iter().any(|s| message.contains(s.as_str())) || self.words.iter().any(|w| word_at(w))
    }
}

/// `host`, `host:port` or `[address]:port`, in the characters a host name or
/// address has.
fn looks_like_host(h: &str) -> bool {
    let (name, port) = match h.strip_prefix('[') {
        Some(bracketed) => match bracketed.split_once(']') {
            Some((address, rest)) => (address, rest.strip_prefix(':')),
            None => return false,
        },
        None => h.rsplit_once(':').map_or((h, None), |(n, p)| (n, Some(p))),
    };
    let name_ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || ".-_:%".contains(c));
    name_ok && port.is_none_or(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// The secrets as written and percent-decoded (the driver quotes decoded
/// values), without empty ones.
fn with_decoded(secrets: Vec<String>) -> Vec<String> {
    let mut out = Vec::new();
    for s in secrets {
        let decoded = percent_decoded(&s);
        if decoded != s {
            out.push(decoded);
        }
        out.push(s);
    }
    out.retain(|s| !s.is_empty());
    out
}

/// `s` with each `%XX` decoded (invalid UTF-8 replaced), as the driver
/// decodes passwords and option values.
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A driver message about `uri`, or a stand-in when the message quotes one of
/// its secrets: never a message with the secret cut out by string replacement
/// (which also mangles the rest of the text).
pub(crate) fn driver_message(message: &str, uri: &str) -> String {
    if Split::of(uri).quoted_in(message) {
        "the driver's message is withheld because it may quote the credentials".to_owned()
    } else {
        message.to_owned()
    }
}

/// `e`, from connecting to `uri`, with a driver message that quotes a secret
/// of `uri` withheld (its source, which would show it again, dropped).
pub(crate) fn redact_error(e: StoreError, uri: &str) -> StoreError {
    match e {
        StoreError::Backend { kind, code, message, source } => {
            let shown = driver_message(&message, uri);
            let source = if shown == message { source } else { None };
            StoreError::Backend { kind, code, message: shown, source }
        }
        other => other,
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
    let operation_timeout = parsed.socket_timeout.take().filter(|d| !d.is_zero()).unwrap_or(DEFAULT_OPERATION_TIMEOUT);
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
    Ok((opts, operation_timeout))
}

pub(crate) fn check_db_name(db: &str) -> StoreResult<&str> {
    if db.is_empty() || db.len() > 63 || db.contains(['/', '\\', '.', ' ', '"', '$', '\0']) {
        return Err(StoreError::invalid("database name", format!("{db:?} is not a valid MongoDB database name")));
    }
    Ok(db)
}

#[cfg(test)]
mod tests {
    use store_trait::FaultKind;

    use super::*;

    #[test]
    fn passwords_are_hidden_the_way_the_driver_splits() {
        for (uri, shown) in [
            ("mongodb://user:s3cr%40t@host:27017/db", "mongodb://user:***@host:27017/db"),
            ("mongodb://u:p%40ss@127.0.0.1:1/", "mongodb://u:***@127.0.0.1:1/"),
            ("mongodb://u:a%3Ab@h1:1,h2:2/db?w=1", "mongodb://u:***@h1:1,h2:2/db?w=1"),
            ("mongodb://user@host/", "mongodb://user@host/"),
            ("mongodb://host", "mongodb://host"),
            // Refused by this driver build (rustls), so shown as unparsable.
            ("mongodb://h/?tlsCertificateKeyFilePassword=pw&w=1", "mongodb://h/***"),
            ("not a uri u:p@h", "***"),
            // Options whose names say secret, in any case; the driver refuses
            // options it does not know (this build, the proxy ones too).
            ("mongodb://h/?TLS=true&tlsCertificateKeyFile=/k.pem", "mongodb://h/?TLS=true&tlsCertificateKeyFile=***"),
            ("mongodb://h/?someApiToken=t1&w=1", "mongodb://h/***"),
            ("mongodb://h/?proxyHost=p&proxyUsername=u&proxyPassword=hunter2", "mongodb://h/***"),
            // URIs the driver cannot parse: scheme and hosts only.
            ("mongodb://u:p@ss@127.0.0.1:1/", "mongodb://***@127.0.0.1:1/***"),
            ("mongodb+srv://u:a:b@c@cluster.example/?w=1", "mongodb+srv://***@cluster.example/***"),
            ("mongodb://u:pa?ss@h:1/", "mongodb://***@h:1/***"),
            ("mongodb://u:pa?ss@h:1", "mongodb://***@h:1"),
            ("mongodb://u:p%3Fss@127.0.0.1:1/?proxyPassword=hunter2", "mongodb://***@127.0.0.1:1/***"),
            ("mongodb://u:secret/", "mongodb://***/***"),
            ("mongodb://h:1/?w", "mongodb://h:1/***"),
            ("mongodb://[::1]:27017,h2/?tlsInsecure=yes", "mongodb://[::1]:27017,h2/***"),
            ("http://u:p@h/", "http://***@h/***"),
        ] {
            assert_eq!(redact_uri(uri), shown, "{uri}");
        }
    }

    #[test]
    fn secret_options_are_named_so() {
        for name in [
            "password",
            "proxyPassword",
            "tlsCertificateKeyFilePassword",
            "sslPEMKeyPassword",
            "authMechanismProperties",
            "AWS_SESSION_TOKEN",
            "clientSecret",
            "apiKey",
            "credentials",
        ] {
            assert!(is_secret_option(name), "{name}");
        }
        for name in ["w", "appName", "proxyHost", "serverSelectionTimeoutMS", "authSource"] {
            assert!(!is_secret_option(name), "{name}");
        }
    }

    /// A message from parsing a URI that quotes any piece of what its shown
    /// form hides is withheld, decoded or not.
    #[tokio::test]
    async fn messages_about_a_uri_never_quote_its_secrets() {
        for (uri, secret) in [
            ("mongodb://u:pa?ss@h:1/", "ss@"),
            ("mongodb://u:pa?ss@h:1/", "?ss"),
            ("mongodb://u:p%3Fss@127.0.0.1:1/?proxyPassword=hunter2&serverSelectionTimeoutMS=200", "hunter2"),
            ("mongodb://u:p%3Fss@127.0.0.1:1/?proxyPassword=hunter2&serverSelectionTimeoutMS=200", "p?ss"),
            ("mongodb://u:p@ss@127.0.0.1:1/", "p@ss"),
            ("mongodb://u:hunter2/", "hunter2"),
            ("mongodb://h/?w=hunter2&w=1", "hunter2"),
            ("mongodb://h/?proxyHost=p&proxyUsername=u&proxyPassword=hunter2&proxyPort=x", "hunter2"),
        ] {
            let Err(e) = client_options(uri).await else { panic!("{uri} parses") };
            let text = e.to_string();
            assert!(!text.contains(secret), "{uri}: {text}");
            let redacted = redact_error(StoreError::backend(FaultKind::Permanent, format!("at {uri}")), uri);
            assert!(!redacted.to_string().contains(secret), "{uri}: {redacted}");
        }
        // A message that quotes nothing hidden is kept whole.
        let e = client_options("mongodb://u:p@h:1/?w=1&w=2").await.unwrap_err().to_string();
        assert!(e.contains("repeated options"), "{e}");
        assert_eq!(percent_decoded("p%3Fss%zz%4"), "p?ss%zz%4");
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
