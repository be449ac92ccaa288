//! Second outside review of traces (#33): the timeout path's outcome span,
//! what `TraceContext` accepts as a `tracestate` and a `traceparent` (against
//! the W3C recommendation and the SDK's own W3C propagator), retries,
//! concurrent runs of different traces in one `work` loop (with and without
//! a layer), and grouped tasks.
//!
//! Each test says in its doc comment whether the attack HELD (the test
//! passes) or was FOUND (it failed before its fix, and passes now).
//!
//! None of these tests sets the global tracer provider (the `otel` suite's
//! test reads its claim span from the one it sets).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Document};
use mongoagent::{Agent, NewTask, Outcome, Processed, Queue, Task, TraceContext};
use opentelemetry::trace::{Status, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use store_memory::MemoryStore;
use store_trait::{Key, Store};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

struct Traced {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
}

impl Traced {
    fn new() -> Self {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        Traced { exporter, provider }
    }

    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(self.provider.tracer("review2")))
    }

    fn spans(&self) -> Vec<SpanData> {
        self.provider.force_flush().unwrap();
        self.exporter.get_finished_spans().unwrap()
    }
}

fn attr(s: &SpanData, key: &str) -> Option<String> {
    s.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.as_str().into_owned())
}

fn runs_of<'a>(spans: &'a [SpanData], id: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == "mongoagent.run" && attr(s, "task").as_deref() == Some(id)).collect()
}

fn names(spans: &[SpanData]) -> Vec<String> {
    spans.iter().map(|s| s.name.to_string()).collect()
}

async fn stored(store: &MemoryStore, q: &Queue<MemoryStore>, id: &Key) -> Document {
    store.get(q.collection(), id).await.unwrap().record.unwrap_or_else(|| panic!("no task {id}")).data().clone()
}

fn stored_trace(d: &Document) -> Option<String> {
    let tp = d.get_document("trace_context").ok()?.get_str("traceparent").ok()?;
    Some(tp.split('-').nth(1)?.to_owned())
}

/// FOUND, fixed (it failed before). "Spans for enqueue, claim, run, complete and fail": an attempt
/// that fails by its timeout (the handler stops at its cancellation, within
/// the grace; the agent writes "timed out after …") is a failure written
/// like any other, but no `mongoagent.fail` span is made for it: the outcome
/// span is made only on the path where the handler's own outcome is
/// written (`run.rs`, `outcome_span`), not in `timed_out`'s
/// `finish_marked` (nor for an abandoned last attempt's failure). A trace
/// of a timed-out task shows a run, and no failure nor its error.
#[tokio::test]
async fn a_timed_out_attempt_is_written_in_a_fail_span() {
    let t = Traced::new();
    let _default = crate::subscriber::scoped(t.subscriber());
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel2_timeout").unwrap();
    let (k, _) = q.enqueue(NewTask::new("slow", doc! {})).instrument(tracing::info_span!("producer")).await.unwrap();
    let a = Agent::builder(store.clone(), "slow", q.collection().as_str())
        .timeout(Duration::from_millis(100))
        .timeout_grace(Duration::from_secs(5))
        .max_attempts(1)
        .build()
        .unwrap();
    let p = a
        .process(|t: Task| async move {
            t.cancellation().cancelled().await;
            Outcome::done()
        })
        .await
        .unwrap();
    assert_eq!(p, Some(Processed::Failed(k.clone())), "the attempt timed out, the task failed for good");
    let d = stored(&store, &q, &k).await;
    let error = d.get_str("last_error").unwrap_or_default().to_owned();
    assert!(error.contains("timed out"), "{d:?}");
    let spans = t.spans();
    let runs = runs_of(&spans, &k.to_string());
    assert_eq!(runs.len(), 1, "{:?}", names(&spans));
    let run = runs[0];
    let fail = spans.iter().find(|s| s.name == "mongoagent.fail" && s.parent_span_id == run.span_context.span_id());
    assert!(
        fail.is_some_and(|f| matches!(&f.status, Status::Error { description } if description.contains("timed out"))),
        "no mongoagent.fail span (with the timeout's error) under the timed-out run; spans: {:?}; run outcome {:?}",
        names(&spans),
        attr(run, "outcome")
    );
}

/// FOUND, fixed (it failed before). `TraceContext` promises "a malformed `tracestate` is dropped and
/// the `traceparent` kept, as the W3C recommendation says". A W3C
/// `tracestate` value is printable ASCII only (`%x20-2B / %x2D-3C /
/// %x3E-7E`, no trailing space); a value with a NUL, a newline, a DEL or a
/// non-ASCII letter is malformed. `from_headers` keeps them all (the SDK's
/// `TraceState::valid_value` checks only the length, `,` and `=`), and hands
/// them on as `TRACESTATE`: a NUL makes `Command::env` fail to spawn the
/// task's command (`mongocoord`'s `review_otel2` shows the task failing),
/// a newline or CR is a header injection for whoever puts it in an HTTP
/// header.
#[tokio::test]
async fn a_tracestate_with_control_or_non_ascii_characters_is_dropped() {
    let mut kept = Vec::new();
    for state in ["vendor=a\u{0}b", "vendor=a\r\nx-evil: 1", "vendor=a\u{7f}", "vendor=caf\u{e9}", "ok=1,vendor=\u{1}"]
    {
        let cx = TraceContext::from_headers(PARENT, Some(state)).expect("the traceparent is kept");
        assert_eq!(cx.traceparent(), PARENT);
        if let Some(s) = cx.tracestate() {
            kept.push(s);
        }
    }
    // Well-formed ones are kept (not vacuous).
    let cx = TraceContext::from_headers(PARENT, Some("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE,,")).unwrap();
    assert_eq!(cx.tracestate().as_deref(), Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"));
    assert!(kept.is_empty(), "malformed tracestates kept and handed on: {kept:?}");
}

/// FOUND, fixed (it failed before). W3C Trace Context, "Versioning of traceparent": a parser that
/// meets a higher version than `00` (not `ff`) SHOULD parse it as a `00`
/// header (trace id, parent id, flags, then a dash or the end) and continue
/// the trace; the SDK's own `TraceContextPropagator` does. `TraceContext`
/// (documented as version `00` only) restarts the trace instead, so a
/// producer one version ahead (a `mongocoord enqueue` handed its
/// `TRACEPARENT`, a foreign task document) loses its trace at this hop.
/// `ff` (forbidden) and a `00` with extra fields stay refused (HELD).
#[tokio::test]
async fn a_future_version_traceparent_is_continued_as_w3c_says() {
    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TraceContextExt as _;
    let sdk = |tp: &str| {
        let carrier: HashMap<String, String> = [("traceparent".to_owned(), tp.to_owned())].into();
        let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| sc.trace_id().to_string())
    };
    let ours = |tp: &str| TraceContext::from_headers(tp, None).map(|c| c.span_context().trace_id().to_string());
    for refused in [PARENT.replacen("00", "ff", 1), format!("{PARENT}-extra")] {
        assert_eq!(ours(&refused), None, "{refused}");
        assert_eq!(sdk(&refused), None, "{refused}");
    }
    let mut disagree = Vec::new();
    for future in [PARENT.replacen("00", "01", 1), format!("{}-what-the-future-holds", PARENT.replacen("00", "cc", 1))]
    {
        assert_eq!(sdk(&future).as_deref(), Some(TRACE), "the SDK continues {future}");
        if ours(&future).as_deref() != Some(TRACE) {
            disagree.push(future);
        }
    }
    assert!(disagree.is_empty(), "future-version traceparents restarted, not continued: {disagree:?}");
}

/// HELD if it passes. A task that fails its first attempt and is retried:
/// both runs continue the producer's trace, each under the enqueue (the
/// retry does not drop or replace the stored context), and the first
/// attempt's failure is in a `mongoagent.fail` span.
#[tokio::test]
async fn a_retried_task_runs_again_in_its_producers_trace() {
    let t = Traced::new();
    let _default = crate::subscriber::scoped(t.subscriber());
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel2_retry").unwrap();
    let (k, _) = q.enqueue(NewTask::new("flaky", doc! {})).instrument(tracing::info_span!("producer")).await.unwrap();
    let a = Agent::builder(store.clone(), "flaky", q.collection().as_str())
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .max_attempts(3)
        .build()
        .unwrap();
    let handler = |t: Task| async move {
        if t.attempt() <= 1 {
            Outcome::failed("once")
        } else {
            Outcome::done()
        }
    };
    let mut seen = Vec::new();
    for _ in 0..200 {
        match a.process(handler).await.unwrap() {
            Some(p) => {
                seen.push(p.clone());
                if matches!(p, Processed::Completed(_)) {
                    break;
                }
            }
            None => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert_eq!(seen, vec![Processed::Retried(k.clone()), Processed::Completed(k.clone())]);
    let spans = t.spans();
    let enqueue = spans.iter().find(|s| s.name == "mongoagent.enqueue").unwrap();
    let runs = runs_of(&spans, &k.to_string());
    assert_eq!(runs.len(), 2);
    for r in &runs {
        assert_eq!(r.span_context.trace_id(), enqueue.span_context.trace_id());
        assert_eq!(r.parent_span_id, enqueue.span_context.span_id());
    }
    assert!(spans.iter().any(|s| s.name == "mongoagent.fail" && s.parent_span_id == runs[0].span_context.span_id()));
}

/// HELD if it passes. One `work` loop, concurrency 4, running tasks of 12
/// producers' traces at once (the handler yields, so runs interleave on one
/// thread), each run enqueuing a follow-up: with a layer, each run and its
/// follow-up's stored context are in its own producer's trace; without any
/// subscriber (the stored context passed on through the task-local), the
/// same. No trace leaks from one run into another's.
#[tokio::test]
async fn concurrent_runs_of_different_traces_do_not_mix() {
    for layered in [true, false] {
        let t = Traced::new();
        let store = MemoryStore::new();
        let coll = if layered { "review_otel2_mix_layer" } else { "review_otel2_mix_bare" };
        let q = Queue::new(store.clone(), coll).unwrap();
        // Twelve producers, each in its own (foreign) trace.
        let mut want = HashMap::new();
        let mut docs = Vec::new();
        for i in 0..12u32 {
            let trace = format!("{:032x}", 0x1000 + i);
            docs.push(doc! { "_id": format!("p{i}"), "agent_name": "mix", "ready": true,
            "trace_context": { "traceparent": format!("00-{trace}-00f067aa0ba902b7-01") } });
            want.insert(format!("p{i}"), trace);
        }
        store.insert_many(q.collection(), docs).await.unwrap();
        let _default = layered.then(|| crate::subscriber::scoped(t.subscriber()));
        let a = Agent::builder(store.clone(), "mix", coll)
            .concurrency(4)
            .process_while(|c| c.tasks_processed < 12)
            .build()
            .unwrap();
        let counter = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let c = counter.clone();
        a.work(move |t: Task| {
            let c = c.clone();
            async move {
                for _ in 0..5 {
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let id = t.id().to_string();
                Outcome::done().follow_up(NewTask::new("next", doc! { "of": id }))
            }
        })
        .await
        .unwrap();
        assert_eq!(counter.load(std::sync::atomic::Ordering::SeqCst), 12);
        for (id, trace) in &want {
            let child = stored(&store, &q, &Key::new(format!("{id}/0")).unwrap()).await;
            assert_eq!(stored_trace(&child).as_ref(), Some(trace), "layer {layered}: follow-up of {id}: {child:?}");
        }
        if layered {
            let spans = t.spans();
            for (id, trace) in &want {
                let runs = runs_of(&spans, id);
                assert_eq!(runs.len(), 1, "{id}");
                assert_eq!(&runs[0].span_context.trace_id().to_string(), trace, "{id}");
            }
        }
    }
}

/// HELD if it passes. A grouped task (numbered in its group before the
/// insert) keeps its producer's trace, and its run continues it.
#[tokio::test]
async fn a_grouped_task_keeps_its_producers_trace() {
    let t = Traced::new();
    let _default = crate::subscriber::scoped(t.subscriber());
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel2_group").unwrap();
    let (k, _) =
        q.enqueue(NewTask::new("grp", doc! {}).group("g1")).instrument(tracing::info_span!("producer")).await.unwrap();
    let d = stored(&store, &q, &k).await;
    let trace = stored_trace(&d).expect("stored");
    let a = Agent::builder(store.clone(), "grp", q.collection().as_str())
        .group_concurrency(1)
        .poll_interval(Duration::from_millis(50))
        .process_while(|c| c.tasks_processed < 1)
        .build()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), a.work(|_t: Task| async { true }))
        .await
        .expect("the grouped task ran")
        .unwrap();
    let spans = t.spans();
    assert_eq!(runs_of(&spans, &k.to_string())[0].span_context.trace_id().to_string(), trace);
}

/// FOUND, fixed (it failed before). "With the `otel` feature and a `tracing-opentelemetry` layer, a
/// task stores its producer's W3C trace context". The usual setup of a
/// service that logs everything but keeps a noisy dependency out of its
/// traces: a log layer for all spans, and the OpenTelemetry layer behind a
/// per-layer filter `info,mongoagent=warn`. The producer's own span is in a
/// trace, yet its task stores nothing: the `mongoagent.enqueue` span exists
/// (the log layer wants it) but has no OpenTelemetry data, and `inject`
/// reads that span's context alone, with no fall-back to its traced parent
/// (the current OpenTelemetry context). Every consumer run starts a new
/// trace: the chain is cut by a filter meant for noise. (With the
/// filter as the only layer, the span is disabled outright and the context
/// falls back to the caller's: that held, but a global filter in this test
/// binary caches the library's callsites as disabled for the other tests'
/// subscribers, so it is not kept as a test.)
#[tokio::test]
async fn a_producer_whose_trace_layer_filters_out_the_librarys_spans_still_stores_its_trace() {
    use tracing_subscriber::Layer as _;
    let t = Traced::new();
    let traces = tracing_opentelemetry::layer()
        .with_tracer(t.provider.tracer("review2"))
        .with_filter(tracing_subscriber::EnvFilter::new("info,mongoagent=warn"));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::sink);
    filtered_producer(&t, tracing_subscriber::registry().with(logs).with(traces), "logs all, traces filtered").await;
}

async fn filtered_producer(t: &Traced, subscriber: impl tracing::Subscriber + Send + Sync + 'static, how: &str) {
    let _default = crate::subscriber::scoped(subscriber);
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel2_filtered").unwrap();
    let (k, _) = q.enqueue(NewTask::new("w", doc! {})).instrument(tracing::info_span!("checkout")).await.unwrap();
    let spans = t.spans();
    let checkout = spans.iter().find(|s| s.name == "checkout").expect("the producer's span is traced");
    assert!(!spans.iter().any(|s| s.name == "mongoagent.enqueue"), "{how}: the library's span is filtered out");
    let d = stored(&store, &q, &k).await;
    assert_eq!(
        stored_trace(&d),
        Some(checkout.span_context.trace_id().to_string()),
        "{how}: the task stores its producer's trace: {d:?}"
    );
}

/// The same filtered layer on the worker's side, its `process` loop inside
/// a span of the application's ("worker loop"): the follow-up a run
/// enqueues stores the run's task's trace (its producer's), never the
/// worker loop's, the one OpenTelemetry's current context holds there.
#[tokio::test]
async fn under_a_filtered_layer_a_runs_follow_up_keeps_its_tasks_trace_not_the_worker_loops() {
    use tracing_subscriber::Layer as _;
    let t = Traced::new();
    let traces = tracing_opentelemetry::layer()
        .with_tracer(t.provider.tracer("review2"))
        .with_filter(tracing_subscriber::EnvFilter::new("info,mongoagent=warn"));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::sink);
    let _default = crate::subscriber::scoped(tracing_subscriber::registry().with(logs).with(traces));
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel2_filtered_run").unwrap();
    let (k, _) = q.enqueue(NewTask::new("w", doc! {})).instrument(tracing::info_span!("checkout")).await.unwrap();
    let producer = stored_trace(&stored(&store, &q, &k).await).expect("the task stores its producer's trace");
    let a = Agent::builder(store.clone(), "w", "review_otel2_filtered_run").build().unwrap();
    let ran = a
        .process(|_t: Task| async { Outcome::done().follow_up(NewTask::new("next", doc! {})) })
        .instrument(tracing::info_span!("worker loop"))
        .await
        .unwrap();
    assert!(matches!(ran, Some(Processed::Completed(_))), "{ran:?}");
    let spans = t.spans();
    let worker = spans.iter().find(|s| s.name == "worker loop").expect("the worker loop's span is traced");
    let child = Key::new(format!("{k}/0")).unwrap();
    let d = stored(&store, &q, &child).await;
    assert_ne!(stored_trace(&d), Some(worker.span_context.trace_id().to_string()), "the worker loop's trace: {d:?}");
    assert_eq!(stored_trace(&d), Some(producer), "the follow-up keeps its task's trace: {d:?}");
}
