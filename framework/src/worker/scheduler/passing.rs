//! Reading past a flood on a fair route's main topic.
//!
//! A partition holds at most `max_in_flight` records in memory. When one
//! tenant floods it, that buffer fills with the tenant's records and the
//! other tenants' records sit behind them in the log, unread: fairness
//! among ready jobs cannot help jobs that were never fetched. So a tenant
//! may hold at most a *share* of a partition's buffer (a quarter). Its
//! later records are *read past*: their offsets are noted (offset, tenant,
//! key lane: a few dozen bytes each) and the records themselves dropped,
//! and reading goes on to the other tenants' records behind them.
//!
//! Guarantees, and why they hold:
//! - **Commit after handle.** A passed offset stays in the partition's
//!   offset tracker as unfinished, so the committed watermark never moves
//!   past it. A crash or a rebalance re-delivers it from the log, like any
//!   record fetched and not yet handled. Nothing is copied or forwarded,
//!   so nothing can be lost between two topics.
//! - **Per-key order.** Once a tenant has a record passed, every later
//!   record of that tenant, and every later record with the key of a passed
//!   one (whatever its tenant), is passed too, until they are read again.
//!   Records are read again strictly in offset order (only the lowest
//!   passed offset may be taken), so a key's jobs enter its lane in log
//!   order.
//! - **Read again at the tenant's share.** When the tenant of the lowest
//!   passed offset is down to a quarter of its share, the partition seeks back to
//!   that offset. Records fetched again are skipped if they were handled or
//!   are still buffered; passed ones are taken while their tenant has room.
//!   At the first that does not fit, the partition seeks forward to where
//!   reading had got to, so a flood is read about twice, not once per
//!   round.
//! - **Bounded.** At `PASSED_PER_BOUND` times the buffer in passed offsets,
//!   the partition stops reading new records (it pauses, as for a full
//!   buffer) and only reads again what it passed.
//!
//! A planned stop cannot close the gaps passed records leave below the
//! highest started job (they are not in memory): they, and the finished
//! jobs above them, run again after the restart, as after a crash.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::worker::scheduler::LaneKey;

/// How many passed offsets a partition keeps, per record of its buffer.
pub(super) const PASSED_PER_BOUND: usize = 40;

/// What to do with a fetched record of a partition that reads past.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Take it (count it with [`Passing::admitted`]).
    Admit,
    /// Fetched again and handled or buffered already, or still passed.
    Skip,
    /// Read past (noted here; the caller keeps its offset unfinished).
    Pass,
    /// Stop reading again: seek forward to this offset.
    SeekForward(i64),
}

/// The read-past state of one partition.
#[derive(Debug)]
pub(super) struct Passing {
    /// The most records of one tenant buffered at once.
    share: usize,
    /// Buffered (taken, not finished) records per tenant.
    buffered: FxHashMap<u32, usize>,
    /// Passed offsets with their tenant and lane, in offset order.
    passed: BTreeMap<i64, (u32, LaneKey)>,
    /// Passed offsets per tenant and per lane: what makes later records
    /// of either follow them.
    tenants: FxHashMap<u32, usize>,
    lanes: FxHashMap<LaneKey, usize>,
    /// While reading again: the highest offset read before the seek back.
    rereading: Option<i64>,
}

impl Passing {
    /// For a partition whose buffer holds `bound` records.
    pub(super) fn new(bound: usize) -> Self {
        Self {
            share: (bound / 4).max(1),
            buffered: FxHashMap::default(),
            passed: BTreeMap::new(),
            tenants: FxHashMap::default(),
            lanes: FxHashMap::default(),
            rereading: None,
        }
    }

    /// How many offsets are passed now.
    pub(super) fn passed(&self) -> usize {
        self.passed.len()
    }

    /// Whether a seek back is being read.
    #[cfg(test)]
    pub(super) fn rereading(&self) -> bool {
        self.rereading.is_some()
    }

    /// Whether the passed offsets reached their bound: the partition stops
    /// reading new records (unless it is reading again).
    pub(super) fn full(&self, bound: usize) -> bool {
        self.rereading.is_none() && self.passed.len() >= bound.saturating_mul(PASSED_PER_BOUND)
    }

    fn room(&self, tenant: u32) -> bool {
        self.buffered.get(&tenant).copied().unwrap_or(0) < self.share
    }

    /// The verdict on a fetched record. `highest_seen` is the highest
    /// offset seen before it; `in_flight`, whether the tracker has it
    /// started and unfinished (buffered, or passed).
    pub(super) fn record(
        &mut self,
        offset: i64,
        highest_seen: Option<i64>,
        in_flight: bool,
        tenant: u32,
        lane: LaneKey,
    ) -> Verdict {
        if self.rereading.is_some_and(|h| offset > h) {
            // Read again up to where reading had got: new records now.
            self.rereading = None;
        }
        if highest_seen.is_none_or(|h| offset > h) {
            let follows = self.tenants.contains_key(&tenant) || self.lanes.contains_key(&lane);
            if follows || !self.room(tenant) {
                self.passed.insert(offset, (tenant, lane));
                *self.tenants.entry(tenant).or_default() += 1;
                *self.lanes.entry(lane).or_default() += 1;
                return Verdict::Pass;
            }
            return Verdict::Admit;
        }
        let Some(&(t, l)) = self.passed.get(&offset) else {
            // Handled (the caller skips those first) or buffered: not twice.
            return if in_flight {
                Verdict::Skip
            } else {
                Verdict::Admit
            };
        };
        let lowest = self.passed.keys().next() == Some(&offset);
        if self.rereading.is_some() && lowest && self.room(t) {
            self.passed.remove(&offset);
            Self::less(&mut self.tenants, t);
            Self::less(&mut self.lanes, l);
            return Verdict::Admit;
        }
        match self.rereading.take() {
            Some(h) => Verdict::SeekForward(h + 1),
            None => Verdict::Skip,
        }
    }

    fn less<K: std::hash::Hash + Eq>(counts: &mut FxHashMap<K, usize>, k: K) {
        if let Some(n) = counts.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&k);
            }
        }
    }

    /// A record of `tenant` was taken.
    pub(super) fn admitted(&mut self, tenant: u32) {
        *self.buffered.entry(tenant).or_default() += 1;
    }

    /// A taken record of `tenant` finished (or gave up).
    pub(super) fn finished(&mut self, tenant: u32) {
        Self::less(&mut self.buffered, tenant);
    }

    /// The offset to seek back to when passed records should be read again
    /// now: the tenant of the lowest is down to a quarter of its share, so
    /// a round takes three quarters of a share.
    /// `highest_seen` is where reading has got. Asked after each finished
    /// job and on every tick, so reading again never waits for an event.
    pub(super) fn reread(&mut self, highest_seen: Option<i64>) -> Option<i64> {
        if self.rereading.is_some() {
            return None;
        }
        let (&lowest, &(t, _)) = self.passed.iter().next()?;
        if self.buffered.get(&t).copied().unwrap_or(0) > self.share / 4 {
            return None;
        }
        self.rereading = Some(highest_seen?);
        Some(lowest)
    }
}
