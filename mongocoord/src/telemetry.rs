//! What the process reports of itself: its log on stderr, and, when the
//! standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set, its traces over OTLP (HTTP/protobuf, the `otel` feature, on by
//! default): a task's run in `mongocoord agent` continues the trace of the
//! process that enqueued it, and the command it runs gets `TRACEPARENT`
//! (and `TRACESTATE`; `runners.rs`), and a `mongocoord` run with
//! `TRACEPARENT` set continues that trace. `OTEL_SDK_DISABLED=true` and
//! `OTEL_TRACES_EXPORTER=none` turn the export off; the other
//! standard variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, …) are read by the exporter.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::error::CliError;

/// The trace exporter, if one was started: flushed by [`Telemetry::shutdown`].
#[must_use = "shut it down at exit, or the last spans are lost"]
pub(crate) struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

/// Starts the log (at `filter`, or `RUST_LOG`) and, when asked for by the
/// environment and `traces` is true, the trace export. A malformed exporter
/// setting is a usage error (status 2).
pub(crate) fn init(filter: &str, traces: bool) -> Result<Telemetry, CliError> {
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colour only for a terminal: a log file or a pipe gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| filter.into()));
    #[cfg(feature = "otel")]
    {
        let provider = if traces { otel::provider()? } else { None };
        let traced = provider.as_ref().map(|p| {
            use opentelemetry::trace::TracerProvider as _;
            // Claim spans are made from the global provider.
            opentelemetry::global::set_tracer_provider(p.clone());
            tracing_opentelemetry::layer()
                .with_tracer(p.tracer("mongocoord"))
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
        });
        let _ = tracing_subscriber::registry().with(log).with(traced).try_init();
        Ok(Telemetry { provider })
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = traces;
        let _ = tracing_subscriber::registry().with(log).try_init();
        Ok(Telemetry {})
    }
}

impl Telemetry {
    /// Sends the spans still buffered, and stops the exporter: within 1 s
    /// unless `OTEL_EXPORTER_OTLP_TIMEOUT` (or its traces variant) says how
    /// long an export may take, so that a hung collector does not hold up
    /// every exit of a script's `mongocoord` calls by the SDK's 5 s.
    pub(crate) fn shutdown(self) {
        #[cfg(feature = "otel")]
        if let Some(p) = self.provider {
            let told = ["OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"]
                .iter()
                .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
            let done = if told { p.shutdown() } else { p.shutdown_with_timeout(std::time::Duration::from_secs(1)) };
            if let Err(e) = done {
                eprintln!("mongocoord: sending the last traces failed: {e}");
            }
        }
    }
}

/// What a task's command gets to continue the run's trace: `TRACEPARENT`
/// (and `TRACESTATE`) of the run's span if it is in a trace, else of the
/// context the task carries (an agent that exports nothing still passes its
/// producer's trace on). A malformed stored context is passed on as none.
pub(crate) fn trace_env(task: &mongoagent::Task) -> Vec<(&'static str, String)> {
    #[cfg(feature = "otel")]
    {
        use mongoagent::TraceContext;
        let cx = TraceContext::of_span(&tracing::Span::current()).or_else(|| TraceContext::of_task(task));
        cx.map(|cx| {
            let parent = ("TRACEPARENT", cx.traceparent());
            std::iter::once(parent).chain(cx.tracestate().map(|s| ("TRACESTATE", s))).collect()
        })
        .unwrap_or_default()
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = task;
        Vec::new()
    }
}

/// The trace a command is handed in `TRACEPARENT` (and `TRACESTATE`): a
/// task's command that calls `mongocoord` again. None if unset or malformed.
#[cfg(feature = "otel")]
fn handed() -> Option<mongoagent::TraceContext> {
    let parent = std::env::var("TRACEPARENT").ok()?;
    mongoagent::TraceContext::from_headers(&parent, std::env::var("TRACESTATE").ok().as_deref())
}

/// `command`, the whole command, in the trace it is handed ([`handed`]):
/// with the trace export on, in a span that is a child of that trace; else
/// what it enqueues still stores that trace. Handed none, it runs in no
/// span: a runner's task runs are each the root of their own trace, or
/// continue their task's.
pub(crate) async fn in_handed_trace<F: std::future::Future>(command: F) -> F::Output {
    let command = tracing::Instrument::instrument(command, command_span());
    #[cfg(feature = "otel")]
    if let Some(cx) = handed() {
        return cx.scope(command).await;
    }
    command.await
}

fn command_span() -> tracing::Span {
    #[cfg(feature = "otel")]
    if let Some(cx) = handed() {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let span = tracing::info_span!("mongocoord");
        // Fails only without the layer: nothing to continue then.
        let _ = span.set_parent(cx.to_parent());
        return span;
    }
    tracing::Span::none()
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use opentelemetry_sdk::Resource;

    use crate::error::CliError;

    /// The provider exporting over OTLP/HTTP, if the environment asks for it.
    pub(super) fn provider() -> Result<Option<SdkTracerProvider>, CliError> {
        let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
        let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
        let exporter = std::env::var("OTEL_TRACES_EXPORTER").unwrap_or_default();
        match exporter.trim() {
            "" | "otlp" => {}
            "none" => return Ok(None),
            other => {
                return Err(CliError::invalid(format!(
                    "OTEL_TRACES_EXPORTER={other:?}: only otlp and none are supported"
                )))
            }
        }
        if disabled || !(set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
            return Ok(None);
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().build().map_err(CliError::Telemetry)?;
        let resource = if set("OTEL_SERVICE_NAME") {
            Resource::builder().build()
        } else {
            Resource::builder().with_service_name("mongocoord").build()
        };
        Ok(Some(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build()))
    }
}
