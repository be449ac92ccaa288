//! Agenda's side of the queue figures: `node DIR/bench.mjs` (the pinned
//! harness in `lab/bench/agenda`) run once per setting of [`AGENDA_SWEEP`], so
//! Agenda is compared at its best, never at a setting that cripples it.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use super::figures::{AgendaSetting, Figures, Section, AGENDA_SWEEP, SHAPES};
use crate::error::LabError;
use crate::server::{Server, ServerSpec};

/// Where a peer's setting, or an idle role, runs: a fresh server each when
/// there is a spec, else the run's own server.
pub(super) struct PeerServer<'a> {
    spec: Option<ServerSpec>,
    shared_uri: &'a str,
}

impl<'a> PeerServer<'a> {
    pub(super) fn new(spec: Option<ServerSpec>, shared_uri: &'a str) -> Self {
        PeerServer { spec, shared_uri }
    }

    /// A server for one setting (or one idle role), and its URI; the server
    /// (if fresh) stops when the first is dropped.
    pub(super) async fn get(&self) -> Result<(Option<Server>, String), LabError> {
        match &self.spec {
            Some(spec) => {
                let s = Server::fresh(spec).await?;
                let uri = s.uri("serverSelectionTimeoutMS=5000");
                Ok((Some(s), uri))
            }
            None => Ok((None, self.shared_uri.to_owned())),
        }
    }
}

/// How much to ask of Agenda.
#[derive(Debug, Clone, Copy)]
pub(super) struct AgendaSize {
    /// Jobs per setting.
    pub(super) jobs: u32,
    /// Idle pickups (Agenda's defaults), in a run of their own.
    pub(super) picks: u32,
    /// Seconds a setting may take before it reports the jobs done by then.
    pub(super) limit_s: u64,
}

/// Runs every setting of [`AGENDA_SWEEP`] and puts `agenda_<setting>_*`, the
/// best rate and its setting (`agenda_best_*`), then `agenda_pickup_ms_p50`
/// from a run of its own. A setting that cannot run is reported as skipped;
/// the others still count.
pub(super) async fn put_figures(f: &mut Figures, dir: &Path, peer: &PeerServer<'_>, db: &str, size: AgendaSize) {
    let mut best: Option<(f64, AgendaSetting, bool)> = None;
    let mut ran = false;
    // A setting that could not run might have been the best: without it, the
    // best of the others is no peer at its best.
    let mut missing = Vec::new();
    for setting in &AGENDA_SWEEP {
        eprintln!(
            "Agenda: {} jobs saved one by one, {} instance(s) of concurrency {}, lockLimit {}, processEvery {} ms…",
            size.jobs, setting.instances, setting.concurrency, setting.lock_limit, setting.process_every_ms,
        );
        let a = match throughput(dir, peer, db, *setting, size).await {
            Ok(a) => a,
            Err(e) => {
                let reason = format!("{}: {e}", setting.name);
                for suffix in ["tasks_per_s", "commands_per_task"] {
                    f.skip_figure(&format!("agenda_{}_{suffix}", setting.name), reason.clone());
                }
                missing.push(setting.name);
                continue;
            }
        };
        if a.timed_out {
            eprintln!(
                "  Agenda hit its time limit after {} of {} jobs: its rate is of those",
                a.completed.unwrap_or_default(),
                size.jobs
            );
            f.put(format!("agenda_{}_timed_out", setting.name), 1.0);
        }
        f.put(format!("agenda_{}_tasks_per_s", setting.name), a.tasks_per_s);
        f.put(format!("agenda_{}_commands_per_task", setting.name), a.commands_per_task);
        ran = true;
        if a.can_be_best() && best.is_none_or(|(rate, _, _)| a.tasks_per_s > rate) {
            best = Some((a.tasks_per_s, *setting, a.timed_out));
        }
    }
    match verdict(best, &missing, ran) {
        Verdict::Best(rate, setting, timed_out) => {
            f.put("agenda_best_tasks_per_s", rate);
            f.put("agenda_best_lock_limit", f64::from(setting.lock_limit));
            f.put("agenda_best_process_every_ms", f64::from(setting.process_every_ms));
            f.put("agenda_best_concurrency", f64::from(setting.concurrency));
            f.put("agenda_best_instances", f64::from(setting.instances));
            if timed_out {
                // Its rate is of the jobs it did by the time limit.
                f.put("agenda_best_timed_out", 1.0);
            }
        }
        Verdict::NoBest(why) => {
            // The best and the ratios are skipped, saying why.
            for name in ["tasks_per_s", "lock_limit", "process_every_ms", "concurrency", "instances"] {
                f.skip_figure(&format!("agenda_best_{name}"), why.clone());
            }
            for shape in SHAPES {
                f.skip_figure(&format!("queue_{shape}_vs_agenda"), why.clone());
            }
        }
        Verdict::NotRun => f.skip(Section::Agenda, "no setting of the sweep ran"),
    }
    put_pickup_figure(f, dir, peer, db, size.picks).await;
}

/// What a sweep says of Agenda at its best.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Its best rate, at that setting (timed out: the rate is of the jobs
    /// done by the time limit).
    Best(f64, AgendaSetting, bool),
    /// No best can be named, and why.
    NoBest(String),
    /// No setting ran at all.
    NotRun,
}

/// The verdict of a sweep whose best completed setting is `best`, in which
/// the settings `missing` could not run (one of them might have been the
/// best: then there is none), and some setting `ran`.
fn verdict(best: Option<(f64, AgendaSetting, bool)>, missing: &[&str], ran: bool) -> Verdict {
    match best {
        _ if !ran => Verdict::NotRun,
        _ if !missing.is_empty() => {
            Verdict::NoBest(format!("the sweep is incomplete (no figures for {})", missing.join(", ")))
        }
        Some((rate, setting, timed_out)) => Verdict::Best(rate, setting, timed_out),
        // A ratio to a peer that did nothing is no comparison (it would be
        // infinite).
        None => Verdict::NoBest("no setting of Agenda's sweep completed a job within its time limit".into()),
    }
}

/// `agenda_pickup_ms_p50`: Agenda at its defaults, on a server of its own
/// (one a throughput run left choked would time its lock queries, not its
/// pickups).
async fn put_pickup_figure(f: &mut Figures, dir: &Path, peer: &PeerServer<'_>, db: &str, picks: u32) {
    eprintln!("Agenda: {picks} pickups with its defaults (processEvery 5 s)…");
    let env = [("AGENDA_PROCESS_EVERY_MS", "5000".to_owned())];
    // Each pick: a pause of up to 5.3 s, and at most 30 s to save and 30 s to
    // be seen; the start and the stop at most 30 s each.
    let limit = Duration::from_secs(90 + 66 * u64::from(picks));
    let v = match node(dir, peer, &format!("{db}_agenda_pickup"), &env, &["0", &picks.to_string()], limit).await {
        Ok(v) => v,
        Err(e) => {
            f.skip_figure("agenda_pickup_picks_seen", e.to_string());
            return f.skip_figure("agenda_pickup_ms_p50", e.to_string());
        }
    };
    let seen = v.get("picks_seen").and_then(Value::as_f64).unwrap_or(0.0);
    f.put("agenda_pickup_picks_seen", seen);
    // A p50 over the picks seen in time would leave out the slow ones.
    match v.get("pickup_ms_p50").and_then(Value::as_f64) {
        Some(p) if seen >= f64::from(picks) => f.put("agenda_pickup_ms_p50", p),
        _ => f.skip_figure("agenda_pickup_ms_p50", format!("{seen} of {picks} picks seen within 30 s each")),
    }
}

/// An idle Agenda (a job defined, none saved) for `seconds` after `warm_up_s`
/// (as ours are measured): at its default
/// `processEvery` (5 s), `agenda_idle_{commands_per_min,cpu_s_per_min,rss_mb}`,
/// and at the 100 ms its best throughput may need, its commands a minute.
pub(super) async fn put_idle_figures(
    f: &mut Figures,
    dir: &Path,
    peer: &PeerServer<'_>,
    db: &str,
    warm_up_s: u64,
    seconds: u64,
) {
    for (every_ms, prefix) in [(5000_u32, "agenda_idle"), (100, "agenda_idle_every_100ms")] {
        eprintln!("Agenda idle: a job defined, none saved, processEvery {every_ms} ms, {seconds} s…");
        let names: &[&str] =
            if every_ms == 5000 { &["commands_per_min", "cpu_s_per_min", "rss_mb"] } else { &["commands_per_min"] };
        let env = [
            ("AGENDA_IDLE_S", seconds.to_string()),
            ("AGENDA_IDLE_WARM_UP_S", warm_up_s.to_string()),
            ("AGENDA_PROCESS_EVERY_MS", every_ms.to_string()),
        ];
        let limit = Duration::from_secs(warm_up_s + seconds + 90);
        let parsed = node(dir, peer, &format!("{db}_agenda_idle"), &env, &["0"], limit).await;
        for name in names {
            let figure = format!("{prefix}_{name}");
            match parsed.as_ref().map(|v| v.get(*name).and_then(Value::as_f64)) {
                Ok(Some(x)) => f.put(figure, x),
                Ok(None) => f.skip_figure(&figure, format!("bench.mjs gave no {name}")),
                Err(e) => f.skip_figure(&figure, e.to_string()),
            }
        }
    }
}

/// Agenda's figures from one run of `node DIR/bench.mjs`.
struct AgendaRun {
    tasks_per_s: f64,
    commands_per_task: f64,
    completed: Option<f64>,
    timed_out: bool,
}

impl AgendaRun {
    /// Whether the run may stand for Agenda at its best: it completed jobs
    /// (a timed-out run's rate is of those it did by the limit).
    fn can_be_best(&self) -> bool {
        self.tasks_per_s.is_finite() && self.tasks_per_s > 0.0 && self.completed.is_none_or(|c| c > 0.0)
    }
}

/// Runs the Agenda harness's throughput run at `setting` on `peer`'s server.
async fn throughput(
    dir: &Path,
    peer: &PeerServer<'_>,
    db: &str,
    setting: AgendaSetting,
    size: AgendaSize,
) -> Result<AgendaRun, LabError> {
    let env = [
        ("AGENDA_TIME_LIMIT_S", size.limit_s.to_string()),
        ("AGENDA_LOCK_LIMIT", setting.lock_limit.to_string()),
        ("AGENDA_PROCESS_EVERY_MS", setting.process_every_ms.to_string()),
        ("AGENDA_CONCURRENCY", setting.concurrency.to_string()),
        ("AGENDA_INSTANCES", setting.instances.to_string()),
    ];
    // A safety net only: the harness bounds its own parts (the throughput run
    // by the time limit, the stop by 30 s); saving the jobs one by one on a
    // loaded server may take a second each.
    let limit = Duration::from_secs(size.limit_s + 120 + u64::from(size.jobs));
    let v = node(dir, peer, &format!("{db}_agenda"), &env, &[&size.jobs.to_string()], limit).await?;
    let num =
        |k: &str| v.get(k).and_then(Value::as_f64).ok_or_else(|| LabError::Unreadable(format!("bench.mjs: no {k}")));
    Ok(AgendaRun {
        tasks_per_s: num("tasks_per_s")?,
        commands_per_task: num("commands_per_task")?,
        completed: num("completed").ok(),
        timed_out: v.get("timed_out").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// Runs `node DIR/bench.mjs AGENDA_DB ARGS…` with `env` on a server from
/// `peer` (fresh, if it has a spec), in a database of its own (the script
/// drops it first), for at most `limit`, and parses the one JSON line it
/// prints last.
async fn node(
    dir: &Path,
    peer: &PeerServer<'_>,
    agenda_db: &str,
    env: &[(&str, String)],
    args: &[&str],
    limit: Duration,
) -> Result<Value, LabError> {
    let script = dir.join("bench.mjs");
    let (_server, uri) = peer.get().await.map_err(|e| e.context("no fresh server"))?;
    let run = tokio::process::Command::new("node")
        .arg(&script)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("MONGODB_URI", &uri)
        .arg(agenda_db)
        .args(args)
        .stdin(Stdio::null())
        // Its progress (saving, the run, the stop) shows as it goes.
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(limit, run)
        .await
        .map_err(|_| LabError::timed_out("node did not finish", limit))?
        .map_err(|e| LabError::io(format!("cannot run node {}", script.display()), e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(line) = text.lines().rev().find(|l| l.trim_start().starts_with('{')) else {
        return Err(LabError::Unreadable(format!(
            "node {} printed no figures ({}; its stderr is above)",
            script.display(),
            out.status
        )));
    };
    serde_json::from_str(line).map_err(|e| LabError::Json { what: format!("bench.mjs printed {line:?}"), source: e })
}

#[cfg(test)]
mod tests {
    use super::AgendaRun;

    fn run(tasks_per_s: f64, completed: Option<f64>, timed_out: bool) -> AgendaRun {
        AgendaRun { tasks_per_s, commands_per_task: 3.0, completed, timed_out }
    }

    #[test]
    fn a_sweep_names_a_best_only_when_every_setting_ran_and_one_did_a_job() {
        use super::{verdict, Verdict, AGENDA_SWEEP};
        let s = AGENDA_SWEEP[2];
        assert_eq!(verdict(Some((135.0, s, false)), &[], true), Verdict::Best(135.0, s, false));
        let incomplete = verdict(Some((135.0, s, false)), &["lock_limit_0_every_10s"], true);
        assert!(matches!(incomplete, Verdict::NoBest(why) if why.contains("lock_limit_0_every_10s")));
        assert!(matches!(verdict(None, &[], true), Verdict::NoBest(why) if why.contains("completed a job")));
        assert_eq!(verdict(None, &["a", "b"], false), Verdict::NotRun);
    }

    #[test]
    fn a_setting_that_completed_no_job_is_never_the_best() {
        assert!(run(42.0, Some(400.0), false).can_be_best());
        assert!(run(0.8, Some(144.0), true).can_be_best(), "a timed-out run's rate is of what it did");
        assert!(!run(0.0, Some(0.0), true).can_be_best());
        assert!(!run(f64::NAN, None, false).can_be_best());
        assert!(!run(f64::INFINITY, None, false).can_be_best());
    }
}
