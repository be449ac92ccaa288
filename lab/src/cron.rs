//! The schedule in the chaos run: three `mongocoord cron` processes on one
//! schedule ticking every two seconds (`*/2 * * * * *`, `--overlap allow`),
//! whose command appends `<tick> <fence>` to a ledger file, while they are
//! killed (SIGKILL), paused (SIGSTOP) and restarted, and the server restarts.
//! The checker accounts for every tick of the window, once:
//! - every tick from the schedule's start to the end of the faults has a task,
//!   which completed, and a line in the ledger;
//! - no claim ran a tick's command twice (each run has its own fence);
//! - a tick's command ran again only under a newer claim (the earlier one's
//!   outcome was never recorded: its runner was killed, paused past its lease
//!   or cut off from the server), and the outcome recorded is the last run's;
//! - with `--only cron` (SIGKILLs only, each while no tick's command runs, no
//!   server restart): exactly one run per tick, on its first claim.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bson::doc;
use mongoagent::{fields, schedule::fields as sched_fields, Queue};
use store_mongo::MongoStore;
use store_trait::{Collection, Condition, Key, Query, Store};
use tokio::process::Child;
use tokio::time::Instant;

use crate::error::LabError;
use crate::signal::{any_signal, runner_or_supervisor, signal};

/// The cron processes' queue (the schedule lives in `chaos_cron_schedules`).
pub(crate) const QUEUE: &str = "chaos_cron";
/// The schedule's name (also its tasks' agent name).
pub(crate) const NAME: &str = "chaos-cron";
const SPEC: &str = "*/2 * * * * *";
const EVERY_MS: i64 = 2_000;
const PROCESSES: usize = 3;

/// The cron processes of a chaos run.
pub(crate) struct Crons {
    bin: PathBuf,
    uri: String,
    db: String,
    ledger: PathBuf,
    procs: Vec<Child>,
    /// The first tick every process must run: the schedule's start, or the
    /// processes' start if the schedule was there already.
    window_start: i64,
    pub(crate) kills: usize,
    pub(crate) pauses: usize,
    /// Signals of any kind sent to a runner or its supervisor.
    pub(crate) signals: usize,
}

/// What the checker found.
#[derive(Debug, Default)]
pub(crate) struct CronReport {
    /// Ticks in the window.
    pub(crate) ticks: usize,
    /// Ticks whose command ran more than once (under newer claims).
    pub(crate) reruns: usize,
    pub(crate) violations: Vec<String>,
}

async fn now_ms(store: &MongoStore) -> Result<i64, LabError> {
    Ok(store.now().await?.as_millis())
}

/// The ticks whose tasks have not ended.
async fn open_ticks(store: &MongoStore) -> Result<Vec<i64>, LabError> {
    let coll = Collection::new(QUEUE)?;
    let q = Query::eq(doc! { fields::SCHEDULE: NAME })
        .when(Condition::FieldEq(fields::COMPLETE.into(), bson::Bson::Boolean(true)).negate());
    let open = store.find(&coll, &q).await?;
    Ok(open
        .iter()
        .filter_map(|r| r.data().get_datetime(fields::SCHEDULED_FOR).ok().map(|d| d.timestamp_millis()))
        .collect())
}

impl Crons {
    /// Starts the three processes (`bin` is `mongocoord`), the ledger in `dir`,
    /// and waits until the schedule exists.
    pub(crate) async fn start(
        bin: &Path,
        uri: &str,
        db: &str,
        dir: &Path,
        store: &MongoStore,
    ) -> Result<Self, LabError> {
        // A run of its own: ticks and runs of an earlier run are not this one's.
        for coll in [QUEUE.to_owned(), format!("{QUEUE}_schedules")] {
            let c = store.database().collection::<bson::Document>(&coll);
            c.drop().await.map_err(|e| LabError::from(e).context(format!("cannot drop {coll}")))?;
        }
        let _ = std::fs::remove_file(dir.join("cron-ledger"));
        let started = now_ms(store).await?;
        let mut c = Crons {
            bin: bin.to_owned(),
            uri: uri.to_owned(),
            db: db.to_owned(),
            ledger: dir.join("cron-ledger"),
            procs: Vec::new(),
            window_start: 0,
            kills: 0,
            pauses: 0,
            signals: 0,
        };
        for _ in 0..PROCESSES {
            let p = c.spawn()?;
            c.procs.push(p);
        }
        let coll = Collection::new(format!("{QUEUE}_schedules"))?;
        let key = Key::new(NAME)?;
        let limit = Duration::from_secs(120);
        let until = Instant::now() + limit;
        let since = loop {
            if let Ok(Some(r)) = store.get(&coll, &key).await.map(|s| s.record) {
                break r.data().get_i64(sched_fields::SINCE).unwrap_or(started);
            }
            if Instant::now() > until {
                return Err(LabError::timed_out("the cron processes did not create their schedule", limit));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        c.window_start = since.max(started);
        Ok(c)
    }

    fn spawn(&self) -> Result<Child, LabError> {
        let script = format!("echo \"$MONGOCOORD_TICK $MONGOCOORD_FENCE\" >> '{}'", self.ledger.display());
        tokio::process::Command::new(&self.bin)
            .env("MONGODB_URI", &self.uri)
            .args(["--db", &self.db, "cron", NAME, SPEC, "--queue", QUEUE])
            .args(["--overlap", "allow", "--ttl", "3", "--max-attempts", "20", "--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| LabError::io("cannot start mongocoord cron", e))
    }

    /// SIGKILLs process `i` and starts it again.
    pub(crate) async fn kill(&mut self, i: usize) -> Result<(), LabError> {
        let i = i % self.procs.len();
        let _ = self.procs[i].start_kill();
        let _ = self.procs[i].wait().await;
        self.kills += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.procs[i] = self.spawn()?;
        Ok(())
    }

    /// One step of the full chaos run: now and then a SIGKILL (and restart) or
    /// a SIGSTOP past the lease, at any moment, mid-command included.
    pub(crate) async fn chaos_step(&mut self, rng: &mut fastrand::Rng) -> Result<(), LabError> {
        // A process a signal ended is started again.
        for i in 0..self.procs.len() {
            if matches!(self.procs[i].try_wait(), Ok(Some(_))) {
                self.procs[i] = self.spawn()?;
            }
        }
        match rng.u32(..8) {
            3 => {
                if let Some(pid) = self.procs[rng.usize(..PROCESSES)].id() {
                    let target = runner_or_supervisor(pid, rng);
                    signal(target, any_signal(rng));
                    self.signals += 1;
                }
            }
            0 | 1 => self.kill(rng.usize(..PROCESSES)).await?,
            2 => {
                if let Some(pid) = self.procs[rng.usize(..PROCESSES)].id() {
                    signal(pid, "-STOP");
                    self.pauses += 1;
                    let d = Duration::from_millis(rng.u64(3500..6000));
                    tokio::spawn(async move {
                        tokio::time::sleep(d).await;
                        signal(pid, "-CONT");
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Waits (at most 30 s) for a moment when no tick's task is ready or
    /// running, a second before the next tick: a SIGKILL then interrupts no
    /// command.
    pub(crate) async fn quiet_moment(&self, store: &MongoStore) -> Result<(), LabError> {
        let limit = Duration::from_secs(30);
        let until = Instant::now() + limit;
        while Instant::now() < until {
            let phase = now_ms(store).await?.rem_euclid(EVERY_MS);
            if (700..1_100).contains(&phase) {
                let busy = open_ticks(store).await?;
                if busy.is_empty() && (700..1_300).contains(&now_ms(store).await?.rem_euclid(EVERY_MS)) {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(LabError::timed_out("no moment without a running tick", limit))
    }

    /// Stops every process: SIGTERM (they let running commands finish), or
    /// SIGKILL when `kill`.
    pub(crate) async fn stop(&mut self, kill: bool) {
        for p in &mut self.procs {
            match (kill, p.id()) {
                (false, Some(pid)) => signal(pid, "-TERM"),
                _ => {
                    let _ = p.start_kill();
                }
            }
        }
        for p in &mut self.procs {
            let _ = tokio::time::timeout(Duration::from_secs(30), p.wait()).await;
            let _ = p.start_kill();
        }
    }

    /// Waits (at most 60 s) until every tick up to `window_end` has a task that
    /// ended.
    pub(crate) async fn settle(&self, store: &MongoStore, window_end: i64) -> Result<(), LabError> {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            let open = open_ticks(store).await.unwrap_or_else(|_| vec![window_end]);
            if open.iter().all(|&t| t > window_end) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(())
    }

    /// Checks the ledger and the store for the ticks in `[window start,
    /// window_end]` (server clock); `strict`: exactly one run per tick.
    pub(crate) async fn check(
        &self,
        store: &MongoStore,
        window_end: i64,
        strict: bool,
    ) -> Result<CronReport, LabError> {
        let mut r = CronReport::default();
        let text = std::fs::read_to_string(&self.ledger).unwrap_or_default();
        let mut runs: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match (f.first().and_then(|t| t.parse().ok()), f.get(1).and_then(|t| t.parse().ok()), f.len()) {
                (Some(tick), Some(fence), 2) => runs.entry(tick).or_default().push(fence),
                _ => r.violations.push(format!("cron ledger line {line:?} is not `<tick> <fence>`")),
            }
        }
        let queue = Queue::new(store.clone(), QUEUE)?;
        let mut recorded: BTreeMap<i64, (bool, bool, u64)> = BTreeMap::new();
        for t in queue.tasks(doc! { fields::SCHEDULE: NAME }, None).await? {
            let d = t.data();
            let tick = d
                .get_datetime(fields::SCHEDULED_FOR)
                .map_err(|e| LabError::Field { what: format!("task {}", t.key()), source: e })?;
            let attempts = d.get_i64(fields::ATTEMPTS).ok().and_then(|a| u64::try_from(a).ok()).unwrap_or(0);
            let ok = d.get_bool(fields::ERROR_ENCOUNTERED).ok() == Some(false);
            recorded.insert(tick.timestamp_millis(), (d.get_bool(fields::COMPLETE).ok() == Some(true), ok, attempts));
        }
        let first = self.window_start.div_euclid(EVERY_MS) * EVERY_MS
            + if self.window_start.rem_euclid(EVERY_MS) == 0 { 0 } else { EVERY_MS };
        let mut tick = first;
        while tick <= window_end {
            r.ticks += 1;
            let ran = runs.get(&tick).map_or(0, Vec::len);
            match recorded.get(&tick) {
                None => r.violations.push(format!("cron tick {tick}: no task")),
                Some((false, _, _)) => r.violations.push(format!("cron tick {tick}: its task never ended")),
                Some((true, false, _)) => r.violations.push(format!("cron tick {tick}: its task failed")),
                Some((true, true, attempts)) => {
                    let last = runs.get(&tick).and_then(|f| f.iter().max().copied());
                    if last != Some(*attempts) {
                        r.violations.push(format!(
                            "cron tick {tick}: the outcome recorded is claim {attempts}'s, the last run was {last:?}'s"
                        ));
                    }
                }
            }
            if ran == 0 {
                r.violations.push(format!("cron tick {tick}: the command never ran"));
            }
            tick += EVERY_MS;
        }
        for (tick, fences) in &runs {
            let mut distinct = fences.clone();
            distinct.sort_unstable();
            distinct.dedup();
            if distinct.len() != fences.len() {
                r.violations.push(format!("cron tick {tick}: one claim ran the command twice ({fences:?})"));
            }
            if fences.len() > 1 {
                r.reruns += 1;
                if strict {
                    r.violations.push(format!("cron tick {tick} ran {} times ({fences:?})", fences.len()));
                }
            }
            if *tick % EVERY_MS != 0 || !recorded.contains_key(tick) {
                r.violations.push(format!("cron ledger has tick {tick}, which is no task's"));
            }
        }
        Ok(r)
    }
}

/// `lab chaos --only cron`: the check. Three `mongocoord cron`
/// processes for `duration`; every quarter of it (at most 15 s), one of them in
/// turn is SIGKILLed and restarted, while no tick's command runs; exactly one
/// run per tick. The server is not restarted.
pub(crate) async fn only(store: &MongoStore, crons: &mut Crons, duration: Duration) -> Result<CronReport, LabError> {
    let end = Instant::now() + duration;
    let every = duration.min(Duration::from_secs(60)) / 4;
    let mut i = 0;
    while Instant::now() + every + Duration::from_secs(8) < end {
        tokio::time::sleep(every).await;
        crons.quiet_moment(store).await?;
        crons.kill(i).await?;
        i += 1;
    }
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    crons.quiet_moment(store).await?;
    let window_end = now_ms(store).await?;
    crons.stop(false).await;
    crons.check(store, window_end, true).await
}
