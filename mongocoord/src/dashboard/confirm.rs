//! The confirmation step of every write action: what it will touch, read
//! the way the action will read it (the library's `dry_run`, as the CLI's
//! `--dry-run`), and the form that does it. Every value is escaped.

use std::fmt::Write as _;

use serde_json::Value;

use super::pages::{cell, esc, url};
use crate::data::StatsRow;

/// An action on tasks selected by id or by filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskAction {
    /// `Queue::requeue`: failed or stuck tasks run again.
    Requeue,
    /// `Queue::cancel`: tasks not yet ended end as cancelled.
    Cancel,
}

impl TaskAction {
    /// The action's route (and its preview's, under it).
    pub(crate) fn path(self) -> &'static str {
        match self {
            TaskAction::Requeue => "/requeue",
            TaskAction::Cancel => "/cancel",
        }
    }

    fn verb(self) -> &'static str {
        match self {
            TaskAction::Requeue => "Requeue",
            TaskAction::Cancel => "Cancel",
        }
    }

    fn which(self) -> &'static str {
        match self {
            TaskAction::Requeue => "failed or stuck",
            TaskAction::Cancel => "pending or running",
        }
    }

    fn what_it_does(self) -> &'static str {
        match self {
            TaskAction::Requeue => "They become ready and run again.",
            TaskAction::Cancel => {
                "Each ends as cancelled, for good; a running one's agent loses its claim and its late outcome is rejected."
            }
        }
    }
}

/// The confirmation of a requeue or a cancel: the tasks it will touch.
pub(crate) fn tasks(action: TaskAction, q: &str, filter: &str, id: &str, ids: &[String]) -> String {
    let (verb, which) = (action.verb(), action.which());
    if ids.is_empty() {
        return format!(
            r#"<p class="msg">Nothing to {}: no {which} task matches.</p><p><a href="/">back</a></p>"#,
            verb.to_lowercase()
        );
    }
    let mut h = format!("<p>This will {} {} {which} task(s) in {}:</p><ul>", verb.to_lowercase(), ids.len(), esc(q));
    for i in ids {
        let _ = write!(h, r#"<li><a href="/tasks/{}?queue={}">{}</a></li>"#, url(i), url(q), esc(i));
    }
    let _ = write!(
        h,
        r#"</ul><p>{}</p><form method="post" action="{}"><input type="hidden" name="queue" value="{}"><input type="hidden" name="filter" value="{}"><input type="hidden" name="id" value="{}"><button id="confirm">{verb} {} task(s)</button> <a href="/">back</a></form>"#,
        action.what_it_does(),
        action.path(),
        esc(q),
        esc(filter),
        esc(id),
        ids.len()
    );
    h
}

/// The confirmation step of a schedule's pause or resume: the schedule as it
/// is now.
pub(crate) fn schedule(q: &str, name: &str, action: &str, row: &Value) -> String {
    let mut h = format!("<p>This will {} schedule {} of {}:</p><dl>", esc(action), esc(name), esc(q));
    for c in ["spec", "zone", "next_tick", "last_tick", "last_outcome", "paused"] {
        let _ = write!(h, "<dt>{}</dt><dd>{}</dd>", c.replace('_', " "), cell(&row[c]));
    }
    let _ = write!(
        h,
        r#"</dl><form method="post" action="/schedule"><input type="hidden" name="queue" value="{}"><input type="hidden" name="name" value="{}"><input type="hidden" name="action" value="{}"><button id="confirm">{} {}</button> <a href="/">cancel</a></form>"#,
        esc(q),
        esc(name),
        esc(action),
        esc(action),
        esc(name)
    );
    h
}

/// The confirmation of an agent name's pause or resume: every agent of that
/// name on the queue, in every process, and its tasks as they are now.
pub(crate) fn agent(q: &str, agent: &str, pause: bool, row: Option<&StatsRow>) -> String {
    let (verb, effect) = if pause {
        (
            "pause",
            "Within a second every agent of this name, in every process, stops claiming tasks; the tasks they run now finish. Nothing else changes.",
        )
    } else {
        ("resume", "Within a second every agent of this name, in every process, claims tasks again.")
    };
    let mut h = format!("<p>This will {verb} agent {} on queue {}.</p><p>{effect}</p>", esc(agent), esc(q));
    match row {
        Some(r) => {
            h.push_str("<table><tr>");
            for s in StatsRow::STATES {
                let _ = write!(h, "<th>{s}</th>");
            }
            h.push_str("<th>paused now</th></tr><tr>");
            for n in r.counts() {
                let _ = write!(h, r#"<td class="n">{n}</td>"#);
            }
            let _ = write!(h, "<td>{}</td></tr></table>", if r.paused { "yes" } else { "no" });
        }
        None => h.push_str(r#"<p class="warn">No task of this agent is in the queue now.</p>"#),
    }
    let _ = write!(
        h,
        r#"<form method="post" action="/agent"><input type="hidden" name="queue" value="{}"><input type="hidden" name="agent" value="{}"><input type="hidden" name="action" value="{verb}"><button id="confirm">{verb} {}</button> <a href="/">back</a></form>"#,
        esc(q),
        esc(agent),
        esc(agent)
    );
    h
}
