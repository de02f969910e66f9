//! What users configure: [`WorkerBuilder`], its defaults, and `build()`,
//! which checks the configuration and turns each registered handler into
//! the route table ([`Routes`]) the worker and the test harness run.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::codec::{parse_contract, Codec, ReaderSchema, SchemaSource};
use crate::config::KafkaConfig;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::layers::{AttemptLayer, LayerFn};
use crate::retry::RetryPolicy;
use crate::telemetry::metrics::{Metrics, MetricsExporter, WorkerGauges};

use super::handler::{Handler, StateMap};
use super::route::{Route, RouteShared, TypedRoute};
use super::scheduler::Limits;
use super::state::{OrderingMode, RouteEntry, Settings, TopicRole};
use super::{limits, strict, watchdog, Priority, WorkerStats};
#[cfg(doc)]
use super::{Ext, State};
use crate::membership::{self, GroupProtocol};
#[cfg(doc)]
use crate::producer::Producer;

/// Builds a route once the codec, timeout, state and layers are known (at
/// `build()`).
type RouteFactory = Box<
    dyn Fn(
            Arc<dyn SchemaSource>,
            Option<Duration>,
            Arc<StateMap>,
            &[LayerFn],
            RouteShared,
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
    delayed_routes: std::collections::BTreeSet<String>,
    shared_tiers: Option<super::SharedTiers>,
    dlq_partitions: Option<usize>,
    schedules: Vec<crate::schedule::Schedule>,
    batches: Option<String>,
    batch_callbacks: Vec<&'static str>,
    retry: RetryPolicy,
    retry_overrides: HashMap<String, RetryPolicy>,
    priorities: HashMap<String, Priority>,
    strict: std::collections::BTreeSet<String>,
    debounce: HashMap<String, Duration>,
    fair: std::collections::BTreeMap<String, super::Fairness>,
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
                Ok(Arc::new(TypedRoute::<J, _, M>::new(
                    handler.clone(),
                    reader,
                    schemas,
                    timeout,
                    states,
                    layers,
                    shared,
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
    /// [`Priority`].
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

    /// Share the handler slots of the route on main topic `topic` among
    /// its tenants, by weight, with an optional cap per tenant: see
    /// [`Fairness`](super::Fairness). Its retry tiers share it.
    pub fn fair(mut self, topic: &str, fairness: super::Fairness) -> Self {
        self.fair.insert(topic.to_string(), fairness);
        self
    }

    /// [`WorkerBuilder::fair`] by the `kjob-tenant` header, every tenant
    /// weighing the same.
    pub fn fair_by_tenant(self, topic: &str) -> Self {
        self.fair(topic, super::Fairness::by_tenant())
    }

    /// The fair routes for the scheduler: each with its topics (main and
    /// tiers) and settings.
    pub(crate) fn topic_fairness(
        &self,
        routes: &HashMap<String, RouteEntry>,
    ) -> Vec<(Vec<String>, super::scheduler::FairSpec)> {
        self.fair
            .iter()
            .map(|(main, f)| {
                let mut topics: Vec<String> = routes
                    .iter()
                    .filter(|(_, e)| e.main == *main)
                    .map(|(t, _)| t.clone())
                    .collect();
                topics.sort();
                (topics, f.spec(main))
            })
            .collect()
    }

    /// Debounce the route on main topic `topic`: of several jobs with the
    /// same key written within `window` of each other, only the newest
    /// runs; the others finish as superseded, without a handler call. Each
    /// job waits `window` after it was written before it may run (parked,
    /// holding no handler slot), so a burst of changes to one record costs
    /// one handler call. For refreshes and syncs whose newest job makes the
    /// older ones moot; not for jobs that each carry their own effect.
    /// Keyless records and retries are not debounced. Not with
    /// [`WorkerBuilder::strict_order`] on the same route. See the
    /// `debounce` module docs for what it keeps across a crash.
    pub fn debounce(mut self, topic: &str, window: Duration) -> Self {
        self.debounce.insert(topic.to_string(), window);
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
    /// never share one. See the book's chapter on deploys and rebalances.
    pub fn static_member(mut self, instance_id: impl Into<String>) -> Self {
        self.static_member = Some(instance_id.into());
        self
    }

    /// Stops gracefully after `n` jobs were handled, for a supervisor to
    /// restart (see the book's chapter on limits; also `KJOB_STOP_AFTER_JOBS`).
    pub fn stop_after_jobs(mut self, n: u64) -> Self {
        self.run_limits.jobs = Some(n);
        self
    }

    /// Stops gracefully once the process's resident memory exceeds `bytes`
    /// (see the book's chapter on limits; also `KJOB_STOP_ABOVE_RSS`).
    pub fn stop_above_rss(mut self, bytes: u64) -> Self {
        self.run_limits.rss = Some(bytes);
        self
    }

    /// Stops gracefully after running for `d` (see the book's chapter on limits; also
    /// `KJOB_STOP_AFTER`).
    pub fn stop_after(mut self, d: Duration) -> Self {
        self.run_limits.time = Some(d);
        self
    }

    /// The rebalance protocol (default: `KJOB_GROUP_PROTOCOL`, else
    /// [`GroupProtocol::Classic`]). A `group.protocol` set on the
    /// [`KafkaConfig`] is honoured too. See the book's chapter on deploys and rebalances for what each
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
    /// routes (default false: seven more topics per route, consumed by the
    /// same consumer).
    pub fn delayed_jobs(mut self, yes: bool) -> Self {
        self.delayed_jobs = yes;
        self
    }

    /// [`delayed_jobs`](Self::delayed_jobs) for the route on `topic` alone:
    /// only the routes that delay jobs get the seven delay topics (times the
    /// main topic's partitions), the others none. `build()` refuses a topic
    /// that is not one of the worker's routes.
    pub fn delayed_jobs_on(mut self, topic: &str) -> Self {
        self.delayed_routes.insert(topic.to_string());
        self
    }

    /// Retry tiers shared by the worker's routes instead of a set per
    /// route: one topic per distinct tier delay, `<group>.retry.<delay>`
    /// (say `mailer.retry.30s`), where per route it would be
    /// `<topic>.retry.<delay>` for every route. A route of 12 partitions
    /// with three tiers costs 36 tier partitions per route; shared, the
    /// three tiers cost 36 for all routes together. Each record names its
    /// route (`kjob-route`), so retry policies, metrics and DLQs stay per
    /// route; routes whose policies have the same delay share that tier,
    /// and a tier still releases its records in arrival order, since all
    /// of them wait the same delay. Routes under
    /// [`strict_order`](Self::strict_order) or [`fair`](Self::fair) keep
    /// tiers of their own (strict order needs a key on one partition number
    /// across the main topic and its tiers; fairness counts a route's
    /// tenants across its topics). Per-route tiers stay the default: they
    /// isolate one route's retry storm from another's, at the partition
    /// cost above.
    pub fn shared_retry_tiers(self) -> Self {
        self.shared_retry_tiers_with(super::SharedTiers::default())
    }

    /// [`shared_retry_tiers`](Self::shared_retry_tiers) with a namespace
    /// other than the group (workers of several groups sharing one set, or
    /// a name that outlives a group rename) or a partition count of its own.
    pub fn shared_retry_tiers_with(mut self, tiers: super::SharedTiers) -> Self {
        self.shared_tiers = Some(tiers);
        self
    }

    /// Creates a missing DLQ (`<topic>.dlq`) with `n` partitions, at least
    /// one, instead of its main topic's count. Dead letters are few and read
    /// by operators, not by a group of workers, so one to three partitions
    /// serve them; with 50 routes of 12 partitions that is 50 to 150 DLQ
    /// partitions instead of 600. A dead letter's partition is chosen by
    /// its key, so a key's dead letters stay in order. An existing DLQ is
    /// used as it is.
    pub fn dlq_partitions(mut self, n: usize) -> Self {
        self.dlq_partitions = Some(n.max(1));
        self
    }

    /// Takes part in batches ([`crate::batch`]) on the batch topic
    /// [`crate::batch::DEFAULT_TOPIC`]: a finished job of a batch is
    /// recorded there before its offset is committed, and the worker joins
    /// the coordinators that fold the batches and fire their callbacks.
    /// Creates the batch topic and its state topic when missing (and
    /// [`create_topics`](Self::create_topics) allows). Every worker that
    /// runs jobs enqueued into a batch needs it: without it, a job's
    /// completion is not counted and its batch never completes.
    pub fn batches(self) -> Self {
        self.batches_on(crate::batch::DEFAULT_TOPIC)
    }

    /// [`batches`](Self::batches) on another batch topic (a namespace of
    /// its own; producers name it with [`crate::batch::Batch::topic`]).
    pub fn batches_on(mut self, topic: &str) -> Self {
        self.batches = Some(topic.to_string());
        self
    }

    /// Declares `J` as a batch callback this worker runs: `build()` fails
    /// if no route of the worker handles `J`, rather than callbacks
    /// waiting on a topic nobody reads.
    pub fn batch_callback<J: Job>(mut self) -> Self {
        self.batch_callbacks.push(J::NAME);
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

    /// Records this worker's metrics into `exporter`, shared with other
    /// workers or an outbox relay of the process
    /// ([`Relay::metrics_exporter`](crate::outbox::Relay::metrics_exporter)),
    /// so one `/metrics` shows them all: the one with a
    /// [`metrics_endpoint`](Self::metrics_endpoint) serves it, or your own
    /// server does ([`MetricsExporter::render`]). The worker's gauges carry
    /// its `group`, so two workers' values stay apart.
    pub fn metrics_exporter(mut self, exporter: MetricsExporter) -> Self {
        self.exporter = Some(exporter);
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
        let (_, limits) = self.scheduler_settings();
        let priorities = self.topic_priorities(&routes.entries);
        let fairness = self.topic_fairness(&routes.entries);
        let turns = self.topic_turns(&routes.entries);
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
        for name in &self.batch_callbacks {
            if !routes.entries.values().any(|e| e.route.job_name() == *name) {
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

    /// Which route each consumed topic's jobs belong to, so that the
    /// routes of one priority level take turns for slots: a route's own
    /// tiers and buckets are its own, a shared one's records name theirs.
    pub(crate) fn topic_turns(
        &self,
        routes: &HashMap<String, RouteEntry>,
    ) -> super::scheduler::Turns {
        let mut mains: Vec<&str> = routes.values().map(|e| e.main.as_str()).collect();
        mains.sort_unstable();
        mains.dedup();
        let mut turns = super::scheduler::Turns::default();
        for (topic, e) in routes {
            if e.sharers.is_some() {
                turns.shared.insert(topic.clone());
            } else if let Ok(i) = mains.binary_search(&e.main.as_str()) {
                let i = u16::try_from(i).unwrap_or(u16::MAX);
                turns.own.insert(topic.clone(), i);
            }
        }
        turns
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
        // Shared tier topic -> main topic -> that route's entry for it.
        let mut shared: std::collections::BTreeMap<
            String,
            rustc_hash::FxHashMap<String, RouteEntry>,
        > = Default::default();
        let mut mains = Vec::new();
        let states = Arc::new(self.states.clone());
        let watchdog = Arc::new(watchdog::Watchdog::new(self.slow_attempt_warning));
        let gauges = Arc::new(WorkerGauges::default());
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
            let delays = self.delayed_jobs || self.delayed_routes.contains(topic);
            let fair: Option<Arc<str>> = self.fair.get(topic).map(|f| Arc::from(f.header.as_str()));
            let mut layers = self.layers.clone();
            layers.extend(self.route_layers.get(topic).into_iter().flatten().cloned());
            let route = make(
                schemas.clone(),
                self.handler_timeout,
                states.clone(),
                &layers,
                RouteShared {
                    watchdog: watchdog.clone(),
                    gauges: gauges.clone(),
                },
            )?;
            let shares = self
                .shared_tiers
                .as_ref()
                .filter(|_| !self.strict.contains(topic) && !self.fair.contains_key(topic));
            let tiers_at: Arc<str> = match shares {
                Some(t) => Arc::from(t.namespace_for(&self.settings.group)),
                None => Arc::from(topic.as_str()),
            };
            let shares_delays = shares.is_some_and(|t| t.delays) && delays;
            let delays_at: Arc<str> = match shares_delays {
                true => tiers_at.clone(),
                false => Arc::from(topic.as_str()),
            };
            for (i, tier) in retry.tier_topics(&tiers_at).into_iter().enumerate() {
                let entry = RouteEntry {
                    route: route.clone(),
                    main: topic.clone(),
                    role: TopicRole::Tier(i),
                    retry: retry.clone(),
                    priority,
                    delays,
                    fair: fair.clone(),
                    tiers_at: tiers_at.clone(),
                    delays_at: delays_at.clone(),
                    sharers: None,
                };
                if shares.is_some() {
                    shared.entry(tier).or_default().insert(topic.clone(), entry);
                } else if entries.insert(tier.clone(), entry).is_some() {
                    return Err(Error::DuplicateTopic { topic: tier });
                }
            }
            if delays {
                for (i, delay) in crate::delay::delay_topics(&delays_at)
                    .into_iter()
                    .enumerate()
                {
                    let entry = RouteEntry {
                        route: route.clone(),
                        main: topic.clone(),
                        role: TopicRole::Delay(i),
                        retry: retry.clone(),
                        priority,
                        delays,
                        fair: fair.clone(),
                        tiers_at: tiers_at.clone(),
                        delays_at: delays_at.clone(),
                        sharers: None,
                    };
                    if shares_delays {
                        shared
                            .entry(delay)
                            .or_default()
                            .insert(topic.clone(), entry);
                    } else if entries.insert(delay.clone(), entry).is_some() {
                        return Err(Error::DuplicateTopic { topic: delay });
                    }
                }
            }
            let entry = RouteEntry {
                route,
                main: topic.clone(),
                role: TopicRole::Main,
                retry,
                priority,
                delays,
                fair: fair.clone(),
                tiers_at,
                delays_at,
                sharers: None,
            };
            if entries.insert(topic.clone(), entry).is_some() {
                return Err(Error::DuplicateTopic {
                    topic: topic.clone(),
                });
            }
            mains.push(topic.clone());
        }
        // A shared topic's own entry stands for all its routes where the
        // topic is what counts (subscription, creation, holds, priority);
        // each record runs under its route's entry (RouteEntry::for_record).
        // It is read at its routes' priority when they all have the same,
        // else at Normal: a priority is a partition's, not a record's, so a
        // Low route's retry storm in a tier read at High would compete with
        // the High routes' main topics, the outage spreading to the work
        // the priorities protect.
        for (tier, sharers) in shared {
            let Some(first) = sharers.values().min_by(|a, b| a.main.cmp(&b.main)).cloned() else {
                continue;
            };
            let priority = match first.priority {
                p if sharers.values().all(|e| e.priority == p) => p,
                _ => Priority::Normal,
            };
            let entry = RouteEntry {
                priority,
                sharers: Some(Arc::new(sharers)),
                ..first
            };
            if entries.insert(tier.clone(), entry).is_some() {
                return Err(Error::DuplicateTopic { topic: tier });
            }
        }
        if let Some(unknown) = self.route_layers.keys().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "layer_for",
            });
        }
        if let Some(unknown) = self.delayed_routes.iter().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "delayed_jobs_on",
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
        if let Some(unknown) = self.fair.keys().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "fair",
            });
        }
        if let Some(unknown) = self.debounce.keys().find(|t| !mains.contains(t)) {
            return Err(Error::NoSuchRoute {
                topic: unknown.clone(),
                setting: "debounce",
            });
        }
        if let Some(topic) = self.debounce.keys().find(|t| self.strict.contains(*t)) {
            return Err(Error::InvalidSetting {
                name: "debounce".into(),
                value: topic.clone(),
                reason: format!(
                    "strict_order(\"{topic}\") runs every job of a key in order, and debounce skips \
                     all but the newest: choose one for this route"
                ),
            });
        }
        if let Some((topic, _)) = self.debounce.iter().find(|(_, w)| w.is_zero()) {
            return Err(Error::InvalidSetting {
                name: "debounce".into(),
                value: format!("{topic}: 0s"),
                reason: "a debounce window must be longer than zero: the jobs of a key written within it of each other are folded into the newest".into(),
            });
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
            gauges,
        })
    }
}

/// Routes by topic (main topics and their tiers).
pub(crate) struct Routes {
    pub entries: HashMap<String, RouteEntry>,
    pub mains: Vec<String>,
    /// The handlers that run for long, across routes.
    pub watchdog: Arc<watchdog::Watchdog>,
    /// What the routes' waits count (registry, breakers), for `/metrics`.
    pub gauges: Arc<WorkerGauges>,
}

/// A configured worker. [`Worker::run`] blocks until SIGTERM/SIGINT;
/// [`Worker::run_until`] until a future of your choice completes.
pub struct Worker {
    pub(super) limits: Limits,
    pub(super) priorities: HashMap<String, Priority>,
    /// The fair routes' topics and settings (`WorkerBuilder::fair`).
    pub(super) fairness: Vec<(Vec<String>, super::scheduler::FairSpec)>,
    /// Which route each topic's jobs take their turn as.
    pub(super) turns: super::scheduler::Turns,
    pub(super) run_limits: limits::Limits,
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
            run_limits: limits::Limits::default(),
            create_topics: true,
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
