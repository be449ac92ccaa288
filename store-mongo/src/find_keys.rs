//! The keys of readable documents matching a query, in its order: the
//! candidates a claimer claims by key ([`Store::find_keys`]), and the ids a
//! batch claim reads first ([`Store::claim_many`]).
//!
//! One `find` of the query's own filter, projected to the fields readability
//! depends on, and the check made here, not in the filter: on SecantusDB's
//! Python server the check as an `$expr` ([`compile::readable`]) is evaluated
//! on every document the equality fields select before the sort, and made the
//! read of a window of candidates from a queue of 400 cost 4.3 times as much
//! (157 ms against 36; docs/performance.md, "Findings that shaped the code").
//! Only when that page is full and holds a document a claim would pass over,
//! so that more readable candidates may lie behind the limit, does a second
//! `find` ask the server for readable documents alone: the one filter that
//! cannot be starved by a head of unreadable documents, however many.
//!
//! The claims themselves keep the check in their filter: a write must never
//! touch a document it cannot read back.

use bson::{doc, Bson, Document};
#[cfg(doc)]
use store_trait::Store;
use store_trait::{fields, Collection, Key, Query, Record, StoreResult};

use crate::{compile, MongoStore};

/// The fields [`Record::from_document`] judges readability by; the rest of a
/// document is the caller's data, never refused.
const READ_BY: [&str; 6] =
    [fields::ID, fields::LEASE_OWNER, fields::LEASE_SINCE, fields::LEASE_UNTIL, fields::FENCE, fields::REV];

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
        let projection: Document = READ_BY.iter().map(|f| ((*f).to_owned(), Bson::Int32(1))).collect();
        let page = self.find_docs(coll, query, compile::filter(query), Some(projection), limit).await?;
        let full = limit.is_some_and(|n| i64::try_from(page.len()).is_ok_and(|got| got >= n));
        let mut ids = Vec::with_capacity(page.len());
        let mut passed_over = false;
        for mut d in page {
            let Some(id) = d.get(fields::ID).cloned() else { continue };
            if Record::from_document(coll.as_str(), std::mem::take(&mut d)).is_ok() {
                ids.push(id);
            } else {
                passed_over = true;
            }
        }
        if !(passed_over && full) {
            return Ok(ids);
        }
        let only_id = doc! { fields::ID: 1 };
        let page = self.find_docs(coll, query, compile::claim_filter(query), Some(only_id), limit).await?;
        Ok(page.into_iter().filter_map(|mut d| d.remove(fields::ID)).collect())
    }
}
