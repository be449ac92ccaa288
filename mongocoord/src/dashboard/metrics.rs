//! `/metrics`: the overview's figures in the Prometheus (OpenMetrics) text
//! format, encoded by `prometheus-client`. Read from the store at each scrape,
//! so a label set that is gone (a deleted lock, an agent without tasks)
//! disappears with it. Followed by this process's library figures
//! (`crate::exposition`: the `metrics` facade's `mongoagent_*`, `mongolock_*`,
//! `mongoelector_*`, `store_*`); the dashboard runs no agent, so those are
//! mostly its own watchers' resyncs: task outcomes and claim latency are on
//! the `/metrics` of the processes that run the agents (`--metrics-bind`).

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::live::LiveCounters;
use super::pages::Overview;
use crate::data::StatsRow;

/// The content type of the exposition.
pub(crate) const CONTENT_TYPE: &str = crate::exposition::CONTENT_TYPE;

type Labels = Vec<(String, String)>;
type Floats = Family<Labels, Gauge<f64, AtomicU64>>;
type Ints = Family<Labels, Gauge>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The exposition of `o`, of the dashboard's own live machinery, and of the
/// process's library figures.
pub(crate) fn render(o: &Overview, locks: &str, live: &LiveCounters) -> Result<String, String> {
    let mut reg = Registry::with_prefix("mongocoord");

    let tasks = Ints::default();
    let oldest = Floats::default();
    for (q, counts, _) in &o.queues {
        for (agent, s) in &counts.agents {
            for (state, n) in StatsRow::STATES.iter().zip(s.counts()) {
                tasks.get_or_create(&labels(&[("queue", q), ("agent", agent), ("state", state)])).set(int(n));
            }
            if let Some(ms) = s.oldest_ready_age_ms {
                oldest.get_or_create(&labels(&[("queue", q), ("agent", agent)])).set(ms as f64 / 1000.0);
            }
        }
    }
    reg.register("queue_tasks", "Tasks by queue, agent and state", tasks);
    reg.register("queue_oldest_ready_age_seconds", "How long the oldest ready task has waited", oldest);

    let held = Ints::default();
    let remaining = Floats::default();
    let fence = Ints::default();
    for l in &o.locks.rows {
        let holder = l.holder.as_deref().unwrap_or("");
        held.get_or_create(&labels(&[("collection", locks), ("key", &l.key), ("holder", holder)]))
            .set(i64::from(l.held));
        let key = labels(&[("collection", locks), ("key", &l.key)]);
        remaining.get_or_create(&key).set(l.expires_in_ms.map_or(0.0, |m| m as f64 / 1000.0));
        fence.get_or_create(&key).set(int(l.fence));
    }
    reg.register("lock_held", "1 while the lock is held, with its holder", held);
    reg.register("lock_remaining_seconds", "Lease left on the store clock (0 when free)", remaining);
    reg.register("lock_fence", "The lock's fencing counter", fence);

    let term = Ints::default();
    let leader = Ints::default();
    let nodes = Ints::default();
    for e in &o.elections.elections {
        let key = labels(&[("election", &e.election)]);
        // Absent between terms; `changes(mongocoord_election_term[5m])` counts
        // term changes.
        if let Some(t) = e.fence {
            term.get_or_create(&key).set(int(t));
        }
        leader.get_or_create(&key).set(i64::from(e.leader.is_some()));
        nodes.get_or_create(&key).set(int(e.nodes.len() as u64));
    }
    reg.register("election_term", "The current term's fence", term);
    reg.register("election_has_leader", "1 while the election has a leader", leader);
    reg.register("election_nodes", "Nodes that reported their status", nodes);

    let watchers = Gauge::<i64>::default();
    watchers.set(int(live.watchers.load(Ordering::Relaxed)));
    reg.register("dashboard_watchers", "Change watchers the dashboard holds (one per collection)", watchers);
    let clients = Gauge::<i64>::default();
    clients.set(int(live.clients.load(Ordering::Relaxed)));
    reg.register("dashboard_live_clients", "Browser tabs receiving live updates", clients);
    let resyncs = Counter::<u64>::default();
    resyncs.inc_by(live.resyncs.load(Ordering::Relaxed));
    reg.register(
        "dashboard_resyncs",
        "Change streams that came back after a failure (changes may have been missed)",
        resyncs,
    );

    let library = crate::exposition::installed().registry();
    let mut out = String::new();
    encode_registry(&mut out, &reg)
        .and_then(|()| encode_registry(&mut out, &library))
        .and_then(|()| encode_eof(&mut out))
        .map_err(|e| format!("cannot encode the metrics: {e}"))?;
    Ok(out)
}
