//! `Store::distinct_strings` on MongoDB: one `distinct` command over the
//! claim filter (so unreadable documents are left out, as a claim passes
//! over them), served by an index that leads with the field.

use store_trait::{Collection, Query, StoreResult};

use crate::{filter, map_err, MongoStore};

impl MongoStore {
    pub(crate) async fn distinct_strings_op(
        &self,
        coll: &Collection,
        field: &str,
        query: &Query,
    ) -> StoreResult<Vec<String>> {
        store_trait::check_field_name(field)?;
        query.validate()?;
        let found = self
            .coll(coll)
            .distinct(field, filter::claim(query))
            .max_time(self.operation_timeout)
            .await
            .map_err(map_err)?;
        let mut out: Vec<String> = found.into_iter().filter_map(|v| v.as_str().map(str::to_owned)).collect();
        out.sort();
        Ok(out)
    }
}
