//! A batch claim in few commands: one `find` of the ids of readable candidates
//! (the claim's filter, sort, and [`WINDOW`] times the limit, served by the
//! claim's index, as `Store::find_keys` reads them; none when the claim names
//! no more keys than the limit, [`Query::keys`]: those are the candidates),
//! one conditional `update` of the first `limit` of them (the claim's filter
//! again, so a candidate another caller took in between is passed over; each
//! document's own fence bumped by the pipeline; the call's nonce stamped into
//! `last_op`), and one `find` of the documents carrying that nonce: those, and
//! only those, this call claimed.
//!
//! Concurrent callers read the same head of the queue. A caller whose update
//! changed fewer documents than it wants lost them to another caller; it goes
//! on with the next candidates of its list (one more `update` each time, no
//! second read of candidates) until it has `limit` or the list is spent. So a
//! batch comes back short only when the queue holds fewer claimable documents,
//! not because another caller was a moment faster (which sent the loser, before,
//! into an idle wait and a new attempt: an empty batch cost two commands and
//! its follow-ups several more).

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
#[cfg(doc)]
use store_trait::Query;
use store_trait::{fields, Claim, Collection, Record, StoreResult};

use crate::{compile, filter, in_coll, map_err, MongoStore};

/// Candidate ids read per document wanted: the room a batch has to go on past
/// candidates other callers took first. Four racing callers each find a full
/// batch among the first four batches' worth.
pub(crate) const WINDOW: usize = 4;

impl MongoStore {
    pub(crate) async fn claim_many_op(
        &self,
        coll: &Collection,
        claim: &Claim,
        limit: usize,
    ) -> StoreResult<Vec<Record>> {
        claim.validate_batch()?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let collection = self.coll(coll);
        let claimable = filter::claim(&claim.query);
        let sort = filter::sort(&claim.query);
        let ids: Vec<Bson> = match &claim.query.keys {
            // The caller named its candidates (a claim by key from its list):
            // no read of candidates; the update's filter passes over those
            // another caller took.
            Some(keys) if keys.len() <= limit => keys.iter().map(|k| k.as_bson().clone()).collect(),
            _ => {
                let window = i64::try_from(limit.saturating_mul(WINDOW)).unwrap_or(i64::MAX);
                self.readable_ids(coll, &claim.query, Some(window)).await?
            }
        };
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // From here on a failure may leave documents stamped for a caller who
        // never learns it: they lapse at the lease's end (see `Store::claim_many`).
        let nonce = self.next_nonce();
        let update = compile::update(compile::Applies::Matched(&claim.query.condition), &claim.mutation, &nonce);
        let (mut got, mut tried) = (0_usize, 0_usize);
        while got < limit && tried < ids.len() {
            let next = &ids[tried..ids.len().min(tried.saturating_add(limit - got))];
            tried += next.len();
            let candidates = doc! { "$and": [ { fields::ID: { "$in": next } }, claimable.clone() ] };
            let changed =
                collection.update_many(candidates, update.clone()).await.map_err(map_err).map_err(in_coll(coll))?;
            got += usize::try_from(changed.modified_count).unwrap_or(usize::MAX);
        }
        if got == 0 {
            return Ok(Vec::new());
        }
        let ids = &ids[..tried];
        let mut read = collection
            .find(doc! { fields::ID: { "$in": ids }, fields::LAST_OP: &nonce })
            .max_time(self.operation_timeout);
        if let Some(s) = sort {
            read = read.sort(s);
        }
        let docs: Vec<Document> = read.await.map_err(map_err)?.try_collect().await.map_err(map_err)?;
        docs.into_iter().map(|d| Record::from_document(coll.as_str(), d)).collect()
    }
}
