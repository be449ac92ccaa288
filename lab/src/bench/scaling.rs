//! Throughput against the number of agent processes on one queue (1, 2, 4,
//! 8 and 16 `lab bench-agent` processes, concurrency 4 each, on the same
//! number of tasks), and a plot of it beside the raw claim-and-complete loop
//! and Agenda at its best, written as SVG next to the summary.

use std::fmt::Write as _;
use std::path::Path;

use store_mongo::MongoStore;

use super::figures::Figures;
use super::processes::queue_processes_run;
use crate::error::LabError;

/// The process counts measured.
pub(crate) const PROCESSES: [usize; 5] = [1, 2, 4, 8, 16];

/// Runs each count of [`PROCESSES`] on `tasks` tasks of a collection of its
/// own and puts `scaling_<n>_processes_{tasks_per_s,commands_per_task}`.
pub(super) async fn put_figures(
    f: &mut Figures,
    uri: &str,
    db: &str,
    store: &MongoStore,
    tasks: u32,
) -> Result<(), LabError> {
    for n in PROCESSES {
        eprintln!("scaling: {n} agent processes (lab bench-agent), {tasks} trivial tasks…");
        let coll = format!("bench_scaling_{n}");
        match queue_processes_run(uri, db, store, tasks, &coll, n).await {
            Ok(r) => {
                f.put(format!("scaling_{n}_processes_tasks_per_s"), r.rate);
                f.put(format!("scaling_{n}_processes_commands_per_task"), r.commands_per_task);
            }
            // A server that gives out under many processes ends the sweep,
            // not the run: the figures measured so far stand.
            Err(e) => {
                for m in PROCESSES.iter().filter(|m| **m >= n) {
                    for suffix in ["tasks_per_s", "commands_per_task"] {
                        f.skip_figure(&format!("scaling_{m}_processes_{suffix}"), format!("{n} processes: {e}"));
                    }
                }
                break;
            }
        }
    }
    Ok(())
}

/// The plot of the figures [`put_figures`] measured, with the raw loop's
/// rate and Agenda's best as horizontal lines where measured, as SVG.
pub(super) fn write_plot(f: &Figures, server: &str, out: &Path) -> Result<(), LabError> {
    let ours: Vec<(usize, f64)> = PROCESSES
        .iter()
        .filter_map(|n| f.get(&format!("scaling_{n}_processes_tasks_per_s")).map(|r| (*n, r)))
        .collect();
    if ours.is_empty() {
        return Ok(());
    }
    let raw = f.get("raw_queue_per_s");
    let agenda = f.get("agenda_best_tasks_per_s");
    let top = ours.iter().map(|(_, r)| *r).chain(raw).chain(agenda).fold(1.0_f64, f64::max) * 1.15;
    let (w, h, left, right, up, down) = (640.0, 400.0, 70.0, 170.0, 50.0, 50.0);
    let x = |i: usize| left + (w - left - right) * i as f64 / (PROCESSES.len() - 1) as f64;
    let y = |r: f64| h - down - (h - up - down) * r / top;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="18" font-size="14">Tasks/s against agent processes (4 slots each)</text>"#
    );
    let _ = writeln!(svg, r#"<text x="{left}" y="34" font-size="11">{}</text>"#, escape(server));
    let (x0, x1, y0, y1) = (left, w - right, h - down, up);
    let _ = writeln!(svg, r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>"#);
    let _ = writeln!(svg, r#"<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>"#);
    for (i, n) in PROCESSES.iter().enumerate() {
        let _ = writeln!(svg, r#"<text x="{}" y="{}" text-anchor="middle">{n}</text>"#, x(i), y0 + 18.0);
    }
    let _ = writeln!(svg, r#"<text x="{}" y="{}" text-anchor="middle">processes</text>"#, (x0 + x1) / 2.0, h - 10.0);
    for k in 0..=4 {
        let r = top / 1.15 * f64::from(k) / 4.0;
        let _ = writeln!(svg, r#"<text x="{}" y="{}" text-anchor="end">{r:.0}</text>"#, x0 - 6.0, y(r) + 4.0);
        let _ = writeln!(svg, r##"<line x1="{x0}" y1="{0}" x2="{x1}" y2="{0}" stroke="#ddd"/>"##, y(r));
    }
    let points: Vec<String> = ours
        .iter()
        .filter_map(|(n, r)| PROCESSES.iter().position(|p| p == n).map(|i| format!("{:.1},{:.1}", x(i), y(*r))))
        .collect();
    let _ =
        writeln!(svg, r##"<polyline points="{}" fill="none" stroke="#1f77b4" stroke-width="2"/>"##, points.join(" "));
    for p in &points {
        let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
        let _ = writeln!(svg, r##"<circle cx="{px}" cy="{py}" r="3" fill="#1f77b4"/>"##);
    }
    let mut legend = vec![("#1f77b4", "", "ours: agent processes".to_owned())];
    for (rate, colour, dash, label) in [
        (raw, "#2ca02c", "6,4", "raw claim + complete loop, one client"),
        (agenda, "#d62728", "2,3", "Agenda at its best, one process"),
    ] {
        if let Some(r) = rate {
            let _ = writeln!(
                svg,
                r#"<line x1="{x0}" y1="{0}" x2="{x1}" y2="{0}" stroke="{colour}" stroke-dasharray="{dash}" stroke-width="2"/>"#,
                y(r)
            );
            legend.push((colour, dash, format!("{label} ({r:.0}/s)")));
        }
    }
    for (i, (colour, dash, label)) in legend.iter().enumerate() {
        let ly = up + 20.0 + 36.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{colour}" stroke-dasharray="{dash}" stroke-width="2"/>"#,
            x1 + 10.0,
            x1 + 30.0
        );
        for (j, part) in wrap(label, 22).iter().enumerate() {
            let _ =
                writeln!(svg, r#"<text x="{}" y="{}">{}</text>"#, x1 + 34.0, ly + 4.0 + 13.0 * j as f64, escape(part));
        }
    }
    svg.push_str("</svg>\n");
    std::fs::write(out, svg).map_err(|e| LabError::io(format!("cannot write {}", out.display()), e))
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Words in lines of at most about `width` characters.
fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in s.split_whitespace() {
        match lines.last_mut() {
            Some(l) if l.len() + 1 + word.len() <= width => {
                l.push(' ');
                l.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plot_has_a_point_per_count_and_the_baselines() {
        let mut f = Figures::default();
        for (n, r) in PROCESSES.iter().zip([10.0, 19.0, 35.0, 50.0, 52.0]) {
            f.put(format!("scaling_{n}_processes_tasks_per_s"), r);
        }
        f.put("raw_queue_per_s", 40.0);
        let out = std::env::temp_dir().join(format!("lab-scaling-{}.svg", std::process::id()));
        write_plot(&f, "a <test> server", &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        std::fs::remove_file(&out).unwrap();
        assert_eq!(svg.matches("<circle").count(), 5, "{svg}");
        assert!(svg.contains("raw claim") && !svg.contains("Agenda"), "{svg}");
        assert!(svg.contains("a &lt;test&gt; server"), "{svg}");
    }
}
