//! One conditional write: one `findAndModify` on the document's `_id`, its
//! condition and mutation compiled into one update pipeline that stamps the
//! call's nonce into `last_op` when it applies, so the document it returns
//! says whether this call applied; tried again only when an upsert lost a
//! creation race.

use bson::doc;
use mongodb::options::ReturnDocument;
use store_trait::{
    fields, Collection, Condition, FaultKind, Key, Record, StoreError, StoreResult, Write, WriteOutcome,
};

use crate::{compile, in_coll, map_err, MongoStore};

impl MongoStore {
    pub(crate) async fn write_op(&self, coll: &Collection, key: &Key, write: &Write) -> StoreResult<WriteOutcome> {
        write.validate()?;
        let nonce = write.stamp(&self.next_nonce());
        // An upsert that came back empty may yet have been applied (some
        // servers answer a creation race so): the attempts after it apply
        // only where this call's stamp is not the last write, and one that
        // finds it there reads as applied, never applies twice (an
        // unconditional `$inc` would count two).
        if let Some(outcome) = self.write_once(coll, key, write, &nonce).await.map_err(in_coll(coll))? {
            return Ok(outcome);
        }
        let not_yet = Condition::FieldEq(fields::LAST_OP.into(), nonce.clone().into()).negate();
        let again = Write { condition: write.condition.clone().and(not_yet), ..write.clone() };
        for _ in 1..4 {
            if let Some(outcome) = self.write_once(coll, key, &again, &nonce).await.map_err(in_coll(coll))? {
                return Ok(outcome);
            }
        }
        // Still racing after four attempts: the document is being created and
        // deleted concurrently. Report it as a transient conflict.
        Err(StoreError::backend(FaultKind::Transient, format!("upsert of {key} in {coll} kept racing; try again")))
    }

    /// One `findAndModify`. `Ok(None)` means "lost a creation race, try again".
    async fn write_once(
        &self,
        coll: &Collection,
        key: &Key,
        write: &Write,
        nonce: &str,
    ) -> Result<Option<WriteOutcome>, StoreError> {
        let pipeline = compile::update(compile::Applies::When(&write.condition), &write.mutation, nonce);
        let result = self
            .coll(coll)
            .find_one_and_update(doc! { fields::ID: key.as_bson().clone() }, pipeline)
            .upsert(write.upsert)
            .return_document(ReturnDocument::After)
            .await
            .map_err(map_err);
        let doc = match result {
            // Concurrent upserts of a missing document race on the `_id` index:
            // exactly one inserts, the others fail with a duplicate key (or, on some
            // servers, come back empty). The document then exists, so another
            // attempt evaluates the condition normally.
            Err(StoreError::DuplicateKey { .. }) if write.upsert => return Ok(None),
            Ok(None) if write.upsert => return Ok(None),
            Ok(None) => return Ok(Some(WriteOutcome::Rejected(None))),
            Ok(Some(doc)) => doc,
            Err(e) => return Err(e),
        };
        let applied = doc.get_str(fields::LAST_OP).is_ok_and(|n| n == nonce);
        let record = Record::from_document(coll.as_str(), doc)?;
        Ok(Some(if applied { WriteOutcome::Applied(record) } else { WriteOutcome::Rejected(Some(record)) }))
    }
}
