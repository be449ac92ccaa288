//! `mongocoord schedules` and `mongocoord schedule pause|resume|delete NAME`:
//! the schedules of a queue, when they tick next, how their last tick went.

use mongoagent::schedule::{Missed, Overlap, ScheduleInfo, Schedules, When};
use serde_json::{json, Value};
use store_trait::{Collection, Key, Query, Store, StoreTime};

use crate::error::CliError;

/// What `mongocoord schedule` does to a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Action {
    /// Skip its ticks until resumed.
    Pause,
    /// Tick again (ticks that fell while paused are not run).
    Resume,
    /// Delete it (its tasks stay).
    Delete,
}

fn open<S: Store + Clone>(store: &S, queue: &str, collection: Option<&str>) -> Result<Schedules<S>, CliError> {
    let s = match collection {
        Some(c) => Schedules::with_collection(store.clone(), queue, c),
        None => Schedules::new(store.clone(), queue),
    };
    Ok(s?)
}

fn spec(info: &ScheduleInfo) -> (String, Option<String>) {
    match info.schedule.when() {
        When::Cron { expr, zone } => (expr.clone(), Some(zone.clone())),
        When::Every { every, offset } if offset.is_zero() => (format!("every {every:?}"), None),
        When::Every { every, offset } => (format!("every {every:?} +{offset:?}"), None),
        When::At(t) => (format!("at {t}"), None),
        _ => ("?".into(), None),
    }
}

/// How the task of the last tick went (`data::task_state`: completed,
/// failed, running, ready, held waiting for the previous tick's task, …), or
/// gone.
async fn outcome<S: Store>(store: &S, queue: &Collection, task: &str) -> Result<String, CliError> {
    let key = Key::new(task)?;
    let Some(r) = store.get(queue, &key).await?.record else {
        return Ok("gone".into());
    };
    Ok(crate::data::task_state(r.data()).into())
}

fn time(t: Option<StoreTime>) -> Value {
    t.map_or(Value::Null, |t| {
        Value::String(t.to_bson_datetime().try_to_rfc3339_string().unwrap_or_else(|_| t.to_string()))
    })
}

/// The rows of `mongocoord schedules`, as JSON objects.
pub(crate) async fn rows<S: Store + Clone>(
    store: &S,
    queue: &str,
    collection: Option<&str>,
) -> Result<Vec<Value>, CliError> {
    let s = open(store, queue, collection)?;
    let mut out = Vec::new();
    for info in s.list_each().await? {
        // One unreadable document (another program's, a damaged one) is
        // skipped, said in the log, not the end of the view.
        let info = match info {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!(queue, error = %e, "skipped a schedule that cannot be read");
                continue;
            }
        };
        let (spec, zone) = spec(&info);
        let last_outcome = match &info.last_task {
            Some(t) => Some(outcome(store, s.queue().collection(), t).await?),
            None => None,
        };
        // How much of its history is kept: its ended ticks' tasks (`cron
        // --retain` deletes them a while after they end).
        let ended =
            bson::doc! { mongoagent::fields::SCHEDULE: info.schedule.name(), mongoagent::fields::COMPLETE: true };
        let kept = store.count(s.queue().collection(), &Query::eq(ended)).await?;
        out.push(json!({
            "name": info.schedule.name(),
            "agent": info.schedule.agent_name(),
            "spec": spec,
            "zone": zone,
            "group": info.schedule.group(),
            "overlap": match info.schedule.overlap_policy() { Overlap::Skip => "skip", Overlap::Queue => "queue", _ => "allow" },
            "missed": match info.schedule.missed_policy() {
                Missed::Skip => "skip".to_owned(),
                Missed::Once => "once".to_owned(),
                Missed::All(n) => format!("all({n})"),
                _ => "?".to_owned(),
            },
            "version": info.version,
            "paused": info.paused,
            "next_tick": time(info.next_tick),
            "last_tick": time(info.last_tick),
            "last_task": info.last_task,
            "last_outcome": last_outcome,
            "ended_kept": kept,
        }));
    }
    Ok(out)
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `mongocoord schedules`.
pub(crate) async fn list<S: Store + Clone>(
    store: &S,
    queue: &str,
    collection: Option<&str>,
    json: bool,
) -> Result<u8, CliError> {
    let rows = rows(store, queue, collection).await?;
    if json {
        println!("{}", Value::Array(rows));
        return Ok(0);
    }
    let header = ["NAME", "SPEC", "ZONE", "NEXT TICK", "LAST TICK", "OUTCOME", "ENDED KEPT", "PAUSED"];
    let keys = ["name", "spec", "zone", "next_tick", "last_tick", "last_outcome", "ended_kept", "paused"];
    let table: Vec<Vec<String>> = rows.iter().map(|r| keys.iter().map(|k| cell(&r[*k])).collect()).collect();
    crate::terminal::print_table(&header, &table);
    Ok(0)
}

/// Applies `action` to schedule `name`; `Ok(false)` when there is no such schedule.
pub(crate) async fn apply<S: Store + Clone>(
    store: &S,
    queue: &str,
    collection: Option<&str>,
    action: Action,
    name: &str,
) -> Result<bool, CliError> {
    let s = open(store, queue, collection)?;
    let found = match action {
        Action::Pause => s.pause(name).await,
        Action::Resume => s.resume(name).await,
        Action::Delete => s.delete(name).await,
    };
    Ok(found?)
}

/// `mongocoord schedule pause|resume|delete NAME`: exit status 1 when there is
/// no such schedule.
pub(crate) async fn act<S: Store + Clone>(
    store: &S,
    queue: &str,
    collection: Option<&str>,
    action: Action,
    name: &str,
    json: bool,
) -> Result<u8, CliError> {
    let found = apply(store, queue, collection, action, name).await?;
    let verb = match action {
        Action::Pause => "paused",
        Action::Resume => "resumed",
        Action::Delete => "deleted",
    };
    if json {
        println!("{}", json!({ "name": name, "found": found, "action": verb }));
    } else if found {
        println!("{}: {verb}", crate::terminal::safe(name));
    } else {
        println!("{}: no such schedule", crate::terminal::safe(name));
    }
    Ok(if found { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use bson::doc;
    use mongoagent::{schedule::Schedule, NewTask};

    #[tokio::test]
    async fn lists_and_changes_schedules() {
        let store = store_memory::MemoryStore::new();
        let s = Schedules::new(store.clone(), "jobs").unwrap();
        let every = Schedule::every("sweep", std::time::Duration::from_secs(60), NewTask::new("w", doc! {})).unwrap();
        let cron = Schedule::cron("nightly", "0 30 2 * * *", "Europe/Berlin", NewTask::new("w", doc! {}))
            .unwrap()
            .overlap(Overlap::Queue)
            .missed(Missed::All(3));
        let once =
            Schedule::at("once", StoreTime::from_millis(0), NewTask::new("w", doc! {})).unwrap().missed(Missed::Once);
        s.upsert(&every).await.unwrap();
        s.upsert(&cron).await.unwrap();
        s.upsert(&once).await.unwrap();
        s.scheduler().pass().await.unwrap();

        let listed = rows(&store, "jobs", None).await.unwrap();
        assert_eq!(listed.len(), 3);
        let (nightly, once, sweep) = (&listed[0], &listed[1], &listed[2]);
        assert_eq!(nightly["spec"], "0 30 2 * * *");
        assert_eq!(nightly["zone"], "Europe/Berlin");
        assert_eq!((nightly["overlap"].as_str(), nightly["missed"].as_str()), (Some("queue"), Some("all(3)")));
        assert_eq!(nightly["last_outcome"], Value::Null);
        assert_eq!(sweep["spec"], "every 60s");
        assert!(sweep["next_tick"].is_string());
        assert_eq!(sweep["paused"], false);
        assert_eq!(once["last_outcome"], "ready", "{once}");
        assert_eq!(once["last_task"], "sched/once/0");
        assert!(once["last_tick"].is_string() && once["next_tick"].is_null());

        assert!(apply(&store, "jobs", None, Action::Pause, "sweep").await.unwrap());
        let listed = rows(&store, "jobs", None).await.unwrap();
        assert_eq!((listed[2]["paused"].as_bool(), listed[2]["next_tick"].is_null()), (Some(true), true));
        assert!(apply(&store, "jobs", None, Action::Resume, "sweep").await.unwrap());
        assert!(apply(&store, "jobs", None, Action::Delete, "sweep").await.unwrap());
        assert!(!apply(&store, "jobs", None, Action::Delete, "sweep").await.unwrap());
        assert_eq!(act(&store, "jobs", None, Action::Pause, "sweep", true).await.unwrap(), 1);
        assert_eq!(rows(&store, "jobs", Some("elsewhere")).await.unwrap().len(), 0);
    }
}
