//! The raw queue loop: what the server gives an unbatched queue written by
//! hand with the driver, the baseline every queue shape is divided by.

use std::time::Instant;

use bson::doc;
use store_mongo::mongodb::options::{Acknowledgment, CollectionOptions, ReadConcern, ReturnDocument, WriteConcern};
use store_mongo::MongoStore;

use super::counted::counted_store;
use super::queue::{preload, QueueRun};
use crate::error::LabError;

/// The server's limit for an unbatched queue: one client claims the next task
/// (the agent's filter and sort, one `findAndModify` with a lease and a fence)
/// and completes it with an update conditional on that fence, until none is left.
/// Same documents, claim index and write concern as the agents'.
pub(super) async fn raw_queue_run(
    uri: &str,
    db: &str,
    store: &MongoStore,
    tasks: u32,
    coll: &str,
) -> Result<QueueRun, LabError> {
    preload(store, tasks, coll).await?;
    let (counted, commands) = counted_store(uri, db).await?;
    let c = counted.database().collection_with_options::<bson::Document>(
        coll,
        CollectionOptions::builder()
            .write_concern(WriteConcern::builder().w(Acknowledgment::Majority).journal(true).build())
            .read_concern(ReadConcern::majority())
            .build(),
    );
    let now = doc! {"$toLong": "$$NOW"};
    let filter = doc! {
        "agent_name": "bench",
        "ready": true,
        "complete": {"$ne": true},
        "$expr": {"$and": [
            {"$lte": [{"$ifNull": [{"$toLong": "$run_at"}, 0_i64]}, now.clone()]},
            {"$or": [
                {"$eq": [{"$ifNull": ["$lease_owner", null]}, null]},
                {"$lte": [{"$ifNull": [{"$toLong": "$lease_until"}, 0_i64]}, now.clone()]},
            ]},
        ]},
    };
    let claim = vec![doc! {"$set": {
        "lease_owner": "raw",
        "lease_until": {"$add": [now, 30_000_i64]},
        "fence": {"$add": [{"$ifNull": ["$fence", 0_i64]}, 1_i64]},
        "ready": false,
        "claimed": true,
    }}];
    let c0 = commands.snapshot();
    let start = Instant::now();
    let mut completed = 0_u32;
    while let Some(task) = c
        .find_one_and_update(filter.clone(), claim.clone())
        .sort(doc! {"priority": -1, "run_at": 1, "_id": 1})
        .return_document(ReturnDocument::After)
        .await?
    {
        let id = task.get("_id").cloned().ok_or_else(|| LabError::Broken("claimed task without _id".into()))?;
        let fence = task.get("fence").cloned().ok_or_else(|| LabError::Broken("claimed task without fence".into()))?;
        let done = c
            .update_one(
                doc! {"_id": id, "fence": fence},
                vec![doc! {"$set": {
                    "complete": true,
                    "claimed": false,
                    "lease_owner": null,
                    "lease_until": null,
                    "completed_at": "$$NOW",
                }}],
            )
            .await?;
        if done.matched_count != 1 {
            return Err(LabError::Broken("raw queue: a fenced completion matched no task".into()));
        }
        completed += 1;
    }
    let rate = f64::from(tasks) / start.elapsed().as_secs_f64();
    let counts = commands.snapshot().since(&c0);
    if completed != tasks {
        return Err(LabError::Completions {
            run: "raw queue",
            completed: u64::from(completed),
            tasks: u64::from(tasks),
        });
    }
    Ok(QueueRun { rate, commands_per_task: counts.total as f64 / f64::from(tasks), counts })
}
