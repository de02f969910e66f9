//! Observability: logs, traces and metrics.
//!
//! * **Logs** go through `tracing`: human-readable by default, JSON with
//!   `KJOB_LOG_FORMAT=json`, filtered by `RUST_LOG`. Every job log line
//!   carries the job id, job type, attempt, `partition:offset` and duration;
//!   payloads are never logged.
//! * **Traces**: a span per enqueue (`kjob.enqueue`, kind producer) and per
//!   attempt (`kjob.handle`, kind consumer) with OpenTelemetry messaging
//!   attributes. W3C `traceparent`/`tracestate` travel in the record headers
//!   on enqueue and on every retry and DLQ hop, so one trace shows
//!   enqueue → handle → retry → handle. Export is OTLP/gRPC, configured by
//!   the standard `OTEL_*` variables and **off unless
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set**; off,
//!   no span is created (one atomic load per attempt). Job spans use the
//!   OpenTelemetry API directly (`telemetry/spans.rs`); `tracing` spans your handlers
//!   create are bridged and nest under the job's span.
//!   The exporter is behind the `otlp` cargo feature (on by default).
//! * **Metrics** (`telemetry/metrics.rs`; the names are in the book's
//!   observability chapter) are recorded into a [`MetricsExporter`] and
//!   served with `/healthz` and `/readyz` by [`http`] when a worker (or an
//!   outbox relay) is given an address. Workers and relays of one process
//!   can share one exporter, and so one endpoint.

pub mod http;
pub(crate) mod metrics;
pub(crate) mod spans;

pub use metrics::{MetricsExporter, DURATION_BUCKETS};

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
#[cfg(feature = "otlp")]
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::error::{Error, Result};
use crate::headers::JobHeaders;

/// Writes the OpenTelemetry context `cx` into the headers as W3C trace
/// context. Writes nothing when `cx` carries no sampled span (tracing off).
pub fn inject(cx: &opentelemetry::Context, headers: &mut JobHeaders) {
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    if let Some(tp) = carrier.remove("traceparent") {
        headers.traceparent = Some(tp);
        headers.tracestate = carrier.remove("tracestate").filter(|s| !s.is_empty());
    }
}

/// Reads the W3C trace context from the headers (empty if absent).
pub fn extract(headers: &JobHeaders) -> opentelemetry::Context {
    let mut carrier: HashMap<String, String> = HashMap::new();
    if let Some(tp) = &headers.traceparent {
        carrier.insert("traceparent".into(), tp.clone());
    }
    if let Some(ts) = &headers.tracestate {
        carrier.insert("tracestate".into(), ts.clone());
    }
    TraceContextPropagator::new().extract(&carrier)
}

/// Keeps the trace exporter alive; flushes pending spans when dropped.
#[must_use = "dropping the guard shuts the trace exporter down"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are being exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown() {
                eprintln!("kjob: flushing traces failed: {e}");
            }
        }
    }
}

fn otlp_configured() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.eq_ignore_ascii_case("none"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// Installs the global `tracing` subscriber: logs (human, or JSON with
/// `KJOB_LOG_FORMAT=json`; `RUST_LOG` filters, default `info`) and, when the
/// `OTEL_*` variables ask for it, the OTLP trace exporter. Call once at the
/// start of `main` and keep the guard until the end.
///
/// Without the `otlp` cargo feature (on by default) no exporter is built:
/// if the `OTEL_*` variables ask for one, a warning says so and logs work
/// as usual, because an environment variable should not stop a binary
/// whose authors chose to leave tracing out.
pub fn init() -> Result<TelemetryGuard> {
    #[cfg(feature = "otlp")]
    let provider = if otlp_configured() {
        Some(otlp_provider()?)
    } else {
        None
    };
    #[cfg(not(feature = "otlp"))]
    let provider = None;
    let guard = install(provider)?;
    #[cfg(not(feature = "otlp"))]
    if otlp_configured() {
        tracing::warn!(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but kjob was built without its `otlp` feature; traces are not exported"
        );
    }
    Ok(guard)
}

/// [`init`] with a tracer provider of your own (a custom exporter or
/// sampler, or none at all to measure instrumentation overhead).
pub fn init_with_provider(provider: SdkTracerProvider) -> Result<TelemetryGuard> {
    install(Some(provider))
}

#[cfg(feature = "otlp")]
fn otlp_provider() -> Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|e| Error::Telemetry {
            what: "OTLP trace exporter",
            reason: e.to_string(),
        })?;
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "kjob".into());
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build())
}

fn install(provider: Option<SdkTracerProvider>) -> Result<TelemetryGuard> {
    // `RUST_LOG` filters the whole stack, not the log layer alone: a
    // per-layer filter keeps a thread-local verdict between `enabled` and
    // the event, and a `log` record that some library only asks about
    // (`log_enabled!`, or bridged and then refused) leaves a stale verdict
    // that makes the log layer drop the thread's next event
    // (tokio-rs/tracing#2519; the worker's "worker started" line was lost
    // under `RUST_LOG=kjob=info`).
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("KJOB_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let logs = if json {
        tracing_subscriber::fmt::layer().json().boxed()
    } else {
        tracing_subscriber::fmt::layer().boxed()
    };
    let otel = provider.as_ref().map(|p| {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        opentelemetry::global::set_tracer_provider(p.clone());
        spans::enable();
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("kjob"))
            .with_filter(EnvFilter::new("kjob=info"))
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .with(otel)
        .try_init()
        .map_err(|e| Error::Telemetry {
            what: "tracing subscriber",
            reason: format!("one is already installed (call kjob::telemetry::init once): {e}"),
        })?;
    Ok(TelemetryGuard { provider })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_context_round_trips_through_headers() {
        let mut h = JobHeaders {
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            ..Default::default()
        };
        let cx = extract(&h);
        h.traceparent = None;
        inject(&cx, &mut h);
        assert_eq!(
            h.traceparent.as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        let mut empty = JobHeaders::default();
        inject(&opentelemetry::Context::new(), &mut empty);
        assert_eq!(empty.traceparent, None, "no span, no header");
    }
}
