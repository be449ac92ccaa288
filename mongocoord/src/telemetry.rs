//! What the process reports of itself: its log on stderr, and, when the
//! standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set, its traces over OTLP (HTTP/protobuf, the `otel` feature, on by
//! default): a task's run in `mongocoord agent` continues the trace of the
//! process that enqueued it, and the command it runs gets `TRACEPARENT`
//! (`runners.rs`). `OTEL_SDK_DISABLED=true` turns the export off; the other
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
    /// Sends the spans still buffered, and stops the exporter.
    pub(crate) fn shutdown(self) {
        #[cfg(feature = "otel")]
        if let Some(p) = self.provider {
            if let Err(e) = p.shutdown() {
                eprintln!("mongocoord: sending the last traces failed: {e}");
            }
        }
    }
}

/// The W3C `traceparent` of the current span, if it is in a trace.
pub(crate) fn traceparent() -> Option<String> {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let cx = tracing::Span::current().context();
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8()))
    }
    #[cfg(not(feature = "otel"))]
    None
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
