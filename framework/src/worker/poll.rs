//! The poll thread: the rdkafka adapter around the
//! [`Scheduler`](super::scheduler::Scheduler).
//!
//! It is the only code that talks to the consumer. Each turn it polls a
//! batch of records, feeds them to the scheduler, and carries out the
//! scheduler's actions: `Run` batches go to the dispatcher tasks on the
//! async runtime, and `Pause`, `Resume`, `Seek` and `Commit` go to the
//! consumer. It never stops polling, so the group session and
//! `max.poll.interval.ms` stay healthy however slow handlers are.
//!
//! Completions do not travel back to this thread: a dispatcher reports the
//! attempts that finished together to the scheduler itself (`Hub::finished`
//! in `hub.rs`,
//! one lock per batch) and runs the jobs that this released right away. A
//! cheap job's slot is thus refilled without a hop between threads; only
//! the consumer actions a completion causes (resuming a partition that was
//! paused at its in-flight bound) are this thread's, which the hub wakes
//! for them (where it waits in librdkafka, on a worker that reads no
//! partition through its own queue, they wait at most [`BUSY_WAIT`]).
//!
//! Commits (always the scheduler's watermark, "next offset to read"):
//! * every `commit_interval`, asynchronously, for partitions whose watermark
//!   moved, and every tenth interval for all of them (librdkafka reports
//!   nothing about an asynchronous commit with explicit offsets, so one that
//!   failed during a broker outage is re-sent this way);
//! * on revoke, synchronously, after the running jobs finished (bounded);
//! * on shutdown, synchronously, after the grace period.
//!
//! It never commits for partitions that were *lost* (session expired):
//! another member may already own them, and our watermark could move theirs
//! backwards.
//!
//! After every assignment it re-applies the scheduler's pause view to the
//! consumer: librdkafka keeps an application's pause across a revoke and a
//! re-assignment, while the scheduler starts the partition afresh.

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::message::Message;

use super::polled::Polled;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::{debug, info, warn};

use super::hub::{Core, Hub};
use super::record::incoming;
use super::scheduler::{Action, Incoming, Tp};
use super::state::{RouteEntry, Settings, TopicRole, WorkerStats};
use crate::dlq::now_ms;
use crate::telemetry::metrics::Metrics;

/// Most records taken from the consumer per turn: large enough to amortise
/// the lock and the wake-ups, small enough to keep completions flowing.
const MAX_BATCH: usize = 1024;

/// Records the poll thread gives the scheduler per hold of the hub's lock.
/// A whole batch (up to [`MAX_BATCH`]) held it about a quarter of a
/// millisecond, while the dispatcher, its jobs done, waited to report them
/// and take the next: a fifth of its time, asleep on the lock, in a no-op
/// run (benches/RESULTS.md, issue 29's ninth step). A chunk holds it a few
/// microseconds, which a waiter spins out ([`Hub::lock`]).
const RECORD_CHUNK: usize = 64;

/// The longest a busy poll thread blocks in the consumer: short, so the
/// consumer actions completions caused are carried out promptly where the
/// hub's wake-up cannot end the wait (a blocking librdkafka poll). New
/// records end the wait at once.
const BUSY_WAIT: Duration = Duration::from_millis(2);

/// How long an interval commit waits for finished batch jobs to be
/// recorded; usually they are within a few milliseconds.
const BATCH_BARRIER: Duration = Duration::from_millis(200);
/// The same for a revoke's or the stop's synchronous commit.
const BATCH_BARRIER_SYNC: Duration = Duration::from_secs(5);

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
    pub watchdog: Arc<super::watchdog::Watchdog>,
    /// Where finished batch jobs are recorded: every commit waits until
    /// they are acknowledged ([`crate::batch`]).
    pub batches: Option<Arc<crate::batch::recorder::Recorder>>,
    /// Routes paused for the whole group ([`crate::control`]), followed by
    /// their own thread; `None` when the worker does not follow them.
    pub holds: Option<Arc<crate::control::Holds>>,
    /// Where each debounced route's newest job per key is noted
    /// ([`super::debounce`]).
    pub debounce: Option<Arc<super::debounce::Debounce>>,
    /// The holds' version last applied and the partitions paused for them.
    pub held: Mutex<(u64, std::collections::HashSet<Tp>)>,
    /// Sent as the metadata of every offset this consumer commits
    /// ([`commit_tag`]): a partition that comes back after a loss is
    /// recognised as untouched only if the group's position still carries
    /// it, so a position another member committed is never mistaken for
    /// one of ours that happens to have the same offset.
    pub commit_tag: String,
    /// Bumped by every change of the assignment: the intake splits the
    /// main-topic partitions again after each ([`super::intake`]).
    pub assignments: std::sync::atomic::AtomicU64,
    /// Set once the poll thread reads main-topic partitions through their
    /// own queues ([`super::intake`]): only then is a partition at its
    /// bound left unread instead of paused.
    pub split_reading: AtomicBool,
    /// Unparks the poll thread when a queue it reads turns non-empty.
    pub wake: Arc<super::intake::Wake>,
}

/// A tag no other consumer (in this process or elsewhere) uses: the
/// process, a per-process counter and the start time.
pub(crate) fn commit_tag() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, AtomicOrdering::Relaxed);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("kjob {} {n} {started}", std::process::id())
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

impl ConsumerContext for WorkerContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        WorkerStats::bump(&self.stats.rebalances);
        self.metrics.rebalance(match rebalance {
            Rebalance::Assign(_) => "assigned",
            Rebalance::Revoke(_) if consumer.assignment_lost() => "lost",
            Rebalance::Revoke(_) => "revoked",
            Rebalance::Error(_) => "error",
        });
        match rebalance {
            Rebalance::Revoke(tpl) => self.on_revoke(consumer, tpl),
            Rebalance::Assign(tpl) => self.on_assign(tpl),
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(_) = rebalance {
            // Only now is the assignment in effect on the consumer.
            self.assignments.fetch_add(1, AtomicOrdering::AcqRel);
            let actions = std::mem::take(&mut self.lock().post_assign);
            self.execute(consumer, actions, CommitMode::Sync, true);
            self.apply_holds(consumer, true);
            self.check_returning(consumer);
        }
    }

    /// librdkafka calls this for the commits it reports: not for an
    /// asynchronous `commit` with explicit offsets, which is why the
    /// scheduler re-sends every watermark now and then, and remembers
    /// every position it sent.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Err(e) => {
                warn!(error = %e, partitions = offsets.count(), "offset commit failed; will recommit");
                self.lock().sched.commit_failed();
            }
            // What the coordinator has: a partition that comes back after a
            // loss is recognised by it (see the scheduler).
            Ok(()) => self.lock().sched.acknowledged(&positions_of(offsets)),
        }
    }
}

fn tps_of(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

/// The `(partition, next offset)` pairs of a commit's list.
fn positions_of(tpl: &TopicPartitionList) -> Vec<(Tp, i64)> {
    tpl.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(n) => Some(((e.topic().to_string(), e.partition()), n)),
            _ => None,
        })
        .collect()
}

fn tpl_of(tps: &[Tp]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in tps {
        tpl.add_partition(t, *p);
    }
    tpl
}

impl WorkerContext {
    /// For partitions that came back after a loss: whether the group's
    /// position is still one this consumer committed (it carries our
    /// [`WorkerContext::commit_tag`]). If another member, or an operator's
    /// reset, wrote it, what this consumer finished before says nothing
    /// about the partition any more and is forgotten: everything from the
    /// position runs again, as the commit rule requires. When the position
    /// cannot be read, the same (running again is always safe).
    fn check_returning(&self, consumer: &BaseConsumer<Self>) {
        let back = self.lock().sched.returning();
        if back.is_empty() {
            return;
        }
        let ours: std::collections::HashSet<Tp> = match consumer
            .committed_offsets(tpl_of(&back), Duration::from_secs(5))
        {
            Ok(tpl) => tpl
                .elements()
                .iter()
                .filter(|e| e.metadata() == self.commit_tag)
                .map(|e| (e.topic().to_string(), e.partition()))
                .collect(),
            Err(e) => {
                warn!(error = %e, "could not read the committed positions of partitions that came back; running again what this worker finished before");
                Default::default()
            }
        };
        let mut core = self.lock();
        for tp in back.into_iter().filter(|tp| !ours.contains(tp)) {
            info!(topic = %tp.0, partition = tp.1, "a partition came back with a position this worker did not commit; what it finished before runs again from there");
            core.sched.forget_returning(&tp);
        }
    }
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        self.hub.lock()
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(AtomicOrdering::Acquire)
    }

    fn on_assign(&self, tpl: &TopicPartitionList) {
        let tps = tps_of(tpl);
        info!(partitions = ?tps, "assigned");
        self.stats.set_assigned(&tps, true);
        let mut core = self.lock();
        let mut out = Vec::new();
        core.sched.assign(&tps, &mut out);
        core.post_assign.extend(out);
        self.stats
            .ready
            .store(!self.is_stopping(), AtomicOrdering::Release);
    }

    /// Revoke: stop dispatching, drop what has not started, wait (bounded)
    /// for the running jobs, commit the watermark synchronously, forget the
    /// partitions. Lost partitions skip the wait and the commit.
    fn on_revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let tps = tps_of(tpl);
        let lost = consumer.assignment_lost();
        info!(partitions = ?tps, lost, "revoking");
        self.assignments.fetch_add(1, AtomicOrdering::AcqRel);
        self.stats.set_assigned(&tps, false);
        let mut out = Vec::new();
        {
            let mut core = self.lock();
            core.sched.revoke(&tps);
            // Every one of them: `any` would stop at the first.
            for tp in &tps {
                core.throttled.remove(tp);
            }
            if !lost {
                let deadline = Instant::now() + self.settings.revoke_timeout;
                while core.sched.running_in(&tps) > 0 {
                    let now = Instant::now();
                    if now >= deadline {
                        warn!(timeout = ?self.settings.revoke_timeout, "running jobs did not finish before the revoke timeout; they will be re-delivered to the new owner");
                        break;
                    }
                    core = self
                        .hub
                        .wait(core, (deadline - now).min(Duration::from_millis(50)));
                }
                core.take_deferred(&mut out);
            } else {
                warn!("partitions were lost (session expired); not committing for them");
            }
            core.sched.release(&tps, lost, &mut out);
            if core.sched.assigned().is_empty() {
                self.stats.ready.store(false, AtomicOrdering::Release);
            }
        }
        // Completions may have made other partitions' jobs ready.
        self.execute(consumer, out, CommitMode::Sync, false);
    }

    /// Carries out the scheduler's actions. The core lock is not held: a
    /// synchronous commit may run the commit callback, which takes it.
    fn execute(
        &self,
        consumer: &BaseConsumer<Self>,
        actions: Vec<Action<Polled>>,
        mode: CommitMode,
        after_assign: bool,
    ) {
        if actions.is_empty() {
            return;
        }
        let mut committed = Vec::new();
        // A synchronous commit that returned is acknowledged.
        let acked = matches!(mode, CommitMode::Sync);
        for action in actions {
            match action {
                Action::Run(jobs) => self.hub.dispatch.send(jobs),
                Action::Grant(tickets) => self.lock().grant(tickets),
                // At its bound, a main-topic partition read through its
                // own queue is left unread rather than paused: a pause
                // makes librdkafka fetch and parse again all it had
                // prefetched (issue 29). Its prefetch limits hold the rest.
                // After an assignment the partition may not be split yet,
                // and a stopping worker should stop fetching: both pause.
                //
                // Pauses and resumes are applied, and noted on the hub, one
                // by one in the order given (the order the scheduler made
                // them in): a partition paused and resumed in one list ends
                // resumed, and one resumed and paused ends paused. (Noted
                // all at once after the list, a split partition paused and
                // then resumed was left unread while the scheduler counted
                // it resumed, and stayed so.)
                Action::Pause(tp)
                    if !after_assign && !self.is_stopping() && self.reads_split(&tp.0) =>
                {
                    self.lock().throttled.add(vec![tp]);
                }
                Action::Pause(tp) => {
                    if let Err(e) = consumer.pause(&tpl_of(std::slice::from_ref(&tp))) {
                        warn!(error = %e, topic = %tp.0, partition = tp.1, "pause failed");
                    } else {
                        self.note_paused(tp, after_assign);
                    }
                }
                Action::Resume(tp) if self.holds.as_ref().is_some_and(|h| h.held(&tp.0)) => {
                    self.unthrottle(&tp);
                    // Paused for the whole group: the scheduler's own view
                    // is "not paused", the consumer's stays paused.
                    if let Err(e) = consumer.pause(&tpl_of(std::slice::from_ref(&tp))) {
                        warn!(error = %e, topic = %tp.0, partition = tp.1, "pause of a paused route failed");
                    }
                    self.note_resumed(&tp, after_assign);
                }
                // Only left unread: reading it again is the whole resume.
                Action::Resume(tp) if self.unthrottle(&tp) && !after_assign => {}
                Action::Resume(tp) => {
                    if let Err(e) = consumer.resume(&tpl_of(std::slice::from_ref(&tp))) {
                        warn!(error = %e, topic = %tp.0, partition = tp.1, "resume failed");
                    } else {
                        self.note_resumed(&tp, after_assign);
                    }
                }
                Action::Seek(tp, offset) => {
                    // Asynchronous (a zero timeout): librdkafka drops what
                    // it pre-fetched for the partition at once and moves
                    // the fetch position in its own thread. Waiting for
                    // that stalled every partition's poll for a fetch
                    // round trip, which a fair route reading past a flood
                    // (several seeks a second) cannot afford: A's share
                    // of the route fell from 77 % to 64 % in the fairness
                    // bench. Records fetched again are skipped by the
                    // scheduler, whichever way the seek lands.
                    if let Err(e) =
                        consumer.seek(&tp.0, tp.1, Offset::Offset(offset), Duration::ZERO)
                    {
                        // The watermark stays below `offset`, so a failed
                        // seek shows up as lag, never as a lost retry.
                        warn!(error = %e, topic = %tp.0, partition = tp.1, offset, "seek failed");
                    }
                }
                Action::Commit(offsets) => {
                    // Finished batch jobs below these offsets are on the
                    // batch topic first; otherwise this commit waits for
                    // the next round (a revoke's or the stop's waits
                    // longer, and commits nothing if it must).
                    let within = match mode {
                        CommitMode::Sync => BATCH_BARRIER_SYNC,
                        CommitMode::Async => BATCH_BARRIER,
                    };
                    if let Some(rec) = &self.batches {
                        if !rec.barrier(within) {
                            warn!(wait_ms = within.as_millis() as u64, "finished batch jobs not yet recorded on the batch topic; this commit waits for the next round");
                            continue;
                        }
                    }
                    let mut tpl = TopicPartitionList::new();
                    for ((t, p), next) in &offsets {
                        let mut e = tpl.add_partition(t, *p);
                        if e.set_offset(Offset::Offset(*next)).is_ok() {
                            e.set_metadata(&self.commit_tag);
                        }
                    }
                    match consumer.commit(&tpl, mode) {
                        Ok(()) => committed.extend(offsets),
                        Err(e) => {
                            warn!(error = %e, ?mode, "offset commit failed; will retry at the next interval")
                        }
                    }
                }
            }
        }
        if committed.is_empty() {
            return;
        }
        let mut core = self.lock();
        core.sched.committed(&committed);
        if acked {
            core.sched.acknowledged(&committed);
        }
    }

    /// Notes that kjob paused `tp` on the consumer.
    fn note_paused(&self, tp: Tp, after_assign: bool) {
        let mut core = self.lock();
        if after_assign && !core.applied_pause.contains(&tp) {
            debug!(topic = %tp.0, partition = tp.1, "pause state corrected after an assignment: paused");
        }
        core.applied_pause.insert(tp);
    }

    /// Notes that kjob resumed `tp` on the consumer (or that the scheduler
    /// let go of it while a route pause holds it).
    fn note_resumed(&self, tp: &Tp, after_assign: bool) {
        if self.lock().applied_pause.remove(tp) && after_assign {
            debug!(topic = %tp.0, partition = tp.1, "pause state corrected after an assignment: resumed (librdkafka kept an old pause)");
        }
    }

    /// Whether a partition of `topic` is read through its own queue, so
    /// that leaving it unread holds it at its bound.
    fn reads_split(&self, topic: &str) -> bool {
        self.split_reading.load(AtomicOrdering::Acquire)
            && self
                .routes
                .get(topic)
                .is_some_and(super::intake::reads_split)
    }

    /// Reads a partition left unread at its bound again. Returns whether it
    /// was left unread (and not also paused on the consumer).
    fn unthrottle(&self, tp: &Tp) -> bool {
        let mut core = self.lock();
        core.throttled.remove(tp) && !core.applied_pause.contains(tp)
    }

    /// Pauses the assigned partitions of the routes paused for the group
    /// and resumes the ones no longer paused, unless the scheduler holds
    /// them itself. One atomic load when nothing changed (unless `force`:
    /// after an assignment).
    fn apply_holds(&self, consumer: &BaseConsumer<Self>, force: bool) {
        let Some(holds) = &self.holds else { return };
        let version = holds.version();
        let mut applied = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if !force && applied.0 == version {
            return;
        }
        applied.0 = version;
        let assigned = self.stats.assignment();
        let want: std::collections::HashSet<Tp> = assigned
            .iter()
            .filter(|(t, _)| holds.held(t))
            .cloned()
            .collect();
        for tp in want.iter().filter(|tp| force || !applied.1.contains(*tp)) {
            match consumer.pause(&tpl_of(std::slice::from_ref(tp))) {
                Ok(()) => {
                    info!(topic = %tp.0, partition = tp.1, "paused: the route is paused for the group")
                }
                Err(e) => {
                    warn!(error = %e, topic = %tp.0, partition = tp.1, "pause for a paused route failed")
                }
            }
        }
        let released: Vec<Tp> = applied
            .1
            .iter()
            .filter(|tp| !want.contains(*tp) && assigned.contains(*tp))
            .cloned()
            .collect();
        if !released.is_empty() && !self.is_stopping() {
            let core = self.lock();
            for tp in released
                .iter()
                .filter(|tp| !core.applied_pause.contains(*tp))
            {
                match consumer.resume(&tpl_of(std::slice::from_ref(tp))) {
                    Ok(()) => {
                        info!(topic = %tp.0, partition = tp.1, "resumed: the route is no longer paused for the group")
                    }
                    Err(e) => {
                        warn!(error = %e, topic = %tp.0, partition = tp.1, "resume after a route pause failed")
                    }
                }
            }
        }
        applied.1 = want;
    }

    /// What the scheduler needs of a polled record.
    fn incoming(&self, msg: Polled) -> Incoming<Polled> {
        let entry = self.routes.get(msg.topic());
        let role = entry.map_or(TopicRole::Main, |e| e.role);
        // Delayed jobs are not ordered among themselves (see crate::delay):
        // one waiting out its last second must not hold back its key.
        let ordering = match role {
            TopicRole::Delay(_) => super::OrderingMode::Unordered,
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
    fn refresh_oldest_pending(&self) {
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
            self.routes.values().map(|e| e.route.job_name()).collect();
        jobs.sort_unstable();
        jobs.dedup();
        snap.oldest_running_seconds = self.watchdog.oldest_running(&jobs);
    }
}

/// Logs a consumer error, from the main queue or a split one, and returns
/// it as fatal when the cluster refused the consumer.
fn consumer_error(
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

/// The poll loop. Returns once stopping is set, or a fatal consumer error
/// (an ACL, the credentials) was seen, and the shutdown sequence (drop
/// queued work, wait for running jobs within the grace period, cancel the
/// rest, commit) is complete; the caller then closes the consumer.
pub(crate) fn poll_loop(
    ctx: &WorkerContext,
    consumer: &Arc<BaseConsumer<WorkerContext>>,
    abandon: impl FnOnce(),
) -> Result<(), FatalConsumerError> {
    ctx.wake.register();
    // Main-topic partitions, each through its own queue, most urgent
    // first (none when only fair routes are handled).
    let mut intake = super::intake::Intake::new(&ctx.routes, consumer, ctx.wake.clone());
    ctx.split_reading
        .store(intake.is_some(), AtomicOrdering::Release);
    let mut throttle_seen = 0;
    let mut last_gauges = Instant::now();
    let mut fatal = None;
    let mut batch: Vec<Polled> = Vec::with_capacity(MAX_BATCH);
    // The scheduler's view of `batch`, reused from turn to turn: a new one
    // per turn was a fresh 170 KiB allocation (1 024 records), which glibc
    // may map and unmap each time.
    let mut incoming: Vec<Incoming<Polled>> = Vec::with_capacity(MAX_BATCH);
    // Topic names, shared by every record of their topic.
    let mut topics: rustc_hash::FxHashMap<String, Arc<str>> = Default::default();
    // Finished records, back from the dispatchers once per turn: kept
    // whole (box and buffer) for the next records, or dropped here (see
    // super::recycle).
    let mut returned: Vec<Polled> = Vec::new();
    let mut spare = super::recycle::Spare::default();
    while !ctx.is_stopping() && fatal.is_none() {
        ctx.hub.returned.take(&mut returned);
        for r in returned.drain(..) {
            spare.keep(r);
        }
        let mut out = Vec::new();
        let (busy, held) = {
            let mut core = ctx.lock();
            core.take_deferred(&mut out);
            core.sched.tick(now_ms(), &mut out);
            core.sched.dispatch(&mut out);
            (
                core.sched.running() > 0 || core.sched.ready_len() > 0,
                core.hold_read_ahead(),
            )
        };
        ctx.execute(consumer, out, CommitMode::Async, false);
        ctx.apply_holds(consumer, false);
        if last_gauges.elapsed() >= ctx.settings.commit_interval {
            ctx.refresh_oldest_pending();
            last_gauges = Instant::now();
        }
        // While jobs run, completions may leave consumer actions behind
        // (a resume): block only briefly, so they are carried out promptly.
        let mut timeout = if busy {
            BUSY_WAIT
        } else {
            ctx.settings.poll_timeout
        };
        // Split partitions first: their records join the batch ahead of
        // whatever the main queue holds.
        let mut failed = None;
        if let Some(intake) = intake.as_mut() {
            let generation = ctx.assignments.load(AtomicOrdering::Acquire);
            intake.refresh(consumer, generation, || ctx.stats.assignment());
            // After this turn's actions: a partition they resumed is read
            // now. (Copied at the top of the turn instead, the set missed
            // such a resume, and when nothing else was left to run the
            // poll thread then waited out its idle timeout, 20 ms, with
            // the partition unread: at a bound of 250 records per
            // partition, about a second in a 200 000-job run.)
            let version = ctx.hub.throttle_version.load(AtomicOrdering::Acquire);
            if version != throttle_seen {
                throttle_seen = version;
                intake.stop_only(ctx.lock().throttled.set());
            }
            intake.hold(held);
            failed = intake.read(&mut batch, MAX_BATCH, |m, topic| {
                Polled::copy_fetched(m, topic.clone(), spare.take())
            });
            // Blocking in the main queue would miss the split ones.
            if batch.is_empty() && failed.is_none() {
                intake.wait(timeout);
            }
            timeout = Duration::ZERO;
        }
        if !batch.is_empty() {
            timeout = Duration::ZERO;
        }
        if let Some(e) = failed {
            fatal = fatal.or_else(|| consumer_error(consumer, &e));
        }
        let mut copy = |m: &rdkafka::message::BorrowedMessage<'_>| {
            let name = m.topic();
            let topic = match topics.get(name) {
                Some(t) => t.clone(),
                None => {
                    let t: Arc<str> = Arc::from(name);
                    topics.insert(name.to_string(), t.clone());
                    t
                }
            };
            Polled::copy_into(m, topic, spare.take())
        };
        // Always polled, even after a full batch of split records or an
        // error from a split queue: the main queue also serves the
        // rebalance and commit callbacks.
        let mut next = consumer.poll(timeout);
        let mut from_main = 0;
        while let Some(result) = next {
            match result {
                Ok(m) => {
                    batch.push(copy(&m));
                    from_main += 1;
                }
                Err(e) => {
                    fatal = fatal.or_else(|| consumer_error(consumer, &e));
                    break;
                }
            }
            if batch.len() >= MAX_BATCH {
                break;
            }
            next = consumer.poll(Duration::ZERO);
        }
        if let Some(intake) = intake.as_mut() {
            intake.main_drained(from_main);
        }
        if batch.is_empty() {
            continue;
        }
        let now = now_ms();
        incoming.extend(batch.drain(..).map(|m| ctx.incoming(m)));
        let mut out = Vec::new();
        // Recorded a chunk at a time, the lock let go in between: a
        // dispatcher reporting completions (and waiting for the jobs they
        // free) waits for one chunk, not for the whole batch.
        // `out` keeps the order of the lock: what completions left for this
        // thread before a hold comes before what the hold's records cause
        // (a resume made before a pause must not be carried out after it).
        // Free slots are given out once the whole batch is in, so that
        // they go to its most urgent records, not to the first chunk's.
        let mut recs = incoming.drain(..).peekable();
        while recs.peek().is_some() {
            let mut core = ctx.lock();
            core.take_deferred(&mut out);
            for rec in recs.by_ref().take(RECORD_CHUNK) {
                core.sched.record(rec, now, &mut out);
            }
            if recs.peek().is_none() {
                core.sched.dispatch(&mut out);
            }
        }
        drop(recs);
        ctx.execute(consumer, out, CommitMode::Async, false);
    }
    shutdown(ctx, consumer, abandon);
    fatal.map_or(Ok(()), Err)
}

/// Shutdown: stop fetching, drop what has not started, let running jobs
/// finish within the grace period, abandon the rest, commit. Leaving the
/// group happens when the caller drops the consumer.
fn shutdown(ctx: &WorkerContext, consumer: &BaseConsumer<WorkerContext>, abandon: impl FnOnce()) {
    ctx.stats.ready.store(false, AtomicOrdering::Release);
    let mut out = Vec::new();
    let close_gaps = ctx.close_gaps.load(AtomicOrdering::Acquire);
    let running = {
        let mut core = ctx.lock();
        core.sched.stop(close_gaps, &mut out);
        core.sched.dispatch(&mut out);
        core.sched.running()
    };
    info!(running, grace = ?ctx.settings.shutdown_grace, "shutting down: waiting for running jobs");
    ctx.execute(consumer, out, CommitMode::Async, false);
    let deadline = Instant::now() + ctx.settings.shutdown_grace;
    loop {
        let mut out = Vec::new();
        let (idle, left) = {
            let mut core = ctx.hub.wait(ctx.lock(), Duration::from_millis(20));
            core.take_deferred(&mut out);
            // Only jobs kept to close gaps are still released; the
            // scheduler emits no resume while stopping.
            core.sched.dispatch(&mut out);
            (core.sched.idle(), core.sched.running())
        };
        ctx.execute(consumer, out, CommitMode::Async, false);
        if idle {
            break;
        }
        if Instant::now() >= deadline {
            warn!(
                left,
                "grace period over; cancelling the remaining jobs (they will be re-delivered)"
            );
            break;
        }
        // Keep serving the consumer, so the session stays alive.
        let _ = consumer.poll(Duration::ZERO);
    }
    abandon();
    let mut out = Vec::new();
    {
        let mut core = ctx.lock();
        core.deferred.clear();
        core.sched.commit_all(&mut out);
    }
    ctx.execute(consumer, out, CommitMode::Sync, false);
    // Forget the partitions so the revoke during close neither waits for
    // abandoned jobs nor commits again.
    ctx.lock().sched.clear();
}
