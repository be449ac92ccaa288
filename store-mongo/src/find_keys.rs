//! The keys of readable documents matching a query, in its order: the
//! candidates a claimer claims by key ([`Store::find_keys`]), and the ids a
//! batch claim reads first ([`Store::claim_many`]).
//!
//! One `find` of the query's own filter, projected to the fields readability
//! depends on, and the check made here, not in the filter: on SecantusDB's
//! Python server the check as an `$expr` ([`readable`](crate::compile::readable)) is evaluated
//! on every document the equality fields select before the sort, and made the
//! read of a window of candidates from a queue of 400 cost 4.3 times as much
//! (157 ms against 36; docs/performance.md, "Findings that shaped the code").
//! The page holds [`SPARE`] documents more than the limit, so the few
//! unreadable documents a queue may keep for good cost nothing more. Only
//! when more of them than that stand before the limit does a second `find`
//! ask the server for readable documents alone: the one filter that no head
//! of unreadable documents, however long, can starve.
//!
//! The claims themselves keep the check in their filter: a write must never
//! touch a document it cannot read back.

use bson::{doc, Bson, Document};
#[cfg(doc)]
use store_trait::Store;
use store_trait::{fields, Collection, Key, Query, Record, StoreResult};

use crate::{filter, MongoStore};

/// The fields [`Record::from_document`] judges readability by; the rest of a
/// document is the caller's data, never refused.
const READ_BY: [&str; 6] =
    [fields::ID, fields::LEASE_OWNER, fields::LEASE_SINCE, fields::LEASE_UNTIL, fields::FENCE, fields::REV];

/// Documents read past the limit, so that a few unreadable ones (another
/// program's, left in the queue for good, where they drift to the head as it
/// drains) cost no second read.
const SPARE: i64 = 8;

impl MongoStore {
    pub(crate) async fn find_keys_op(&self, coll: &Collection, query: &Query) -> StoreResult<Vec<Key>> {
        let ids = self.readable_ids(coll, query, query.limit.map(i64::from)).await?;
        Ok(ids.into_iter().filter_map(|id| Key::from_bson(id).ok()).collect())
    }

    /// The `_id`s of the first `limit` readable documents matching `query`
    /// (all of them without a limit), in its order.
    pub(crate) async fn readable_ids(
        &self,
        coll: &Collection,
        query: &Query,
        limit: Option<i64>,
    ) -> StoreResult<Vec<Bson>> {
        query.validate()?;
        if limit == Some(0) {
            return Ok(Vec::new());
        }
        let projection: Document = READ_BY.iter().map(|f| ((*f).to_owned(), Bson::Int32(1))).collect();
        let page_limit = limit.map(|n| n.saturating_add(SPARE));
        let page = self.find_docs(coll, query, filter::query(query), Some(projection), page_limit).await?;
        let whole = page_limit.is_none_or(|n| i64::try_from(page.len()).is_ok_and(|got| got < n));
        let mut ids: Vec<Bson> = page
            .into_iter()
            .filter_map(|d| {
                let id = d.get(fields::ID).cloned()?;
                Record::from_document(coll.as_str(), d).is_ok().then_some(id)
            })
            .collect();
        let wanted = limit.map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        if whole || ids.len() >= wanted {
            ids.truncate(wanted);
            return Ok(ids);
        }
        let only_id = doc! { fields::ID: 1 };
        let page = self.find_docs(coll, query, filter::claim(query), Some(only_id), limit).await?;
        Ok(page.into_iter().filter_map(|mut d| d.remove(fields::ID)).collect())
    }
}
