//! The ready queues: jobs whose lane is free, one queue per priority
//! level. Within a level each route has a queue of its own and the routes
//! with ready jobs take turns, one job each, so a flood of one route's
//! jobs does not queue another route's behind it; within a route, its new
//! jobs and its jobs coming back from delay buckets and retry tiers take
//! turns too ([`RouteQueue`]); a fair route's jobs are kept per tenant
//! ([`FairRoute`]).

use std::collections::VecDeque;

use crate::worker::scheduler::fair::FairRoute;
use crate::worker::scheduler::types::{Job, Ticket};
use crate::worker::Priority;

/// One place in a route's ready queue: a job, or `n` ready jobs of a fair
/// route (which of them runs is the route's fair pick, [`FairRoute`]).
pub(super) enum Entry<R> {
    Job(Job<R>),
    Fair(u16, usize),
}

/// One level's ready jobs: a queue per route, and the routes whose queue
/// holds something, in turn order.
struct Level<R> {
    routes: Vec<RouteQueue<R>>,
    turns: VecDeque<u16>,
}

impl<R> Level<R> {
    fn new() -> Self {
        Self {
            routes: Vec::new(),
            turns: VecDeque::new(),
        }
    }

    fn queue(&mut self, route: u16, back: bool) -> &mut VecDeque<Entry<R>> {
        let i = usize::from(route);
        if self.routes.len() <= i {
            self.routes.resize_with(i + 1, RouteQueue::default);
        }
        if self.routes[i].is_empty() {
            self.turns.push_back(route);
        }
        &mut self.routes[i].queues[usize::from(back)]
    }
}

/// One route's ready jobs, in two queues that take turns: jobs new to the
/// route (its main topic) and jobs coming back (from its delay buckets
/// and retry tiers, [`crate::worker::scheduler::Turns::back`]). Why: 5 000 delayed jobs due
/// in the same second, ready in one queue with the route's new jobs, held
/// every slot until they were through, and a job due now waited behind
/// them (238 ms at p99 in the `delays` bench, 10 ms with 2 048 slots). The
/// two queues share the route's one turn, so other routes keep their share.
struct RouteQueue<R> {
    /// `[new, coming back]`.
    queues: [VecDeque<Entry<R>>; 2],
    /// Which queue goes first when both hold jobs.
    next: usize,
}

impl<R> Default for RouteQueue<R> {
    fn default() -> Self {
        Self {
            queues: [VecDeque::new(), VecDeque::new()],
            next: 0,
        }
    }
}

impl<R> RouteQueue<R> {
    fn is_empty(&self) -> bool {
        self.queues.iter().all(VecDeque::is_empty)
    }

    /// Up to `n` jobs: one from each queue in turn while both hold some,
    /// then the rest from the one that does.
    fn take(
        &mut self,
        fair: &mut [FairRoute<R>],
        blocked: &mut Vec<u16>,
        n: usize,
        out: &mut Vec<Job<R>>,
    ) -> usize {
        let mut taken = 0;
        // A queue that gave nothing holds only blocked fair entries.
        let mut stalled = [false; 2];
        while taken < n {
            let open = |i: usize| !stalled[i] && !self.queues[i].is_empty();
            let i = match (open(0), open(1)) {
                (false, false) => break,
                (true, false) => 0,
                (false, true) => 1,
                (true, true) => {
                    let i = self.next;
                    self.next = 1 - i;
                    let got = Ready::take_from(&mut self.queues[i], fair, blocked, 1, out);
                    stalled[i] = got == 0;
                    taken += got;
                    continue;
                }
            };
            taken += Ready::take_from(&mut self.queues[i], fair, blocked, n - taken, out);
            break;
        }
        taken
    }
}

/// Jobs whose lane is free, one set of queues per priority level.
pub(super) struct Ready<R> {
    levels: [Level<R>; Priority::LEVELS],
    /// Ready jobs per level (a fair entry counts its jobs).
    counts: [usize; Priority::LEVELS],
    /// The fair routes' ready jobs by tenant, by route index.
    pub(super) fair: Vec<FairRoute<R>>,
}

impl<R> Ready<R> {
    pub(super) fn new() -> Self {
        Self {
            levels: std::array::from_fn(|_| Level::new()),
            counts: [0; Priority::LEVELS],
            fair: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, job: Job<R>) {
        let level = job.ticket.level;
        self.counts[level] += 1;
        let q = self.levels[level].queue(job.ticket.turn, job.ticket.back);
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

    /// Takes up to `n` jobs of `level` into `out`, the routes taking turns
    /// and each route's in queue order (a fair route's by its fair pick);
    /// answers how many. A fair route whose tenants with ready jobs are
    /// all at their cap keeps its place.
    pub(super) fn take(&mut self, level: usize, n: usize, out: &mut Vec<Job<R>>) -> usize {
        let mut taken = 0;
        let mut blocked: Vec<u16> = Vec::new();
        // Routes whose queue holds only blocked entries: back in line after.
        let mut waiting: Vec<u16> = Vec::new();
        let fair = &mut self.fair;
        let lv = &mut self.levels[level];
        while taken < n {
            let Some(r) = lv.turns.pop_front() else {
                break;
            };
            // Alone in line: the route takes all it can in one go.
            let quantum = if lv.turns.is_empty() { n - taken } else { 1 };
            let q = &mut lv.routes[usize::from(r)];
            let got = q.take(fair, &mut blocked, quantum, out);
            taken += got;
            if got == 0 {
                waiting.push(r);
            } else if !q.is_empty() {
                lv.turns.push_back(r);
            }
        }
        // In their old order, ahead of the routes that had a turn.
        for r in waiting.into_iter().rev() {
            lv.turns.push_front(r);
        }
        self.counts[level] -= taken;
        taken
    }

    /// Takes up to `n` jobs of one route's queue, in its order.
    fn take_from(
        q: &mut VecDeque<Entry<R>>,
        fair: &mut [FairRoute<R>],
        blocked: &mut Vec<u16>,
        n: usize,
        out: &mut Vec<Job<R>>,
    ) -> usize {
        let mut taken = 0;
        let mut kept: Vec<Entry<R>> = Vec::new();
        while taken < n {
            let Some(entry) = q.pop_front() else {
                break;
            };
            match entry {
                Entry::Job(j) => {
                    out.push(j);
                    taken += 1;
                }
                Entry::Fair(r, mut left) => {
                    if !blocked.contains(&r) {
                        if let Some(route) = fair.get_mut(usize::from(r)) {
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
            q.push_front(e);
        }
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
        for (level, lv) in self.levels.iter_mut().enumerate() {
            let mut removed = 0;
            for q in lv.routes.iter_mut().flat_map(|r| r.queues.iter_mut()) {
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
            }
            let routes = &lv.routes;
            lv.turns.retain(|r| !routes[usize::from(*r)].is_empty());
            self.counts[level] -= removed;
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Job<R>> {
        self.levels
            .iter()
            .flat_map(|lv| lv.routes.iter().flat_map(|r| r.queues.iter().flatten()))
            .filter_map(|e| match e {
                Entry::Job(j) => Some(j),
                Entry::Fair(..) => None,
            })
            .chain(self.fair.iter().flat_map(FairRoute::iter))
    }

    pub(super) fn clear(&mut self) {
        for lv in &mut self.levels {
            lv.routes
                .iter_mut()
                .flat_map(|r| r.queues.iter_mut())
                .for_each(VecDeque::clear);
            lv.turns.clear();
        }
        self.fair.iter_mut().for_each(FairRoute::clear);
        self.counts = [0; Priority::LEVELS];
    }
}
