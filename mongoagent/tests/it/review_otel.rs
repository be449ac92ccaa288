//! Review of traces (#33), as an adversary sees them: trace contexts written
//! by another program (wrong types, huge, malformed), enqueue paths other
//! than `enqueue_all` (debounce, prepared outbox tasks, fan-in steps),
//! handlers and producers trying to forge `trace_context`, a chain whose
//! middle agent has no OpenTelemetry layer, and the cost with no subscriber.
//!
//! Each test says in its doc comment whether the attack HELD (the test
//! passes) or is a FINDING (the test fails, as written against the promise).
//!
//! None of these tests sets the global tracer provider: the `otel` suite's
//! test reads its claim span from the one it sets, and a second one set
//! concurrently would steal it.

use std::time::{Duration, Instant};

use bson::{doc, Document};
use mongoagent::{Agent, NewTask, Outcome, Processed, Queue, Task};
use store_memory::MemoryStore;
use store_trait::{Key, Store};

#[cfg(feature = "otel")]
mod traced {
    //! An in-memory exporter behind a `tracing-opentelemetry` layer, set as
    //! the thread's default subscriber (the tests run on a current-thread
    //! runtime, so the agent's spawned handlers see it too).
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry::Value;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
    use tracing_subscriber::layer::SubscriberExt;

    pub(super) struct Traced {
        pub(super) exporter: InMemorySpanExporter,
        pub(super) provider: SdkTracerProvider,
    }

    impl Traced {
        pub(super) fn new() -> Self {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
            Traced { exporter, provider }
        }

        /// The subscriber to set as default while traced.
        pub(super) fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
            tracing_subscriber::registry()
                .with(tracing_opentelemetry::layer().with_tracer(self.provider.tracer("review")))
        }

        pub(super) fn spans(&self) -> Vec<SpanData> {
            self.provider.force_flush().unwrap();
            self.exporter.get_finished_spans().unwrap()
        }
    }

    pub(super) fn attr<'a>(s: &'a SpanData, key: &str) -> Option<&'a Value> {
        s.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
    }

    /// The `mongoagent.run` spans of task `id`.
    pub(super) fn runs_of<'a>(spans: &'a [SpanData], id: &str) -> Vec<&'a SpanData> {
        spans
            .iter()
            .filter(|s| s.name == "mongoagent.run" && attr(s, "task").is_some_and(|v| v.as_str() == id))
            .collect()
    }

    pub(super) fn one<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
        let found: Vec<&SpanData> = spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name} among {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());
        found[0]
    }
}

async fn stored(store: &MemoryStore, q: &Queue<MemoryStore>, id: &Key) -> Document {
    let r = store.get(q.collection(), id).await.unwrap().record.unwrap_or_else(|| panic!("no task {id}"));
    r.data().clone()
}

/// The trace id (32 hex digits) of a stored `trace_context`, if any.
fn stored_trace_id(d: &Document) -> Option<String> {
    let tp = d.get_document("trace_context").ok()?.get_str("traceparent").ok()?;
    Some(tp.split('-').nth(1)?.to_owned())
}

const VALID_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const VALID_PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// HELD if it passes. Documents another program wrote, with `trace_context`
/// of every wrong shape (a string, a number, an array, null, a traceparent
/// of the wrong type, 4 MiB long, uppercase, all-zero ids, version ff,
/// unknown flags, multibyte text at the hex positions, extra fields, a
/// tracestate of the wrong type or with 10 000 members): each is claimed and
/// run without a panic, each run starts a trace of its own (no forged id is
/// continued), and a follow-up of a run whose context carries a huge
/// tracestate stores at most the 32 members W3C allows. A well-formed one
/// is continued (so the test is not vacuous).
#[cfg(feature = "otel")]
#[tokio::test]
async fn foreign_trace_contexts_of_every_bad_shape_are_ignored_without_a_panic() {
    let t = traced::Traced::new();
    let _default = crate::subscriber::scoped(t.subscriber());
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel_foreign").unwrap();
    q.ensure_indexes().await.unwrap();
    let huge = "a".repeat(4 << 20);
    let many: String = (0..10_000).map(|i| format!("k{i}=v{i}")).collect::<Vec<_>>().join(",");
    let zeros_trace = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
    let zeros_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
    use bson::Bson;
    let bad: Vec<(&str, Bson)> = vec![
        ("str", Bson::String(VALID_PARENT.into())),
        ("num", Bson::Int64(7)),
        ("arr", Bson::Array(vec![Bson::String(VALID_PARENT.into())])),
        ("null", Bson::Null),
        ("tp_int", Bson::Document(doc! { "traceparent": 12_i64 })),
        ("tp_doc", Bson::Document(doc! { "traceparent": { "v": VALID_PARENT } })),
        ("tp_huge", Bson::Document(doc! { "traceparent": huge.clone() })),
        ("tp_upper", Bson::Document(doc! { "traceparent": VALID_PARENT.to_uppercase() })),
        ("tp_zero_trace", Bson::Document(doc! { "traceparent": zeros_trace })),
        ("tp_zero_span", Bson::Document(doc! { "traceparent": zeros_span })),
        ("tp_ff", Bson::Document(doc! { "traceparent": VALID_PARENT.replacen("00", "ff", 1) })),
        ("tp_flags", Bson::Document(doc! { "traceparent": VALID_PARENT.replace("-01", "-zz") })),
        ("tp_utf8", Bson::Document(doc! { "traceparent": "00-ééééééééééééééé4bf92f3-00f067aa0ba902b7-01" })),
        ("tp_short", Bson::Document(doc! { "traceparent": "00-4bf9-00f0-01" })),
        ("tp_dashes", Bson::Document(doc! { "traceparent": "----" })),
    ];
    let mut docs: Vec<Document> = bad
        .iter()
        .map(|(id, tc)| doc! { "_id": *id, "agent_name": "foreign", "ready": true, "trace_context": tc.clone() })
        .collect();
    // Well formed, with extra fields and a tracestate of the wrong type: continued.
    docs.push(doc! { "_id": "ok_extra", "agent_name": "foreign", "ready": true,
    "trace_context": { "traceparent": VALID_PARENT, "tracestate": 5_i32, "baggage": "x", "more": [1, 2] } });
    // Well formed, with a 10 000-member tracestate; its run makes a follow-up.
    docs.push(doc! { "_id": "ok_many", "agent_name": "foreign", "ready": true,
    "trace_context": { "traceparent": VALID_PARENT, "tracestate": many.clone() } });
    store.insert_many(q.collection(), docs).await.unwrap();

    let a = Agent::builder(store.clone(), "foreign", q.collection().as_str()).build().unwrap();
    let mut done = 0;
    while let Some(p) = a
        .process(|t: Task| async move {
            if t.id().to_string() == "ok_many" {
                Outcome::done().follow_up(NewTask::new("child", doc! {}))
            } else {
                Outcome::done()
            }
        })
        .await
        .unwrap()
    {
        assert!(matches!(p, Processed::Completed(_)), "{p:?}");
        done += 1;
    }
    assert_eq!(done, bad.len() + 2);
    let spans = t.spans();
    for (id, _) in &bad {
        let runs = traced::runs_of(&spans, id);
        assert_eq!(runs.len(), 1, "{id}");
        let trace = runs[0].span_context.trace_id().to_string();
        assert_ne!(trace, VALID_TRACE, "{id}: a malformed context was continued");
        assert!(runs[0].span_context.is_valid(), "{id}");
    }
    for id in ["ok_extra", "ok_many"] {
        let runs = traced::runs_of(&spans, id);
        assert_eq!(runs[0].span_context.trace_id().to_string(), VALID_TRACE, "{id} continues its producer");
    }
    let child = stored(&store, &q, &Key::new("ok_many/0").unwrap()).await;
    assert_eq!(stored_trace_id(&child).as_deref(), Some(VALID_TRACE), "{child:?}");
    let state = child.get_document("trace_context").unwrap().get_str("tracestate").unwrap_or("");
    assert!(
        state.split(',').count() <= 32 && state.len() <= 32 * 514,
        "tracestate kept bounded: {} bytes",
        state.len()
    );
}

/// FOUND, fixed (it failed before). A chain whose middle agent runs without a
/// `tracing-opentelemetry` layer (the `otel` feature is on, it is linked
/// against the API, but that process exports nothing, like `mongocoord
/// agent` without `OTEL_EXPORTER_OTLP_ENDPOINT`): the producer's trace
/// should pass through it to the follow-up, as OpenTelemetry's propagation
/// does through a process whose tracer is a no-op. Here the follow-up is
/// stored without any `trace_context`, and its run (in a traced process)
/// starts a new trace: the chain is cut for good.
#[cfg(feature = "otel")]
#[tokio::test]
async fn a_follow_up_made_by_an_untraced_agent_keeps_the_producers_trace() {
    let t = traced::Traced::new();
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel_gap").unwrap();
    let (first, trace) = {
        let _default = crate::subscriber::scoped(t.subscriber());
        let span = tracing::info_span!("producer");
        let (k, _) = tracing::Instrument::instrument(q.enqueue(NewTask::new("mid", doc! {})), span).await.unwrap();
        drop(_default);
        let d = stored(&store, &q, &k).await;
        (k, stored_trace_id(&d).expect("the producer's trace is stored"))
    };
    // The middle agent: no subscriber at all.
    let mid = Agent::builder(store.clone(), "mid", q.collection().as_str()).build().unwrap();
    let p = mid.process(|_t: Task| async { Outcome::done().follow_up(NewTask::new("last", doc! {})) }).await.unwrap();
    assert_eq!(p, Some(Processed::Completed(first.clone())));
    let child_id = Key::new(format!("{first}/0")).unwrap();
    let child = stored(&store, &q, &child_id).await;
    // Traced again: the last agent.
    let _default = crate::subscriber::scoped(t.subscriber());
    let last = Agent::builder(store.clone(), "last", q.collection().as_str()).build().unwrap();
    assert!(last.process(|_t: Task| async { Outcome::done() }).await.unwrap().is_some());
    let spans = t.spans();
    let run = traced::runs_of(&spans, &child_id.to_string());
    assert_eq!(run.len(), 1);
    assert_eq!(
        run[0].span_context.trace_id().to_string(),
        trace,
        "the follow-up's run continues the producer's trace (stored on the follow-up: {:?})",
        child.get("trace_context")
    );
}

/// FOUND, fixed (it failed before). A debounce replaces the waiting task's data with the
/// latest enqueue's ("the task's data is this enqueue's alone, never a mix of
/// two"), but `trace_context` is reserved, so the replace keeps the first
/// producer's when the latest enqueue is untraced: the task runs the second
/// producer's data in the first producer's trace.
#[cfg(feature = "otel")]
#[tokio::test]
async fn a_debounced_task_runs_in_the_trace_of_the_enqueue_whose_data_it_has() {
    let t = traced::Traced::new();
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel_debounce").unwrap();
    let task = |n: i32| NewTask::new("deb", doc! { "n": n }).dedupe_key("k").debounce(Duration::from_secs(3600));
    let (k, _) = {
        let _default = crate::subscriber::scoped(t.subscriber());
        tracing::Instrument::instrument(q.enqueue(task(1)), tracing::info_span!("first producer")).await.unwrap()
    };
    let first = stored_trace_id(&stored(&store, &q, &k).await).expect("traced");
    // The second producer: untraced; its data replaces the first's.
    let (k2, new) = q.enqueue(task(2)).await.unwrap();
    assert_eq!((&k2, new), (&k, false), "debounced into the waiting task");
    let d = stored(&store, &q, &k).await;
    assert_eq!(d.get_i32("n").ok(), Some(2), "{d:?}");
    assert_ne!(stored_trace_id(&d), Some(first), "the second enqueue's data runs in the first producer's trace: {d:?}");
}

/// HELD if it passes. Two traced producers debounce into one task: it keeps
/// the latest one's trace, along with its data.
#[cfg(feature = "otel")]
#[tokio::test]
async fn a_debounced_task_takes_the_latest_traced_producers_context() {
    let t = traced::Traced::new();
    let _default = crate::subscriber::scoped(t.subscriber());
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel_debounce2").unwrap();
    let task = |n: i32| NewTask::new("deb", doc! { "n": n }).dedupe_key("k").debounce(Duration::from_secs(3600));
    let (k, _) = tracing::Instrument::instrument(q.enqueue(task(1)), tracing::info_span!("p1")).await.unwrap();
    let first = stored_trace_id(&stored(&store, &q, &k).await).unwrap();
    tracing::Instrument::instrument(q.enqueue(task(2)), tracing::info_span!("p2")).await.unwrap();
    let second = stored_trace_id(&stored(&store, &q, &k).await).unwrap();
    assert_ne!(first, second);
    let spans = t.spans();
    let p2 = traced::one(&spans, "p2");
    assert_eq!(second, p2.span_context.trace_id().to_string());
}

/// HELD if it passes. A prepared (outbox) task carries the trace of the span
/// it was prepared in, and its run, once another writer inserted it,
/// continues that trace.
#[cfg(feature = "otel")]
#[tokio::test]
async fn a_prepared_outbox_task_carries_and_continues_the_callers_trace() {
    let t = traced::Traced::new();
    let _default = crate::subscriber::scoped(t.subscriber());
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel_outbox").unwrap();
    let prepared = tracing::Instrument::instrument(
        q.prepare(NewTask::new("outbox", doc! { "n": 1 })),
        tracing::info_span!("transaction"),
    )
    .await
    .unwrap();
    let id = prepared.id().clone();
    let trace = stored_trace_id(prepared.document()).expect("a prepared task carries the caller's trace");
    store.insert_many(q.collection(), vec![prepared.into_document()]).await.unwrap();
    let a = Agent::builder(store.clone(), "outbox", q.collection().as_str()).build().unwrap();
    assert!(a.process(|_t: Task| async { true }).await.unwrap().is_some());
    let spans = t.spans();
    let tx = traced::one(&spans, "transaction");
    assert_eq!(trace, tx.span_context.trace_id().to_string());
    assert_eq!(traced::runs_of(&spans, &id.to_string())[0].span_context.trace_id().to_string(), trace);
}

/// HELD if it passes. A fan-in step (`Outcome::then`) and the follow-ups it
/// waits for all continue the parent's trace, and the step's run is under the
/// parent's outcome write (where it was enqueued), not under the last
/// follow-up's run that woke it.
#[cfg(feature = "otel")]
#[tokio::test]
async fn a_fan_in_step_continues_its_parents_trace() {
    let t = traced::Traced::new();
    let _default = crate::subscriber::scoped(t.subscriber());
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel_fanin").unwrap();
    let (k, _) =
        tracing::Instrument::instrument(q.enqueue(NewTask::new("root", doc! {})), tracing::info_span!("order"))
            .await
            .unwrap();
    let coll = q.collection().as_str().to_owned();
    let root = Agent::builder(store.clone(), "root", &coll).build().unwrap();
    root.process(|_t: Task| async {
        Outcome::done()
            .follow_up(NewTask::new("leg", doc! { "i": 1 }))
            .follow_up(NewTask::new("leg", doc! { "i": 2 }))
            .then(NewTask::new("join", doc! {}))
    })
    .await
    .unwrap();
    let leg = Agent::builder(store.clone(), "leg", &coll).build().unwrap();
    while leg.process(|_t: Task| async { true }).await.unwrap().is_some() {}
    let join = Agent::builder(store.clone(), "join", &coll).build().unwrap();
    assert!(join.process(|_t: Task| async { true }).await.unwrap().is_some());
    let spans = t.spans();
    let trace = traced::one(&spans, "order").span_context.trace_id();
    let root_run = traced::runs_of(&spans, &k.to_string())[0];
    let root_complete = spans
        .iter()
        .find(|s| s.name == "mongoagent.complete" && s.parent_span_id == root_run.span_context.span_id())
        .expect("the root's outcome write");
    for id in [format!("{k}/0"), format!("{k}/1"), format!("{k}/then")] {
        let runs = traced::runs_of(&spans, &id);
        assert_eq!(runs.len(), 1, "{id}");
        assert_eq!(runs[0].span_context.trace_id(), trace, "{id} continues the trace");
        assert_eq!(runs[0].parent_span_id, root_complete.span_context.span_id(), "{id} under the root's outcome");
    }
}

/// HELD if it passes. User data cannot set `trace_context`: not a new
/// task's data, not a follow-up's, not a handler's merge (the task fails
/// for good, and its stored context is still its producer's).
#[tokio::test]
async fn user_data_cannot_forge_a_trace_context_on_any_path() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel_forge").unwrap();
    let forged = doc! { "traceparent": VALID_PARENT };
    let err = q.enqueue(NewTask::new("w", doc! { "trace_context": forged.clone() })).await;
    assert!(err.is_err(), "a new task's data");
    let err = q.prepare(NewTask::new("w", doc! { "trace_context": forged.clone() })).await;
    assert!(err.is_err(), "a prepared task's data");
    let (k, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let (k2, _) = q.enqueue(NewTask::new("w", doc! {})).await.unwrap();
    let a = Agent::builder(store.clone(), "w", q.collection().as_str()).build().unwrap();
    // Two claims, in claim order (ids are not ordered): the first run merges
    // it, the second makes a follow-up with it.
    let f = forged.clone();
    let p = a.process(move |_t: Task| {
        let f = f.clone();
        async move { Outcome::done_with(doc! { "trace_context": f }) }
    });
    assert!(matches!(p.await.unwrap(), Some(Processed::Failed(_))), "a handler's merge");
    let f = forged.clone();
    let p = a.process(move |_t: Task| {
        let f = f.clone();
        async move { Outcome::done().follow_up(NewTask::new("w2", doc! { "trace_context": f })) }
    });
    assert!(matches!(p.await.unwrap(), Some(Processed::Failed(_))), "a follow-up's data");
    for id in [&k, &k2] {
        let d = stored(&store, &q, id).await;
        assert_ne!(stored_trace_id(&d).as_deref(), Some(VALID_TRACE), "{d:?}");
    }
    let all = q.tasks(doc! {}, None).await.unwrap();
    assert!(all.iter().all(|r| stored_trace_id(r.data()).as_deref() != Some(VALID_TRACE)), "{all:?}");
}

/// HELD if it passes. Without the `otel` feature nothing is stored, even
/// inside spans of an installed subscriber.
#[cfg(not(feature = "otel"))]
#[tokio::test]
async fn without_the_feature_nothing_is_stored_even_inside_spans() {
    let _default = crate::subscriber::scoped(tracing_subscriber::registry());
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel_nofeature").unwrap();
    let (k, _) =
        tracing::Instrument::instrument(q.enqueue(NewTask::new("w", doc! {})), tracing::info_span!("p")).await.unwrap();
    let prepared = q.prepare(NewTask::new("w", doc! {})).await.unwrap();
    assert!(prepared.document().get("trace_context").is_none());
    let a = Agent::builder(store.clone(), "w", q.collection().as_str()).build().unwrap();
    a.process(|_t: Task| async { Outcome::done().follow_up(NewTask::new("x", doc! {})) }).await.unwrap();
    for r in q.tasks(doc! {}, None).await.unwrap() {
        assert!(r.data().get("trace_context").is_none(), "{k}: {:?}", r.data());
    }
}

/// HELD if it passes (a measurement, reported on stderr). With no
/// subscriber installed, enqueuing and running tasks costs no more than a
/// few microseconds per task beyond the store's work: 2 000 tasks enqueued
/// one by one and run on the memory store within a generous bound, with and
/// without the `otel` feature. Measured (debug build, loaded 2-core box):
/// 64-90 µs per enqueue and 2.6-3.2 ms per `process` either way: no
/// difference above the noise.
#[tokio::test]
async fn with_no_subscriber_the_spans_cost_next_to_nothing() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "review_otel_cost").unwrap();
    const N: usize = 2000;
    let start = Instant::now();
    for i in 0..N {
        q.enqueue(NewTask::new("c", doc! { "i": i64::try_from(i).unwrap() })).await.unwrap();
    }
    let enqueue = start.elapsed();
    let a = Agent::builder(store.clone(), "c", q.collection().as_str()).build().unwrap();
    let start = Instant::now();
    let mut n = 0;
    while a.process(|_t: Task| async { true }).await.unwrap().is_some() {
        n += 1;
    }
    let run = start.elapsed();
    assert_eq!(n, N);
    eprintln!(
        "review_otel cost (otel feature: {}): enqueue {:?}/task, run {:?}/task",
        cfg!(feature = "otel"),
        enqueue / u32::try_from(N).unwrap(),
        run / u32::try_from(N).unwrap()
    );
    assert!(enqueue + run < Duration::from_secs(60), "{enqueue:?} + {run:?}");
}
