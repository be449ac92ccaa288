//! Election trials: three candidate processes; the leader is stopped with
//! SIGTERM or killed with SIGKILL, and the time until the next leader's
//! command writes its line is measured. After a kill, the time from the dead
//! leader's lease lapsing (its `lease_until`, on the server's clock) to that
//! line is the failover's overhead: what the followers add to the ttl.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bson::{doc, Document};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use store_mongo::mongodb::Collection;
use store_mongo::MongoStore;
use store_trait::Store;

use super::figures::Figures;
use super::stats::{pct, sorted};
use crate::error::LabError;

/// Our elector (`mongocoord elect` processes, ttl 3 s): `trials` clean stops
/// and as many kills of the leader; puts `elector_handover_ms_p50`,
/// `failover_s_p50`, `failover_over_ttl` and `failover_overhead_ms_p50`.
pub(super) async fn put_figures(
    f: &mut Figures,
    mongocoord: &Path,
    uri: &str,
    db: &str,
    store: &MongoStore,
    out: &Path,
    trials: usize,
) -> Result<(), LabError> {
    eprintln!("elector: 3 processes, ttl 3 s, {trials} clean stops and {trials} kills…");
    let ours = |key: &str, file: &Path| {
        // The runner's pid, which the trials signal: the command's parent
        // is the runner's supervisor, not the runner.
        let script = format!("echo $(date +%s%N) $MONGOCOORD_RUNNER_PID >> {}; exec sleep 100000", file.display());
        let mut c = tokio::process::Command::new(mongocoord);
        let ttl = TTL.as_secs().to_string();
        c.env("MONGODB_URI", uri).args(["--db", db, "elect", key, "--ttl", &ttl, "--", "sh", "-c", &script]);
        c
    };
    let lease = LeaseDoc::new(store, mongoelector::DEFAULT_COLLECTION).await?;
    let t = self::trials("bench-elect", out, trials, trials, Some(&lease), ours).await?;
    let (h, fo) = (sorted(t.handovers_ms), sorted(t.failovers_s));
    f.put("elector_handover_ms_p50", pct(&h, 0.5));
    f.put("failover_s_p50", pct(&fo, 0.5));
    f.put("failover_over_ttl", pct(&fo, 0.5) / TTL.as_secs_f64());
    f.put("failover_overhead_ms_p50", pct(&sorted(t.overheads_ms), 0.5));
    Ok(())
}

/// What a run of trials measured.
#[derive(Debug, Default)]
pub(super) struct Trials {
    /// Clean stops: milliseconds from SIGTERM to the next leader's line.
    pub(super) handovers_ms: Vec<f64>,
    /// Kills: seconds from SIGKILL to the next leader's line.
    pub(super) failovers_s: Vec<f64>,
    /// Kills, where the lease document is known: milliseconds from the dead
    /// leader's `lease_until` (server clock) to the next leader's line.
    pub(super) overheads_ms: Vec<f64>,
}

/// Where the candidates keep their lease, so a kill's overhead can be read
/// off the server: the collection, and the server clock's offset from ours.
pub(super) struct LeaseDoc {
    coll: Collection<Document>,
    offset_ms: f64,
}

impl LeaseDoc {
    /// The lease documents of `collection`, with the server clock's offset
    /// measured now (the middle of one `now()` round trip).
    pub(super) async fn new(store: &MongoStore, collection: &str) -> Result<LeaseDoc, LabError> {
        let before = unix_ms();
        let server = store.now().await?.as_millis() as f64;
        let after = unix_ms();
        Ok(LeaseDoc { coll: store.database().collection(collection), offset_ms: server - (before + after) / 2.0 })
    }

    /// When `key`'s lease lapses, on our clock (epoch ms).
    async fn lapses_at(&self, key: &str) -> Result<f64, LabError> {
        let d = self
            .coll
            .find_one(doc! {"_id": key})
            .await?
            .ok_or_else(|| LabError::Broken(format!("no lease document {key:?}")))?;
        let until = d
            .get_i64(store_trait::fields::LEASE_UNTIL)
            .map_err(|e| LabError::Field { what: format!("the lease {key:?}"), source: e })?;
        Ok(until as f64 - self.offset_ms)
    }
}

/// The candidates' ttl, ours and the seed's alike.
pub(super) const TTL: Duration = Duration::from_secs(3);

fn unix_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Three candidates from `spawn(key, file)`, each of which, once it leads,
/// appends `EPOCH_NANOS PID` to `file` (PID: the process the trials signal).
/// The leader is stopped `stops` times, then killed `kills` times; a
/// replacement keeps three candidates. With `lease`, each kill's overhead is
/// measured too.
pub(super) async fn trials(
    key: &str,
    out: &Path,
    stops: usize,
    kills: usize,
    lease: Option<&LeaseDoc>,
    spawn: impl Fn(&str, &Path) -> tokio::process::Command,
) -> Result<Trials, LabError> {
    let file = out.with_file_name(format!("{key}.log"));
    let _ = std::fs::remove_file(&file);
    let start = |c: &mut tokio::process::Command| {
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| LabError::io("cannot start a candidate", e))
    };
    let mut procs: Vec<tokio::process::Child> = Vec::new();
    for _ in 0..3 {
        procs.push(start(&mut spawn(key, &file))?);
    }
    let lines = || read_lines(&file);
    wait_lines(&file, 1, Duration::from_secs(120)).await?;
    let mut t = Trials::default();
    for trial in 0..stops + kills {
        let before = lines();
        let leader_pid: u32 =
            before.last().and_then(|l| l.split_whitespace().nth(1)).and_then(|p| p.parse().ok()).ok_or_else(|| {
                LabError::Unreadable(format!("bad leader line in {}: {:?}", file.display(), before.last()))
            })?;
        let idx = procs
            .iter()
            .position(|p| p.id() == Some(leader_pid))
            .ok_or_else(|| LabError::Broken(format!("leader {leader_pid} is not one of ours")))?;
        let kill = trial >= stops;
        // The signal is sent from here, not by a `kill` process: starting one
        // would count its fork and exec as handover.
        let sig = if kill { Signal::SIGKILL } else { Signal::SIGTERM };
        let pid = Pid::from_raw(i32::try_from(leader_pid).map_err(|_| LabError::Broken(format!("pid {leader_pid}")))?);
        let t0 = unix_ms();
        nix::sys::signal::kill(pid, sig).map_err(|e| LabError::io("cannot signal the leader", e.into()))?;
        // A renewal in flight when the leader died lands within a round trip.
        let lapses = match (kill, lease) {
            (true, Some(l)) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Some(l.lapses_at(key).await?)
            }
            _ => None,
        };
        let after = wait_lines(&file, before.len() + 1, Duration::from_secs(180)).await?;
        let line = &after[before.len()];
        let t1_ns: u128 = line
            .split_whitespace()
            .next()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| LabError::Unreadable(format!("bad line in {}: {line:?}", file.display())))?;
        let t1 = t1_ns as f64 / 1e6;
        if kill {
            t.failovers_s.push((t1 - t0).max(0.0) / 1e3);
            if let Some(lapses) = lapses {
                t.overheads_ms.push(t1 - lapses);
            }
        } else {
            t.handovers_ms.push((t1 - t0).max(0.0));
        }
        let mut old = procs.remove(idx);
        // A stopped leader that has not gone within the grace of a stop is
        // killed: a trial never waits on it for ever.
        if tokio::time::timeout(Duration::from_secs(15), old.wait()).await.is_err() {
            let _ = old.start_kill();
            let _ = old.wait().await;
        }
        procs.push(start(&mut spawn(key, &file))?);
        // The next stop or kill comes at a random point of the leader's
        // cycle (its renewals, a seed follower's polls, every ttl/3 to ttl):
        // at a fixed pause after the replacement started, every trial would
        // land at the same point of it, which favours or penalises a design
        // by chance.
        tokio::time::sleep(Duration::from_millis(700) + TTL.mul_f64(fastrand::f64())).await;
    }
    for p in &mut procs {
        let _ = p.start_kill();
    }
    Ok(t)
}

fn read_lines(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file).unwrap_or_default().lines().map(str::to_owned).collect()
}

async fn wait_lines(file: &Path, n: usize, limit: Duration) -> Result<Vec<String>, LabError> {
    let t = Instant::now();
    loop {
        let l = read_lines(file);
        if l.len() >= n {
            return Ok(l);
        }
        if t.elapsed() > limit {
            return Err(LabError::timed_out("no new leader", limit));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
