//! The README's Performance table, written from bench summaries
//! (`lab bench-table`, which `cargo xtask bench-table` runs): one column per
//! summary (a server), so no figure in it is ever copied by hand. It replaces
//! what lies between [`START`] and [`END`] in the README.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::error::LabError;

/// The line before the generated table.
pub(crate) const START: &str =
    "<!-- bench-table: written by `cargo xtask bench-table` from target/bench/summary-*.json; do not edit by hand -->";
/// The line after it.
pub(crate) const END: &str = "<!-- /bench-table -->";

/// How a figure is shown.
#[derive(Debug, Clone, Copy)]
enum Unit {
    /// Per second.
    PerS,
    /// Milliseconds.
    Ms,
    /// Microseconds, shown in milliseconds.
    UsAsMs,
    /// Seconds.
    S,
    /// A ratio.
    Times,
    /// Megabytes.
    Mb,
    /// A bare number.
    Plain,
}

/// The rows: a label, then the figures shown in its cells, joined by " / ".
const ROWS: &[(&str, &[(&str, Unit)])] = &[
    (
        "raw `findAndModify` upsert, one client: calls/s, p50",
        &[("raw_fam_per_s", Unit::PerS), ("raw_fam_p50_us", Unit::UsAsMs)],
    ),
    (
        "lock acquire + release cycles (ours / the seed's)",
        &[("lock_cycles_per_s", Unit::PerS), ("seed_lock_cycles_per_s", Unit::PerS)],
    ),
    ("lock acquire p50 / p99", &[("lock_acquire_p50_us", Unit::UsAsMs), ("lock_acquire_p99_us", Unit::UsAsMs)]),
    (
        "lock acquire ÷ raw p50; ÷ a minimal lock pipeline",
        &[("lock_acquire_vs_raw", Unit::Times), ("lock_vs_minimal_pipeline", Unit::Times)],
    ),
    (
        "lock handover, release → waiter holds it, p50 / p99",
        &[("handover_ms_p50", Unit::Ms), ("handover_ms_p99", Unit::Ms)],
    ),
    (
        "election handover after a clean stop, 3 processes, ttl 3 s (ours / the seed's)",
        &[("elector_handover_ms_p50", Unit::Ms), ("seed_handover_ms_p50", Unit::Ms)],
    ),
    (
        "failover after `kill -9` of the leader, ttl 3 s: p50, ÷ ttl",
        &[("failover_s_p50", Unit::S), ("failover_over_ttl", Unit::Times)],
    ),
    (
        "failover overhead, lease lapsed (server clock) → next leader's command, p50",
        &[("failover_overhead_ms_p50", Unit::Ms)],
    ),
    ("the seed's failover after `kill -9` (waits for the TTL monitor)", &[("seed_failover_s_p50", Unit::S)]),
    ("tasks per queue run", &[("queue_tasks", Unit::Plain)]),
    (
        "raw claim (filter + sort) + fenced complete loop: tasks/s, commands per task",
        &[("raw_queue_per_s", Unit::PerS), ("raw_queue_commands_per_task", Unit::Plain)],
    ),
    (
        "queue, 4 agents each on its own `Queue`: tasks/s, ÷ raw loop, commands per task",
        &[
            ("queue_per_agent_tasks_per_s", Unit::PerS),
            ("queue_per_agent_vs_raw_queue", Unit::Times),
            ("queue_per_agent_commands_per_task", Unit::Plain),
        ],
    ),
    (
        "queue, 4 agent processes: tasks/s, ÷ raw loop, commands per task",
        &[
            ("queue_processes_tasks_per_s", Unit::PerS),
            ("queue_processes_vs_raw_queue", Unit::Times),
            ("queue_processes_commands_per_task", Unit::Plain),
        ],
    ),
    (
        "queue, 4 agents sharing one `Queue`: tasks/s, ÷ raw loop, commands per task",
        &[
            ("queue_shared_tasks_per_s", Unit::PerS),
            ("queue_shared_vs_raw_queue", Unit::Times),
            ("queue_shared_commands_per_task", Unit::Plain),
        ],
    ),
    (
        "queue, as each on its own `Queue`, tasks in 100 groups of one at a time: tasks/s, ÷ ungrouped, commands per task",
        &[
            ("queue_grouped_100_tasks_per_s", Unit::PerS),
            ("queue_grouped_100_vs_per_agent", Unit::Times),
            ("queue_grouped_100_commands_per_task", Unit::Plain),
        ],
    ),
    (
        "agent processes on one queue, 1 / 2 / 4 / 8 / 16: tasks/s",
        &[
            ("scaling_1_processes_tasks_per_s", Unit::PerS),
            ("scaling_2_processes_tasks_per_s", Unit::PerS),
            ("scaling_4_processes_tasks_per_s", Unit::PerS),
            ("scaling_8_processes_tasks_per_s", Unit::PerS),
            ("scaling_16_processes_tasks_per_s", Unit::PerS),
        ],
    ),
    (
        "the same: commands per task",
        &[
            ("scaling_1_processes_commands_per_task", Unit::Plain),
            ("scaling_2_processes_commands_per_task", Unit::Plain),
            ("scaling_4_processes_commands_per_task", Unit::Plain),
            ("scaling_8_processes_commands_per_task", Unit::Plain),
            ("scaling_16_processes_commands_per_task", Unit::Plain),
        ],
    ),
    ("a global concurrency of 1,000 that never binds, ÷ none", &[("queue_global_1000_vs_shared", Unit::Times)]),
    (
        "Agenda at its best setting of the sweep: jobs/s (`lockLimit`, `processEvery` ms, concurrency, instances)",
        &[
            ("agenda_best_tasks_per_s", Unit::PerS),
            ("agenda_best_lock_limit", Unit::Plain),
            ("agenda_best_process_every_ms", Unit::Plain),
            ("agenda_best_concurrency", Unit::Plain),
            ("agenda_best_instances", Unit::Plain),
        ],
    ),
    (
        "queue ÷ Agenda at its best: 4 agents on their own `Queue`s / 4 processes",
        &[("queue_per_agent_vs_agenda", Unit::Times), ("queue_processes_vs_agenda", Unit::Times)],
    ),
    (
        "idle pickup, enqueue → handler start, p50 / p99 (Agenda at its defaults)",
        &[("pickup_ms_p50", Unit::Ms), ("pickup_ms_p99", Unit::Ms), ("agenda_pickup_ms_p50", Unit::Ms)],
    ),
    ("a producer's `Queue::wait_for`, enqueue → result seen, p50", &[("wait_for_ms_p50", Unit::Ms)]),
    (
        "lifecycle events to one subscriber: events/s, per task",
        &[("queue_events_per_s", Unit::PerS), ("queue_events_per_task", Unit::Plain)],
    ),
    (
        "schedule tick → command start, 3 `cron` processes, p50 / p99",
        &[("schedule_tick_lag_ms_p50", Unit::Ms), ("schedule_tick_lag_ms_p99", Unit::Ms)],
    ),
    (
        "idle `agent`, empty queue: commands/min, CPU s/min, RSS",
        &[
            ("idle_agent_commands_per_min", Unit::Plain),
            ("idle_agent_cpu_s_per_min", Unit::S),
            ("idle_agent_rss_mb", Unit::Mb),
        ],
    ),
    (
        "idle `elect` follower: commands/min, CPU s/min, RSS",
        &[
            ("idle_follower_commands_per_min", Unit::Plain),
            ("idle_follower_cpu_s_per_min", Unit::S),
            ("idle_follower_rss_mb", Unit::Mb),
        ],
    ),
    (
        "`lock` waiting for a held lock: commands/min, CPU s/min, RSS",
        &[
            ("idle_waiter_commands_per_min", Unit::Plain),
            ("idle_waiter_cpu_s_per_min", Unit::S),
            ("idle_waiter_rss_mb", Unit::Mb),
        ],
    ),
    (
        "`cron` between ticks: commands/min, CPU s/min, RSS",
        &[
            ("idle_cron_commands_per_min", Unit::Plain),
            ("idle_cron_cpu_s_per_min", Unit::S),
            ("idle_cron_rss_mb", Unit::Mb),
        ],
    ),
    (
        "idle Agenda at its defaults: commands/min, CPU s/min, RSS (commands/min at `processEvery` 100 ms)",
        &[
            ("agenda_idle_commands_per_min", Unit::Plain),
            ("agenda_idle_cpu_s_per_min", Unit::S),
            ("agenda_idle_rss_mb", Unit::Mb),
            ("agenda_idle_every_100ms_commands_per_min", Unit::Plain),
        ],
    ),
    ("elector simulation on the memory store: store ops/s", &[("sim_steps_per_s", Unit::PerS)]),
];

/// A figure as the table shows it, or "–" when the summary lacks it.
fn cell(summary: &Value, figure: &str, unit: Unit) -> String {
    let Some(v) = summary.get(figure).and_then(Value::as_f64).filter(|v| v.is_finite()) else {
        return "–".into();
    };
    let n = |v: f64| {
        if v.abs() >= 100.0 {
            format!("{v:.0}")
        } else if v.abs() >= 10.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.2}")
        }
    };
    match unit {
        Unit::PerS => format!("{}/s", n(v)),
        Unit::Ms => format!("{} ms", n(v)),
        Unit::UsAsMs => format!("{} ms", n(v / 1e3)),
        Unit::S => format!("{} s", n(v)),
        Unit::Times => format!("{}×", n(v)),
        Unit::Mb => format!("{} MB", n(v)),
        // A setting: whole numbers as such.
        Unit::Plain if v.fract() == 0.0 => format!("{v:.0}"),
        Unit::Plain => n(v),
    }
}

fn text<'a>(summary: &'a Value, key: &str) -> &'a str {
    summary.get(key).and_then(Value::as_str).unwrap_or("?")
}

/// A column of the table: a summary's, or one kept from the table as it was
/// (a server whose summary is not here: its figures, and the line saying
/// where they came from, stay as a run on it wrote them).
enum Column {
    /// From a summary.
    Summary(Value),
    /// Kept from the table as it was.
    Kept {
        /// The server's name (the column's header).
        name: String,
        /// Its line saying where the figures come from.
        line: String,
        /// Its cells, by row label.
        cells: std::collections::HashMap<String, String>,
    },
}

impl Column {
    fn name(&self) -> &str {
        match self {
            Column::Summary(s) => text(s, "server_name"),
            Column::Kept { name, .. } => name,
        }
    }

    fn line(&self) -> String {
        match self {
            Column::Summary(s) => format!(
                "- **{}**: {} (version {}), a `{}` run of commit `{}` on {}.",
                text(s, "server_name"),
                text(s, "server"),
                text(s, "server_version"),
                text(s, "mode"),
                text(s, "commit"),
                text(s, "date"),
            ),
            Column::Kept { line, .. } => line.clone(),
        }
    }

    fn cell(&self, label: &str, figures: &[(&str, Unit)]) -> String {
        match self {
            Column::Summary(s) => figures.iter().map(|(f, u)| cell(s, f, *u)).collect::<Vec<_>>().join(" / "),
            // A row whose settings in parentheses grew since the column was
            // written keeps its cell, the figures that run had; only where one
            // old row alone has its head, so that no other row's cell is taken.
            Column::Kept { cells, .. } => cells
                .get(label)
                .or_else(|| {
                    let mut same = cells.iter().filter(|(old, _)| before_settings(old) == before_settings(label));
                    match (same.next(), same.next()) {
                        (Some((_, c)), None) => Some(c),
                        _ => None,
                    }
                })
                .cloned()
                .unwrap_or_else(|| "–".into()),
        }
    }
}

/// A row's label without the settings it names in parentheses.
fn before_settings(label: &str) -> &str {
    label.split_once(" (").map_or(label, |(head, _)| head)
}

/// The columns of `old` (the text between the markers) whose server is not
/// in `fresh`.
fn kept_columns(old: &str, fresh: &[&str]) -> Vec<Column> {
    let rows: Vec<Vec<String>> = old
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
        .map(|l| l.trim().trim_matches('|').split(" | ").map(|c| c.trim().to_owned()).collect())
        .collect();
    let Some(header) = rows.first().filter(|h| h.first().is_some_and(|f| f == "figure")) else { return Vec::new() };
    let mut out = Vec::new();
    for (i, name) in header.iter().enumerate().skip(1) {
        if fresh.contains(&name.as_str()) {
            continue;
        }
        let prefix = format!("- **{name}**:");
        let Some(line) = old.lines().find(|l| l.starts_with(&prefix)) else { continue };
        let cells = rows[1..].iter().filter_map(|r| Some((r.first()?.clone(), r.get(i)?.clone()))).collect();
        out.push(Column::Kept { name: name.clone(), line: line.to_owned(), cells });
    }
    out
}

/// The table, with a line per column saying where its figures come from.
fn render_columns(columns: &[Column]) -> String {
    let mut out = String::new();
    for c in columns {
        let _ = writeln!(out, "{}", c.line());
    }
    out.push_str("\n| figure |");
    for c in columns {
        let _ = write!(out, " {} |", c.name());
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(columns.len()));
    out.push('\n');
    for (label, figures) in ROWS {
        let _ = write!(out, "| {label} |");
        for c in columns {
            let _ = write!(out, " {} |", c.cell(label, figures));
        }
        out.push('\n');
    }
    out
}

/// Why a summary may not stand in the README.
#[derive(Debug, PartialEq, Eq)]
enum Unpublishable {
    /// A quick or smoke run: its figures compare within the run only.
    Mode(String),
    /// Its strict check failed, saying how.
    CheckFailed(String),
    /// A run from before the check was recorded.
    NoCheck,
}

impl std::fmt::Display for Unpublishable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unpublishable::Mode(mode) => write!(f, "a {mode} run"),
            Unpublishable::CheckFailed(how) => write!(f, "its check {how}"),
            Unpublishable::NoCheck => f.write_str("it records no check (a run before the check was recorded)"),
        }
    }
}

/// Whether a summary may stand in the README: a full run's (a quick one's
/// figures compare within the run only) whose strict check passed.
fn publishable(summary: &Value) -> Result<(), Unpublishable> {
    match (text(summary, "mode"), summary.get("check").and_then(Value::as_str)) {
        ("full", Some("passed")) => Ok(()),
        ("full", Some(failed)) => Err(Unpublishable::CheckFailed(failed.to_owned())),
        ("full", None) => Err(Unpublishable::NoCheck),
        (mode, _) => Err(Unpublishable::Mode(mode.to_owned())),
    }
}

/// The table of `summaries`, a column each.
#[cfg(test)]
fn render(summaries: &[Value]) -> String {
    render_columns(&summaries.iter().cloned().map(Column::Summary).collect::<Vec<_>>())
}

/// Rewrites the table between the markers of `readme` from `summaries`; the
/// column of a server with no summary here is kept as it was, so a run on
/// one server leaves the other's figures (and where they came from) alone.
pub(crate) fn rewrite(readme: &Path, summaries: &[&Path]) -> Result<(), LabError> {
    let mut values = Vec::new();
    for path in summaries {
        let text =
            std::fs::read_to_string(path).map_err(|e| LabError::io(format!("cannot read {}", path.display()), e))?;
        let value = serde_json::from_str::<Value>(&text)
            .map_err(|e| LabError::Json { what: format!("{} is not a summary", path.display()), source: e })?;
        match publishable(&value) {
            Ok(()) => values.push(value),
            Err(why) => {
                eprintln!("lab bench-table: {} is not published ({why}); its server's column stays", path.display())
            }
        }
    }
    if values.is_empty() {
        return Err(LabError::invalid(
            "no summary of a full run that kept every promise to write a table from (run `cargo xtask bench`)",
        ));
    }
    let doc =
        std::fs::read_to_string(readme).map_err(|e| LabError::io(format!("cannot read {}", readme.display()), e))?;
    let (Some(start), Some(end)) = (doc.find(START), doc.find(END)) else {
        return Err(LabError::invalid(format!("{} has no {START:?} … {END:?} markers", readme.display())));
    };
    if end < start {
        return Err(LabError::invalid(format!("{}: the table's end marker comes before its start", readme.display())));
    }
    let fresh: Vec<&str> = values.iter().map(|v| text(v, "server_name")).collect();
    let kept = kept_columns(&doc[start + START.len()..end], &fresh);
    let mut columns: Vec<Column> = values.into_iter().map(Column::Summary).chain(kept).collect();
    columns.sort_by(|a, b| a.name().cmp(b.name()));
    let new = format!("{}{START}\n{}{}", &doc[..start], render_columns(&columns), &doc[end..]);
    std::fs::write(readme, new).map_err(|e| LabError::io(format!("cannot write {}", readme.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_row_shows_promised_figures() {
        for (label, figures) in ROWS {
            for (f, _) in *figures {
                assert!(
                    super::super::figures::PROMISED.iter().any(|(p, _)| p == f),
                    "row {label:?} shows {f}, which no run promises"
                );
            }
        }
    }

    #[test]
    fn a_server_without_a_summary_keeps_its_column() {
        let dir = std::env::temp_dir().join(format!("bench-table-kept-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (readme, py_path, rs_path) = (dir.join("README.md"), dir.join("py.json"), dir.join("rs.json"));
        std::fs::write(&readme, format!("{START}\nold\n{END}\n")).unwrap();
        let py = json!({"server_name": "py", "mode": "full", "check": "passed", "commit": "aaa", "raw_fam_per_s": 900.0, "raw_fam_p50_us": 1100.0});
        let rs = json!({"server_name": "rs", "mode": "full", "check": "passed", "commit": "bbb", "raw_fam_per_s": 3500.0, "raw_fam_p50_us": 300.0});
        std::fs::write(&py_path, py.to_string()).unwrap();
        std::fs::write(&rs_path, rs.to_string()).unwrap();
        rewrite(&readme, &[&py_path, &rs_path]).unwrap();
        // A later run on py alone: rs's column and its line stay.
        let py2 = json!({"server_name": "py", "mode": "full", "check": "passed", "commit": "ccc", "raw_fam_per_s": 1000.0, "raw_fam_p50_us": 1000.0});
        std::fs::write(&py_path, py2.to_string()).unwrap();
        rewrite(&readme, &[&py_path]).unwrap();
        let doc = std::fs::read_to_string(&readme).unwrap();
        assert!(doc.contains("| figure | py | rs |"), "{doc}");
        assert!(doc.contains("| 1000/s / 1.00 ms | 3500/s / 0.30 ms |"), "{doc}");
        assert!(doc.contains("commit `ccc`") && doc.contains("commit `bbb`") && !doc.contains("commit `aaa`"), "{doc}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_kept_cell_follows_its_row_when_the_row_names_more_settings() {
        let (label, _) = ROWS.iter().find(|(l, _)| l.starts_with("Agenda at its best")).unwrap();
        let (head, _) = label.split_once(" (").unwrap();
        let old = format!(
            "- **py**: an old run.\n\n| figure | py |\n|---|---|\n| {head} (`lockLimit`) | 10.2/s / 0.00 |\n| other | 1 |\n"
        );
        let kept = kept_columns(&old, &["rs"]);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].cell(label, &[]), "10.2/s / 0.00");
        assert_eq!(kept[0].cell("a row it never had (x)", &[]), "–");
        // Two old rows with that head: neither is taken for the other.
        let two =
            format!("- **py**: an old run.\n\n| figure | py |\n|---|---|\n| {head} (a) | 1 |\n| {head} (b) | 2 |\n");
        assert_eq!(kept_columns(&two, &["rs"])[0].cell(label, &[]), "–");
    }

    #[test]
    fn a_table_has_a_column_per_summary_and_marks_what_is_missing() {
        let py = json!({"server_name": "py", "server": "SecantusDB 0.7.0b3", "raw_fam_per_s": 901.4, "raw_fam_p50_us": 1110.0});
        let rs = json!({"server_name": "rs", "raw_fam_per_s": 3512.0});
        let t = render(&[py, rs]);
        assert!(t.contains("| figure | py | rs |"), "{t}");
        assert!(t.contains("| 901/s / 1.11 ms | 3512/s / – |"), "{t}");
        assert!(t.contains("- **py**: SecantusDB 0.7.0b3 (version ?)"), "{t}");
    }

    #[test]
    fn only_a_full_run_that_kept_its_promises_is_published() {
        assert!(publishable(&json!({"mode": "full", "check": "passed"})).is_ok());
        assert_eq!(publishable(&json!({"mode": "full"})), Err(Unpublishable::NoCheck));
        let failed = publishable(&json!({"mode": "full", "check": "failed: x: missing"}));
        assert!(failed.is_err_and(|e| e.to_string().contains("x: missing")));
        assert!(
            publishable(&json!({"mode": "quick", "check": "passed"})).is_err_and(|e| e.to_string() == "a quick run")
        );
        assert!(publishable(&json!({})).is_err());
    }

    #[test]
    fn rewrite_replaces_only_what_lies_between_the_markers() {
        let dir = std::env::temp_dir().join(format!("lab-table-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let readme = dir.join("README.md");
        let summary = dir.join("summary-py.json");
        std::fs::write(&readme, format!("# T\nbefore\n{START}\nold table\n{END}\nafter\n")).unwrap();
        std::fs::write(
            &summary,
            r#"{"server_name": "py", "mode": "full", "check": "passed", "sim_steps_per_s": 249000.0}"#,
        )
        .unwrap();
        rewrite(&readme, &[&summary]).unwrap();
        let doc = std::fs::read_to_string(&readme).unwrap();
        assert!(doc.starts_with(&format!("# T\nbefore\n{START}\n")), "{doc}");
        assert!(doc.ends_with(&format!("{END}\nafter\n")), "{doc}");
        assert!(!doc.contains("old table") && doc.contains("249000/s"), "{doc}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
