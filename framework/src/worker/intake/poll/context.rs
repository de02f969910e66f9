//! The poll thread's rdkafka context: what the consumer's callbacks and
//! the poll loop share (the hub, the routes, the stop flags), and the
//! errors that stop the loop.

use crate::clock::now_ms;
use crate::telemetry::metrics::Metrics;
use crate::worker::dispatch::hub::Core;
use crate::worker::dispatch::hub::Hub;
use crate::worker::intake::polled::Polled;
use crate::worker::intake::record::incoming;
use crate::worker::scheduler::Incoming;
use crate::worker::scheduler::Tp;
use crate::worker::state::RouteEntry;
use crate::worker::state::Settings;
use crate::worker::state::TopicRole;
use crate::worker::state::WorkerStats;
use rdkafka::consumer::BaseConsumer;
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::ClientContext;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::sync::PoisonError;
use tracing::warn;

/// rdkafka context: rebalance and commit callbacks, and everything the poll
/// thread needs.
pub(crate) struct WorkerContext {
    pub hub: Arc<Hub>,
    pub routes: rustc_hash::FxHashMap<String, RouteEntry>,
    pub settings: Settings,
    pub stats: Arc<WorkerStats>,
    pub metrics: Metrics,
    pub stopping: AtomicBool,
    /// The stop is planned (a worker limit): close the gaps below the
    /// highest started job before committing, so nothing runs twice.
    pub close_gaps: AtomicBool,
    /// librdkafka's words for the last error event (they name the topic an
    /// authorization failure is about; the error code alone does not).
    pub last_error: Mutex<Option<String>>,
    /// Handlers running for long (`kjob_oldest_running_seconds`).
    pub watchdog: Arc<crate::worker::handler::watchdog::Watchdog>,
    /// Where finished batch jobs are recorded: every commit waits until
    /// they are acknowledged ([`crate::batch`]).
    pub batches: Option<Arc<crate::batch::recorder::Recorder>>,
    /// Routes paused for the whole group ([`crate::control`]), followed by
    /// their own thread; `None` when the worker does not follow them.
    pub in_force: Option<Arc<crate::control::InForce>>,
    /// Where each debounced route's newest job per key is noted
    /// ([`crate::worker::before::debounce`]).
    pub debounce: Option<Arc<crate::worker::before::debounce::Debounce>>,
    /// The holds' version last applied and the partitions paused for them.
    pub held: Mutex<(u64, std::collections::HashSet<Tp>)>,
    /// Sent as the metadata of every offset this consumer commits
    /// ([`commit_tag`](crate::worker::intake::poll::commit_tag)): a partition that comes back after a loss is
    /// recognised as untouched only if the group's position still carries
    /// it, so a position another member committed is never mistaken for
    /// one of ours that happens to have the same offset.
    pub commit_tag: String,
    /// Bumped by every change of the assignment: the intake splits the
    /// main-topic partitions again after each ([`crate::worker::intake`]).
    pub assignments: std::sync::atomic::AtomicU64,
    /// Set once the poll thread reads main-topic partitions through their
    /// own queues ([`crate::worker::intake`]): only then is a partition at its
    /// bound left unread instead of paused.
    pub split_reading: AtomicBool,
    /// Unparks the poll thread when a queue it reads turns non-empty.
    pub wake: Arc<crate::worker::wake::Wake>,
}

impl ClientContext for WorkerContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        warn!(%error, reason, "librdkafka error");
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(reason.to_string());
    }
}

/// A consumer error that waiting cannot fix: an ACL or the credentials
/// refuse the worker. The poll loop stops on it (drains, commits, leaves)
/// and the worker returns it, instead of polling into the void forever.
#[derive(Debug)]
pub(crate) struct FatalConsumerError {
    /// The error code.
    pub code: rdkafka::types::RDKafkaErrorCode,
    /// librdkafka's description, including the topic where it names one.
    pub message: String,
}

fn fatal_consumer_error(
    consumer: &BaseConsumer<WorkerContext>,
    e: &rdkafka::error::KafkaError,
) -> Option<FatalConsumerError> {
    use rdkafka::types::RDKafkaErrorCode as C;
    let code = e.rdkafka_error_code()?;
    if code == C::Fatal || matches!(e, rdkafka::error::KafkaError::MessageConsumptionFatal(_)) {
        // librdkafka gave up on the client (for example a broker without
        // KIP-848 consumer groups refused `group.protocol=consumer`): the
        // client keeps the underlying error.
        let (code, message) = consumer
            .client()
            .fatal_error()
            .unwrap_or((code, e.to_string()));
        return Some(FatalConsumerError { code, message });
    }
    let fatal = matches!(
        code,
        C::TopicAuthorizationFailed
            | C::GroupAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::SaslAuthenticationFailed
            | C::Authentication
    );
    if !fatal {
        return None;
    }
    let reason = consumer
        .context()
        .last_error
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    Some(FatalConsumerError {
        code,
        message: reason.unwrap_or_else(|| e.to_string()),
    })
}

impl WorkerContext {
    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        self.hub.lock()
    }

    #[inline]
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(AtomicOrdering::Acquire)
    }

    /// What the scheduler needs of a polled record.
    #[inline]
    pub(super) fn incoming(&self, msg: Polled) -> Incoming<Polled> {
        let entry = self.routes.get(msg.topic());
        let role = entry.map_or(TopicRole::Main, |e| e.role);
        // Delayed jobs are not ordered among themselves (see crate::delay):
        // one waiting out its last second must not hold back its key.
        let ordering = match role {
            TopicRole::Delay(_) => crate::worker::OrderingMode::Unordered,
            _ => self.settings.ordering,
        };
        if let (Some(d), TopicRole::Main, Some(key)) = (&self.debounce, role, msg.key()) {
            if d.window(msg.topic()).is_some() {
                d.seen(msg.topic(), msg.partition(), key, msg.offset());
            }
        }
        let mut rec = incoming(msg, ordering, role.holds(), &self.settings.group);
        if let TopicRole::Delay(_) = role {
            let slack = crate::delay::HOLD_SLACK.as_millis() as i64;
            rec.due_ms = rec.due_ms.map(|d| d - slack);
        }
        if rec.foreign {
            WorkerStats::bump(&self.stats.skipped_foreign);
        }
        rec
    }

    /// Updates `kjob_oldest_pending_seconds`: per topic, the age of the
    /// oldest record this worker holds uncommitted (0 when nothing is).
    pub(super) fn refresh_oldest_pending(&self) {
        let now = now_ms();
        let (oldest, by_level, parked, skipped, tenants, read_past) = {
            let core = self.lock();
            (
                core.sched.oldest_pending(),
                core.sched.by_level(),
                core.sched.parked(),
                core.sched.skipped_finished(),
                core.sched.tenants(),
                core.sched.read_past(),
            )
        };
        let passed: usize = read_past.iter().map(|(_, n)| n).sum();
        self.stats
            .read_past
            .store(passed as u64, AtomicOrdering::Relaxed);
        self.stats
            .skipped_finished
            .store(skipped, AtomicOrdering::Relaxed);
        let ages = oldest
            .into_iter()
            .map(|(topic, ts)| {
                let age = ts.map_or(0.0, |ts| ((now - ts).max(0) as f64) / 1000.0);
                (topic, age)
            })
            .collect();
        let mut snap = self
            .metrics
            .snapshot
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        snap.oldest_pending_seconds = ages;
        snap.priority = by_level;
        snap.parked = parked;
        snap.read_past = read_past;
        snap.tenants = crate::telemetry::metrics::top_tenants(tenants);
        let mut jobs: Vec<&'static str> =
            self.routes.values().map(|e| e.handler.job_name()).collect();
        jobs.sort_unstable();
        jobs.dedup();
        snap.oldest_running_seconds = self.watchdog.oldest_running(&jobs);
    }
}

/// Logs a consumer error, from the main queue or a split one, and returns
/// it as fatal when the cluster refused the consumer.
pub(super) fn consumer_error(
    consumer: &BaseConsumer<WorkerContext>,
    e: &rdkafka::error::KafkaError,
) -> Option<FatalConsumerError> {
    let f = fatal_consumer_error(consumer, e);
    match &f {
        Some(f) => {
            tracing::error!(error = %e, reason = %f.message, "consumer refused by the cluster; stopping")
        }
        None => warn!(error = %e, "consumer error"),
    }
    f
}
