//! The poll thread: the only place that talks to the consumer.
//!
//! It polls continuously (so the group session and `max.poll.interval.ms`
//! stay healthy no matter how slow handlers are), hands records to lanes,
//! pauses partitions that hit the in-flight bound, resumes them when they
//! drain, and commits watermarks:
//!
//! * every `commit_interval`, asynchronously, for partitions whose watermark moved;
//! * on revoke, synchronously, after in-flight work drained (bounded);
//! * on shutdown, synchronously, after the grace period.
//!
//! It never commits for partitions that were *lost* (session expired): another
//! member may already own them, and our watermark could move theirs backwards.

use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::{debug, info, warn};

use super::lane::run_lane;
use super::state::{Delay, LaneKey, PartitionState, Shared, Tp, WorkerStats};
use crate::dlq::now_ms;
use crate::headers;

/// rdkafka context: routes rebalance and commit callbacks into kjob's state.
pub(crate) struct WorkerContext {
    pub shared: Arc<Shared>,
}

impl ClientContext for WorkerContext {}

impl ConsumerContext for WorkerContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        WorkerStats::bump(&self.shared.stats.rebalances);
        self.shared.metrics.rebalance();
        match rebalance {
            Rebalance::Revoke(tpl) => on_revoke(&self.shared, consumer, tpl),
            Rebalance::Assign(tpl) => on_assign(&self.shared, tpl),
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            // Only now is the assignment in effect on the consumer.
            reapply_pause_view(&self.shared, consumer, &tps_of(tpl));
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(e) = result {
            warn!(error = %e, partitions = offsets.count(), "offset commit failed; will recommit");
            self.shared.lock().commit_failed = true;
        }
    }
}

fn tps_of(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

fn on_assign(shared: &Shared, tpl: &TopicPartitionList) {
    let tps = tps_of(tpl);
    info!(partitions = ?tps, "assigned");
    shared.stats.set_assigned(&tps, true);
    let mut st = shared.lock();
    for tp in tps {
        st.next_epoch += 1;
        let epoch = st.next_epoch;
        let cancel = shared.stop_token.child_token();
        st.partitions.insert(tp, PartitionState::new(epoch, cancel));
    }
    shared
        .stats
        .ready
        .store(!shared.is_stopping(), AtomicOrdering::Release);
}

/// Revoke: stop dispatch, wait (bounded) for in-flight work, commit the
/// watermark synchronously, drop the state. Lost partitions skip the wait and
/// the commit.
fn on_revoke(shared: &Shared, consumer: &BaseConsumer<WorkerContext>, tpl: &TopicPartitionList) {
    let tps = tps_of(tpl);
    let lost = consumer.assignment_lost();
    info!(partitions = ?tps, lost, "revoking");
    shared.stats.set_assigned(&tps, false);
    {
        let mut st = shared.lock();
        for tp in &tps {
            if let Some(p) = st.partitions.get_mut(tp) {
                p.revoked = true;
                p.cancel.cancel();
                p.drop_queued();
            }
        }
    }
    if !lost {
        let drained = shared.wait_drained(&tps, Instant::now() + shared.settings.revoke_timeout);
        if !drained {
            warn!(timeout = ?shared.settings.revoke_timeout, "in-flight jobs did not finish before the revoke timeout; they will be re-delivered to the new owner");
        }
        commit(shared, consumer, Some(&tps), CommitMode::Sync);
    } else {
        warn!("partitions were lost (session expired); not committing for them");
    }
    let mut st = shared.lock();
    for tp in &tps {
        if let Some(p) = st.partitions.remove(tp) {
            for task in p.tasks.values() {
                task.abort();
            }
        }
    }
    if st.partitions.is_empty() {
        shared.stats.ready.store(false, AtomicOrdering::Release);
    }
    shared.changed.notify_all();
}

/// Commits the watermark of `only` (or of every partition) if it moved.
pub(crate) fn commit(
    shared: &Shared,
    consumer: &BaseConsumer<WorkerContext>,
    only: Option<&[Tp]>,
    mode: CommitMode,
) {
    let mut tpl = TopicPartitionList::new();
    let mut marks = Vec::new();
    {
        let mut st = shared.lock();
        if std::mem::take(&mut st.commit_failed) {
            for p in st.partitions.values_mut() {
                p.tracker.reset_committed();
            }
        }
        for (tp, p) in st.partitions.iter() {
            if only.is_some_and(|o| !o.contains(tp)) {
                continue;
            }
            if let Some(next) = p.tracker.committable() {
                if tpl
                    .add_partition_offset(&tp.0, tp.1, Offset::Offset(next))
                    .is_ok()
                {
                    marks.push((tp.clone(), next));
                }
            }
        }
    }
    if marks.is_empty() {
        return;
    }
    match consumer.commit(&tpl, mode) {
        Ok(()) => {
            let mut st = shared.lock();
            for (tp, next) in marks {
                if let Some(p) = st.partitions.get_mut(&tp) {
                    p.tracker.mark_committed(next);
                }
            }
        }
        Err(e) => warn!(error = %e, ?mode, "offset commit failed; will retry at the next interval"),
    }
}

fn tpl_of(tps: &[Tp]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in tps {
        tpl.add_partition(t, *p);
    }
    tpl
}

/// A retry-tier record never runs before its due time: zero slack.
const DUE_SLACK_MS: i64 = 0;

/// Hands a polled record to its lane, starting a task if the lane is idle.
///
/// Retry-tier records are gated on `kjob-due-at`: a record that is not due
/// yet pauses its partition and seeks back to it (see [`hold`]); the poll
/// loop resumes the partition at the due time. Polling never stops, so the
/// group session stays alive and every other partition keeps flowing.
fn dispatch(shared: &Arc<Shared>, consumer: &BaseConsumer<WorkerContext>, msg: OwnedMessage) {
    let tp: Tp = (msg.topic().to_string(), msg.partition());
    let entry = shared.routes.get(msg.topic());
    let is_tier = entry.is_some_and(|e| e.tier.is_some());
    let lane = LaneKey::for_message(shared.settings.ordering, &msg);
    let mut st = shared.lock();
    let Some(p) = st.partitions.get_mut(&tp) else {
        // Not (or no longer) assigned: not tracked, so never committed.
        return;
    };
    if p.revoked || shared.is_stopping() {
        return;
    }
    // A held partition dispatches nothing but the record it waits for; any
    // other record was fetched before the pause and comes again after it.
    if p.delay.is_some_and(|d| d.offset != msg.offset()) {
        return;
    }
    if is_tier {
        let due_ms =
            headers::find(msg.headers(), headers::DUE_AT).and_then(|v| v.parse::<i64>().ok());
        let now = now_ms();
        if let Some(due_ms) = due_ms.filter(|d| *d > now + DUE_SLACK_MS) {
            // The placeholder keeps the watermark below the held record.
            p.tracker
                .start_at(msg.offset(), msg.timestamp().to_millis());
            // +1 ms: `due` is in whole milliseconds, resuming a hair early
            // would cost a second pause/seek round trip.
            let wait = Duration::from_millis((due_ms - now) as u64 + 1);
            p.delay = Some(Delay {
                offset: msg.offset(),
                due: Instant::now() + wait,
                resumed: false,
            });
            drop(st);
            hold(shared, consumer, &tp, msg.offset(), wait);
            return;
        }
        p.delay = None;
        let group = headers::find(msg.headers(), headers::GROUP);
        if group.is_some_and(|g| g != shared.settings.group) {
            // Another group's retry: its view of the job, not ours.
            p.tracker.start(msg.offset());
            p.tracker.finish(msg.offset());
            WorkerStats::bump(&shared.stats.skipped_foreign);
            return;
        }
    }
    p.tracker
        .start_at(msg.offset(), msg.timestamp().to_millis());
    let epoch = p.epoch;
    let cancel = p.cancel.clone();
    match p.lanes.get_mut(&lane) {
        Some(queue) => queue.push_back(msg),
        None => {
            p.lanes.insert(lane.clone(), Default::default());
            let task = shared.runtime.spawn(run_lane(
                shared.clone(),
                tp.clone(),
                epoch,
                lane.clone(),
                msg,
                cancel,
            ));
            p.tasks.insert(lane, task.abort_handle());
        }
    }
    if !p.paused && p.tracker.in_flight() >= shared.settings.max_in_flight_per_partition {
        p.paused = true;
        drop(st);
        debug!(topic = %tp.0, partition = tp.1, "in-flight bound reached; pausing");
        set_paused(shared, consumer, std::slice::from_ref(&tp), true);
    }
}

/// Pauses (or resumes) partitions on the consumer and records it in
/// `applied_pause`, the only record of what librdkafka was told. Every pause
/// and resume kjob makes goes through here.
fn set_paused(shared: &Shared, consumer: &BaseConsumer<WorkerContext>, tps: &[Tp], pause: bool) {
    if tps.is_empty() {
        return;
    }
    let tpl = tpl_of(tps);
    let result = if pause {
        consumer.pause(&tpl)
    } else {
        consumer.resume(&tpl)
    };
    if let Err(e) = result {
        warn!(error = %e, pause, partitions = ?tps, "pause/resume failed");
        return;
    }
    let mut st = shared.lock();
    for tp in tps {
        if pause {
            st.applied_pause.insert(tp.clone());
        } else {
            st.applied_pause.remove(tp);
        }
    }
}

/// After an assignment, makes the consumer's pause state match kjob's view
/// of each newly assigned partition. kjob's view is the truth: librdkafka
/// keeps an application's pause across a revoke and a re-assignment of the
/// same partition (under the eager, cooperative and KIP-848 protocols alike),
/// while kjob starts the partition afresh, so without this a partition
/// paused at the in-flight bound, or held for a retry's due time, when the
/// rebalance began would stay paused forever.
pub(crate) fn reapply_pause_view(
    shared: &Shared,
    consumer: &BaseConsumer<WorkerContext>,
    assigned: &[Tp],
) {
    let (mut pause, mut resume) = (Vec::new(), Vec::new());
    {
        let st = shared.lock();
        let stopping = shared.is_stopping();
        for tp in assigned {
            let want = stopping || st.partitions.get(tp).is_some_and(|p| p.wants_pause());
            let applied = st.applied_pause.contains(tp);
            if want != applied {
                debug!(topic = %tp.0, partition = tp.1, paused = want, "correcting the consumer's pause state after an assignment");
            }
            if want {
                pause.push(tp.clone());
            } else {
                // Resumed even when kjob thinks it is running: a resume of a
                // running partition is a no-op, and it costs nothing to be sure.
                resume.push(tp.clone());
            }
        }
    }
    set_paused(shared, consumer, &pause, true);
    set_paused(shared, consumer, &resume, false);
}

/// Pauses a partition and seeks it back to `offset`, so the not-yet-due
/// record (and everything behind it) is fetched again after the resume.
fn hold(
    shared: &Shared,
    consumer: &BaseConsumer<WorkerContext>,
    tp: &Tp,
    offset: i64,
    wait: Duration,
) {
    debug!(topic = %tp.0, partition = tp.1, offset, wait_ms = wait.as_millis() as u64, "retry not due; holding partition");
    set_paused(shared, consumer, std::slice::from_ref(tp), true);
    seek(consumer, tp, offset);
}

fn seek(consumer: &BaseConsumer<WorkerContext>, tp: &Tp, offset: i64) {
    if let Err(e) = consumer.seek(&tp.0, tp.1, Offset::Offset(offset), Duration::from_secs(2)) {
        // The placeholder in the tracker keeps the commit below `offset`, so
        // a failed seek shows up as lag, never as a lost retry.
        warn!(error = %e, topic = %tp.0, partition = tp.1, offset, "seek failed");
    }
}

/// Resumes partitions whose held retry record is due now.
fn release_due(shared: &Shared, consumer: &BaseConsumer<WorkerContext>) {
    let now = Instant::now();
    let mut due = Vec::new();
    {
        let mut st = shared.lock();
        for (tp, p) in st.partitions.iter_mut() {
            if let Some(d) = p.delay.as_mut().filter(|d| !d.resumed && d.due <= now) {
                d.resumed = true;
                if !p.paused {
                    due.push((tp.clone(), d.offset));
                }
            }
        }
    }
    for (tp, offset) in due {
        set_paused(shared, consumer, std::slice::from_ref(&tp), false);
        seek(consumer, &tp, offset);
    }
}

/// Updates `kjob_oldest_pending_seconds`: per topic, the age of the oldest
/// record this worker holds uncommitted (0 when nothing is pending).
fn refresh_oldest_pending(shared: &Shared) {
    let now = now_ms();
    let mut ages: std::collections::HashMap<String, f64> = std::collections::HashMap::new();
    {
        let st = shared.lock();
        for ((topic, _), p) in st.partitions.iter() {
            let age = p
                .tracker
                .oldest_timestamp()
                .map_or(0.0, |ts| ((now - ts).max(0) as f64) / 1000.0);
            let slot = ages.entry(topic.clone()).or_insert(0.0);
            *slot = slot.max(age);
        }
    }
    let mut snap = shared
        .metrics
        .snapshot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    snap.oldest_pending_seconds = ages;
}

/// The poll loop. Returns once `shared.stopping` is set and the shutdown
/// sequence (drain, cancel, commit) is complete; the caller then closes the
/// consumer.
pub(crate) fn poll_loop(shared: Arc<Shared>, consumer: &BaseConsumer<WorkerContext>) {
    let mut last_commit = Instant::now();
    while !shared.is_stopping() {
        let resumes: Vec<Tp> = {
            let mut st = shared.lock();
            let mut r = std::mem::take(&mut st.to_resume);
            // Only what is still assigned and not held for another reason.
            r.retain(|tp| st.partitions.get(tp).is_some_and(|p| !p.wants_pause()));
            r
        };
        set_paused(&shared, consumer, &resumes, false);
        release_due(&shared, consumer);
        if last_commit.elapsed() >= shared.settings.commit_interval {
            commit(&shared, consumer, None, CommitMode::Async);
            refresh_oldest_pending(&shared);
            last_commit = Instant::now();
        }
        match consumer.poll(shared.settings.poll_timeout) {
            None => {}
            Some(Ok(m)) => dispatch(&shared, consumer, m.detach()),
            Some(Err(e)) => warn!(error = %e, "consumer error"),
        }
    }
    shutdown(&shared, consumer);
}

/// Shutdown: stop fetching, let in-flight jobs finish within the grace
/// period, cancel the rest, commit. Leaving the group happens when the caller
/// drops the consumer.
fn shutdown(shared: &Shared, consumer: &BaseConsumer<WorkerContext>) {
    shared.stats.ready.store(false, AtomicOrdering::Release);
    let tps: Vec<Tp> = {
        let mut st = shared.lock();
        for p in st.partitions.values_mut() {
            p.drop_queued();
        }
        st.partitions.keys().cloned().collect()
    };
    info!(partitions = tps.len(), grace = ?shared.settings.shutdown_grace, "shutting down: draining in-flight jobs");
    set_paused(shared, consumer, &tps, true);
    let deadline = Instant::now() + shared.settings.shutdown_grace;
    // Keep serving the consumer while we wait, so the session stays alive.
    while !shared.wait_drained(&tps, Instant::now() + shared.settings.poll_timeout) {
        if Instant::now() >= deadline {
            warn!("grace period over; cancelling the remaining jobs (they will be re-delivered)");
            break;
        }
        let _ = consumer.poll(Duration::ZERO);
    }
    shared.cancel.cancel();
    commit(shared, consumer, None, CommitMode::Sync);
    let mut st = shared.lock();
    for p in st.partitions.values() {
        for task in p.tasks.values() {
            task.abort();
        }
    }
    // Forget the partitions so the revoke callback during close neither
    // waits for aborted tasks nor commits again.
    st.partitions.clear();
}
