//! `sim_steps_per_s`: five electors on the memory store under paused time,
//! what the store's and the elector's own code cost without a server.

use std::time::{Duration, Instant};

use store_memory::MemoryStore;

use crate::error::LabError;

/// Store operations per wall second of the five-elector simulation on the
/// memory store under paused time.
pub(super) async fn simulate(minutes: u64) -> Result<f64, LabError> {
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .map_err(|e| LabError::io("cannot start the simulation's runtime", e))?;
        rt.block_on(async move {
            let store = MemoryStore::new();
            let electors: Vec<_> = (0..5)
                .map(|_| {
                    mongoelector::Elector::builder(store.clone(), "sim")
                        .ttl(Duration::from_secs(3))
                        .report_status(false)
                        .build()
                })
                .collect::<Result<_, _>>()?;
            for e in &electors {
                e.start()?;
            }
            let wall = Instant::now();
            let mut rng = fastrand::Rng::with_seed(1);
            let end = tokio::time::Instant::now() + Duration::from_secs(60 * minutes);
            while tokio::time::Instant::now() < end {
                let e = &electors[rng.usize(..electors.len())];
                if rng.u32(..10) == 0 {
                    let _ = e.release().await;
                }
                tokio::time::sleep(Duration::from_millis(rng.u64(100..2000))).await;
            }
            let ops = store.operation_count() as f64;
            for e in &electors {
                e.stop().await;
            }
            Ok::<f64, LabError>(ops / wall.elapsed().as_secs_f64())
        })
    })
    .await
    .map_err(|e| LabError::join("the simulation stopped", e))?
}
