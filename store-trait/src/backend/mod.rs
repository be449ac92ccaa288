//! Support for **implementors of [`Store`](crate::Store)**: the reference
//! semantics every backend must agree with, and the input checks they share.
//!
//! **Unstable**, and hidden from the crate's docs: not part of the API for
//! users of a store, and what is here may change with the backends
//! (`store-memory` runs [`semantics`] directly, `store-mongo`
//! compiles the same rules into server-side expressions). Users read records
//! through [`Record`](crate::Record)'s accessors instead.

pub mod semantics;

pub use crate::ops::ChangeDetail;

use bson::Document;

use crate::{check_field_name, fields, Key, StoreResult};

/// Checks documents for [`Store::insert_many`](crate::Store::insert_many) and
/// gives each an `_id`, rev 1 and fence 0; shared by backends so they reject
/// the same inputs.
pub fn prepare_inserts(docs: Vec<Document>) -> StoreResult<Vec<(Key, Document)>> {
    docs.into_iter()
        .map(|mut d| {
            let key = match d.remove(fields::ID) {
                Some(id) => Key::from_bson(id)?,
                None => Key::generate(),
            };
            for name in d.keys() {
                check_field_name(name)?;
            }
            let mut out = bson::doc! { fields::ID: key.as_bson().clone() };
            out.extend(d);
            out.insert(fields::FENCE, 0_i64);
            out.insert(fields::REV, 1_i64);
            Ok((key, out))
        })
        .collect()
}
