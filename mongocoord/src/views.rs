//! Operator views: who holds which lock until when, who leads, what is stuck in
//! which queue; and repairs (enqueue, requeue). Tables for people, `--json` for
//! scripts.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::time::Duration;

use bson::{doc, Bson, Document};
use mongoagent::{NewTask, Queue};
use serde_json::{json, Value};
use store_mongo::MongoStore;
use store_trait::{Collection, Query, Record, Store, StoreError, StoreResult, StoreTime};

fn coll(name: &str) -> Result<Collection, String> {
    Collection::new(name).map_err(|e| e.to_string())
}

/// A JSON object from the command line; `what` names it in errors ("filter",
/// "task").
fn parse_object(what: &str, text: &str) -> Result<Document, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("the {what} is not valid JSON: {e}"))?;
    match Bson::try_from(v).map_err(|e| format!("the {what} cannot be stored: {e}"))? {
        Bson::Document(d) => Ok(d),
        _ => Err(format!("the {what} must be a JSON object")),
    }
}

fn parse_filter(text: &str) -> Result<Document, String> {
    parse_object("filter", text)
}

fn ms(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect::<Vec<_>>().join("  ")
    };
    println!("{}", line(header.to_vec()).trim_end());
    for r in rows {
        println!("{}", line(r.iter().map(String::as_str).collect()).trim_end());
    }
}

/// Splits a per-document read into the records and what was skipped: documents
/// the store cannot read (another program's, with a UUID `_id` or a string
/// `fence`), each as `{"skipped": true, "key": <raw id>, "error": …}`. A view
/// lists the records and reports the rest instead of failing on the first.
fn readable(found: Vec<StoreResult<Record>>) -> (Vec<Record>, Vec<Value>) {
    let mut records = Vec::with_capacity(found.len());
    let mut skipped = Vec::new();
    for r in found {
        match r {
            Ok(r) => records.push(r),
            Err(StoreError::Malformed { key, reason, .. }) => {
                skipped.push(json!({ "skipped": true, "key": key, "error": reason }))
            }
            Err(e) => skipped.push(json!({ "skipped": true, "key": Value::Null, "error": e.to_string() })),
        }
    }
    (records, skipped)
}

/// Tells the operator, on stderr, which documents a view skipped.
fn report_skipped(what: &str, skipped: &[Value]) {
    if skipped.is_empty() {
        return;
    }
    eprintln!("skipped {} {what} document(s) that cannot be read:", skipped.len());
    for s in skipped {
        eprintln!("  {}: {}", s["key"].as_str().unwrap_or("?"), s["error"].as_str().unwrap_or_default());
    }
}

fn lock_json(r: &Record, now: StoreTime) -> Value {
    let info = mongolock::LockInfo::from_record(r, Some(now));
    json!({
        "key": r.key().to_string(),
        "held": info.is_some(),
        "holder": info.as_ref().map(|i| i.owner.clone()),
        "host": info.as_ref().and_then(|i| i.host.clone()),
        "pid": info.as_ref().and_then(|i| i.pid),
        "token": r.fence(),
        "since_ms": info.as_ref().map(|i| i.since.as_millis()),
        "expires_in_ms": info.as_ref().map(|i| now.until(i.expires).as_millis() as u64),
    })
}

/// `mongocoord locks`.
pub(crate) async fn locks(store: &MongoStore, collection: &str, json: bool) -> Result<u8, String> {
    let c = coll(collection)?;
    let now = store.now().await.map_err(|e| e.to_string())?;
    let found =
        store.find_each(&c, &Query::all().sort("_id", store_trait::Order::Asc)).await.map_err(|e| e.to_string())?;
    let (records, skipped) = readable(found);
    report_skipped("lock", &skipped);
    let rows: Vec<Value> = records.iter().map(|r| lock_json(r, now)).collect();
    if json {
        // Skipped documents follow the locks, marked `"skipped": true`.
        println!("{}", Value::Array(rows.into_iter().chain(skipped).collect()));
        return Ok(0);
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|v| {
            vec![
                v["key"].as_str().unwrap_or_default().to_owned(),
                v["holder"].as_str().unwrap_or("-").to_owned(),
                v["token"].to_string(),
                v["expires_in_ms"].as_u64().map_or("-".into(), |m| ms(Duration::from_millis(m))),
            ]
        })
        .collect();
    print_table(&["KEY", "HOLDER", "TOKEN", "EXPIRES IN"], &table);
    Ok(0)
}

/// `mongocoord leaders`: the seed's `cluster_detail` for every election. Status
/// documents are read with the library's schema (`mongoelector::status`); those
/// it cannot read are listed on stderr and under `skipped` in `--json`.
pub(crate) async fn leaders(store: &MongoStore, collection: &str, status: &str, json: bool) -> Result<u8, String> {
    let (c, s) = (coll(collection)?, coll(status)?);
    let now = store.now().await.map_err(|e| e.to_string())?;
    let elections =
        store.find(&c, &Query::all().sort("_id", store_trait::Order::Asc)).await.map_err(|e| e.to_string())?;
    let reports = mongoelector::status::read_reports(store, &s, None).await.map_err(|e| e.to_string())?;
    for bad in &reports.skipped {
        eprintln!("mongocoord: skipped {bad}");
    }
    let mut out = Vec::new();
    for e in &elections {
        let key = e.key().to_string();
        let master = mongolock::LockInfo::from_record(e, Some(now));
        let nodes: Vec<Value> = reports
            .nodes
            .iter()
            .filter(|n| n.election == key)
            .map(|n| {
                json!({
                    "node": n.node,
                    "host": n.host,
                    "pid": n.pid,
                    "version": n.version,
                    "is_master": n.is_master,
                    "last_seen_ms_ago": now.as_millis().saturating_sub(n.last_poll.as_millis()),
                })
            })
            .collect();
        out.push(json!({
            "election": key,
            "master": master.as_ref().map(|m| m.owner.clone()),
            "token": master.as_ref().map(|m| m.token),
            "since_ms": master.as_ref().map(|m| m.since.as_millis()),
            "expires_in_ms": master.as_ref().map(|m| now.until(m.expires).as_millis() as u64),
            "nodes": nodes,
        }));
    }
    if json {
        let skipped: Vec<Value> = reports.skipped.iter().map(|b| json!({"id": b.id, "error": b.to_string()})).collect();
        println!("{}", json!({ "elections": out, "skipped": skipped }));
        return Ok(0);
    }
    let mut rows = Vec::new();
    for e in &out {
        let nodes = e["nodes"].as_array().map(|n| n.len()).unwrap_or(0);
        rows.push(vec![
            e["election"].as_str().unwrap_or_default().to_owned(),
            e["master"].as_str().unwrap_or("(none)").to_owned(),
            e["token"].to_string(),
            nodes.to_string(),
        ]);
    }
    print_table(&["ELECTION", "MASTER", "TERM", "NODES"], &rows);
    Ok(0)
}

/// The agent names in a queue, and the documents skipped on the way.
async fn agent_names(store: &MongoStore, c: &Collection) -> Result<(Vec<String>, Vec<Value>), String> {
    // A scan of names only; queues with millions of tasks should pass --agent.
    let found = store.find_each(c, &Query::all().limit(100_000)).await.map_err(|e| e.to_string())?;
    let (all, skipped) = readable(found);
    let mut names: Vec<String> =
        all.iter().filter_map(|r| r.data().get_str("agent_name").ok().map(str::to_owned)).collect();
    names.sort();
    names.dedup();
    Ok((names, skipped))
}

/// Which tasks `mongocoord tasks` shows.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Only<'a> {
    /// Only this agent's.
    pub(crate) agent: Option<&'a str>,
    /// Only the ticks of this schedule (with `--list`).
    pub(crate) schedule: Option<&'a str>,
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
) -> Result<u8, String> {
    let q = Queue::new(store.clone(), queue).map_err(|e| e.to_string())?;
    if list {
        let mut f = filter.map(parse_filter).transpose()?.unwrap_or_default();
        if let Some(a) = only.agent {
            f.insert(mongoagent::fields::AGENT_NAME, a);
        }
        if let Some(s) = only.schedule {
            f.insert(mongoagent::fields::SCHEDULE, s);
        }
        let (tasks, skipped) = readable(q.tasks_each(f, Some(limit)).await.map_err(|e| e.to_string())?);
        report_skipped("task", &skipped);
        let docs: Vec<Value> = tasks
            .iter()
            .map(|r| {
                let mut d = doc! { "_id": r.key().as_bson().clone(), "token": r.fence() as i64 };
                d.extend(r.data().clone());
                Bson::Document(d).into_relaxed_extjson()
            })
            // Skipped documents follow the tasks, marked `"skipped": true`.
            .chain(skipped)
            .collect();
        if json {
            println!("{}", Value::Array(docs));
        } else {
            for d in docs {
                println!("{d}");
            }
        }
        return Ok(0);
    }
    let (names, skipped) = match only.agent {
        Some(a) => (vec![a.to_owned()], Vec::new()),
        None => agent_names(store, q.collection()).await?,
    };
    report_skipped("task", &skipped);
    let mut out = BTreeMap::new();
    for n in &names {
        let s = q.stats(n).await.map_err(|e| e.to_string())?;
        out.insert(
            n.clone(),
            json!({
                "ready": s.ready, "delayed": s.delayed, "running": s.running, "stuck": s.stuck,
                "waiting": s.waiting, "completed": s.completed, "failed": s.failed,
                "oldest_ready_age_ms": s.oldest_ready_age.map(|d| d.as_millis() as u64),
            }),
        );
    }
    if json {
        let mut v = json!(out);
        // Counts read no document, so they include unreadable ones; the agents
        // those belong to are unknown. The list goes under `$skipped`, and only
        // when something was skipped, so the per-agent shape stays as it was.
        if !skipped.is_empty() {
            v["$skipped"] = Value::Array(skipped);
        }
        println!("{v}");
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = out
        .iter()
        .map(|(n, v)| {
            let mut r = vec![n.clone()];
            for k in ["ready", "delayed", "running", "stuck", "waiting", "completed", "failed"] {
                r.push(v[k].to_string());
            }
            r.push(v["oldest_ready_age_ms"].as_u64().map_or("-".into(), |m| ms(Duration::from_millis(m))));
            r
        })
        .collect();
    print_table(
        &["AGENT", "READY", "DELAYED", "RUNNING", "STUCK", "WAITING", "COMPLETED", "FAILED", "OLDEST READY"],
        &rows,
    );
    Ok(0)
}

/// Options of `mongocoord enqueue`.
#[derive(Debug)]
pub(crate) struct EnqueueOpts {
    pub(crate) priority: i64,
    pub(crate) delay: Option<f64>,
    pub(crate) dedupe_key: Option<String>,
    pub(crate) id: Option<String>,
}

/// `mongocoord enqueue`.
pub(crate) async fn enqueue(
    store: &MongoStore,
    queue: &str,
    agent: &str,
    data: &str,
    o: EnqueueOpts,
    json: bool,
) -> Result<u8, String> {
    let q = Queue::new(store.clone(), queue).map_err(|e| e.to_string())?;
    let mut t = NewTask::new(agent, parse_object("task", data)?).priority(o.priority);
    if let Some(d) = o.delay {
        t = t.delay(crate::args::seconds("delay", d, true)?);
    }
    if let Some(k) = o.dedupe_key {
        t = t.dedupe_key(k);
    }
    if let Some(id) = o.id {
        t = t.id(id);
    }
    let (id, new) = q.enqueue(t).await.map_err(|e| e.to_string())?;
    if json {
        println!("{}", json!({ "id": id.to_string(), "inserted": new }));
    } else {
        println!("{} {id}", if new { "enqueued" } else { "duplicate, not enqueued:" });
    }
    Ok(0)
}

/// `mongocoord requeue`.
pub(crate) async fn requeue(
    store: &MongoStore,
    queue: &str,
    filter: &str,
    dry_run: bool,
    yes: bool,
    json: bool,
) -> Result<u8, String> {
    let q = Queue::new(store.clone(), queue).map_err(|e| e.to_string())?;
    let f = parse_filter(filter)?;
    let candidates = q.requeue(f.clone(), true).await.map_err(|e| e.to_string())?;
    if dry_run || candidates.is_empty() {
        let ids: Vec<String> = candidates.iter().map(ToString::to_string).collect();
        if json {
            println!("{}", json!({ "dry_run": dry_run, "ids": ids }));
        } else {
            println!("{} task(s) would be requeued: {}", ids.len(), ids.join(" "));
        }
        return Ok(0);
    }
    if !yes {
        eprint!("Requeue {} failed or stuck task(s) in {queue}? [y/N] ", candidates.len());
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("nothing changed");
            return Ok(1);
        }
    }
    let done = q.requeue(f, false).await.map_err(|e| e.to_string())?;
    let ids: Vec<String> = done.iter().map(ToString::to_string).collect();
    if json {
        println!("{}", json!({ "dry_run": false, "ids": ids }));
    } else {
        println!("requeued {} task(s)", ids.len());
    }
    Ok(0)
}

/// `mongocoord watch`: a refreshing view.
pub(crate) async fn watch(
    store: &MongoStore,
    queue: Option<&str>,
    interval: f64,
    count: Option<u64>,
) -> Result<u8, String> {
    let interval = crate::args::seconds("interval", interval, false)?;
    let mut n = 0;
    loop {
        print!("\x1b[2J\x1b[H");
        println!("mongocoord watch — {}", store.now().await.map_err(|e| e.to_string())?);
        println!("\nLOCKS");
        locks(store, mongolock::DEFAULT_COLLECTION, false).await?;
        println!("\nLEADERS");
        leaders(store, mongoelector::DEFAULT_COLLECTION, mongoelector::DEFAULT_STATUS_COLLECTION, false).await?;
        if let Some(q) = queue {
            println!("\nTASKS in {q}");
            tasks(store, q, Only::default(), false, None, 0, false).await?;
        }
        n += 1;
        if count.is_some_and(|c| n >= c) {
            return Ok(0);
        }
        tokio::time::sleep(interval).await;
    }
}
