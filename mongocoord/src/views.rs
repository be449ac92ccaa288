//! Operator views: who holds which lock until when, who leads, what has lapsed in
//! which queue; and repairs (enqueue, requeue). Tables for people, `--json` for
//! scripts.

use std::io::BufRead;
use std::time::Duration;

use mongoagent::{NewTask, Queue};
use serde_json::{json, Value};
use store_mongo::MongoStore;
use store_trait::Store;

use crate::data::{self, parse_object, StatsRow};
use crate::error::CliError;
use crate::terminal::{print_table, safe};

fn parse_filter(text: &str) -> Result<bson::Document, CliError> {
    parse_object("filter", text)
}

fn ms(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Tells the operator, on stderr, which documents a view skipped.
fn report_skipped(what: &str, skipped: &[Value]) {
    if skipped.is_empty() {
        return;
    }
    eprintln!("skipped {} {what} document(s) that cannot be read:", skipped.len());
    for s in skipped {
        let (key, error) = (s["key"].as_str().unwrap_or("?"), s["error"].as_str().unwrap_or_default());
        eprintln!("  {}: {}", safe(key), safe(error));
    }
}

/// Serialized as the views have always printed it (object keys sorted).
fn to_json(v: &impl serde::Serialize) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// `mongocoord locks`.
pub(crate) async fn locks(store: &MongoStore, collection: &str, json: bool) -> Result<u8, CliError> {
    let data::Locks { rows, skipped } = data::locks(store, collection).await?;
    report_skipped("lock", &skipped);
    if json {
        // Skipped documents follow the locks, marked `"skipped": true`.
        println!("{}", Value::Array(rows.iter().map(to_json).chain(skipped).collect()));
        return Ok(0);
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|l| {
            vec![
                l.key.clone(),
                l.holder.clone().unwrap_or_else(|| "-".into()),
                l.fence.to_string(),
                l.expires_in_ms.map_or("-".into(), |m| ms(Duration::from_millis(m))),
            ]
        })
        .collect();
    print_table(&["KEY", "HOLDER", "FENCE", "EXPIRES IN"], &table);
    Ok(0)
}

/// `mongocoord leaders`: the seed's `cluster_detail` for every election. Status
/// documents are read with the library's schema (`mongoelector::status`); those
/// it cannot read are listed on stderr and under `skipped` in `--json`.
pub(crate) async fn leaders(store: &MongoStore, collection: &str, status: &str, json: bool) -> Result<u8, CliError> {
    let out = data::elections(store, collection, status).await?;
    for bad in &out.skipped {
        eprintln!("mongocoord: skipped {}", safe(bad["error"].as_str().unwrap_or_default()));
    }
    if json {
        println!("{}", to_json(&out));
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = out
        .elections
        .iter()
        .map(|e| {
            vec![
                e.election.clone(),
                e.leader.clone().unwrap_or_else(|| "(none)".into()),
                e.fence.map_or("null".into(), |t| t.to_string()),
                e.nodes.len().to_string(),
            ]
        })
        .collect();
    print_table(&["ELECTION", "LEADER", "FENCE", "NODES"], &rows);
    Ok(0)
}

/// Which tasks `mongocoord tasks` shows.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Only<'a> {
    /// Only this agent's.
    pub(crate) agent: Option<&'a str>,
    /// Only the ticks of this schedule (with `--list`).
    pub(crate) schedule: Option<&'a str>,
    /// Only the tasks that failed for good (`--failed`).
    pub(crate) failed: bool,
}

/// `mongocoord tasks`. Listed tasks show the schedule and tick they came from
/// (`schedule`, `scheduled_for`), when a schedule enqueued them.
pub(crate) async fn tasks(
    store: &MongoStore,
    queue: &str,
    only: Only<'_>,
    list: bool,
    filter: Option<&str>,
    limit: u32,
    json: bool,
) -> Result<u8, CliError> {
    if only.failed {
        return failed(store, queue, only, filter, limit, json).await;
    }
    if list {
        let mut f = filter.map(parse_filter).transpose()?.unwrap_or_default();
        if let Some(a) = only.agent {
            f.insert(mongoagent::fields::AGENT_NAME, a);
        }
        if let Some(s) = only.schedule {
            f.insert(mongoagent::fields::SCHEDULE, s);
        }
        let data::TaskList { tasks, skipped } = data::task_list(store, queue, f, 0, limit).await?;
        report_skipped("task", &skipped);
        // Skipped documents follow the tasks, marked `"skipped": true`.
        let docs: Vec<Value> = tasks.into_iter().chain(skipped).collect();
        if json {
            println!("{}", Value::Array(docs));
        } else {
            for d in docs {
                // JSON escapes C0 controls but not DEL, C1 or bidi controls.
                println!("{}", safe(&d.to_string()));
            }
        }
        return Ok(0);
    }
    let data::QueueCounts { agents, skipped } = data::queue_counts(store, queue, only.agent).await?;
    report_skipped("task", &skipped);
    if json {
        let mut v = to_json(&agents);
        // Counts read no document, so they include unreadable ones; the agents
        // those belong to are unknown. The list goes under `$skipped`, and only
        // when something was skipped, so the per-agent shape stays as it was.
        if !skipped.is_empty() {
            v["$skipped"] = Value::Array(skipped);
        }
        println!("{v}");
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = agents
        .iter()
        .map(|(n, s): (&String, &StatsRow)| {
            let mut r = vec![n.clone()];
            r.extend(s.counts().iter().map(ToString::to_string));
            r.push(s.timed_out.to_string());
            r.push(s.oldest_ready_age_ms.map_or("-".into(), |m| ms(Duration::from_millis(m))));
            r.push(if s.paused { "PAUSED".into() } else { "-".into() });
            r
        })
        .collect();
    print_table(
        &[
            "AGENT",
            "READY",
            "DELAYED",
            "RUNNING",
            "LAPSED",
            "WAITING",
            "COMPLETED",
            "FAILED",
            "TIMED OUT",
            "OLDEST READY",
            "PAUSED",
        ],
        &rows,
    );
    Ok(0)
}

/// `mongocoord tasks --failed`: the tasks that failed for good, the latest
/// first, with their last error, and whether their last attempt timed out.
async fn failed(
    store: &MongoStore,
    queue: &str,
    only: Only<'_>,
    filter: Option<&str>,
    limit: u32,
    json: bool,
) -> Result<u8, CliError> {
    let mut f = filter.map(parse_filter).transpose()?.unwrap_or_default();
    if let Some(a) = only.agent {
        f.insert(mongoagent::fields::AGENT_NAME, a);
    }
    let data::TaskList { tasks, skipped } = data::failed_list(store, queue, f, limit).await?;
    report_skipped("task", &skipped);
    if json {
        println!("{}", Value::Array(tasks));
        return Ok(0);
    }
    let text = |t: &Value, k: &str| match &t[k] {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("$date")
            .or_else(|| o.get("$oid"))
            .map_or_else(|| t[k].to_string(), |v| v.to_string().trim_matches('"').to_owned()),
        v => v.to_string(),
    };
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            let error = text(t, mongoagent::fields::LAST_ERROR).replace('\n', " ");
            vec![
                text(t, "_id"),
                text(t, mongoagent::fields::AGENT_NAME),
                text(t, mongoagent::fields::ATTEMPTS),
                text(t, mongoagent::fields::COMPLETED_AT),
                data::timed_out_json(t).unwrap_or_else(|| "-".into()),
                error,
            ]
        })
        .collect();
    print_table(&["ID", "AGENT", "ATTEMPTS", "ENDED", "TIMED OUT", "LAST ERROR"], &rows);
    Ok(0)
}

/// Options of `mongocoord enqueue`.
#[derive(Debug)]
pub(crate) struct EnqueueOpts {
    pub(crate) priority: i64,
    pub(crate) delay: Option<f64>,
    pub(crate) dedupe_key: Option<String>,
    pub(crate) dedupe_scope: mongoagent::DedupeScope,
    pub(crate) id: Option<String>,
    pub(crate) timeout: Option<f64>,
    /// Its group (`--group`).
    pub(crate) group: Option<String>,
    /// Wait for the task to end (`Some`), for at most this long (`Some(Some)`).
    pub(crate) wait: Option<Option<std::time::Duration>>,
}

/// `mongocoord enqueue`.
pub(crate) async fn enqueue(
    store: &MongoStore,
    queue: &str,
    agent: &str,
    data: &str,
    o: EnqueueOpts,
    json: bool,
) -> Result<u8, CliError> {
    let q = Queue::new(store.clone(), queue)?;
    let debounced = matches!(o.dedupe_scope, mongoagent::DedupeScope::Debounce(_));
    let mut t = NewTask::new(agent, parse_object("task", data)?).priority(o.priority);
    if let Some(d) = o.delay {
        t = t.delay(crate::args::seconds("delay", d, true)?);
    }
    if let Some(k) = o.dedupe_key {
        t = t.dedupe_key(k).dedupe_scope(o.dedupe_scope);
    }
    if let Some(s) = o.timeout {
        t = t.timeout(crate::args::seconds("timeout", s, false)?);
    }
    if let Some(g) = o.group {
        t = t.group(g);
    }
    if let Some(id) = o.id {
        data::check_new_task_id(&id)?;
        t = t.id(id);
    }
    let (id, new) = q.enqueue(t).await?;
    if let Some(limit) = o.wait {
        return wait_for(&q, &id, new, limit).await;
    }
    if json {
        println!("{}", json!({ "id": id.to_string(), "inserted": new }));
    } else {
        let said = match (new, debounced) {
            (true, _) => "enqueued",
            (false, true) => "debounced:",
            (false, false) => "duplicate, not enqueued:",
        };
        println!("{said} {}", safe(&id.to_string()));
    }
    Ok(0)
}

/// `enqueue --wait`: waits for task `id` to end and prints it as JSON; exit
/// status 0 if it completed, 1 if not, [`CliError::NotEnded`] (status 74) if
/// `limit` passed first. When the wait ends otherwise (status 2), the task's
/// id is still printed, with `"ended": false`.
async fn wait_for(
    q: &Queue<MongoStore>,
    id: &store_trait::Key,
    inserted: bool,
    limit: Option<std::time::Duration>,
) -> Result<u8, CliError> {
    let waiting = q.wait_for(id);
    let ended = match limit {
        Some(l) => match tokio::time::timeout(l, waiting).await {
            Ok(r) => r,
            Err(_) => {
                let out = json!({ "id": id.to_string(), "inserted": inserted, "ended": false });
                println!("{out}");
                return Err(CliError::NotEnded { task: id.to_string(), after: l });
            }
        },
        None => waiting.await,
    };
    let ended = match ended {
        Ok(ended) => ended,
        Err(e) => {
            // The task is in the queue whatever the wait met (a deletion, a
            // server gone): its id on stdout, so a retry need not enqueue
            // another.
            println!("{}", json!({ "id": id.to_string(), "inserted": inserted, "ended": false }));
            return Err(e.into());
        }
    };
    let result = bson::Bson::Document(ended.data().clone()).into_relaxed_extjson();
    let out = json!({
        "id": id.to_string(),
        "inserted": inserted,
        "ended": true,
        "completed": ended.completed(),
        "cancelled": ended.cancelled(),
        "error": ended.error(),
        "result": result,
    });
    println!("{out}");
    Ok(if ended.completed() { 0 } else { 1 })
}

/// `mongocoord requeue`: lists the tasks the filter selects, asks (unless
/// `yes`), then requeues those it listed.
pub(crate) async fn requeue(
    store: &MongoStore,
    queue: &str,
    filter: &str,
    dry_run: bool,
    yes: bool,
    json: bool,
) -> Result<u8, CliError> {
    let ask = |n: usize| async move {
        if yes {
            return true;
        }
        eprint!("Requeue {n} failed or lapsed task(s) in {queue}? [y/N] ");
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        matches!(answer.trim(), "y" | "Y" | "yes")
    };
    requeue_asking(store, queue, filter, dry_run, json, ask).await
}

/// [`requeue`] with the question put by `ask` (given how many tasks the
/// preview found). The requeue acts on the ids the preview listed, never on
/// the filter read again: a task that fails while the operator reads the
/// question was not shown, and is left alone.
async fn requeue_asking<S, F, Fut>(
    store: &S,
    queue: &str,
    filter: &str,
    dry_run: bool,
    json: bool,
    ask: F,
) -> Result<u8, CliError>
where
    S: Store + Clone,
    F: FnOnce(usize) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let q = Queue::new(store.clone(), queue)?;
    let f = parse_filter(filter)?;
    let candidates = q.requeue(f).dry_run(true).await?;
    if dry_run || candidates.is_empty() {
        let ids: Vec<String> = candidates.iter().map(ToString::to_string).collect();
        if json {
            println!("{}", json!({ "dry_run": dry_run, "ids": ids }));
        } else {
            println!("{} task(s) would be requeued: {}", ids.len(), safe(&ids.join(" ")));
        }
        return Ok(0);
    }
    if !ask(candidates.len()).await {
        eprintln!("nothing changed");
        return Ok(1);
    }
    let done = q.requeue_ids(&candidates).await?;
    let ids: Vec<String> = done.iter().map(ToString::to_string).collect();
    if json {
        println!("{}", json!({ "dry_run": false, "ids": ids }));
    } else {
        println!("requeued {} task(s)", ids.len());
    }
    Ok(0)
}

/// `mongocoord watch` without `--queue`: a refreshing view of locks and
/// leaders (with `--queue`, the queue's events: `events::watch`).
pub(crate) async fn watch(store: &MongoStore, interval: f64, count: Option<u64>) -> Result<u8, CliError> {
    let interval = crate::args::seconds("interval", interval, false)?;
    // The screen is cleared only on a terminal: piped, the refreshes follow
    // one another.
    let clear = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut n = 0;
    loop {
        if clear {
            print!("\x1b[2J\x1b[H");
        }
        println!("mongocoord watch — {}", store.now().await?);
        println!("\nLOCKS");
        locks(store, mongolock::DEFAULT_COLLECTION, false).await?;
        println!("\nLEADERS");
        leaders(store, mongoelector::DEFAULT_COLLECTION, mongoelector::DEFAULT_STATUS_COLLECTION, false).await?;
        n += 1;
        if count.is_some_and(|c| n >= c) {
            return Ok(0);
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use store_trait::{Condition, Key, Mutation, Write};

    async fn failed_task<S: Store + Clone>(store: &S, id: &str) {
        let q = Queue::new(store.clone(), "jobs").unwrap();
        let (key, _) = q.enqueue(NewTask::new("resize", bson::doc! {}).id(id)).await.unwrap();
        let w = Write::new(
            Condition::Always,
            Mutation::new().set("complete", true).set("error_encountered", true).set("ready", false),
        );
        assert!(store.write(q.collection(), &key, &w).await.unwrap().is_applied());
    }

    /// A task that fails while the operator reads the question matches the
    /// filter by then, but was not shown: it is left alone.
    #[tokio::test]
    async fn requeue_acts_on_the_tasks_it_asked_about() {
        let store = store_memory::MemoryStore::new();
        failed_task(&store, "shown").await;
        let ask = |n: usize| {
            let store = store.clone();
            async move {
                assert_eq!(n, 1);
                failed_task(&store, "later").await;
                true
            }
        };
        assert_eq!(requeue_asking(&store, "jobs", r#"{"agent_name": "resize"}"#, false, true, ask).await.unwrap(), 0);
        let q = Queue::new(store.clone(), "jobs").unwrap();
        let ready = |id: &'static str| {
            let q = q.clone();
            async move {
                let key = Key::new(id).unwrap();
                q.tasks(bson::doc! { "_id": key.as_bson().clone() }, None).await.unwrap()[0].get_bool("ready")
            }
        };
        assert_eq!(ready("shown").await, Some(true));
        assert_eq!(ready("later").await, Some(false), "a task the question did not show was requeued");
    }
}
