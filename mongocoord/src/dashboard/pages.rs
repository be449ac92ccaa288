//! The HTML of the dashboard's pages, rendered on the server from the views'
//! data (`crate::data`). Every value that comes from the store or the request
//! goes through [`esc`]; the rest is literal markup.

use std::fmt::Write as _;

use mongoagent::fields;
use serde_json::Value;

use super::confirm::TaskAction;
use super::escape::{cell, esc, url};
use super::history::TaskHistory;
use crate::data::{Elections, Locks, QueueCounts, StatsRow, TaskDetail, TaskList};

fn secs(ms: Option<u64>) -> String {
    ms.map_or("-".into(), |m| format!("{:.1}s", m as f64 / 1000.0))
}

/// A page: what live updates replace (`live`, re-rendered when one of
/// `sections` changes) and what they leave alone (`extra`: forms).
#[derive(Debug, Default)]
pub(crate) struct Page {
    pub(crate) title: String,
    pub(crate) sections: Vec<String>,
    pub(crate) live: String,
    pub(crate) extra: String,
}

impl Page {
    /// The whole document, or with `fragment` only the live part.
    pub(crate) fn render(&self, fragment: bool, read_only: bool) -> String {
        if fragment {
            return self.live.clone();
        }
        let mode = if read_only {
            r#"<span class="ro">read-only</span>"#
        } else {
            r#"<a href="/login">log in</a> <form method="post" action="/logout" class="inline"><button id="logout">log out</button></form>"#
        };
        format!(
            r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} · mongocoord</title>
<link rel="stylesheet" href="/assets/app.css"><script src="/assets/app.js" defer></script></head>
<body><header><a href="/"><b>mongocoord</b></a> <a href="/">overview</a> <a href="/tasks">tasks</a> <a href="/metrics">metrics</a> {mode}
<span id="status" title="live updates">●</span></header>
<main><h1>{title}</h1><div id="live" data-sections="{sections}">{live}</div>{extra}</main></body></html>
"#,
            title = esc(&self.title),
            sections = esc(&self.sections.join(" ")),
            live = self.live,
            extra = self.extra,
        )
    }
}

/// A short page with a message (an action's outcome, an error).
pub(crate) fn message(title: &str, text: &str, back: &str) -> Page {
    Page {
        title: title.into(),
        live: format!(r#"<p class="msg">{}</p><p><a href="{}">back</a></p>"#, esc(text), esc(back)),
        ..Page::default()
    }
}

/// The overview's data.
#[derive(Debug)]
pub(crate) struct Overview {
    pub(crate) elections: Elections,
    pub(crate) locks: Locks,
    pub(crate) queues: Vec<(String, QueueCounts, Vec<Value>)>,
}

/// Elections, locks, queues and schedules (with `actions`, a schedule's
/// pause or resume button).
pub(crate) fn overview(o: &Overview, actions: bool) -> String {
    let mut h = String::from(
        r#"<section id="elections"><h2>Elections</h2><table><tr><th>election</th><th>leader</th><th>term</th><th>expires in</th><th>nodes</th></tr>"#,
    );
    for e in &o.elections.elections {
        let nodes: Vec<String> = e
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "{}{} ({} pid {}, v{}, seen {:.1}s ago)",
                    esc(&n.node),
                    if n.is_leader { " ★" } else { "" },
                    esc(&n.host),
                    n.pid,
                    esc(&n.version),
                    // A report stamped after the read of the clock is seen now.
                    n.last_seen_ms_ago.max(0) as f64 / 1000.0
                )
            })
            .collect();
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&e.election),
            esc(e.leader.as_deref().unwrap_or("(none)")),
            e.fence.map_or("-".into(), |t| t.to_string()),
            secs(e.expires_in_ms),
            nodes.join("<br>")
        );
    }
    h.push_str("</table></section>");
    h.push_str(r#"<section id="locks"><h2>Locks</h2><table><tr><th>key</th><th>holder</th><th>host</th><th>pid</th><th>fence</th><th>expires in</th></tr>"#);
    for l in &o.locks.rows {
        let _ = write!(
            h,
            r#"<tr class="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            if l.held { "held" } else { "free" },
            esc(&l.key),
            esc(l.holder.as_deref().unwrap_or("-")),
            esc(l.host.as_deref().unwrap_or("-")),
            l.pid.map_or("-".into(), |p| p.to_string()),
            l.fence,
            secs(l.expires_in_ms)
        );
    }
    h.push_str("</table>");
    skipped(&mut h, o.locks.skipped.len() + o.elections.skipped.len());
    h.push_str("</section>");
    for (q, counts, schedules) in &o.queues {
        queue(&mut h, q, counts, actions);
        schedule_table(&mut h, q, schedules, actions);
    }
    h
}

fn skipped(h: &mut String, n: usize) {
    if n > 0 {
        let _ = write!(h, r#"<p class="warn">{n} document(s) could not be read and are not shown.</p>"#);
    }
}

fn queue(h: &mut String, q: &str, counts: &QueueCounts, actions: bool) {
    let _ = write!(h, r#"<section class="queue"><h2>Queue {}</h2><table><tr><th>agent</th>"#, esc(q));
    for s in StatsRow::STATES {
        let _ = write!(h, "<th>{s}</th>");
    }
    h.push_str(if actions {
        "<th>timed out</th><th>oldest ready</th><th>paused</th><th></th></tr>"
    } else {
        "<th>timed out</th><th>oldest ready</th><th>paused</th></tr>"
    });
    for (agent, s) in &counts.agents {
        let _ = write!(h, "<tr><td>{}</td>", esc(agent));
        for (state, n) in StatsRow::STATES.iter().zip(s.counts()) {
            if *state == "waiting" {
                let _ = write!(h, r#"<td class="n">{n}</td>"#);
                continue;
            }
            let _ = write!(
                h,
                r#"<td class="n"><a href="/tasks?queue={}&amp;agent={}&amp;state={state}">{n}</a></td>"#,
                url(q),
                url(agent)
            );
        }
        // Not a link: the task list filters by equality, and this is a field's presence.
        let _ = write!(h, r#"<td class="n timed-out">{}</td>"#, s.timed_out);
        let _ = write!(h, "<td>{}</td><td>{}</td>", secs(s.oldest_ready_age_ms), if s.paused { "paused" } else { "" });
        if actions {
            let action = if s.paused { "resume" } else { "pause" };
            let _ = write!(
                h,
                r#"<td><form method="post" action="/agent/preview" class="inline"><input type="hidden" name="queue" value="{}"><input type="hidden" name="agent" value="{}"><input type="hidden" name="action" value="{action}"><button class="agent">{action}…</button></form></td>"#,
                esc(q),
                esc(agent)
            );
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    skipped(h, counts.skipped.len());
    h.push_str("</section>");
}

fn schedule_table(h: &mut String, q: &str, rows: &[Value], actions: bool) {
    if rows.is_empty() {
        return;
    }
    let _ = write!(h, r#"<section class="schedules"><h2>Schedules of {}</h2><table><tr>"#, esc(q));
    let cols =
        ["name", "agent", "spec", "zone", "group", "next_tick", "last_tick", "last_outcome", "ended_kept", "paused"];
    for c in cols {
        let _ = write!(h, "<th>{}</th>", c.replace('_', " "));
    }
    h.push_str("</tr>");
    for r in rows {
        h.push_str("<tr>");
        for c in cols {
            let _ = write!(h, "<td>{}</td>", cell(&r[c]));
        }
        if actions {
            let name = r["name"].as_str().unwrap_or_default();
            let action = if r["paused"] == true { "resume" } else { "pause" };
            let _ = write!(
                h,
                r#"<td><form method="post" action="/schedule/preview" class="inline"><input type="hidden" name="queue" value="{}"><input type="hidden" name="name" value="{}"><input type="hidden" name="action" value="{action}"><button class="schedule">{action}…</button></form></td>"#,
                esc(q),
                esc(name)
            );
        }
        h.push_str("</tr>");
    }
    h.push_str("</table></section>");
}

/// A task's state in words (`data::task_state`, on the task as shown).
pub(crate) fn state(t: &Value) -> &'static str {
    match bson::Bson::try_from(t.clone()) {
        Ok(bson::Bson::Document(d)) => crate::data::task_state(&d),
        _ => "unknown",
    }
}

/// A badge saying a task's latest attempt timed out (`data::timed_out`), or
/// nothing.
fn timed_out_badge(t: &Value) -> String {
    crate::data::timed_out_json(t)
        .map_or_else(String::new, |t| format!(r#" <span class="badge timed-out">{}</span>"#, esc(&t)))
}

/// A task's id as text (an `ObjectId` as its hex).
pub(crate) fn id_text(t: &Value) -> String {
    match &t["_id"] {
        Value::String(s) => s.clone(),
        Value::Object(o) => o.get("$oid").and_then(Value::as_str).map_or_else(|| t["_id"].to_string(), str::to_owned),
        other => other.to_string(),
    }
}

fn task_button(action: TaskAction, q: &str, id: &str) -> String {
    let name = &action.path()[1..];
    format!(
        r#"<form method="post" action="{}/preview" class="inline"><input type="hidden" name="queue" value="{}"><input type="hidden" name="id" value="{}"><button class="{name}">{name}…</button></form>"#,
        action.path(),
        esc(q),
        esc(id)
    )
}

/// The actions the page offers for a task in `state` (each previewed, which
/// tells whether it applies after all: a running task's claim may have lapsed or not).
fn task_buttons(q: &str, id: &str, state: &str) -> String {
    let mut h = String::new();
    if matches!(state, "failed" | "running") {
        h.push_str(&task_button(TaskAction::Requeue, q, id));
    }
    if matches!(state, "ready" | "running" | "held") {
        h.push_str(&task_button(TaskAction::Cancel, q, id));
    }
    h
}

/// The task list: one row per task, links to the detail, and paging.
pub(crate) fn task_list(q: &str, list: &TaskList, query: &str, page: u32, more: bool, actions: bool) -> String {
    let mut h = String::from(
        "<table><tr><th>id</th><th>agent</th><th>state</th><th>attempts</th><th>priority</th><th>last error</th><th></th></tr>",
    );
    for t in &list.tasks {
        let (id, st) = (id_text(t), state(t));
        let _ = write!(
            h,
            r#"<tr class="{st}"><td><a href="/tasks/{}?queue={}">{}</a></td><td>{}</td><td>{st}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            url(&id),
            url(q),
            esc(&id),
            cell(&t[fields::AGENT_NAME]),
            timed_out_badge(t),
            cell(&t[fields::ATTEMPTS]),
            cell(&t[fields::PRIORITY]),
            cell(&t[fields::LAST_ERROR]),
            if actions { task_buttons(q, &id, st) } else { String::new() }
        );
    }
    h.push_str("</table>");
    skipped(&mut h, list.skipped.len());
    h.push_str(r#"<p class="paging">"#);
    if page > 0 {
        let _ = write!(h, r#"<a href="/tasks?{}&amp;page={}">← previous</a> "#, esc(query), page - 1);
    }
    let _ = write!(h, "page {}", page + 1);
    if more {
        let _ = write!(h, r#" <a href="/tasks?{}&amp;page={}">next →</a>"#, esc(query), page + 1);
    }
    h.push_str("</p>");
    h
}

/// The task list's filters as the request gave them.
#[derive(Debug)]
pub(crate) struct Filters<'a> {
    pub(crate) agent: &'a str,
    pub(crate) state: &'a str,
    pub(crate) id: &'a str,
}

/// The filters above the task list.
pub(crate) fn task_filters(queues: &[String], q: &str, f: &Filters<'_>) -> String {
    let (agent, st) = (f.agent, f.state);
    let mut h = String::from(r#"<form method="get" action="/tasks" class="filters">queue <select name="queue">"#);
    for name in queues {
        let sel = if name == q { " selected" } else { "" };
        let _ = write!(h, r#"<option value="{0}"{sel}>{0}</option>"#, esc(name));
    }
    let _ = write!(h, r#"</select> agent <input name="agent" value="{}"> state <select name="state">"#, esc(agent));
    for s in ["", "ready", "running", "completed", "failed", "cancelled"] {
        let sel = if s == st { " selected" } else { "" };
        let _ = write!(h, r#"<option value="{s}"{sel}>{}</option>"#, if s.is_empty() { "any" } else { s });
    }
    let _ =
        write!(h, r#"</select> id <input name="id" value="{}" size="26"> <button>filter</button></form>"#, esc(f.id));
    h
}

/// A date as relaxed extended JSON shows it (`{"$date": "…"}`): its text.
fn when(v: &Value) -> String {
    match v.get("$date") {
        Some(Value::String(d)) => esc(d),
        _ => cell(v),
    }
}

/// What the task last reported of its progress (`Task::progress`), and when.
fn progress(t: &Value) -> String {
    if t[fields::PROGRESS].is_null() {
        return "-".into();
    }
    match &t[fields::PROGRESS_AT] {
        Value::Null => cell(&t[fields::PROGRESS]),
        at => format!("{} (at {})", cell(&t[fields::PROGRESS]), when(at)),
    }
}

/// A task: its state, attempts, last error, progress, times, parent and
/// children, and every field.
pub(crate) fn task_detail(q: &str, d: &TaskDetail, seen: &TaskHistory, actions: bool) -> String {
    let t = &d.task;
    let st = state(t);
    let mut h = format!(
        r#"<dl><dt>queue</dt><dd>{}</dd><dt>state</dt><dd id="state" class="{st}">{st}</dd><dt>agent</dt><dd>{}</dd><dt>attempts</dt><dd id="attempts">{}{}</dd><dt>last error</dt><dd id="last-error">{}</dd><dt>progress</dt><dd id="progress">{}</dd><dt>fence</dt><dd>{}</dd><dt>priority</dt><dd>{}</dd>"#,
        esc(q),
        cell(&t[fields::AGENT_NAME]),
        cell(&t[fields::ATTEMPTS]),
        if t[fields::MAX_ATTEMPTS].is_null() {
            String::new()
        } else {
            format!(" of at most {}", cell(&t[fields::MAX_ATTEMPTS]))
        },
        cell(&t[fields::LAST_ERROR]),
        progress(t),
        cell(&t[store_trait::fields::FENCE]),
        cell(&t[fields::PRIORITY])
    );
    if let Some(timed_out) = crate::data::timed_out_json(t) {
        let _ = write!(h, r#"<dt>timed out</dt><dd id="timed-out" class="timed-out">{}</dd>"#, esc(&timed_out));
    }
    if !t[fields::GROUP_KEY].is_null() {
        // Its group, its number in it, and whether it waits for its turn.
        let waits = if t[fields::GROUP_HELD] == Value::Bool(true) { ", waiting for its turn" } else { "" };
        let _ = write!(
            h,
            r#"<dt>group</dt><dd id="group">{} (number {}{waits})</dd>"#,
            cell(&t[fields::GROUP_KEY]),
            cell(&t[fields::GROUP_SEQ])
        );
    }
    for (label, field) in [
        ("run at", fields::RUN_AT),
        ("started", fields::STARTED_AT),
        ("on host", fields::AGENT_HOST),
        ("ended", fields::COMPLETED_AT),
    ] {
        if !t[field].is_null() {
            let _ = write!(h, "<dt>{label}</dt><dd>{}</dd>", when(&t[field]));
        }
    }
    if let Some(p) = &d.parent {
        let _ = write!(h, r#"<dt>parent</dt><dd><a href="/tasks/{}?queue={}">{}</a></dd>"#, url(p), url(q), esc(p));
    }
    h.push_str("</dl>");
    if actions {
        h.push_str(&task_buttons(q, &id_text(t), st));
    }
    if !d.children.is_empty() {
        h.push_str("<h2>Children</h2><ul>");
        for c in &d.children {
            let id = id_text(c);
            let _ =
                write!(h, r#"<li><a href="/tasks/{}?queue={}">{}</a> {}</li>"#, url(&id), url(q), esc(&id), state(c));
        }
        h.push_str("</ul>");
    }
    h.push_str(&task_events(seen));
    let pretty = serde_json::to_string_pretty(t).unwrap_or_default();
    let _ = write!(h, "<h2>Document</h2><pre>{}</pre>", esc(&pretty));
    h
}

/// The events the dashboard saw of a task, with what it cannot know said.
fn task_events(seen: &TaskHistory) -> String {
    let mut h = format!(
        r#"<h2>Events seen</h2><p class="note">since this dashboard started ({}), at the time it saw each{}</p>"#,
        esc(&seen.since),
        if seen.truncated { "; only the latest are kept" } else { "" }
    );
    for g in &seen.gaps {
        let _ = write!(h, r#"<p class="note gap">the queue's feed lost events at {}: some may be missing</p>"#, esc(g));
    }
    if seen.events.is_empty() {
        h.push_str(r#"<p id="events-seen">none yet</p>"#);
        return h;
    }
    h.push_str(r#"<table id="events-seen"><tr><th>seen at</th><th>event</th><th>fence</th><th>details</th></tr>"#);
    for e in &seen.events {
        let details = match &e.details {
            serde_json::Value::Object(d) => d.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "),
            _ => String::new(),
        };
        let _ = write!(
            h,
            r#"<tr class="{0}"><td>{1}</td><td>{0}</td><td>{2}</td><td>{3}</td></tr>"#,
            e.event,
            esc(&e.at),
            e.fence,
            esc(&details)
        );
    }
    h.push_str("</table>");
    h
}

/// The forms of the write actions (absent in read-only mode).
pub(crate) fn action_forms(queues: &[String]) -> String {
    let mut opts = String::new();
    for q in queues {
        let _ = write!(opts, r#"<option value="{0}">{0}</option>"#, esc(q));
    }
    format!(
        r#"<section id="actions"><h2>Enqueue a task</h2><form method="post" action="/enqueue">queue <select name="queue">{opts}</select> agent <input name="agent" required> priority <input name="priority" value="0" size="4"><br><textarea name="data" rows="3" cols="60">{{}}</textarea><br><button>enqueue</button></form>
<h2>Requeue failed or lapsed tasks</h2><form method="post" action="/requeue/preview">queue <select name="queue">{opts}</select> filter <input name="filter" value="{{}}" size="40"> <button>preview…</button></form>
<h2>Cancel pending or running tasks</h2><form method="post" action="/cancel/preview">queue <select name="queue">{opts}</select> filter <input name="filter" value="{{}}" size="40"> <button>preview…</button></form></section>"#
    )
}

/// The login form.
pub(crate) fn login() -> String {
    r#"<form method="post" action="/login">token <input type="password" name="token" id="token" autocomplete="off"> <button id="login">log in</button></form><p>The token is printed when the dashboard starts, or read from <code>--token-file</code>.</p>"#.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_urls() {
        assert_eq!(esc(r#"<script>"a"&'b'</script>"#), "&lt;script&gt;&quot;a&quot;&amp;&#39;b&#39;&lt;/script&gt;");
        assert_eq!(url("a b/&?é"), "a%20b%2F%26%3F%C3%A9");
        let p = Page { title: "<t>".into(), live: "L".into(), ..Page::default() };
        assert_eq!(p.render(true, false), "L");
        assert!(p.render(false, true).contains("&lt;t&gt;") && !p.render(false, true).contains("/login"));
    }
}
