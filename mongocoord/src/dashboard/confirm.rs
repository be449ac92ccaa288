//! The confirmation step of every write action: what it will touch, read
//! the way the action will read it (the library's `dry_run`, as the CLI's
//! `--dry-run`), and the form that does it. Every value is escaped.

use std::fmt::Write as _;

use serde_json::Value;

use super::escape::{cell, esc, url};
use store_trait::Key;

use crate::data::StatsRow;
use crate::error::CliError;

/// An action on tasks selected by id or by filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskAction {
    /// `Queue::requeue`: failed or lapsed tasks run again.
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

    /// The action in a word, as its button says it.
    pub(crate) fn verb(self) -> &'static str {
        match self {
            TaskAction::Requeue => "Requeue",
            TaskAction::Cancel => "Cancel",
        }
    }

    fn which(self) -> &'static str {
        match self {
            TaskAction::Requeue => "failed or lapsed",
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

/// At most this many ids ride in one confirmation, and at most
/// [`MAX_PINNED_JSON`] bytes of them: the form must fit the body limit even
/// URL-encoded (three bytes a character at worst). A preview that finds more
/// confirms the first ones; the operator confirms again for the rest.
pub(crate) const MAX_PINNED: usize = 500;
/// See [`MAX_PINNED`].
pub(crate) const MAX_PINNED_JSON: usize = super::BODY_LIMIT / 4;

/// The ids a confirmation carries: as many of `ids` as fit, as a JSON array
/// of extended JSON (`{"$oid": …}` for an `ObjectId`, so that a string id of
/// 24 hex digits stays a string).
pub(crate) fn pin_ids(ids: &[Key]) -> (String, usize) {
    let mut out = Vec::new();
    let mut len = 2;
    for id in ids.iter().take(MAX_PINNED) {
        let v = id.as_bson().clone().into_relaxed_extjson();
        let n = v.to_string().len() + 1;
        if len + n > MAX_PINNED_JSON {
            break;
        }
        len += n;
        out.push(v);
    }
    let n = out.len();
    (Value::Array(out).to_string(), n)
}

/// The ids of a confirmation, as [`pin_ids`] wrote them.
pub(crate) fn parse_ids(text: &str) -> Result<Vec<Key>, CliError> {
    read_ids(text).map_err(|e| e.context("the confirmation's ids cannot be read"))
}

fn read_ids(text: &str) -> Result<Vec<Key>, CliError> {
    let v: Value =
        serde_json::from_str(text).map_err(|source| CliError::Json { what: "not valid JSON".into(), source })?;
    let Value::Array(items) = v else { return Err(CliError::invalid("not a JSON array")) };
    if items.len() > MAX_PINNED {
        return Err(CliError::invalid(format!("more than {MAX_PINNED}")));
    }
    items
        .into_iter()
        .map(|i| {
            let b = bson::Bson::try_from(i).map_err(|source| CliError::Bson { what: "not an id".into(), source })?;
            Ok(Key::from_bson(b)?)
        })
        .collect()
}

/// The confirmation of a requeue or a cancel: the tasks it will touch, and a
/// form that carries their ids (not the filter that found them), so the
/// action touches these and no task that came to match since.
pub(crate) fn tasks(action: TaskAction, q: &str, id: &str, ids: &[Key]) -> String {
    let (verb, which) = (action.verb(), action.which());
    if ids.is_empty() {
        return format!(
            r#"<p class="msg">Nothing to {}: no {which} task matches.</p><p><a href="/">back</a></p>"#,
            verb.to_lowercase()
        );
    }
    let (pinned, n) = pin_ids(ids);
    let mut h = format!("<p>This will {} {n} {which} task(s) in {}:</p><ul>", verb.to_lowercase(), esc(q));
    for i in &ids[..n] {
        let i = i.to_string();
        let _ = write!(h, r#"<li><a href="/tasks/{}?queue={}">{}</a></li>"#, url(&i), url(q), esc(&i));
    }
    h.push_str("</ul>");
    if n < ids.len() {
        let _ = write!(
            h,
            r#"<p class="warn">{} more match; this confirmation touches the {n} above: preview again for the rest.</p>"#,
            ids.len() - n
        );
    }
    let _ = write!(
        h,
        r#"<p>{}</p><form method="post" action="{}"><input type="hidden" name="queue" value="{}"><input type="hidden" name="ids" value="{}"><input type="hidden" name="id" value="{}"><button id="confirm">{verb} {n} task(s)</button> <a href="/">back</a></form>"#,
        action.what_it_does(),
        action.path(),
        esc(q),
        esc(&pinned),
        esc(id),
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
            h.push_str("<th>timed out</th><th>paused now</th></tr><tr>");
            for n in r.counts().into_iter().chain([r.timed_out]) {
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
