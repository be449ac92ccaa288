//! OpenTelemetry (the `otel` feature): a task carries its producer's trace
//! context, its run continues that trace, and its follow-ups' runs continue
//! its run's; the spans are exported through `tracing-opentelemetry` to an
//! in-memory exporter and read back with their parent links.

use bson::doc;
use mongoagent::{Agent, NewTask, Outcome, Queue, Task};
use opentelemetry::trace::{SpanId, Status, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use store_memory::MemoryStore;
use tracing::Instrument;

use crate::subscriber::scoped;
use tracing_subscriber::layer::SubscriberExt;

fn attr<'a>(s: &'a SpanData, key: &str) -> Option<&'a Value> {
    s.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| &kv.value)
}

/// The one span named `name` whose attribute `key` is `value` (any, without).
fn one<'a>(spans: &'a [SpanData], name: &str, with: Option<(&str, &str)>) -> &'a SpanData {
    let found: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| with.is_none_or(|(k, v)| attr(s, k).is_some_and(|x| x.as_str() == v)))
        .collect();
    assert_eq!(found.len(), 1, "one {name} {with:?} among {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>());
    found[0]
}

#[tokio::test]
async fn a_follow_up_chain_continues_the_producers_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    // Claim spans come from the global provider, as an application sets it.
    opentelemetry::global::set_tracer_provider(provider.clone());
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
    let _default = scoped(tracing_subscriber::registry().with(layer));

    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    let checkout = tracing::info_span!("checkout");
    let (first, _) = q.enqueue(NewTask::new("otel_a", doc! { "n": 1 })).instrument(checkout.clone()).await.unwrap();
    drop(checkout);
    let a = Agent::builder(store.clone(), "otel_a", "tasks").build().unwrap();
    let ran = a
        .process(|_t: Task| async {
            tracing::info_span!("charge card").in_scope(|| ());
            Outcome::done().follow_up(NewTask::new("otel_b", doc! { "n": 2 }))
        })
        .await
        .unwrap();
    assert!(ran.is_some());
    let b = Agent::builder(store.clone(), "otel_b", "tasks").build().unwrap();
    assert!(b.process(|_t: Task| async { Outcome::failed_permanently("declined") }).await.unwrap().is_some());
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();

    let checkout = one(&spans, "checkout", None);
    let trace = checkout.span_context.trace_id();
    let enqueue = one(&spans, "mongoagent.enqueue", None);
    assert_eq!(enqueue.parent_span_id, checkout.span_context.span_id(), "the enqueue is in the caller's span");
    let run_a = one(&spans, "mongoagent.run", Some(("task", &first.to_string())));
    assert_eq!(run_a.span_context.trace_id(), trace, "the run continues the producer's trace");
    assert_eq!(run_a.parent_span_id, enqueue.span_context.span_id(), "the run's parent is the enqueue");
    assert_eq!(attr(run_a, "outcome").map(Value::as_str).as_deref(), Some("completed"));
    let charge = one(&spans, "charge card", None);
    assert_eq!(charge.parent_span_id, run_a.span_context.span_id(), "the handler runs inside the run");
    let complete = one(&spans, "mongoagent.complete", None);
    assert_eq!(complete.parent_span_id, run_a.span_context.span_id());
    // The claim: its own span, which the run links to.
    let claim = one(&spans, "mongoagent.claim", Some(("agent", "otel_a")));
    assert!(
        run_a.links.iter().any(|l| l.span_context.span_id() == claim.span_context.span_id()),
        "the run links to its claim"
    );
    // The follow-up's run continues the trace, under the outcome that enqueued it.
    let run_b = one(&spans, "mongoagent.run", Some(("agent", "otel_b")));
    assert_eq!(run_b.span_context.trace_id(), trace, "the follow-up's run continues the trace");
    assert_eq!(run_b.parent_span_id, complete.span_context.span_id());
    let fail = one(&spans, "mongoagent.fail", None);
    assert_eq!(fail.parent_span_id, run_b.span_context.span_id());
    assert!(
        matches!(&fail.status, Status::Error { description } if description.contains("declined")),
        "{:?}",
        fail.status
    );
    assert_ne!(run_b.span_context.span_id(), SpanId::INVALID);
}

/// An application that keeps a tracer provider of its own (not the global
/// one) gives it to the builder, and the agent's claim spans go to it.
#[tokio::test]
async fn claim_spans_come_from_the_builders_provider() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    q.enqueue(NewTask::new("otel_own", doc! {})).await.unwrap();
    let a = Agent::builder(store.clone(), "otel_own", "tasks").tracer_provider(provider.clone()).build().unwrap();
    assert!(a.process(|_t: Task| async { Outcome::done() }).await.unwrap().is_some());
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let claim = one(&spans, "mongoagent.claim", Some(("agent", "otel_own")));
    assert_eq!(attr(claim, "messaging.batch.message_count"), Some(&Value::I64(1)));
}

#[tokio::test]
async fn without_a_trace_nothing_is_written_and_a_foreign_context_is_ignored() {
    let store = MemoryStore::new();
    let q = Queue::new(store.clone(), "tasks").unwrap();
    // No subscriber: no span is in a trace, so no trace context is stored.
    let (k, _) = q.enqueue(NewTask::new("otel_c", doc! {})).await.unwrap();
    let t = q.tasks(doc! { "_id": k.as_bson().clone() }, None).await.unwrap();
    assert_eq!(t.len(), 1);
    assert!(t[0].data().get("trace_context").is_none(), "{:?}", t[0].data());
    // User data cannot set it: it is reserved.
    let forged = NewTask::new(
        "otel_c",
        doc! { "trace_context": { "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" } },
    );
    assert!(q.enqueue(forged).await.is_err(), "trace_context is reserved");
}
