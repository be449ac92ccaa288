//! What the server is: its clock (`hello`), its version, and the one-command
//! read of a record together with the server time, in the form that version
//! supports.

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use mongodb::options::ReadConcern;
use store_trait::{fields, Collection, FaultKind, Key, Record, Snapshot, StoreError, StoreResult, StoreTime};

use crate::{map_err, Consistency, MongoStore};

/// The oldest MongoDB release this store supports. The Rust driver itself
/// refuses older servers (at server selection, with an error naming its own
/// minimum); everything the store sends — pipeline updates, `$$NOW`,
/// `$toLong`, change streams — is older than this.
pub const MIN_SERVER_VERSION: &str = "4.4";
/// The wire version of [`MIN_SERVER_VERSION`].
const MIN_WIRE_VERSION: i32 = 9;
/// The first wire version with the `$documents` stage (MongoDB 5.1).
const DOCUMENTS_WIRE_VERSION: i32 = 14;

/// How [`Store::get`](store_trait::Store::get) reads a record and the server
/// time in one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadForm {
    /// A database aggregate: `$documents` makes one row holding `$$NOW`, and
    /// `$lookup` adds the document (MongoDB 5.1 and newer).
    Documents,
    /// A collection aggregate: `$match` on `_id`, then `$facet`, which outputs
    /// exactly one row even when nothing matched (on an empty or missing
    /// collection too), to which `$project` adds `$$NOW` (MongoDB 4.4 and 5.0).
    Facet,
}

impl ReadForm {
    /// The form for a server reporting `max_wire_version` in its `hello`;
    /// a permanent error naming the required version for one too old.
    pub(crate) fn for_wire_version(max_wire_version: i32) -> StoreResult<ReadForm> {
        match max_wire_version {
            v if v >= DOCUMENTS_WIRE_VERSION => Ok(ReadForm::Documents),
            v if v >= MIN_WIRE_VERSION => Ok(ReadForm::Facet),
            v => Err(StoreError::Backend {
                kind: FaultKind::Permanent,
                code: None,
                message: format!(
                    "MongoDB {MIN_SERVER_VERSION} or newer is required (wire version {MIN_WIRE_VERSION}); \
                     the server reports wire version {v}"
                ),
                source: None,
            }),
        }
    }

    fn pipeline(self, coll: &Collection, key: &Key) -> Vec<Document> {
        let id = key.as_bson().clone();
        match self {
            ReadForm::Documents => vec![
                doc! { "$documents": [{ "now": { "$toLong": "$$NOW" } }] },
                doc! { "$lookup": { "from": coll.as_str(), "pipeline": [{ "$match": { fields::ID: id } }], "as": "doc" } },
            ],
            ReadForm::Facet => vec![
                doc! { "$match": { fields::ID: id } },
                doc! { "$facet": { "doc": [{ "$limit": 1 }] } },
                doc! { "$project": { "doc": 1, "now": { "$toLong": "$$NOW" } } },
            ],
        }
    }
}

/// The store time and the `maxWireVersion` of a `hello` reply.
fn parse_hello(reply: &Document) -> StoreResult<(StoreTime, i32)> {
    let now = match reply.get("localTime") {
        Some(Bson::DateTime(d)) => StoreTime::from_millis(d.timestamp_millis()),
        _ => return Err(StoreError::backend(FaultKind::Permanent, "the server's hello reply has no localTime")),
    };
    // A server that does not say is taken as too old, as the driver takes it.
    let wire = match reply.get("maxWireVersion") {
        Some(Bson::Int32(v)) => *v,
        Some(Bson::Int64(v)) => i32::try_from(*v).unwrap_or(i32::MAX),
        _ => 0,
    };
    Ok((now, wire))
}

/// The record and the time of one row of either [`ReadForm`].
fn parse_row(coll: &Collection, rows: Vec<Document>) -> StoreResult<Snapshot> {
    let row = rows
        .into_iter()
        .next()
        .ok_or_else(|| StoreError::backend(FaultKind::Permanent, "the server time read returned no row"))?;
    let now = row.get_i64("now").map_err(|_| StoreError::backend(FaultKind::Permanent, "no server time in reply"))?;
    let record = match row.get_array("doc").ok().and_then(|a| a.first()) {
        Some(Bson::Document(d)) => Some(Record::from_document(coll.as_str(), d.clone())?),
        _ => None,
    };
    Ok(Snapshot { record, now: StoreTime::from_millis(now) })
}

impl MongoStore {
    /// One `hello`: the server's time, and the read form for its version (a
    /// permanent error for a server too old). The first reply decides the
    /// form for the life of the store: an upgrade past 5.1 keeps the older
    /// form, which works there too; a downgrade below 5.1 needs a new store.
    pub(crate) async fn hello_op(&self) -> StoreResult<(StoreTime, ReadForm)> {
        let reply = self.db.run_command(doc! { "hello": 1 }).await.map_err(map_err)?;
        let (now, wire) = parse_hello(&reply)?;
        let form = ReadForm::for_wire_version(wire)?;
        Ok((now, *self.read_form.get_or_init(|| form)))
    }

    pub(crate) async fn get_op(&self, coll: &Collection, key: &Key) -> StoreResult<Snapshot> {
        let form = match self.read_form.get() {
            Some(form) => *form,
            None => self.hello_op().await?.1,
        };
        let pipeline = form.pipeline(coll, key);
        let cursor = match form {
            ReadForm::Documents => {
                let mut agg = self.db.aggregate(pipeline).max_time(self.operation_timeout);
                if self.consistency == Consistency::Majority {
                    agg = agg.read_concern(ReadConcern::majority());
                }
                agg.await
            }
            // The collection's options carry the read concern.
            ReadForm::Facet => self.coll(coll).aggregate(pipeline).max_time(self.operation_timeout).await,
        };
        let rows: Vec<Document> = cursor.map_err(map_err)?.try_collect().await.map_err(map_err)?;
        parse_row(coll, rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wire versions of MongoDB releases, as their `hello` reports them.
    #[test]
    fn the_read_form_follows_the_wire_version() {
        for (release, wire, expect) in [
            ("4.2", 8, None),
            ("4.4", 9, Some(ReadForm::Facet)),
            ("5.0", 13, Some(ReadForm::Facet)),
            ("5.1", 14, Some(ReadForm::Documents)),
            ("6.0", 17, Some(ReadForm::Documents)),
            ("8.0", 25, Some(ReadForm::Documents)),
        ] {
            match (ReadForm::for_wire_version(wire), expect) {
                (Ok(form), Some(expect)) => assert_eq!(form, expect, "MongoDB {release}"),
                (Err(e), None) => {
                    assert_eq!(e.fault_kind(), Some(FaultKind::Permanent), "{e}");
                    assert!(e.to_string().contains("MongoDB 4.4 or newer"), "{e}");
                }
                (got, _) => panic!("MongoDB {release} (wire {wire}): {got:?}"),
            }
        }
        assert!(ReadForm::for_wire_version(0).is_err());
    }

    #[test]
    fn hello_replies() {
        let at = bson::DateTime::from_millis(1_000);
        let (now, wire) = parse_hello(&doc! { "localTime": at, "maxWireVersion": 21 }).unwrap();
        assert_eq!((now, wire), (StoreTime::from_millis(1_000), 21));
        assert_eq!(parse_hello(&doc! { "localTime": at, "maxWireVersion": 17_i64 }).unwrap().1, 17);
        assert_eq!(parse_hello(&doc! { "localTime": at }).unwrap().1, 0, "no version: too old");
        assert!(parse_hello(&doc! { "maxWireVersion": 21 }).is_err());
    }
}
