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
//! (made only for claims that got tasks, from the global tracer provider),
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
    static STORED: Option<Document>;
}

/// Puts the trace context of `span` into `doc`, a task about to be inserted,
/// if `span` is in a trace; else, inside a run ([`carry`]), the run's task's
/// own stored context, so that a process that exports nothing still passes
/// its producer's trace on to the follow-ups and tasks it enqueues.
pub(crate) fn inject(span: &Span, doc: &mut Document) {
    #[cfg(feature = "otel")]
    if let Some(cx) = otel::context_of(span).or_else(|| STORED.try_with(Clone::clone).ok().flatten()) {
        doc.insert(crate::schema::fields::TRACE_CONTEXT, cx);
    }
    #[cfg(not(feature = "otel"))]
    let _ = (span, doc);
}

/// The trace context stored in a claimed task, for [`carry`].
#[derive(Debug, Default)]
pub(crate) struct Stored {
    #[cfg(feature = "otel")]
    context: Option<Document>,
}

/// The trace context `record`'s task carries, if well formed.
pub(crate) fn stored(record: &store_trait::Record) -> Stored {
    #[cfg(feature = "otel")]
    {
        let context = record.data().get_document(crate::schema::fields::TRACE_CONTEXT).ok();
        Stored { context: context.filter(|d| otel::parse(d).is_some()).cloned() }
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

/// A claim that got `tasks` tasks, sent at `sent`.
pub(crate) fn claimed(queue: &str, agent: &str, tasks: usize, sent: tokio::time::Instant) -> ClaimTrace {
    #[cfg(feature = "otel")]
    return ClaimTrace { span: otel::claim_span(queue, agent, tasks, sent) };
    #[cfg(not(feature = "otel"))]
    {
        let _ = (queue, agent, tasks, sent);
        ClaimTrace::default()
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
    otel::continue_trace(&span, record.data().get_document(crate::schema::fields::TRACE_CONTEXT).ok(), claim);
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

#[cfg(feature = "otel")]
mod otel {
    use std::str::FromStr;
    use std::time::SystemTime;

    use bson::{doc, Document};
    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer, TracerProvider,
    };
    use opentelemetry::{Context, KeyValue};
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::ClaimTrace;

    /// The W3C trace context of `span` (`traceparent`, and `tracestate` if
    /// any), if it is in a sampled or unsampled trace at all.
    pub(super) fn context_of(span: &Span) -> Option<Document> {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        if !sc.is_valid() {
            return None;
        }
        let parent = format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8());
        let mut d = doc! { "traceparent": parent };
        let state = sc.trace_state().header();
        if !state.is_empty() {
            d.insert("tracestate", state);
        }
        Some(d)
    }

    /// The span context a W3C `traceparent` (and `tracestate`) names, if
    /// well formed (version 00, ids not all zero).
    pub(super) fn parse(d: &Document) -> Option<SpanContext> {
        let parent = d.get_str("traceparent").ok()?;
        let mut parts = parent.split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex =
            |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if version != "00" || parts.next().is_some() || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return None;
        }
        let trace = TraceId::from_hex(trace).ok()?;
        let span = SpanId::from_hex(span).ok()?;
        let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()? & TraceFlags::SAMPLED.to_u8());
        let state = d.get_str("tracestate").ok().and_then(|s| TraceState::from_str(s).ok()).unwrap_or_default();
        let sc = SpanContext::new(trace, span, flags, true, state);
        sc.is_valid().then_some(sc)
    }

    pub(super) fn continue_trace(span: &Span, stored: Option<&Document>, claim: &ClaimTrace) {
        if let Some(parent) = stored.and_then(parse) {
            // Fails only without the layer (nothing to continue then).
            let _ = span.set_parent(Context::new().with_remote_span_context(parent));
        }
        if let Some(c) = &claim.span {
            span.add_link(c.clone());
        }
    }

    /// A `mongoagent.claim` span from the global tracer provider, from
    /// `sent` to now, for a claim that got tasks.
    pub(super) fn claim_span(
        queue: &str,
        agent: &str,
        tasks: usize,
        sent: tokio::time::Instant,
    ) -> Option<SpanContext> {
        if tasks == 0 {
            return None;
        }
        let tracer = opentelemetry::global::tracer_provider().tracer("mongoagent");
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
            .start(&tracer);
        let sc = opentelemetry::trace::Span::span_context(&span).clone();
        opentelemetry::trace::Span::end(&mut span);
        sc.is_valid().then_some(sc)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_traceparent_is_read_back_and_foreign_ones_are_ignored() {
            let d =
                doc! { "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "k=v" };
            let sc = parse(&d).unwrap();
            assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
            assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
            assert!(sc.is_sampled() && sc.is_remote());
            assert_eq!(sc.trace_state().header(), "k=v");
            for bad in [
                doc! {},
                doc! { "traceparent": 7 },
                doc! { "traceparent": "" },
                doc! { "traceparent": "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" },
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
}
