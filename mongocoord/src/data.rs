//! What the operator views show, read once: locks, elections, queue counts,
//! tasks and schedules as serializable data, generic over the store. The CLI
//! views (`views.rs`, `schedules.rs`) print it; the dashboard renders it and
//! serves it as JSON. Each document schema has its one reader in the library
//! (`LockInfo`, `mongoelector::status`, `Queue`, `Schedules`); this module only
//! shapes what they return.

use std::collections::BTreeMap;

use bson::{doc, oid::ObjectId, Bson, Document};
use mongoagent::{fields, Queue};
use serde::Serialize;
use serde_json::{json, Value};
use store_trait::{Collection, Order, Query, Record, Store, StoreError, StoreResult};

use crate::error::CliError;

/// A collection name from the user, checked.
pub(crate) fn coll(name: &str) -> Result<Collection, CliError> {
    Ok(Collection::new(name)?)
}

/// A JSON object given by the user; `what` names it in errors ("filter",
/// "task").
pub(crate) fn parse_object(what: &str, text: &str) -> Result<Document, CliError> {
    let v: Value = serde_json::from_str(text)
        .map_err(|source| CliError::Json { what: format!("the {what} is not valid JSON"), source })?;
    match Bson::try_from(v).map_err(|source| CliError::Bson { what: format!("the {what} cannot be stored"), source })? {
        Bson::Document(d) => Ok(d),
        _ => Err(CliError::invalid(format!("the {what} must be a JSON object"))),
    }
}

/// Splits a per-document read into the records and what was skipped: documents
/// the store cannot read (another program's, with a UUID `_id` or a string
/// `fence`), each as `{"skipped": true, "key": <raw id>, "error": …}`. A view
/// lists the records and reports the rest instead of failing on the first.
pub(crate) fn readable(found: Vec<StoreResult<Record>>) -> (Vec<Record>, Vec<Value>) {
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

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One lock document as `mongocoord locks` shows it; expiry on the store clock.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LockRow {
    pub(crate) key: String,
    pub(crate) held: bool,
    pub(crate) holder: Option<String>,
    pub(crate) host: Option<String>,
    pub(crate) pid: Option<u32>,
    /// The fence.
    pub(crate) fence: u64,
    pub(crate) since_ms: Option<i64>,
    pub(crate) expires_in_ms: Option<u64>,
}

/// The lock collection: its readable documents and those skipped.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Locks {
    pub(crate) rows: Vec<LockRow>,
    pub(crate) skipped: Vec<Value>,
}

/// Reads every lock document, with expiry measured on the store's clock.
pub(crate) async fn locks<S: Store>(store: &S, collection: &str) -> Result<Locks, CliError> {
    let c = coll(collection)?;
    let now = store.now().await?;
    let found = store.find_each(&c, &Query::all().sort("_id", Order::Asc)).await?;
    let (records, skipped) = readable(found);
    let rows = records
        .iter()
        .map(|r| {
            let info = mongolock::LockInfo::from_record(r, Some(now));
            LockRow {
                key: r.key().to_string(),
                held: info.is_some(),
                holder: info.as_ref().map(|i| i.owner.clone()),
                host: info.as_ref().and_then(|i| i.host.clone()),
                pid: info.as_ref().and_then(|i| i.pid),
                fence: r.fence(),
                since_ms: info.as_ref().map(|i| i.since.as_millis()),
                expires_in_ms: info.as_ref().map(|i| millis(now.until(i.expires))),
            }
        })
        .collect();
    Ok(Locks { rows, skipped })
}

/// A node that reported on an election.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NodeRow {
    pub(crate) node: String,
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) version: String,
    pub(crate) is_leader: bool,
    pub(crate) last_seen_ms_ago: i64,
}

/// One election: its leader, the term's fence and the nodes.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ElectionRow {
    pub(crate) election: String,
    pub(crate) leader: Option<String>,
    /// The term's fence.
    pub(crate) fence: Option<u64>,
    pub(crate) since_ms: Option<i64>,
    pub(crate) expires_in_ms: Option<u64>,
    pub(crate) nodes: Vec<NodeRow>,
}

/// Every election, and status documents that could not be read.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Elections {
    pub(crate) elections: Vec<ElectionRow>,
    /// `{"id", "error"}` per status document skipped.
    pub(crate) skipped: Vec<Value>,
}

/// The seed's `cluster_detail` for every election; status documents are read
/// with the library's one reader (`mongoelector::status::read_reports`).
pub(crate) async fn elections<S: Store>(store: &S, collection: &str, status: &str) -> Result<Elections, CliError> {
    let (c, s) = (coll(collection)?, coll(status)?);
    let now = store.now().await?;
    // Each lease read on its own: one unreadable document (another
    // program's, a damaged one) is skipped and reported, not the end of the view.
    let mut bad_leases = Vec::new();
    let leases: Vec<store_trait::Record> = store
        .find_each(&c, &Query::all().sort("_id", Order::Asc))
        .await?
        .into_iter()
        .filter_map(|r| r.map_err(|e| bad_leases.push(json!({ "error": e.to_string() }))).ok())
        .collect();
    let reports = mongoelector::status::read_reports(store, &s, None).await?;
    let elections = leases
        .iter()
        .map(|e| {
            let key = e.key().to_string();
            let leader = mongolock::LockInfo::from_record(e, Some(now));
            let nodes = reports
                .nodes
                .iter()
                .filter(|n| n.key == key)
                .map(|n| NodeRow {
                    node: n.node.clone(),
                    host: n.host.clone(),
                    pid: n.pid,
                    version: n.version.clone(),
                    is_leader: n.is_leader,
                    last_seen_ms_ago: now.as_millis().saturating_sub(n.last_round.as_millis()),
                })
                .collect();
            ElectionRow {
                election: key,
                leader: leader.as_ref().map(|m| m.owner.clone()),
                fence: leader.as_ref().map(|m| m.fence),
                since_ms: leader.as_ref().map(|m| m.since.as_millis()),
                expires_in_ms: leader.as_ref().map(|m| millis(now.until(m.expires))),
                nodes,
            }
        })
        .collect();
    let mut skipped: Vec<Value> = bad_leases;
    skipped.extend(reports.skipped.iter().map(|b| json!({"id": b.id, "error": b.to_string()})));
    Ok(Elections { elections, skipped })
}

/// One agent's task counts by state.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StatsRow {
    pub(crate) ready: u64,
    pub(crate) delayed: u64,
    pub(crate) running: u64,
    pub(crate) lapsed: u64,
    pub(crate) waiting: u64,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    /// Whose latest attempt timed out (`QueueStats::timed_out`): beside the
    /// states, each also counted in one of them.
    pub(crate) timed_out: u64,
    pub(crate) oldest_ready_age_ms: Option<u64>,
    /// Whether the agent name is paused on the queue (`Queue::set_paused`).
    pub(crate) paused: bool,
}

impl StatsRow {
    /// The states, in the order the views show them.
    pub(crate) const STATES: [&'static str; 7] =
        ["ready", "delayed", "running", "lapsed", "waiting", "completed", "failed"];

    /// The counts in the order of [`StatsRow::STATES`].
    pub(crate) fn counts(&self) -> [u64; 7] {
        [self.ready, self.delayed, self.running, self.lapsed, self.waiting, self.completed, self.failed]
    }
}

/// A queue's counts per agent, and the documents skipped finding the agents.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct QueueCounts {
    pub(crate) agents: BTreeMap<String, StatsRow>,
    pub(crate) skipped: Vec<Value>,
}

/// How many of a queue's documents are read to report those the store
/// cannot read (another program's), beside its agent names.
pub(crate) const SKIPPED_SCAN: u32 = 1_000;

/// The agent names in a queue, and the documents the store cannot read among
/// the first [`SKIPPED_SCAN`]. The names come from one `distinct` on MongoDB,
/// served by the claim index (which leads with `agent_name`): neither the
/// queue's length nor its documents' size costs a scan, and no agent is left
/// out however long the queue. `mongocoord tasks --list` reads every document
/// it lists, and reports each it cannot read.
async fn agent_names<S: Store>(store: &S, c: &Collection) -> Result<(Vec<String>, Vec<Value>), CliError> {
    let names = store.distinct_strings(c, fields::AGENT_NAME, &Query::all()).await?;
    let found = store.find_each(c, &Query::all().limit(SKIPPED_SCAN)).await?;
    let (_, skipped) = readable(found);
    Ok((names, skipped))
}

/// Per-agent counts of a queue (`Queue::stats`), for one agent or all of them.
pub(crate) async fn queue_counts<S: Store + Clone>(
    store: &S,
    queue: &str,
    agent: Option<&str>,
) -> Result<QueueCounts, CliError> {
    let q = Queue::new(store.clone(), queue)?;
    let (names, skipped) = match agent {
        Some(a) => (vec![a.to_owned()], Vec::new()),
        None => agent_names(store, q.collection()).await?,
    };
    let mut agents = BTreeMap::new();
    let paused = q.paused_agents().await?;
    for n in &names {
        let s = q.stats(n).await?;
        agents.insert(
            n.clone(),
            StatsRow {
                ready: s.ready,
                delayed: s.delayed,
                running: s.running,
                lapsed: s.lapsed,
                waiting: s.waiting,
                completed: s.completed,
                failed: s.failed,
                timed_out: s.timed_out,
                oldest_ready_age_ms: s.oldest_ready_age.map(millis),
                paused: paused.contains(n),
            },
        );
    }
    Ok(QueueCounts { agents, skipped })
}

/// A task's state in words, from its fields: the one reading of them the
/// views share (`completed`, `failed`, `cancelled`, `held` by the overlap policy
/// or waiting for its group's turn,
/// `waiting` for follow-ups, `running` (claimed; the lease may have lapsed),
/// `ready`, or `pending`: a follow-up not yet active).
pub(crate) fn task_state(d: &Document) -> &'static str {
    let flag = |k: &str| d.get_bool(k).ok() == Some(true);
    if flag(fields::COMPLETE) {
        if flag(fields::CANCELLED) {
            "cancelled"
        } else if flag(fields::ERROR_ENCOUNTERED) {
            "failed"
        } else {
            "completed"
        }
    } else if flag(fields::OVERLAP_HELD) || flag(fields::GROUP_HELD) {
        "held"
    } else if d.contains_key(fields::WAITING) {
        "waiting"
    } else if flag(fields::CLAIMED) {
        "running"
    } else if flag(fields::READY) {
        "ready"
    } else {
        "pending"
    }
}

/// A task's latest attempt, in words, when it timed out ("attempt 2 timed
/// out after 1.5 s"): the library's reading of its fields
/// (`mongoagent::TimedOutAttempt`). None for a cancelled task, which
/// `Queue::stats` does not count either: an operator ended it.
pub(crate) fn timed_out(d: &Document) -> Option<String> {
    if d.get_bool(fields::CANCELLED).ok() == Some(true) {
        return None;
    }
    mongoagent::TimedOutAttempt::of(d).map(|t| t.to_string())
}

/// [`timed_out`] of a task as JSON ([`task_json`]).
pub(crate) fn timed_out_json(t: &Value) -> Option<String> {
    match Bson::try_from(t.clone()) {
        Ok(Bson::Document(d)) => timed_out(&d),
        _ => None,
    }
}

/// A task as JSON: `_id`, `fence`, then its fields (relaxed
/// extended JSON, so dates and ids stay readable).
pub(crate) fn task_json(r: &Record) -> Value {
    let mut d = doc! { "_id": r.key().as_bson().clone(), "fence": i64::try_from(r.fence()).unwrap_or(i64::MAX) };
    d.extend(r.data().clone());
    Bson::Document(d).into_relaxed_extjson()
}

/// Tasks in claim order, as JSON.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TaskList {
    pub(crate) tasks: Vec<Value>,
    pub(crate) skipped: Vec<Value>,
}

/// Tasks matching an equality filter in claim order, `skip` of them passed
/// over and at most `limit` listed (`Queue::tasks_page`: the store has no
/// offset, so the ids of the tasks before the page are read, never their
/// documents; callers bound `skip`).
pub(crate) async fn task_list<S: Store + Clone>(
    store: &S,
    queue: &str,
    filter: Document,
    skip: u32,
    limit: u32,
) -> Result<TaskList, CliError> {
    let q = Queue::new(store.clone(), queue)?;
    let found = q.tasks_page(filter, skip, limit).await?;
    let (records, skipped) = readable(found);
    Ok(TaskList { tasks: records.iter().map(task_json).collect(), skipped })
}

/// The tasks of an equality filter that failed for good, the latest to end
/// first, at most `limit` (`Queue::failed_tasks`): `requeue` revives them.
pub(crate) async fn failed_list<S: Store + Clone>(
    store: &S,
    queue: &str,
    filter: Document,
    limit: u32,
) -> Result<TaskList, CliError> {
    let q = Queue::new(store.clone(), queue)?;
    let found = q.failed_tasks(filter, Some(limit)).await?;
    let (records, skipped) = readable(found);
    Ok(TaskList { tasks: records.iter().map(task_json).collect(), skipped })
}

/// One task with its parent and children.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TaskDetail {
    pub(crate) task: Value,
    pub(crate) parent: Option<String>,
    pub(crate) children: Vec<Value>,
}

/// A string id the command line would read back as an `ObjectId` ([`task_id`]):
/// refused where ids are given to new tasks, so that an id typed in an
/// operator's command always names the task it was shown for.
pub(crate) fn check_new_task_id(id: &str) -> Result<(), CliError> {
    match task_id(id) {
        Bson::ObjectId(_) => Err(CliError::invalid(format!(
            "the id {id:?} is 24 hex digits, which the command line reads as an ObjectId: give another id, or none for a fresh ObjectId"
        ))),
        _ => Ok(()),
    }
}

/// A task id as typed: a 24-digit hex string is an `ObjectId`, anything else a
/// string id.
pub(crate) fn task_id(id: &str) -> Bson {
    match ObjectId::parse_str(id) {
        Ok(oid) if id.len() == 24 => Bson::ObjectId(oid),
        _ => Bson::String(id.to_owned()),
    }
}

/// The task with id `id`, its parent's id and its children (at most 100).
pub(crate) async fn task_detail<S: Store + Clone>(
    store: &S,
    queue: &str,
    id: &str,
) -> Result<Option<TaskDetail>, CliError> {
    let q = Queue::new(store.clone(), queue)?;
    let id = task_id(id);
    let found = q.tasks_each(doc! { "_id": id.clone() }, Some(1)).await?;
    let r = match found.into_iter().next() {
        None => return Ok(None),
        Some(Err(e)) => return Err(CliError::UnreadableTask(e)),
        Some(Ok(r)) => r,
    };
    let parent = r.data().get(fields::PARENT).map(|p| match p {
        Bson::String(s) => s.clone(),
        Bson::ObjectId(o) => o.to_hex(),
        other => other.to_string(),
    });
    let found = q.tasks_each(doc! { fields::PARENT: id }, Some(100)).await?;
    let children = readable(found).0.iter().map(task_json).collect();
    Ok(Some(TaskDetail { task: task_json(&r), parent, children }))
}
