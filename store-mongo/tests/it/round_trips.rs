//! Each contract operation used by a lock acquire, renew, release and a task
//! claim is exactly one command to the server, counted with the driver's
//! command monitoring.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::doc;
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use store_mongo::MongoStore;
use store_test::mongo::{db_name, server_uri, skip};
use store_trait::{Claim, Collection, Condition, Key, Mutation, Query, Store, Ttl, Write};

pub(crate) type Seen = Arc<Mutex<Vec<String>>>;
pub(crate) type Concerns = Arc<Mutex<Vec<bson::Document>>>;

pub(crate) async fn monitored(test: &str) -> Option<(MongoStore, Seen, Concerns)> {
    let uri = match server_uri() {
        Ok(u) => u,
        Err(why) => {
            skip(test, &why);
            return None;
        }
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let write_concerns = Arc::new(Mutex::new(Vec::new()));
    let sink_wc = write_concerns.clone();
    let mut opts = ClientOptions::parse(&uri).await.unwrap();
    opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| {
        if let CommandEvent::Started(s) = ev {
            if s.command_name == "findAndModify" {
                let wc = s.command.get_document("writeConcern").cloned().unwrap_or_default();
                sink_wc.lock().unwrap().push(wc);
            }
            sink.lock().unwrap().push(s.command_name);
        }
    }));
    let client = mongodb::Client::with_options(opts).unwrap();
    let db = client.database(&db_name(test));
    db.drop().await.unwrap();
    Some((MongoStore::new(db), seen, write_concerns))
}

pub(crate) fn take(seen: &Mutex<Vec<String>>) -> Vec<String> {
    std::mem::take(&mut *seen.lock().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_claim_operations_are_one_command_each() {
    let Some((s, seen, concerns)) = monitored("round_trips").await else { return };
    let (c, k) = (Collection::new("locks").unwrap(), Key::new("k").unwrap());
    let ttl = Ttl::new(Duration::from_secs(30)).unwrap();
    s.now().await.unwrap(); // connection established
    take(&seen);

    let acquire =
        Write::new(Condition::Free.or(Condition::HeldBy("a".into())), Mutation::new().grant("a", ttl).bump_fence())
            .upsert();
    assert!(s.write(&c, &k, &acquire).await.unwrap().is_applied());
    assert_eq!(take(&seen), ["findAndModify"], "acquire");

    let contended = Write::new(Condition::Free, Mutation::new().grant("b", ttl).bump_fence()).upsert();
    assert!(!s.write(&c, &k, &contended).await.unwrap().is_applied());
    assert_eq!(take(&seen), ["findAndModify"], "a failed acquire also reports the holder in one command");

    let renew = Write::new(Condition::HeldBy("a".into()), Mutation::new().grant("a", ttl));
    assert!(s.write(&c, &k, &renew).await.unwrap().is_applied());
    assert_eq!(take(&seen), ["findAndModify"], "renew");

    let release = Write::new(Condition::OwnedBy("a".into()).and(Condition::FenceIs(1)), Mutation::new().release());
    assert!(s.write(&c, &k, &release).await.unwrap().is_applied());
    assert_eq!(take(&seen), ["findAndModify"], "release");

    let snap = s.get(&c, &k).await.unwrap();
    assert!(snap.record.is_some());
    assert_eq!(take(&seen), ["aggregate"], "get with server time");

    let q = Collection::new("tasks").unwrap();
    s.insert_many(&q, vec![doc! {"_id": "t1", "agent_name": "x", "ready": true}]).await.unwrap();
    assert_eq!(take(&seen), ["insert"], "insert_many");
    let claim = Claim {
        query: Query::eq(doc! {"agent_name": "x", "ready": true}).sort("_id", store_trait::Order::Asc),
        mutation: Mutation::new().grant("w", ttl).bump_fence().set("ready", false),
    };
    assert!(s.claim(&q, &claim).await.unwrap().is_some());
    assert_eq!(take(&seen), ["findAndModify"], "claim");
    // Grants must survive a server crash and a failover: a rolled-back grant would
    // hand out a fence twice (found by the chaos run).
    let concerns = concerns.lock().unwrap().clone();
    assert_eq!(concerns.len(), 5);
    for wc in concerns {
        assert_eq!(wc.get_str("w").ok(), Some("majority"), "{wc}");
        assert_eq!(wc.get_bool("j").ok(), Some(true), "{wc}");
    }
}

/// A list of candidates is one `find`, with a few unreadable documents (another
/// program's, left for good) before its limit too; a head of them longer than
/// that costs one more, asking the server for readable documents alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_of_candidates_is_one_find_past_a_few_unreadable_documents() {
    let Some((s, seen, _)) = monitored("round_trips_find_keys").await else { return };
    let q = Collection::new("tasks").unwrap();
    let task = |id: String, p: i32| doc! {"_id": id, "agent_name": "x", "ready": true, "priority": p};
    let readable: Vec<bson::Document> = (0..20).map(|i| task(format!("t{i:02}"), 0)).collect();
    s.insert_many(&q, readable).await.unwrap();
    let list = Query::eq(doc! {"agent_name": "x", "ready": true})
        .sort("priority", store_trait::Order::Desc)
        .sort("_id", store_trait::Order::Asc)
        .limit(4);
    let keys = |names: &[&str]| names.iter().map(|n| Key::new(*n).unwrap()).collect::<Vec<_>>();
    take(&seen);
    assert_eq!(s.find_keys(&q, &list).await.unwrap(), keys(&["t00", "t01", "t02", "t03"]));
    assert_eq!(take(&seen), ["find"], "a list of readable candidates");
    // Unreadable documents inserted as another program would, at the head.
    let raw = s.database().collection::<bson::Document>("tasks");
    let bad = |i: i32| {
        let mut d = task(format!("bad{i:02}"), 9);
        d.insert("fence", "not a number");
        d
    };
    raw.insert_many((0..3).map(bad).collect::<Vec<_>>()).await.unwrap();
    take(&seen);
    assert_eq!(s.find_keys(&q, &list).await.unwrap(), keys(&["t00", "t01", "t02", "t03"]));
    assert_eq!(take(&seen), ["find"], "a few unreadable documents before the limit");
    raw.insert_many((3..30).map(bad).collect::<Vec<_>>()).await.unwrap();
    take(&seen);
    assert_eq!(s.find_keys(&q, &list).await.unwrap(), keys(&["t00", "t01", "t02", "t03"]));
    assert_eq!(take(&seen), ["find", "find"], "a head of unreadable documents");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_a_typed_error() {
    // Nothing listens on this port: connecting fails fast and is classified.
    let port = store_test::free_port().unwrap();
    let uri = format!("mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=300");
    let err = MongoStore::connect(&uri, "x").await.unwrap_err();
    assert_eq!(err.fault_kind(), Some(store_trait::FaultKind::Unreachable), "{err}");
    let err = MongoStore::connect("not a uri", "x").await.unwrap_err();
    assert!(matches!(err, store_trait::StoreError::InvalidInput { .. }), "{err}");
    let err = MongoStore::connect("mongodb://user:hunter2@127.0.0.1:1/?connectTimeoutMS=abc", "x").await.unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "passwords never appear in errors: {err}");
}
