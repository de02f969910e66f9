//! What users configure: [`WorkerBuilder`], its defaults, and `build()`,
//! which checks the configuration and turns each registered handler into
//! the route table (`routes::Routes`) the worker and the test harness run.
//! The settings stand in files by capability: `scheduling` (priority,
//! strict order, fairness, debounce), `lifecycle` (membership, commits,
//! stops), `topology` (the topics it owns), `serving` (metrics, HTTP,
//! outbox relay), and `routes` (the route table `build()` makes).
//!
//! The room of step 2 in ARCHITECTURE.md, configure and provision.
//! **Enters:** the handlers, layers and settings a worker binary registers.
//! **Leaves:** a [`Worker`]: its settings and route table, and, before the
//! first poll, the registry checked (`readers`: each route reads what its
//! topic's subject holds), the topics a route lacks created (`provision`),
//! and what it owns as one model, without connecting (`describe`). Also
//! here: the stop limits (`limits`) and the shared tier layout
//! (`shared_tiers`).

pub(in crate::worker) mod describe;
pub(in crate::worker) mod limits;
pub(in crate::worker) mod provision;
pub(in crate::worker) mod readers;
pub(in crate::worker) mod shared_tiers;

mod lifecycle;
mod routes;
mod scheduling;
mod serving;
mod topology;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::codec::{parse_contract, Codec, ReaderSchema, SchemaSource};
use crate::config::KafkaConfig;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::layers::{AttemptLayer, LayerFn};
use crate::retry::RetryPolicy;
use crate::telemetry::metrics::{Metrics, MetricsExporter};

use crate::membership::{self, GroupProtocol};
#[cfg(doc)]
use crate::producer::Producer;
use crate::worker::handler::route::{HandlerShared, RouteHandler, TypedHandler};
use crate::worker::handler::{Handler, StateMap};
use crate::worker::scheduler::Limits;
use crate::worker::state::{OrderingMode, RouteEntry, Settings};
use crate::worker::{before::strict, handler::watchdog, Priority, WorkerStats};
#[cfg(doc)]
use crate::worker::{Ext, State};

/// Builds a route once the codec, timeout, state and layers are known (at
/// `build()`).
type RouteFactory = Box<
    dyn Fn(
            Arc<dyn SchemaSource>,
            Option<Duration>,
            Arc<StateMap>,
            &[LayerFn],
            HandlerShared,
        ) -> Result<Arc<dyn RouteHandler>>
        + Send
        + Sync,
>;

/// A registered route: its topic, its factory, and the state types its
/// handler's extractors need.
struct Registration {
    topic: String,
    make: RouteFactory,
    needs: Vec<(std::any::TypeId, &'static str)>,
}

/// Configures a [`Worker`]. Every setting has a production-safe default.
pub struct WorkerBuilder {
    config: KafkaConfig,
    settings: Settings,
    concurrency: usize,
    handler_timeout: Option<Duration>,
    slow_attempt_warning: Duration,
    park: bool,
    codec: Result<Arc<Codec>>,
    routes: Vec<Registration>,
    states: StateMap,
    layers: Vec<LayerFn>,
    route_layers: HashMap<String, Vec<LayerFn>>,
    static_member: Option<String>,
    protocol: Option<GroupProtocol>,
    stop_limits: limits::StopLimits,
    create_topics: bool,
    create_main_topics: Option<usize>,
    delayed_jobs: bool,
    delayed_routes: std::collections::BTreeSet<String>,
    shared_tiers: Option<crate::worker::SharedTiers>,
    dlq_partitions: Option<usize>,
    schedules: Vec<crate::schedule::Schedule>,
    batches: Option<String>,
    batch_callbacks: Vec<&'static str>,
    retry: RetryPolicy,
    retry_overrides: HashMap<String, RetryPolicy>,
    priorities: HashMap<String, Priority>,
    strict: std::collections::BTreeSet<String>,
    debounce: HashMap<String, Duration>,
    fair: std::collections::BTreeMap<String, crate::worker::Fairness>,
    endpoint: Option<SocketAddr>,
    exporter: Option<MetricsExporter>,
    #[cfg(feature = "metrics-http")]
    http_routes: Option<axum::Router>,
    #[cfg(feature = "postgres")]
    outbox_relay: Option<crate::outbox::Relay>,
}

impl WorkerBuilder {
    /// Runs handlers for `J` on its main topic `J::NAME`. A handler is an
    /// `async fn(job, ctx)`, optionally with extractors after `ctx`
    /// ([`State`], [`Ext`]).
    pub fn handle<J: Job, M: 'static>(self, handler: impl Handler<J, M>) -> Self {
        self.handle_on::<J, M>(J::NAME, handler)
    }

    /// Runs handlers for `J` on an explicit topic.
    pub fn handle_on<J: Job, M: 'static>(
        mut self,
        topic: &str,
        handler: impl Handler<J, M>,
    ) -> Self {
        let needs = handler.required_states();
        let handler = Arc::new(handler);
        self.routes.push(Registration {
            topic: topic.to_string(),
            make: Box::new(move |schemas, timeout, states, layers, shared| {
                let reader = ReaderSchema::new(parse_contract::<J>()?);
                Ok(Arc::new(TypedHandler::<J, _, M>::new(
                    handler.clone(),
                    reader,
                    schemas,
                    timeout,
                    states,
                    layers,
                    shared,
                )) as Arc<dyn RouteHandler>)
            }),
            needs,
        });
        self
    }

    /// Registers shared state that handlers take as [`State<S>`]: a pool, a
    /// client, settings. One value per type; `S` is cloned per attempt, so
    /// wrap large values in an `Arc`.
    pub fn state<S: Clone + Send + Sync + 'static>(mut self, value: S) -> Self {
        self.states.insert(value);
        self
    }

    /// Wraps every route's attempts in a [`tower::Layer`] (see
    /// [`crate::layers`] for the order). Layers added first are outermost.
    pub fn layer(mut self, layer: impl AttemptLayer) -> Self {
        self.layers.push(layer.erase());
        self
    }

    /// Wraps the attempts of the route on main topic `topic` (and its retry
    /// tiers) in a layer, inside the worker-wide ones: a breaker or a rate
    /// limit for the downstream that route calls.
    pub fn layer_for(mut self, topic: &str, layer: impl AttemptLayer) -> Self {
        self.route_layers
            .entry(topic.to_string())
            .or_default()
            .push(layer.erase());
        self
    }

    /// Handlers running at once across all partitions (default 64).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Records read but not finished per partition before the worker
    /// stops reading the partition (default 5000); it reads on at three
    /// quarters. A main-topic partition is then left unread in its own
    /// librdkafka queue rather than paused, because a pause makes
    /// librdkafka drop what it prefetched and fetch it again. librdkafka
    /// prefetches up to as many records again per partition (at most
    /// 8 MiB, `queued.min.messages` and `queued.max.messages.kbytes`), so
    /// memory is bounded by about twice this, times the assigned
    /// partitions, times the record size. Retry tiers and fair routes,
    /// read through the consumer's main queue, are paused.
    ///
    /// Below the bound, a main-topic partition is also left unread while
    /// its priority level has four times the concurrency (at least 4 096)
    /// jobs waiting for a slot, until they are down to half of that: jobs
    /// that only wait for a slot need not be read yet, and 40 000 of them
    /// on 8 partitions went cold before they ran. Jobs queued behind their
    /// key's running job do not count, so a hot key still reads up to the
    /// bound.
    pub fn max_in_flight_per_partition(mut self, n: usize) -> Self {
        self.settings.max_in_flight_per_partition = n.max(1);
        self
    }

    /// Whether a job that waits for a downstream (the registry, a breaker, a
    /// rate limit) gives its handler slot back while it waits (default:
    /// yes). Off, waiting jobs hold their slots as kjob did before; only the
    /// benchmarks that measure the difference turn it off.
    #[doc(hidden)]
    pub fn park_waiting_jobs(mut self, yes: bool) -> Self {
        self.park = yes;
        self
    }

    /// Logs a warning (job id, key, partition) once a handler has run
    /// longer than `d` (default 5 minutes): a hung handler holds its
    /// partition's commit, and `kjob_oldest_running_seconds{job}` shows its
    /// age. Nothing is cancelled; see [`WorkerBuilder::handler_timeout`].
    pub fn slow_attempt_warning(mut self, d: Duration) -> Self {
        self.slow_attempt_warning = d;
        self
    }

    /// Cancels an attempt after `d` and classes it `retryable.timeout`.
    pub fn handler_timeout(mut self, d: Duration) -> Self {
        self.handler_timeout = Some(d);
        self
    }

    /// Retry policy (tiers, attempts, jitter) for every route without its
    /// own; see [`crate::retry`].
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Retry policy for the route on main topic `topic` only.
    pub fn retry_for(mut self, topic: &str, policy: RetryPolicy) -> Self {
        self.retry_overrides.insert(topic.to_string(), policy);
        self
    }

    /// Validates the configuration and parses every contract's schema, so a
    /// broken contract fails here rather than at the first record.
    pub fn build(self) -> Result<Worker> {
        let codec = self.codec.as_ref().map_err(Error::clone)?.clone();
        let routes = self.build_routes(codec.clone())?;
        let protocol = match self.protocol {
            Some(p) => p,
            None => match self.config.overrides.get("group.protocol") {
                Some(v) => GroupProtocol::parse(v)?,
                None => GroupProtocol::from_env()?.unwrap_or_default(),
            },
        };
        if protocol == GroupProtocol::Consumer {
            membership::reject_classic_only(&self.config)?;
        }
        let strict_topics: Vec<String> = self.strict.iter().cloned().collect();
        strict::check_assignment(&self.config, protocol, &strict_topics)?;
        let exporter = match (&self.exporter, self.endpoint) {
            (Some(e), _) => e.clone(),
            (None, Some(_)) => MetricsExporter::prometheus()?,
            // No endpoint, but OTLP metrics asked for: push them anyway.
            (None, None) if crate::telemetry::otlp::metrics_requested() => {
                MetricsExporter::prometheus().unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "OTLP metrics asked for, but no exporter can be built; metrics are not exported");
                    MetricsExporter::disabled()
                })
            }
            (None, None) => MetricsExporter::disabled(),
        };
        let metrics = Metrics::on(&exporter, &self.settings.group, routes.gauges.clone());
        #[cfg(feature = "metrics-http")]
        if self.http_routes.is_some() && self.endpoint.is_none() {
            return Err(Error::InvalidSetting {
                name: "http_routes".into(),
                value: "a router".into(),
                reason: "they are served on the metrics endpoint; add .metrics_endpoint(addr)"
                    .into(),
            });
        }
        if self.create_main_topics == Some(0) {
            return Err(Error::InvalidSetting {
                name: "create_main_topics".into(),
                value: "0".into(),
                reason: "a topic needs at least one partition; pass the count to create a missing main topic with (1 for a first try)".into(),
            });
        }
        let (_, limits) = self.scheduler_settings();
        let priorities = self.topic_priorities(&routes.entries);
        let fairness = self.topic_fairness(&routes.entries);
        let turns = self.topic_turns(&routes.entries);
        let stop_limits = self.stop_limits.with_env()?;
        let mut names = std::collections::HashSet::new();
        for s in &self.schedules {
            s.validate()?;
            if !names.insert(s.name()) {
                return Err(Error::InvalidSetting {
                    name: "schedule".into(),
                    value: s.name().to_string(),
                    reason: "two schedules share this name; names are unique within a group".into(),
                });
            }
        }
        for name in &self.batch_callbacks {
            if !routes
                .entries
                .values()
                .any(|e| e.handler.job_name() == *name)
            {
                return Err(Error::InvalidSetting {
                    name: "batch_callback".into(),
                    value: (*name).to_string(),
                    reason: format!("no route of this worker handles `{name}`, so its batch callbacks would wait on a topic nobody reads; register its handler (.handle(...)) on this worker"),
                });
            }
        }
        if let Some(topic) = &self.batches {
            if topic.trim().is_empty() {
                return Err(Error::InvalidSetting {
                    name: "batches_on".into(),
                    value: topic.clone(),
                    reason: "the batch topic needs a name, e.g. kjob.batches".into(),
                });
            }
        }
        Ok(Worker {
            limits,
            priorities,
            fairness,
            turns,
            stop_limits,
            metrics,
            endpoint: self.endpoint,
            #[cfg(feature = "metrics-http")]
            http_routes: self.http_routes,
            config: self.config,
            settings: self.settings,
            codec,
            routes: routes.entries,
            mains: routes.mains,
            watchdog: routes.watchdog,
            park: self.park,
            static_member: self.static_member.or_else(membership::instance_id_from_env),
            protocol,
            create_topics: self.create_topics,
            create_main_topics: self.create_main_topics,
            schedules: self.schedules,
            batches: self.batches,
            strict: strict_topics,
            shared_tier_partitions: self.shared_tiers.as_ref().and_then(|t| t.partitions),
            dlq_partitions: self.dlq_partitions,
            debounce: self.debounce,
            stats: Arc::new(WorkerStats::default()),
            #[cfg(feature = "postgres")]
            outbox_relay: self.outbox_relay,
        })
    }

    /// The consumer group this builder was created for.
    pub fn group(&self) -> &str {
        &self.settings.group
    }
}

/// A configured worker. [`Worker::run`] blocks until SIGTERM/SIGINT;
/// [`Worker::run_until`] until a future of your choice completes.
pub struct Worker {
    pub(super) limits: Limits,
    pub(super) priorities: HashMap<String, Priority>,
    /// The fair routes' topics and settings (`WorkerBuilder::fair`).
    pub(super) fairness: Vec<(Vec<String>, crate::worker::scheduler::FairSpec)>,
    /// Which route each topic's jobs take their turn as.
    pub(super) turns: crate::worker::scheduler::Turns,
    pub(super) stop_limits: limits::StopLimits,
    pub(super) config: KafkaConfig,
    pub(super) settings: Settings,
    pub(super) codec: Arc<Codec>,
    pub(super) routes: HashMap<String, RouteEntry>,
    pub(super) mains: Vec<String>,
    pub(super) watchdog: Arc<watchdog::Watchdog>,
    pub(super) park: bool,
    pub(super) static_member: Option<String>,
    pub(super) protocol: GroupProtocol,
    pub(super) create_topics: bool,
    /// Partitions of a missing main topic, created at start
    /// (`WorkerBuilder::create_main_topics`, development only).
    pub(super) create_main_topics: Option<usize>,
    pub(super) schedules: Vec<crate::schedule::Schedule>,
    /// The batch topic, when the worker takes part in batches.
    pub(super) batches: Option<String>,
    /// Main topics under strict order (`WorkerBuilder::strict_order`).
    pub(super) strict: Vec<String>,
    /// Partitions of missing shared retry tiers, when set
    /// (`SharedTiers::partitions`); else the largest sharing main topic's.
    pub(super) shared_tier_partitions: Option<usize>,
    /// Partitions of missing DLQs, when set (`WorkerBuilder::dlq_partitions`);
    /// else the main topic's.
    pub(super) dlq_partitions: Option<usize>,
    /// Debounce windows by main topic (`WorkerBuilder::debounce`).
    pub(super) debounce: HashMap<String, Duration>,
    pub(super) stats: Arc<WorkerStats>,
    pub(super) metrics: Metrics,
    pub(super) endpoint: Option<SocketAddr>,
    #[cfg(feature = "metrics-http")]
    pub(super) http_routes: Option<axum::Router>,
    #[cfg(feature = "postgres")]
    pub(super) outbox_relay: Option<crate::outbox::Relay>,
}

impl Worker {
    /// Starts configuring a worker in consumer group `group`.
    pub fn builder(config: KafkaConfig, group: impl Into<String>) -> WorkerBuilder {
        let codec = Codec::from_config(&config).map(Arc::new);
        WorkerBuilder {
            config,
            settings: Settings {
                group: group.into(),
                ordering: OrderingMode::PerKey,
                max_in_flight_per_partition: 5000,
                shutdown_grace: Duration::from_secs(30),
                revoke_timeout: Duration::from_secs(15),
                commit_interval: Duration::from_secs(1),
                poll_timeout: Duration::from_millis(20),
            },
            concurrency: 64,
            handler_timeout: None,
            slow_attempt_warning: watchdog::WARN_AFTER,
            park: true,
            codec,
            routes: Vec::new(),
            states: StateMap::default(),
            layers: Vec::new(),
            route_layers: HashMap::new(),
            static_member: None,
            protocol: None,
            stop_limits: limits::StopLimits::default(),
            create_topics: true,
            create_main_topics: None,
            delayed_jobs: false,
            delayed_routes: Default::default(),
            shared_tiers: None,
            dlq_partitions: None,
            schedules: Vec::new(),
            batches: None,
            batch_callbacks: Vec::new(),
            retry: RetryPolicy::default(),
            retry_overrides: HashMap::new(),
            priorities: HashMap::new(),
            strict: Default::default(),
            debounce: HashMap::new(),
            fair: Default::default(),
            endpoint: None,
            exporter: None,
            #[cfg(feature = "metrics-http")]
            http_routes: None,
            #[cfg(feature = "postgres")]
            outbox_relay: None,
        }
    }
}
