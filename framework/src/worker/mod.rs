//! The worker: a consumer-group member that runs handlers and commits only
//! what they finished.
//!
//! ```no_run
//! # use kjob::{Job, JobContext, JobError, KafkaConfig, Worker};
//! # #[derive(serde::Serialize, serde::Deserialize)] struct SendMail { order_id: String }
//! # impl Job for SendMail { const NAME: &'static str = "mail"; const VERSION: u32 = 1;
//! #   const SCHEMA: &'static str = r#"{"type":"record","name":"SendMail","fields":[{"name":"order_id","type":"string"}]}"#;
//! #   fn key(&self) -> String { self.order_id.clone() } }
//! async fn send_mail(job: SendMail, ctx: JobContext) -> Result<(), JobError> {
//!     println!("mail for {} (attempt {})", job.order_id, ctx.attempt);
//!     Ok(())
//! }
//! # async fn run() -> kjob::Result<()> {
//! Worker::builder(KafkaConfig::from_env(), "mailer")
//!     .handle::<SendMail, _>(send_mail)
//!     .build()?
//!     .run() // until SIGTERM / SIGINT
//!     .await
//! # }
//! ```
//!
//! Layout of this module, following a record:
//! `poll` (the poll thread: the rdkafka adapter; polls batches, copies each
//! record out of librdkafka as a `polled::Polled`, carries out the
//! scheduler's pause/resume/seek/commit, handles rebalances) →
//! `scheduler` (every decision: lanes, concurrency, in-flight bound,
//! due-time holds, the commit watermark; no rdkafka in it) → `dispatcher`
//! (async tasks running `Run` batches; they report completions to the
//! scheduler through `poll::Hub` and start what that releases) →
//! `pipeline` (one attempt: decode, handler, classify, retry tier or DLQ,
//! forward-then-finish; `strict` gates strict-order routes) → [`route`]
//! (the typed handler call). The watermark arithmetic is in
//! `offsets.rs`.

mod dispatcher;
pub mod limits;
pub mod membership;
pub(crate) mod park;
pub(crate) mod pipeline;
pub(crate) mod poll;
pub(crate) mod polled;
pub mod priority;
pub(crate) mod record;
pub mod route;
pub(crate) mod scheduler;
pub mod state;
pub(crate) mod strict;
pub(crate) mod watchdog;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::telemetry::http;
use crate::telemetry::metrics::Metrics;
use std::net::SocketAddr;
use tracing::{info, warn};

use crate::codec::{parse_contract, Codec, ReaderSchema, SchemaSource};
use crate::config::KafkaConfig;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::layers::{AttemptLayer, LayerFn};
use crate::producer::Producer;
use crate::retry::RetryPolicy;
use crate::topics::{create_topics, create_topics_with, dlq_topic, partition_counts};
pub use membership::GroupProtocol;
use pipeline::Pipeline;
pub use priority::Priority;
pub(crate) use route::Attempt;
pub use route::{Ext, FromParts, Handler, Parts, State};
use route::{Route, StateMap, TypedRoute};
use scheduler::{Limits, Scheduler};
pub use state::WorkerStats;
use state::{RouteEntry, Settings};

/// Which jobs of a partition may run at the same time.
///
/// Named `OrderingMode`, not `Ordering`, so a handler crate can import it
/// next to `std::sync::atomic::Ordering` and `std::cmp::Ordering`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OrderingMode {
    /// Same key: one after another; different keys: in parallel, even within
    /// one partition. The right default for entity-scoped jobs.
    #[default]
    PerKey,
    /// One job at a time per partition (parallelism = partition count).
    PerPartition,
    /// No ordering: every record may run in parallel.
    Unordered,
}

/// The old name of [`OrderingMode`]; it clashed with
/// `std::sync::atomic::Ordering` in handler crates.
#[deprecated(since = "0.2.0", note = "renamed to `OrderingMode`")]
pub type Ordering = OrderingMode;

/// Builds a route once the codec, timeout, state and layers are known (at
/// `build()`).
type RouteFactory = Box<
    dyn Fn(
            Arc<dyn SchemaSource>,
            Option<Duration>,
            Arc<StateMap>,
            &[LayerFn],
            Arc<watchdog::Watchdog>,
        ) -> Result<Arc<dyn Route>>
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
    run_limits: limits::Limits,
    create_topics: bool,
    delayed_jobs: bool,
    schedules: Vec<crate::schedule::Schedule>,
    retry: RetryPolicy,
    retry_overrides: HashMap<String, RetryPolicy>,
    priorities: HashMap<String, Priority>,
    strict: std::collections::BTreeSet<String>,
    endpoint: Option<SocketAddr>,
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
            make: Box::new(move |schemas, timeout, states, layers, watchdog| {
                let reader = ReaderSchema::new(parse_contract::<J>()?);
                Ok(Arc::new(TypedRoute::<J, _, M>::new(
                    handler.clone(),
                    reader,
                    schemas,
                    timeout,
                    states,
                    layers,
                    watchdog,
                )) as Arc<dyn Route>)
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

    /// How urgent the route on main topic `topic` (and its retry tiers) is
    /// against this worker's other routes (default [`Priority::Normal`]):
    /// free slots go to the most urgent active route first, and less urgent
    /// ones keep at most three quarters of them meanwhile. See
    /// [`priority`].
    pub fn priority(mut self, topic: &str, priority: Priority) -> Self {
        self.priorities.insert(topic.to_string(), priority);
        self
    }

    /// Strict ordered retries for the route on main topic `topic`: while a
    /// key has a job in the retry path, the key's later jobs do not run
    /// before it. They are parked in one of the route's retry tiers (the
    /// longest that brings them back no later than that job is due; their
    /// attempt count untouched, `kjob-follows` naming the job they wait
    /// for) and run in arrival order once it was handled or dead-lettered.
    /// The order survives a crash or a rebalance: it is kept in a compacted
    /// topic `<topic>.order` (created with the main topic's partition count
    /// when [`WorkerBuilder::create_topics`] allows). Other keys are not
    /// delayed. Use it for contracts where order is the point (a ledger, a
    /// state machine); it costs one state write per failure, per parked
    /// record and per finished chain member, and a key's throughput drops
    /// to one job per retry delay while it waits.
    ///
    /// Needs keyed records (keyless ones run as on any route),
    /// [`OrderingMode::PerKey`] or [`OrderingMode::PerPartition`], and the
    /// `range` assignment kjob uses by default: `build()` refuses another
    /// `partition.assignment.strategy` or `group.remote.assignor`, and
    /// start-up refuses tier or order topics whose partition count differs
    /// from the main topic's. Delayed jobs are not ordered with their key's
    /// other jobs. A state record that is not kjob's is logged and read as
    /// an empty chain (the key's waiting jobs then run as they come due).
    /// See the `strict` module docs for the rules and the write order.
    pub fn strict_order(mut self, topic: &str) -> Self {
        self.strict.insert(topic.to_string());
        self
    }

    /// The strict-order state for this builder's strict routes, stored in
    /// `store` (`None` without any).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn strict_state(
        &self,
        store: Arc<dyn strict::OrderStore>,
        stats: Arc<WorkerStats>,
        cancel: CancellationToken,
    ) -> Option<Arc<strict::Strict>> {
        (!self.strict.is_empty()).then(|| {
            Arc::new(strict::Strict::new(
                self.strict.iter().cloned().collect(),
                store,
                stats,
                cancel,
            ))
        })
    }

    /// Ordering mode (default [`OrderingMode::PerKey`]).
    pub fn ordering(mut self, ordering: OrderingMode) -> Self {
        self.settings.ordering = ordering;
        self
    }

    /// Handlers running at once across all partitions (default 64).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Records dispatched but not finished per partition before the
    /// partition is paused (default 5000). Resumed at three quarters. Memory is bounded
    /// by this times the assigned partitions times the record size.
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

    /// How long in-flight jobs may run after SIGTERM before they are cancelled
    /// (default 30 s). Keep it below your orchestrator's kill timeout.
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.settings.shutdown_grace = d;
        self
    }

    /// How long a revoke waits for in-flight jobs before giving the partition
    /// up anyway (default 15 s).
    pub fn revoke_timeout(mut self, d: Duration) -> Self {
        self.settings.revoke_timeout = d;
        self
    }

    /// How often finished work is committed (default 1 s). Shorter means
    /// fewer duplicates after a crash, at the cost of more commit traffic.
    pub fn commit_interval(mut self, d: Duration) -> Self {
        self.settings.commit_interval = d;
        self
    }

    /// Static group membership (`group.instance.id`): a member that restarts
    /// within the session timeout gets its partitions back without a
    /// rebalance of the others, which suits rolling deploys and crash loops.
    /// Defaults to `KJOB_INSTANCE_ID` when that is set. Use a stable,
    /// per-replica name (a StatefulSet pod name); two live processes must
    /// never share one. See [`membership`].
    pub fn static_member(mut self, instance_id: impl Into<String>) -> Self {
        self.static_member = Some(instance_id.into());
        self
    }

    /// Stops gracefully after `n` jobs were handled, for a supervisor to
    /// restart (see [`limits`]; also `KJOB_STOP_AFTER_JOBS`).
    pub fn stop_after_jobs(mut self, n: u64) -> Self {
        self.run_limits.jobs = Some(n);
        self
    }

    /// Stops gracefully once the process's resident memory exceeds `bytes`
    /// (see [`limits`]; also `KJOB_STOP_ABOVE_RSS`).
    pub fn stop_above_rss(mut self, bytes: u64) -> Self {
        self.run_limits.rss = Some(bytes);
        self
    }

    /// Stops gracefully after running for `d` (see [`limits`]; also
    /// `KJOB_STOP_AFTER`).
    pub fn stop_after(mut self, d: Duration) -> Self {
        self.run_limits.time = Some(d);
        self
    }

    /// The rebalance protocol (default: `KJOB_GROUP_PROTOCOL`, else
    /// [`GroupProtocol::Classic`]). A `group.protocol` set on the
    /// [`KafkaConfig`] is honoured too. See [`membership`] for what each
    /// costs on a deploy and on a crash.
    pub fn group_protocol(mut self, protocol: GroupProtocol) -> Self {
        self.protocol = Some(protocol);
        self
    }

    /// Whether the worker creates its missing retry-tier and DLQ topics at
    /// start, with the main topic's partition count (default true). Disable
    /// where topics are managed elsewhere: a missing one is then an error.
    pub fn create_topics(mut self, yes: bool) -> Self {
        self.create_topics = yes;
        self
    }

    /// Whether the worker also serves its routes' delay topics
    /// (`<topic>.delay.<bucket>`, see [`crate::delay`]), creating them at
    /// start when [`WorkerBuilder::create_topics`] allows, so that
    /// [`Producer::enqueue_in`] and [`Producer::enqueue_at`] work for its
    /// routes (default false: six more topics per route, consumed by the
    /// same consumer).
    pub fn delayed_jobs(mut self, yes: bool) -> Self {
        self.delayed_jobs = yes;
        self
    }

    /// Enqueues `make()` on `J`'s main topic at every tick of the cron
    /// expression `expr` (with seconds, UTC: `0 */5 * * * *` is every five
    /// minutes), once per tick across every worker of the group, whatever
    /// their number; see [`crate::schedule`] for leadership, ids and the
    /// catch-up policy ([`crate::schedule::CatchUp::Latest`] by default).
    pub fn schedule<J: Job>(
        self,
        name: &str,
        expr: &str,
        make: impl Fn() -> J + Send + Sync + 'static,
    ) -> Self {
        self.schedule_with(crate::schedule::Schedule::new(name, expr, make))
    }

    /// Adds a [`crate::schedule::Schedule`] configured in full (another
    /// topic, another catch-up policy).
    pub fn schedule_with(mut self, schedule: crate::schedule::Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Serves `/metrics` (Prometheus), `/healthz` and `/readyz` on `addr`
    /// while the worker runs (port 0 picks a free port; see
    /// [`WorkerStats::endpoint`]). Without it, metrics are no-ops.
    pub fn metrics_endpoint(mut self, addr: SocketAddr) -> Self {
        self.endpoint = Some(addr);
        self
    }

    /// Serves `routes` on the [`metrics_endpoint`](Self::metrics_endpoint)
    /// too, for any path other than `/metrics`, `/healthz` and `/readyz`
    /// (which keep answering as before). Meant for the operator dashboard
    /// (`kjob_ops::ui::Dashboard::router_on`), so a worker can show its
    /// routes and dead letters without a separate `kjob ui` process; the
    /// routes guard themselves. `build()` refuses it without an endpoint.
    #[cfg(feature = "metrics-http")]
    pub fn http_routes(mut self, routes: axum::Router) -> Self {
        self.http_routes = Some(routes);
        self
    }

    /// Also runs an outbox relay ([`crate::outbox::Relay`]) in this process,
    /// started with the worker and stopped when it stops, so a service that
    /// enqueues through the outbox needs no separate relay deployment.
    #[cfg(feature = "postgres")]
    pub fn outbox_relay(mut self, relay: crate::outbox::Relay) -> Self {
        self.outbox_relay = Some(relay);
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
        let metrics = match self.endpoint {
            Some(_) => Metrics::prometheus()?,
            None => Metrics::disabled(),
        };
        #[cfg(feature = "metrics-http")]
        if self.http_routes.is_some() && self.endpoint.is_none() {
            return Err(Error::InvalidSetting {
                name: "http_routes".into(),
                value: "a router".into(),
                reason: "they are served on the metrics endpoint; add .metrics_endpoint(addr)"
                    .into(),
            });
        }
        let (_, limits) = self.scheduler_settings();
        let priorities = self.topic_priorities(&routes.entries);
        let run_limits = self.run_limits.with_env()?;
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
        Ok(Worker {
            limits,
            priorities,
            run_limits,
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
            schedules: self.schedules,
            strict: strict_topics,
            stats: Arc::new(WorkerStats::default()),
            #[cfg(feature = "postgres")]
            outbox_relay: self.outbox_relay,
        })
    }

    /// The consumer group this builder was created for.
    pub fn group(&self) -> &str {
        &self.settings.group
    }

    /// The ordering mode and the scheduler limits this builder configures,
    /// shared by the worker and the test harness.
    pub(crate) fn scheduler_settings(&self) -> (OrderingMode, Limits) {
        (
            self.settings.ordering,
            Limits {
                concurrency: self.concurrency,
                max_in_flight: self.settings.max_in_flight_per_partition,
                commit_interval_ms: self.settings.commit_interval.as_millis() as i64,
            },
        )
    }

    /// Every consumed topic's priority: a route's tiers take its main
    /// topic's.
    pub(crate) fn topic_priorities(
        &self,
        routes: &HashMap<String, RouteEntry>,
    ) -> HashMap<String, Priority> {
        routes
            .iter()
            .map(|(topic, e)| (topic.clone(), e.priority))
            .collect()
    }

    /// Turns the registrations into routes decoding through `schemas`: the
    /// registry for a worker, an in-memory store for the test harness. One
    /// code path, so both route, classify and retry alike.
    pub(crate) fn build_routes(&self, schemas: Arc<dyn SchemaSource>) -> Result<Routes> {
        if self.routes.is_empty() {
            return Err(Error::NoHandlers);
        }
        let mut entries: HashMap<String, RouteEntry> = HashMap::new();
        let mut mains = Vec::new();
        let states = Arc::new(self.states.clone());
        let watchdog = Arc::new(watchdog::Watchdog::new(self.slow_attempt_warning));
        for Registration { topic, make, needs } in &self.routes {
            if let Some((_, name)) = needs.iter().find(|(id, _)| !states.contains(*id)) {
                return Err(Error::MissingState {
                    topic: topic.clone(),
                    state: name,
                });
            }
            if entries.contains_key(topic) {
                return Err(Error::DuplicateTopic {
                    topic: topic.clone(),
                });
            }
            let retry = self
                .retry_overrides
                .get(topic)
                .unwrap_or(&self.retry)
                .clone();
            retry.validate().map_err(|reason| Error::RetryPolicy {
                topic: topic.clone(),
                reason,
            })?;
            let retry = Arc::new(retry);
            let priority = self.priorities.get(topic).copied().unwrap_or_default();
            let mut layers = self.layers.clone();
            layers.extend(self.route_layers.get(topic).into_iter().flatten().cloned());
            let route = make(
                schemas.clone(),
                self.handler_timeout,
                states.clone(),
                &layers,
                watchdog.clone(),
            )?;
            for (i, tier) in retry.tier_topics(topic).into_iter().enumerate() {
                let entry = RouteEntry {
                    route: route.clone(),
                    main: topic.clone(),
                    tier: Some(i),
                    delay: None,
                    retry: retry.clone(),
                    priority,
                };
                if entries.insert(tier.clone(), entry).is_some() {
                    return Err(Error::DuplicateTopic { topic: tier });
                }
            }
            if self.delayed_jobs {
                for (i, delay) in crate::delay::delay_topics(topic).into_iter().enumerate() {
                    let entry = RouteEntry {
                        route: route.clone(),
                        main: topic.clone(),
                        tier: None,
                        delay: Some(i),
                        retry: retry.clone(),
                        priority,
                    };
                    if entries.insert(delay.clone(), entry).is_some() {
                        return Err(Error::DuplicateTopic { topic: delay });
                    }
                }
            }
            let entry = RouteEntry {
                route,
                main: topic.clone(),
                tier: None,
                delay: None,
                retry,
                priority,
            };
            if entries.insert(topic.clone(), entry).is_some() {
                return Err(Error::DuplicateTopic {
                    topic: topic.clone(),
                });
            }
            mains.push(topic.clone());
        }
        if let Some(unknown) = self.route_layers.keys().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "layer_for",
            });
        }
        if let Some(unknown) = self.strict.iter().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "strict_order",
            });
        }
        if let Some(topic) = self.strict.iter().next() {
            if self.settings.ordering == OrderingMode::Unordered {
                return Err(Error::InvalidSetting {
                    name: "ordering".into(),
                    value: "OrderingMode::Unordered".into(),
                    reason: format!(
                        "strict_order(\"{topic}\") keeps per-key order across retries, which \
                         unordered dispatch breaks before any retry; use OrderingMode::PerKey \
                         (the default) or PerPartition, or drop strict_order"
                    ),
                });
            }
        }
        if let Some(unknown) = self.priorities.keys().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "priority",
            });
        }
        if let Some(unknown) = self.retry_overrides.keys().find(|t| !mains.contains(t)) {
            return Err(Error::RetryPolicy {
                topic: unknown.clone(),
                reason: crate::retry::RetryPolicyError::NoSuchRoute,
            });
        }
        Ok(Routes {
            entries,
            mains,
            watchdog,
        })
    }
}

/// Routes by topic (main topics and their tiers).
pub(crate) struct Routes {
    pub entries: HashMap<String, RouteEntry>,
    pub mains: Vec<String>,
    /// The handlers that run for long, across routes.
    pub watchdog: Arc<watchdog::Watchdog>,
}

/// A configured worker. [`Worker::run`] blocks until SIGTERM/SIGINT;
/// [`Worker::run_until`] until a future of your choice completes.
pub struct Worker {
    limits: Limits,
    priorities: HashMap<String, Priority>,
    run_limits: limits::Limits,
    config: KafkaConfig,
    settings: Settings,
    codec: Arc<Codec>,
    routes: HashMap<String, RouteEntry>,
    mains: Vec<String>,
    watchdog: Arc<watchdog::Watchdog>,
    park: bool,
    static_member: Option<String>,
    protocol: GroupProtocol,
    create_topics: bool,
    schedules: Vec<crate::schedule::Schedule>,
    /// Main topics under strict order ([`WorkerBuilder::strict_order`]).
    strict: Vec<String>,
    stats: Arc<WorkerStats>,
    metrics: Metrics,
    endpoint: Option<SocketAddr>,
    #[cfg(feature = "metrics-http")]
    http_routes: Option<axum::Router>,
    #[cfg(feature = "postgres")]
    outbox_relay: Option<crate::outbox::Relay>,
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
            run_limits: limits::Limits::default(),
            create_topics: true,
            delayed_jobs: false,
            schedules: Vec::new(),
            retry: RetryPolicy::default(),
            retry_overrides: HashMap::new(),
            priorities: HashMap::new(),
            strict: Default::default(),
            endpoint: None,
            #[cfg(feature = "metrics-http")]
            http_routes: None,
            #[cfg(feature = "postgres")]
            outbox_relay: None,
        }
    }

    /// Live counters, readable while the worker runs.
    pub fn stats(&self) -> Arc<WorkerStats> {
        self.stats.clone()
    }

    /// Every route topic this worker consumes: main topics, their retry
    /// tiers and (with [`WorkerBuilder::delayed_jobs`]) their delay topics.
    /// With schedules it also subscribes to `<group>.schedules`.
    pub fn topics(&self) -> Vec<String> {
        let mut t: Vec<String> = self.routes.keys().cloned().collect();
        t.sort();
        t
    }

    /// Runs until SIGTERM or SIGINT, then shuts down gracefully.
    pub async fn run(self) -> Result<()> {
        self.run_until(shutdown_signal()).await
    }

    /// Runs until `stop` completes, then shuts down gracefully: stop fetching,
    /// finish in-flight jobs within the grace period, cancel the rest,
    /// commit, leave the group.
    pub async fn run_until<F: Future<Output = ()>>(
        #[allow(unused_mut)] mut self,
        stop: F,
    ) -> Result<()> {
        self.preflight().await?;
        let producer =
            Producer::with_codec(&self.config, self.codec.clone(), Duration::from_secs(30))?;
        let cancel = CancellationToken::new();
        let strict = (!self.strict.is_empty()).then(|| {
            let store = strict::KafkaStore {
                producer: producer.raw().clone(),
                config: self.config.clone(),
            };
            Arc::new(strict::Strict::new(
                self.strict.iter().cloned().collect(),
                Arc::new(store),
                self.stats.clone(),
                cancel.clone(),
            ))
        });
        let pipeline = Arc::new(Pipeline {
            routes: self
                .routes
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            group: self.settings.group.clone(),
            sink: Arc::new(producer),
            metrics: self.metrics.clone(),
            stats: self.stats.clone(),
            cancel: cancel.clone(),
            strict,
            clock: crate::clock::Clock::Wall,
            park: self.park,
        });
        let background = CancellationToken::new();
        let _stop_background = background.clone().drop_guard();
        #[cfg(feature = "postgres")]
        if let Some(relay) = self.outbox_relay.take() {
            let stop = background.clone().cancelled_owned();
            tokio::spawn(async move {
                if let Err(e) = relay.run_until(stop).await {
                    tracing::error!(error = %e, "the worker's outbox relay stopped");
                }
            });
        }
        if !self.schedules.is_empty() {
            let producer =
                Producer::with_codec(&self.config, self.codec.clone(), Duration::from_secs(30))?;
            tokio::spawn(crate::schedule::run_schedules(
                self.config.clone(),
                self.settings.group.clone(),
                producer,
                self.stats.clone(),
                self.schedules.clone(),
                background.clone(),
            ));
        }
        if let Some(addr) = self.endpoint {
            #[cfg(feature = "metrics-http")]
            let extra = self.http_routes.take();
            #[cfg(not(feature = "metrics-http"))]
            let extra = None;
            let bound = http::serve(
                addr,
                self.metrics.clone(),
                self.stats.clone(),
                extra,
                background.clone(),
            )
            .await?;
            let _ = self.stats.endpoint.set(bound);
            info!(%bound, "metrics endpoint listening");
            self.spawn_lag_refresh(background.clone());
        }
        // Dispatchers: one task per runtime thread, each running its share of
        // every `Run` batch concurrently. No task is spawned per record.
        let threads = tokio::runtime::Handle::current()
            .metrics()
            .num_workers()
            .max(1);
        let mut senders = Vec::with_capacity(threads);
        let mut receivers = Vec::with_capacity(threads);
        for _ in 0..threads {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            senders.push(tx);
            receivers.push(rx);
        }
        let limits = self.limits;
        let hub = Arc::new(poll::Hub::new(
            Scheduler::new(limits).with_priorities(self.priorities.clone()),
            senders,
        ));
        let dispatchers: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(me, rx)| tokio::spawn(dispatcher::run(pipeline.clone(), hub.clone(), me, rx)))
            .collect();
        let aborts: Vec<tokio::task::AbortHandle> =
            dispatchers.iter().map(|d| d.abort_handle()).collect();
        let context = poll::WorkerContext {
            hub,
            routes: self
                .routes
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            settings: self.settings.clone(),
            stats: self.stats.clone(),
            metrics: self.metrics.clone(),
            stopping: AtomicBool::new(false),
            close_gaps: AtomicBool::new(false),
            last_error: std::sync::Mutex::new(None),
            watchdog: self.watchdog.clone(),
        };
        let consumer = Arc::new(self.consumer(context)?);
        let mut topics = self.topics();
        if !self.schedules.is_empty() {
            // Its partition 0's owner is the group's schedule leader.
            topics.push(crate::schedule::leader_topic(&self.settings.group));
        }
        let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topic_refs)
            .map_err(|e| Error::kafka(format!("subscribing to {topics:?}"), e))?;
        info!(group = %self.settings.group, ?topics, protocol = self.protocol.as_str(), static_member = ?self.static_member, "worker started");

        let (closed_tx, mut closed_rx) =
            oneshot::channel::<std::result::Result<(), poll::FatalConsumerError>>();
        let thread_consumer = consumer.clone();
        let abandon_cancel = cancel.clone();
        std::thread::Builder::new()
            .name("kjob-poll".into())
            .spawn(move || {
                let consumer = thread_consumer;
                let outcome = poll::poll_loop(consumer.context(), &consumer, move || {
                    // End of the grace period: forwards give up, handlers
                    // still running are dropped; their records stay
                    // uncommitted and are re-delivered.
                    abandon_cancel.cancel();
                    for a in aborts {
                        a.abort();
                    }
                });
                // Dropping the consumer closes it: final revoke, leave group.
                // It happens here, off the async runtime, because a close can
                // block; the async side waits for it with a bound.
                consumer.unsubscribe();
                drop(consumer);
                let _ = closed_tx.send(outcome);
            })
            .map_err(|e| Error::Worker(format!("spawning the poll thread: {e}")))?;

        let watch = self.run_limits.watch(self.stats.clone());
        let mut fired = None;
        tokio::select! {
            _ = stop => {}
            limit = watch => {
                warn!(%limit, exit_code = limit.exit_code(), "worker limit reached; stopping gracefully so that a supervisor restarts the worker");
                fired = Some(limit);
            }
            ended = &mut closed_rx => {
                return Err(match ended {
                    Ok(Err(fatal)) => self.refused(fatal),
                    _ => Error::Worker("the poll thread ended unexpectedly".into()),
                });
            }
        }
        info!("stop requested");
        // Not ready from the moment shutdown begins.
        self.stats.ready.store(false, AtomicOrdering::Release);
        if fired.is_some() {
            // A planned stop: close the gaps so the restart repeats nothing.
            consumer
                .context()
                .close_gaps
                .store(true, AtomicOrdering::Release);
        }
        consumer
            .context()
            .stopping
            .store(true, AtomicOrdering::Release);
        drop(consumer);
        let bound = self.settings.shutdown_grace + Duration::from_secs(30);
        match tokio::time::timeout(bound, closed_rx).await {
            Ok(Ok(Err(fatal))) => Err(self.refused(fatal)),
            Ok(_) => {
                info!("worker stopped");
                match fired {
                    Some(limit) => Err(Error::LimitReached(limit)),
                    None => Ok(()),
                }
            }
            Err(_) => Err(Error::Worker(format!(
                "consumer did not close within {bound:?}; offsets up to the last commit are safe"
            ))),
        }
    }

    /// Turns a consumer error the cluster will not change its mind about
    /// into an error naming the credentials or the ACL to grant.
    fn refused(&self, fatal: poll::FatalConsumerError) -> Error {
        use rdkafka::types::RDKafkaErrorCode as C;
        let group = &self.settings.group;
        let (operation, resource, acl_args) = match fatal.code {
            C::GroupAuthorizationFailed => (
                "Read",
                format!("group `{group}`"),
                format!("--group {group}"),
            ),
            C::ClusterAuthorizationFailed => {
                ("ClusterAction", "the cluster".into(), "--cluster".into())
            }
            C::TopicAuthorizationFailed => {
                let topics = self.topics().join(" --topic ");
                (
                    "Read",
                    "one of its topics (see the broker's words)".into(),
                    format!("--topic {topics}"),
                )
            }
            C::SaslAuthenticationFailed | C::Authentication => {
                return Error::Authentication {
                    bootstrap: self.config.bootstrap_servers.clone(),
                    message: fatal.message,
                }
            }
            C::UnreleasedInstanceId => {
                return Error::InvalidSetting {
                    name: membership::INSTANCE_ID_ENV.into(),
                    value: self.static_member.clone().unwrap_or_default(),
                    reason: format!(
                        "another member of group `{group}` still holds this static-member id: \
                         a second live process with the same id, or (under KIP-848) a previous \
                         run that stopped without leaving, whose id the broker releases when its \
                         session (group.consumer.session.timeout.ms) expires. Give every live \
                         process its own id, or start again after the session timeout. \
                         librdkafka said: {}",
                        fatal.message
                    ),
                }
            }
            C::UnsupportedVersion | C::UnsupportedFeature
                if self.protocol == GroupProtocol::Consumer =>
            {
                return Error::InvalidSetting {
                    name: "group.protocol".into(),
                    value: "consumer".into(),
                    reason: format!(
                        "the brokers at {} do not serve KIP-848 consumer groups (Kafka 4.0 or \
                         newer, with `consumer` in `group.coordinator.rebalance.protocols`); \
                         set KJOB_GROUP_PROTOCOL=classic (or .group_protocol(GroupProtocol::Classic)) \
                         for older brokers. librdkafka said: {}",
                        self.config.bootstrap_servers, fatal.message
                    ),
                }
            }
            _ => {
                return Error::Worker(format!(
                    "the Kafka client stopped on a fatal error: {}",
                    fatal.message
                ))
            }
        };
        Error::not_authorized(&self.config, operation, resource, &acl_args, fatal.message)
    }

    /// Refreshes `kjob_consumer_lag` from Kafka (committed vs end offsets of
    /// every consumed topic) every two seconds, off the async threads, with
    /// one long-lived client.
    fn spawn_lag_refresh(&self, stop: CancellationToken) {
        let (config, group, topics) = (
            self.config.clone(),
            self.settings.group.clone(),
            self.topics(),
        );
        let snapshot = self.metrics.snapshot.clone();
        tokio::spawn(async move {
            let reader = match tokio::task::spawn_blocking(move || {
                crate::lag::LagReader::new(&config, &group)
            })
            .await
            {
                Ok(Ok(r)) => Arc::new(r),
                Ok(Err(e)) => {
                    warn!(error = %e, "no consumer-lag metrics: the lag client could not be created");
                    return;
                }
                Err(_) => return,
            };
            loop {
                let (r, t) = (reader.clone(), topics.clone());
                if let Ok(Ok(rows)) = tokio::task::spawn_blocking(move || r.read(&t)).await {
                    let mut snap = snapshot
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    snap.lag = rows
                        .iter()
                        .map(|r| ((r.topic.clone(), r.partition), r.lag()))
                        .collect();
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        });
    }

    /// Fails fast, with a clear message, if the registry is down or a main
    /// topic is missing; creates missing retry-tier and DLQ topics (with the
    /// main topic's partition count) when allowed, and warns about existing
    /// ones whose partition count differs.
    async fn preflight(&self) -> Result<()> {
        self.codec.ping().await?;
        if !self.schedules.is_empty() {
            self.schedule_topics().await?;
        }
        let mut wanted: Vec<(String, String)> = Vec::new(); // (topic, its main topic)
        for main in &self.mains {
            wanted.push((main.clone(), main.clone()));
            wanted.push((dlq_topic(main), main.clone()));
        }
        for (topic, entry) in &self.routes {
            if entry.tier.is_some() || entry.delay.is_some() {
                wanted.push((topic.clone(), entry.main.clone()));
            }
        }
        let names: Vec<String> = wanted.iter().map(|(t, _)| t.clone()).collect();
        let config = self.config.clone();
        let counts = tokio::task::spawn_blocking(move || partition_counts(&config, &names))
            .await
            .map_err(|e| Error::Worker(format!("metadata task failed: {e}")))??;
        let count_of: HashMap<&str, Option<usize>> = wanted
            .iter()
            .map(|(t, _)| t.as_str())
            .zip(counts.iter().copied())
            .collect();
        let mut missing = Vec::new();
        for (topic, main) in &wanted {
            let main_count = count_of.get(main.as_str()).copied().flatten();
            let Some(main_count) = main_count else {
                return Err(Error::MissingTopic {
                    topic: main.clone(),
                    bootstrap: self.config.bootstrap_servers.clone(),
                });
            };
            match count_of.get(topic.as_str()).copied().flatten() {
                Some(n) if n != main_count => warn!(
                    topic = %topic, partitions = n, main = %main, main_partitions = main_count,
                    "partition count differs from the main topic"
                ),
                Some(_) => {}
                None if self.create_topics => missing.push((topic.clone(), main_count as i32)),
                None => {
                    return Err(Error::MissingTopic {
                        topic: topic.clone(),
                        bootstrap: self.config.bootstrap_servers.clone(),
                    })
                }
            }
        }
        // A tier or DLQ must take whatever its main topic accepted, plus
        // kjob's headers; otherwise a large record could never be forwarded.
        let mains_of_missing: Vec<String> = {
            let mut m: Vec<String> = missing
                .iter()
                .filter_map(|(t, _)| wanted.iter().find(|(w, _)| w == t).map(|(_, m)| m.clone()))
                .collect();
            m.sort();
            m.dedup();
            m
        };
        let limits = crate::topics::max_message_bytes(&self.config, &mains_of_missing).await;
        let retention = crate::delay::CREATED_RETENTION.as_millis().to_string();
        for (main, limit) in mains_of_missing.iter().zip(limits) {
            let of_main: Vec<(String, i32)> = missing
                .iter()
                .filter(|(t, _)| wanted.iter().any(|(w, m)| w == t && m == main))
                .cloned()
                .collect();
            // Delay topics also get an explicit retention (the delay
            // producer checks it), whatever the broker's default.
            let (delays, topics): (Vec<_>, Vec<_>) = of_main
                .into_iter()
                .partition(|(t, _)| self.routes.get(t).is_some_and(|e| e.delay.is_some()));
            let sized =
                limit.map(|bytes| (bytes + crate::topics::FORWARD_HEADROOM_BYTES).to_string());
            let mut cfg: Vec<(&str, &str)> = Vec::new();
            if let Some(sized) = &sized {
                cfg.push(("max.message.bytes", sized));
            }
            match cfg.is_empty() {
                false => create_topics_with(&self.config, &topics, &cfg).await?,
                true => create_topics(&self.config, &topics).await?,
            }
            cfg.push(("retention.ms", &retention));
            create_topics_with(&self.config, &delays, &cfg).await?;
        }
        if !missing.is_empty() {
            let created: Vec<String> = missing.iter().map(|(t, _)| t.clone()).collect();
            crate::topics::wait_visible(&self.config, &created).await?;
        }
        self.strict_topics().await
    }

    /// For every strict-order route: the compacted `<main>.order` topic,
    /// created with the main topic's partition count when missing and
    /// allowed, and the same partition count on the main topic, its tiers
    /// and its order topic (partition *n* of each must be one member's).
    async fn strict_topics(&self) -> Result<()> {
        for main in &self.strict {
            let order = strict::order_topic(main);
            let mut names = vec![main.clone(), order.clone()];
            names.extend(
                self.routes
                    .iter()
                    .filter(|(_, e)| e.main == *main && e.tier.is_some())
                    .map(|(t, _)| t.clone()),
            );
            let config = self.config.clone();
            let query = names.clone();
            let counts = tokio::task::spawn_blocking(move || partition_counts(&config, &query))
                .await
                .map_err(|e| Error::Worker(format!("metadata task failed: {e}")))??;
            let Some(Some(main_count)) = counts.first().copied() else {
                return Err(Error::MissingTopic {
                    topic: main.clone(),
                    bootstrap: self.config.bootstrap_servers.clone(),
                });
            };
            for (topic, count) in names.iter().zip(&counts).skip(1) {
                match count {
                    Some(n) if *n != main_count => {
                        return Err(Error::InvalidSetting {
                            name: "strict_order".into(),
                            value: main.clone(),
                            reason: format!(
                                "`{topic}` has {n} partitions and `{main}` {main_count}; strict \
                                 order keeps a key's records on one partition number across \
                                 them, so they must match: recreate `{topic}` with \
                                 {main_count} partitions (or add partitions to it), or drop \
                                 strict_order"
                            ),
                        })
                    }
                    Some(_) => {}
                    None if topic == &order && self.create_topics => {
                        create_topics_with(
                            &self.config,
                            &[(order.clone(), main_count as i32)],
                            &[("cleanup.policy", "compact")],
                        )
                        .await?;
                        crate::topics::wait_visible(&self.config, std::slice::from_ref(&order))
                            .await?;
                    }
                    None => {
                        return Err(Error::MissingTopic {
                            topic: topic.clone(),
                            bootstrap: self.config.bootstrap_servers.clone(),
                        })
                    }
                }
            }
        }
        Ok(())
    }

    /// The schedule leader topic (one partition) and the compacted state
    /// topic (one partition), created when missing and allowed.
    async fn schedule_topics(&self) -> Result<()> {
        let group = &self.settings.group;
        let leader = crate::schedule::leader_topic(group);
        let state = crate::schedule::state_topic(group);
        let names = vec![leader.clone(), state.clone()];
        let config = self.config.clone();
        let counts = tokio::task::spawn_blocking(move || partition_counts(&config, &names))
            .await
            .map_err(|e| Error::Worker(format!("metadata task failed: {e}")))??;
        for ((topic, count), compact) in [leader, state].into_iter().zip(counts).zip([false, true])
        {
            if count.is_some() {
                continue;
            }
            if !self.create_topics {
                return Err(Error::MissingTopic {
                    topic,
                    bootstrap: self.config.bootstrap_servers.clone(),
                });
            }
            let cfg: &[(&str, &str)] = if compact {
                &[("cleanup.policy", "compact")]
            } else {
                &[]
            };
            create_topics_with(&self.config, &[(topic.clone(), 1)], cfg).await?;
            crate::topics::wait_visible(&self.config, &[topic]).await?;
        }
        Ok(())
    }

    fn consumer(&self, context: poll::WorkerContext) -> Result<BaseConsumer<poll::WorkerContext>> {
        let mut defaults = vec![
            ("group.id", self.settings.group.as_str()),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", "earliest"),
            ("enable.partition.eof", "false"),
            // A paused partition (backpressure, retry delay) is fetched again
            // only after the broker's long-poll returns; librdkafka's 500 ms
            // default made every resume cost half a second of idle time.
            ("fetch.wait.max.ms", "100"),
            // librdkafka 2.x postpones a partition's next fetch by this much
            // (default 1 s) once its local queue went over the threshold;
            // after kjob resumes a partition paused at the in-flight bound,
            // that left it idle for up to a second (no-op throughput 79k
            // jobs/s instead of 215k on the bench machine).
            ("fetch.queue.backoff.ms", "10"),
        ];
        defaults.extend(membership::consumer_settings(self.protocol));
        let mut cfg = self.config.client_config(&defaults);
        if let Some(id) = &self.static_member {
            cfg.set("group.instance.id", id);
        }
        cfg.create_with_context(context)
            .map_err(|e| Error::kafka("creating consumer", e))
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the worker");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
