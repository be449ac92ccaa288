//! The library crates' own figures (`store_*`, `mongolock_*`,
//! `mongoelector_*`, `mongoagent_*`, emitted through the `metrics` facade) in
//! the Prometheus exposition: [`Bridge`] is a `metrics` recorder that keeps
//! each figure as a `prometheus-client` family, so that one encoder writes the
//! whole of `/metrics` (the dashboard's figures read from the store, and
//! these) in one format. The figures are this process's: the dashboard runs
//! no agent, so they fill in on the `/metrics` of the processes that run
//! agents, locks and elections (`--metrics-bind` of the runners, [`serve`]).
//!
//! Every label value of `/metrics`, these and the dashboard's, is a
//! [`LabelValue`], escaped as the text format asks; every family is a
//! [`Capped`] one, so names read from the database can neither forge a line
//! nor grow a scrape without bound.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use metrics::{CounterFn, GaugeFn, HistogramFn, Key, KeyName, Metadata, SharedString, Unit};
use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::error::CliError;

/// The most label sets a family keeps in one exposition. Names come from the
/// database (agent names, lock keys, elections) and from whatever a process
/// records, so without a cap one scrape could grow without bound; what is
/// left out is counted (`mongocoord_metrics_series_truncated`,
/// `mongocoord_metrics_series_dropped_total`).
pub(crate) const MAX_SERIES: usize = 1000;

/// A label value, written escaped as the Prometheus and OpenMetrics text
/// formats ask (backslash, double quote and line feed as `\\`, `\"`, `\n`):
/// `prometheus-client` writes values as given, so a value holding `"` or a
/// line feed would end the label set early, or forge a series.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) struct LabelValue(String);

impl LabelValue {
    /// The value `v`, escaped when written.
    pub(crate) fn new(v: &str) -> Self {
        LabelValue(v.to_owned())
    }
}

impl EncodeLabelValue for LabelValue {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// A label set: names chosen by code, values escaped.
pub(crate) type Labels = Vec<(String, LabelValue)>;

/// `labels(&[("queue", q)])`: the label set of these pairs.
pub(crate) fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), LabelValue::new(v))).collect()
}

/// A family of at most [`MAX_SERIES`] label sets: a new label set past the
/// cap gets no series, and is counted instead.
pub(crate) struct Capped<M, C = fn() -> M> {
    family: Family<Labels, M, C>,
    len: usize,
    left_out: u64,
}

impl<M: Default> Default for Capped<M> {
    fn default() -> Self {
        Capped::with(Family::new_with_constructor(M::default as fn() -> M))
    }
}

impl<M, C: MetricConstructor<M> + Clone> Capped<M, C> {
    fn with(family: Family<Labels, M, C>) -> Self {
        Capped { family, len: 0, left_out: 0 }
    }

    /// The metric of `labels`, or `None` past the cap (counted as left out).
    pub(crate) fn get_or_create(&mut self, labels: &Labels) -> Option<M>
    where
        M: Clone,
    {
        if let Some(m) = self.family.get(labels) {
            return Some(m.clone());
        }
        if self.len >= MAX_SERIES {
            self.left_out += 1;
            return None;
        }
        self.len += 1;
        Some(self.family.get_or_create(labels).clone())
    }

    /// How many times a label set was left out.
    pub(crate) fn left_out(&self) -> u64 {
        self.left_out
    }

    /// How many label sets were left out, and the family to register.
    pub(crate) fn parts(&self) -> (u64, Family<Labels, M, C>)
    where
        Family<Labels, M, C>: Clone,
    {
        (self.left_out, self.family.clone())
    }

    /// The family, to register (it shares its metrics with this one).
    pub(crate) fn family(&self) -> Family<Labels, M, C>
    where
        Family<Labels, M, C>: Clone,
    {
        self.family.clone()
    }
}

impl<M, C> std::fmt::Debug for Capped<M, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capped").field("len", &self.len).field("left_out", &self.left_out).finish_non_exhaustive()
    }
}

type Counters = Capped<Counter>;
type Gauges = Capped<Gauge<f64, AtomicU64>>;
type Histograms = Capped<Histogram>;

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

impl Figures {
    /// Recordings left out by name, for `mongocoord_metrics_series_dropped_total`.
    fn dropped(&self) -> Counters {
        let mut out = Counters::default();
        let counters = self.counters.iter().map(|(n, f)| (n, f.left_out()));
        let gauges = self.gauges.iter().map(|(n, f)| (n, f.left_out()));
        let histograms = self.histograms.iter().map(|(n, f)| (n, f.left_out()));
        for (name, n) in counters.chain(gauges).chain(histograms).filter(|(_, n)| *n > 0) {
            if let Some(c) = out.get_or_create(&labels(&[("metric", name)])) {
                c.inc_by(n);
            }
        }
        out
    }
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

/// The label set of `key`: names as the text format allows them (others
/// become `_`), values escaped.
fn key_labels(key: &Key) -> Labels {
    let name = |k: &str| -> String {
        k.chars()
            .enumerate()
            .map(|(i, c)| if c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()) { c } else { '_' })
            .collect()
    };
    key.labels().map(|l| (name(l.key()), LabelValue::new(l.value()))).collect()
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

    // Past the cap a recording goes nowhere (a no-op handle), and is counted.

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> metrics::Counter {
        let mut f = self.figures.lock();
        let family = f.counters.entry(counter_name(key.name()).to_owned()).or_default();
        match family.get_or_create(&key_labels(key)) {
            Some(handle) => metrics::Counter::from_arc(Arc::new(CounterHandle(handle))),
            None => metrics::Counter::noop(),
        }
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> metrics::Gauge {
        let mut f = self.figures.lock();
        let family = f.gauges.entry(key.name().to_owned()).or_default();
        match family.get_or_create(&key_labels(key)) {
            Some(handle) => metrics::Gauge::from_arc(Arc::new(GaugeHandle(handle))),
            None => metrics::Gauge::noop(),
        }
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> metrics::Histogram {
        let mut f = self.figures.lock();
        let family = f
            .histograms
            .entry(key.name().to_owned())
            .or_insert_with(|| Capped::with(Family::new_with_constructor(histogram as fn() -> Histogram)));
        match family.get_or_create(&key_labels(key)) {
            Some(handle) => metrics::Histogram::from_arc(Arc::new(HistogramHandle(handle))),
            None => metrics::Histogram::noop(),
        }
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
            reg.register(name.clone(), help(name), family.family());
        }
        for (name, family) in &f.gauges {
            reg.register(name.clone(), help(name), family.family());
        }
        for (name, family) in &f.histograms {
            reg.register(name.clone(), help(name), family.family());
        }
        let dropped = f.dropped();
        if dropped.len > 0 {
            reg.register(
                "mongocoord_metrics_series_dropped",
                format!("Recordings left out because their figure already had {MAX_SERIES} label sets"),
                dropped.family(),
            );
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
pub(crate) fn render() -> Result<String, CliError> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &installed().registry()).map_err(CliError::Encode)?;
    Ok(out)
}

/// Serves [`render`] at `http://ADDR/metrics` in the background (the
/// runners' `--metrics-bind`); returns the address bound.
///
/// # Cancel safety
///
/// Cancel-safe: dropped before it returns, nothing is served.
pub(crate) async fn serve(addr: &str) -> Result<std::net::SocketAddr, CliError> {
    installed();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::io(format!("cannot listen on {addr} for metrics"), e))?;
    let bound =
        listener.local_addr().map_err(|e| CliError::io(format!("cannot read the address bound for {addr}"), e))?;
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
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
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

    /// A sample's name and its labels, unescaped.
    pub(crate) type Sample = (String, Vec<(String, String)>);

    /// Checks `text` line by line as a scraper reads it: comments, and
    /// samples `name{label="value",…} number` whose label values escape
    /// backslash, double quote and line feed. The label sets of each sample,
    /// by name, are returned.
    pub(crate) fn check_exposition(text: &str) -> Result<Vec<Sample>, CliError> {
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.chars()
                    .enumerate()
                    .all(|(i, c)| c == '_' || c == ':' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()))
        };
        let mut samples = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let bad = |why: &str| Err(CliError::invalid(format!("line {}: {why}: {line:?}", i + 1)));
            if line.starts_with("# ") {
                continue;
            }
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = &line[..name_end];
            if !name_ok(name) {
                return bad("not a metric name");
            }
            let mut rest = &line[name_end..];
            let mut labels = Vec::new();
            if let Some(after) = rest.strip_prefix('{') {
                rest = after;
                loop {
                    if let Some(after) = rest.strip_prefix('}') {
                        rest = after;
                        break;
                    }
                    let Some((key, after)) = rest.split_once("=\"") else { return bad("a label without =\"") };
                    if !name_ok(key) || key.contains(':') {
                        return bad("not a label name");
                    }
                    let mut value = String::new();
                    let mut chars = after.char_indices();
                    let end = loop {
                        match chars.next() {
                            Some((j, '"')) => break j,
                            Some((_, '\\')) => match chars.next() {
                                Some((_, '\\')) => value.push('\\'),
                                Some((_, '"')) => value.push('"'),
                                Some((_, 'n')) => value.push('\n'),
                                _ => return bad("an unknown escape"),
                            },
                            Some((_, c)) => value.push(c),
                            None => return bad("an unterminated label value"),
                        }
                    };
                    labels.push((key.to_owned(), value));
                    rest = &after[end + 1..];
                    rest = rest.strip_prefix(',').unwrap_or(rest);
                }
            }
            let Some(number) = rest.strip_prefix(' ') else { return bad("no value") };
            let number = number.split(' ').next().unwrap_or_default();
            if number.parse::<f64>().is_err() && !["+Inf", "-Inf", "NaN"].contains(&number) {
                return bad("not a number");
            }
            samples.push((name.to_owned(), labels));
        }
        Ok(samples)
    }

    #[test]
    fn the_checker_refuses_forged_and_broken_lines() {
        assert!(check_exposition("# TYPE a gauge\na{x=\"1\\\"\\n\\\\\"} 2\nb 1.5\n# EOF\n").is_ok());
        for bad in ["a{x=\"1\"\"} 1", "a{x=\"1} 1", "a{x=\"\\q\"} 1", "a 1x", "\"} 1", "a{x=\"1\"}"] {
            assert!(check_exposition(bad).is_err(), "{bad}");
        }
    }

    /// Label values holding quotes, backslashes and line feeds are written
    /// escaped; a family keeps at most `MAX_SERIES` label sets and counts the
    /// rest.
    #[test]
    fn label_values_are_escaped_and_families_capped() {
        let bridge = Bridge::default();
        let forged = "x\"} 1\nforged_series_total 1\n#\\";
        metrics::with_local_recorder(&bridge, || {
            metrics::counter!("exp_escape_total", "agent" => forged, "bad-name" => "v").increment(2);
            for n in 0..MAX_SERIES + 5 {
                metrics::gauge!("exp_many", "n" => n.to_string()).set(1.0);
            }
        });
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &bridge.registry()).unwrap();
        let samples = check_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert!(!text.lines().any(|l| l.starts_with("forged_series_total")), "{text}");
        let escape = samples.iter().find(|(n, _)| n == "exp_escape_total").unwrap();
        assert_eq!(escape.1, [("agent".to_owned(), forged.to_owned()), ("bad_name".to_owned(), "v".to_owned())]);
        assert_eq!(samples.iter().filter(|(n, _)| n == "exp_many").count(), MAX_SERIES);
        assert_eq!(value(&text, r#"mongocoord_metrics_series_dropped_total{metric="exp_many"}"#), Some(5.0), "{text}");
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
        // The loss, then the subscription made again.
        for _ in 0..2 {
            let ev = tokio::time::timeout(Duration::from_secs(10), w.changed()).await.unwrap();
            assert_eq!(ev.kind, store_trait::ChangeKind::Resync);
        }

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
