//! A bench report written from summaries (`lab bench-report`, which
//! `cargo xtask bench-report` runs): every promised figure of each summary
//! side by side, the change from the first summary to each other one, and
//! the bench's targets checked per summary. Two runs of one server, before
//! and after a change, are how a change shows that the figures held.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::figures::PROMISED;
use crate::error::LabError;

/// Which way a figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Better {
    Higher,
    Lower,
    /// A size or a setting: no better way.
    Neither,
}

/// Which way `figure` is better, from its name: rates and our ratios over a
/// baseline or a peer are better higher; times, commands, CPU, memory, and
/// ratios of our cost over a baseline's, lower.
fn better(figure: &str) -> Better {
    const NEITHER: [&str; 7] = [
        "queue_tasks",
        "queue_global_1000_pair_tasks",
        "agenda_best_lock_limit",
        "agenda_best_process_every_ms",
        "agenda_best_concurrency",
        "agenda_best_instances",
        "queue_events_per_task",
    ];
    const LOWER_RATIOS: [&str; 3] = ["lock_acquire_vs_raw", "lock_vs_minimal_pipeline", "failover_over_ttl"];
    if NEITHER.contains(&figure) {
        Better::Neither
    } else if LOWER_RATIOS.contains(&figure) {
        Better::Lower
    } else if figure.ends_with("_per_s") || figure.contains("_vs_") {
        Better::Higher
    } else {
        Better::Lower
    }
}

/// A target of the bench: a figure, a bound, and the servers it holds on.
struct Target {
    figure: &'static str,
    /// At most (`true`) or at least.
    at_most: bool,
    bound: f64,
    /// The summary's `server_name` it applies to; `None`: every server.
    server: Option<&'static str>,
}

const fn t(figure: &'static str, at_most: bool, bound: f64, server: Option<&'static str>) -> Target {
    Target { figure, at_most, bound, server }
}

/// The targets of the bench (docs/performance.md, "Targets", says why).
const TARGETS: &[Target] = &[
    t("queue_processes_vs_agenda", false, 2.0, None),
    t("queue_per_agent_vs_raw_queue", false, 0.9, None),
    t("queue_processes_vs_raw_queue", false, 0.9, None),
    t("queue_per_agent_commands_per_task", true, 1.2, None),
    t("queue_processes_commands_per_task", true, 1.2, None),
    t("lock_vs_minimal_pipeline", true, 1.0, None),
    t("pickup_ms_p50", true, 20.0, Some("py")),
    t("pickup_ms_p50", true, 10.0, Some("rs")),
    t("elector_handover_ms_p50", true, 25.0, None),
    t("idle_agent_commands_per_min", true, 2.0, None),
    t("idle_agent_cpu_s_per_min", true, 0.1, None),
];

fn number(summary: &Value, figure: &str) -> Option<f64> {
    summary.get(figure).and_then(Value::as_f64).filter(|v| v.is_finite())
}

fn text<'a>(summary: &'a Value, key: &str) -> &'a str {
    summary.get(key).and_then(Value::as_str).unwrap_or("?")
}

fn shown(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.3}"),
    }
}

/// The change from `before` to `after`, and whether it is better, worse, or
/// within 5% (noise between two runs of one machine).
fn change(figure: &str, before: Option<f64>, after: Option<f64>) -> String {
    let (Some(b), Some(a)) = (before, after) else { return "–".into() };
    if b == 0.0 {
        // No ratio to 0, but the change still has a direction.
        return match better(figure) {
            _ if a == 0.0 => "same".into(),
            Better::Neither => "from 0".into(),
            Better::Higher if a > 0.0 => "from 0, better".into(),
            Better::Lower if a < 0.0 => "from 0, better".into(),
            _ => "from 0, **worse**".into(),
        };
    }
    let ratio = a / b;
    let verdict = match better(figure) {
        _ if (ratio - 1.0).abs() <= 0.05 => "same",
        Better::Neither => "",
        Better::Higher if ratio > 1.0 => "better",
        Better::Lower if ratio < 1.0 => "better",
        _ => "**worse**",
    };
    format!("{ratio:.2}× {verdict}").trim_end().to_owned()
}

/// The report of `summaries`, labelled by their file names.
fn render(summaries: &[(String, Value)]) -> String {
    let mut out = String::from(
        "# Bench report\n\nWritten by `cargo xtask bench-report` from the summaries below; do not edit by hand.\n\n",
    );
    out.push_str("| | ");
    out.push_str(&summaries.iter().map(|(name, _)| format!("`{name}`")).collect::<Vec<_>>().join(" | "));
    out.push_str(" |\n|---|");
    out.push_str(&"---|".repeat(summaries.len()));
    out.push('\n');
    for key in ["server", "commit", "date", "mode"] {
        let cells: Vec<&str> = summaries.iter().map(|(_, s)| text(s, key)).collect();
        let _ = writeln!(out, "| {key} | {} |", cells.join(" | "));
    }

    out.push_str("\n## Targets\n\n| target | ");
    out.push_str(&summaries.iter().map(|(name, _)| format!("`{name}`")).collect::<Vec<_>>().join(" | "));
    out.push_str(" |\n|---|");
    out.push_str(&"---|".repeat(summaries.len()));
    out.push('\n');
    for target in TARGETS {
        let op = if target.at_most { "≤" } else { "≥" };
        let on = target.server.map(|s| format!(" (on {s})")).unwrap_or_default();
        let cells: Vec<String> = summaries
            .iter()
            .map(|(_, s)| match (target.server, number(s, target.figure)) {
                (Some(server), _) if text(s, "server_name") != server => "n/a".into(),
                // A smoke run's figures are of a tiny size, on a debug build.
                (_, Some(v)) if text(s, "mode") == "smoke" => format!("{} (smoke: not judged)", shown(Some(v))),
                (_, None) => "–".into(),
                (_, Some(v)) => {
                    let met = if target.at_most { v <= target.bound } else { v >= target.bound };
                    format!("{} {}", shown(Some(v)), if met { "✓" } else { "✗" })
                }
            })
            .collect();
        let _ = writeln!(out, "| `{}` {op} {}{on} | {} |", target.figure, target.bound, cells.join(" | "));
    }

    out.push_str("\n## Figures\n\n| figure | ");
    out.push_str(&summaries.iter().map(|(name, _)| format!("`{name}`")).collect::<Vec<_>>().join(" | "));
    for (name, _) in summaries.iter().skip(1) {
        let _ = write!(out, " | `{name}` ÷ first");
    }
    out.push_str(" |\n|---|");
    out.push_str(&"---|".repeat(2 * summaries.len() - 1));
    out.push('\n');
    for (figure, _) in PROMISED {
        let values: Vec<Option<f64>> = summaries.iter().map(|(_, s)| number(s, figure)).collect();
        let mut cells: Vec<String> = values.iter().map(|v| shown(*v)).collect();
        cells.extend(values.iter().skip(1).map(|v| change(figure, values[0], *v)));
        let _ = writeln!(out, "| `{figure}` | {} |", cells.join(" | "));
    }
    out
}

/// Writes the report of `summaries` to `out`.
pub(crate) fn write(out: &Path, summaries: &[&Path]) -> Result<(), LabError> {
    let mut read = Vec::new();
    for path in summaries {
        let text =
            std::fs::read_to_string(path).map_err(|e| LabError::io(format!("cannot read {}", path.display()), e))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| LabError::Unreadable(format!("{} is not a bench summary: {e}", path.display())))?;
        // JSON that is no summary would make a report of dashes.
        if ["server", "mode"].iter().any(|k| value.get(k).and_then(Value::as_str).is_none()) {
            return Err(LabError::Unreadable(format!(
                "{} is not a bench summary: it has no \"server\" and \"mode\"",
                path.display()
            )));
        }
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        read.push((name, value));
    }
    std::fs::write(out, render(&read)).map_err(|e| LabError::io(format!("cannot write {}", out.display()), e))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn json_that_is_no_summary_is_refused() {
        let dir = std::env::temp_dir().join(format!("lab-bench-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (empty, out) = (dir.join("empty.json"), dir.join("report.md"));
        std::fs::write(&empty, "{}").unwrap();
        let refused = write(&out, &[empty.as_path()]);
        assert!(
            matches!(&refused, Err(LabError::Unreadable(m)) if m.contains("is not a bench summary")),
            "{refused:?}"
        );
        assert!(!out.exists(), "no report of dashes");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn directions_follow_the_figures_meaning() {
        assert_eq!(better("queue_per_agent_tasks_per_s"), Better::Higher);
        assert_eq!(better("queue_processes_vs_agenda"), Better::Higher);
        assert_eq!(better("queue_per_agent_vs_raw_queue"), Better::Higher);
        assert_eq!(better("lock_vs_minimal_pipeline"), Better::Lower);
        assert_eq!(better("pickup_ms_p50"), Better::Lower);
        assert_eq!(better("queue_processes_commands_per_task"), Better::Lower);
        assert_eq!(better("idle_agent_rss_mb"), Better::Lower);
        assert_eq!(better("queue_tasks"), Better::Neither);
    }

    #[test]
    fn a_change_is_judged_by_direction_beyond_noise() {
        assert_eq!(change("pickup_ms_p50", Some(10.0), Some(8.0)), "0.80× better");
        assert_eq!(change("queue_per_agent_tasks_per_s", Some(100.0), Some(80.0)), "0.80× **worse**");
        assert_eq!(change("queue_per_agent_tasks_per_s", Some(100.0), Some(103.0)), "1.03× same");
        assert_eq!(change("queue_tasks", Some(400.0), Some(2000.0)), "5.00×");
        assert_eq!(change("pickup_ms_p50", None, Some(8.0)), "–");
        assert_eq!(change("idle_agent_cpu_s_per_min", Some(0.0), Some(0.3)), "from 0, **worse**");
        assert_eq!(change("queue_per_agent_tasks_per_s", Some(0.0), Some(3.0)), "from 0, better");
        assert_eq!(change("queue_tasks", Some(0.0), Some(0.0)), "same");
    }

    #[test]
    fn targets_are_checked_per_server_and_figures_compared_to_the_first() {
        let before = json!({"server": "secantusd-rs", "server_name": "rs", "commit": "aaa", "pickup_ms_p50": 12.0, "lock_vs_minimal_pipeline": 1.04});
        let after = json!({"server": "secantusd-rs", "server_name": "rs", "commit": "bbb", "pickup_ms_p50": 9.0, "lock_vs_minimal_pipeline": 0.98});
        let report = render(&[("before.json".into(), before), ("after.json".into(), after)]);
        assert!(report.contains("| `pickup_ms_p50` ≤ 20 (on py) | n/a | n/a |"), "{report}");
        assert!(report.contains("| `pickup_ms_p50` ≤ 10 (on rs) | 12.0 ✗ | 9.000 ✓ |"), "{report}");
        assert!(report.contains("| `lock_vs_minimal_pipeline` | 1.040 | 0.980 | 0.94× better |"), "{report}");
        assert!(report.contains("| commit | aaa | bbb |"), "{report}");
        let smoke = json!({"server": "secantusd-rs", "server_name": "rs", "mode": "smoke", "pickup_ms_p50": 9.0});
        let report = render(&[("smoke.json".into(), smoke)]);
        assert!(report.contains("| `pickup_ms_p50` ≤ 10 (on rs) | 9.000 (smoke: not judged) |"), "{report}");
    }
}
