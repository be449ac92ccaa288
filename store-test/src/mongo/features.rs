//! What some tests need of the server beyond the store's contract, and how a
//! test that needs what the server lacks says so.
//!
//! A server may lack a feature only by declaration: `MONGODB_LACKS` lists the
//! features the server at `MONGODB_URI` is known to lack (`failpoints`,
//! `idle-cursors`, `unique-key-release`, `streams-past-open-transactions`, comma-separated), and a test that needs one of them then
//! skips with a message naming the servers it runs on. A lack that was not
//! declared fails the test under `CI` (skips otherwise), and a declared lack
//! the server turns out not to have fails it too: neither a missing feature
//! nor a stale declaration passes in silence.

use std::io::Write as _;
use std::sync::OnceLock;

use bson::doc;
use futures::StreamExt as _;

use store_mongo::mongodb;

use crate::Needs;

use super::{db_name, required, server_uri, skip_unless_required, with_option};

/// A feature of the server that some tests need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Feature {
    /// `configureFailPoint` with `failCommand`: `mongod` started with
    /// `--setParameter enableTestCommands=1`, `secantusd-py` started with
    /// `--enable-test-commands`. (The pinned `secantusd-rs` has no such
    /// command.)
    FailPoints,
    /// Open idle cursors (change streams between two `getMore`s) listed per
    /// namespace: `mongod`'s `$currentOp` stage with `idleCursors: true`,
    /// `secantusd-py`'s `currentOp` command. (`secantusd-rs` lists neither.)
    IdleCursors,
    /// A unique index lets go of a key once its document no longer holds it
    /// ([`Needs::UniqueKeyRelease`]): `mongod`, `secantusd-py`.
    /// (`secantusd-rs` keeps the key until the document is deleted.)
    UniqueKeyRelease,
    /// Change streams keep delivering other writes while a transaction is
    /// open: `mongod`, `secantusd-py`. (The pinned `secantusd-rs` holds
    /// back every change stream's events, on every collection, until the
    /// open transaction ends: one a crashed client leaves open stops all
    /// notifications for its lifetime, 60 s by default.)
    StreamsPastOpenTransactions,
}

impl Feature {
    /// Its name in `MONGODB_LACKS`.
    pub fn name(self) -> &'static str {
        match self {
            Feature::FailPoints => "failpoints",
            Feature::IdleCursors => "idle-cursors",
            Feature::UniqueKeyRelease => "unique-key-release",
            Feature::StreamsPastOpenTransactions => "streams-past-open-transactions",
        }
    }

    /// The feature that keeps a part of the contract some servers break.
    pub fn of(need: Needs) -> Feature {
        match need {
            Needs::UniqueKeyRelease => Feature::UniqueKeyRelease,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Feature::FailPoints => "`configureFailPoint` (`failCommand`)",
            Feature::IdleCursors => "idle cursors listed by `currentOp` or the `$currentOp` stage",
            Feature::UniqueKeyRelease => "a unique index that lets go of a key its document no longer holds",
            Feature::StreamsPastOpenTransactions => {
                "change streams that deliver other writes while a transaction is open"
            }
        }
    }

    fn servers(self) -> &'static str {
        match self {
            Feature::FailPoints => {
                "mongod with --setParameter enableTestCommands=1, or secantusd-py with --enable-test-commands \
                 (the default test run's server)"
            }
            Feature::IdleCursors | Feature::UniqueKeyRelease | Feature::StreamsPastOpenTransactions => {
                "mongod, or secantusd-py (the default test run's server)"
            }
        }
    }

    fn cached(self) -> &'static OnceLock<Result<(), String>> {
        static FAIL_POINTS: OnceLock<Result<(), String>> = OnceLock::new();
        static IDLE_CURSORS: OnceLock<Result<(), String>> = OnceLock::new();
        static UNIQUE_KEY_RELEASE: OnceLock<Result<(), String>> = OnceLock::new();
        static STREAMS_PAST_OPEN_TRANSACTIONS: OnceLock<Result<(), String>> = OnceLock::new();
        match self {
            Feature::FailPoints => &FAIL_POINTS,
            Feature::IdleCursors => &IDLE_CURSORS,
            Feature::UniqueKeyRelease => &UNIQUE_KEY_RELEASE,
            Feature::StreamsPastOpenTransactions => &STREAMS_PAST_OPEN_TRANSACTIONS,
        }
    }
}

/// Whether `MONGODB_LACKS` declares that the server lacks `feature`.
fn declared_lacking(feature: Feature) -> bool {
    declares(std::env::var("MONGODB_LACKS").ok().as_deref(), feature)
}

/// Whether a `MONGODB_LACKS` value names `feature`.
fn declares(lacks: Option<&str>, feature: Feature) -> bool {
    lacks.is_some_and(|v| v.split(',').any(|f| f.trim() == feature.name()))
}

/// Whether the test server has `feature`, found out once per process. When it
/// has not, `test` is reported: skipped with a message naming the servers it
/// runs on when `MONGODB_LACKS` declares the lack, else failed under `CI`
/// (skipped otherwise). A server that has a feature `MONGODB_LACKS` declares
/// lacking fails the test. With no server at all, the test is skipped as
/// every Mongo test is (failed under `CI`).
///
/// # Cancel safety
///
/// Cancel-safe: a probe dropped half-way leaves nothing behind but, for
/// [`Feature::IdleCursors`], a probe database the next probe empties again.
pub async fn server_has(test: &str, feature: Feature) -> bool {
    if feature == Feature::FailPoints {
        // The probe turns `failCommand` off: not while another test of this
        // process has it on.
        let _turn = super::FAIL_POINTS.lock().await;
        return has_in_turn(test, feature).await;
    }
    has_in_turn(test, feature).await
}

/// Held while a probe runs.
static PROBING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// As [`server_has`], for a caller that holds the failpoints' turn.
pub(super) async fn has_in_turn(test: &str, feature: Feature) -> bool {
    let found = match feature.cached().get() {
        Some(found) => found.clone(),
        None => {
            // One probe at a time: two at once share the probe's database,
            // and one's drop would fail the other's insert, a lack that is not.
            let _probing = PROBING.lock().await;
            match feature.cached().get() {
                Some(found) => found.clone(),
                None => {
                    let Some(client) = client(test).await else { return false };
                    let found = probe(&client, feature).await;
                    feature.cached().get_or_init(|| found).clone()
                }
            }
        }
    };
    match (found, declared_lacking(feature)) {
        (Ok(()), false) => true,
        (Ok(()), true) => panic!(
            "{test}: MONGODB_LACKS declares that the server lacks {}, yet it has it: remove `{}` from MONGODB_LACKS",
            feature.what(),
            feature.name()
        ),
        (Err(detail), declared) => {
            report_lack(test, feature, &detail, declared, required());
            false
        }
    }
}

fn report_lack(test: &str, feature: Feature, detail: &str, declared: bool, required: bool) {
    let needs = format!(
        "{test} needs {}, which the server at MONGODB_URI lacks ({detail}); it runs on {}",
        feature.what(),
        feature.servers()
    );
    let msg = if declared {
        format!("SKIPPED {needs} (the lack is declared: MONGODB_LACKS names `{}`)", feature.name())
    } else {
        let msg = format!("{needs}. If the lack is known, declare it: MONGODB_LACKS={}", feature.name());
        assert!(!required, "{msg} (CI is set: a Mongo test must not skip)");
        format!("SKIPPED {msg}")
    };
    // Past libtest's capture, as every skip.
    let _ = writeln!(std::io::stderr(), "{msg}");
}

async fn client(test: &str) -> Option<mongodb::Client> {
    let uri = match server_uri() {
        Ok(uri) => uri,
        Err(why) => {
            skip_unless_required(required(), test, &why);
            return None;
        }
    };
    match mongodb::Client::with_uri_str(with_option(&uri, "appName=feature-probe")).await {
        Ok(c) => Some(c),
        Err(e) => {
            skip_unless_required(required(), test, &e.to_string());
            None
        }
    }
}

/// `Ok` when the server has `feature`, else what it answered.
async fn probe(client: &mongodb::Client, feature: Feature) -> Result<(), String> {
    match feature {
        Feature::FailPoints => {
            let off = doc! { "configureFailPoint": "failCommand", "mode": "off" };
            client.database("admin").run_command(off).await.map(drop).map_err(|e| answer(&e))
        }
        Feature::IdleCursors => {
            // An idle find cursor (one document of two read): listed where
            // idle cursors are.
            let db = client.database(&db_name("feature_probe_idle_cursors"));
            let coll = db.collection::<bson::Document>("probe");
            let probe = async {
                db.drop().await?;
                coll.insert_many([doc! { "n": 1 }, doc! { "n": 2 }]).await?;
                let mut cursor = coll.find(doc! {}).batch_size(1).await?;
                let _ = cursor.next().await;
                let listed = open_cursors(client, &format!("{}.probe", db.name())).await;
                drop(cursor);
                Ok::<usize, mongodb::error::Error>(listed)
            };
            let listed = probe.await.map_err(|e| answer(&e));
            let _ = db.drop().await;
            match listed? {
                0 => Err("an open cursor is listed by neither `currentOp` nor `$currentOp`".into()),
                _ => Ok(()),
            }
        }
        Feature::UniqueKeyRelease => {
            // A key removed from its document by an update, then inserted
            // again in another.
            let db = client.database(&db_name("feature_probe_unique_key_release"));
            let coll = db.collection::<bson::Document>("probe");
            let probe = async {
                db.drop().await?;
                let index = mongodb::IndexModel::builder()
                    .keys(doc! { "k": 1 })
                    .options(mongodb::options::IndexOptions::builder().unique(true).sparse(true).build())
                    .build();
                coll.create_index(index).await?;
                coll.insert_one(doc! { "_id": 1, "k": "a" }).await?;
                coll.update_one(doc! { "_id": 1 }, doc! { "$unset": { "k": "" } }).await?;
                coll.insert_one(doc! { "_id": 2, "k": "a" }).await.map(drop)
            };
            let released = probe.await.map_err(|e| answer(&e));
            let _ = db.drop().await;
            released.map_err(|e| format!("a key removed from its document by an update is still taken: {e}"))
        }
        Feature::StreamsPastOpenTransactions => {
            // A write outside a transaction that is left open, watched on
            // another collection: delivered within 5 s?
            let db = client.database(&db_name("feature_probe_streams_past_transactions"));
            let (held, watched) = (db.collection::<bson::Document>("held"), db.collection::<bson::Document>("watched"));
            let mut session = None;
            let probe = async {
                db.drop().await?;
                held.insert_one(doc! { "_id": 0 }).await?;
                watched.insert_one(doc! { "_id": 0 }).await?;
                let mut stream = watched.watch().await?;
                let mut s = client.start_session().await?;
                s.start_transaction().await?;
                held.insert_one(doc! { "_id": 1 }).session(&mut s).await?;
                session = Some(s);
                watched.insert_one(doc! { "_id": 1 }).await?;
                Ok::<_, mongodb::error::Error>(
                    tokio::time::timeout(std::time::Duration::from_secs(5), stream.next()).await.is_ok(),
                )
            };
            let delivered = probe.await.map_err(|e| answer(&e));
            if let Some(mut s) = session {
                let _ = s.abort_transaction().await;
            }
            let _ = db.drop().await;
            match delivered? {
                true => Ok(()),
                false => Err("a write was not delivered within 5 s while another transaction was open".into()),
            }
        }
    }
}

/// What the server answered: its error code, name and message, without the
/// raw reply the driver's `Display` adds.
fn answer(e: &mongodb::error::Error) -> String {
    match &*e.kind {
        mongodb::error::ErrorKind::Command(c) => format!("error {} {}: {}", c.code, c.code_name, c.message),
        _ => e.to_string(),
    }
}

/// How many cursors are open on the namespace `ns` (`db.collection`), as the
/// server reports them. `mongod` lists idle cursors, and a `getMore` in
/// flight with its cursor, through the `$currentOp` stage; SecantusDB's
/// `$currentOp` stage is a stub, and `secantusd-py`'s `currentOp` command
/// lists every open cursor (`type: "idleCursor"`, also while a `getMore`
/// waits on it). The union of both, by cursor id. A server that lists
/// neither (`secantusd-rs`) reports none: see [`Feature::IdleCursors`].
///
/// # Cancel safety
///
/// Cancel-safe: it only reads.
pub async fn open_cursors(client: &mongodb::Client, ns: &str) -> usize {
    let db = client.database("admin");
    let mut reported = Vec::new();
    let stage = doc! {"$currentOp": {"allUsers": true, "idleCursors": true, "idleConnections": false}};
    if let Ok(mut ops) = db.aggregate([stage]).await {
        while let Some(Ok(op)) = ops.next().await {
            reported.push(op);
        }
    }
    if let Ok(command) = db.run_command(doc! {"currentOp": 1, "$all": true}).await {
        if let Ok(ops) = command.get_array("inprog") {
            reported.extend(ops.iter().filter_map(|op| op.as_document().cloned()));
        }
    }
    let cursor_id = |op: &bson::Document| {
        op.get_i64("cursorId").ok().or_else(|| op.get_document("cursor").ok()?.get_i64("cursorId").ok())
    };
    let ids: std::collections::HashSet<i64> =
        reported.iter().filter(|op| op.get_str("ns").ok() == Some(ns)).filter_map(cursor_id).collect();
    ids.len()
}

#[cfg(test)]
mod tests {
    use super::{declares, report_lack, Feature};

    #[test]
    fn a_lack_is_declared_by_name() {
        assert!(declares(Some("failpoints"), Feature::FailPoints));
        assert!(declares(Some("idle-cursors, failpoints"), Feature::FailPoints));
        assert!(!declares(Some("idle-cursors"), Feature::FailPoints));
        assert!(!declares(Some("failpoint"), Feature::FailPoints));
        assert!(!declares(None, Feature::IdleCursors));
    }

    /// An undeclared lack fails a required (CI) test; a declared one, or any
    /// lack outside CI, is a skip with its message.
    #[test]
    fn an_undeclared_lack_fails_under_ci() {
        let report = |declared, required| {
            std::panic::catch_unwind(|| report_lack("t", Feature::FailPoints, "no such command", declared, required))
        };
        assert!(report(false, true).is_err(), "undeclared, under CI");
        assert!(report(true, true).is_ok(), "declared, under CI");
        assert!(report(false, false).is_ok(), "undeclared, outside CI");
    }
}
