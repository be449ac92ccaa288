//! Commands sent to the server, counted with the driver's command monitoring:
//! the total, and a breakdown by command name and the kind of operation it
//! carries (a claim by filter, a write by `_id`, a change-stream `getMore`…),
//! so a figure of commands per task says where the commands go; and the time
//! each kind took, from its start to its reply, so a figure says which
//! commands cost the time, not only how many there are.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use store_mongo::mongodb::event::command::CommandEvent;
use store_mongo::mongodb::event::EventHandler;
use store_mongo::mongodb::options::ClientOptions;
use store_mongo::mongodb::Client;
use store_mongo::MongoStore;

use crate::error::LabError;

/// The counters of one client.
#[derive(Debug, Default)]
pub(crate) struct Commands {
    total: AtomicU64,
    by_kind: Mutex<BTreeMap<String, u64>>,
    /// The kind of each command sent and not answered yet, by request id.
    pending: Mutex<HashMap<i32, String>>,
    /// Microseconds from start to reply, summed by kind.
    micros: Mutex<BTreeMap<String, u64>>,
}

/// Counts at one moment, or between two.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counts {
    pub(crate) total: u64,
    pub(crate) by_kind: BTreeMap<String, u64>,
    /// Microseconds by kind (in this process's counts only).
    pub(crate) micros: BTreeMap<String, u64>,
}

impl Commands {
    fn record(&self, request: i32, kind: String) {
        self.total.fetch_add(1, Ordering::Relaxed);
        *self.by_kind.lock().entry(kind.clone()).or_default() += 1;
        self.pending.lock().insert(request, kind);
    }

    fn answered(&self, request: i32, took: std::time::Duration) {
        if let Some(kind) = self.pending.lock().remove(&request) {
            let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            *self.micros.lock().entry(kind).or_default() += us;
        }
    }

    /// The counts so far.
    pub(crate) fn snapshot(&self) -> Counts {
        Counts {
            total: self.total.load(Ordering::Relaxed),
            by_kind: self.by_kind.lock().clone(),
            micros: self.micros.lock().clone(),
        }
    }
}

impl Counts {
    /// What was counted after `earlier`.
    pub(crate) fn since(&self, earlier: &Counts) -> Counts {
        let by_kind = self
            .by_kind
            .iter()
            .map(|(k, v)| (k.clone(), v - earlier.by_kind.get(k).copied().unwrap_or_default()))
            .filter(|(_, v)| *v > 0)
            .collect();
        let micros = self
            .micros
            .iter()
            .map(|(k, v)| (k.clone(), v.saturating_sub(earlier.micros.get(k).copied().unwrap_or_default())))
            .filter(|(_, v)| *v > 0)
            .collect();
        Counts { total: self.total - earlier.total, by_kind, micros }
    }

    /// The mean milliseconds from start to reply of each kind that has times.
    pub(crate) fn mean_ms(&self) -> Vec<(String, f64)> {
        self.micros
            .iter()
            .filter_map(|(k, us)| {
                let n = self.by_kind.get(k).copied().filter(|n| *n > 0)?;
                Some((k.clone(), *us as f64 / n as f64 / 1e3))
            })
            .collect()
    }

    /// Milliseconds of command time (start to reply, summed over commands
    /// that overlap) per task.
    pub(crate) fn command_ms_per_task(&self, tasks: u32) -> f64 {
        self.micros.values().sum::<u64>() as f64 / 1e3 / f64::from(tasks.max(1))
    }

    /// Adds `other`'s counts (another process's).
    pub(crate) fn add(&mut self, other: &Counts) {
        self.total += other.total;
        for (k, v) in &other.by_kind {
            *self.by_kind.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &other.micros {
            *self.micros.entry(k.clone()).or_default() += v;
        }
    }

    /// `kind=count` words, for a report line.
    pub(crate) fn words(&self) -> String {
        self.by_kind.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
    }

    /// Parses [`Counts::words`].
    pub(crate) fn parse_words<'a>(words: impl Iterator<Item = &'a str>) -> Result<Counts, LabError> {
        let mut c = Counts::default();
        for w in words {
            let (k, v) = w.split_once('=').ok_or_else(|| LabError::Unreadable(format!("bad count {w:?}")))?;
            let v: u64 = v.parse().map_err(|e| LabError::Number { what: format!("bad count {w:?}"), source: e })?;
            c.total += v;
            *c.by_kind.entry(k.to_owned()).or_default() += v;
        }
        Ok(c)
    }

    /// The breakdown per task, one line per kind, most frequent first.
    pub(crate) fn per_task(&self, tasks: u32) -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> =
            self.by_kind.iter().map(|(k, n)| (k.clone(), *n as f64 / f64::from(tasks.max(1)))).collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v
    }
}

/// The kind of a command: its name, and for the commands a queue sends, what
/// it addresses (one document by `_id`, or a filter; a pipeline update or not;
/// a `getMore` of the control collection or not).
fn kind(name: &str, command: &bson::Document) -> String {
    let by_id = |filter: Option<&bson::Document>| match filter {
        Some(f) if f.contains_key("_id") => "by_id",
        Some(_) => "by_filter",
        None => "all",
    };
    match name {
        "findAndModify" => format!("findAndModify:{}", by_id(command.get_document("query").ok())),
        "find" => format!("find:{}", by_id(command.get_document("filter").ok())),
        "update" => {
            let n = command.get_array("updates").map_or(0, |u| u.len());
            let many = command
                .get_array("updates")
                .ok()
                .and_then(|u| u.first())
                .and_then(|s| s.as_document())
                .and_then(|s| s.get_bool("multi").ok())
                .unwrap_or(false);
            format!("update:{}{}", if many { "multi" } else { "one" }, if n > 1 { "_batched" } else { "" })
        }
        "aggregate" => {
            let change_stream = command
                .get_array("pipeline")
                .ok()
                .and_then(|p| p.first())
                .and_then(|s| s.as_document())
                .is_some_and(|s| s.contains_key("$changeStream"));
            if change_stream {
                "aggregate:changeStream".into()
            } else {
                "aggregate".into()
            }
        }
        // A cursor's next batch, by what it reads: the control collection
        // (pause documents, permits, rate slots) or the queue.
        "getMore" => match command.get_str("collection") {
            Ok(c) if c.ends_with("_control") => "getMore:control".into(),
            _ => "getMore".into(),
        },
        other => other.to_owned(),
    }
}

/// A store on a client of its own whose command monitoring counts every command
/// it sends (claims, completions, renewals, change-stream `getMore`s, index
/// builds: everything), and its counters.
pub(crate) async fn counted_store(uri: &str, db: &str) -> Result<(MongoStore, Arc<Commands>), LabError> {
    let mut opts = ClientOptions::parse(uri).await?;
    let commands = Arc::new(Commands::default());
    let counter = commands.clone();
    opts.command_event_handler = Some(EventHandler::callback(move |ev: CommandEvent| match ev {
        CommandEvent::Started(s) => counter.record(s.request_id, kind(&s.command_name, &s.command)),
        CommandEvent::Succeeded(s) => counter.answered(s.request_id, s.duration),
        CommandEvent::Failed(s) => counter.answered(s.request_id, s.duration),
        _ => {}
    }));
    let client = Client::with_options(opts)?;
    let store = MongoStore::new(client.database(db));
    crate::CLIENTS.keep_store(&store);
    Ok((store, commands))
}
