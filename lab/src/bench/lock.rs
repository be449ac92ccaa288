//! The lock's figures beside the raw driver's: `findAndModify` upserts, lock
//! acquire and release cycles, a minimal DistributedLock.MongoDB-style
//! acquire pipeline, and handovers from a releasing holder to a waiter.

use std::time::{Duration, Instant};

use bson::doc;
use mongolock::{Acquire, Lock};
use store_mongo::mongodb::options::{Acknowledgment, CollectionOptions, ReturnDocument, WriteConcern};
use store_mongo::MongoStore;

use super::figures::Figures;
use super::stats::{pct, sorted};
use crate::error::LabError;

/// Puts the raw driver's and the lock's figures: `n` calls and cycles of
/// each, then `trials` handovers.
pub(super) async fn put_figures(f: &mut Figures, store: &MongoStore, n: usize, trials: usize) -> Result<(), LabError> {
    eprintln!("raw findAndModify ({n} calls)…");
    let raw = store.database().collection::<bson::Document>("bench_raw");
    let mut lat = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        raw.find_one_and_update(
            doc! {"_id": "k"},
            vec![doc! {"$set": {"n": {"$add": [{"$ifNull": ["$n", 0]}, 1]}, "at": "$$NOW"}}],
        )
        .upsert(true)
        .await?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let raw_rate = n as f64 / start.elapsed().as_secs_f64();
    let raw_p50 = pct(&sorted(lat), 0.5);
    f.put("raw_fam_per_s", raw_rate);
    f.put("raw_fam_p50_us", raw_p50);

    // Our cycles and the minimal pipeline's take turns, so whatever else
    // the machine or the server does meanwhile weighs on both alike.
    eprintln!(
        "lock acquire + release, and a minimal DistributedLock.MongoDB-style pipeline's, in turns ({n} cycles each)…"
    );
    let lock = Lock::builder(store.clone(), "bench-lock").ttl(Duration::from_secs(30)).build()?;
    let minimal = MinimalLock::new(store);
    let (mut acq, mut min) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut cycles = Duration::ZERO;
    for _ in 0..n {
        let t = Instant::now();
        let g = lock.try_acquire().await?.ok_or_else(|| LabError::Broken("uncontended lock was held".into()))?;
        acq.push(t.elapsed().as_secs_f64() * 1e6);
        g.release().await?;
        cycles += t.elapsed();
        min.push(minimal.cycle().await?);
    }
    f.put("lock_cycles_per_s", n as f64 / cycles.as_secs_f64());
    let acq = sorted(acq);
    f.put("lock_acquire_p50_us", pct(&acq, 0.5));
    f.put("lock_acquire_p99_us", pct(&acq, 0.99));
    f.put("lock_acquire_vs_raw", pct(&acq, 0.5) / raw_p50);
    let minimal = sorted(min);
    f.put("minimal_pipeline_acquire_p50_us", pct(&minimal, 0.5));
    f.put("lock_vs_minimal_pipeline", pct(&acq, 0.5) / pct(&minimal, 0.5));

    eprintln!("lock handover ({trials} trials)…");
    let mut hand = Vec::new();
    for _ in 0..trials {
        let a = Lock::builder(store.clone(), "bench-handover").ttl(Duration::from_secs(30)).build()?;
        let b = a.clone();
        let g = a.acquire().await?;
        let waiter = tokio::spawn(async move {
            b.acquire_with(Acquire::new().timeout(Duration::from_secs(20))).await.map(|g| (Instant::now(), g))
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        let t0 = Instant::now();
        g.release().await?;
        let (t1, g2) = waiter.await.map_err(|e| LabError::join("the handover's waiter stopped", e))??;
        hand.push(t1.duration_since(t0).as_secs_f64() * 1e3);
        g2.release().await?;
    }
    let hand = sorted(hand);
    f.put("handover_ms_p50", pct(&hand, 0.5));
    f.put("handover_ms_p99", pct(&hand, 0.99));
    Ok(())
}

/// A minimal DistributedLock.MongoDB-style lock: an acquire is one
/// `findAndModify` upsert whose single `$set` stage takes the lock when it is
/// free or expired (a `$cond` on `$$NOW` per field: owner, expiry, fence),
/// and a release one untimed update. Same write concern as our lock.
struct MinimalLock {
    coll: store_mongo::mongodb::Collection<bson::Document>,
    acquire: Vec<bson::Document>,
}

impl MinimalLock {
    fn new(store: &MongoStore) -> MinimalLock {
        let coll = store.database().collection_with_options::<bson::Document>(
            "bench_minimal_lock",
            CollectionOptions::builder()
                .write_concern(WriteConcern::builder().w(Acknowledgment::Majority).journal(true).build())
                .build(),
        );
        let now = doc! {"$toLong": "$$NOW"};
        let free = doc! {"$or": [
            {"$eq": [{"$ifNull": ["$owner", null]}, null]},
            {"$lte": [{"$ifNull": ["$expires_ms", 0_i64]}, now.clone()]},
        ]};
        let acquire = vec![doc! {"$set": {
            "owner": {"$cond": [free.clone(), "bench", "$owner"]},
            "expires_ms": {"$cond": [free.clone(), {"$add": [now, 30_000_i64]}, "$expires_ms"]},
            "fence": {"$cond": [free, {"$add": [{"$ifNull": ["$fence", 0_i64]}, 1_i64]}, "$fence"]},
        }}];
        MinimalLock { coll, acquire }
    }

    /// One acquire and release; the acquire's latency in µs.
    async fn cycle(&self) -> Result<f64, LabError> {
        let t = Instant::now();
        let got = self
            .coll
            .find_one_and_update(doc! {"_id": "bench"}, self.acquire.clone())
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await?;
        let lat = t.elapsed().as_secs_f64() * 1e6;
        if got.as_ref().and_then(|d| d.get_str("owner").ok()) != Some("bench") {
            return Err(LabError::Broken("minimal lock pipeline: a free lock was not taken".into()));
        }
        self.coll.update_one(doc! {"_id": "bench", "owner": "bench"}, doc! {"$set": {"owner": null}}).await?;
        Ok(lat)
    }
}
