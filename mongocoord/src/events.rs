//! `mongocoord watch --queue Q`: the queue's task events as they happen
//! (`Queue::events`), one line each, or NDJSON with `--json`.

use std::time::Duration;

use bson::Bson;
use mongoagent::{EventFilter, EventKind, Queue, QueueEvent, TaskEvent};
use serde_json::{json, Value};
use store_mongo::MongoStore;

use crate::error::CliError;

/// What `watch --queue` shows.
#[derive(Debug)]
pub(crate) struct WatchEvents<'a> {
    pub(crate) queue: &'a str,
    /// Only this agent name's tasks.
    pub(crate) agent: Option<&'a str>,
    /// How often a server without change streams is polled.
    pub(crate) poll: Duration,
    /// Stop after this many events.
    pub(crate) count: Option<u64>,
    pub(crate) json: bool,
}

/// Prints events until `count` were printed (or forever).
pub(crate) async fn watch(store: &MongoStore, w: WatchEvents<'_>) -> Result<u8, CliError> {
    let q = Queue::new(store.clone(), w.queue)?;
    let mut filter = EventFilter::all().poll_every(w.poll);
    if let Some(a) = w.agent {
        filter = filter.agent(a);
    }
    let mut events = q.events(filter).await?;
    // On stderr, so NDJSON on stdout stays clean; after subscribing, so
    // nothing after this line is missed.
    eprintln!("watching the tasks of {} (Ctrl-C stops)", w.queue);
    let mut n = 0;
    while w.count.is_none_or(|c| n < c) {
        let Some(ev) = events.next().await else { return Err(CliError::Stopped("the event feed")) };
        if w.json {
            println!("{}", event_json(&ev));
        } else {
            println!("{}", crate::terminal::safe(&event_line(&ev)));
        }
        n += 1;
    }
    Ok(0)
}

fn id_json(id: &Bson) -> Value {
    match id {
        Bson::String(s) => Value::String(s.clone()),
        Bson::ObjectId(o) => Value::String(o.to_hex()),
        other => other.clone().into_relaxed_extjson(),
    }
}

/// The fields an event kind carries beyond its name.
pub(crate) fn details(kind: &EventKind) -> Value {
    match kind {
        EventKind::Claimed { attempt } | EventKind::Recovered { attempt } => json!({ "attempt": attempt }),
        EventKind::Progress { value } => json!({ "progress": value.clone().into_relaxed_extjson() }),
        EventKind::Retrying { attempt, error } | EventKind::Failed { attempt, error } => {
            json!({ "attempt": attempt, "error": error })
        }
        EventKind::Waiting { round } | EventKind::Woken { round } => json!({ "round": round }),
        EventKind::TimedOut { attempt, timeout } => {
            json!({ "attempt": attempt, "timeout_ms": u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX) })
        }
        _ => json!({}),
    }
}

/// One NDJSON line: `{"event", "task", "agent", "fence", …details}`, or
/// `{"event": "resync", "missed"}`.
pub(crate) fn event_json(ev: &QueueEvent) -> Value {
    match ev {
        QueueEvent::Task(TaskEvent { task, agent, fence, kind, .. }) => {
            let mut v =
                json!({ "event": kind.name(), "task": id_json(task.as_bson()), "agent": agent, "fence": fence });
            if let (Value::Object(o), Value::Object(d)) = (&mut v, details(kind)) {
                o.extend(d);
            }
            v
        }
        QueueEvent::Resync { missed } => json!({ "event": "resync", "missed": missed }),
        _ => json!({ "event": "unknown" }),
    }
}

/// One human line: `EVENT  TASK  AGENT  fence N  details`.
pub(crate) fn event_line(ev: &QueueEvent) -> String {
    match ev {
        QueueEvent::Task(TaskEvent { task, agent, fence, kind, .. }) => {
            let extra = match details(kind) {
                Value::Object(d) => d.iter().map(|(k, v)| format!("  {k} {v}")).collect::<String>(),
                _ => String::new(),
            };
            format!("{:<10} {task}  {agent}  fence {fence}{extra}", kind.name())
        }
        QueueEvent::Resync { missed } => {
            format!("resync     {missed} event(s) missed: `mongocoord tasks` shows where the tasks are")
        }
        _ => "unknown event".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongoagent::store_trait::Key;

    #[test]
    fn lines_and_json() {
        let ev = |kind| QueueEvent::Task(TaskEvent::new(Key::new("t1").unwrap(), "resize", 3, kind));
        let p = ev(EventKind::Progress { value: Bson::Document(bson::doc! {"done": 2}) });
        assert_eq!(
            event_json(&p),
            json!({"event": "progress", "task": "t1", "agent": "resize", "fence": 3, "progress": {"done": 2}})
        );
        assert_eq!(event_line(&p), r#"progress   t1  resize  fence 3  progress {"done":2}"#);
        let f = ev(EventKind::Failed { attempt: 5, error: "boom".into() });
        assert_eq!(event_json(&f)["error"], "boom");
        assert_eq!(event_json(&QueueEvent::Resync { missed: 7 }), json!({"event": "resync", "missed": 7}));
        let t = ev(EventKind::TimedOut { attempt: 2, timeout: Duration::from_millis(1500) });
        assert_eq!(
            event_json(&t),
            json!({"event": "timed_out", "task": "t1", "agent": "resize", "fence": 3, "attempt": 2, "timeout_ms": 1500})
        );
        assert_eq!(event_line(&t), "timed_out  t1  resize  fence 3  attempt 2  timeout_ms 1500");
    }
}
