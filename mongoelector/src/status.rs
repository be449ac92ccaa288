//! Status documents: the schema every node writes once per round, and its one
//! reader ([`read_reports`]), which `mongocoord leaders` calls as well.
//!
//! One document per node and election, with the `_id` `election/node`, in the
//! status collection ([`crate::DEFAULT_STATUS_COLLECTION`]). Each carries a
//! `gc_at` some ten ttls (at least a minute) after its last report, and the
//! elector ensures the TTL index ([`IndexSpec::gc`]) on the collection, so the
//! documents of nodes that stopped are deleted; [`crate::Elector::cluster_detail`]
//! lists only the nodes that reported within the last three ttls.

use std::time::Duration;

use bson::doc;
use mongolock::{Identity, LockInfo};
use store_trait::{Collection, Condition, IndexSpec, Key, Mutation, Order, Query, Record, Store, StoreError};
use store_trait::{StoreTime, Ttl, Write, WriteOutcome};

use crate::error::{ElectorError, MalformedReport};
use crate::inner::Inner;

/// The status document's field names.
pub mod fields {
    /// The election key ([`NodeReport::key`](super::NodeReport::key)).
    pub const ELECTION: &str = "election";
    /// The node's identity (`host/pid/instance`).
    pub const NODE: &str = "node";
    /// The node's host.
    pub const HOST: &str = "host";
    /// The node's process id.
    pub const PID: &str = "pid";
    /// The application's version.
    pub const VERSION: &str = "version";
    /// Whether the node reported itself leader.
    pub const IS_LEADER: &str = "is_leader";
    /// When the node last reported, at the end of its last round (a date,
    /// store clock). Stored under the seed's name for a round, `last_poll`,
    /// as every status document written so far has it.
    pub const LAST_ROUND: &str = "last_poll";
}

/// This node's own status (the Python `MongoElector`'s `node_status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// The election key.
    pub key: String,
    /// This node's identity (`host/pid/instance`).
    pub node: String,
    /// Its host.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The application's version ([`crate::ElectorBuilder::version`]).
    pub version: String,
    /// Whether the background tasks run.
    pub running: bool,
    /// Whether this node leads.
    pub is_leader: bool,
    /// This node's current term's fence, when leading.
    pub fence: Option<u64>,
    /// The leader as last observed.
    pub leader: Option<LockInfo>,
    /// Elections won by this node.
    pub terms_won: u64,
    /// When this node last reported its status (store clock); `None` before its
    /// first report, or with reports off.
    pub last_round: Option<StoreTime>,
}

/// One node as reported in the status collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReport {
    /// The election key (stored as `election`).
    pub key: String,
    /// The node's identity.
    pub node: String,
    /// Its host.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The application's version.
    pub version: String,
    /// Whether it reported itself leader.
    pub is_leader: bool,
    /// When it last reported (store clock).
    pub last_round: StoreTime,
}

/// All recently reporting nodes and who leads since when (the Python `MongoElector`'s `cluster_detail`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDetail {
    /// The election key.
    pub key: String,
    /// The store's time when read.
    pub now: StoreTime,
    /// The live leader, if any.
    pub leader: Option<LockInfo>,
    /// Nodes that reported within the last three ttls.
    pub nodes: Vec<NodeReport>,
}

/// The status documents of a collection, read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reports {
    /// The documents that could be read, by election, then node.
    pub nodes: Vec<NodeReport>,
    /// The documents that could not.
    pub skipped: Vec<MalformedReport>,
}

fn field<T>(
    r: &Record,
    name: &'static str,
    read: impl FnOnce(&Record, &str) -> Option<T>,
) -> Result<T, MalformedReport> {
    let bad = |problem| MalformedReport { id: r.key().to_string(), field: name, problem };
    if r.get(name).is_none() {
        return Err(bad("is missing"));
    }
    read(r, name).ok_or_else(|| bad("has another type, or a value out of range"))
}

fn string(r: &Record, name: &str) -> Option<String> {
    r.get_str(name).map(str::to_owned)
}

/// A process id, stored as a 64-bit integer: one out of `u32`'s range is not
/// a process id, and the document is reported as unreadable.
fn pid(r: &Record, name: &str) -> Option<u32> {
    r.get_i64(name).and_then(|p| u32::try_from(p).ok())
}

impl NodeReport {
    /// Reads a status document.
    pub fn from_record(r: &Record) -> Result<NodeReport, MalformedReport> {
        Ok(NodeReport {
            key: field(r, fields::ELECTION, string)?,
            node: field(r, fields::NODE, string)?,
            host: field(r, fields::HOST, string)?,
            pid: field(r, fields::PID, pid)?,
            version: field(r, fields::VERSION, string)?,
            is_leader: field(r, fields::IS_LEADER, Record::get_bool)?,
            last_round: field(r, fields::LAST_ROUND, Record::get_time)?,
        })
    }
}

/// Reads the status documents in `coll`, of the election `key` or of all,
/// sorted by election key, then node. Documents that cannot be read are returned apart.
///
/// # Cancel safety
///
/// Cancel-safe: reads only.
pub async fn read_reports<S: Store>(store: &S, coll: &Collection, key: Option<&str>) -> Result<Reports, StoreError> {
    let q = match key {
        Some(e) => Query::eq(doc! { fields::ELECTION: e }),
        None => Query::all(),
    };
    let q = q.sort(fields::ELECTION, Order::Asc).sort(fields::NODE, Order::Asc);
    let mut out = Reports::default();
    for r in store.find(coll, &q).await? {
        match NodeReport::from_record(&r) {
            Ok(n) => out.nodes.push(n),
            Err(e) => out.skipped.push(e),
        }
    }
    Ok(out)
}

/// The status document's key for `node` in `election`.
fn report_key(election: &str, node: &Identity) -> Result<Key, StoreError> {
    Key::new(format!("{election}/{node}"))
}

impl<S: Store + Clone> Inner<S> {
    /// Upserts this node's status document (ensuring the collection's TTL index
    /// once per elector).
    pub(crate) async fn report_status(&self) -> Result<(), ElectorError> {
        // One report at a time: a report read before a transition and written
        // after a later one would leave the stale role in the document.
        let mut indexed = self.reporting.lock().await;
        if !*indexed {
            self.store.ensure_indexes(&self.status_coll, &[IndexSpec::gc()]).await?;
            *indexed = true;
        }
        let id = report_key(&self.key, &self.identity)?;
        let gc = Ttl::new((self.lock.ttl() * 10).max(Duration::from_secs(60)))?;
        let m = Mutation::new()
            .set(fields::ELECTION, self.key.as_str())
            .set(fields::NODE, self.identity.to_string())
            .set(fields::HOST, self.identity.host())
            .set(fields::PID, i64::from(self.identity.pid()))
            .set(fields::VERSION, self.version.as_str())
            .set(fields::IS_LEADER, self.is_leader())
            .set_now(fields::LAST_ROUND)
            .gc_after(gc);
        let out = self.store.write(&self.status_coll, &id, &Write::new(Condition::Always, m).upsert()).await?;
        if let WriteOutcome::Applied(r) = out {
            if let Ok(report) = NodeReport::from_record(&r) {
                *self.last_round.lock() = Some(report.last_round);
            }
        }
        Ok(())
    }

    /// All nodes that reported within the last three ttls, and the leader.
    pub(crate) async fn cluster_detail(&self) -> Result<ClusterDetail, ElectorError> {
        let status = self.lock.status().await?;
        let ttl_ms = i64::try_from(self.lock.ttl().as_millis()).unwrap_or(i64::MAX / 4);
        let horizon = status.now.as_millis().saturating_sub(ttl_ms.saturating_mul(3));
        let reports = read_reports(&self.store, &self.status_coll, Some(&self.key)).await?;
        for bad in &reports.skipped {
            tracing::warn!(key = %self.key, error = %bad, "status document left out");
        }
        let nodes = reports.nodes.into_iter().filter(|n| n.last_round.as_millis() >= horizon).collect();
        Ok(ClusterDetail { key: self.key.clone(), now: status.now, leader: status.holder, nodes })
    }
}
