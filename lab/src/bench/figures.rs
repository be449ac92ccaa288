//! The figures `lab bench` promises, in one list ([`PROMISED`]) that both the
//! summary writer and the smoke check read: a figure is either measured
//! (present and finite) or reported as skipped, with its section's reason.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::error::LabError;

/// A part of the bench whose figures stand or fall together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Section {
    /// Ours and the raw driver: always measured.
    Core,
    /// `mongocoord elect` processes (`MONGOCOORD_BENCH_SKIP=elector`).
    Elector,
    /// `mongocoord cron` processes (`MONGOCOORD_BENCH_SKIP=schedule`).
    Schedule,
    /// The seed's Python `mongoelector` (a venv; `MONGOCOORD_BENCH_SKIP=seed`).
    Seed,
    /// The seed's failover, which waits for MongoDB's TTL monitor (about a
    /// minute a trial): full runs only.
    SeedFailover,
    /// Idle `mongocoord` processes, read from `/proc` (`MONGOCOORD_BENCH_SKIP=idle`).
    Idle,
    /// Agenda under `node` (an `npm` install).
    Agenda,
}

impl Section {
    /// The name in `summary.json`'s `skipped` and in `MONGOCOORD_BENCH_SKIP`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Section::Core => "core",
            Section::Elector => "elector",
            Section::Schedule => "schedule",
            Section::Seed => "seed",
            Section::SeedFailover => "seed_failover",
            Section::Idle => "idle",
            Section::Agenda => "agenda",
        }
    }

    /// Whether a strict smoke run (under `CI`) may report it as skipped: only
    /// the seed's failover, a minute a trial (full runs only). Agenda may not:
    /// `.ci/run` installs `node` and `npm`, and a broken Agenda harness is a
    /// broken comparison.
    fn may_skip_under_ci(self) -> bool {
        matches!(self, Section::SeedFailover)
    }
}

/// The queue shapes measured side by side (`queue_<shape>_*`).
pub(crate) const SHAPES: [&str; 4] = ["per_agent", "shared", "shared_global_1000", "processes"];

/// Agenda's settings swept for its best (`agenda_<name>_*`): `lockLimit` (0 is
/// Agenda's default, no limit) and `processEvery` (5 s is its default), jobs
/// saved one by one. In the order they run: the ones that keep up first,
/// since a run whose lock queries pile up leaves the server busy after it.
pub(crate) const AGENDA_SWEEP: [AgendaSetting; 10] = [
    one("lock_limit_0_every_100ms", 0, 100, 16),
    one("lock_limit_0_every_1s", 0, 1000, 16),
    one("lock_limit_0_every_5s", 0, 5000, 16),
    // Longer ticks than its default: on a backlog, Agenda's rate grows with
    // its tick while its lock queries pile up (fewer in flight at once).
    // On `secantusd-py` it did best at 10 s (33 jobs/s, 14.8 at 5 s), so
    // 30 s brackets its best there; on `secantusd-rs` 5 s did.
    one("lock_limit_0_every_10s", 0, 10_000, 16),
    one("lock_limit_0_every_30s", 0, 30_000, 16),
    one("lock_limit_4_every_5s", 4, 5000, 16),
    one("lock_limit_4_every_100ms", 4, 100, 16),
    // A limit as large as its slots: short ticks, and no more fills once
    // they are all locked.
    one("lock_limit_16_every_100ms", 16, 100, 16),
    // Fewer slots, fewer lock queries in flight: on `secantusd-py`, Agenda
    // at 16 collapses under its own (no job in 180 s at 100 ms). At 4, by
    // hand on a fresh server, it once did 42 jobs/s; in the full runs, none.
    one("lock_limit_0_every_100ms_concurrency_4", 0, 100, 4),
    // Four instances of concurrency 4, each with its own client, as four
    // processes: one instance locks one job at a time, and ours is 4 agents
    // (or 4 processes), so this is Agenda deployed as ours is. (Measured by
    // hand at 1 s too, on secantusd-rs: 23 jobs/s, under the 31 at 5 s.)
    AgendaSetting {
        name: "lock_limit_0_every_5s_x4",
        lock_limit: 0,
        process_every_ms: 5000,
        concurrency: 4,
        instances: 4,
    },
];

/// A setting of one Agenda instance.
const fn one(name: &'static str, lock_limit: u32, process_every_ms: u32, concurrency: u32) -> AgendaSetting {
    AgendaSetting { name, lock_limit, process_every_ms, concurrency, instances: 1 }
}

/// One point of [`AGENDA_SWEEP`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AgendaSetting {
    pub(crate) name: &'static str,
    pub(crate) lock_limit: u32,
    pub(crate) process_every_ms: u32,
    /// Agenda's `maxConcurrency`/`defaultConcurrency`: 16 is the slots our
    /// side has (4 agents of concurrency 4, or 4 processes of one each).
    pub(crate) concurrency: u32,
    /// Agenda instances, each with its own client (as processes would be).
    pub(crate) instances: u32,
}

use Section::{Agenda, Core, Elector, Idle, Schedule, Seed, SeedFailover};

/// Every figure a run promises, by section. The per-kind breakdowns
/// (`*_cmd_<kind>`, `*_ms_<kind>`) depend on what the agents sent and are
/// not promised.
pub(crate) const PROMISED: &[(&str, Section)] = &[
    ("raw_fam_per_s", Core),
    ("raw_fam_p50_us", Core),
    ("lock_cycles_per_s", Core),
    ("lock_acquire_p50_us", Core),
    ("lock_acquire_p99_us", Core),
    ("lock_acquire_vs_raw", Core),
    ("minimal_pipeline_acquire_p50_us", Core),
    ("lock_vs_minimal_pipeline", Core),
    ("handover_ms_p50", Core),
    ("handover_ms_p99", Core),
    ("elector_handover_ms_p50", Elector),
    ("failover_s_p50", Elector),
    ("failover_over_ttl", Elector),
    ("failover_overhead_ms_p50", Elector),
    ("queue_tasks", Core),
    ("raw_queue_per_s", Core),
    ("raw_queue_commands_per_task", Core),
    ("raw_queue_command_ms_per_task", Core),
    ("queue_per_agent_tasks_per_s", Core),
    ("queue_per_agent_commands_per_task", Core),
    ("queue_per_agent_command_ms_per_task", Core),
    ("queue_per_agent_vs_raw_queue", Core),
    ("queue_shared_tasks_per_s", Core),
    ("queue_shared_commands_per_task", Core),
    ("queue_shared_command_ms_per_task", Core),
    ("queue_shared_vs_raw_queue", Core),
    ("queue_shared_global_1000_tasks_per_s", Core),
    ("queue_shared_global_1000_commands_per_task", Core),
    ("queue_shared_global_1000_command_ms_per_task", Core),
    ("queue_shared_global_1000_vs_raw_queue", Core),
    ("queue_processes_tasks_per_s", Core),
    ("queue_processes_commands_per_task", Core),
    ("queue_processes_vs_raw_queue", Core),
    ("queue_grouped_100_tasks_per_s", Core),
    ("queue_grouped_100_commands_per_task", Core),
    ("queue_grouped_100_vs_per_agent", Core),
    ("queue_global_1000_pair_tasks", Core),
    ("queue_global_1000_vs_shared_first_pair", Core),
    ("queue_global_1000_vs_shared_second_pair", Core),
    ("queue_global_1000_vs_shared", Core),
    ("queue_global_1000_extra_commands_per_task", Core),
    ("scaling_1_processes_tasks_per_s", Core),
    ("scaling_1_processes_commands_per_task", Core),
    ("scaling_2_processes_tasks_per_s", Core),
    ("scaling_2_processes_commands_per_task", Core),
    ("scaling_4_processes_tasks_per_s", Core),
    ("scaling_4_processes_commands_per_task", Core),
    ("scaling_8_processes_tasks_per_s", Core),
    ("scaling_8_processes_commands_per_task", Core),
    ("scaling_16_processes_tasks_per_s", Core),
    ("scaling_16_processes_commands_per_task", Core),
    ("queue_events_per_s", Core),
    ("queue_events_per_task", Core),
    ("queue_events_tasks_per_s", Core),
    ("queue_events_resyncs", Core),
    ("pickup_ms_p50", Core),
    ("pickup_ms_p99", Core),
    ("wait_for_ms_p50", Core),
    ("schedule_tick_lag_ms_p50", Schedule),
    ("schedule_tick_lag_ms_p99", Schedule),
    ("sim_steps_per_s", Core),
    ("idle_agent_commands_per_min", Idle),
    ("idle_agent_cpu_s_per_min", Idle),
    ("idle_agent_rss_mb", Idle),
    ("idle_follower_commands_per_min", Idle),
    ("idle_follower_cpu_s_per_min", Idle),
    ("idle_follower_rss_mb", Idle),
    ("idle_waiter_commands_per_min", Idle),
    ("idle_waiter_cpu_s_per_min", Idle),
    ("idle_waiter_rss_mb", Idle),
    ("idle_cron_commands_per_min", Idle),
    ("idle_cron_cpu_s_per_min", Idle),
    ("idle_cron_rss_mb", Idle),
    ("seed_lock_cycles_per_s", Seed),
    ("seed_handover_ms_p50", Seed),
    ("seed_failover_s_p50", SeedFailover),
    ("agenda_lock_limit_0_every_100ms_tasks_per_s", Agenda),
    ("agenda_lock_limit_0_every_100ms_commands_per_task", Agenda),
    ("agenda_lock_limit_0_every_1s_tasks_per_s", Agenda),
    ("agenda_lock_limit_0_every_1s_commands_per_task", Agenda),
    ("agenda_lock_limit_0_every_5s_tasks_per_s", Agenda),
    ("agenda_lock_limit_0_every_5s_commands_per_task", Agenda),
    ("agenda_lock_limit_4_every_5s_tasks_per_s", Agenda),
    ("agenda_lock_limit_4_every_5s_commands_per_task", Agenda),
    ("agenda_lock_limit_4_every_100ms_tasks_per_s", Agenda),
    ("agenda_lock_limit_4_every_100ms_commands_per_task", Agenda),
    ("agenda_lock_limit_0_every_100ms_concurrency_4_tasks_per_s", Agenda),
    ("agenda_lock_limit_0_every_100ms_concurrency_4_commands_per_task", Agenda),
    ("agenda_lock_limit_0_every_10s_tasks_per_s", Agenda),
    ("agenda_lock_limit_0_every_10s_commands_per_task", Agenda),
    ("agenda_lock_limit_0_every_30s_tasks_per_s", Agenda),
    ("agenda_lock_limit_0_every_30s_commands_per_task", Agenda),
    ("agenda_lock_limit_16_every_100ms_tasks_per_s", Agenda),
    ("agenda_lock_limit_16_every_100ms_commands_per_task", Agenda),
    ("agenda_lock_limit_0_every_5s_x4_tasks_per_s", Agenda),
    ("agenda_lock_limit_0_every_5s_x4_commands_per_task", Agenda),
    ("agenda_best_tasks_per_s", Agenda),
    ("agenda_best_lock_limit", Agenda),
    ("agenda_best_process_every_ms", Agenda),
    ("agenda_best_concurrency", Agenda),
    ("agenda_best_instances", Agenda),
    ("agenda_pickup_ms_p50", Agenda),
    ("agenda_pickup_picks_seen", Agenda),
    ("agenda_idle_commands_per_min", Agenda),
    ("agenda_idle_cpu_s_per_min", Agenda),
    ("agenda_idle_rss_mb", Agenda),
    ("agenda_idle_every_100ms_commands_per_min", Agenda),
    ("queue_per_agent_vs_agenda", Agenda),
    ("queue_shared_vs_agenda", Agenda),
    ("queue_shared_global_1000_vs_agenda", Agenda),
    ("queue_processes_vs_agenda", Agenda),
    ("queue_tasks_per_s", Core),
    ("queue_vs_raw", Core),
    ("queue_shared_vs_raw", Core),
];

/// The figures of one run, and the sections skipped with their reasons.
#[derive(Debug, Default)]
pub(crate) struct Figures {
    values: BTreeMap<String, f64>,
    skipped: BTreeMap<Section, String>,
    /// Single figures not measured while the rest of their section was.
    skipped_figures: BTreeMap<String, String>,
}

impl Figures {
    /// Records a figure (and prints it, so a run that fails later shows it).
    pub(crate) fn put(&mut self, k: impl Into<String>, v: f64) {
        let k = k.into();
        eprintln!("  {k} = {v:.3}");
        self.values.insert(k, v);
    }

    pub(crate) fn get(&self, k: &str) -> Option<f64> {
        self.values.get(k).copied()
    }

    /// Records that `section` was not measured, and why.
    pub(crate) fn skip(&mut self, section: Section, reason: impl Into<String>) {
        let reason = reason.into();
        eprintln!("  {} skipped: {reason}", section.name());
        self.skipped.entry(section).or_insert(reason);
    }

    /// Records that one figure of an otherwise measured section was not
    /// measured, and why.
    pub(crate) fn skip_figure(&mut self, figure: &str, reason: impl Into<String>) {
        let reason = reason.into();
        eprintln!("  {figure} skipped: {reason}");
        self.skipped_figures.insert(figure.to_owned(), reason);
    }

    /// Why `figure` (of `section`) is absent: its own reason, else its
    /// section's, else `None`.
    fn reason(&self, figure: &str, section: Section) -> Option<&str> {
        self.skipped_figures.get(figure).or_else(|| self.skipped.get(&section)).map(String::as_str)
    }

    /// Writes `summary.json` (every figure, `skipped` by section, and
    /// `skipped_figures`: each promised figure not measured, with its reason)
    /// and prints the figures as a Markdown table.
    pub(crate) fn write(&self, out: &Path, header: &[(&str, &str)]) -> Result<(), LabError> {
        let mut summary = serde_json::Map::new();
        for (k, v) in &self.values {
            summary.insert(k.clone(), json!(v));
        }
        for (k, v) in header {
            summary.insert((*k).into(), json!(v));
        }
        let skipped: serde_json::Map<String, Value> =
            self.skipped.iter().map(|(s, r)| (s.name().to_owned(), json!(r))).collect();
        summary.insert("skipped".into(), Value::Object(skipped));
        let absent: serde_json::Map<String, Value> = PROMISED
            .iter()
            .filter(|(k, _)| !self.values.get(*k).is_some_and(|v| v.is_finite()))
            .map(|(k, s)| {
                ((*k).to_owned(), json!(self.reason(k, *s).unwrap_or("missing: not measured, no reason given")))
            })
            .collect();
        summary.insert("skipped_figures".into(), Value::Object(absent));
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir).map_err(|e| LabError::io(format!("cannot create {}", dir.display()), e))?;
        }
        std::fs::write(out, Value::Object(summary).to_string())
            .map_err(|e| LabError::io(format!("cannot write {}", out.display()), e))?;
        println!("| figure | value |\n|---|---|");
        for (k, v) in &self.values {
            println!("| `{k}` | {v:.3} |");
        }
        for (k, v) in header {
            println!("| `{k}` | {v} |");
        }
        for (s, r) in &self.skipped {
            println!("| `{}` | skipped: {r} |", s.name());
        }
        Ok(())
    }

    /// The smoke check: every promised figure is present and finite, or its
    /// section was skipped with a reason; with `strict` (under `CI`), only
    /// the seed's failover may be skipped. No thresholds.
    pub(crate) fn check(&self, strict: bool) -> Result<(), LabError> {
        let mut wrong = Vec::new();
        for (k, section) in PROMISED {
            match (self.values.get(*k), self.reason(k, *section)) {
                (Some(v), _) if v.is_finite() => {}
                (Some(v), _) => wrong.push(format!("{k} = {v} (not finite)")),
                (None, Some(_)) if *section != Core && (!strict || section.may_skip_under_ci()) => {}
                (None, Some(r)) => {
                    wrong.push(format!("{k}: {} skipped ({r}), which this run may not skip", section.name()))
                }
                (None, None) => wrong.push(format!("{k}: missing")),
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(LabError::MissingFigures(wrong))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn promised(k: &str) -> bool {
        PROMISED.iter().any(|(p, _)| *p == k)
    }

    #[test]
    fn every_shape_and_agenda_setting_is_promised() {
        for shape in SHAPES {
            for suffix in ["tasks_per_s", "commands_per_task", "vs_raw_queue", "vs_agenda"] {
                assert!(promised(&format!("queue_{shape}_{suffix}")), "queue_{shape}_{suffix}");
            }
        }
        for a in AGENDA_SWEEP {
            for suffix in ["tasks_per_s", "commands_per_task"] {
                assert!(promised(&format!("agenda_{}_{suffix}", a.name)), "{} {suffix}", a.name);
            }
        }
        for n in super::super::scaling::PROCESSES {
            for suffix in ["tasks_per_s", "commands_per_task"] {
                assert!(promised(&format!("scaling_{n}_processes_{suffix}")), "scaling_{n} {suffix}");
            }
        }
        for role in crate::bench::idle::ROLES {
            for suffix in ["commands_per_min", "cpu_s_per_min", "rss_mb"] {
                assert!(promised(&format!("idle_{role}_{suffix}")), "idle_{role}_{suffix}");
            }
        }
        let names: std::collections::BTreeSet<_> = PROMISED.iter().map(|(k, _)| k).collect();
        assert_eq!(names.len(), PROMISED.len(), "a figure promised twice");
    }

    #[test]
    fn the_check_wants_every_figure_or_a_reason() {
        let mut f = Figures::default();
        // What the check says is wrong, or `None` when it passes.
        let check = |f: &Figures, strict: bool| f.check(strict).err().map(|e| e.to_string());
        for (k, _) in PROMISED {
            f.values.insert((*k).to_owned(), 1.0);
        }
        assert_eq!(check(&f, true), None);
        f.values.insert("raw_fam_per_s".into(), f64::NAN);
        assert!(check(&f, false).is_some_and(|e| e.contains("raw_fam_per_s")));
        f.values.insert("raw_fam_per_s".into(), 1.0);
        f.values.remove("agenda_best_tasks_per_s");
        assert!(check(&f, false).is_some_and(|e| e.contains("agenda_best_tasks_per_s: missing")));
        f.skip(Section::Agenda, "no node");
        assert_eq!(check(&f, false), None);
        assert!(check(&f, true).is_some_and(|e| e.contains("agenda_best_tasks_per_s: agenda skipped")));
        f.values.insert("agenda_best_tasks_per_s".into(), 1.0);
        f.skipped.clear();
        f.values.remove("seed_failover_s_p50");
        f.skip(Section::SeedFailover, "full runs only");
        assert_eq!(check(&f, true), None);
        f.values.remove("seed_handover_ms_p50");
        f.skip(Section::Seed, "MONGOCOORD_BENCH_SKIP");
        assert_eq!(check(&f, false), None);
        assert!(check(&f, true).is_some_and(|e| e.contains("seed_handover_ms_p50: seed skipped")));
        f.values.remove("pickup_ms_p50");
        f.skip(Section::Core, "no reason can excuse it");
        assert!(check(&f, false).is_some_and(|e| e.contains("pickup_ms_p50")));
    }
}
