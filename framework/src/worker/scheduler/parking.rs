//! Parking: a job that waits for a downstream gives its slot back and asks
//! for one again (see the scheduler's module docs).

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::{Located, Scheduler, Ticket};

/// One level's parked jobs that asked for a slot again: a queue per
/// partition, oldest first, and the partitions take turns. Why by
/// partition: thousands of delayed jobs due in the same second wait out
/// their last moments parked, all from one delay partition; in one queue,
/// a job of the main topic that unparked a moment later waited behind all
/// of them (214-222 ms at p99 in the `delays` bench).
#[derive(Default)]
pub(super) struct Unparking {
    queues: FxHashMap<usize, VecDeque<Ticket>>,
    /// Partition slots with a job waiting, in turn order.
    turns: VecDeque<usize>,
    len: usize,
}

impl Unparking {
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn push_back(&mut self, t: Ticket) {
        let q = self.queues.entry(t.slot).or_default();
        if q.is_empty() {
            self.turns.push_back(t.slot);
        }
        q.push_back(t);
        self.len += 1;
    }

    /// The next partition's oldest job; that partition goes to the back.
    pub(super) fn pop_front(&mut self) -> Option<Ticket> {
        while let Some(slot) = self.turns.pop_front() {
            let Some(q) = self.queues.get_mut(&slot) else {
                continue;
            };
            let Some(t) = q.pop_front() else {
                self.queues.remove(&slot);
                continue;
            };
            self.len -= 1;
            if q.is_empty() {
                self.queues.remove(&slot);
            } else {
                self.turns.push_back(slot);
            }
            return Some(t);
        }
        None
    }
}

impl<R: Located> Scheduler<R> {
    /// Jobs parked now: dispatched, waiting for a downstream without a slot.
    pub(crate) fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Slots free for `level` now: the limit, less the reserve kept for a
    /// more urgent level that is active, less what runs.
    fn free_for(&self, level: usize) -> usize {
        (self.limits.concurrency - self.reserve_for(level)).saturating_sub(self.running)
    }

    /// A running job waits for a downstream: it gives its slot back and
    /// keeps its lane. No-op for a job that is not running.
    pub(crate) fn park(&mut self, t: Ticket) {
        if self.parked.insert(t) {
            self.running = self.running.saturating_sub(1);
            self.running_at[t.level] = self.running_at[t.level].saturating_sub(1);
            // Nor is it shown among its tenant's running jobs.
            self.ready.parked(&t);
        }
    }

    /// A parked job can go on. Returns `true` if it has its slot back at
    /// once; otherwise it waits for a [`Action::Grant`](super::Action::Grant) from a later
    /// [`Scheduler::dispatch`] (parked jobs of its level asked before it
    /// are served first).
    pub(crate) fn unpark(&mut self, t: Ticket) -> bool {
        if !self.parked.contains(&t) {
            return true;
        }
        if self.unparking[t.level].is_empty() && self.free_for(t.level) > 0 {
            self.parked.remove(&t);
            self.ready.resumed(&t);
            self.running += 1;
            self.running_at[t.level] += 1;
            return true;
        }
        self.unparking[t.level].push_back(t);
        false
    }
}
