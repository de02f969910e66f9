//! OTLP export of traces and metrics, configured by the standard `OTEL_*`
//! variables.
//!
//! | variable | effect |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT` | where to; **unset, nothing is exported** |
//! | `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL` | `grpc` (kjob's default, port 4317) or `http/protobuf` (port 4318) |
//! | `OTEL_TRACES_EXPORTER` | `none` turns trace export off |
//! | `OTEL_METRICS_EXPORTER` | `otlp` exports the worker's metrics over OTLP too, beside Prometheus's `/metrics` |
//! | `OTEL_SDK_DISABLED` | `true` turns both off |
//! | `OTEL_SERVICE_NAME` | the `service.name` resource attribute (kjob's default: `kjob`) |
//!
//! The signal's own variable wins over the general one. A signal endpoint
//! is used as it is; with the general one, HTTP appends the signal's path
//! (`/v1/traces`, `/v1/metrics`) and gRPC does not, as the OTLP exporter
//! specification says. The other `OTEL_EXPORTER_OTLP_*` settings
//! (headers, timeout, compression) and `OTEL_METRIC_EXPORT_INTERVAL` are
//! read by the OpenTelemetry exporter itself.
//!
//! kjob defaults to gRPC where the specification defaults to
//! `http/protobuf`, because gRPC was kjob's only transport before: an
//! existing `OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4317` keeps
//! working. `http/json` is refused at start with an error naming it, as is
//! any other value, rather than exporting to a collector that cannot read
//! what it is sent.
//!
//! Exporting needs the `otlp` cargo feature (on by default); without it
//! the functions here say that nothing is built, and a warning names the
//! feature when the variables ask for export.

use opentelemetry_sdk::metrics::MeterProviderBuilder;
#[cfg(feature = "otlp")]
use opentelemetry_sdk::Resource;

use crate::error::{Error, Result};

/// The variables, read through a function so that tests need not change
/// the process's environment.
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process's environment; an empty value counts as unset.
pub(crate) fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

/// A kind of telemetry exported over OTLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// Spans.
    Traces,
    /// The worker's metrics.
    Metrics,
}

impl Signal {
    fn var(self, suffix: &str) -> String {
        let signal = match self {
            Signal::Traces => "TRACES",
            Signal::Metrics => "METRICS",
        };
        format!("OTEL_EXPORTER_OTLP_{signal}_{suffix}")
    }

    fn path(self) -> &'static str {
        match self {
            Signal::Traces => "/v1/traces",
            Signal::Metrics => "/v1/metrics",
        }
    }

    fn exporter_var(self) -> &'static str {
        match self {
            Signal::Traces => "OTEL_TRACES_EXPORTER",
            Signal::Metrics => "OTEL_METRICS_EXPORTER",
        }
    }
}

/// An OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP over HTTP, protobuf bodies.
    HttpProtobuf,
}

/// Where and how a signal is exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) protocol: Protocol,
    /// The full URL: for HTTP, with the signal's path.
    pub(crate) endpoint: String,
}

/// Whether `signal` is to be exported, and where. `Ok(None)`: it is not
/// (no endpoint, turned off, or, for metrics, not asked for with
/// `OTEL_METRICS_EXPORTER=otlp`). An unusable protocol is an error.
pub(crate) fn target(signal: Signal, env: Env<'_>) -> Result<Option<Target>> {
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let exporters = env(signal.exporter_var());
    let named = |want: &str| {
        exporters
            .as_deref()
            .is_some_and(|v| v.split(',').any(|e| e.trim().eq_ignore_ascii_case(want)))
    };
    let asked = match signal {
        // Traces go out whenever an endpoint is set, unless turned off.
        Signal::Traces => !named("none"),
        // Metrics have Prometheus's `/metrics`; OTLP is opt-in.
        Signal::Metrics => named("otlp") && !named("none"),
    };
    if !asked {
        return Ok(None);
    }
    let own = env(&signal.var("ENDPOINT"));
    let general = env("OTEL_EXPORTER_OTLP_ENDPOINT");
    if own.is_none() && general.is_none() {
        if signal == Signal::Metrics {
            tracing::warn!(
                "OTEL_METRICS_EXPORTER=otlp, but neither OTEL_EXPORTER_OTLP_METRICS_ENDPOINT nor OTEL_EXPORTER_OTLP_ENDPOINT is set; metrics are not exported over OTLP"
            );
        }
        return Ok(None);
    }
    let protocol_var = signal.var("PROTOCOL");
    let (var, value) = match env(&protocol_var) {
        Some(v) => (protocol_var.as_str(), v),
        None => match env("OTEL_EXPORTER_OTLP_PROTOCOL") {
            Some(v) => ("OTEL_EXPORTER_OTLP_PROTOCOL", v),
            None => ("", "grpc".to_string()),
        },
    };
    let protocol = match value.trim().to_ascii_lowercase().as_str() {
        "grpc" => Protocol::Grpc,
        "http/protobuf" => Protocol::HttpProtobuf,
        other => {
            let why = if other == "http/json" {
                "kjob exports OTLP as protobuf only"
            } else {
                "not an OTLP protocol"
            };
            return Err(Error::Telemetry {
                what: "OTLP exporter",
                reason: format!("{var}={value}: {why}; use `grpc` or `http/protobuf`"),
            });
        }
    };
    let endpoint = match (own, general, protocol) {
        (Some(own), _, _) => own,
        (None, Some(general), Protocol::Grpc) => general,
        (None, Some(general), Protocol::HttpProtobuf) => {
            format!("{}{}", general.trim_end_matches('/'), signal.path())
        }
        (None, None, _) => unreachable!("checked above"),
    };
    Ok(Some(Target { protocol, endpoint }))
}

/// The resource every exported span and metric names: `service.name` from
/// `OTEL_SERVICE_NAME`, else `kjob`.
#[cfg(feature = "otlp")]
pub(crate) fn resource() -> Resource {
    let service = process_env("OTEL_SERVICE_NAME").unwrap_or_else(|| "kjob".into());
    Resource::builder().with_service_name(service).build()
}

#[cfg(feature = "otlp")]
fn build_error(what: &'static str) -> impl FnOnce(opentelemetry_otlp::ExporterBuildError) -> Error {
    move |e| Error::Telemetry {
        what,
        reason: e.to_string(),
    }
}

/// The span exporter for `target`. Needs a Tokio runtime for gRPC (the
/// channel's task is spawned on it).
#[cfg(feature = "otlp")]
pub(crate) fn span_exporter(target: &Target) -> Result<opentelemetry_otlp::SpanExporter> {
    use opentelemetry_otlp::{SpanExporter, WithExportConfig as _};
    let builder = SpanExporter::builder();
    match target.protocol {
        Protocol::Grpc => builder
            .with_tonic()
            .with_endpoint(target.endpoint.clone())
            .build(),
        Protocol::HttpProtobuf => builder
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(target.endpoint.clone())
            .build(),
    }
    .map_err(build_error("OTLP trace exporter"))
}

/// The tracer provider that exports over OTLP in batches, if the variables
/// ask for trace export.
#[cfg(feature = "otlp")]
pub(crate) fn tracer_provider(
    env: Env<'_>,
) -> Result<Option<opentelemetry_sdk::trace::SdkTracerProvider>> {
    let Some(target) = target(Signal::Traces, env)? else {
        return Ok(None);
    };
    let exporter = span_exporter(&target)?;
    Ok(Some(
        opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource())
            .build(),
    ))
}

/// The OTLP metric reader, as [`metric_reader_from`] builds it.
#[cfg(feature = "otlp")]
pub(crate) type MetricReader =
    opentelemetry_sdk::metrics::PeriodicReader<opentelemetry_otlp::MetricExporter>;

/// A reader that pushes a meter provider's metrics over OTLP every
/// `OTEL_METRIC_EXPORT_INTERVAL` ms (default 60 s), when
/// `OTEL_METRICS_EXPORTER=otlp` and an endpoint is set; `Ok(None)`
/// otherwise. Needs a Tokio runtime for gRPC. [`with_metric_reader`] adds
/// it to a provider, and builds without the `otlp` feature too.
#[cfg(feature = "otlp")]
fn metric_reader_from(env: Env<'_>) -> Result<Option<MetricReader>> {
    use opentelemetry_otlp::{MetricExporter, WithExportConfig as _};
    let Some(target) = target(Signal::Metrics, env)? else {
        return Ok(None);
    };
    let builder = MetricExporter::builder();
    let exporter = match target.protocol {
        Protocol::Grpc => builder
            .with_tonic()
            .with_endpoint(target.endpoint.clone())
            .build(),
        Protocol::HttpProtobuf => builder
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(target.endpoint.clone())
            .build(),
    }
    .map_err(build_error("OTLP metric exporter"))?;
    Ok(Some(
        opentelemetry_sdk::metrics::PeriodicReader::builder(exporter).build(),
    ))
}

/// `builder` with the OTLP metric reader ([`metric_reader_from`]) and the
/// service's resource added when the `OTEL_*` variables ask for OTLP
/// metrics, unchanged otherwise: the worker's Prometheus `/metrics` stays
/// as it is, and the same numbers are also pushed to the collector.
/// Without the `otlp` feature, unchanged, with a warning if the variables
/// ask for OTLP metrics.
// The meter provider it extends is `MetricsExporter::prometheus`'s, which
// exists only with `metrics-http`.
#[cfg_attr(not(feature = "metrics-http"), allow(dead_code))]
pub(crate) fn with_metric_reader(builder: MeterProviderBuilder) -> Result<MeterProviderBuilder> {
    with_metric_reader_from(builder, &process_env)
}

/// Whether the `OTEL_*` variables ask for OTLP metrics (a worker without a
/// Prometheus endpoint then still builds an exporter, to push them).
pub(crate) fn metrics_requested() -> bool {
    matches!(target(Signal::Metrics, &process_env), Ok(Some(_)))
}

/// [`with_metric_reader`] over the variables `env` gives.
#[cfg_attr(not(feature = "metrics-http"), allow(dead_code))]
fn with_metric_reader_from(
    builder: MeterProviderBuilder,
    env: Env<'_>,
) -> Result<MeterProviderBuilder> {
    #[cfg(feature = "otlp")]
    {
        Ok(match metric_reader_from(env)? {
            Some(reader) => builder.with_reader(reader).with_resource(resource()),
            None => builder,
        })
    }
    #[cfg(not(feature = "otlp"))]
    {
        if !matches!(target(Signal::Metrics, env), Ok(None)) {
            tracing::warn!(
                "OTEL_METRICS_EXPORTER=otlp, but kjob was built without its `otlp` feature; metrics are not exported over OTLP"
            );
        }
        Ok(builder)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn at(env: &dyn Fn(&str) -> Option<String>, signal: Signal) -> Option<Target> {
        target(signal, env).expect("a usable configuration")
    }

    #[test]
    fn traces_go_out_when_an_endpoint_is_set_over_grpc_by_default() {
        assert_eq!(at(&env(&[]), Signal::Traces), None);
        let e = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317")]);
        assert_eq!(
            at(&e, Signal::Traces),
            Some(Target {
                protocol: Protocol::Grpc,
                endpoint: "http://c:4317".into()
            })
        );
        let off = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ]);
        assert_eq!(at(&off, Signal::Traces), None);
        let disabled = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ]);
        assert_eq!(at(&disabled, Signal::Traces), None);
    }

    #[test]
    fn http_appends_the_signal_path_to_the_general_endpoint_only() {
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_METRICS_EXPORTER", "otlp"),
        ]);
        assert_eq!(
            at(&e, Signal::Traces).map(|t| t.endpoint),
            Some("http://c:4318/v1/traces".into())
        );
        assert_eq!(
            at(&e, Signal::Metrics).map(|t| t.endpoint),
            Some("http://c:4318/v1/metrics".into())
        );
        let own = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4318/custom"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ]);
        assert_eq!(
            at(&own, Signal::Traces),
            Some(Target {
                protocol: Protocol::HttpProtobuf,
                endpoint: "http://t:4318/custom".into()
            }),
            "the signal's own endpoint and protocol win, as they are"
        );
    }

    #[test]
    fn metrics_are_opt_in_and_an_unusable_protocol_is_an_error() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317");
        assert_eq!(at(&env(&[endpoint]), Signal::Metrics), None);
        assert_eq!(
            at(
                &env(&[endpoint, ("OTEL_METRICS_EXPORTER", "prometheus")]),
                Signal::Metrics
            ),
            None
        );
        assert_eq!(
            at(&env(&[("OTEL_METRICS_EXPORTER", "otlp")]), Signal::Metrics),
            None,
            "no endpoint, no export"
        );
        for bad in ["http/json", "udp"] {
            let e = env(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", bad)]);
            let err = target(Signal::Traces, &e).unwrap_err().to_string();
            assert!(
                err.contains(bad) && err.contains("OTEL_EXPORTER_OTLP_PROTOCOL"),
                "{err}"
            );
        }
    }

    /// The reader is built for the variables that ask for it, over either
    /// transport (the worker's meter provider adds it beside Prometheus).
    #[cfg(feature = "otlp")]
    #[tokio::test]
    async fn a_metric_reader_is_built_when_the_variables_ask_for_one() {
        assert!(metric_reader_from(&env(&[])).unwrap().is_none());
        for protocol in ["grpc", "http/protobuf"] {
            let e = env(&[
                ("OTEL_METRICS_EXPORTER", "otlp"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", protocol),
            ]);
            assert!(metric_reader_from(&e).unwrap().is_some(), "{protocol}");
        }
    }

    /// The reader really pushes, added as the worker adds it: over HTTP/protobuf to `/v1/metrics` of the
    /// general endpoint, received here by a minimal HTTP/1.1 listener.
    #[cfg(feature = "otlp")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_metric_reader_pushes_over_http_protobuf() {
        use opentelemetry::metrics::MeterProvider as _;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        fn position(haystack: &[u8], needle: &[u8]) -> Option<usize> {
            haystack.windows(needle.len()).position(|w| w == needle)
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let server = tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let mut request = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    request.extend_from_slice(&chunk[..n]);
                    let Some(end) = position(&request, b"\r\n\r\n") else {
                        if n == 0 {
                            break;
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if request.len() >= end + 4 + length || n == 0 {
                        break;
                    }
                }
                let _ = sock
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
                let _ = tx.send(request);
            }
        });
        let e = env(&[
            ("OTEL_METRICS_EXPORTER", "otlp"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ]);
        // As the worker's meter provider adds it.
        let builder = opentelemetry_sdk::metrics::SdkMeterProvider::builder();
        let provider = with_metric_reader_from(builder, &e).unwrap().build();
        let jobs = provider
            .meter("kjob")
            .u64_counter("kjob_jobs_total")
            .build();
        jobs.add(1, &[]);
        // The reader exports from its own thread; flushing waits for it.
        tokio::task::spawn_blocking(move || provider.force_flush())
            .await
            .unwrap()
            .expect("flushed to the endpoint");
        let request = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .expect("a request within 10 s")
            .expect("a request");
        server.abort();
        let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
        assert!(text.starts_with("post /v1/metrics "), "{text}");
        assert!(
            text.contains("content-type: application/x-protobuf"),
            "{text}"
        );
        assert!(
            position(&request, b"kjob_jobs_total").is_some(),
            "the counter is in the body"
        );
    }
}
