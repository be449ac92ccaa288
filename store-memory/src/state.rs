//! The data of a [`MemoryStore`](crate::MemoryStore): its collections, their
//! documents in insertion order, the query selection and unique indexes the
//! backend semantics give them, and change notifications.

use std::collections::HashMap;
use std::sync::Arc;

use bson::{Bson, Document};
use store_trait::backend::{semantics, ChangeDetail};
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
    pub(crate) events: broadcast::Sender<Noted>,
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
/// What an update from `before` to `after` did: the fields it set to a new
/// value (or added), and those it removed, as a change stream reports them.
pub(crate) fn diff(before: &Document, after: &Document) -> ChangeDetail {
    let set = after.iter().filter(|(k, v)| before.get(k.as_str()) != Some(*v)).map(|(k, v)| (k.clone(), v.clone()));
    let removed = before.keys().filter(|k| !after.contains_key(k.as_str())).cloned().collect();
    ChangeDetail::Update { set: set.collect(), removed }
}

/// A change as the collection broadcasts it: the event watchers get, and what
/// the change did, for [`Store::watch_filtered`](store_trait::Store::watch_filtered)'s filter.
pub(crate) type Noted = (ChangeEvent, Arc<ChangeDetail>);

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

    pub(crate) fn notify(&self, key: Option<Key>, detail: ChangeDetail) {
        let kind = match &detail {
            ChangeDetail::Insert => ChangeKind::Insert,
            ChangeDetail::Delete => ChangeKind::Delete,
            ChangeDetail::Update { set, removed } => {
                ChangeKind::of_update(set.keys().map(String::as_str), removed.iter().map(String::as_str))
            }
            _ => ChangeKind::Update,
        };
        let _ = self.events.send((ChangeEvent { key, kind }, Arc::new(detail)));
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
