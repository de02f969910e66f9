//! The worker's metrics, as OpenTelemetry instruments exported in Prometheus
//! format (`/metrics`):
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `kjob_jobs_total` | counter | `job`, `outcome` (ok, retried, dead_lettered, panicked, held) |
//! | `kjob_handler_seconds` | histogram | `job` |
//! | `kjob_in_flight` | gauge | `job` |
//! | `kjob_consumer_lag` | gauge | `topic`, `partition` |
//! | `kjob_oldest_pending_seconds` | gauge | `topic` |
//! | `kjob_retry_due_lateness_seconds` | histogram | `topic` |
//! | `kjob_rebalances_total` | counter | |
//! | `kjob_parked` | gauge | | jobs waiting for a downstream without a handler slot |
//! | `kjob_oldest_running_seconds` | gauge | `job`: age of the oldest handler running (0 under 1 s) |
//! | `kjob_priority_waiting` | gauge | `priority` (high, normal, low): jobs ready, waiting for a slot |
//! | `kjob_priority_in_flight` | gauge | `priority`: jobs running |
//! | `kjob_priority_latency_seconds` | histogram | `priority`: record timestamp to the attempt's outcome |
//!
//! Each worker owns its registry, so two workers in one process (tests, a
//! multi-tenant binary) never mix their numbers. A worker without a metrics
//! endpoint uses no-op instruments: recording costs nothing.
//!
//! The Prometheus exporter is behind the `metrics-http` cargo feature (on by
//! default). Without it the instruments still exist, as no-ops, so the
//! worker's code is the same; asking for an exporter is an error that names
//! the feature.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

#[cfg(feature = "metrics-http")]
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::metrics::{Counter, Histogram, Meter, UpDownCounter};
use opentelemetry::KeyValue;
#[cfg(feature = "metrics-http")]
use opentelemetry_sdk::metrics::SdkMeterProvider;
#[cfg(feature = "metrics-http")]
use prometheus::{Encoder, Registry, TextEncoder};

use crate::error::{Error, Result};

/// What keeps a Prometheus export alive: the meter provider and the
/// registry it writes into.
#[cfg(feature = "metrics-http")]
type Exporter = Arc<(SdkMeterProvider, Registry)>;
/// Without `metrics-http` there is nothing to export to.
#[cfg(not(feature = "metrics-http"))]
type Exporter = std::convert::Infallible;

/// Gauges the poll thread refreshes; read when `/metrics` is scraped.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// (topic, partition) -> records not yet committed.
    pub lag: HashMap<(String, i32), i64>,
    /// topic -> age in seconds of the oldest uncommitted record kjob holds.
    pub oldest_pending_seconds: HashMap<String, f64>,
    /// Per priority level (high, normal, low): (running, waiting).
    pub priority: [(usize, usize); crate::worker::Priority::LEVELS],
    /// Jobs parked: waiting for a downstream without a handler slot.
    pub parked: usize,
    /// Per job type: age of the oldest handler running for 1 s or more.
    pub oldest_running_seconds: Vec<(&'static str, f64)>,
}

/// The instruments a worker records into.
#[derive(Clone)]
pub struct Metrics {
    jobs: Counter<u64>,
    handler_seconds: Histogram<f64>,
    in_flight: UpDownCounter<i64>,
    lateness: Histogram<f64>,
    rebalances: Counter<u64>,
    priority_latency: Histogram<f64>,
    /// Refreshed by the poll thread.
    pub snapshot: Arc<Mutex<Snapshot>>,
    exporter: Option<Exporter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("exported", &self.exporter.is_some())
            .finish()
    }
}

impl Metrics {
    /// No-op instruments (no endpoint configured).
    pub fn disabled() -> Self {
        let meter = opentelemetry::global::meter_provider().meter("kjob-disabled");
        Self::with_meter(&meter, Arc::default(), None)
    }

    /// Instruments exported to a fresh Prometheus registry.
    #[cfg(feature = "metrics-http")]
    pub fn prometheus() -> Result<Self> {
        let registry = Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .without_units()
            .without_target_info()
            .build()
            .map_err(|e| Error::Metrics {
                reason: format!("building the Prometheus exporter: {e}"),
            })?;
        let provider = SdkMeterProvider::builder().with_reader(exporter).build();
        let meter = provider.meter("kjob");
        let snapshot: Arc<Mutex<Snapshot>> = Arc::default();
        Ok(Self::with_meter(
            &meter,
            snapshot,
            Some(Arc::new((provider, registry))),
        ))
    }

    /// Without the `metrics-http` feature there is no exporter: an error
    /// that says which feature to enable.
    #[cfg(not(feature = "metrics-http"))]
    pub fn prometheus() -> Result<Self> {
        Err(Error::FeatureDisabled {
            feature: "metrics-http",
            what: "a metrics endpoint",
        })
    }

    fn with_meter(
        meter: &Meter,
        snapshot: Arc<Mutex<Snapshot>>,
        exporter: Option<Exporter>,
    ) -> Self {
        let lag_snapshot = snapshot.clone();
        meter
            .i64_observable_gauge("kjob_consumer_lag")
            .with_description("Records in a partition not yet committed by the group")
            .with_callback(move |obs| {
                let snap = lag_snapshot.lock().unwrap_or_else(PoisonError::into_inner);
                for ((topic, partition), lag) in &snap.lag {
                    obs.observe(
                        *lag,
                        &[
                            KeyValue::new("topic", topic.clone()),
                            KeyValue::new("partition", i64::from(*partition)),
                        ],
                    );
                }
            })
            .build();
        let age_snapshot = snapshot.clone();
        meter
            .f64_observable_gauge("kjob_oldest_pending_seconds")
            .with_description("Age of the oldest record the worker holds but has not committed")
            .with_callback(move |obs| {
                let snap = age_snapshot.lock().unwrap_or_else(PoisonError::into_inner);
                for (topic, age) in &snap.oldest_pending_seconds {
                    obs.observe(*age, &[KeyValue::new("topic", topic.clone())]);
                }
            })
            .build();
        for (name, description, running) in [
            (
                "kjob_priority_in_flight",
                "Jobs running, per priority lane",
                true,
            ),
            (
                "kjob_priority_waiting",
                "Jobs ready and waiting for a slot, per priority lane",
                false,
            ),
        ] {
            let snap = snapshot.clone();
            meter
                .i64_observable_gauge(name)
                .with_description(description)
                .with_callback(move |obs| {
                    let snap = snap.lock().unwrap_or_else(PoisonError::into_inner);
                    for (level, (run, wait)) in snap.priority.iter().enumerate() {
                        let v = if running { *run } else { *wait };
                        let p = crate::worker::Priority::at_level(level);
                        obs.observe(
                            i64::try_from(v).unwrap_or(i64::MAX),
                            &[KeyValue::new("priority", p.as_str())],
                        );
                    }
                })
                .build();
        }
        let running_snapshot = snapshot.clone();
        meter
            .f64_observable_gauge("kjob_oldest_running_seconds")
            .with_description(
                "Age of the oldest handler still running, per job type (0 while all are under 1 s)",
            )
            .with_callback(move |obs| {
                let snap = running_snapshot
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                for (job, age) in &snap.oldest_running_seconds {
                    obs.observe(*age, &[KeyValue::new("job", *job)]);
                }
            })
            .build();
        let parked_snapshot = snapshot.clone();
        meter
            .i64_observable_gauge("kjob_parked")
            .with_description(
                "Jobs waiting for a downstream (registry, breaker, rate limit) without a handler slot",
            )
            .with_callback(move |obs| {
                let snap = parked_snapshot
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                obs.observe(i64::try_from(snap.parked).unwrap_or(i64::MAX), &[]);
            })
            .build();
        meter
            .i64_observable_gauge("kjob_breaker_state")
            .with_description("Circuit breaker state per downstream: 0 closed, 1 half-open, 2 open")
            .with_callback(|obs| {
                for (name, state, _) in crate::layers::breaker::snapshot() {
                    let v = match state {
                        crate::layers::breaker::BreakerState::Closed => 0,
                        crate::layers::breaker::BreakerState::HalfOpen => 1,
                        crate::layers::breaker::BreakerState::Open => 2,
                    };
                    obs.observe(v, &[KeyValue::new("breaker", name)]);
                }
            })
            .build();
        meter
            .i64_observable_gauge("kjob_registry_waiting")
            .with_description(
                "Jobs waiting for the schema registry to serve their writer schema (not failed, not retried)",
            )
            .with_callback(|obs| obs.observe(crate::worker::route::registry_waiting(), &[]))
            .build();
        meter
            .i64_observable_gauge("kjob_breaker_parked")
            .with_description("Jobs waiting for a circuit breaker to close")
            .with_callback(|obs| {
                for (name, _, parked) in crate::layers::breaker::snapshot() {
                    obs.observe(parked, &[KeyValue::new("breaker", name)]);
                }
            })
            .build();
        Self {
            jobs: meter
                .u64_counter("kjob_jobs")
                .with_description("Attempts by job type and outcome")
                .build(),
            handler_seconds: meter
                .f64_histogram("kjob_handler_seconds")
                .with_description("Handler duration per attempt")
                .build(),
            in_flight: meter
                .i64_up_down_counter("kjob_in_flight")
                .with_description("Attempts running now")
                .build(),
            lateness: meter
                .f64_histogram("kjob_retry_due_lateness_seconds")
                .with_description("How long after its due time a retry ran")
                .build(),
            rebalances: meter
                .u64_counter("kjob_rebalances")
                .with_description("Partition assignments and revocations")
                .build(),
            priority_latency: meter
                .f64_histogram("kjob_priority_latency_seconds")
                .with_description("Record timestamp to the attempt's outcome, per priority lane")
                .build(),
            snapshot,
            exporter,
        }
    }

    /// Counts one final outcome of an attempt.
    pub fn outcome(&self, job: &'static str, outcome: &'static str) {
        self.jobs.add(
            1,
            &[KeyValue::new("job", job), KeyValue::new("outcome", outcome)],
        );
    }

    /// Records a handler's duration.
    pub fn handler_seconds(&self, job: &'static str, seconds: f64) {
        self.handler_seconds
            .record(seconds, &[KeyValue::new("job", job)]);
    }

    /// One more (or one less) attempt running.
    pub fn in_flight(&self, job: &'static str, delta: i64) {
        self.in_flight.add(delta, &[KeyValue::new("job", job)]);
    }

    /// A retry ran `seconds` after its due time.
    pub fn lateness(&self, topic: &str, seconds: f64) {
        self.lateness
            .record(seconds, &[KeyValue::new("topic", topic.to_string())]);
    }

    /// An attempt of a `priority` lane ended `seconds` after its record's
    /// timestamp.
    pub fn priority_latency(&self, priority: crate::worker::Priority, seconds: f64) {
        self.priority_latency
            .record(seconds, &[KeyValue::new("priority", priority.as_str())]);
    }

    /// A rebalance happened.
    pub fn rebalance(&self) {
        self.rebalances.add(1, &[]);
    }

    /// The Prometheus text exposition, or `None` when metrics are disabled.
    #[cfg(feature = "metrics-http")]
    pub fn render(&self) -> Option<String> {
        let (_, registry) = self.exporter.as_deref()?;
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .ok()?;
        String::from_utf8(out).ok()
    }

    /// Without `metrics-http` nothing is exported.
    #[cfg(not(feature = "metrics-http"))]
    pub fn render(&self) -> Option<String> {
        None
    }
}
