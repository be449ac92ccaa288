//! A batch of conditional writes in one `update` command: one statement per
//! write, each filtered by its document's `_id` and its own condition (so a
//! statement matches exactly when its write applies) and stamping its own
//! nonce into `last_op`. When the server reports as many matches as writes,
//! every write applied; otherwise one `find` reads the documents back and
//! tells each write apart by its stamp: applied, or rejected with the current
//! document. A group commit of fenced outcome writes costs one command.

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use store_trait::{fields, BatchOutcome, Collection, FaultKind, Key, Record, StoreError, StoreResult, Write};

use crate::{compile, filter, in_coll, map_err, MongoStore};

impl MongoStore {
    pub(crate) async fn write_many_op(
        &self,
        coll: &Collection,
        writes: &[(Key, Write)],
    ) -> StoreResult<Vec<BatchOutcome>> {
        for (_, w) in writes {
            w.validate()?;
        }
        // Upserts race on creation and two writes of one document would hide
        // each other's stamp: those batches go write by write.
        let distinct = writes.iter().enumerate().all(|(i, (k, _))| writes[..i].iter().all(|(o, _)| o != k));
        if writes.iter().any(|(_, w)| w.upsert) || !distinct {
            let mut out = Vec::with_capacity(writes.len());
            for (key, write) in writes {
                out.push(self.write_op(coll, key, write).await?.into());
            }
            return Ok(out);
        }
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let stamps: Vec<String> = writes.iter().map(|(_, w)| w.stamp(&self.next_nonce())).collect();
        let updates: Vec<Document> = writes
            .iter()
            .zip(&stamps)
            .map(|((key, w), stamp)| {
                let mut q = doc! { fields::ID: key.as_bson().clone() };
                filter::select(&mut q, &w.condition, None);
                doc! { "q": q, "u": compile::update(compile::Applies::Matched(&w.condition), &w.mutation, stamp), "multi": false, "upsert": false }
            })
            .collect();
        let collection = self.coll(coll);
        let mut command = doc! { "update": coll.as_str(), "updates": updates, "ordered": false };
        if let Some(wc) = collection.write_concern() {
            let wc = bson::serialize_to_document(wc)
                .map_err(|e| StoreError::backend(FaultKind::Permanent, format!("write concern: {e}")))?;
            command.insert("writeConcern", wc);
        }
        let reply = self.db.run_command(command).await.map_err(map_err).map_err(in_coll(coll))?;
        if let Ok(e) = reply.get_document("writeConcernError") {
            // Applied on the primary, not confirmed as asked: in doubt.
            return Err(StoreError::backend(FaultKind::Transient, format!("update_many in {coll}: {e}")));
        }
        if let Ok(errors) = reply.get_array("writeErrors") {
            if let Some(Bson::Document(first)) = errors.first() {
                let message = first.get_str("errmsg").unwrap_or("a write failed");
                return Err(StoreError::backend(FaultKind::Permanent, format!("write_many in {coll}: {message}")));
            }
        }
        let matched = match reply.get("n") {
            Some(Bson::Int32(n)) => usize::try_from(*n).unwrap_or(0),
            Some(Bson::Int64(n)) => usize::try_from(*n).unwrap_or(0),
            _ => 0,
        };
        if matched >= writes.len() {
            return Ok(vec![BatchOutcome::Applied; writes.len()]);
        }
        let ids: Vec<Bson> = writes.iter().map(|(k, _)| k.as_bson().clone()).collect();
        let docs: Vec<Document> = collection
            .find(doc! { fields::ID: { "$in": ids } })
            .max_time(self.operation_timeout)
            .await
            .map_err(map_err)?
            .try_collect()
            .await
            .map_err(map_err)?;
        // Each document with the stamp of the last write applied to it.
        let mut current = Vec::with_capacity(docs.len());
        for d in docs {
            let stamp = d.get_str(fields::LAST_OP).ok().map(str::to_owned);
            current.push((Record::from_document(coll.as_str(), d)?, stamp));
        }
        Ok(writes
            .iter()
            .zip(&stamps)
            .map(|((key, _), stamp)| match current.iter().find(|(r, _)| r.key() == key) {
                Some((_, Some(last))) if last == stamp => BatchOutcome::Applied,
                found => BatchOutcome::Rejected(found.map(|(r, _)| Box::new(r.clone()))),
            })
            .collect())
    }
}
