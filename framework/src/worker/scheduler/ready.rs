//! The ready queues: jobs whose lane is free, one queue per priority
//! level, a fair route's jobs kept per tenant ([`FairRoute`]).

use std::collections::VecDeque;

use super::fair::FairRoute;
use super::types::{Job, Ticket};
use crate::worker::Priority;

/// One place in a level's ready queue: a job, or `n` ready jobs of a fair
/// route (which of them runs is the route's fair pick, [`FairRoute`]).
pub(super) enum Entry<R> {
    Job(Job<R>),
    Fair(u16, usize),
}

/// Jobs whose lane is free, one queue per priority level.
pub(super) struct Ready<R> {
    queues: [VecDeque<Entry<R>>; Priority::LEVELS],
    /// Ready jobs per level (a fair entry counts its jobs).
    counts: [usize; Priority::LEVELS],
    /// The fair routes' ready jobs by tenant, by route index.
    pub(super) fair: Vec<FairRoute<R>>,
}

impl<R> Ready<R> {
    pub(super) fn new() -> Self {
        Self {
            queues: std::array::from_fn(|_| VecDeque::new()),
            counts: [0; Priority::LEVELS],
            fair: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, job: Job<R>) {
        let level = job.ticket.level;
        self.counts[level] += 1;
        let q = &mut self.queues[level];
        match job.ticket.fair {
            Some((r, t)) => {
                if let Some(route) = self.fair.get_mut(usize::from(r)) {
                    route.push(t, job);
                }
                // Tokens of one route are alike: consecutive ones merge.
                match q.back_mut() {
                    Some(Entry::Fair(last, n)) if *last == r => *n += 1,
                    _ => q.push_back(Entry::Fair(r, 1)),
                }
            }
            None => q.push_back(Entry::Job(job)),
        }
    }

    /// Takes up to `n` jobs of `level` in queue order (a fair route's by
    /// its fair pick) into `out`; answers how many. A fair route whose
    /// tenants with ready jobs are all at their cap keeps its place.
    pub(super) fn take(&mut self, level: usize, n: usize, out: &mut Vec<Job<R>>) -> usize {
        let mut taken = 0;
        let mut blocked: Vec<u16> = Vec::new();
        let mut kept: Vec<Entry<R>> = Vec::new();
        while taken < n {
            let Some(entry) = self.queues[level].pop_front() else {
                break;
            };
            match entry {
                Entry::Job(j) => {
                    out.push(j);
                    taken += 1;
                }
                Entry::Fair(r, mut left) => {
                    if !blocked.contains(&r) {
                        if let Some(route) = self.fair.get_mut(usize::from(r)) {
                            while left > 0 && taken < n {
                                let Some(j) = route.pick() else {
                                    blocked.push(r);
                                    break;
                                };
                                out.push(j);
                                taken += 1;
                                left -= 1;
                            }
                        }
                    }
                    if left > 0 {
                        kept.push(Entry::Fair(r, left));
                    }
                }
            }
        }
        for e in kept.into_iter().rev() {
            self.queues[level].push_front(e);
        }
        self.counts[level] -= taken;
        taken
    }

    /// Ready jobs of `level`.
    pub(super) fn len_at(&self, level: usize) -> usize {
        self.counts[level]
    }

    pub(super) fn len(&self) -> usize {
        self.counts.iter().sum()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A fair route's parked job has its slot again: its tenant runs one
    /// more.
    pub(super) fn resumed(&mut self, ticket: &Ticket) {
        if let Some((r, t)) = ticket.fair {
            if let Some(route) = self.fair.get_mut(usize::from(r)) {
                route.resumed(t);
            }
        }
    }

    /// A fair route's job parked: its tenant holds one slot fewer.
    pub(super) fn parked(&mut self, ticket: &Ticket) {
        if let Some((r, t)) = ticket.fair {
            if let Some(route) = self.fair.get_mut(usize::from(r)) {
                route.parked(t);
            }
        }
    }

    /// A fair route's job finished; `holding` if it held a slot.
    pub(super) fn finished(&mut self, ticket: &Ticket, holding: bool) {
        if let Some((r, t)) = ticket.fair {
            if let Some(route) = self.fair.get_mut(usize::from(r)) {
                route.finished(t, holding);
            }
        }
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Job<R>) -> bool) {
        // Fair jobs first: then as many of each route's tokens go.
        let mut gone: Vec<usize> = self.fair.iter_mut().map(|f| f.retain(&mut keep)).collect();
        for (level, q) in self.queues.iter_mut().enumerate() {
            let mut removed = 0;
            q.retain(|e| match e {
                Entry::Job(j) => {
                    let k = keep(j);
                    removed += usize::from(!k);
                    k
                }
                Entry::Fair(..) => true,
            });
            for e in q.iter_mut().rev() {
                if let Entry::Fair(r, n) = e {
                    let g = &mut gone[usize::from(*r)];
                    let cut = (*g).min(*n);
                    *n -= cut;
                    *g -= cut;
                    removed += cut;
                }
            }
            q.retain(|e| !matches!(e, Entry::Fair(_, 0)));
            self.counts[level] -= removed;
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Job<R>> {
        self.queues
            .iter()
            .flatten()
            .filter_map(|e| match e {
                Entry::Job(j) => Some(j),
                Entry::Fair(..) => None,
            })
            .chain(self.fair.iter().flat_map(FairRoute::iter))
    }

    pub(super) fn clear(&mut self) {
        self.queues.iter_mut().for_each(VecDeque::clear);
        self.fair.iter_mut().for_each(FairRoute::clear);
        self.counts = [0; Priority::LEVELS];
    }
}
