//! Traces across the queue: a task carries the W3C trace context of the
//! span that enqueued it ([`fields::TRACE_CONTEXT`](crate::schema::fields::TRACE_CONTEXT)), and each run of it
//! continues that trace, so a producer's trace goes on in the agent that runs
//! its task, and in the runs of that task's follow-ups.
//!
//! The spans are `tracing` spans, always made (at `INFO`, nearly free without
//! a subscriber that wants them):
//!
//! | span | when | parent |
//! |---|---|---|
//! | `mongoagent.enqueue` | [`Queue::enqueue_all`](crate::Queue::enqueue_all) | the caller's |
//! | `mongoagent.run` | a claimed task's run, its handler inside it | the task's producer (its `trace_context`) |
//! | `mongoagent.complete`, `mongoagent.fail` | the outcome's write | the run |
//!
//! With the `otel` feature, a run span links to a `mongoagent.claim` span
//! (made only for claims that got tasks, from the global tracer provider or
//! the one given to [`AgentBuilder::tracer_provider`](crate::AgentBuilder::tracer_provider)),
//! and the context is read from, and written to, the `tracing-opentelemetry`
//! layer (a process without the layer passes a run's stored context on, as
//! it is, to what the run enqueues); without the feature, no
//! `trace_context` is written and runs start their own traces. A trace
//! context in a document that is not one (a foreign document) is ignored.

use bson::Document;
use tracing::Span;

/// The claim a run came from, for the run's link to it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClaimTrace {
    #[cfg(feature = "otel")]
    span: Option<opentelemetry::trace::SpanContext>,
}

#[cfg(feature = "otel")]
tokio::task_local! {
    /// The trace context stored in the task whose run this is: passed on
    /// as it is where no layer makes the run's span part of a trace.
    static STORED: Option<TraceContext>;
}

/// Puts the trace context of `span` into `doc`, a task about to be inserted,
/// if `span` is in a trace; else, inside a run ([`carry`]), the run's task's
/// own stored context, so that a process that exports nothing still passes
/// its producer's trace on to the follow-ups and tasks it enqueues; else,
/// outside runs, OpenTelemetry's current context.
pub(crate) fn inject(span: &Span, doc: &mut Document) {
    #[cfg(feature = "otel")]
    {
        let cx = TraceContext::of_span(span).or_else(|| match STORED.try_with(Clone::clone) {
            // Inside a run (or a scope): its task's context, or none; never
            // the span its worker loop runs in.
            Ok(stored) => stored,
            // A layer whose filter leaves the library's spans out still
            // makes its caller's span the current context.
            Err(_) => TraceContext::current(),
        });
        if let Some(cx) = cx {
            doc.insert(crate::schema::fields::TRACE_CONTEXT, cx.to_document());
        }
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, doc);
}

/// The trace context stored in a claimed task, for [`carry`].
#[derive(Debug, Default)]
pub(crate) struct Stored {
    #[cfg(feature = "otel")]
    context: Option<TraceContext>,
}

/// The trace context `record`'s task carries, if well formed.
pub(crate) fn stored(record: &store_trait::Record) -> Stored {
    #[cfg(feature = "otel")]
    {
        Stored { context: TraceContext::of_data(record.data()) }
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = record;
        Stored::default()
    }
}

/// `fut` (a run of a task), with the task's stored trace context at hand
/// for [`inject`].
pub(crate) fn carry<F: std::future::Future>(stored: Stored, fut: F) -> impl std::future::Future<Output = F::Output> {
    #[cfg(feature = "otel")]
    {
        STORED.scope(stored.context, fut)
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = stored;
        fut
    }
}

/// `fut`, to be spawned from inside a run: with the run's stored trace
/// context at hand, as [`carry`] gives it (a spawned task has its own).
pub(crate) fn carried<F: std::future::Future>(fut: F) -> impl std::future::Future<Output = F::Output> {
    #[cfg(feature = "otel")]
    {
        let stored = STORED.try_with(Clone::clone).ok().flatten();
        STORED.scope(stored, fut)
    }
    #[cfg(not(feature = "otel"))]
    fut
}

/// Where an agent's claim spans come from: the global tracer provider,
/// unless its builder was given one
/// ([`AgentBuilder::tracer_provider`](crate::AgentBuilder::tracer_provider)).
#[derive(Clone, Default)]
pub(crate) struct ClaimTracer {
    #[cfg(feature = "otel")]
    pub(crate) provider: Option<std::sync::Arc<dyn opentelemetry::global::ObjectSafeTracerProvider + Send + Sync>>,
}

impl std::fmt::Debug for ClaimTracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClaimTracer")
    }
}

impl ClaimTracer {
    /// A claim that got `tasks` tasks, sent at `sent`.
    pub(crate) fn claimed(&self, queue: &str, agent: &str, tasks: usize, sent: tokio::time::Instant) -> ClaimTrace {
        #[cfg(feature = "otel")]
        return ClaimTrace { span: otel::claim_span(self.provider.as_deref(), queue, agent, tasks, sent) };
        #[cfg(not(feature = "otel"))]
        {
            let _ = (queue, agent, tasks, sent);
            ClaimTrace::default()
        }
    }
}

/// The span of a run of the claimed task `record`, continuing its
/// producer's trace and linked to its claim.
pub(crate) fn run_span(agent: &str, record: &store_trait::Record, claim: &ClaimTrace) -> Span {
    // Its parent is its producer, never the agent's current span: a worker
    // loop's span would otherwise hold every run it ever made.
    let span = tracing::info_span!(
        parent: None,
        "mongoagent.run",
        otel.kind = "consumer",
        messaging.system = "mongoagent",
        messaging.operation.type = "process",
        agent,
        task = %record.key(),
        fence = record.fence(),
        outcome = tracing::field::Empty,
    );
    #[cfg(feature = "otel")]
    otel::continue_trace(&span, TraceContext::of_data(record.data()).as_ref(), claim);
    #[cfg(not(feature = "otel"))]
    let _ = claim;
    span
}

/// The span of an outcome's write: `mongoagent.complete`, or
/// `mongoagent.fail` (an error status, saying why).
pub(crate) fn outcome_span(outcome: &crate::outcome::Outcome) -> Span {
    match outcome {
        crate::outcome::Outcome::Fail { error, .. } => {
            tracing::info_span!("mongoagent.fail", otel.status_code = "ERROR", otel.status_description = %error)
        }
        _ => tracing::info_span!("mongoagent.complete"),
    }
}

/// A W3C trace context (`traceparent`, and `tracestate` if any): what a task
/// stores of its producer's trace in
/// [`fields::TRACE_CONTEXT`](crate::fields::TRACE_CONTEXT), and what a
/// program hands on to a process it starts (`TRACEPARENT`, `TRACESTATE`).
///
/// Only a well-formed context is one: lowercase hex, ids not all zero;
/// version `00` with nothing after the flags, or a later version (`01` to
/// `fe`) read as the W3C recommendation says, by its first four fields
/// (only the sampled flag kept). A stored value from anywhere else is
/// refused whole, never half read. A malformed `tracestate` (a bad key, or
/// a value with a control, non-ASCII, `,` or `=` character) is dropped and
/// the `traceparent` kept, as the recommendation says. What it formats is
/// always version `00`.
///
/// ```
/// use mongoagent::TraceContext;
///
/// let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// let cx = TraceContext::from_headers(parent, Some("vendor=abc")).unwrap();
/// assert_eq!(cx.traceparent(), parent);
/// assert_eq!(cx.tracestate().as_deref(), Some("vendor=abc"));
/// assert!(cx.span_context().is_sampled());
///
/// assert!(TraceContext::from_headers("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None).is_none());
/// assert!(TraceContext::from_headers("not a traceparent", None).is_none());
///
/// // A later version: its first four fields, as version 00.
/// let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more";
/// assert_eq!(TraceContext::from_headers(later, None).unwrap().traceparent(), parent);
/// // A malformed tracestate is dropped.
/// let cx = TraceContext::from_headers(parent, Some("vendor=a\r\nx: 1")).unwrap();
/// assert_eq!(cx.tracestate(), None);
/// ```
#[cfg(feature = "otel")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext(opentelemetry::trace::SpanContext);

#[cfg(feature = "otel")]
impl TraceContext {
    /// The context W3C headers name, if `traceparent` is well formed.
    pub fn from_headers(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
        use std::str::FromStr as _;
        let mut parts = traceparent.split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex =
            |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        // Version 00 has four fields; a later one may have more, after a dash.
        let rest_ok = if version == "00" { parts.next().is_none() } else { version != "ff" };
        if !hex(version, 2) || !rest_ok || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return None;
        }
        let trace = TraceId::from_hex(trace).ok()?;
        let span = SpanId::from_hex(span).ok()?;
        let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()? & TraceFlags::SAMPLED.to_u8());
        // The SDK checks keys, but of values only `,`, `=` and the length:
        // a value is printable ASCII (a list's separators are spaces and tabs).
        let printable = |s: &str| s.bytes().all(|b| (0x20..=0x7e).contains(&b) || b == b'\t');
        let state = tracestate.filter(|s| printable(s)).and_then(|s| TraceState::from_str(s).ok()).unwrap_or_default();
        let sc = SpanContext::new(trace, span, flags, true, state);
        sc.is_valid().then_some(Self(sc))
    }

    /// The context of `span`, if the `tracing-opentelemetry` layer makes it
    /// part of a trace (sampled or not); none without the layer.
    pub fn of_span(span: &Span) -> Option<Self> {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        Self::of_context(&span.context())
    }

    /// The context of OpenTelemetry's current context, if it is in a trace.
    pub fn current() -> Option<Self> {
        Self::of_context(&opentelemetry::Context::current())
    }

    fn of_context(cx: &opentelemetry::Context) -> Option<Self> {
        use opentelemetry::trace::TraceContextExt as _;
        let sc = cx.span().span_context().clone();
        sc.is_valid().then_some(Self(sc))
    }

    /// The context `task` carries (its producer's), if well formed.
    pub fn of_task(task: &crate::task::Task) -> Option<Self> {
        Self::of_data(task.data())
    }

    pub(crate) fn of_data(data: &Document) -> Option<Self> {
        let d = data.get_document(crate::schema::fields::TRACE_CONTEXT).ok()?;
        Self::from_headers(d.get_str("traceparent").ok()?, d.get_str("tracestate").ok())
    }

    fn to_document(&self) -> Document {
        let mut d = bson::doc! { "traceparent": self.traceparent() };
        if let Some(state) = self.tracestate() {
            d.insert("tracestate", state);
        }
        d
    }

    /// The `traceparent` header.
    pub fn traceparent(&self) -> String {
        let sc = &self.0;
        format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8())
    }

    /// The `tracestate` header, if not empty.
    pub fn tracestate(&self) -> Option<String> {
        Some(self.0.trace_state().header()).filter(|s| !s.is_empty())
    }

    /// The span context: a remote one when read from headers or a task.
    pub fn span_context(&self) -> &opentelemetry::trace::SpanContext {
        &self.0
    }

    /// An OpenTelemetry context whose (remote) parent this is, for
    /// `tracing_opentelemetry::OpenTelemetrySpanExt::set_parent`.
    pub fn to_parent(&self) -> opentelemetry::Context {
        use opentelemetry::trace::TraceContextExt as _;
        opentelemetry::Context::new().with_remote_span_context(self.0.clone())
    }

    /// `fut`, whose enqueues store this context where their span is in no
    /// trace: a process without the `tracing-opentelemetry` layer (one that
    /// exports nothing) still passes on the trace it was handed. Where the
    /// layer puts the enqueue's span in a trace, that trace wins. A task
    /// spawned from `fut` does not inherit the context.
    pub fn scope<F: std::future::Future>(self, fut: F) -> impl std::future::Future<Output = F::Output> {
        STORED.scope(Some(self), fut)
    }
}

#[cfg(feature = "otel")]
mod otel {
    use std::time::SystemTime;

    use opentelemetry::global::BoxedTracer;
    use opentelemetry::trace::{SpanContext, SpanKind, Tracer, TracerProvider};
    use opentelemetry::{Context, InstrumentationScope, KeyValue};
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::{ClaimTrace, TraceContext};

    pub(super) fn continue_trace(span: &Span, stored: Option<&TraceContext>, claim: &ClaimTrace) {
        if let Some(parent) = stored {
            // Fails only without the layer (nothing to continue then).
            let _ = span.set_parent(parent.to_parent());
        }
        if let Some(c) = &claim.span {
            span.add_link(c.clone());
        }
    }

    /// A `mongoagent.claim` span from `provider` (else the global tracer
    /// provider), from `sent` to now, for a claim that got tasks.
    pub(super) fn claim_span(
        provider: Option<&(dyn opentelemetry::global::ObjectSafeTracerProvider + Send + Sync)>,
        queue: &str,
        agent: &str,
        tasks: usize,
        sent: tokio::time::Instant,
    ) -> Option<SpanContext> {
        if tasks == 0 {
            return None;
        }
        let tracer = match provider {
            Some(p) => BoxedTracer::new(p.boxed_tracer(InstrumentationScope::builder("mongoagent").build())),
            None => opentelemetry::global::tracer_provider().tracer("mongoagent"),
        };
        let start = SystemTime::now().checked_sub(sent.elapsed()).unwrap_or_else(SystemTime::now);
        let mut span = tracer
            .span_builder("mongoagent.claim")
            .with_kind(SpanKind::Consumer)
            .with_start_time(start)
            .with_attributes([
                KeyValue::new("messaging.system", "mongoagent"),
                KeyValue::new("messaging.operation.type", "receive"),
                KeyValue::new("messaging.destination.name", queue.to_owned()),
                KeyValue::new("messaging.batch.message_count", i64::try_from(tasks).unwrap_or(i64::MAX)),
                KeyValue::new("agent", agent.to_owned()),
            ])
            // A root, whatever span the agent's loop runs in: a worker's
            // claims are no part of the trace it was started in.
            .start_with_context(&tracer, &Context::new());
        let sc = opentelemetry::trace::Span::span_context(&span).clone();
        opentelemetry::trace::Span::end(&mut span);
        sc.is_valid().then_some(sc)
    }
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use bson::doc;

    use super::TraceContext;

    fn parse(d: &bson::Document) -> Option<opentelemetry::trace::SpanContext> {
        TraceContext::of_data(&doc! { "trace_context": d.clone() }).map(|cx| cx.span_context().clone())
    }

    #[test]
    fn a_traceparent_is_read_back_and_foreign_ones_are_ignored() {
        let d = doc! { "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "k=v" };
        let sc = parse(&d).unwrap();
        assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
        assert_eq!(sc.trace_state().header(), "k=v");
        for bad in [
            doc! {},
            doc! { "traceparent": 7 },
            doc! { "traceparent": "" },
            doc! { "traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" },
            doc! { "traceparent": "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" },
            doc! { "traceparent": "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x" },
            doc! { "traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01" },
            doc! { "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01" },
            doc! { "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01" },
            doc! { "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x" },
            doc! { "traceparent": "00-ä4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01" },
            doc! { "traceparent": "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" },
            doc! { "traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01" },
        ] {
            assert!(parse(&bad).is_none(), "{bad:?}");
        }
    }
}
