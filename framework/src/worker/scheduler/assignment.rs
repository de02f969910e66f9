//! Partitions coming and going: an assignment's fresh state, a revoke's
//! two steps (drop what has not started, then release and commit once the
//! running jobs are done), and a stop. The watermark of a partition that
//! was *lost* is kept here for the case that it comes back unchanged (see
//! the module docs of [`super`]).

use rustc_hash::FxHashMap;
use tokio_util::sync::CancellationToken;

use super::types::{Action, LaneKey, Located, Part, Tp, LOST_KEPT};
use super::{passing, Scheduler};
use crate::offsets::OffsetTracker;

impl<R: Located> Scheduler<R> {
    /// Assigned partitions, in no particular order.
    pub(crate) fn assigned(&self) -> Vec<Tp> {
        self.slots.iter().flatten().map(|p| p.tp.clone()).collect()
    }

    /// Partitions were assigned: fresh state, and the pause view of each
    /// (the adapter applies it, whatever the consumer believed before).
    pub(crate) fn assign(&mut self, tps: &[Tp], out: &mut Vec<Action<R>>) {
        for tp in tps {
            if let Some(slot) = self.slot_of(&tp.0, tp.1) {
                // Re-assigned without a release in between: start afresh.
                if let Some(old) = self.slots[slot].take() {
                    old.released.cancel();
                }
                if let Some(m) = self.index.get_mut(&tp.0) {
                    m.remove(&tp.1);
                }
            }
            self.next_epoch += 1;
            let level = self
                .priorities
                .get(&tp.0)
                .copied()
                .unwrap_or_default()
                .level();
            let returning = self
                .lost
                .iter()
                .find(|(_, (t, _))| t == tp)
                .map(|(e, _)| *e)
                .and_then(|e| self.lost.remove(&e).map(|(_, t)| (e, t)));
            let part = Part {
                tp: tp.clone(),
                epoch: self.next_epoch,
                level,
                fair: self.fair_topics.get(&tp.0).copied(),
                turn: self.turns.for_topic(&tp.0),
                back: self.turns.back.contains(&tp.0),
                tracker: OffsetTracker::new(),
                released: std::sync::Arc::new(CancellationToken::new()),
                lanes: FxHashMap::default(),
                paused_bound: false,
                hold: None,
                held: None,
                revoked: false,
                max_dispatched: None,
                returning,
                skip: None,
                pass: self
                    .fair_topics
                    .get(&tp.0)
                    .and_then(|r| self.ready.fair.get(usize::from(*r)))
                    .filter(|r| r.route() == tp.0)
                    .map(|_| passing::Passing::new(self.limits.max_in_flight)),
            };
            let slot = match self.slots.iter().position(Option::is_none) {
                Some(free) => {
                    self.slots[free] = Some(part);
                    free
                }
                None => {
                    self.slots.push(Some(part));
                    self.slots.len() - 1
                }
            };
            self.index
                .entry(tp.0.clone())
                .or_default()
                .insert(tp.1, slot);
            out.push(if self.stopping {
                Action::Pause(tp.clone())
            } else {
                Action::Resume(tp.clone())
            });
        }
    }

    /// Begins a revoke: nothing more of `tps` is dispatched, and their
    /// queued and ready jobs are dropped (uncommitted). Running jobs finish;
    /// the adapter waits for [`Scheduler::running_in`] to reach 0, bounded,
    /// then calls [`Scheduler::release`].
    pub(crate) fn revoke(&mut self, tps: &[Tp]) {
        for tp in tps {
            let Some(slot) = self.slot_of(&tp.0, tp.1) else {
                continue;
            };
            self.ready.retain(|j| j.ticket.slot != slot);
            if let Some(p) = self.slots[slot].as_mut() {
                p.revoked = true;
                p.released.cancel();
                // Only lanes whose head is running remain.
                p.lanes.retain(|_, l| {
                    l.queue.clear();
                    l.running
                });
            }
        }
    }

    /// Running jobs of `tps`.
    pub(crate) fn running_in(&self, tps: &[Tp]) -> usize {
        tps.iter()
            .filter_map(|tp| self.part(tp))
            .map(|p| p.lanes.values().filter(|l| l.running).count())
            .sum()
    }

    /// Ends a revoke: commits the watermark of `tps` (unless they were lost
    /// to another member, whose position ours could move backwards) and
    /// forgets them.
    pub(crate) fn release(&mut self, tps: &[Tp], lost: bool, out: &mut Vec<Action<R>>) {
        let mut commits = Vec::new();
        for tp in tps {
            let Some(slot) = self.slot_of(&tp.0, tp.1) else {
                continue;
            };
            if let Some(p) = self.slots[slot].take() {
                p.released.cancel();
                if !lost {
                    if let Some(next) = p.tracker.committable() {
                        commits.push((p.tp.clone(), next));
                    }
                } else {
                    // Kept in case the partition comes back unchanged.
                    if self.lost.len() >= LOST_KEPT {
                        if let Some(oldest) = self.lost.keys().min().copied() {
                            self.lost.remove(&oldest);
                        }
                    }
                    match p.returning {
                        // Lost again before a record came: the older state.
                        Some((epoch, tracker)) => self.lost.insert(epoch, (p.tp, tracker)),
                        None => self.lost.insert(p.epoch, (p.tp, p.tracker)),
                    };
                }
            }
            self.ready.retain(|j| j.ticket.slot != slot);
            if let Some(m) = self.index.get_mut(&tp.0) {
                m.remove(&tp.1);
            }
        }
        if !commits.is_empty() {
            out.push(Action::Commit(commits));
        }
    }

    /// Stops: no more records are accepted, and every partition is paused.
    /// Running jobs finish.
    ///
    /// With `close_gaps == false` (SIGTERM, a revoke-like stop) everything
    /// not started is dropped at once: it is uncommitted, so the next owner
    /// runs it; a job that finished above one of them runs again there.
    /// With `close_gaps == true` (a planned stop, such as a worker limit)
    /// the jobs *below* the highest one started in each partition still
    /// run, so the watermark reaches every finished job and the next worker
    /// repeats nothing; only jobs above it are dropped.
    pub(crate) fn stop(&mut self, close_gaps: bool, out: &mut Vec<Action<R>>) {
        self.stopping = true;
        let slots = &self.slots;
        let below = |slot: usize, offset: i64| {
            close_gaps
                && slots
                    .get(slot)
                    .and_then(Option::as_ref)
                    .and_then(|p| p.max_dispatched)
                    .is_some_and(|m| offset < m)
        };
        self.ready.retain(|j| below(j.ticket.slot, j.ticket.offset));
        let kept: Vec<(usize, LaneKey)> = self
            .ready
            .iter()
            .map(|j| (j.ticket.slot, j.ticket.lane))
            .collect();
        for (slot, part) in self.slots.iter_mut().enumerate() {
            let Some(p) = part.as_mut() else { continue };
            p.released.cancel();
            let limit = p.max_dispatched.filter(|_| close_gaps);
            p.lanes.retain(|lane, l| {
                l.queue
                    .retain(|j| limit.is_some_and(|m| j.ticket.offset < m));
                l.running || !l.queue.is_empty() || kept.contains(&(slot, *lane))
            });
            out.push(Action::Pause(p.tp.clone()));
        }
    }

    /// Nothing runs, waits to run or is parked: a stop is complete.
    pub(crate) fn idle(&self) -> bool {
        self.running == 0 && self.ready.is_empty() && self.parked.is_empty()
    }
}
