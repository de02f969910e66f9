//! The worker's metrics, as OpenTelemetry instruments exported in Prometheus
//! format (`/metrics`). The names and labels are listed in the book
//! (`docs/src/observability.md`), with PromQL for the usual alerts.
//!
//! Conventions, after Prometheus' own: durations are seconds with explicit
//! buckets from 1 ms to 5 min ([`DURATION_BUCKETS`]; OpenTelemetry's
//! defaults, 0 to 10 000, make every quantile useless for seconds), counters
//! end in `_total`, a state is a label (`kjob_breaker_state{state="open"} 1`)
//! rather than a code, and no series carries `otel_scope_name`.
//!
//! Gauges describe one worker, so they carry its consumer `group`: two
//! workers that share one [`MetricsExporter`] (or one process) never
//! overwrite each other's values. The lag of a partition is exported only by
//! the member that owns it, so `sum()` over the replicas of a group counts it
//! once.
//!
//! A worker without a metrics endpoint or exporter uses no-op instruments:
//! recording costs nothing. The Prometheus exporter is behind the
//! `metrics-http` cargo feature (on by default); asking for one without it
//! is an error that names the feature.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider as _, UpDownCounter};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::SdkMeterProvider;
#[cfg(feature = "metrics-http")]
use prometheus::{Encoder, Registry, TextEncoder};

#[cfg(not(feature = "metrics-http"))]
use crate::error::Error;
use crate::error::Result;

pub(crate) use super::gauges::{GuardGauge, RegistryWait, WorkerGauges};

/// Bucket bounds, in seconds, of every duration histogram kjob exports:
/// from a 1 ms handler to a 5 min one, dense where job latencies live, so
/// `histogram_quantile(0.99, ...)` lands within a bucket's width of the truth.
pub const DURATION_BUCKETS: [f64; 17] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// The process's metrics exposition: one OpenTelemetry meter provider and
/// the Prometheus registry it writes into. Cloning shares it.
///
/// A worker creates one for its [`metrics_endpoint`](crate::WorkerBuilder::metrics_endpoint);
/// give the same exporter to a second worker or to an outbox relay in the
/// process ([`WorkerBuilder::metrics_exporter`](crate::WorkerBuilder::metrics_exporter))
/// and one `/metrics` serves all of them, instead of one port each.
#[derive(Clone)]
pub struct MetricsExporter {
    inner: Option<Arc<Exporting>>,
}

struct Exporting {
    provider: SdkMeterProvider,
    #[cfg(feature = "metrics-http")]
    registry: Registry,
}

impl std::fmt::Debug for MetricsExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsExporter")
            .field("exporting", &self.inner.is_some())
            .finish()
    }
}

impl MetricsExporter {
    /// Instruments exported in Prometheus format, to a fresh registry of
    /// their own (never the process-global default registry, which other
    /// libraries write into).
    #[cfg(feature = "metrics-http")]
    pub fn prometheus() -> Result<Self> {
        let registry = Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .without_units()
            .without_target_info()
            .scope_info_enabled(false)
            .build()
            .map_err(|e| crate::error::Error::Metrics {
                reason: format!("building the Prometheus exporter: {e}"),
            })?;
        // Also pushed over OTLP when `OTEL_METRICS_EXPORTER=otlp` asks.
        let provider =
            super::otlp::with_metric_reader(SdkMeterProvider::builder().with_reader(exporter))?
                .build();
        Ok(Self {
            inner: Some(Arc::new(Exporting { provider, registry })),
        })
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

    /// No exporter: instruments are no-ops.
    pub fn disabled() -> Self {
        Self { inner: None }
    }

    /// Whether anything is exported.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// A meter for `scope` (no-op when disabled).
    pub(crate) fn meter(&self, scope: &'static str) -> Meter {
        match &self.inner {
            Some(e) => e.provider.meter(scope),
            None => opentelemetry::global::meter_provider().meter("kjob-disabled"),
        }
    }

    /// The Prometheus text exposition, or `None` when disabled.
    #[cfg(feature = "metrics-http")]
    pub fn render(&self) -> Option<String> {
        let e = self.inner.as_deref()?;
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&e.registry.gather(), &mut out)
            .ok()?;
        String::from_utf8(out).ok()
    }

    /// Without `metrics-http` nothing is exported.
    #[cfg(not(feature = "metrics-http"))]
    pub fn render(&self) -> Option<String> {
        None
    }
}

/// Gauges the poll thread refreshes; read when `/metrics` is scraped.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// (topic, partition) -> records not yet committed, for the partitions
    /// this worker owns.
    pub(crate) lag: HashMap<(String, i32), i64>,
    /// topic -> age in seconds of the oldest uncommitted record kjob holds.
    pub(crate) oldest_pending_seconds: HashMap<String, f64>,
    /// Per priority level (high, normal, low): (running, waiting).
    pub(crate) priority: [(usize, usize); crate::worker::Priority::LEVELS],
    /// Jobs parked: waiting for a downstream without a handler slot.
    pub(crate) parked: usize,
    /// Per fair route main topic: records of a tenant over its share read
    /// past, not yet read again.
    pub(crate) read_past: Vec<(String, usize)>,
    /// Per fair route and tenant (the busiest [`TENANTS_SHOWN`], the rest
    /// as `other`): (ready, running).
    pub(crate) tenants: Vec<(String, String, usize, usize)>,
    /// Per job type: age of the oldest handler running for 1 s or more.
    pub(crate) oldest_running_seconds: Vec<(&'static str, f64)>,
    /// Per schedule: whether this worker fires it now.
    pub(crate) schedules: Vec<(String, bool)>,
    /// The batches this worker coordinates (its partitions of the batch
    /// topic): (open, age in seconds of the oldest open one); `None`
    /// without batches.
    pub(crate) batches: Option<(usize, f64)>,
}

/// One point per fair route and tenant of the snapshot, of the count
/// `pick` takes from (ready, running).
fn tenant_points(
    s: &Snapshot,
    group: &KeyValue,
    out: &mut dyn FnMut(f64, Vec<KeyValue>),
    pick: fn(usize, usize) -> usize,
) {
    for (topic, tenant, ready, running) in &s.tenants {
        out(
            pick(*ready, *running) as f64,
            vec![
                group.clone(),
                KeyValue::new("topic", topic.clone()),
                KeyValue::new("tenant", tenant.clone()),
            ],
        );
    }
}

/// Tenants shown by name per fair route on `/metrics`: the busiest by
/// ready plus running jobs; the others are summed as tenant `other`, so a
/// route with a million tenants still exports a bounded number of series.
pub(crate) const TENANTS_SHOWN: usize = 20;

/// The busiest [`TENANTS_SHOWN`] tenants of each route by name, the rest
/// summed as `other`.
pub(crate) fn top_tenants(
    all: Vec<(String, String, usize, usize)>,
) -> Vec<(String, String, usize, usize)> {
    let mut by_route: std::collections::BTreeMap<String, Vec<(String, usize, usize)>> =
        Default::default();
    for (route, tenant, ready, running) in all {
        by_route
            .entry(route)
            .or_default()
            .push((tenant, ready, running));
    }
    let mut out = Vec::new();
    for (route, mut tenants) in by_route {
        tenants.sort_by(|a, b| (b.1 + b.2).cmp(&(a.1 + a.2)).then(a.0.cmp(&b.0)));
        let rest = tenants.split_off(tenants.len().min(TENANTS_SHOWN));
        for (tenant, ready, running) in tenants {
            out.push((route.clone(), tenant, ready, running));
        }
        if !rest.is_empty() {
            let (ready, running) = rest.iter().fold((0, 0), |(r, n), t| (r + t.1, n + t.2));
            out.push((route, "other".to_string(), ready, running));
        }
    }
    out
}

/// Reads one gauge's points out of the snapshot: `(snapshot, group label,
/// emit(value, labels))`.
type ReadSnapshot = fn(&Snapshot, &KeyValue, &mut dyn FnMut(f64, Vec<KeyValue>));

/// The instruments a worker records into.
#[derive(Clone)]
pub(crate) struct Metrics {
    jobs: Counter<u64>,
    handler_duration: Histogram<f64>,
    /// The name before `kjob_handler_duration_seconds`, kept for one release.
    handler_seconds_deprecated: Histogram<f64>,
    in_flight: UpDownCounter<i64>,
    lateness: Histogram<f64>,
    rebalances: Counter<u64>,
    priority_latency: Histogram<f64>,
    schedule_fired: Counter<u64>,
    schedule_lateness: Histogram<f64>,
    tenant_handled: Counter<u64>,
    tenant_wait: Histogram<f64>,
    /// The tenants of each fair route that get a series of their own.
    tenant_names: Arc<Mutex<HashMap<String, std::collections::HashSet<String>>>>,
    /// Refreshed by the poll thread.
    pub(crate) snapshot: Arc<Mutex<Snapshot>>,
    exporter: MetricsExporter,
    /// Handler durations per job since the last heartbeat took them
    /// (their p50/p99 reach the dashboard's history that way).
    pub(crate) durations: Arc<crate::control::Durations>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("exported", &self.exporter.is_enabled())
            .finish()
    }
}

/// One observable gauge read from the snapshot under its lock.
fn gauge_from_snapshot(
    meter: &Meter,
    group: &KeyValue,
    snapshot: &Arc<Mutex<Snapshot>>,
    name: &'static str,
    description: &'static str,
    read: ReadSnapshot,
) {
    let (snap, group) = (snapshot.clone(), group.clone());
    meter
        .f64_observable_gauge(name)
        .with_description(description)
        .with_callback(move |obs| {
            let s = snap.lock().unwrap_or_else(PoisonError::into_inner);
            read(&s, &group, &mut |v, labels| obs.observe(v, &labels));
        })
        .build();
}

/// The observable gauges read from the worker's snapshot, each under the
/// snapshot's lock: per partition and priority (then
/// [`observe_snapshot_jobs`]).
fn observe_snapshot(meter: &Meter, group: &KeyValue, snapshot: &Arc<Mutex<Snapshot>>) {
    let from_snapshot = |name: &'static str, description: &'static str, read: ReadSnapshot| {
        gauge_from_snapshot(meter, group, snapshot, name, description, read)
    };
    from_snapshot(
        "kjob_consumer_lag",
        "Records in a partition not yet committed by the group (exported by the partition's owner)",
        |s, g, out| {
            for ((topic, partition), lag) in &s.lag {
                out(
                    *lag as f64,
                    vec![
                        g.clone(),
                        KeyValue::new("topic", topic.clone()),
                        KeyValue::new("partition", i64::from(*partition)),
                    ],
                );
            }
        },
    );
    from_snapshot(
        "kjob_oldest_pending_seconds",
        "Age of the oldest record the worker holds but has not committed",
        |s, g, out| {
            for (topic, age) in &s.oldest_pending_seconds {
                out(*age, vec![g.clone(), KeyValue::new("topic", topic.clone())]);
            }
        },
    );
    from_snapshot(
        "kjob_priority_in_flight",
        "Jobs running, per priority lane",
        |s, g, out| {
            for (level, (run, _)) in s.priority.iter().enumerate() {
                let p = crate::worker::Priority::at_level(level);
                out(
                    *run as f64,
                    vec![g.clone(), KeyValue::new("priority", p.as_str())],
                );
            }
        },
    );
    from_snapshot(
        "kjob_priority_waiting",
        "Jobs ready and waiting for a slot, per priority lane",
        |s, g, out| {
            for (level, (_, wait)) in s.priority.iter().enumerate() {
                let p = crate::worker::Priority::at_level(level);
                out(
                    *wait as f64,
                    vec![g.clone(), KeyValue::new("priority", p.as_str())],
                );
            }
        },
    );
    observe_snapshot_jobs(meter, group, snapshot);
}

/// [`observe_snapshot`]'s gauges of jobs: per tenant, running, parked,
/// read past, and the schedule's and batches' state.
fn observe_snapshot_jobs(meter: &Meter, group: &KeyValue, snapshot: &Arc<Mutex<Snapshot>>) {
    let from_snapshot = |name: &'static str, description: &'static str, read: ReadSnapshot| {
        gauge_from_snapshot(meter, group, snapshot, name, description, read)
    };
    from_snapshot(
        "kjob_tenant_ready",
        "Jobs of a fair route ready and waiting for a slot, per tenant (the busiest, the rest as other)",
        |s, g, out| tenant_points(s, g, out, |ready, _| ready),
    );
    from_snapshot(
        "kjob_tenant_running",
        "Jobs of a fair route running, per tenant (the busiest, the rest as other)",
        |s, g, out| tenant_points(s, g, out, |_, running| running),
    );
    from_snapshot(
        "kjob_oldest_running_seconds",
        "Age of the oldest handler still running, per job type (0 while all are under 1 s)",
        |s, g, out| {
            for (job, age) in &s.oldest_running_seconds {
                out(*age, vec![g.clone(), KeyValue::new("job", *job)]);
            }
        },
    );
    from_snapshot(
        "kjob_parked",
        "Jobs waiting for a downstream (registry, breaker, rate limit) without a handler slot",
        |s, g, out| out(s.parked as f64, vec![g.clone()]),
    );
    from_snapshot(
        "kjob_read_past",
        "Records of a fair route's tenant over its share of the buffer, read past to reach the other tenants and not yet read again",
        |s, g, out| {
            for (topic, n) in &s.read_past {
                out(
                    *n as f64,
                    vec![
                        g.clone(),
                        KeyValue::new("topic", topic.clone()),
                    ],
                );
            }
        },
    );
    from_snapshot(
        "kjob_schedule_leader",
        "1 on the worker that fires the schedule now, 0 on the others",
        |s, g, out| {
            for (name, leading) in &s.schedules {
                let v = if *leading { 1.0 } else { 0.0 };
                out(v, vec![g.clone(), KeyValue::new("schedule", name.clone())]);
            }
        },
    );
    from_snapshot(
        "kjob_batches_open",
        "Batches not complete nor cancelled, among those this worker coordinates",
        |s, g, out| {
            if let Some((open, _)) = s.batches {
                out(open as f64, vec![g.clone()]);
            }
        },
    );
    from_snapshot(
        "kjob_batch_oldest_open_seconds",
        "Age of the oldest open batch this worker coordinates (0 with none)",
        |s, g, out| {
            if let Some((_, age)) = s.batches {
                out(age, vec![g.clone()]);
            }
        },
    );
}

/// The observable instruments read from the routes' live gauges
/// (registry waits, breakers, dropped fields).
fn observe_gauges(meter: &Meter, group: &KeyValue, gauges: &Arc<WorkerGauges>) {
    let (g, l) = (gauges.clone(), group.clone());
    meter
        .i64_observable_gauge("kjob_registry_waiting")
        .with_description(
            "Jobs waiting for the schema registry to serve their writer schema (not failed, not retried)",
        )
        .with_callback(move |obs| {
            obs.observe(
                g.registry_waiting.load(Ordering::Relaxed),
                std::slice::from_ref(&l),
            )
        })
        .build();
    let (g, l) = (gauges.clone(), group.clone());
    meter
        .i64_observable_gauge("kjob_breaker_state")
        .with_description(
            "Circuit breaker state per downstream: 1 for the state it is in, 0 for the others",
        )
        .with_callback(move |obs| {
            for (name, state, _) in g.guards() {
                for s in ["closed", "half_open", "open"] {
                    obs.observe(
                        i64::from(s == state),
                        &[
                            l.clone(),
                            KeyValue::new("breaker", name.clone()),
                            KeyValue::new("state", s),
                        ],
                    );
                }
            }
        })
        .build();
    let (g, l) = (gauges.clone(), group.clone());
    meter
        .u64_observable_counter("kjob_fields_dropped")
        .with_description("Records decoded by a reader that drops fields their writer carries, per job and the writer's contract version (kjob-version)")
        .with_callback(move |obs| {
            for (job, version, n) in g.dropped() {
                obs.observe(
                    n,
                    &[
                        l.clone(),
                        KeyValue::new("job", job),
                        KeyValue::new("writer_version", version),
                    ],
                );
            }
        })
        .build();
    let (g, l) = (gauges.clone(), group.clone());
    meter
        .i64_observable_gauge("kjob_breaker_parked")
        .with_description("Jobs waiting for a circuit breaker to close")
        .with_callback(move |obs| {
            for (name, _, parked) in g.guards() {
                obs.observe(parked, &[l.clone(), KeyValue::new("breaker", name)]);
            }
        })
        .build();
}

impl Metrics {
    /// The instruments of the worker of consumer group `group`, recorded
    /// into `exporter`; `gauges` are the ones its routes update.
    pub(crate) fn on(exporter: &MetricsExporter, group: &str, gauges: Arc<WorkerGauges>) -> Self {
        let meter = exporter.meter("kjob");
        Self::with_meter(&meter, group, Arc::default(), gauges, exporter.clone())
    }

    fn with_meter(
        meter: &Meter,
        group: &str,
        snapshot: Arc<Mutex<Snapshot>>,
        gauges: Arc<WorkerGauges>,
        exporter: MetricsExporter,
    ) -> Self {
        let group = KeyValue::new("group", group.to_string());
        observe_snapshot(meter, &group, &snapshot);
        observe_gauges(meter, &group, &gauges);
        let seconds = |name: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_description(description)
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build()
        };
        Self {
            jobs: meter
                .u64_counter("kjob_jobs")
                .with_description("Attempts by job type and outcome")
                .build(),
            handler_duration: seconds(
                "kjob_handler_duration_seconds",
                "Handler duration per attempt",
            ),
            handler_seconds_deprecated: seconds(
                "kjob_handler_seconds",
                "Deprecated: kjob_handler_duration_seconds (removed in the next release)",
            ),
            in_flight: meter
                .i64_up_down_counter("kjob_in_flight")
                .with_description("Attempts running now")
                .build(),
            lateness: seconds(
                "kjob_retry_due_lateness_seconds",
                "How long after its due time a retry ran",
            ),
            rebalances: meter
                .u64_counter("kjob_rebalances")
                .with_description("Partition assignments, revocations and losses (kind)")
                .build(),
            priority_latency: seconds(
                "kjob_priority_latency_seconds",
                "Record timestamp to the attempt's outcome, per priority lane",
            ),
            schedule_fired: meter
                .u64_counter("kjob_schedule_fired")
                .with_description("Ticks of a cron schedule enqueued by this worker")
                .build(),
            schedule_lateness: seconds(
                "kjob_schedule_lateness_seconds",
                "How long after its tick a scheduled job was enqueued",
            ),
            tenant_handled: meter
                .u64_counter("kjob_tenant_jobs")
                .with_description("Attempts of a fair route's jobs that ran, per tenant (the first tenants seen, the rest as other)")
                .build(),
            tenant_wait: seconds(
                "kjob_tenant_wait_seconds",
                "Record timestamp to handler start of a fair route's jobs, per tenant (the first tenants seen, the rest as other)",
            ),
            tenant_names: Arc::default(),
            snapshot,
            exporter,
            durations: Default::default(),
        }
    }

    /// Counts one final outcome of an attempt.
    pub(crate) fn outcome(&self, job: &'static str, outcome: &'static str) {
        self.jobs.add(
            1,
            &[KeyValue::new("job", job), KeyValue::new("outcome", outcome)],
        );
    }

    /// Records a handler's duration.
    pub(crate) fn handler_seconds(&self, job: &'static str, seconds: f64) {
        let labels = [KeyValue::new("job", job)];
        self.handler_duration.record(seconds, &labels);
        self.handler_seconds_deprecated.record(seconds, &labels);
        self.durations.record(job, seconds);
    }

    /// One more (or one less) attempt running.
    pub(crate) fn in_flight(&self, job: &'static str, delta: i64) {
        self.in_flight.add(delta, &[KeyValue::new("job", job)]);
    }

    /// A retry ran `seconds` after its due time.
    pub(crate) fn lateness(&self, topic: &str, seconds: f64) {
        self.lateness
            .record(seconds, &[KeyValue::new("topic", topic.to_string())]);
    }

    /// A fair route's job of `tenant` started its handler `waited_seconds`
    /// after its record was written. The first [`TENANTS_SHOWN`] tenants
    /// of a route keep their own series; later ones count as `other`, so
    /// the series stay bounded and every counter stays monotonic.
    pub(crate) fn tenant_started(&self, topic: &str, tenant: &str, waited_seconds: f64) {
        let label = {
            let mut names = self
                .tenant_names
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let known = names.entry(topic.to_string()).or_default();
            if known.contains(tenant) {
                tenant.to_string()
            } else if known.len() < TENANTS_SHOWN {
                known.insert(tenant.to_string());
                tenant.to_string()
            } else {
                "other".to_string()
            }
        };
        let labels = [
            KeyValue::new("topic", topic.to_string()),
            KeyValue::new("tenant", label),
        ];
        self.tenant_handled.add(1, &labels);
        self.tenant_wait.record(waited_seconds, &labels);
    }

    /// An attempt of a `priority` lane ended `seconds` after its record's
    /// timestamp.
    pub(crate) fn priority_latency(&self, priority: crate::worker::Priority, seconds: f64) {
        self.priority_latency
            .record(seconds, &[KeyValue::new("priority", priority.as_str())]);
    }

    /// A rebalance of `kind`: `assigned`, `revoked` or `lost` (the session
    /// expired, so nothing could be committed for the partitions).
    pub(crate) fn rebalance(&self, kind: &'static str) {
        self.rebalances.add(1, &[KeyValue::new("kind", kind)]);
    }

    /// Schedule `name` fired a tick `late_seconds` after it was due.
    pub(crate) fn schedule_fired(&self, name: &str, late_seconds: f64) {
        let labels = [KeyValue::new("schedule", name.to_string())];
        self.schedule_fired.add(1, &labels);
        self.schedule_lateness
            .record(late_seconds.max(0.0), &labels);
    }

    /// What this worker records into.
    pub(crate) fn exporter(&self) -> &MetricsExporter {
        &self.exporter
    }
}

#[cfg(test)]
mod tenant_tests {
    use super::*;

    #[test]
    fn tenant_series_are_bounded_per_route() {
        let mut all = Vec::new();
        for i in 0..(TENANTS_SHOWN + 5) {
            all.push(("r".to_string(), format!("t{i:02}"), i, 1));
        }
        all.push(("s".to_string(), "solo".to_string(), 0, 2));
        let top = top_tenants(all);
        let r: Vec<_> = top.iter().filter(|t| t.0 == "r").collect();
        assert_eq!(r.len(), TENANTS_SHOWN + 1);
        // The busiest first; the five least busy summed as other.
        assert_eq!(r[0].1, format!("t{:02}", TENANTS_SHOWN + 4));
        let other = r.last().map(|t| (t.1.as_str(), t.2, t.3));
        assert_eq!(other, Some(("other", 1 + 2 + 3 + 4, 5)));
        assert!(top.contains(&("s".to_string(), "solo".to_string(), 0, 2)));
    }
}
