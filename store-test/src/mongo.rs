//! Finding a real MongoDB server for tests, in this order:
//!
//! 1. `MONGODB_URI`, when set;
//! 2. a testcontainers `mongo` container (a one-node replica set), when a Docker
//!    engine answers;
//! 3. a SecantusDB server started here ([`crate::secantus`]: PyPI
//!    `SecantusDB` at the version pinned for the whole workspace, installed
//!    into a venv under `target/` if missing);
//! 4. otherwise the test is skipped with a message written straight to stderr
//!    (which `cargo test` does not capture) — or, with `CI` set, it fails.
//!
//! Each test gets its own database, named from the test, so tests run in parallel.
//!
//! A test that needs more of the server than the store's contract (failpoints,
//! a listing of open cursors) asks [`server_has`] first; see [`Feature`] for
//! how a server's known lack is declared (`MONGODB_LACKS`) and reported.
#![allow(clippy::print_stderr)]

mod features;

pub use features::{open_cursors, server_has, Feature};

use std::io::Write as _;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use store_trait::StoreResult;

use store_mongo::MongoStore;

use crate::secantus;

/// URI options for test connections: fail fast when no server answers, and poll
/// the server's state so an injected "shutting down" error does not stall the
/// client until the next heartbeat.
pub const TEST_URI_OPTIONS: &str =
    "directConnection=true&serverSelectionTimeoutMS=5000&serverMonitoringMode=poll&heartbeatFrequencyMS=500";

static SERVER: OnceLock<Result<String, String>> = OnceLock::new();

/// Whether a missing server must fail the test (`CI` is set) instead of skipping it.
pub fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// The URI of a test server, finding or starting one on first use.
/// `Err` says why none could be found.
pub fn server_uri() -> Result<String, String> {
    SERVER
        .get_or_init(|| {
            // Discovery may start a blocking container runtime; keep it off any
            // async runtime the caller is on.
            std::thread::spawn(discover).join().unwrap_or_else(|_| Err("server discovery panicked".into()))
        })
        .clone()
}

fn discover() -> Result<String, String> {
    if let Ok(uri) = std::env::var("MONGODB_URI") {
        if !uri.trim().is_empty() {
            return Ok(uri);
        }
    }
    let mut why = Vec::new();
    if docker_available() {
        match docker::start() {
            Ok(uri) => return Ok(uri),
            Err(e) => why.push(format!("testcontainers: {e}")),
        }
    } else {
        why.push("no Docker engine (no /var/run/docker.sock, DOCKER_HOST unset)".to_owned());
    }
    match secantus::start() {
        Ok(port) => Ok(format!("mongodb://127.0.0.1:{port}/?{TEST_URI_OPTIONS}")),
        Err(e) => {
            why.push(format!("SecantusDB: {e}"));
            Err(why.join("; "))
        }
    }
}

fn docker_available() -> bool {
    std::env::var_os("DOCKER_HOST").is_some() || Path::new("/var/run/docker.sock").exists()
}

mod docker {
    use std::sync::OnceLock;
    use testcontainers_modules::mongo::Mongo;
    use testcontainers_modules::testcontainers::runners::SyncRunner;
    use testcontainers_modules::testcontainers::Container;

    // Kept for the life of the test process.
    static CONTAINER: OnceLock<Container<Mongo>> = OnceLock::new();

    pub(super) fn start() -> Result<String, String> {
        let c = Mongo::repl_set().start().map_err(|e| e.to_string())?;
        let host = c.get_host().map_err(|e| e.to_string())?;
        let port = c.get_host_port_ipv4(27017).map_err(|e| e.to_string())?;
        let _ = CONTAINER.set(c);
        Ok(format!("mongodb://{host}:{port}/?{}", super::TEST_URI_OPTIONS))
    }
}

/// A database name for a test: the test's name made safe, at most 63 bytes.
pub fn db_name(test: &str) -> String {
    let clean: String = test.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    let mut h: u32 = 2166136261;
    for b in test.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(16777619);
    }
    let keep = clean.len().min(50);
    format!("t_{}_{h:08x}", &clean[clean.len() - keep..])
}

/// Tells the person running the tests that this test did not run against a
/// server, bypassing libtest's output capture; panics instead under `CI`.
pub fn skip(test: &str, why: &str) {
    skip_unless_required(required(), test, why);
}

fn skip_unless_required(required: bool, test: &str, why: &str) {
    let msg = format!("SKIPPED {test}: no MongoDB server ({why}). Set MONGODB_URI or run `cargo xtask test`.");
    assert!(!required, "{msg} (CI is set: a Mongo test must not skip)");
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// A fresh, empty database for `test` on the test server, or `None` (after
/// [`skip`]) when there is none.
///
/// # Cancel safety
///
/// Dropped half-way, the test's database may be left as it was; the next call
/// empties it again.
pub async fn test_store(test: &str) -> Option<MongoStore> {
    test_store_as(test, "mongocoord").await
}

/// As [`test_store`], connecting with application name `app`, so a
/// `configureFailPoint` with `appName` hits only this test's commands.
///
/// # Cancel safety
///
/// As [`test_store`].
pub async fn test_store_as(test: &str, app: &str) -> Option<MongoStore> {
    test_store_with(test, &format!("appName={app}")).await
}

/// As [`test_store`], with extra URI options (`"maxPoolSize=2"`).
///
/// # Cancel safety
///
/// As [`test_store`].
pub async fn test_store_with(test: &str, options: &str) -> Option<MongoStore> {
    let uri = match server_uri() {
        Ok(uri) => with_option(&uri, options),
        Err(why) => {
            skip(test, &why);
            return None;
        }
    };
    let store = match MongoStore::connect(&uri, &db_name(test)).await {
        Ok(s) => s,
        Err(e) => {
            skip(test, &e.to_string());
            return None;
        }
    };
    if let Err(e) = store.database().drop().await {
        panic!("cannot drop test database {}: {e}", db_name(test));
    }
    Some(store)
}

/// Another client on `test`'s database (not emptied), with application name
/// `app`: a second "process" in a failpoint test. `None` (after [`skip`]) when
/// there is no server.
///
/// # Cancel safety
///
/// Cancel-safe: nothing is written.
pub async fn connect_as(test: &str, app: &str) -> Option<MongoStore> {
    connect_as_to(server_uri(), required(), test, app).await
}

async fn connect_as_to(server: Result<String, String>, required: bool, test: &str, app: &str) -> Option<MongoStore> {
    let uri = match server {
        Ok(uri) => with_option(&uri, &format!("appName={app}")),
        Err(why) => {
            skip_unless_required(required, test, &why);
            return None;
        }
    };
    match MongoStore::connect(&uri, &db_name(test)).await {
        Ok(s) => Some(s),
        Err(e) => {
            skip_unless_required(required, test, &e.to_string());
            None
        }
    }
}

fn with_option(uri: &str, option: &str) -> String {
    let sep = if uri.contains('?') {
        '&'
    } else if uri.matches('/').count() >= 3 {
        '?'
    } else {
        '/'
    };
    let sep = if sep == '/' { "/?".to_owned() } else { sep.to_string() };
    format!("{uri}{sep}{option}")
}

/// A client connected to the test server, for `configureFailPoint` (send
/// those from a separate client). `None` (after [`skip`]) when there is no
/// server, or (after [`server_has`] reported it) when the server lacks
/// [`Feature::FailPoints`].
///
/// The tests of one binary that hold one take turns: `failCommand` is one
/// failpoint for the whole server, so a test configuring it would replace
/// another's (or turn it off) while that one runs. Hold it until the
/// failpoint is off.
///
/// # Cancel safety
///
/// Cancel-safe: nothing is written but, the first time, a `failCommand` turned
/// off (which it is whenever no test holds the turn).
pub async fn admin_client(test: &str) -> Option<AdminClient> {
    let turn = FAIL_POINTS.lock().await;
    let client = admin_client_to(server_uri(), required()).await?;
    if !features::has_in_turn(test, Feature::FailPoints).await {
        return None;
    }
    Some(AdminClient { client, _turn: turn })
}

/// The server-wide failpoints' turn (see [`admin_client`]).
static FAIL_POINTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An admin client held alone among the tests of this process (see
/// [`admin_client`]); it derefs to the driver's client.
#[derive(Debug)]
pub struct AdminClient {
    client: store_mongo::mongodb::Client,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for AdminClient {
    type Target = store_mongo::mongodb::Client;
    fn deref(&self) -> &store_mongo::mongodb::Client {
        &self.client
    }
}

async fn admin_client_to(server: Result<String, String>, required: bool) -> Option<store_mongo::mongodb::Client> {
    let test = "a failpoint test (admin client)";
    let uri = match server {
        Ok(uri) => uri,
        Err(why) => {
            skip_unless_required(required, test, &why);
            return None;
        }
    };
    match store_mongo::mongodb::Client::with_uri_str(&uri).await {
        Ok(c) => Some(c),
        Err(e) => {
            skip_unless_required(required, test, &e.to_string());
            None
        }
    }
}

/// Runs a TTL pass now: SecantusDB's `{"secantusAdmin.pruneTtl": 1}` on the
/// admin database. A server without that command (`mongod`) has no way to force
/// one, so this waits out its TTL monitor (it runs every 60 s).
///
/// # Cancel safety
///
/// Cancel-safe: a TTL pass may or may not have run, and running one again is
/// harmless.
pub async fn prune_ttl() {
    // Not a failpoint: no turn to wait for.
    let Some(admin) = admin_client_to(server_uri(), required()).await else { panic!("the test server went away") };
    if let Err(e) = admin.database("admin").run_command(bson::doc! { "secantusAdmin.pruneTtl": 1 }).await {
        tracing::info!(error = %e, "no pruneTtl command; waiting for the server's TTL monitor");
        tokio::time::sleep(Duration::from_secs(65)).await;
    }
}

/// `store` reading as it would from a server whose `hello` reports
/// `max_wire_version` (9 for MongoDB 4.4, 13 for 5.0, 14 for 5.1): the forms
/// older servers get, tried on the test server. A permanent error for a
/// version older than [`MIN_SERVER_VERSION`](store_mongo::MIN_SERVER_VERSION).
pub fn assuming_wire_version(store: MongoStore, max_wire_version: i32) -> StoreResult<MongoStore> {
    store.assuming_wire_version(max_wire_version)
}

/// The [`Harness`](crate::Harness) of a real server, for the conformance suite
/// and the behaviour suites.
#[derive(Debug, Clone, Copy)]
pub struct MongoHarness {
    wire_version: Option<i32>,
}

impl MongoHarness {
    /// The harness, or `None` (after [`skip`]) when there is no server.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: finding or starting the server runs on its own thread to
    /// the end, and the next call uses the result.
    pub async fn get() -> Option<MongoHarness> {
        match server_uri() {
            Ok(_) => Some(MongoHarness { wire_version: None }),
            Err(why) => {
                skip("conformance suite", &why);
                None
            }
        }
    }

    /// Its stores read as on a server of `max_wire_version`
    /// ([`assuming_wire_version`]).
    #[must_use]
    pub fn assuming_wire_version(self, max_wire_version: i32) -> MongoHarness {
        MongoHarness { wire_version: Some(max_wire_version) }
    }
}

#[async_trait::async_trait]
impl crate::Harness for MongoHarness {
    type Store = MongoStore;

    async fn store(&self, test: &str) -> MongoStore {
        // Its own database per wire version, so the runs of one test do not meet.
        let name = match self.wire_version {
            Some(v) => format!("conf_w{v}_{test}"),
            None => format!("conf_{test}"),
        };
        let store = match test_store(&name).await {
            Some(s) => s,
            None => panic!("the test server went away during {test}"),
        };
        match self.wire_version.map(|v| store.clone().assuming_wire_version(v)) {
            None => store,
            Some(Ok(s)) => s,
            Some(Err(e)) => panic!("{test}: {e}"),
        }
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(600)
    }

    fn change_streams_expected(&self) -> bool {
        // SecantusDB and a testcontainers replica set have them. Set
        // MONGODB_EXPECT_CHANGE_STREAMS=0 when MONGODB_URI is a standalone `mongod`.
        std::env::var("MONGODB_EXPECT_CHANGE_STREAMS").map_or(true, |v| v != "0")
    }

    async fn insert_raw(&self, store: &MongoStore, coll: &store_trait::Collection, doc: bson::Document) {
        if let Err(e) = store.database().collection::<bson::Document>(coll.as_str()).insert_one(doc).await {
            panic!("raw insert into {coll}: {e}");
        }
    }

    async fn prune_ttl(&self, _store: &MongoStore) {
        prune_ttl().await;
    }

    async fn has(&self, test: &str, need: crate::Needs) -> bool {
        server_has(test, Feature::of(need)).await
    }
}

#[cfg(test)]
mod tests {
    use super::{admin_client_to, connect_as_to};

    fn no_server() -> Result<String, String> {
        Err("no server in this test".to_owned())
    }

    /// Every way a test reaches the server skips when there is none, and fails
    /// instead under `CI` (`required`): a failpoint test must not pass silently.
    #[tokio::test]
    async fn no_server_fails_a_required_test_at_every_entry_point() {
        assert!(admin_client_to(no_server(), false).await.is_none());
        assert!(connect_as_to(no_server(), false, "t", "app").await.is_none());
        let admin = tokio::spawn(admin_client_to(no_server(), true)).await;
        assert!(admin.is_err_and(|e| e.is_panic()), "admin_client fails under CI");
        let other = tokio::spawn(connect_as_to(no_server(), true, "t", "app")).await;
        assert!(other.is_err_and(|e| e.is_panic()), "connect_as fails under CI");
        // A URI the driver cannot use is no server either.
        let bad = || Ok("not-a-uri".to_owned());
        assert!(tokio::spawn(admin_client_to(bad(), true)).await.is_err_and(|e| e.is_panic()));
        assert!(tokio::spawn(connect_as_to(bad(), true, "t", "app")).await.is_err_and(|e| e.is_panic()));
    }
}
