//! The chaos run's checker: reads every worker's log and the store
//! afterwards and verifies the history (see the module's docs for the lines).

use mongoagent::fields;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use bson::doc;
use store_mongo::MongoStore;
use store_trait::{Collection, Query, Store};

use super::limited::{Overlap, Runs};
use super::names::{QUEUE, SEEDED};
use super::pause::{PauseReport, Pauses};
use crate::error::LabError;

#[derive(Debug, Default)]
pub(super) struct Report {
    pub(super) acquisitions: usize,
    pub(super) writes_ok: usize,
    pub(super) writes_rejected: usize,
    pub(super) terms: usize,
    pub(super) tasks: u64,
    pub(super) stale: usize,
    pub(super) joins: usize,
    pub(super) fork_fences: usize,
    pub(super) fork_writes_ok: usize,
    /// The last server time a forked ledger writer reported running.
    pub(super) last_fork_hold: Option<i64>,
    /// The limited agent's runs, and its tasks in the store.
    pub(super) limited: Overlap,
    pub(super) limited_tasks: usize,
    /// The grouped agent's runs, and its tasks in the store.
    pub(super) grouped: super::grouped::Report,
    pub(super) grouped_tasks: usize,
    pub(super) pause: PauseReport,
    pub(super) violations: Vec<String>,
}

/// Reads every worker's log and the store, and verifies the history.
pub(super) async fn check(store: &MongoStore, logs: &Path) -> Result<Report, LabError> {
    let mut r = Report::default();
    // fence -> (first, last) server time at which its holder confirmed it held.
    // The first confirmation, not the lease's `since`, marks the start: a server
    // stamps `$$NOW` when a command starts, which can be before the write takes
    // effect (seen: 22 ms on a loaded SecantusDB), so `since` may precede the
    // moment the previous holder's lease was really gone.
    let mut holds: BTreeMap<u64, (i64, i64)> = BTreeMap::new();
    let mut terms: BTreeMap<u64, (i64, i64)> = BTreeMap::new();
    let mut writes: Vec<(u64, u64)> = Vec::new();
    let mut fork_holds: BTreeMap<u64, (i64, i64)> = BTreeMap::new();
    let mut fork_writes: Vec<(u64, u64)> = Vec::new();
    let mut done: HashMap<String, usize> = HashMap::new();
    let (mut runs, mut pauses) = (Runs::default(), Pauses::default());
    let mut gruns = super::grouped::Runs::default();
    let entries = std::fs::read_dir(logs).map_err(|e| LabError::io(format!("cannot list {}", logs.display()), e))?;
    for e in entries.flatten() {
        let path = e.path();
        let text =
            std::fs::read_to_string(&path).map_err(|e| LabError::io(format!("cannot read {}", path.display()), e))?;
        let source = e.path().file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            runs.line(&f);
            gruns.line(&f);
            pauses.line(&source, &f);
            let num = |i: usize| f.get(i).and_then(|s| s.parse::<i64>().ok());
            match (f.first().copied(), num(1), num(2)) {
                (Some("acq"), Some(_), Some(_)) => r.acquisitions += 1,
                (Some("hold"), Some(t), Some(now)) => {
                    let e = holds.entry(t as u64).or_insert((now, now));
                    e.0 = e.0.min(now);
                    e.1 = e.1.max(now);
                }
                (Some("write"), Some(t), Some(rev)) => {
                    if f.get(3) == Some(&"ok") {
                        r.writes_ok += 1;
                        writes.push((rev as u64, t as u64));
                    } else {
                        r.writes_rejected += 1;
                    }
                }
                (Some("lead"), Some(t), Some(now)) => {
                    let e = terms.entry(t as u64).or_insert((now, now));
                    e.0 = e.0.min(now);
                    e.1 = e.1.max(now);
                }
                (Some("done"), _, _) => *done.entry(f.get(1).unwrap_or(&"").to_string()).or_default() += 1,
                (Some("stale"), _, _) => r.stale += 1,
                (Some("fhold"), Some(t), Some(now)) => {
                    let e = fork_holds.entry(t as u64).or_insert((now, now));
                    e.0 = e.0.min(now);
                    e.1 = e.1.max(now);
                    r.last_fork_hold = Some(r.last_fork_hold.map_or(now, |l| l.max(now)));
                }
                (Some("fwrite"), Some(t), Some(rev)) if f.get(3) == Some(&"ok") => {
                    r.fork_writes_ok += 1;
                    fork_writes.push((rev as u64, t as u64));
                }
                (Some("joined"), _, _) => {
                    r.joins += 1;
                    if f.get(2) != f.get(3) || f.get(3) != Some(&"2") {
                        r.violations.push(format!("{line}: ran again before both follow-ups ended"));
                    }
                }
                _ => {}
            }
        }
    }
    // No holder confirmed it still held the lock after a later fence's holder had
    // confirmed its own (both on the server clock).
    let check_overlaps = |m: &BTreeMap<u64, (i64, i64)>, what: &str, v: &mut Vec<String>| {
        let list: Vec<(u64, i64, i64)> = m.iter().map(|(t, (f, l))| (*t, *f, *l)).collect();
        for (i, (t, _, last)) in list.iter().enumerate() {
            for (t2, first2, _) in &list[i + 1..] {
                if last > first2 {
                    v.push(format!(
                        "{what} {t} was still believed held at {last} after {what} {t2} was held at {first2}"
                    ));
                }
            }
        }
    };
    check_overlaps(&holds, "lock fence", &mut r.violations);
    check_overlaps(&terms, "term", &mut r.violations);
    check_overlaps(&fork_holds, "forked runner fence", &mut r.violations);
    r.limited = runs.check(&mut r.violations);
    r.grouped = gruns.check(&mut r.violations);
    r.pause = pauses.check(&mut r.violations);
    r.fork_fences = fork_holds.len();
    r.terms = terms.len();
    check_fenced_writes(writes, "ledger", &mut r.violations);
    check_fenced_writes(fork_writes, "fork ledger", &mut r.violations);
    for (task, n) in &done {
        if *n > 1 {
            r.violations.push(format!("task {task} reported finished {n} times"));
        }
    }
    // The store: every task ended; two follow-ups per completed seeded task.
    let coll = Collection::new(QUEUE)?;
    let mut all = Vec::new();
    let mut debris = Vec::new();
    let mut unreadable = 0;
    for r in store.find_each(&coll, &Query::all()).await? {
        match r {
            // A stale run's follow-ups that the holder's outcome did not take
            // over stay pending and inert: not tasks (checked below).
            Ok(t) if t.data().contains_key(fields::PENDING_PARENT_FENCE) => debris.push(t),
            Ok(t) => all.push(t),
            Err(_) => unreadable += 1,
        }
    }
    r.limited_tasks = super::limited::check_store(store, &pauses.seeded, &mut r.violations).await?;
    r.grouped_tasks = super::grouped::check_store(store, &gruns.seeded, &mut r.violations).await?;
    for d in &debris {
        let parent = d.data().get(fields::PARENT).and_then(|p| all.iter().find(|t| t.key().as_bson() == p));
        if parent.is_none_or(|p| p.data().get_bool(fields::COMPLETE).ok() != Some(true)) {
            r.violations.push(format!("pending follow-up {} of a parent that has not ended", d.key()));
        }
    }
    let foreign = foreign_tasks().len();
    if unreadable != foreign {
        r.violations.push(format!("{unreadable} unreadable documents in the queue, {foreign} foreign ones inserted"));
    }
    // The foreign documents were never claimed (nor changed at all).
    let raw = store.database().collection::<bson::Document>(QUEUE);
    let untouched =
        raw.count_documents(doc! { "foreign": true, "ready": true, "lease_owner": { "$exists": false } }).await?;
    if untouched != foreign as u64 {
        r.violations.push(format!("{} of {foreign} foreign documents were changed", foreign as u64 - untouched));
    }
    r.tasks = all.len() as u64;
    let open: Vec<String> = all
        .iter()
        .filter(|t| t.data().get_bool(fields::COMPLETE).ok() != Some(true))
        .map(|t| t.key().to_string())
        .collect();
    if !open.is_empty() {
        r.violations.push(format!("{} task(s) never finished, e.g. {}", open.len(), open[0]));
    }
    let seeded = all.iter().filter(|t| !t.data().contains_key(fields::PARENT)).count();
    if seeded != SEEDED as usize {
        r.violations.push(format!("{seeded} seeded tasks of {SEEDED} are in the store"));
    }
    let completed_parents = all
        .iter()
        .filter(|t| {
            t.data().get_i32("stage").ok() == Some(0)
                && t.data().get_bool(fields::ERROR_ENCOUNTERED).ok() == Some(false)
        })
        .count();
    let children = all.iter().filter(|t| t.data().contains_key(fields::PARENT)).count();
    if children != 2 * completed_parents {
        r.violations.push(format!("{children} follow-ups for {completed_parents} completed parents (want two each)"));
    }
    // Odd seeded tasks that completed waited for their follow-ups once.
    for t in &all {
        let odd = t.data().get_i64("i").is_ok_and(|i| i % 2 == 1);
        let completed = t.data().get_bool(fields::ERROR_ENCOUNTERED).ok() == Some(false);
        if odd && completed && t.data().get_i64("round").ok() != Some(1) {
            r.violations.push(format!("task {} completed without waiting for its follow-ups once", t.key()));
        }
    }
    Ok(r)
}

/// Accepted fenced writes, in the order the server applied them (the ledger's
/// revision), never go back to an older fence; and no revision was handed out
/// twice (which would mean the server lost acknowledged writes).
fn check_fenced_writes(mut writes: Vec<(u64, u64)>, what: &str, violations: &mut Vec<String>) {
    writes.sort();
    for w in writes.windows(2) {
        if w[1].0 == w[0].0 {
            violations.push(format!(
                "{what} revision {} acknowledged twice (fences {} and {}): acknowledged writes were lost",
                w[0].0, w[0].1, w[1].1
            ));
        } else if w[1].1 < w[0].1 {
            violations.push(format!("{what}: fenced write with fence {} accepted after fence {}", w[1].1, w[0].1));
        }
    }
}

/// Tasks written by another program that no agent can read: an `_id` of an
/// unsupported type, a fence that is a string, an owner without an expiry.
pub(super) fn foreign_tasks() -> Vec<bson::Document> {
    let uuid = bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] };
    vec![
        doc! { "_id": uuid, "agent_name": "chaos", "ready": true, "foreign": true, "stage": 1 },
        doc! { "_id": "foreign-fence", "agent_name": "chaos", "ready": true, "foreign": true, "fence": "7", "stage": 1 },
        doc! { "_id": "foreign-owner", "agent_name": "chaos", "ready": true, "foreign": true, "lease_owner_x": 1,
        "rev": "x", "stage": 1 },
    ]
}
