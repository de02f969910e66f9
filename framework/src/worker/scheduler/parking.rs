//! Parking: a job that waits for a downstream gives its slot back and asks
//! for one again (see the scheduler's module docs).

use crate::worker::scheduler::{Located, Scheduler, Ticket};

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
    /// once; otherwise it waits for a [`Action::Grant`](crate::worker::scheduler::Action::Grant) from a later
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
