//! `mongocoord cancel`, `delete`, `pause` and `resume`: operator actions on
//! tasks (by id or by filter) and on agent names. The library does the work
//! (`Queue::cancel`, `Queue::delete`, `Queue::set_paused`); this file parses
//! the selection and prints the result.

use mongoagent::Queue;
use serde_json::json;
use store_mongo::MongoStore;
use store_trait::Key;

use crate::data::{parse_object, task_id};

/// Which tasks an action applies to: these ids, or those matching a filter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Selection<'a> {
    pub(crate) ids: &'a [String],
    pub(crate) filter: Option<&'a str>,
}

impl Selection<'_> {
    /// The equality filter each selected task is found with.
    fn filters(&self) -> Result<Vec<bson::Document>, String> {
        match (self.ids.is_empty(), self.filter) {
            (false, None) => Ok(self.ids.iter().map(|id| bson::doc! { "_id": task_id(id) }).collect()),
            (true, Some(f)) => Ok(vec![parse_object("filter", f)?]),
            _ => Err("give task ids or --filter (one of them)".into()),
        }
    }
}

fn print(action: &str, done: &[Key], dry_run: bool, json: bool) {
    let ids: Vec<String> = done.iter().map(ToString::to_string).collect();
    if json {
        println!("{}", json!({ "dry_run": dry_run, "ids": ids }));
    } else if dry_run {
        println!("{} task(s) would be {action}: {}", ids.len(), ids.join(" "));
    } else {
        println!("{action} {} task(s): {}", ids.len(), ids.join(" "));
    }
}

/// `mongocoord cancel`: ends tasks not yet ended as cancelled (a running one's
/// agent loses its claim; the fence decides against a racing completion).
pub(crate) async fn cancel(
    store: &MongoStore,
    queue: &str,
    which: Selection<'_>,
    dry_run: bool,
    json: bool,
) -> Result<u8, String> {
    let q = Queue::new(store.clone(), queue).map_err(|e| e.to_string())?;
    let mut done = Vec::new();
    for f in which.filters()? {
        done.extend(q.cancel(f, dry_run).await.map_err(|e| e.to_string())?);
    }
    print("cancelled", &done, dry_run, json);
    Ok(0)
}

/// `mongocoord delete`: removes ended tasks (with `force`, any task).
pub(crate) async fn delete(
    store: &MongoStore,
    queue: &str,
    which: Selection<'_>,
    force: bool,
    dry_run: bool,
    json: bool,
) -> Result<u8, String> {
    let q = Queue::new(store.clone(), queue).map_err(|e| e.to_string())?;
    let mut done = Vec::new();
    for f in which.filters()? {
        done.extend(q.delete(f, force, dry_run).await.map_err(|e| e.to_string())?);
    }
    print("deleted", &done, dry_run, json);
    Ok(0)
}

/// `mongocoord pause` / `mongocoord resume`: every agent named `agent` on the
/// queue stops claiming (its running tasks finish) or claims again, within
/// `mongoagent::CONTROL_REFRESH`.
pub(crate) async fn set_paused(
    store: &MongoStore,
    queue: &str,
    agent: &str,
    paused: bool,
    json: bool,
) -> Result<u8, String> {
    let q = Queue::new(store.clone(), queue).map_err(|e| e.to_string())?;
    q.set_paused(agent, paused).await.map_err(|e| e.to_string())?;
    if json {
        println!("{}", json!({ "agent": agent, "paused": paused }));
    } else {
        println!("{agent} {} on {queue}", if paused { "paused" } else { "resumed" });
    }
    Ok(0)
}
