//! The batch claim ([`Store::claim_many`](store_trait::Store::claim_many)):
//! one atomic operation on the memory store.

use store_trait::backend::semantics;
use store_trait::{Claim, Collection, Query, Record, StoreResult};

use crate::{map_key, to_record, Entry, MemoryStore};

impl MemoryStore {
    /// One atomic operation here: the batch cannot be torn. A fault injected
    /// after apply stands for a batch whose caller never learned what it got.
    pub(crate) async fn claim_many_op(
        &self,
        coll: &Collection,
        claim: &Claim,
        limit: usize,
    ) -> StoreResult<Vec<Record>> {
        claim.validate_batch()?;
        let nonce = self.next_nonce();
        self.op(|state, now| {
            let c = state.coll(coll);
            let q = Query { limit: None, ..claim.query.clone() };
            let found: Vec<Entry> =
                c.select(&q, now).into_iter().filter(|e| semantics::readable(&e.doc)).take(limit).cloned().collect();
            let mut out = Vec::with_capacity(found.len());
            for entry in found {
                let key = to_record(coll.as_str(), &entry.doc)?.key().clone();
                let doc = semantics::apply(Some(&entry.doc), &key, &claim.mutation, now, &nonce)?;
                let mk = map_key(&key);
                c.check_unique(coll.as_str(), &mk, &doc)?;
                out.push(to_record(coll.as_str(), &doc)?);
                let detail = crate::state::diff(&entry.doc, &doc);
                c.docs.insert(mk, Entry { seq: entry.seq, doc });
                c.notify(Some(key), detail);
            }
            Ok(out)
        })
        .await
    }
}
