//! The library crates' own figures (`store_*`, `mongolock_*`,
//! `mongoelector_*`, `mongoagent_*`, emitted through the `metrics` facade) in
//! the Prometheus exposition: [`Bridge`] is a `metrics` recorder that keeps
//! each figure as a `prometheus-client` family, so that one encoder writes the
//! whole of `/metrics` (the dashboard's figures read from the store, and
//! these) in one format. The figures are this process's: the dashboard runs
//! no agent, so they fill in on the `/metrics` of the processes that run
//! agents, locks and elections (`--metrics-bind` of the runners, [`serve`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use metrics::{CounterFn, GaugeFn, HistogramFn, Key, KeyName, Metadata, SharedString, Unit};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;
type Counters = Family<Labels, Counter>;
type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// The buckets of every histogram: 1 ms to about 33 s, doubling (the
/// libraries' histograms are durations in seconds).
fn histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The figures recorded so far, by name, with their help texts.
#[derive(Default)]
struct Figures {
    counters: BTreeMap<String, Counters>,
    gauges: BTreeMap<String, Gauges>,
    histograms: BTreeMap<String, Histograms>,
    help: BTreeMap<String, String>,
}

/// A `metrics` recorder whose figures `prometheus-client` encodes. Cheap to
/// clone (the clones share the figures).
#[derive(Clone, Default)]
pub(crate) struct Bridge {
    figures: Arc<Mutex<Figures>>,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge").finish_non_exhaustive()
    }
}

fn labels(key: &Key) -> Labels {
    key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect()
}

/// `prometheus-client` appends `_total` to a counter's name itself; the
/// `metrics` convention has it in the name.
fn counter_name(name: &str) -> &str {
    name.strip_suffix("_total").unwrap_or(name)
}

struct CounterHandle(Counter);

impl CounterFn for CounterHandle {
    fn increment(&self, value: u64) {
        self.0.inc_by(value);
    }

    fn absolute(&self, value: u64) {
        self.0.inner().fetch_max(value, Ordering::Relaxed);
    }
}

struct GaugeHandle(Gauge<f64, AtomicU64>);

impl GaugeFn for GaugeHandle {
    fn increment(&self, value: f64) {
        self.0.inc_by(value);
    }

    fn decrement(&self, value: f64) {
        self.0.dec_by(value);
    }

    fn set(&self, value: f64) {
        self.0.set(value);
    }
}

struct HistogramHandle(Histogram);

impl HistogramFn for HistogramHandle {
    fn record(&self, value: f64) {
        self.0.observe(value);
    }
}

impl metrics::Recorder for Bridge {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.figures.lock().help.insert(counter_name(key.as_str()).to_owned(), description.into_owned());
    }

    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.figures.lock().help.insert(key.as_str().to_owned(), description.into_owned());
    }

    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.figures.lock().help.insert(key.as_str().to_owned(), description.into_owned());
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> metrics::Counter {
        let mut f = self.figures.lock();
        let family = f.counters.entry(counter_name(key.name()).to_owned()).or_default();
        let handle = family.get_or_create(&labels(key)).clone();
        metrics::Counter::from_arc(Arc::new(CounterHandle(handle)))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> metrics::Gauge {
        let mut f = self.figures.lock();
        let family = f.gauges.entry(key.name().to_owned()).or_default();
        let handle = family.get_or_create(&labels(key)).clone();
        metrics::Gauge::from_arc(Arc::new(GaugeHandle(handle)))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> metrics::Histogram {
        let mut f = self.figures.lock();
        let family = f
            .histograms
            .entry(key.name().to_owned())
            .or_insert_with(|| Family::new_with_constructor(histogram as fn() -> Histogram));
        let handle = family.get_or_create(&labels(key)).clone();
        metrics::Histogram::from_arc(Arc::new(HistogramHandle(handle)))
    }
}

impl Bridge {
    /// A registry of every figure recorded so far (the families are shared,
    /// so it shows them as they are when it is encoded).
    pub(crate) fn registry(&self) -> Registry {
        let f = self.figures.lock();
        let mut reg = Registry::default();
        let help = |name: &str| f.help.get(name).cloned().unwrap_or_default();
        for (name, family) in &f.counters {
            reg.register(name.clone(), help(name), family.clone());
        }
        for (name, family) in &f.gauges {
            reg.register(name.clone(), help(name), family.clone());
        }
        for (name, family) in &f.histograms {
            reg.register(name.clone(), help(name), family.clone());
        }
        reg
    }
}

/// The process's recorder: installed as the `metrics` global recorder by the
/// first call (with the libraries' help texts), the same one afterwards.
pub(crate) fn installed() -> &'static Bridge {
    static BRIDGE: OnceLock<Bridge> = OnceLock::new();
    BRIDGE.get_or_init(|| {
        let bridge = Bridge::default();
        if metrics::set_global_recorder(bridge.clone()).is_err() {
            tracing::warn!("another metrics recorder is installed: the library figures do not reach /metrics");
        }
        store_trait::helpers::metrics::describe();
        mongolock::metrics::describe();
        mongoelector::metrics::describe();
        mongoagent::metrics::describe();
        bridge
    })
}

/// The content type of the exposition.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The process's library figures, as a whole exposition.
pub(crate) fn render() -> Result<String, String> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &installed().registry())
        .map_err(|e| format!("cannot encode the metrics: {e}"))?;
    Ok(out)
}

/// Serves [`render`] at `http://ADDR/metrics` in the background (the
/// runners' `--metrics-bind`); returns the address bound.
///
/// # Cancel safety
///
/// Cancel-safe: dropped before it returns, nothing is served.
pub(crate) async fn serve(addr: &str) -> Result<std::net::SocketAddr, String> {
    installed();
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("cannot listen on {addr} for metrics: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let app = axum::Router::new().route("/metrics", axum::routing::get(metrics_text));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the metrics endpoint stopped");
        }
    });
    tracing::info!(addr = %bound, "serving /metrics");
    Ok(bound)
}

async fn metrics_text() -> axum::response::Response {
    use axum::response::IntoResponse;
    match render() {
        Ok(text) => ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use bson::doc;
    use mongoagent::{Agent, NewTask, Outcome, Queue, Task};
    use store_memory::MemoryStore;

    use super::*;

    /// The line of `name{labels}` in `text`, and its value.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// What each library emits reaches the exposition, named and labelled as
    /// documented. The recorder is global: each figure here has labels no
    /// other test uses.
    #[tokio::test(start_paused = true)]
    async fn library_figures_reach_the_exposition() {
        installed();
        let store = MemoryStore::new();

        // mongoagent: every outcome, by queue, agent name and outcome.
        let q = Queue::new(store.clone(), "exp_jobs").unwrap();
        for (id, what) in [("a", "ok"), ("b", "retry"), ("c", "fail"), ("d", "cancel")] {
            q.enqueue(NewTask::new("exp", doc! { "what": what }).id(id)).await.unwrap();
        }
        q.cancel(doc! { "_id": "d" }).await.unwrap();
        let agent = Agent::builder(store.clone(), "exp", "exp_jobs").build().unwrap();
        let handler = |t: Task| async move {
            match t.data().get_str("what").unwrap_or_default() {
                "ok" => Outcome::done(),
                "retry" => Outcome::failed("again"),
                _ => Outcome::failed_permanently("no"),
            }
        };
        for _ in 0..3 {
            assert!(agent.process(handler).await.unwrap().is_some());
        }

        // mongolock: an acquisition, and a loss (a lease left to lapse).
        let lock = mongolock::Lock::builder(store.clone(), "k")
            .collection("exp_locks")
            .ttl(Duration::from_secs(2))
            .build()
            .unwrap();
        let guard = lock.try_acquire().await.unwrap().unwrap();
        tokio::time::timeout(Duration::from_secs(10), guard.lost()).await.unwrap();

        // mongoelector: a term won, then ended.
        let elector = mongoelector::Elector::builder(store.clone(), "exp_election").build().unwrap();
        elector.poll().await.unwrap();
        assert!(elector.is_leader());
        elector.release().await.unwrap();

        // store-trait: a watcher whose stream ended subscribes again.
        let coll = store_trait::Collection::new("exp_watched").unwrap();
        let mut w = store_trait::helpers::Watcher::open(store.clone(), coll, None, Duration::from_millis(100)).await;
        store.faults().end_change_streams();
        let ev = tokio::time::timeout(Duration::from_secs(10), w.changed()).await.unwrap();
        assert_eq!(ev.kind, store_trait::ChangeKind::Resync);

        let text = render().unwrap();
        for (series, want) in [
            (r#"mongoagent_tasks_total{queue="exp_jobs",agent="exp",outcome="completed"}"#, 1.0),
            (r#"mongoagent_tasks_total{queue="exp_jobs",agent="exp",outcome="retried"}"#, 1.0),
            (r#"mongoagent_tasks_total{queue="exp_jobs",agent="exp",outcome="failed_permanently"}"#, 1.0),
            (r#"mongoagent_tasks_total{queue="exp_jobs",agent="exp",outcome="cancelled"}"#, 1.0),
            (r#"mongoagent_claim_seconds_count{queue="exp_jobs",agent="exp"}"#, 3.0),
            (r#"mongolock_acquisitions_total{collection="exp_locks"}"#, 1.0),
            (r#"mongolock_losses_total{collection="exp_locks"}"#, 1.0),
            // The agent's three claims are leases too.
            (r#"mongolock_acquisitions_total{collection="exp_jobs"}"#, 3.0),
            (r#"mongoelector_term_changes_total{election="exp_election",change="won"}"#, 1.0),
            (r#"mongoelector_term_changes_total{election="exp_election",change="ended"}"#, 1.0),
            (r#"mongoelector_leader{election="exp_election"}"#, 0.0),
            (r#"store_watcher_resyncs_total{collection="exp_watched"}"#, 1.0),
        ] {
            assert_eq!(value(&text, series), Some(want), "{series} in\n{text}");
        }
        assert!(text.contains("# HELP mongoagent_tasks Task outcomes"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}
