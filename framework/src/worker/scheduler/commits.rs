//! The commit side of the scheduler: which watermarks to commit, what the
//! adapter reports back, and the per-topic age of what is uncommitted.

use std::collections::HashMap;

use crate::worker::scheduler::{Action, Located, Scheduler, Tp};

impl<R: Located> Scheduler<R> {
    /// A `Commit` of every watermark that moved.
    pub(crate) fn commit_all(&mut self, out: &mut Vec<Action<R>>) {
        let commits: Vec<(Tp, i64)> = self
            .slots
            .iter()
            .flatten()
            .filter(|p| !p.revoked)
            .filter_map(|p| p.tracker.committable().map(|n| (p.tp.clone(), n)))
            .collect();
        if !commits.is_empty() {
            out.push(Action::Commit(commits));
        }
    }

    /// The adapter sent a commit of these positions.
    pub(crate) fn committed(&mut self, offsets: &[(Tp, i64)]) {
        for (tp, next) in offsets {
            if let Some(slot) = self.slot_of(&tp.0, tp.1) {
                if let Some(p) = self.slots[slot].as_mut() {
                    p.tracker.mark_committed(*next);
                }
            }
        }
    }

    /// The coordinator acknowledged these positions.
    pub(crate) fn acknowledged(&mut self, offsets: &[(Tp, i64)]) {
        for (tp, next) in offsets {
            if let Some(slot) = self.slot_of(&tp.0, tp.1) {
                if let Some(p) = self.slots[slot].as_mut() {
                    p.tracker.mark_acked(*next);
                }
            }
        }
    }

    /// An asynchronous commit failed: the next `commit_all` commits every
    /// watermark again.
    pub(crate) fn commit_failed(&mut self) {
        for p in self.slots.iter_mut().flatten() {
            p.tracker.reset_committed();
        }
    }

    /// Per topic, the oldest record timestamp still pending (epoch ms).
    pub(crate) fn oldest_pending(&self) -> HashMap<String, Option<i64>> {
        let mut out: HashMap<String, Option<i64>> = HashMap::new();
        for p in self.slots.iter().flatten() {
            let slot = out.entry(p.tp.0.clone()).or_default();
            if let Some(ts) = p.tracker.oldest_timestamp() {
                *slot = Some(slot.map_or(ts, |s: i64| s.min(ts)));
            }
        }
        out
    }

    /// Partitions that came back after a loss and still wait for their
    /// first record to show whether the group's position moved.
    pub(crate) fn returning(&self) -> Vec<Tp> {
        self.slots
            .iter()
            .flatten()
            .filter(|p| p.returning.is_some())
            .map(|p| p.tp.clone())
            .collect()
    }

    /// The adapter learned that `tp`'s position was committed by someone
    /// else: what this member finished before its loss is forgotten, so
    /// everything from the position runs again.
    pub(crate) fn forget_returning(&mut self, tp: &Tp) {
        if let Some(slot) = self.slot_of(&tp.0, tp.1) {
            if let Some(p) = self.slots[slot].as_mut() {
                p.returning = None;
            }
        }
    }

    /// Per fair route main topic: records read past and not yet read again
    /// (see `passing`).
    pub(crate) fn read_past(&self) -> Vec<(String, usize)> {
        let mut out: HashMap<String, usize> = HashMap::new();
        for p in self.slots.iter().flatten() {
            if let Some(pass) = &p.pass {
                *out.entry(p.tp.0.clone()).or_default() += pass.passed();
            }
        }
        let mut out: Vec<(String, usize)> = out.into_iter().collect();
        out.sort();
        out
    }

    /// Records skipped so far because this member had finished them before
    /// (a partition that came back after it was lost).
    pub(crate) fn skipped_finished(&self) -> u64 {
        self.skipped_finished
    }
}
