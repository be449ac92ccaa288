//! The server, as the chaos run's processes reach it while it is killed and
//! restarted: a connection and the server's clock, each retried until the
//! server answers.

use std::time::Duration;

use store_mongo::MongoStore;
use store_trait::Store;

/// A store on `db` at `uri`, once the server answers.
pub(super) async fn connect_retrying(uri: &str, db: &str) -> MongoStore {
    loop {
        match MongoStore::connect(uri, db).await {
            Ok(s) => {
                crate::CLIENTS.keep_store(&s);
                return s;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// The server time, once the server answers.
pub(super) async fn now_retrying(store: &MongoStore) -> i64 {
    loop {
        match store.now().await {
            Ok(t) => return t.as_millis(),
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}
