//! The commit watermark: which offset of a partition is safe to commit.
//!
//! This is the heart of "commit only after the handler finished". Jobs of one
//! partition may run in parallel (different keys) and finish in any order,
//! but Kafka stores a single position per partition, meaning "everything
//! before this is done". So the position kjob commits is the **lowest offset
//! still in flight**, or, when nothing is in flight, the highest offset seen
//! plus one.
//!
//! ```text
//! offsets   10  11  12  13  14
//! state     ok  RUN ok  ok  RUN      -> commit 11 (not 15, not 13)
//! ```
//!
//! A crash after this commit re-delivers 11..14; 12 and 13 run twice, which
//! is why handlers must be idempotent, but nothing is ever lost.
//!
//! Kafka's convention is that a committed offset is the *next offset to
//! read*, i.e. last done + 1. [`OffsetTracker::committable`] already returns
//! that form, ready for `commit`/`store_offsets` with a partition list.
//! (rdkafka's `store_offset_from_message` adds the 1 itself; kjob never uses
//! it, so the +1 lives only here.)

use std::collections::VecDeque;

/// Per-partition bookkeeping of started and finished offsets.
#[derive(Debug, Default, Clone)]
pub(crate) struct OffsetTracker {
    /// Started offsets in ascending order, each with its record's timestamp
    /// (epoch ms) if known; a finished one stays as a tombstone until it
    /// reaches the front, so the front is always the lowest offset in
    /// flight. Records arrive in offset order, so a start is a push at the
    /// back and needs no allocation of its own (a `BTreeMap` allocated a
    /// node per few records on the poll thread, freed on a dispatcher).
    in_flight: VecDeque<Entry>,
    /// How many entries are in flight (not tombstones).
    live: usize,
    highest_seen: Option<i64>,
    /// The first offset this assignment saw: where fetching began, so the
    /// group's committed position (or the reset position) at assignment.
    first_seen: Option<i64>,
    committed: Option<i64>,
    /// The last position the group coordinator acknowledged.
    acked: Option<i64>,
    /// The last positions sent in commits, newest last: librdkafka does
    /// not report the outcome of an asynchronous commit, so any of them
    /// may be the group's position now.
    sent: std::collections::VecDeque<i64>,
}

/// One started offset.
#[derive(Debug, Clone, Copy)]
struct Entry {
    offset: i64,
    timestamp_ms: Option<i64>,
    done: bool,
}

/// Tombstones beyond the live entries (plus this) are swept out at once:
/// behind a long-running job at the front, its partition's later jobs keep
/// finishing, and the deque must not grow with them.
const TOMBSTONE_SLACK: usize = 1024;

/// An empty tracker with room for more entries than this gives it back.
const SHRINK_ABOVE: usize = 1024;

/// How many sent commit positions a tracker remembers (one per commit
/// interval: a minute at the default second).
const SENT_KEPT: usize = 64;

impl OffsetTracker {
    /// A tracker for a freshly assigned partition.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Registers a record as dispatched. Must be called before the record can
    /// finish, in offset order per partition (the order Kafka delivers).
    #[cfg(test)]
    pub(crate) fn start(&mut self, offset: i64) {
        self.start_at(offset, None);
    }

    /// Registers a record as dispatched (before it can finish, in offset
    /// order per partition), with the record's timestamp, so the age of
    /// the oldest pending record can be reported.
    pub(crate) fn start_at(&mut self, offset: i64, timestamp_ms: Option<i64>) {
        let fresh = Entry {
            offset,
            timestamp_ms,
            done: false,
        };
        if self.in_flight.back().is_none_or(|b| b.offset < offset) {
            self.in_flight.push_back(fresh);
            self.live += 1;
        } else {
            // Out of order (fetched again after a seek): kept sorted.
            match self.find(offset) {
                Ok(i) => {
                    if let Some(e) = self.in_flight.get_mut(i) {
                        if e.done {
                            *e = fresh;
                            self.live += 1;
                        } else if e.timestamp_ms.is_none() {
                            e.timestamp_ms = timestamp_ms;
                        }
                    }
                }
                Err(i) => {
                    self.in_flight.insert(i, fresh);
                    self.live += 1;
                }
            }
        }
        if self.highest_seen.is_none_or(|h| offset > h) {
            self.highest_seen = Some(offset);
        }
        if self.first_seen.is_none() {
            self.first_seen = Some(offset);
        }
    }

    /// The highest offset started.
    pub(crate) fn highest_seen(&self) -> Option<i64> {
        self.highest_seen
    }

    /// Whether `offset` is started and not finished.
    pub(crate) fn is_in_flight(&self, offset: i64) -> bool {
        self.find(offset)
            .ok()
            .and_then(|i| self.in_flight.get(i))
            .is_some_and(|e| !e.done)
    }

    /// Where `offset` is (or would be) in the sorted entries.
    fn find(&self, offset: i64) -> Result<usize, usize> {
        // A partition's offsets are nearly always consecutive here (a
        // finished entry keeps its place until the front passes it), so
        // the distance from the front is the index: one comparison instead
        // of a search per finished job. Gaps (compaction, transaction
        // markers, tombstones retained away) fall back to the search.
        if let Some(front) = self.in_flight.front() {
            let guess = offset
                .checked_sub(front.offset)
                .and_then(|d| usize::try_from(d).ok());
            if let Some(i) = guess {
                if self.in_flight.get(i).is_some_and(|e| e.offset == offset) {
                    return Ok(i);
                }
            }
        }
        self.in_flight.binary_search_by_key(&offset, |e| e.offset)
    }

    /// Whether this tracker saw `offset` finish: at or below the highest
    /// offset seen, at or above the first, and no longer in flight.
    pub(crate) fn finished_here(&self, offset: i64) -> bool {
        match (self.first_seen, self.highest_seen) {
            (Some(lo), Some(hi)) => offset >= lo && offset <= hi && !self.is_in_flight(offset),
            _ => false,
        }
    }

    /// Whether the group's position still is what this tracker left it at,
    /// judged from `fetched_from`, the offset a new assignment of the same
    /// partition starts fetching at (the group's committed position): a
    /// position this tracker committed (acknowledged, or sent without a
    /// known answer: it may have landed), or, if none was acknowledged,
    /// where this tracker itself began. Anything else means another member
    /// (or an operator's reset) moved it, so what this tracker finished says
    /// nothing about the partition any more.
    pub(crate) fn position_unchanged(&self, fetched_from: i64) -> bool {
        let begun = self.acked.is_none().then_some(self.first_seen).flatten();
        [self.acked, self.committed, begun].contains(&Some(fetched_from))
            || self.sent.contains(&fetched_from)
    }

    /// Marks a record done. Returns false if it was not in flight (a stale
    /// completion from before a rebalance), which callers may log.
    pub(crate) fn finish(&mut self, offset: i64) -> bool {
        let Ok(i) = self.find(offset) else {
            return false;
        };
        match self.in_flight.get_mut(i) {
            Some(e) if !e.done => e.done = true,
            _ => return false,
        }
        self.live -= 1;
        while self.in_flight.front().is_some_and(|e| e.done) {
            self.in_flight.pop_front();
        }
        if self.in_flight.len() > self.live + TOMBSTONE_SLACK {
            self.in_flight.retain(|e| !e.done);
        }
        // A burst's room is given back once the partition is idle, so
        // many partitions do not each keep their largest backlog's size.
        if self.in_flight.is_empty() && self.in_flight.capacity() > SHRINK_ABOVE {
            self.in_flight.shrink_to(SHRINK_ABOVE / 4);
        }
        true
    }

    /// Timestamp (epoch ms) of the oldest in-flight record, if known.
    pub(crate) fn oldest_timestamp(&self) -> Option<i64> {
        self.in_flight
            .iter()
            .filter(|e| !e.done)
            .filter_map(|e| e.timestamp_ms)
            .min()
    }

    /// How many records are started but not finished. Records dropped
    /// without finishing (queued work on revoke) simply stay here, so the
    /// watermark never passes them and they are re-delivered.
    pub(crate) fn in_flight(&self) -> usize {
        self.live
    }

    /// The next offset to read, as Kafka wants it committed: the lowest
    /// in-flight offset, or highest seen + 1. `None` before the first record.
    pub(crate) fn watermark(&self) -> Option<i64> {
        // The front is never a tombstone (see `finish`).
        match self.in_flight.front() {
            Some(lowest) => Some(lowest.offset),
            None => self.highest_seen.map(|h| h + 1),
        }
    }

    /// The watermark if it moved past what was last committed; the caller
    /// commits it and then calls [`OffsetTracker::mark_committed`].
    pub(crate) fn committable(&self) -> Option<i64> {
        let w = self.watermark()?;
        if self.committed.is_none_or(|c| w > c) {
            Some(w)
        } else {
            None
        }
    }

    /// Records that `offset` (next-to-read form) was committed.
    pub(crate) fn mark_committed(&mut self, offset: i64) {
        if self.committed.is_none_or(|c| offset > c) {
            self.committed = Some(offset);
        }
        if self.sent.back() != Some(&offset) {
            if self.sent.len() == SENT_KEPT {
                self.sent.pop_front();
            }
            self.sent.push_back(offset);
        }
    }

    /// Records that the coordinator acknowledged `offset` (next-to-read form).
    pub(crate) fn mark_acked(&mut self, offset: i64) {
        if self.acked.is_none_or(|c| offset > c) {
            self.acked = Some(offset);
        }
    }

    /// Forgets the last commit so the next [`OffsetTracker::committable`]
    /// returns the watermark again; used when an async commit failed.
    pub(crate) fn reset_committed(&mut self) {
        self.committed = None;
    }

    /// The last committed position (next-to-read form).
    #[cfg(test)]
    pub(crate) fn committed(&self) -> Option<i64> {
        self.committed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_tracker_has_nothing_to_commit() {
        let t = OffsetTracker::new();
        assert_eq!(t.watermark(), None);
        assert_eq!(t.committable(), None);
    }

    #[test]
    fn in_order_completion_commits_last_plus_one() {
        let mut t = OffsetTracker::new();
        for o in 5..8 {
            t.start(o);
        }
        for o in 5..8 {
            assert!(t.finish(o));
        }
        assert_eq!(
            t.committable(),
            Some(8),
            "next offset to read, not last done"
        );
    }

    #[test]
    fn out_of_order_completion_never_passes_unfinished_work() {
        let mut t = OffsetTracker::new();
        for o in 10..15 {
            t.start(o);
        }
        // 11 is blocked; everything else finishes.
        for o in [14, 12, 10, 13] {
            t.finish(o);
        }
        assert_eq!(t.watermark(), Some(11));
        t.mark_committed(11);
        assert_eq!(t.committable(), None, "nothing new to commit while 11 runs");
        t.finish(11);
        assert_eq!(t.committable(), Some(15));
    }

    #[test]
    fn commit_only_moves_forward() {
        let mut t = OffsetTracker::new();
        t.start(1);
        t.finish(1);
        t.mark_committed(2);
        t.mark_committed(1);
        assert_eq!(t.committed(), Some(2));
        t.reset_committed();
        assert_eq!(t.committable(), Some(2));
    }

    #[test]
    fn oldest_timestamp_follows_in_flight_records() {
        let mut t = OffsetTracker::new();
        t.start_at(1, Some(500));
        t.start_at(2, Some(300));
        t.start(3);
        assert_eq!(t.oldest_timestamp(), Some(300));
        t.finish(2);
        assert_eq!(t.oldest_timestamp(), Some(500));
        t.finish(1);
        t.finish(3);
        assert_eq!(t.oldest_timestamp(), None);
    }

    #[test]
    fn a_returning_partition_is_recognised_by_where_fetching_starts() {
        let mut t = OffsetTracker::new();
        for o in 100..110 {
            t.start(o);
        }
        for o in 100..105 {
            t.finish(o);
        }
        // Nothing acknowledged yet: only the start position matches.
        assert!(t.position_unchanged(100));
        assert!(!t.position_unchanged(103));
        t.mark_committed(103);
        assert!(t.position_unchanged(103), "the commit sent may have landed");
        t.reset_committed();
        t.mark_committed(104);
        assert!(
            t.position_unchanged(103),
            "an earlier commit sent may be the one that landed"
        );
        t.mark_acked(103);
        assert!(!t.position_unchanged(100), "acknowledged past the start");
        assert!(t.position_unchanged(103));
        assert!(!t.position_unchanged(105), "moved by someone else");
        assert!(t.finished_here(104) && !t.finished_here(105));
        assert!(!t.finished_here(99) && !t.finished_here(110));
    }

    #[test]
    fn restarts_out_of_order_and_tombstones_keep_the_watermark_right() {
        let mut t = OffsetTracker::new();
        for o in [10, 11, 12, 20] {
            t.start(o);
        }
        assert!(t.finish(11) && t.finish(12));
        assert_eq!(t.watermark(), Some(10));
        // 11 fetched again after a seek back: in flight again, once.
        t.start_at(11, Some(7));
        t.start_at(11, Some(9));
        assert!(t.is_in_flight(11));
        assert_eq!(t.in_flight(), 3);
        assert_eq!(t.oldest_timestamp(), Some(7));
        // A lower offset than any started: in front of the rest.
        t.start(5);
        assert_eq!(t.watermark(), Some(5));
        for o in [5, 10, 11] {
            assert!(t.finish(o));
        }
        assert_eq!(t.watermark(), Some(20));
        assert!(t.finish(20));
        assert_eq!((t.watermark(), t.in_flight()), (Some(21), 0));
    }

    #[test]
    fn a_long_job_at_the_front_does_not_grow_the_tracker_with_tombstones() {
        let mut t = OffsetTracker::new();
        t.start(0);
        for o in 1..100_000 {
            t.start(o);
            assert!(t.finish(o));
        }
        assert_eq!(t.watermark(), Some(0));
        assert_eq!(t.in_flight(), 1);
        assert!(t.in_flight.len() <= 1 + TOMBSTONE_SLACK + 1);
        assert!(t.finish(0));
        assert_eq!(t.watermark(), Some(100_000));
        assert!(
            t.in_flight.capacity() <= SHRINK_ABOVE,
            "room given back when idle"
        );
    }

    proptest::proptest! {
        /// Against a plain set of in-flight offsets: any order of starts
        /// (ascending with seeks back) and finishes gives the same answers.
        #[test]
        fn agrees_with_a_set_of_in_flight_offsets(ops in proptest::collection::vec((0u8..3, 0i64..64), 0..400)) {
            let mut t = OffsetTracker::new();
            let mut model = std::collections::BTreeSet::new();
            let mut next = 0i64;
            for (op, o) in ops {
                match op {
                    0 => { t.start(next); model.insert(next); next += 1 + o % 3; }
                    1 => { let o = o.min(next); t.start(o); model.insert(o); }
                    _ => { let o = o.min(next); proptest::prop_assert_eq!(t.finish(o), model.remove(&o)); }
                }
                proptest::prop_assert_eq!(t.in_flight(), model.len());
                let want = model.iter().next().copied().or(t.highest_seen().map(|h| h + 1));
                proptest::prop_assert_eq!(t.watermark(), want);
                proptest::prop_assert_eq!(t.is_in_flight(o), model.contains(&o));
            }
        }
    }

    #[test]
    fn stale_completion_is_reported() {
        let mut t = OffsetTracker::new();
        assert!(!t.finish(3));
        t.start(3);
        assert!(t.finish(3));
        assert!(!t.finish(3));
    }
}
