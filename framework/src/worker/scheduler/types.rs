//! The scheduler's vocabulary: what comes in (records), what goes out
//! (actions, jobs to run), and the per-partition state it keeps.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use tokio_util::sync::CancellationToken;

use super::fair::FairRoute;
use crate::offsets::OffsetTracker;
use crate::worker::Priority;

/// A topic-partition.
pub(crate) type Tp = (String, i32);

/// Which records must run one after another, within one partition.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(crate) enum LaneKey {
    /// Same record key (a 64-bit hash of it: no allocation per record; a
    /// collision only serialises two keys, it never reorders one).
    Key(u64),
    /// The whole partition (per-partition ordering, keyless records).
    Partition,
    /// One record (unordered mode).
    Offset(i64),
}

/// Where a record comes from; the scheduler needs nothing else of it.
pub(crate) trait Located {
    fn topic(&self) -> &str;
    fn partition(&self) -> i32;
    /// A header's value as text (a fair route's tenant).
    fn header(&self, name: &str) -> Option<&str>;
}

/// A record as the adapter hands it over: what the scheduler needs to
/// decide, plus the item it carries through to `Run`.
pub(crate) struct Incoming<R> {
    pub offset: i64,
    pub lane: LaneKey,
    pub timestamp_ms: Option<i64>,
    /// For a retry-tier record: when it is due (epoch ms).
    pub due_ms: Option<i64>,
    /// Written by another consumer group's retry path: not ours to run.
    pub foreign: bool,
    pub item: R,
}

/// Identifies a job when it comes back as finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Ticket {
    pub(super) slot: usize,
    pub(super) epoch: u64,
    pub offset: i64,
    pub(super) lane: LaneKey,
    pub(super) level: usize,
    /// A fair route's job: the route's index and its tenant's.
    pub(super) fair: Option<(u16, u32)>,
}

#[cfg(test)]
impl Ticket {
    /// A ticket for unit tests elsewhere in the worker.
    pub(crate) fn for_test(offset: i64) -> Self {
        Self {
            slot: 0,
            epoch: 0,
            offset,
            lane: LaneKey::Offset(offset),
            level: 0,
            fair: None,
        }
    }
}

/// A job to run now.
pub(crate) struct Job<R> {
    pub ticket: Ticket,
    pub item: R,
    /// Cancelled when this job's partition is revoked, lost or stopped: an
    /// attempt that is still *waiting* (for the schema registry, or parked
    /// by a layer such as the breaker) gives up then instead of holding the
    /// revoke or the shutdown; it is uncommitted, so the next owner runs it.
    /// A handler that already started is never cut short by it.
    pub released: CancellationToken,
}

/// What the adapter must do.
pub(crate) enum Action<R> {
    /// Run these jobs (one batch per event).
    Run(Vec<Job<R>>),
    /// Pause fetching this partition.
    Pause(Tp),
    /// Resume fetching this partition.
    Resume(Tp),
    /// Set this partition's fetch position.
    Seek(Tp, i64),
    /// Commit these positions (next offset to read).
    Commit(Vec<(Tp, i64)>),
    /// These parked jobs may go on: each got its slot back.
    Grant(Vec<Ticket>),
}

impl<R> std::fmt::Debug for Action<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Run(jobs) => {
                let offsets: Vec<i64> = jobs.iter().map(|j| j.ticket.offset).collect();
                write!(f, "Run({offsets:?})")
            }
            Action::Pause(tp) => write!(f, "Pause({tp:?})"),
            Action::Resume(tp) => write!(f, "Resume({tp:?})"),
            Action::Seek(tp, o) => write!(f, "Seek({tp:?}, {o})"),
            Action::Commit(c) => write!(f, "Commit({c:?})"),
            Action::Grant(t) => {
                let offsets: Vec<i64> = t.iter().map(|t| t.offset).collect();
                write!(f, "Grant({offsets:?})")
            }
        }
    }
}

/// The scheduler's limits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Jobs running at once across all partitions.
    pub concurrency: usize,
    /// Accepted-but-unfinished records per partition before it is paused.
    pub max_in_flight: usize,
    /// How often `tick` commits moved watermarks (ms).
    pub commit_interval_ms: i64,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Hold {
    pub(super) offset: i64,
    pub(super) due_ms: i64,
    pub(super) resumed: bool,
}

/// How long a priority level counts as active after its last record: long
/// enough to bridge the gaps of a steady trickle of urgent jobs.
pub(super) const ACTIVE_MS: i64 = 1_000;

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

    /// A fair route's job finished (or parked): its tenant runs one fewer.
    pub(super) fn finished(&mut self, ticket: &Ticket) {
        if let Some((r, t)) = ticket.fair {
            if let Some(route) = self.fair.get_mut(usize::from(r)) {
                route.finished(t);
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

/// A lane with a job ready or running at its head.
pub(super) struct Lane<R> {
    /// The head job was dispatched (it is not in the ready queue).
    pub(super) running: bool,
    /// Jobs waiting behind the head, in offset order.
    pub(super) queue: VecDeque<Job<R>>,
}

pub(super) struct Part<R> {
    pub(super) tp: Tp,
    pub(super) epoch: u64,
    /// Priority level of the partition's topic (0 is the most urgent).
    pub(super) level: usize,
    /// The fair route the topic belongs to, if any (its index).
    pub(super) fair: Option<u16>,
    pub(super) tracker: OffsetTracker,
    /// Cancelled when this assignment ends (see [`Job::released`]).
    pub(super) released: CancellationToken,
    /// Fx, not SipHash: looked up twice per record. Its keys are offsets
    /// or per-process randomly seeded hashes of record keys (see
    /// `record::incoming`), so a producer cannot aim keys at one bucket.
    pub(super) lanes: FxHashMap<LaneKey, Lane<R>>,
    pub(super) paused_bound: bool,
    pub(super) hold: Option<Hold>,
    pub(super) revoked: bool,
    /// The highest offset handed to a runner in this assignment.
    pub(super) max_dispatched: Option<i64>,
    /// What this member finished here before it lost the partition (and
    /// the lost assignment's epoch), until the first record shows whether
    /// the group's position is unchanged.
    pub(super) returning: Option<(u64, OffsetTracker)>,
    /// That state once taken up: records it saw finish are skipped as they
    /// are fetched again (offsets in order; dropped past its highest).
    pub(super) skip: Option<(u64, OffsetTracker)>,
}

/// The most lost partitions whose finished work is remembered (each costs
/// its in-flight offsets, at most the in-flight bound).
pub(super) const LOST_KEPT: usize = 4_096;

impl<R> Part<R> {
    pub(super) fn wants_pause(&self) -> bool {
        self.paused_bound || self.hold.is_some_and(|h| !h.resumed)
    }
}
