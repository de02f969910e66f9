//! The commit, carried out (step 10 of ARCHITECTURE.md): the offsets the
//! scheduler says may be committed (`scheduler/commits.rs` decides which,
//! over each partition's watermark) are committed here, and nowhere else.
//!
//! * A commit waits until the finished batch jobs below its offsets are
//!   recorded on the batch topic; otherwise it waits for the next round.
//! * Every offset carries this consumer's tag ([`commit_tag`]), by which a
//!   partition that comes back after a loss is recognised as untouched.
//! * What was committed goes back to the scheduler: sent (and, for a
//!   synchronous commit or a reported one, acknowledged), or failed, so it
//!   is sent again at the next interval.

use std::sync::atomic::Ordering as AtomicOrdering;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};
use tracing::warn;

use crate::worker::intake::poll::rebalance::positions_of;
use crate::worker::intake::poll::WorkerContext;
use crate::worker::scheduler::Tp;

/// How long an interval commit waits for finished batch jobs to be
/// recorded; usually they are within a few milliseconds.
pub(in crate::worker) const BATCH_BARRIER: Duration = Duration::from_millis(200);
/// The same for a revoke's or the stop's synchronous commit.
pub(in crate::worker) const BATCH_BARRIER_SYNC: Duration = Duration::from_secs(5);

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

impl WorkerContext {
    /// Commits `offsets` (each partition's next offset), after the batch
    /// barrier. True when the consumer took the commit.
    pub(super) fn commit(
        &self,
        consumer: &BaseConsumer<Self>,
        offsets: &[(Tp, i64)],
        mode: CommitMode,
    ) -> bool {
        // Finished batch jobs below these offsets are on the batch topic
        // first; otherwise this commit waits for the next round (a
        // revoke's or the stop's waits longer, and commits nothing if it
        // must).
        let within = match mode {
            CommitMode::Sync => BATCH_BARRIER_SYNC,
            CommitMode::Async => BATCH_BARRIER,
        };
        if let Some(rec) = &self.batches {
            if !rec.barrier(within) {
                warn!(wait_ms = within.as_millis() as u64, "finished batch jobs not yet recorded on the batch topic; this commit waits for the next round");
                return false;
            }
        }
        let mut tpl = TopicPartitionList::new();
        for ((t, p), next) in offsets {
            let mut e = tpl.add_partition(t, *p);
            if e.set_offset(Offset::Offset(*next)).is_ok() {
                e.set_metadata(&self.commit_tag);
            }
        }
        match consumer.commit(&tpl, mode) {
            Ok(()) => true,
            Err(e) => {
                warn!(error = %e, ?mode, "offset commit failed; will retry at the next interval");
                false
            }
        }
    }

    /// Tells the scheduler what the consumer took: sent, and acknowledged
    /// too when the commit was synchronous (it returned once the
    /// coordinator had it).
    pub(super) fn note_committed(&self, committed: &[(Tp, i64)], mode: CommitMode) {
        if committed.is_empty() {
            return;
        }
        let mut core = self.lock();
        core.sched.committed(committed);
        if matches!(mode, CommitMode::Sync) {
            core.sched.acknowledged(committed);
        }
    }

    /// What librdkafka reports of a commit (not an asynchronous one with
    /// explicit offsets, which is why the scheduler re-sends every
    /// watermark now and then and remembers every position it sent).
    pub(super) fn commit_reported(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
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
