//! Observability: logs, traces and metrics.
//!
//! * **Logs** go through `tracing`: human-readable by default, JSON with
//!   `KJOB_LOG_FORMAT=json`, filtered by `RUST_LOG`. Every job log line
//!   carries the job id, job type, attempt, `partition:offset` and duration;
//!   payloads are never logged.
//! * **Traces**, after the OpenTelemetry semantic conventions for
//!   messaging: a producer span `send <topic>` per enqueue and a consumer
//!   span `process <main topic>` per attempt (`telemetry/spans.rs` says
//!   which attributes, and how an attempt relates to the others: the first
//!   continues its enqueue's trace; a retried or delayed one starts its own,
//!   linked to the attempt that forwarded it and to the enqueue). The
//!   context travels in the record headers on enqueue and on every retry,
//!   delay and DLQ hop, through the propagators `OTEL_PROPAGATORS` names
//!   (`telemetry/propagation.rs`: W3C trace context and baggage by default,
//!   B3 with the `b3` feature). Export is OTLP over gRPC or HTTP/protobuf
//!   (`telemetry/otlp.rs`), configured by the standard `OTEL_*` variables
//!   and **off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`)
//!   is set**; off, no span is created (one atomic load per attempt). Job
//!   spans use the OpenTelemetry API directly; `tracing` spans of any
//!   target (a handler crate's own) are bridged and nest under the
//!   attempt's span, filtered by `RUST_LOG` and `KJOB_TRACES_FILTER`. The
//!   exporter is behind the `otlp` cargo feature (on by default).
//! * **Metrics** (`telemetry/metrics.rs`; the names are in the book's
//!   observability chapter) are recorded into a [`MetricsExporter`] and
//!   served with `/healthz` and `/readyz` by [`http`] when a worker (or an
//!   outbox relay) is given an address. Workers and relays of one process
//!   can share one exporter, and so one endpoint.

pub(crate) mod gauges;
pub mod http;
pub(crate) mod metrics;
pub(crate) mod otlp;
pub(crate) mod propagation;
pub(crate) mod spans;

pub use metrics::{MetricsExporter, DURATION_BUCKETS};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::error::{Error, Result};
use crate::headers::JobHeaders;

/// Writes the OpenTelemetry context `cx` (its span and its baggage) into
/// the headers through the propagators `OTEL_PROPAGATORS` names (W3C trace
/// context and baggage by default). Headers those propagators own are
/// cleared first; a context without a span writes no trace header.
pub fn inject(cx: &opentelemetry::Context, headers: &mut JobHeaders) {
    propagation::inject_with(propagation::configured(), cx, headers);
}

/// Reads the trace context and baggage from the headers through the
/// propagators `OTEL_PROPAGATORS` names (an empty context if absent).
pub fn extract(headers: &JobHeaders) -> opentelemetry::Context {
    propagation::extract_with(propagation::configured(), headers)
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

/// The variable that chooses which `tracing` spans are exported (an
/// `EnvFilter`, like `RUST_LOG`).
const TRACES_FILTER: &str = "KJOB_TRACES_FILTER";

/// What is exported without [`TRACES_FILTER`]: every target at `info`,
/// except the crates that carry the export itself. Their spans would
/// describe the exporter's own work, and exporting them makes more of it
/// (each export's HTTP/2 spans exported by the next export, without end).
const TRACES_FILTER_DEFAULT: &str = "info,h2=off,hyper=off,hyper_util=off,tonic=off,tower=off,\
     reqwest=off,opentelemetry=off,opentelemetry_sdk=off,opentelemetry_otlp=off,opentelemetry_http=off";

/// Installs the global `tracing` subscriber: logs (human, or JSON with
/// `KJOB_LOG_FORMAT=json`; `RUST_LOG` filters, default `info`) and, when the
/// `OTEL_*` variables ask for it, the OTLP trace exporter (gRPC or
/// HTTP/protobuf, see `OTEL_EXPORTER_OTLP_PROTOCOL` in the book). Call once
/// at the start of `main` (inside the Tokio runtime: the gRPC channel runs
/// on it) and keep the guard until the end.
///
/// Without the `otlp` cargo feature (on by default) no exporter is built:
/// if the `OTEL_*` variables ask for one, a warning says so and logs work
/// as usual, because an environment variable should not stop a binary
/// whose authors chose to leave tracing out.
pub fn init() -> Result<TelemetryGuard> {
    #[cfg(feature = "otlp")]
    let provider = otlp::tracer_provider(&otlp::process_env)?;
    #[cfg(not(feature = "otlp"))]
    let provider = None;
    let guard = install(provider)?;
    #[cfg(not(feature = "otlp"))]
    // Even a value `init` would refuse with the feature only warns here.
    if !matches!(
        otlp::target(otlp::Signal::Traces, &otlp::process_env),
        Ok(None)
    ) {
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

fn install(provider: Option<SdkTracerProvider>) -> Result<TelemetryGuard> {
    // `RUST_LOG` filters the whole stack, not the log layer alone: a
    // per-layer filter keeps a thread-local verdict between `enabled` and
    // the event, and a `log` record that some library only asks about
    // (`log_enabled!`, or bridged and then refused) leaves a stale verdict
    // that makes the log layer drop the thread's next event
    // (tokio-rs/tracing#2519; the worker's "worker started" line was lost
    // under `RUST_LOG=kjob=info`).
    let (filter, logs) = log_layers();
    // The bridge exports `tracing` spans of any target (a handler crate's
    // own included) that pass both `RUST_LOG` and this filter. A per-layer
    // filter, so the caveat above applies to it, but only to the bridge:
    // at worst one event is missing from a span, never a log line.
    let traces_filter = match provider {
        Some(_) => Some(match otlp::process_env(TRACES_FILTER) {
            Some(directives) => EnvFilter::try_new(&directives).map_err(|e| Error::Telemetry {
                what: "trace filter",
                reason: format!("{TRACES_FILTER}={directives}: {e}"),
            })?,
            None => EnvFilter::new(TRACES_FILTER_DEFAULT),
        }),
        None => None,
    };
    let propagators = propagation::from_env();
    let otel = provider.as_ref().zip(traces_filter).map(|(p, f)| {
        opentelemetry::global::set_text_map_propagator(propagators.build());
        opentelemetry::global::set_tracer_provider(p.clone());
        spans::enable();
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("kjob"))
            .with_filter(f)
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
    // Now that the warnings can be seen; and fixes kjob's propagator.
    propagators.warn();
    let _ = propagation::configured();
    Ok(TelemetryGuard { provider })
}

/// The log half of [`init`]: `RUST_LOG` (default `info`) and the format
/// `KJOB_LOG_FORMAT` chooses, written to stdout.
fn log_layers<S>() -> (EnvFilter, Box<dyn Layer<S> + Send + Sync>)
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("KJOB_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let logs = if json {
        tracing_subscriber::fmt::layer().json().boxed()
    } else {
        tracing_subscriber::fmt::layer().boxed()
    };
    (filter, logs)
}

/// Installs [`init`]'s logs (no trace export) when the program has not
/// installed a `tracing` subscriber of its own, so that a worker or a
/// relay started without any setup still says what it does: a silent
/// worker is the first thing a newcomer cannot debug. Called by
/// `Worker::run` and the outbox relay before they connect. A program
/// keeps control by installing any subscriber first (`telemetry::init`,
/// its own, or `tracing::subscriber::NoSubscriber` for none); `RUST_LOG`
/// filters the default as it filters `init`'s.
pub(crate) fn default_logs() {
    if tracing::dispatcher::has_been_set() {
        return;
    }
    let (filter, logs) = log_layers();
    // Another thread may have won the race; its subscriber then stands.
    if tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .try_init()
        .is_ok()
    {
        tracing::debug!("kjob installed its default logs (stdout; RUST_LOG filters, KJOB_LOG_FORMAT=json for JSON)");
    }
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
