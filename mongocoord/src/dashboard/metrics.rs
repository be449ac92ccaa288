//! `/metrics`: the overview's figures in the Prometheus (OpenMetrics) text
//! format, encoded by `prometheus-client`. Read from the store at each scrape,
//! so a label set that is gone (a deleted lock, an agent without tasks)
//! disappears with it. Followed by this process's library figures
//! (`crate::exposition`: the `metrics` facade's `mongoagent_*`, `mongolock_*`,
//! `mongoelector_*`, `store_*`); the dashboard runs no agent, so those are
//! mostly its own watchers' resyncs: task outcomes and claim latency are on
//! the `/metrics` of the processes that run the agents (`--metrics-bind`).
//!
//! Label values are the database's (agent names, lock keys and holders,
//! elections): each is a [`LabelValue`](crate::exposition::LabelValue),
//! escaped when written, and each family keeps at most
//! [`MAX_SERIES`](crate::exposition::MAX_SERIES) label sets, the label sets
//! left out counted under `mongocoord_metrics_series_truncated`.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry};

use super::live::LiveCounters;
use super::pages::Overview;
use crate::data::StatsRow;
use crate::error::CliError;
use crate::exposition::{labels, Capped, MAX_SERIES};

/// The content type of the exposition.
pub(crate) const CONTENT_TYPE: &str = crate::exposition::CONTENT_TYPE;

type Floats = Capped<Gauge<f64, AtomicU64>>;
type Ints = Capped<Gauge>;

/// The families of one scrape, registered together with how many label sets
/// each left out.
struct Families {
    reg: Registry,
    truncated: Ints,
}

impl Families {
    /// Registers `family` as `mongocoord_{name}`; `left_out` label sets did
    /// not fit under the cap.
    fn register(&mut self, name: &str, help: &str, (left_out, family): (u64, impl Metric)) {
        if left_out > 0 {
            let metric = format!("mongocoord_{name}");
            set_int(self.truncated.get_or_create(&labels(&[("metric", &metric)])), int(left_out));
        }
        self.reg.register(name, help, family);
    }
}

/// Sets a gauge that fit under the cap (`None` did not: it is counted as left
/// out instead).
fn set_int(g: Option<Gauge>, v: i64) {
    if let Some(g) = g {
        g.set(v);
    }
}

fn set_float(g: Option<Gauge<f64, AtomicU64>>, v: f64) {
    if let Some(g) = g {
        g.set(v);
    }
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The exposition of `o`, of the dashboard's own live machinery, and of the
/// process's library figures.
pub(crate) fn render(o: &Overview, locks: &str, live: &LiveCounters) -> Result<String, CliError> {
    let mut f = Families { reg: Registry::with_prefix("mongocoord"), truncated: Ints::default() };
    let mut tasks = Ints::default();
    let mut oldest = Floats::default();
    let mut timed_out = Ints::default();
    for (q, counts, _) in &o.queues {
        for (agent, s) in &counts.agents {
            for (state, n) in StatsRow::STATES.iter().zip(s.counts()) {
                set_int(tasks.get_or_create(&labels(&[("queue", q), ("agent", agent), ("state", state)])), int(n));
            }
            set_int(timed_out.get_or_create(&labels(&[("queue", q), ("agent", agent)])), int(s.timed_out));
            if let Some(ms) = s.oldest_ready_age_ms {
                set_float(oldest.get_or_create(&labels(&[("queue", q), ("agent", agent)])), ms as f64 / 1000.0);
            }
        }
    }
    f.register("queue_tasks", "Tasks by queue, agent and state", tasks.parts());
    f.register("queue_oldest_ready_age_seconds", "How long the oldest ready task has waited", oldest.parts());
    // Its own family, not a state: each of these tasks is counted in a state
    // too, and the states of `queue_tasks` add up to the queue.
    f.register(
        "queue_timed_out_tasks",
        "Tasks whose latest attempt timed out, by queue and agent (each also counted in its state)",
        timed_out.parts(),
    );

    let mut held = Ints::default();
    let mut remaining = Floats::default();
    let mut fence = Ints::default();
    for l in &o.locks.rows {
        let holder = l.holder.as_deref().unwrap_or("");
        let with_holder = labels(&[("collection", locks), ("key", &l.key), ("holder", holder)]);
        set_int(held.get_or_create(&with_holder), i64::from(l.held));
        let key = labels(&[("collection", locks), ("key", &l.key)]);
        set_float(remaining.get_or_create(&key), l.expires_in_ms.map_or(0.0, |m| m as f64 / 1000.0));
        set_int(fence.get_or_create(&key), int(l.fence));
    }
    f.register("lock_held", "1 while the lock is held, with its holder", held.parts());
    f.register("lock_remaining_seconds", "Lease left on the store clock (0 when free)", remaining.parts());
    f.register("lock_fence", "The lock's fencing counter", fence.parts());

    let mut term = Ints::default();
    let mut leader = Ints::default();
    let mut nodes = Ints::default();
    for e in &o.elections.elections {
        let key = labels(&[("election", &e.election)]);
        // Absent between terms; `changes(mongocoord_election_term[5m])` counts
        // term changes.
        if let Some(t) = e.fence {
            set_int(term.get_or_create(&key), int(t));
        }
        set_int(leader.get_or_create(&key), i64::from(e.leader.is_some()));
        set_int(nodes.get_or_create(&key), int(e.nodes.len() as u64));
    }
    f.register("election_term", "The current term's fence", term.parts());
    f.register("election_has_leader", "1 while the election has a leader", leader.parts());
    f.register("election_nodes", "Nodes that reported their status", nodes.parts());

    let Families { mut reg, truncated } = f;
    reg.register(
        "metrics_series_truncated",
        format!("Label sets left out of this scrape because their metric already had {MAX_SERIES}"),
        truncated.family(),
    );

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
        .map_err(CliError::Encode)?;
    Ok(out)
}
