//! Logs, and OpenTelemetry traces when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
//!
//! Every binary of the example logs to stderr (filtered by `RUST_LOG`). With
//! `OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318` it also exports its
//! spans over OTLP/HTTP (protobuf; the exporter appends `/v1/traces`, and
//! honours the other `OTEL_EXPORTER_OTLP_*` variables), under the service
//! name it was started as. The framework's spans then form one trace per
//! order across both services: `outbox.unit_of_work` (the orders handler),
//! `outbox.publish` (the relay), `outbox.handle` (the payments consumer), and
//! so on back to the orders service (see `docs/relay.md`, "Traces").

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry};

/// The variable that turns span export on.
pub const OTLP_ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The installed logging and tracing; flushes the spans still buffered when
/// dropped (keep it alive for the whole of `main`).
#[derive(Debug)]
#[must_use = "dropping the telemetry guard flushes and stops span export"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Installs the global subscriber: logs filtered by `RUST_LOG` or else by
    /// `default_filter` (librdkafka's own lines off unless asked for), and,
    /// when [`OTLP_ENDPOINT_VAR`] is set and not empty, an OpenTelemetry
    /// layer exporting as `service`. An exporter that cannot be built is
    /// reported on stderr and the service runs without it.
    pub fn init(service: &'static str, default_filter: &str) -> Self {
        let filter = EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| format!("{default_filter},librdkafka=off,rdkafka=off").into());
        let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
        let provider = match std::env::var(OTLP_ENDPOINT_VAR) {
            Ok(endpoint) if !endpoint.trim().is_empty() => match otlp_provider(service) {
                Ok(provider) => Some(provider),
                Err(error) => {
                    eprintln!(
                        "{OTLP_ENDPOINT_VAR}={endpoint}: cannot build the OTLP exporter ({error}); running without span export"
                    );
                    None
                }
            },
            _ => None,
        };
        // Spans are exported at `info` whatever the log filter says: the
        // framework's spans of traced events are at `info`, and a quiet log
        // (the demo's `warn`) must not cut the traces.
        let traces = provider
            .as_ref()
            .map(|provider| layer(provider, service).with_filter(LevelFilter::INFO));
        Registry::default()
            .with(logs.with_filter(filter))
            .with(traces)
            .init();
        Self { provider }
    }

    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            eprintln!("flushing the spans at exit: {error}");
        }
    }
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of
/// `provider` (a tracer named after `service`).
pub fn layer<S>(
    provider: &SdkTracerProvider,
    service: &'static str,
) -> tracing_opentelemetry::OpenTelemetryLayer<S, SdkTracer>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer(service))
}

/// A provider exporting over OTLP/HTTP in batches, from the standard
/// `OTEL_EXPORTER_OTLP_*` variables.
fn otlp_provider(service: &'static str) -> Result<SdkTracerProvider, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|error| error.to_string())?;
    Ok(SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name(service).build())
        .with_batch_exporter(exporter)
        .build())
}
