//! `mongocoord cancel`, `delete`, `pause` and `resume`: operator actions on
//! tasks (by id or by filter) and on agent names. The library does the work
//! (`Queue::cancel`, `Queue::delete`, `Queue::set_paused`); this file parses
//! the selection and prints the result.

use mongoagent::Queue;
use serde_json::json;
use store_mongo::MongoStore;
use store_trait::Key;

use crate::data::{parse_object, task_id};
use crate::error::CliError;
use crate::terminal::safe;

/// Which tasks an action applies to, in which queue: these ids, or those
/// matching a filter; the options `cancel` and `delete` share.
#[derive(Debug, clap::Args)]
pub(crate) struct Selection {
    /// The queue collection.
    #[arg(long)]
    pub(crate) queue: String,
    /// Task ids (a 24-digit hex id is an ObjectId).
    #[arg(required_unless_present = "filter", conflicts_with = "filter")]
    pub(crate) ids: Vec<String>,
    /// Equality filter as a JSON object, instead of ids.
    #[arg(long)]
    pub(crate) filter: Option<String>,
    /// Only list the tasks the action would touch.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

impl Selection {
    /// The equality filter each selected task is found with.
    fn filters(&self) -> Result<Vec<bson::Document>, CliError> {
        match (self.ids.is_empty(), self.filter.as_deref()) {
            (false, None) => Ok(self.ids.iter().map(|id| bson::doc! { "_id": task_id(id) }).collect()),
            (true, Some(f)) => Ok(vec![parse_object("filter", f)?]),
            _ => Err(CliError::invalid("give task ids or --filter (one of them)")),
        }
    }
}

fn print(action: &str, done: &[Key], dry_run: bool, json: bool) {
    let ids: Vec<String> = done.iter().map(ToString::to_string).collect();
    if json {
        println!("{}", json!({ "dry_run": dry_run, "ids": ids }));
    } else if dry_run {
        println!("{} task(s) would be {action}: {}", ids.len(), safe(&ids.join(" ")));
    } else {
        println!("{action} {} task(s): {}", ids.len(), safe(&ids.join(" ")));
    }
}

/// `mongocoord cancel`: ends tasks not yet ended as cancelled (a running one's
/// agent loses its claim; the fence decides against a racing completion).
pub(crate) async fn cancel(store: &MongoStore, which: &Selection, json: bool) -> Result<u8, CliError> {
    let q = Queue::new(store.clone(), &which.queue)?;
    let mut done = Vec::new();
    for f in which.filters()? {
        done.extend(q.cancel(f).dry_run(which.dry_run).await?);
    }
    print("cancelled", &done, which.dry_run, json);
    Ok(0)
}

/// `mongocoord delete`: removes ended tasks (with `force`, any task).
pub(crate) async fn delete(store: &MongoStore, which: &Selection, force: bool, json: bool) -> Result<u8, CliError> {
    let q = Queue::new(store.clone(), &which.queue)?;
    let mut done = Vec::new();
    for f in which.filters()? {
        done.extend(q.delete(f).force(force).dry_run(which.dry_run).await?);
    }
    print("deleted", &done, which.dry_run, json);
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
) -> Result<u8, CliError> {
    let q = Queue::new(store.clone(), queue)?;
    q.set_paused(agent, paused).await?;
    if json {
        println!("{}", json!({ "agent": agent, "paused": paused }));
    } else {
        println!("{} {} on {queue}", safe(agent), if paused { "paused" } else { "resumed" });
    }
    Ok(0)
}
