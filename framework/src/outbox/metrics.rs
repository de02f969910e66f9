//! The relay's metrics: OpenTelemetry instruments recorded into a
//! [`MetricsExporter`], the same kind of exporter the worker's use.
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
//! table-wide value. A relay run by a worker
//! ([`WorkerBuilder::outbox_relay`](crate::WorkerBuilder::outbox_relay))
//! records into the worker's exporter, so the worker's `/metrics` shows
//! both; a relay of its own serves the same endpoint code
//! ([`crate::telemetry::http::serve`]). Both need the `metrics-http`
//! feature (on by default).

use std::sync::{Arc, Mutex, PoisonError};

use opentelemetry::metrics::{Counter, Meter};
use opentelemetry::KeyValue;

use super::OutboxError;
use crate::telemetry::metrics::MetricsExporter;

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
    exporter: MetricsExporter,
}

impl std::fmt::Debug for OutboxMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxMetrics")
            .field("exported", &self.exporter.is_enabled())
            .finish()
    }
}

impl OutboxMetrics {
    /// No-op instruments; the snapshot is still kept (for [`super::Relay`]
    /// callers and tests).
    pub fn disabled(table: &str) -> Self {
        Self::on(&MetricsExporter::disabled(), table)
    }

    /// Instruments exported to a fresh Prometheus registry of their own.
    pub fn prometheus(table: &str) -> Result<Self, OutboxError> {
        Ok(Self::on(&MetricsExporter::prometheus()?, table))
    }

    /// Instruments recorded into `exporter`, which a worker (or another
    /// relay) of the process may share, so one `/metrics` serves them all.
    pub fn on(exporter: &MetricsExporter, table: &str) -> Self {
        let meter = exporter.meter("kjob-outbox");
        Self::with_meter(&meter, table, exporter.clone())
    }

    /// What these instruments record into.
    pub fn exporter(&self) -> &MetricsExporter {
        &self.exporter
    }

    fn with_meter(meter: &Meter, table: &str, exporter: MetricsExporter) -> Self {
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
    pub fn render(&self) -> Option<String> {
        self.exporter.render()
    }
}
