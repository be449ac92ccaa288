//! The data of a [`MemoryStore`](crate::MemoryStore): its collections, their
//! documents in insertion order, the query selection and unique indexes the
//! backend semantics give them, and change notifications.

use std::collections::HashMap;

use bson::{Bson, Document};
use store_trait::backend::semantics;
use store_trait::{
    ChangeEvent, ChangeKind, Collection, IndexSpec, Key, Order, Query, Record, StoreError, StoreResult, StoreTime,
};
use tokio::sync::broadcast;

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) collections: HashMap<String, Coll>,
    pub(crate) seq: u64,
}

#[derive(Debug)]
pub(crate) struct Coll {
    pub(crate) docs: HashMap<String, Entry>,
    pub(crate) indexes: Vec<IndexSpec>,
    pub(crate) events: broadcast::Sender<ChangeEvent>,
}

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) seq: u64,
    pub(crate) doc: Document,
}

impl Default for Coll {
    fn default() -> Self {
        Coll { docs: HashMap::new(), indexes: Vec::new(), events: broadcast::channel(1024).0 }
    }
}

/// What a change stream would report for an update from `before` to `after`.
pub(crate) fn update_kind(before: &Document, after: &Document) -> ChangeKind {
    let set = after.iter().filter(|(k, v)| before.get(k.as_str()) != Some(*v)).map(|(k, _)| k.as_str());
    let removed = before.keys().filter(|k| !after.contains_key(k.as_str())).map(String::as_str);
    ChangeKind::of_update(set, removed)
}

pub(crate) fn map_key(k: &Key) -> String {
    match k.as_bson() {
        Bson::String(s) => format!("s:{s}"),
        Bson::ObjectId(o) => format!("o:{o}"),
        other => format!("n:{}", semantics::as_i64(other).unwrap_or_default()),
    }
}

pub(crate) fn to_record(coll: &str, doc: &Document) -> StoreResult<Record> {
    Record::from_document(coll, doc.clone())
}

impl State {
    pub(crate) fn coll(&mut self, c: &Collection) -> &mut Coll {
        self.collections.entry(c.as_str().to_owned()).or_default()
    }
}

impl Coll {
    /// Checks unique indexes for `doc` replacing the document at `own` (if any).
    pub(crate) fn check_unique(&self, cname: &str, own: &str, doc: &Document) -> StoreResult<()> {
        for idx in self.indexes.iter().filter(|i| i.unique) {
            let vals: Vec<Option<&Bson>> = idx.keys.iter().map(|(f, _)| doc.get(f)).collect();
            if idx.sparse && vals.iter().all(Option::is_none) {
                continue;
            }
            let clash = self.docs.iter().any(|(k, e)| {
                k != own && {
                    let other: Vec<Option<&Bson>> = idx.keys.iter().map(|(f, _)| e.doc.get(f)).collect();
                    !(idx.sparse && other.iter().all(Option::is_none))
                        && vals
                            .iter()
                            .zip(&other)
                            .all(|(a, b)| semantics::value_eq(a.unwrap_or(&Bson::Null), b.unwrap_or(&Bson::Null)))
                }
            });
            if clash {
                return Err(StoreError::DuplicateKey {
                    collection: cname.to_owned(),
                    key: format!("{} {:?}", idx.name, vals),
                });
            }
        }
        Ok(())
    }

    pub(crate) fn notify(&self, key: &Key, kind: ChangeKind) {
        let _ = self.events.send(ChangeEvent { key: Some(key.clone()), kind });
    }

    pub(crate) fn select(&self, q: &Query, now: StoreTime) -> Vec<&Entry> {
        let mut hits: Vec<&Entry> = self.docs.values().filter(|e| semantics::query_matches(q, &e.doc, now)).collect();
        hits.sort_by(|a, b| {
            for (f, order) in &q.sort {
                let (x, y) = (a.doc.get(f).unwrap_or(&Bson::Null), b.doc.get(f).unwrap_or(&Bson::Null));
                let o = semantics::compare(x, y);
                let o = if *order == Order::Desc { o.reverse() } else { o };
                if o != std::cmp::Ordering::Equal {
                    return o;
                }
            }
            a.seq.cmp(&b.seq)
        });
        if let Some(n) = q.limit {
            hits.truncate(n as usize);
        }
        hits
    }
}
