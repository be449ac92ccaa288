//! `schedule_tick_lag_ms_*` of `lab bench`: three `mongocoord cron` processes
//! on one schedule ticking every second; each tick's command writes the tick's
//! instant (`$MONGOCOORD_TICK`, server clock) and its own start (the local wall
//! clock, moved onto the server clock by an offset measured around a
//! `Store::now` call). The lag is from the tick to the command's start: the
//! scheduler's wake-up, the insert, the change notification, the claim and
//! starting the supervised command.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use store_mongo::MongoStore;
use store_trait::Store;
use tokio::time::Instant;

use crate::error::LabError;

const QUEUE: &str = "bench_cron";
const NAME: &str = "bench-tick";

fn wall_ms() -> Result<f64, LabError> {
    Ok(SystemTime::now().duration_since(UNIX_EPOCH).map_err(LabError::Clock)?.as_secs_f64() * 1e3)
}

/// Server clock minus local wall clock, in ms (the smallest round trip of five).
async fn clock_offset(store: &MongoStore) -> Result<f64, LabError> {
    let mut best: Option<(f64, f64)> = None;
    for _ in 0..5 {
        let t0 = wall_ms()?;
        let server = store.now().await?.as_millis() as f64;
        let t1 = wall_ms()?;
        let (rtt, offset) = (t1 - t0, server - (t0 + t1) / 2.0);
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, offset));
        }
    }
    best.map(|(_, o)| o).ok_or_else(|| LabError::Broken("no clock reading".into()))
}

/// The lag of `ticks` ticks (after two to warm up), in ms.
pub(crate) async fn measure(
    mongocoord: &Path,
    uri: &str,
    db: &str,
    store: &MongoStore,
    out: &Path,
    ticks: usize,
) -> Result<Vec<f64>, LabError> {
    let file = out.with_file_name("schedule-ticks.log");
    let _ = std::fs::remove_file(&file);
    for coll in [QUEUE.to_owned(), format!("{QUEUE}_schedules")] {
        let _ = store.database().collection::<bson::Document>(&coll).drop().await;
    }
    let script = format!("echo \"$MONGOCOORD_TICK $(date +%s%N)\" >> '{}'", file.display());
    let mut procs = Vec::new();
    for _ in 0..3 {
        let p = tokio::process::Command::new(mongocoord)
            .env("MONGODB_URI", uri)
            .args(["--db", db, "cron", NAME, "* * * * * *", "--queue", QUEUE, "--overlap", "allow"])
            .args(["--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| LabError::io("cannot start mongocoord cron", e))?;
        procs.push(p);
    }
    let offset = clock_offset(store).await?;
    let read = || -> Vec<(i64, f64)> {
        std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (tick, ns) = l.split_once(' ')?;
                Some((tick.parse().ok()?, ns.trim().parse::<f64>().ok()? / 1e6))
            })
            .collect()
    };
    let limit = Duration::from_secs(60) + Duration::from_secs(2) * u32::try_from(ticks).unwrap_or(0);
    let until = Instant::now() + limit;
    while read().len() < ticks + 2 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for p in &mut procs {
        let _ = p.start_kill();
        let _ = p.wait().await;
    }
    let mut runs = read();
    runs.sort_by_key(|r| r.0);
    if runs.len() < ticks + 2 {
        return Err(LabError::timed_out(format!("only {} of {} ticks ran", runs.len(), ticks + 2), limit));
    }
    let offset = (offset + clock_offset(store).await?) / 2.0;
    Ok(runs.iter().skip(2).take(ticks).map(|(tick, start)| start + offset - *tick as f64).collect())
}
