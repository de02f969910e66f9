//! Rebalances: what the poll thread does when partitions are assigned,
//! revoked or lost, and the commit callback. A revoke finishes or hands
//! back what runs and commits synchronously; a loss never commits.

use crate::worker::intake::poll::WorkerContext;
use crate::worker::scheduler::Tp;
use crate::worker::state::WorkerStats;
use rdkafka::consumer::BaseConsumer;
use rdkafka::consumer::CommitMode;
use rdkafka::consumer::Consumer;
use rdkafka::consumer::ConsumerContext;
use rdkafka::consumer::Rebalance;
use rdkafka::error::KafkaResult;
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::time::Duration;
use std::time::Instant;
use tracing::info;
use tracing::warn;

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
            self.apply_pauses(consumer, true);
            self.check_returning(consumer);
        }
    }

    /// librdkafka calls this for the commits it reports (`commit.rs`).
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        self.commit_reported(result, offsets);
    }
}

impl WorkerContext {
    /// For partitions that came back after a loss: whether the group's
    /// position is still one this consumer committed (it carries our
    /// [`WorkerContext::commit_tag`]). If another member, or an operator's
    /// reset, wrote it, what this consumer finished before says nothing
    /// about the partition any more and is forgotten: everything from the
    /// position runs again, as the commit rule requires. When the position
    /// cannot be read, the same (running again is always safe).
    pub(super) fn check_returning(&self, consumer: &BaseConsumer<Self>) {
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

    pub(super) fn on_assign(&self, tpl: &TopicPartitionList) {
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
    pub(super) fn on_revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
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
}

pub(super) fn tps_of(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

/// The `(partition, next offset)` pairs of a commit's list.
pub(super) fn positions_of(tpl: &TopicPartitionList) -> Vec<(Tp, i64)> {
    tpl.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(n) => Some(((e.topic().to_string(), e.partition()), n)),
            _ => None,
        })
        .collect()
}

pub(super) fn tpl_of(tps: &[Tp]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in tps {
        tpl.add_partition(t, *p);
    }
    tpl
}
