//! The relay's metrics, in the same shape as the worker's
//! ([`crate::telemetry::metrics`]): OpenTelemetry instruments exported in
//! Prometheus format.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `kjob_outbox_lag_seconds` | gauge | `table` | age of the oldest unsent row: alert on this |
//! | `kjob_outbox_unsent` | gauge | `table` | rows waiting (counted up to 100 000) |
//! | `kjob_outbox_published_total` | counter | `table` | rows acknowledged and marked; `rate()` is rows/s |
//! | `kjob_outbox_publish_errors_total` | counter | `table`, `reason` | `delivery` (a row the broker refused), `stalled` (10 s without an ack), `database`, `encode` (a JSON job that does not fit its contract, dead-lettered) |
//! | `kjob_outbox_buckets_held` | gauge | `table` | key buckets this relay publishes |
//! | `kjob_outbox_relays` | gauge | `table` | relays connected to the table |
//!
//! Lag and unsent are read from the table, so every relay reports the
//! table-wide value. The Prometheus exporter and `/metrics` endpoint need
//! the `metrics-http` feature (on by default), as the worker's do.

use std::sync::{Arc, Mutex, PoisonError};

#[cfg(feature = "metrics-http")]
use axum::{
    extract::State,
    http::{header, StatusCode},
    response::IntoResponse,
    routing::get,
    Router,
};
#[cfg(feature = "metrics-http")]
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::metrics::{Counter, Meter};
use opentelemetry::KeyValue;
#[cfg(feature = "metrics-http")]
use opentelemetry_sdk::metrics::SdkMeterProvider;
#[cfg(feature = "metrics-http")]
use prometheus::{Encoder, Registry, TextEncoder};
#[cfg(feature = "metrics-http")]
use tokio_util::sync::CancellationToken;

use super::OutboxError;

/// What keeps a Prometheus export alive (nothing without `metrics-http`).
#[cfg(feature = "metrics-http")]
type Exporter = Arc<(SdkMeterProvider, Registry)>;
#[cfg(not(feature = "metrics-http"))]
type Exporter = std::convert::Infallible;

/// Gauge values the relay refreshes; read when `/metrics` is scraped.
#[derive(Clone, Debug, Default)]
pub struct OutboxSnapshot {
    /// Age of the oldest unsent row, seconds.
    pub lag_seconds: f64,
    /// Unsent rows (capped).
    pub unsent: i64,
    /// Buckets held by this relay.
    pub buckets_held: i64,
    /// Relays holding the presence lock.
    pub relays: i64,
}

/// The relay's instruments.
#[derive(Clone)]
pub struct OutboxMetrics {
    table: KeyValue,
    published: Counter<u64>,
    errors: Counter<u64>,
    /// Refreshed by the relay.
    pub snapshot: Arc<Mutex<OutboxSnapshot>>,
    exporter: Option<Exporter>,
}

impl std::fmt::Debug for OutboxMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxMetrics")
            .field("exported", &self.exporter.is_some())
            .finish()
    }
}

impl OutboxMetrics {
    /// No-op instruments; the snapshot is still kept (for [`super::Relay`]
    /// callers and tests).
    pub fn disabled(table: &str) -> Self {
        let meter = opentelemetry::global::meter_provider().meter("kjob-outbox-disabled");
        Self::with_meter(&meter, table, None)
    }

    /// Instruments exported to a fresh Prometheus registry.
    #[cfg(feature = "metrics-http")]
    pub fn prometheus(table: &str) -> Result<Self, OutboxError> {
        let registry = Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .without_units()
            .without_target_info()
            .build()
            .map_err(|e| OutboxError::Config(format!("building the Prometheus exporter: {e}")))?;
        let provider = SdkMeterProvider::builder().with_reader(exporter).build();
        let meter = provider.meter("kjob-outbox");
        Ok(Self::with_meter(
            &meter,
            table,
            Some(Arc::new((provider, registry))),
        ))
    }

    /// Without the `metrics-http` feature there is no exporter: an error
    /// that says which feature to enable.
    #[cfg(not(feature = "metrics-http"))]
    pub fn prometheus(_table: &str) -> Result<Self, OutboxError> {
        Err(OutboxError::Kjob(crate::Error::FeatureDisabled {
            feature: "metrics-http",
            what: "an outbox relay metrics endpoint",
        }))
    }

    fn with_meter(meter: &Meter, table: &str, exporter: Option<Exporter>) -> Self {
        let snapshot: Arc<Mutex<OutboxSnapshot>> = Arc::default();
        let label = KeyValue::new("table", table.to_string());
        let gauge = |name: &'static str, help: &'static str, read: fn(&OutboxSnapshot) -> f64| {
            let snap = snapshot.clone();
            let label = label.clone();
            meter
                .f64_observable_gauge(name)
                .with_description(help)
                .with_callback(move |obs| {
                    let s = snap.lock().unwrap_or_else(PoisonError::into_inner);
                    obs.observe(read(&s), std::slice::from_ref(&label));
                })
                .build();
        };
        gauge(
            "kjob_outbox_lag_seconds",
            "Age of the oldest outbox row not yet published",
            |s| s.lag_seconds,
        );
        gauge(
            "kjob_outbox_unsent",
            "Outbox rows not yet published (counted up to 100000)",
            |s| s.unsent as f64,
        );
        gauge(
            "kjob_outbox_buckets_held",
            "Key buckets this relay publishes",
            |s| s.buckets_held as f64,
        );
        gauge(
            "kjob_outbox_relays",
            "Relays connected to the outbox table",
            |s| s.relays as f64,
        );
        Self {
            published: meter
                .u64_counter("kjob_outbox_published")
                .with_description("Outbox rows acknowledged by the broker and marked sent")
                .build(),
            errors: meter
                .u64_counter("kjob_outbox_publish_errors")
                .with_description("Outbox publish failures by reason")
                .build(),
            table: label,
            snapshot,
            exporter,
        }
    }

    /// `n` rows published.
    pub fn published(&self, n: u64) {
        self.published.add(n, std::slice::from_ref(&self.table));
    }

    /// `n` errors of `reason` (`delivery`, `stalled`, `database`, `encode`).
    pub fn error(&self, reason: &'static str, n: u64) {
        self.errors
            .add(n, &[self.table.clone(), KeyValue::new("reason", reason)]);
    }

    /// Updates the gauges' values.
    pub fn update(&self, f: impl FnOnce(&mut OutboxSnapshot)) {
        f(&mut self.snapshot.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// The current gauge values.
    pub fn read(&self) -> OutboxSnapshot {
        self.snapshot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The Prometheus text exposition, or `None` when disabled.
    #[cfg(not(feature = "metrics-http"))]
    pub fn render(&self) -> Option<String> {
        None
    }

    /// The Prometheus text exposition, or `None` when disabled.
    #[cfg(feature = "metrics-http")]
    pub fn render(&self) -> Option<String> {
        let (_, registry) = self.exporter.as_deref()?;
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .ok()?;
        String::from_utf8(out).ok()
    }
}

#[cfg(feature = "metrics-http")]
async fn metrics_page(State(m): State<OutboxMetrics>) -> impl IntoResponse {
    match m.render() {
        Some(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            text,
        ),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain")],
            "metrics are disabled\n".to_string(),
        ),
    }
}

/// Serves `/metrics` and `/healthz` on `addr` until `stop` is cancelled.
/// Binds now, so a port conflict fails the relay's start.
#[cfg(feature = "metrics-http")]
pub(crate) async fn serve(
    addr: std::net::SocketAddr,
    metrics: OutboxMetrics,
    stop: CancellationToken,
) -> Result<std::net::SocketAddr, OutboxError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| OutboxError::Config(format!("binding the metrics endpoint on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| OutboxError::Config(format!("metrics endpoint address: {e}")))?;
    let app = Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(metrics);
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "outbox metrics endpoint stopped");
        }
    });
    Ok(bound)
}
