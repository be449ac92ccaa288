//! Records: a document with the store's lease metadata beside the user's fields.

use bson::{Bson, Document};

use crate::{Key, StoreError, StoreTime};

/// The field names the store reserves at the top level of every document.
///
/// Both backends store a record as one flat document: the user's fields and
/// these. Keeping them top-level keeps task documents field-compatible with the
/// original `mongo_agent` shape and lets indexes cover them.
pub mod fields {
    /// The document id.
    pub const ID: &str = "_id";
    /// The lease holder's identity, or null when free.
    pub const LEASE_OWNER: &str = "lease_owner";
    /// When the current holder first took the lease (epoch ms, store clock).
    pub const LEASE_SINCE: &str = "lease_since";
    /// When the lease lapses (epoch ms as an `i64`, store clock).
    pub const LEASE_UNTIL: &str = "lease_until";
    /// The fencing counter: grows by one on every grant that asks for it, never
    /// shrinks, survives release.
    pub const FENCE: &str = "fence";
    /// Revision: grows by one on every applied write.
    pub const REV: &str = "rev";
    /// The nonce of the last applied write, which lets a backend tell in one round
    /// trip whether its own conditional write was applied: the backend's nonce for
    /// the call, after the caller's nonce and a `/` when the write has one
    /// ([`Write::stamp`](crate::Write::stamp)), so a retry recognises an earlier
    /// attempt ([`Record::last_nonce`](crate::Record::last_nonce)).
    pub const LAST_OP: &str = "last_op";
    /// A BSON date after which the document may be garbage-collected by a TTL
    /// index. Never used for correctness.
    pub const GC_AT: &str = "gc_at";

    /// All reserved names.
    pub const ALL: [&str; 8] = [ID, LEASE_OWNER, LEASE_SINCE, LEASE_UNTIL, FENCE, REV, LAST_OP, GC_AT];

    /// Whether `name` is reserved.
    pub fn is_reserved(name: &str) -> bool {
        ALL.contains(&name)
    }
}

/// The largest `fence` or `rev` a record is read with (9·10¹⁵, as for a
/// double): far beyond any count of writes, and far enough below `i64::MAX`
/// that bumping it never overflows. A document with a larger one is
/// malformed, so a claim passes over it (`backend::semantics::readable`).
pub const MAX_COUNTER: u64 = 9_000_000_000_000_000;

/// A lease on a record: who holds it, since when, until when (store clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The holder's identity.
    pub owner: String,
    /// When this holder took the lease.
    pub since: StoreTime,
    /// When the lease lapses unless renewed.
    pub until: StoreTime,
}

impl Lease {
    /// Whether the lease is still valid at store time `now`.
    pub fn is_live_at(&self, now: StoreTime) -> bool {
        self.until > now
    }
}

/// A document as the store sees it.
///
/// ```
/// use store_trait::{Record, StoreTime};
/// use bson::doc;
///
/// let r = Record::from_document(
///     "locks",
///     doc! { "_id": "a", "lease_owner": "me", "lease_since": 1_i64,
///            "lease_until": 10_i64, "fence": 3_i64, "rev": 4_i64, "color": "red" },
/// ).unwrap();
/// assert_eq!(r.fence(), 3);
/// assert_eq!(r.holder_at(StoreTime::from_millis(5)).unwrap().owner, "me");
/// assert!(r.holder_at(StoreTime::from_millis(10)).is_none());
/// assert_eq!(r.get_str("color"), Some("red"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    key: Key,
    lease: Option<Lease>,
    fence: u64,
    rev: u64,
    last_op: Option<String>,
    data: Document,
}

impl Record {
    /// Reads a stored document. Missing metadata reads as "never written through the
    /// store" (no lease, fence 0, rev 0); metadata of the wrong type is
    /// [`StoreError::Malformed`].
    pub fn from_document(collection: &str, mut doc: Document) -> Result<Record, StoreError> {
        let key = match doc.remove(fields::ID) {
            Some(id) => {
                let shown = render_raw_id(&id);
                Key::from_bson(id).map_err(|e| StoreError::Malformed {
                    collection: collection.to_owned(),
                    key: shown,
                    reason: e.to_string(),
                })?
            }
            None => {
                return Err(StoreError::Malformed {
                    collection: collection.to_owned(),
                    key: "(no _id)".into(),
                    reason: "document has no _id".into(),
                })
            }
        };
        let bad = |field: &str, v: &Bson| {
            StoreError::malformed(collection, &key, format!("field {field} has unexpected value {v}"))
        };
        let int = |doc: &mut Document, field: &str| -> Result<Option<i64>, StoreError> {
            match doc.remove(field) {
                None | Some(Bson::Null) => Ok(None),
                Some(Bson::Int64(v)) => Ok(Some(v)),
                Some(Bson::Int32(v)) => Ok(Some(i64::from(v))),
                Some(Bson::DateTime(d)) => Ok(Some(d.timestamp_millis())),
                Some(Bson::Double(v)) if v.fract() == 0.0 && v.abs() < 9.0e15 => Ok(Some(v as i64)),
                Some(v) => Err(bad(field, &v)),
            }
        };
        let owner = match doc.remove(fields::LEASE_OWNER) {
            None | Some(Bson::Null) => None,
            Some(Bson::String(s)) => Some(s),
            Some(v) => return Err(bad(fields::LEASE_OWNER, &v)),
        };
        let since = int(&mut doc, fields::LEASE_SINCE)?;
        let until = int(&mut doc, fields::LEASE_UNTIL)?;
        let fence = int(&mut doc, fields::FENCE)?.unwrap_or(0);
        let rev = int(&mut doc, fields::REV)?.unwrap_or(0);
        // A foreign or hand-edited value is no nonce of ours: read it as none.
        let last_op = match doc.remove(fields::LAST_OP) {
            Some(Bson::String(s)) => Some(s),
            _ => None,
        };
        doc.remove(fields::GC_AT);
        let lease = match (owner, until) {
            (Some(owner), Some(until)) => Some(Lease {
                owner,
                since: StoreTime::from_millis(since.unwrap_or(until)),
                until: StoreTime::from_millis(until),
            }),
            (Some(_), None) => {
                return Err(StoreError::malformed(collection, &key, "lease_owner is set but lease_until is missing"))
            }
            (None, _) => None,
        };
        // A counter is read up to `MAX_COUNTER`, below which every increment
        // still fits: one a write could not bump (it would overflow into a
        // double on MongoDB) is another program's value, never claimed.
        let to_u64 = |field: &str, v: i64| {
            u64::try_from(v).ok().filter(|&c| c <= MAX_COUNTER).ok_or_else(|| bad(field, &Bson::Int64(v)))
        };
        Ok(Record {
            fence: to_u64(fields::FENCE, fence)?,
            rev: to_u64(fields::REV, rev)?,
            key,
            lease,
            last_op,
            data: doc,
        })
    }

    /// The document id.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The last lease granted, live or lapsed; `None` when free or released.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// The lease if it is still valid at store time `now`.
    pub fn holder_at(&self, now: StoreTime) -> Option<&Lease> {
        self.lease.as_ref().filter(|l| l.is_live_at(now))
    }

    /// Whether `owner` holds a live lease at `now`.
    pub fn is_held_by_at(&self, owner: &str, now: StoreTime) -> bool {
        self.holder_at(now).is_some_and(|l| l.owner == owner)
    }

    /// The fencing counter (0 when never granted).
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The revision (0 when never written through the store).
    pub fn rev(&self) -> u64 {
        self.rev
    }

    /// The nonce of the last write applied to this document, when that write was
    /// given one ([`Write::with_nonce`](crate::Write::with_nonce)): how a retried
    /// write recognises its own earlier application.
    pub fn last_nonce(&self) -> Option<&str> {
        self.last_op.as_deref().and_then(|s| s.rsplit_once('/')).map(|(nonce, _attempt)| nonce)
    }

    /// A user field's value as stored; `None` when the document has no such
    /// field. Reserved fields are not among the user's fields: read them
    /// through [`Record::lease`], [`Record::fence`], [`Record::rev`].
    pub fn get(&self, field: &str) -> Option<&Bson> {
        self.data.get(field)
    }

    /// A user field as an integer: an `Int32`, an `Int64`, or a `Double` that
    /// holds a whole number (MongoDB compares numbers by value across these
    /// types, and other programs write any of them). `None` when the field is
    /// missing, null, or holds anything else.
    ///
    /// ```
    /// # use store_trait::Record;
    /// let r = Record::from_document("c", bson::doc! { "_id": "a", "n": 3_i32, "x": 2.5, "s": "7" }).unwrap();
    /// assert_eq!((r.get_i64("n"), r.get_i64("x"), r.get_i64("s"), r.get_i64("none")), (Some(3), None, None, None));
    /// ```
    pub fn get_i64(&self, field: &str) -> Option<i64> {
        match self.data.get(field)? {
            Bson::Int32(i) => Some(i64::from(*i)),
            Bson::Int64(i) => Some(*i),
            // Below 2^63, so the conversion is exact for every whole number here.
            Bson::Double(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Some(*f as i64),
            _ => None,
        }
    }

    /// A user field as a string; `None` when missing or not a string.
    pub fn get_str(&self, field: &str) -> Option<&str> {
        self.data.get(field).and_then(Bson::as_str)
    }

    /// A user field as a boolean; `None` when missing or not a boolean.
    pub fn get_bool(&self, field: &str) -> Option<bool> {
        self.data.get(field).and_then(Bson::as_bool)
    }

    /// A user field holding a BSON date (as [`Mutation::set_time_after`](crate::Mutation::set_time_after)
    /// writes them), as store time; `None` when missing or not a date.
    pub fn get_time(&self, field: &str) -> Option<StoreTime> {
        self.data.get(field).and_then(Bson::as_datetime).map(|d| StoreTime::from_millis(d.timestamp_millis()))
    }

    /// The user's fields (everything but the reserved ones).
    pub fn data(&self) -> &Document {
        &self.data
    }

    /// Takes the user's fields.
    pub fn into_data(self) -> Document {
        self.data
    }
}

/// The longest rendering of a raw `_id` in an error, in characters.
const RAW_ID_CHARS: usize = 120;

/// A raw `_id` value as an operator can find it again: its relaxed extended JSON
/// (`{"$binary": …}` for a UUID, `"abc"` for a string), truncated to a bounded length.
///
/// ```
/// use store_trait::render_raw_id;
/// assert_eq!(render_raw_id(&bson::Bson::Double(1.5)), "1.5");
/// assert_eq!(render_raw_id(&bson::Bson::String("x".repeat(500))).chars().count(), 121);
/// ```
pub fn render_raw_id(id: &Bson) -> String {
    let full = id.clone().into_relaxed_extjson().to_string();
    match full.char_indices().nth(RAW_ID_CHARS) {
        Some((cut, _)) => format!("{}…", &full[..cut]),
        None => full,
    }
}

/// A record read together with the store's clock, in one round trip.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The record, if the document exists.
    pub record: Option<Record>,
    /// The store's time when it was read.
    pub now: StoreTime,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn parses_foreign_documents() {
        // A task in the original mongo_agent shape: no store metadata at all.
        let r =
            Record::from_document("q", doc! { "_id": bson::oid::ObjectId::new(), "agent_name": "a", "ready": true })
                .unwrap();
        assert_eq!((r.fence(), r.rev()), (0, 0));
        assert!(r.lease().is_none());
        assert_eq!(r.data().len(), 2);
    }

    #[test]
    fn rejects_malformed_metadata() {
        for bad in [
            doc! { "_id": "a", "fence": "x" },
            doc! { "_id": "a", "fence": -1_i64 },
            doc! { "_id": "a", "lease_owner": 5 },
            doc! { "_id": "a", "lease_owner": "me" },
            doc! { "_id": "" },
            doc! { "x": 1 },
        ] {
            let e = Record::from_document("c", bad.clone()).unwrap_err();
            assert!(matches!(e, StoreError::Malformed { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn malformed_ids_are_named() {
        let uuid = bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] };
        let e = Record::from_document("c", doc! { "_id": uuid, "agent_name": "a" }).unwrap_err();
        match e {
            StoreError::Malformed { key, .. } => {
                assert!(key.contains("$binary") && key.contains("BwcHBwcHBwcHBwcHBwcHBw=="), "{key}")
            }
            other => panic!("{other}"),
        }
        let e = Record::from_document("c", doc! { "_id": "t", "fence": "7" }).unwrap_err();
        assert!(e.to_string().contains("document t in c"), "{e}");
    }

    #[test]
    fn typed_getters() {
        let r = Record::from_document(
            "c",
            doc! { "_id": "a", "fence": 2_i64, "i": 1_i32, "l": 2_i64, "d": 3.0, "f": 3.5, "big": 1e19, "s": "x",
            "b": true, "t": bson::DateTime::from_millis(42), "nul": null },
        )
        .unwrap();
        assert_eq!([r.get_i64("i"), r.get_i64("l"), r.get_i64("d")], [Some(1), Some(2), Some(3)]);
        for not_int in ["f", "big", "s", "b", "t", "nul", "missing", "fence"] {
            assert_eq!(r.get_i64(not_int), None, "{not_int}");
        }
        assert_eq!((r.get_str("s"), r.get_str("i")), (Some("x"), None));
        assert_eq!((r.get_bool("b"), r.get_bool("s")), (Some(true), None));
        assert_eq!((r.get_time("t"), r.get_time("l")), (Some(StoreTime::from_millis(42)), None));
        assert_eq!((r.get("nul"), r.get("fence")), (Some(&Bson::Null), None));
    }

    #[test]
    fn accepts_numeric_variants() {
        let r =
            Record::from_document("c", doc! { "_id": "a", "fence": 2_i32, "rev": 3.0, "lease_owner": null }).unwrap();
        assert_eq!((r.fence(), r.rev()), (2, 3));
    }
}
