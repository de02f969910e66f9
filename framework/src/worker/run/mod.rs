//! The wiring: [`Worker::run_until`] starts the pipeline, the dispatcher
//! tasks, the poll thread and the background tasks (metrics endpoint, lag,
//! schedules, outbox relay), and shuts them down in order.
//!
//! Not a step of its own: it wires the rooms of steps 2 to 10 together.
//! **Enters:** a built [`Worker`]. **Leaves:** its exit, an error that
//! names the fix when the cluster refused the consumer (`refusal`).

mod refusal;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::producer::Producer;
use crate::telemetry::http;

use crate::membership;
use crate::worker::pipeline::Pipeline;
use crate::worker::scheduler::Scheduler;
use crate::worker::{
    before::strict, dispatch::dispatcher, dispatch::hub, intake::poll, Worker, WorkerStats,
};

/// What the poll thread's context takes from the parts started before it.
struct Polling {
    hub: Arc<hub::Hub>,
    wake: Arc<crate::worker::wake::Wake>,
    in_force: Arc<crate::control::InForce>,
    debounce: Option<Arc<crate::worker::before::debounce::Debounce>>,
    batches: Option<Arc<crate::batch::recorder::Recorder>>,
}

impl Worker {
    /// Live counters, readable while the worker runs.
    pub fn stats(&self) -> Arc<WorkerStats> {
        self.stats.clone()
    }

    /// Every route topic this worker consumes: main topics, their retry
    /// tiers and (with `WorkerBuilder::delayed_jobs`) their delay topics.
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
    ///
    /// With `KJOB_DESCRIBE=json` it prints the worker's [`Worker::deployment`]
    /// on stdout instead and returns at once, without connecting: how a
    /// deploy pipeline learns what topics and ACLs a binary needs.
    pub async fn run_until<F: Future<Output = ()>>(mut self, stop: F) -> Result<()> {
        if crate::deployment::describe_requested()? {
            println!("{}", self.deployment().to_json());
            return Ok(());
        }
        // After the description, whose stdout must stay pure JSON.
        crate::telemetry::default_logs();
        // One listing of the cluster's topics serves both adoptions when a
        // route shares its tiers (it needs one anyway); otherwise the delay
        // topics are asked for by name.
        self.create_missing_mains().await?;
        let listed = self.list_for_adoption().await?;
        self.adopt_delay_topics(listed.as_deref()).await?;
        self.adopt_route_tiers(listed.as_deref()).await?;
        self.preflight().await?;
        // `cancel` ends forwards at the end of the grace period; `background`
        // the tasks beside the pipeline, when this run ends however it ends.
        let cancel = CancellationToken::new();
        let background = CancellationToken::new();
        let _stop_background = background.clone().drop_guard();
        let (pipeline, in_force, debounce) = self.start_pipeline(&cancel, &background)?;
        self.start_background(&background).await?;
        let (hub, wake, aborts) = self.start_dispatch(&pipeline);
        self.start_beat(&hub, &background)?;
        // What is paused for the group, read before the first fetch and
        // followed until this run ends (`following` is dropped with it).
        let following = {
            let (config, group) = (self.config.clone(), self.settings.group.clone());
            tokio::task::spawn_blocking(move || crate::control::follow(&config, &group, in_force))
                .await
                .map_err(|e| Error::Task {
                    what: "reading the group's controls",
                    reason: e.to_string(),
                })??
        };
        let parts = Polling {
            hub,
            wake,
            in_force: following.in_force.clone(),
            debounce,
            batches: pipeline.batches.clone(),
        };
        let (consumer, closed_rx) = self.start_poll_thread(parts, cancel, aborts)?;
        self.stop_when(stop, consumer, closed_rx).await
    }

    /// The pipeline every attempt runs (steps 6 to 9), with what it shares:
    /// strict order's chains, the operators' pauses, the debounce windows
    /// and, for batches, the recorder (and the coordinator, started here).
    #[allow(clippy::type_complexity)]
    fn start_pipeline(
        &self,
        cancel: &CancellationToken,
        background: &CancellationToken,
    ) -> Result<(
        Arc<Pipeline>,
        Arc<crate::control::InForce>,
        Option<Arc<crate::worker::before::debounce::Debounce>>,
    )> {
        let producer =
            Producer::with_codec(&self.config, self.codec.clone(), Duration::from_secs(30))?;
        let strict = (!self.strict.is_empty()).then(|| {
            let store = strict::KafkaStore {
                producer: producer.raw().clone(),
                config: self.config.clone(),
                group: self.settings.group.clone(),
            };
            Arc::new(strict::Strict::new(
                self.strict.iter().cloned().collect(),
                Arc::new(store),
                self.stats.clone(),
                cancel.clone(),
            ))
        });
        let mut pipeline = Pipeline::new(
            self.routes
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            self.settings.group.clone(),
            Arc::new(producer),
            self.metrics.clone(),
            self.stats.clone(),
            cancel.clone(),
            strict,
            crate::clock::Clock::Wall,
        );
        pipeline.park = self.park;
        // Filled by the control tail started below, before the first fetch.
        let in_force = Arc::new(crate::control::InForce::default());
        pipeline.in_force = Some(in_force.clone());
        let debounce =
            crate::worker::before::debounce::Debounce::new(self.debounce.clone()).map(Arc::new);
        pipeline.debounce = debounce.clone();
        pipeline.server =
            crate::telemetry::spans::server_attributes(&self.config.bootstrap_servers);
        if let Some(topic) = &self.batches {
            let producer =
                Producer::with_codec(&self.config, self.codec.clone(), Duration::from_secs(30))?;
            pipeline.batches = Some(Arc::new(crate::batch::recorder::Recorder::start(
                producer.clone(),
                topic.clone(),
            )));
            tokio::spawn(crate::batch::coordinator::run(
                self.config.clone(),
                self.group_settings(),
                topic.clone(),
                producer,
                self.metrics.clone(),
                background.clone(),
            ));
        }
        Ok((Arc::new(pipeline), in_force, debounce))
    }

    /// The tasks beside the pipeline: the outbox relay, the schedules and
    /// the metrics endpoint with its lag refresh.
    async fn start_background(&mut self, background: &CancellationToken) -> Result<()> {
        #[cfg(feature = "postgres")]
        if let Some(mut relay) = self.outbox_relay.take() {
            // One endpoint per process: a relay without its own records
            // into the worker's exporter.
            if self.metrics.exporter().is_enabled() && !relay.has_metrics_endpoint() {
                relay = relay.metrics_exporter(self.metrics.exporter().clone());
            }
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
                self.metrics.clone(),
                self.schedules.clone(),
                background.clone(),
            ));
        }
        if let Some(addr) = self.endpoint {
            #[cfg(feature = "metrics-http")]
            let extra = self.http_routes.take();
            #[cfg(not(feature = "metrics-http"))]
            let extra = None;
            let stats = self.stats.clone();
            let bound = http::serve(
                addr,
                self.metrics.exporter().clone(),
                Arc::new(move || stats.ready.load(AtomicOrdering::Acquire)),
                extra,
                background.clone(),
            )
            .await?;
            let _ = self.stats.endpoint.set(bound);
            info!(%bound, "metrics endpoint listening");
            self.spawn_lag_refresh(background.clone());
        }
        Ok(())
    }

    /// The hub (the scheduler behind one lock) and the dispatcher tasks,
    /// with the handles that abort them at the end of the grace period.
    fn start_dispatch(
        &self,
        pipeline: &Arc<Pipeline>,
    ) -> (
        Arc<hub::Hub>,
        Arc<crate::worker::wake::Wake>,
        Vec<tokio::task::AbortHandle>,
    ) {
        // Dispatchers: one task per runtime thread but one, each running its
        // share of every `Run` batch concurrently. No task is spawned per
        // record. The thread left over is for the poll thread and
        // librdkafka's broker threads, which are busy whenever the
        // dispatchers are: on 2 cores, two dispatchers beside them made
        // four busy threads on two cores, and one dispatcher did the same
        // work with less CPU per job and more jobs/s (CHANGELOG.md's benchmark history,
        // issue 29's third step).
        let threads = dispatcher::count(tokio::runtime::Handle::current().metrics().num_workers());
        let mut senders = Vec::with_capacity(threads);
        let mut receivers = Vec::with_capacity(threads);
        for _ in 0..threads {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            senders.push(tx);
            receivers.push(rx);
        }
        let limits = self.limits;
        // The poll thread's wake-up: its queues' callbacks and the hub
        // (completions that leave it a consumer action) both use it.
        let wake: Arc<crate::worker::wake::Wake> = Default::default();
        let hub = Arc::new(hub::Hub::new(
            Scheduler::new(limits)
                .with_priorities(self.priorities.clone())
                .with_fairness(self.fairness.clone())
                .with_turns(self.turns.clone()),
            senders,
            wake.clone(),
        ));
        let dispatchers: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(me, rx)| tokio::spawn(dispatcher::run(pipeline.clone(), hub.clone(), me, rx)))
            .collect();
        let aborts: Vec<tokio::task::AbortHandle> =
            dispatchers.iter().map(|d| d.abort_handle()).collect();
        (hub, wake, aborts)
    }

    /// The heartbeat on the control topic, for the dashboard's workers page.
    fn start_beat(&self, hub: &Arc<hub::Hub>, background: &CancellationToken) -> Result<()> {
        // A heartbeat on the control topic for the dashboard's workers page.
        {
            let producer =
                Producer::with_codec(&self.config, self.codec.clone(), Duration::from_secs(30))?;
            let busy_hub = hub.clone();
            let source = crate::control::BeatSource {
                group: self.settings.group.clone(),
                client_id: crate::config::default_client_id(&self.settings.group),
                slots: self.limits.concurrency,
                stats: self.stats.clone(),
                busy: Box::new(move || busy_hub.lock().sched.running()),
                tenants: {
                    let hub = hub.clone();
                    Box::new(move || {
                        let all = hub.lock().sched.tenants();
                        crate::telemetry::metrics::top_tenants(all)
                            .into_iter()
                            .map(
                                |(topic, tenant, ready, running)| crate::control::TenantLoad {
                                    topic,
                                    tenant,
                                    ready,
                                    running,
                                },
                            )
                            .collect()
                    })
                },
                durations: self.metrics.durations.clone(),
                jobs: self
                    .routes
                    .iter()
                    .filter(|(topic, e)| **topic == e.main)
                    .map(|(topic, e)| (topic.clone(), e.handler.job_name()))
                    .collect(),
            };
            tokio::spawn(crate::control::beat(source, producer, background.clone()));
        }
        Ok(())
    }

    /// The consumer, subscribed, and the poll thread that owns it; the
    /// receiver says when the thread closed it, and how.
    #[allow(clippy::type_complexity)]
    fn start_poll_thread(
        &self,
        parts: Polling,
        cancel: CancellationToken,
        aborts: Vec<tokio::task::AbortHandle>,
    ) -> Result<(
        Arc<BaseConsumer<poll::WorkerContext>>,
        oneshot::Receiver<std::result::Result<(), poll::FatalConsumerError>>,
    )> {
        let Polling {
            hub,
            wake,
            in_force,
            debounce,
            batches,
        } = parts;
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
            batches,
            in_force: Some(in_force),
            debounce,
            held: std::sync::Mutex::new(Default::default()),
            commit_tag: poll::commit_tag(),
            assignments: Default::default(),
            split_reading: AtomicBool::new(false),
            wake: wake.clone(),
        };
        let mut consumer = self.consumer(context)?;
        // The poll thread parks while it waits for any of its queues.
        consumer.set_nonempty_callback(move || wake.notify());
        let consumer = Arc::new(consumer);
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

        let (closed_tx, closed_rx) =
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
            .map_err(|e| Error::PollThread {
                reason: e.to_string(),
            })?;

        Ok((consumer, closed_rx))
    }

    /// Waits for `stop`, a limit or the poll thread's end, then shuts down
    /// in order: not ready, stop fetching, and wait for the poll thread to
    /// close the consumer within the grace period and a bound.
    async fn stop_when<F: Future<Output = ()>>(
        &self,
        stop: F,
        consumer: Arc<BaseConsumer<poll::WorkerContext>>,
        mut closed_rx: oneshot::Receiver<std::result::Result<(), poll::FatalConsumerError>>,
    ) -> Result<()> {
        let limits = self.stop_limits;
        let planned = |limit: &crate::error::StopLimit| limits.planned(limit);
        let watch = self.stop_limits.watch(self.stats.clone());
        let mut fired = None;
        tokio::select! {
            _ = stop => {}
            limit = watch => {
                match planned(&limit) {
                    // A run of N jobs the program asked for ends as planned.
                    true => info!(%limit, "job limit reached; stopping gracefully"),
                    false => warn!(%limit, exit_code = limit.exit_code(), "worker limit reached; stopping gracefully so that a supervisor restarts the worker"),
                }
                fired = Some(limit);
            }
            ended = &mut closed_rx => {
                return Err(match ended {
                    Ok(Err(fatal)) => self.refused(fatal),
                    _ => Error::PollThreadEnded,
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
                    Some(limit) if !planned(&limit) => Err(Error::LimitReached(limit)),
                    _ => Ok(()),
                }
            }
            Err(_) => Err(Error::CloseTimeout { bound }),
        }
    }

    /// Refreshes `kjob_consumer_lag` from Kafka (committed vs end offsets of
    /// the partitions this member owns) every two seconds, off the async threads, with
    /// one long-lived client.
    fn spawn_lag_refresh(&self, stop: CancellationToken) {
        let (config, group, topics) = (
            self.config.clone(),
            self.settings.group.clone(),
            self.topics(),
        );
        let snapshot = self.metrics.snapshot.clone();
        let stats = self.stats.clone();
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
                let read = tokio::task::spawn_blocking(move || r.read(&t)).await;
                // Only the partitions this member owns: every replica reads
                // the whole group's lag, and `sum()` over the replicas must
                // count each partition once. A failed read (a timeout on a
                // busy broker) keeps the last values of the partitions still
                // owned, never those of partitions moved to another member.
                let owned: std::collections::HashSet<(String, i32)> =
                    stats.assignment().into_iter().collect();
                {
                    let mut snap = snapshot
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    match read {
                        Ok(Ok(rows)) => {
                            snap.lag = rows
                                .iter()
                                .map(|r| ((r.topic.clone(), r.partition), r.lag()))
                                .filter(|(tp, _)| owned.contains(tp))
                                .collect();
                        }
                        _ => snap.lag.retain(|tp, _| owned.contains(tp)),
                    }
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        });
    }

    /// How this worker's consumers join their groups: the worker's own and
    /// the batch coordinator's (`crate::membership`).
    pub(super) fn group_settings(&self) -> membership::GroupSettings {
        membership::GroupSettings {
            protocol: self.protocol,
            instance_id: self.static_member.clone(),
        }
    }

    /// How long the broker may hold a fetch that found nothing new. A
    /// partition resumed (after backpressure, a retry delay, or a fair or
    /// priority route reading past a flood at its in-flight bound) is
    /// fetched again only once the fetch in flight returns, and while the
    /// partitions in that fetch are idle (tiers, quiet topics) it returns
    /// after this wait: librdkafka's 500 ms made each resume cost half a
    /// second. 100 ms by default; 20 ms for a worker with a fair route or
    /// a priority, whose isolated traffic otherwise waits in 100 ms steps
    /// behind a flood (measured: the other tenants' p99 102 ms at 100 ms,
    /// 21–23 ms at 20 ms, against 10 ms alone; benches/RESULTS.md). The
    /// cost is idle fetches: about 0.3–0.8 s of broker CPU per 30 s per
    /// idle worker more. `KJOB_KAFKA_FETCH_WAIT_MAX_MS` overrides both.
    fn fetch_wait_ms(&self) -> &'static str {
        if self.fairness.is_empty() && self.priorities.is_empty() {
            "100"
        } else {
            "20"
        }
    }

    fn consumer(&self, context: poll::WorkerContext) -> Result<BaseConsumer<poll::WorkerContext>> {
        let queued_min = self.settings.max_in_flight_per_partition.to_string();
        let own = [
            ("enable.auto.offset.store", "false"),
            ("fetch.wait.max.ms", self.fetch_wait_ms()),
            // librdkafka 2.x postpones a partition's next fetch by this much
            // (default 1 s) once its local queue went over the threshold;
            // after kjob resumes a partition paused at the in-flight bound,
            // that left it idle for up to a second (no-op throughput 79k
            // jobs/s instead of 215k on the bench machine).
            ("fetch.queue.backoff.ms", "10"),
            // Main-topic partitions are read through a queue each
            // (intake.rs), and librdkafka's prefetch limits then hold per
            // partition: by default 100 000 records or 64 MiB each, where
            // the single main queue held that much in all. A partition at
            // its in-flight bound is left unread, so librdkafka holds at
            // most about the bound again, and at most 8 MiB.
            ("queued.min.messages", queued_min.as_str()),
            ("queued.max.messages.kbytes", "8192"),
        ];
        self.group_settings()
            .member(&self.config, &self.settings.group, &own)
            .create_with_context(context)
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
