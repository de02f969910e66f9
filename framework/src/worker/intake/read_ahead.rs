//! How far the poll thread reads ahead of the handlers, below the
//! in-flight bound.
//!
//! The in-flight bound (`max_in_flight_per_partition`, 5 000 by default)
//! caps what a partition may have read and unfinished: it is what lets a
//! key's later records queue behind a running one, a fair route read past
//! a flood, a debounced job see a newer one. But when handlers keep up
//! with nothing, a poll thread that reads up to the bound fills the
//! scheduler with jobs that only wait for a slot: 40 000 of them on
//! 8 partitions, 20 MB of records that are cold by the time they run (and
//! the read-ahead's first fill costs the start of every run). So a split
//! main-topic partition is read only while fewer than a limit of its
//! priority level's jobs wait for a slot ([`ReadAhead::limit_for`]); jobs
//! queued behind a running job of their key do not count, so a hot key
//! still reads up to the bound. A full level is read again when a
//! completion leaves it under half the limit: the dispatcher that sees it
//! wakes the poll thread ([`crate::worker::dispatch::hub::Hub::finished`]).
//!
//! Levels are counted apart, so jobs waiting at one level never keep an
//! urgent record of another unread. Fair routes and retry tiers, read
//! through the consumer's main queue, are not limited here.

use crate::worker::scheduler::priority::Priority;
use crate::worker::scheduler::{Located, Scheduler};

/// Which priority levels the poll thread leaves unread for now.
pub(crate) type Full = [bool; Priority::LEVELS];

/// See the module docs.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    /// Jobs of one level waiting for a slot at which its split partitions
    /// are left unread.
    limit: usize,
    full: Full,
}

impl ReadAhead {
    /// The limit for a worker running `concurrency` handlers at once:
    /// four rounds of slots, and never under [`MIN_LIMIT`].
    pub(crate) fn limit_for(concurrency: usize) -> usize {
        concurrency.saturating_mul(4).max(MIN_LIMIT)
    }

    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            full: [false; Priority::LEVELS],
        }
    }

    /// The poll thread, under the hub's lock, before it reads: the levels
    /// with `limit` or more jobs waiting for a slot are full (left unread).
    pub(crate) fn full<R: Located>(&mut self, sched: &Scheduler<R>) -> Full {
        for (level, full) in self.full.iter_mut().enumerate() {
            *full = sched.ready_len_at(level) >= self.limit;
        }
        self.full
    }

    /// After completions, under the hub's lock: whether a full level fell
    /// under half the limit (it is then no longer full, and the poll thread
    /// has to be woken to read it).
    pub(crate) fn release<R: Located>(&mut self, sched: &Scheduler<R>) -> bool {
        let mut released = false;
        for (level, full) in self.full.iter_mut().enumerate() {
            if *full && sched.ready_len_at(level) < self.limit / 2 {
                *full = false;
                released = true;
            }
        }
        released
    }
}

/// The least limit. The poll thread is woken at half of it and needs
/// time to wake, read and copy a batch (up to 1 024 records) while the
/// dispatchers run what is left: at limits of 256 and 1 024 a no-op run
/// left them without jobs (1.1 and 1.4 cores busy instead of 1.6, and
/// fewer jobs/s than without the limit); 2 048 to 8 192 kept them busy
/// (CHANGELOG.md's benchmark history, issue 29's tenth step).
const MIN_LIMIT: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::scheduler::{Action, Incoming, LaneKey, Limits, Ticket};

    /// A scheduler of `concurrency` slots with partition ("t", 0) assigned
    /// (the scheduler's tests locate an `i64` record there).
    fn sched(concurrency: usize) -> Scheduler<i64> {
        let mut s = Scheduler::new(Limits {
            concurrency,
            max_in_flight: 1_000,
            commit_interval_ms: 0,
        });
        s.assign(&[("t".to_string(), 0)], &mut Vec::new());
        s
    }

    fn record(s: &mut Scheduler<i64>, offset: i64, key: u64) {
        let rec = Incoming {
            offset,
            lane: LaneKey::Key(key),
            timestamp_ms: None,
            due_ms: None,
            foreign: false,
            item: offset,
        };
        s.record(rec, 0, &mut Vec::new());
    }

    /// Starts what the free slots take; the tickets of the jobs started.
    fn dispatch(s: &mut Scheduler<i64>) -> Vec<Ticket> {
        let mut out = Vec::new();
        s.dispatch(&mut out);
        out.iter()
            .flat_map(|a| match a {
                Action::Run(jobs) => jobs.iter().map(|j| j.ticket).collect(),
                _ => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn a_level_is_full_at_the_limit_and_read_again_under_half() {
        let mut s = sched(1);
        let mut ra = ReadAhead::new(4);
        for o in 0..4 {
            record(&mut s, o, o as u64);
        }
        assert_eq!(
            ra.full(&s),
            [false, true, false],
            "4 jobs wait at the normal level"
        );
        assert!(!ra.release(&s), "still at the limit");
        let mut running = dispatch(&mut s);
        assert_eq!(s.ready_len_at(1), 3, "the one slot took one job");
        assert!(!ra.release(&s), "3 is not under half of 4");
        let ticket = running.pop().expect("a job runs");
        s.finished(ticket, true, &mut Vec::new());
        running = dispatch(&mut s);
        assert_eq!(s.ready_len_at(1), 2);
        assert!(!ra.release(&s), "2 is not under half of 4");
        let ticket = running.pop().expect("a job runs");
        s.finished(ticket, true, &mut Vec::new());
        dispatch(&mut s);
        assert!(ra.release(&s), "released once 1 job waits");
        assert!(!ra.release(&s), "released once");
        assert_eq!(ra.full(&s), [false; 3]);
    }

    #[test]
    fn jobs_queued_behind_their_keys_running_job_are_not_counted() {
        let mut s = sched(1);
        let mut ra = ReadAhead::new(4);
        for o in 0..10 {
            record(&mut s, o, 7);
        }
        assert_eq!(
            ra.full(&s),
            [false; 3],
            "one key: one job ready, nine in its lane"
        );
    }

    #[test]
    fn the_limit_covers_four_rounds_of_slots_and_the_least_limit() {
        assert_eq!(ReadAhead::limit_for(64), MIN_LIMIT);
        assert_eq!(ReadAhead::limit_for(2000), 8000);
        assert_eq!(ReadAhead::limit_for(usize::MAX), usize::MAX);
    }
}
