//! The scheduler: every decision about partitions, lanes and offsets, as a
//! plain state machine with no Kafka client in it.
//!
//! It takes events (`assigned`, `revoke`/`release`, `record`, `finished`,
//! `tick`, `stop`) and answers with [`Action`]s (`Run`, `Pause`, `Resume`,
//! `Seek`, `Commit`) for an adapter to carry out: the worker's poll thread
//! against rdkafka ([`super::poll`]), and the test harness against
//! in-memory logs on a virtual clock. Both therefore share per-key
//! ordering, backpressure, due-time holds and the commit watermark.
//!
//! Rules it keeps, each enforced here and nowhere else:
//!
//! * **Watermark.** A record enters its partition's [`OffsetTracker`] when it
//!   is accepted and leaves it only when its attempt reached a final
//!   outcome, so a `Commit` never passes an unfinished record.
//! * **Lanes.** Records of one lane (same key, same partition, or a single
//!   record, by ordering mode) run one after another: a lane has at most one
//!   job ready or running, the rest wait behind it.
//! * **Concurrency.** At most `concurrency` jobs run at once. Jobs whose lane
//!   is free wait in a ready queue; a revoke or a stop drops them at once
//!   (they are uncommitted, so the next owner gets them), and only running
//!   jobs are waited for.
//! * **Priorities.** Each topic has a priority level (its route's). There is
//!   one ready queue per level, and free slots go to the most urgent level
//!   first. While a more urgent level is active (it has jobs running or
//!   ready, or had a record within the last second), less urgent levels
//!   together use at most `concurrency - concurrency / 4` slots, so an
//!   urgent job finds a free slot at once however slow the bulk handlers
//!   are. Less urgent partitions are never paused for it: polling goes on
//!   and their share of slots keeps them moving.
//! * **Backpressure.** At `max_in_flight` accepted-but-unfinished records a
//!   partition is paused, and resumed at three quarters (so a single busy
//!   partition never drains while librdkafka refetches what the pause
//!   dropped). Polling never stops.
//! * **Holds.** A retry-tier record that is not due pauses its partition and
//!   seeks back to it; at the due time the partition is resumed and seeked
//!   again. Nothing else of the partition runs meanwhile.
//! * **Pause view.** What the scheduler says about a partition's pause is the
//!   truth; after every assignment the adapter re-applies it, because
//!   librdkafka keeps an application's pause across a revoke and a
//!   re-assignment.
//! * **Epochs.** Each assignment of a partition gets a fresh epoch; a
//!   completion from an older epoch (a job that outlived its revoke) is
//!   counted as no longer running but never marks an offset done.
//! * **Parking.** A job that waits for a downstream before its handler runs
//!   (the schema registry, an open breaker, a rate limit) gives its
//!   concurrency slot back ([`Scheduler::park`]) and keeps its lane, so its
//!   key's later jobs still wait behind it while other keys, partitions and
//!   routes run. When it can go on it asks for a slot again
//!   ([`Scheduler::unpark`]); parked jobs get free slots before jobs that
//!   never started, and the concurrency limit holds for both. Parked jobs
//!   stay in the in-flight bound, so memory stays bounded: parked jobs that
//!   fill a partition's bound pause that partition alone.
//! * **A partition that comes back.** When a partition is *lost* (the
//!   session expired, typically during a coordinator outage), what this
//!   member finished in it is kept. If the partition is assigned to this
//!   member again and fetching starts where this member left the group's
//!   position (nobody else committed meanwhile), the kept state is taken
//!   up again: records it finished are skipped instead of run a second
//!   time, and its watermark is committed. Otherwise it is dropped.
//!   Independently of that, a record this assignment already saw finish is
//!   never run again within it.

use std::collections::{HashMap, VecDeque};

use rustc_hash::FxHashMap;
use tokio_util::sync::CancellationToken;

use crate::worker::Priority;

use crate::offsets::OffsetTracker;

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
    slot: usize,
    epoch: u64,
    pub offset: i64,
    lane: LaneKey,
    level: usize,
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
struct Hold {
    offset: i64,
    due_ms: i64,
    resumed: bool,
}

/// How long a priority level counts as active after its last record: long
/// enough to bridge the gaps of a steady trickle of urgent jobs.
const ACTIVE_MS: i64 = 1_000;

/// Jobs whose lane is free, one queue per priority level.
struct Ready<R> {
    queues: [VecDeque<Job<R>>; Priority::LEVELS],
}

impl<R> Ready<R> {
    fn new() -> Self {
        Self {
            queues: std::array::from_fn(|_| VecDeque::new()),
        }
    }

    fn push(&mut self, job: Job<R>) {
        self.queues[job.ticket.level].push_back(job);
    }

    fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    fn is_empty(&self) -> bool {
        self.queues.iter().all(VecDeque::is_empty)
    }

    fn retain(&mut self, mut keep: impl FnMut(&Job<R>) -> bool) {
        for q in &mut self.queues {
            q.retain(&mut keep);
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Job<R>> {
        self.queues.iter().flatten()
    }

    fn clear(&mut self) {
        self.queues.iter_mut().for_each(VecDeque::clear);
    }
}

/// A lane with a job ready or running at its head.
struct Lane<R> {
    /// The head job was dispatched (it is not in the ready queue).
    running: bool,
    /// Jobs waiting behind the head, in offset order.
    queue: VecDeque<Job<R>>,
}

struct Part<R> {
    tp: Tp,
    epoch: u64,
    /// Priority level of the partition's topic (0 is the most urgent).
    level: usize,
    tracker: OffsetTracker,
    /// Cancelled when this assignment ends (see [`Job::released`]).
    released: CancellationToken,
    /// Fx, not SipHash: looked up twice per record. Its keys are offsets
    /// or per-process randomly seeded hashes of record keys (see
    /// `record::incoming`), so a producer cannot aim keys at one bucket.
    lanes: FxHashMap<LaneKey, Lane<R>>,
    paused_bound: bool,
    hold: Option<Hold>,
    revoked: bool,
    /// The highest offset handed to a runner in this assignment.
    max_dispatched: Option<i64>,
    /// What this member finished here before it lost the partition (and
    /// the lost assignment's epoch), until the first record shows whether
    /// the group's position is unchanged.
    returning: Option<(u64, OffsetTracker)>,
    /// That state once taken up: records it saw finish are skipped as they
    /// are fetched again (offsets in order; dropped past its highest).
    skip: Option<(u64, OffsetTracker)>,
}

/// The most lost partitions whose finished work is remembered (each costs
/// its in-flight offsets, at most the in-flight bound).
const LOST_KEPT: usize = 4_096;

impl<R> Part<R> {
    fn wants_pause(&self) -> bool {
        self.paused_bound || self.hold.is_some_and(|h| !h.resumed)
    }
}

/// See the module docs.
pub(crate) struct Scheduler<R> {
    limits: Limits,
    slots: Vec<Option<Part<R>>>,
    index: FxHashMap<String, FxHashMap<i32, usize>>,
    ready: Ready<R>,
    running: usize,
    /// Topic -> priority; unlisted topics are [`Priority::Normal`].
    priorities: HashMap<String, Priority>,
    /// Running jobs per priority level.
    running_at: [usize; Priority::LEVELS],
    /// When each level last took a record (ms).
    seen_ms: [i64; Priority::LEVELS],
    /// The latest time an event brought (ms).
    now_ms: i64,
    next_epoch: u64,
    stopping: bool,
    last_commit_ms: i64,
    /// Jobs that gave their slot back while they wait (see the module docs).
    parked: rustc_hash::FxHashSet<Ticket>,
    /// Parked jobs that asked for a slot again, per level, oldest first.
    unparking: [VecDeque<Ticket>; Priority::LEVELS],
    /// Lost partitions' trackers, by the epoch of the assignment they
    /// belonged to (stale completions still land in them).
    lost: FxHashMap<u64, (Tp, OffsetTracker)>,
    /// Records skipped because this member had finished them already.
    skipped_finished: u64,
    /// Commit intervals since every watermark was last committed again.
    since_full_commit: u32,
}

/// Every this many commit intervals, every watermark is committed again,
/// moved or not: librdkafka does not report a failed asynchronous commit,
/// so a position that failed to commit (a broker outage) is re-sent
/// without waiting for the watermark to move.
const FULL_COMMIT_EVERY: u32 = 10;

impl<R: Located> Scheduler<R> {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits: Limits {
                concurrency: limits.concurrency.max(1),
                max_in_flight: limits.max_in_flight.max(1),
                ..limits
            },
            slots: Vec::new(),
            index: FxHashMap::default(),
            ready: Ready::new(),
            running: 0,
            priorities: HashMap::new(),
            running_at: [0; Priority::LEVELS],
            seen_ms: [i64::MIN; Priority::LEVELS],
            now_ms: i64::MIN,
            next_epoch: 0,
            stopping: false,
            last_commit_ms: i64::MIN,
            parked: Default::default(),
            unparking: std::array::from_fn(|_| VecDeque::new()),
            lost: FxHashMap::default(),
            skipped_finished: 0,
            since_full_commit: 0,
        }
    }

    /// Sets each topic's priority (a route's tiers take its main topic's).
    /// Applies to partitions assigned from now on.
    pub(crate) fn with_priorities(mut self, priorities: HashMap<String, Priority>) -> Self {
        self.priorities = priorities;
        self
    }

    /// Jobs running and jobs ready to run, per priority level.
    pub(crate) fn by_level(&self) -> [(usize, usize); Priority::LEVELS] {
        std::array::from_fn(|l| (self.running_at[l], self.ready.queues[l].len()))
    }

    /// Whether `level` had work recently (see the module docs).
    fn active(&self, level: usize) -> bool {
        self.running_at[level] > 0
            || !self.ready.queues[level].is_empty()
            || self.now_ms.saturating_sub(self.seen_ms[level]) < ACTIVE_MS
    }

    fn slot_of(&self, topic: &str, partition: i32) -> Option<usize> {
        self.index.get(topic)?.get(&partition).copied()
    }

    fn part(&self, tp: &Tp) -> Option<&Part<R>> {
        self.slots.get(self.slot_of(&tp.0, tp.1)?)?.as_ref()
    }

    /// Jobs running now (holding a slot; parked jobs do not).
    pub(crate) fn running(&self) -> usize {
        self.running
    }

    /// Jobs parked now: dispatched, waiting for a downstream without a slot.
    pub(crate) fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Records skipped so far because this member had finished them before
    /// (a partition that came back after it was lost).
    pub(crate) fn skipped_finished(&self) -> u64 {
        self.skipped_finished
    }

    /// Slots free for `level` now: the limit, less the reserve kept for a
    /// more urgent level that is active, less what runs.
    fn free_for(&self, level: usize) -> usize {
        let urgent_active = (0..level).any(|l| self.active(l));
        let reserve = if urgent_active {
            self.limits.concurrency / 4
        } else {
            0
        };
        (self.limits.concurrency - reserve).saturating_sub(self.running)
    }

    /// A running job waits for a downstream: it gives its slot back and
    /// keeps its lane. No-op for a job that is not running.
    pub(crate) fn park(&mut self, t: Ticket) {
        if self.parked.insert(t) {
            self.running = self.running.saturating_sub(1);
            self.running_at[t.level] = self.running_at[t.level].saturating_sub(1);
        }
    }

    /// A parked job can go on. Returns `true` if it has its slot back at
    /// once; otherwise it waits for a [`Action::Grant`] from a later
    /// [`Scheduler::dispatch`] (parked jobs of its level asked before it
    /// are served first).
    pub(crate) fn unpark(&mut self, t: Ticket) -> bool {
        if !self.parked.contains(&t) {
            return true;
        }
        if self.unparking[t.level].is_empty() && self.free_for(t.level) > 0 {
            self.parked.remove(&t);
            self.running += 1;
            self.running_at[t.level] += 1;
            return true;
        }
        self.unparking[t.level].push_back(t);
        false
    }

    /// Jobs waiting for a concurrency slot.
    pub(crate) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Whether the scheduler holds `tp` paused (bound or due-time hold).
    #[cfg(test)]
    pub(crate) fn wants_pause(&self, tp: &Tp) -> bool {
        self.stopping || self.part(tp).is_some_and(Part::wants_pause)
    }

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
                tracker: OffsetTracker::new(),
                released: CancellationToken::new(),
                lanes: FxHashMap::default(),
                paused_bound: false,
                hold: None,
                revoked: false,
                max_dispatched: None,
                returning,
                skip: None,
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

    /// A polled record. `now_ms` decides whether a tier record is due.
    pub(crate) fn record(&mut self, rec: Incoming<R>, now_ms: i64, out: &mut Vec<Action<R>>) {
        self.now_ms = self.now_ms.max(now_ms);
        if self.stopping {
            return;
        }
        let Some(slot) = self.slot_of(rec.item.topic(), rec.item.partition()) else {
            return; // not (or no longer) assigned: never tracked, never committed
        };
        let Some(p) = self.slots[slot].as_mut() else {
            return;
        };
        if p.revoked {
            return;
        }
        if let Some((epoch, kept)) = p.returning.take() {
            // The first record of a partition that came back: fetching
            // starts at the group's committed position.
            if kept.position_unchanged(rec.offset) {
                p.skip = Some((epoch, kept));
            }
        }
        if p.tracker.finished_here(rec.offset) {
            // Fetched again after a seek: never run twice.
            return;
        }
        if let Some((_, kept)) = &p.skip {
            if kept.finished_here(rec.offset) {
                // Finished by this member before it lost the partition.
                p.tracker.start_at(rec.offset, rec.timestamp_ms);
                p.tracker.finish(rec.offset);
                self.skipped_finished += 1;
                return;
            }
            if kept.highest_seen().is_none_or(|h| rec.offset >= h) {
                p.skip = None;
            }
        }
        // A held partition takes nothing but the record it waits for; any
        // other was fetched before the pause and comes again after it.
        if p.hold.is_some_and(|h| h.offset != rec.offset) {
            return;
        }
        if let Some(due) = rec.due_ms.filter(|d| *d > now_ms) {
            // The placeholder keeps the watermark below the held record.
            p.tracker.start_at(rec.offset, rec.timestamp_ms);
            p.hold = Some(Hold {
                offset: rec.offset,
                due_ms: due,
                resumed: false,
            });
            out.push(Action::Pause(p.tp.clone()));
            out.push(Action::Seek(p.tp.clone(), rec.offset));
            return;
        }
        p.hold = None;
        p.tracker.start_at(rec.offset, rec.timestamp_ms);
        self.seen_ms[p.level] = now_ms;
        if rec.foreign {
            p.tracker.finish(rec.offset);
            return;
        }
        let job = Job {
            ticket: Ticket {
                slot,
                epoch: p.epoch,
                offset: rec.offset,
                lane: rec.lane,
                level: p.level,
            },
            item: rec.item,
            released: p.released.clone(),
        };
        match p.lanes.get_mut(&rec.lane) {
            Some(l) => l.queue.push_back(job),
            None => {
                p.lanes.insert(
                    rec.lane,
                    Lane {
                        running: false,
                        queue: VecDeque::new(),
                    },
                );
                self.ready.push(job);
            }
        }
        if !p.paused_bound && p.tracker.in_flight() >= self.limits.max_in_flight {
            let was = p.wants_pause();
            p.paused_bound = true;
            if !was {
                out.push(Action::Pause(p.tp.clone()));
            }
        }
    }

    /// Hands ready jobs to runners, up to the concurrency limit and the
    /// most urgent level first, as one `Run` batch. Call after a batch of
    /// events.
    pub(crate) fn dispatch(&mut self, out: &mut Vec<Action<R>>) {
        if self.running >= self.limits.concurrency
            || (self.ready.is_empty() && self.unparking.iter().all(VecDeque::is_empty))
        {
            return;
        }
        let mut batch: Vec<Job<R>> = Vec::new();
        let mut grants: Vec<Ticket> = Vec::new();
        let mut urgent_active = false;
        for level in 0..Priority::LEVELS {
            // Slots kept free for a more urgent level that is active.
            let reserve = if urgent_active {
                self.limits.concurrency / 4
            } else {
                0
            };
            urgent_active |= self.active(level);
            let mut free = (self.limits.concurrency - reserve).saturating_sub(self.running);
            // Parked jobs that can go on first: they are older, and they
            // hold their lanes.
            while free > 0 {
                let Some(t) = self.unparking[level].pop_front() else {
                    break;
                };
                let live = self
                    .slots
                    .get(t.slot)
                    .and_then(Option::as_ref)
                    .is_some_and(|p| p.epoch == t.epoch && !p.revoked);
                // A revoked one is being released; it reports soon.
                if live && self.parked.remove(&t) {
                    grants.push(t);
                    self.running += 1;
                    self.running_at[level] += 1;
                    free -= 1;
                }
            }
            let queue = &mut self.ready.queues[level];
            let n = free.min(queue.len());
            if n == 0 {
                continue;
            }
            batch.extend(queue.drain(..n));
            self.running += n;
            self.running_at[level] += n;
        }
        if !grants.is_empty() {
            out.push(Action::Grant(grants));
        }
        if batch.is_empty() {
            return;
        }
        for j in &batch {
            if let Some(p) = self.slots[j.ticket.slot].as_mut() {
                p.max_dispatched = p.max_dispatched.max(Some(j.ticket.offset));
                if let Some(lane) = p.lanes.get_mut(&j.ticket.lane) {
                    lane.running = true;
                }
            }
        }
        out.push(Action::Run(batch));
    }

    /// A job reached its final outcome (`done`: handled, or forwarded and
    /// acknowledged) or gave up without one (`done == false`: it must be
    /// re-delivered, so its offset stays unfinished).
    pub(crate) fn finished(&mut self, ticket: Ticket, done: bool, out: &mut Vec<Action<R>>) {
        // A parked job holds no slot (one still queued for a grant is
        // skipped when its turn comes).
        if !self.parked.remove(&ticket) {
            self.running = self.running.saturating_sub(1);
            self.running_at[ticket.level] = self.running_at[ticket.level].saturating_sub(1);
        }
        let Some(p) = self
            .slots
            .get_mut(ticket.slot)
            .and_then(Option::as_mut)
            .filter(|p| p.epoch == ticket.epoch)
        else {
            // Stale: the partition was revoked (and maybe re-assigned). If
            // it was lost, what finished counts for its return.
            if done {
                let kept = match self.lost.get_mut(&ticket.epoch) {
                    Some((_, tracker)) => Some(tracker),
                    None => self
                        .slots
                        .iter_mut()
                        .flatten()
                        .flat_map(|p| p.returning.as_mut().into_iter().chain(p.skip.as_mut()))
                        .find(|(e, _)| *e == ticket.epoch)
                        .map(|(_, t)| t),
                };
                if let Some(tracker) = kept {
                    tracker.finish(ticket.offset);
                }
            }
            return;
        };
        if done {
            p.tracker.finish(ticket.offset);
        }
        // After a stop, the queues hold only what must still run.
        let next = match p.lanes.get_mut(&ticket.lane) {
            Some(l) if !p.revoked => {
                l.running = false;
                l.queue.pop_front()
            }
            _ => None,
        };
        match next {
            Some(job) => self.ready.push(job),
            None => {
                p.lanes.remove(&ticket.lane);
            }
        }
        if p.paused_bound
            && !p.revoked
            && !self.stopping
            && p.tracker.in_flight() <= self.limits.max_in_flight * 3 / 4
        {
            p.paused_bound = false;
            if !p.wants_pause() {
                out.push(Action::Resume(p.tp.clone()));
            }
        }
    }

    /// Time passed: resumes holds that are due, and commits moved
    /// watermarks once per commit interval.
    pub(crate) fn tick(&mut self, now_ms: i64, out: &mut Vec<Action<R>>) {
        self.now_ms = self.now_ms.max(now_ms);
        for p in self.slots.iter_mut().flatten() {
            if let Some(h) = p.hold.as_mut().filter(|h| !h.resumed && h.due_ms <= now_ms) {
                h.resumed = true;
                let offset = h.offset;
                if !p.paused_bound && !p.revoked && !self.stopping {
                    out.push(Action::Resume(p.tp.clone()));
                    out.push(Action::Seek(p.tp.clone(), offset));
                }
            }
        }
        if now_ms.saturating_sub(self.last_commit_ms) >= self.limits.commit_interval_ms {
            self.last_commit_ms = now_ms;
            self.since_full_commit += 1;
            if self.since_full_commit >= FULL_COMMIT_EVERY {
                self.since_full_commit = 0;
                self.commit_failed();
            }
            self.commit_all(out);
        }
    }

    /// The earliest due time of a hold not yet resumed, if any (the
    /// harness jumps its virtual clock there).
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    pub(crate) fn next_due_ms(&self) -> Option<i64> {
        self.slots
            .iter()
            .flatten()
            .filter_map(|p| p.hold.filter(|h| !h.resumed).map(|h| h.due_ms))
            .min()
    }

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

    /// Forgets every partition without committing: after a shutdown, so the
    /// consumer's final revoke neither waits for abandoned jobs nor commits.
    pub(crate) fn clear(&mut self) {
        for p in self.slots.iter().flatten() {
            p.released.cancel();
        }
        self.lost.clear();
        self.slots.clear();
        self.index.clear();
        self.ready.clear();
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeSet, HashSet};

    impl Located for i64 {
        fn topic(&self) -> &str {
            "t"
        }
        fn partition(&self) -> i32 {
            0
        }
    }

    fn limits(concurrency: usize, max_in_flight: usize) -> Limits {
        Limits {
            concurrency,
            max_in_flight,
            commit_interval_ms: 0,
        }
    }

    fn tp(p: i32) -> Tp {
        ("t".to_string(), p)
    }

    fn rec(offset: i64, key: u64) -> Incoming<i64> {
        Incoming {
            offset,
            lane: LaneKey::Key(key),
            timestamp_ms: None,
            due_ms: None,
            foreign: false,
            item: offset,
        }
    }

    fn runs(out: &[Action<i64>]) -> Vec<Ticket> {
        out.iter()
            .flat_map(|a| match a {
                Action::Run(jobs) => jobs.iter().map(|j| j.ticket).collect(),
                _ => vec![],
            })
            .collect()
    }

    /// A record of a named topic (partition 0), for the priority tests.
    struct Topical(&'static str);

    impl Located for Topical {
        fn topic(&self) -> &str {
            self.0
        }
        fn partition(&self) -> i32 {
            0
        }
    }

    fn on(topic: &'static str, offset: i64) -> Incoming<Topical> {
        Incoming {
            offset,
            lane: LaneKey::Offset(offset),
            timestamp_ms: None,
            due_ms: None,
            foreign: false,
            item: Topical(topic),
        }
    }

    /// The (topic, ticket) of every job in `Run` actions.
    fn started(out: &[Action<Topical>]) -> Vec<(&'static str, Ticket)> {
        out.iter()
            .flat_map(|a| match a {
                Action::Run(jobs) => jobs.iter().map(|j| (j.item.0, j.ticket)).collect(),
                _ => vec![],
            })
            .collect()
    }

    #[test]
    fn urgent_jobs_take_free_slots_first_and_bulk_keeps_three_quarters_meanwhile() {
        let mut s = Scheduler::new(limits(8, 1_000)).with_priorities(HashMap::from([
            ("hi".to_string(), Priority::High),
            ("lo".to_string(), Priority::Low),
        ]));
        let mut out = Vec::new();
        s.assign(&[("hi".to_string(), 0), ("lo".to_string(), 0)], &mut out);
        // A bulk flood alone takes every slot.
        for o in 0..100 {
            s.record(on("lo", o), 0, &mut out);
        }
        out.clear();
        s.dispatch(&mut out);
        let mut bulk: Vec<Ticket> = started(&out).into_iter().map(|(_, t)| t).collect();
        assert_eq!(bulk.len(), 8, "bulk alone uses all 8 slots");
        // Urgent work arrives behind 92 ready bulk jobs: the next free slots
        // are its own.
        for o in 0..3 {
            s.record(on("hi", o), 10, &mut out);
        }
        out.clear();
        for t in bulk.drain(..2) {
            s.finished(t, true, &mut out);
        }
        s.dispatch(&mut out);
        let next = started(&out);
        assert_eq!(
            next.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            vec!["hi", "hi"],
            "freed slots go to the urgent level"
        );
        // While urgent work is active, bulk keeps at most 6 of 8 slots.
        out.clear();
        for (_, t) in next {
            s.finished(t, true, &mut out);
        }
        s.dispatch(&mut out);
        let third = started(&out);
        assert_eq!(third.len(), 1, "one urgent job left");
        assert_eq!(third[0].0, "hi");
        out.clear();
        s.finished(third[0].1, true, &mut out);
        s.record(on("hi", 3), 500, &mut out);
        s.dispatch(&mut out);
        let fourth = started(&out);
        assert_eq!(fourth.len(), 1, "the new urgent job starts at once");
        let (running, ready) = s.by_level()[2];
        assert_eq!(running, 6, "bulk holds 6 slots while urgent work is active");
        assert!(ready > 0);
        // A second after the urgent level went quiet, bulk takes every slot.
        out.clear();
        for (_, t) in fourth {
            s.finished(t, true, &mut out);
        }
        s.tick(1_600, &mut out);
        out.clear();
        s.dispatch(&mut out);
        assert_eq!(s.by_level()[0], (0, 0));
        assert_eq!(s.running(), 8, "bulk takes all 8 slots again");
    }

    #[test]
    fn without_priorities_every_topic_shares_one_level() {
        let mut s: Scheduler<Topical> = Scheduler::new(limits(4, 1_000));
        let mut out = Vec::new();
        s.assign(&[("a".to_string(), 0), ("b".to_string(), 0)], &mut out);
        for o in 0..10 {
            s.record(on("a", o), 0, &mut out);
            s.record(on("b", o), 0, &mut out);
        }
        out.clear();
        s.dispatch(&mut out);
        assert_eq!(
            started(&out).iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            vec!["a", "b", "a", "b"],
            "arrival order, all slots used"
        );
    }

    #[test]
    fn same_key_runs_in_order_and_other_keys_in_parallel() {
        let mut s = Scheduler::new(limits(8, 100));
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        for (o, k) in [(0, 1), (1, 1), (2, 2), (3, 1)] {
            s.record(rec(o, k), 0, &mut out);
        }
        out.clear();
        s.dispatch(&mut out);
        let first = runs(&out);
        assert_eq!(
            first.iter().map(|t| t.offset).collect::<Vec<_>>(),
            vec![0, 2],
            "one job per key at a time"
        );
        out.clear();
        s.finished(first[0], true, &mut out);
        s.dispatch(&mut out);
        assert_eq!(
            runs(&out).iter().map(|t| t.offset).collect::<Vec<_>>(),
            vec![1]
        );
    }

    #[test]
    fn a_revoke_or_stop_releases_the_jobs_of_its_partitions_only() {
        let mut s = Scheduler::new(limits(8, 100));
        let mut out = Vec::new();
        let (a, b) = (("a".to_string(), 0), ("b".to_string(), 0));
        s.assign(&[a.clone(), b], &mut out);
        s.record(on("a", 0), 0, &mut out);
        s.record(on("b", 0), 0, &mut out);
        out.clear();
        s.dispatch(&mut out);
        let released: Vec<(&str, CancellationToken)> = out
            .iter()
            .flat_map(|a| match a {
                Action::Run(jobs) => jobs
                    .iter()
                    .map(|j| (j.item.0, j.released.clone()))
                    .collect(),
                _ => vec![],
            })
            .collect();
        assert_eq!(released.len(), 2);
        assert!(released.iter().all(|(_, t)| !t.is_cancelled()));
        s.revoke(&[a]);
        for (topic, token) in &released {
            assert_eq!(
                token.is_cancelled(),
                *topic == "a",
                "only the revoked partition's job is released"
            );
        }
        s.stop(false, &mut out);
        assert!(
            released.iter().all(|(_, t)| t.is_cancelled()),
            "a stop releases every job"
        );
    }

    #[test]
    fn the_watermark_never_passes_a_running_job() {
        let mut s = Scheduler::new(limits(8, 100));
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        for o in 0..3 {
            s.record(rec(o, o as u64), 0, &mut out);
        }
        s.dispatch(&mut out);
        let t = runs(&out);
        out.clear();
        s.finished(t[2], true, &mut out);
        s.finished(t[0], true, &mut out);
        s.commit_all(&mut out);
        assert!(matches!(&out[..], [Action::Commit(c)] if c == &vec![(tp(0), 1)]));
    }

    #[test]
    fn the_in_flight_bound_pauses_and_resumes_at_three_quarters() {
        let mut s = Scheduler::new(limits(100, 8));
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        out.clear();
        for o in 0..8 {
            s.record(rec(o, o as u64), 0, &mut out);
        }
        assert!(matches!(&out[..], [Action::Pause(_)]), "{out:?}");
        assert!(s.wants_pause(&tp(0)));
        out.clear();
        s.dispatch(&mut out);
        let t = runs(&out);
        out.clear();
        s.finished(t[0], true, &mut out);
        assert!(out.is_empty(), "7 in flight: still above three quarters");
        s.finished(t[1], true, &mut out);
        assert!(matches!(&out[..], [Action::Resume(_)]), "{out:?}");
    }

    #[test]
    fn a_record_not_due_holds_its_partition_until_due() {
        let mut s = Scheduler::new(limits(8, 100));
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        out.clear();
        let mut r = rec(5, 1);
        r.due_ms = Some(1_000);
        s.record(r, 0, &mut out);
        assert!(
            matches!(&out[..], [Action::Pause(_), Action::Seek(_, 5)]),
            "{out:?}"
        );
        out.clear();
        s.record(rec(6, 2), 0, &mut out);
        s.dispatch(&mut out);
        assert!(out.is_empty(), "nothing behind a hold runs");
        s.tick(999, &mut out);
        assert!(!out.iter().any(|a| matches!(a, Action::Resume(_))));
        out.clear();
        s.tick(1_000, &mut out);
        assert!(
            matches!(&out[..2], [Action::Resume(_), Action::Seek(_, 5)]),
            "{out:?}"
        );
        out.clear();
        let mut again = rec(5, 1);
        again.due_ms = Some(1_000);
        s.record(again, 1_000, &mut out);
        s.dispatch(&mut out);
        assert_eq!(runs(&out).len(), 1);
    }

    #[test]
    fn a_revoke_drops_what_has_not_started_and_waits_only_for_running_jobs() {
        let mut s = Scheduler::new(limits(1, 100));
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        for o in 0..50 {
            s.record(rec(o, o as u64), 0, &mut out);
        }
        out.clear();
        s.dispatch(&mut out);
        let t = runs(&out);
        assert_eq!(t.len(), 1);
        s.revoke(&[tp(0)]);
        assert_eq!(s.running_in(&[tp(0)]), 1);
        assert_eq!(s.ready_len(), 0, "49 jobs dropped at once");
        out.clear();
        s.finished(t[0], true, &mut out);
        assert_eq!(s.running_in(&[tp(0)]), 0);
        s.release(&[tp(0)], false, &mut out);
        assert!(
            matches!(&out[..], [Action::Commit(c)] if c == &vec![(tp(0), 1)]),
            "{out:?}"
        );
    }

    #[test]
    fn a_lost_partition_is_not_committed_and_a_stale_completion_is_ignored() {
        let mut s = Scheduler::new(limits(4, 100));
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        s.record(rec(0, 1), 0, &mut out);
        s.dispatch(&mut out);
        let t = runs(&out);
        out.clear();
        s.revoke(&[tp(0)]);
        s.release(&[tp(0)], true, &mut out);
        assert!(out.is_empty());
        s.assign(&[tp(0)], &mut out);
        out.clear();
        s.finished(t[0], true, &mut out);
        assert_eq!(s.running(), 0);
        s.commit_all(&mut out);
        assert!(out.is_empty(), "the old epoch's completion marked nothing");
    }

    fn grants(out: &[Action<i64>]) -> Vec<Ticket> {
        out.iter()
            .flat_map(|a| match a {
                Action::Grant(t) => t.clone(),
                _ => vec![],
            })
            .collect()
    }

    #[test]
    fn a_parked_job_gives_its_slot_to_another_key_and_keeps_its_lane() {
        let mut s = Scheduler::new(limits(1, 100));
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        for (o, k) in [(0, 1), (1, 1), (2, 2)] {
            s.record(rec(o, k), 0, &mut out);
        }
        out.clear();
        s.dispatch(&mut out);
        let first = runs(&out);
        assert_eq!(first.iter().map(|t| t.offset).collect::<Vec<_>>(), [0]);
        out.clear();
        s.park(first[0]);
        assert_eq!((s.running(), s.parked()), (0, 1));
        s.dispatch(&mut out);
        let second = runs(&out);
        assert_eq!(
            second.iter().map(|t| t.offset).collect::<Vec<_>>(),
            [2],
            "key 2 takes the slot; key 1's next job waits behind its parked head"
        );
        out.clear();
        assert!(!s.unpark(first[0]), "no slot free: it waits for a grant");
        s.finished(second[0], true, &mut out);
        s.dispatch(&mut out);
        assert_eq!(grants(&out), [first[0]], "the parked job is served first");
        assert!(runs(&out).is_empty(), "the concurrency limit holds");
        out.clear();
        s.finished(first[0], true, &mut out);
        s.dispatch(&mut out);
        assert_eq!(runs(&out).iter().map(|t| t.offset).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn a_parked_job_released_by_a_revoke_frees_nothing_twice() {
        let mut s = Scheduler::new(limits(2, 100));
        let mut out = Vec::new();
        s.assign(&[tp(0), tp(1)], &mut out);
        s.record(rec(0, 1), 0, &mut out);
        out.clear();
        s.dispatch(&mut out);
        let t = runs(&out)[0];
        s.park(t);
        assert!(
            !s.idle(),
            "a parked job keeps a stop waiting for its release"
        );
        s.revoke(&[tp(0)]);
        out.clear();
        s.finished(t, false, &mut out);
        assert_eq!((s.running(), s.parked()), (0, 0));
        assert!(s.idle());
    }

    #[test]
    fn a_partition_that_comes_back_unchanged_skips_what_this_member_finished() {
        let mut s = Scheduler::new(limits(8, 100));
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        for o in 0..6 {
            s.record(rec(o, o as u64), 0, &mut out);
        }
        out.clear();
        s.dispatch(&mut out);
        let t = runs(&out);
        for i in [0, 1, 3] {
            s.finished(t[i], true, &mut out);
        }
        // The session expires (the coordinator is down): lost, no commit.
        s.revoke(&[tp(0)]);
        out.clear();
        s.release(&[tp(0)], true, &mut out);
        assert!(out.is_empty());
        // A job that was running finishes after the loss.
        s.finished(t[4], true, &mut out);
        s.assign(&[tp(0)], &mut out);
        out.clear();
        // Nothing was committed meanwhile: fetching starts at 0 again.
        for o in 0..6 {
            s.record(rec(o, o as u64), 0, &mut out);
        }
        s.dispatch(&mut out);
        let again: Vec<i64> = runs(&out).iter().map(|t| t.offset).collect();
        assert_eq!(again, [2, 5], "only what did not finish runs again");
        assert_eq!(s.skipped_finished(), 4);
        out.clear();
        s.commit_all(&mut out);
        assert!(
            matches!(&out[..], [Action::Commit(c)] if c == &vec![(tp(0), 2)]),
            "{out:?}"
        );
    }

    #[test]
    fn a_partition_whose_position_moved_meanwhile_runs_everything_again() {
        let mut s = Scheduler::new(limits(8, 100));
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        for o in 0..4 {
            s.record(rec(o, o as u64), 0, &mut out);
        }
        s.dispatch(&mut out);
        let t = runs(&out);
        for ticket in &t {
            s.finished(*ticket, true, &mut out);
        }
        s.revoke(&[tp(0)]);
        s.release(&[tp(0)], true, &mut out);
        s.assign(&[tp(0)], &mut out);
        out.clear();
        // Another member committed 2 meanwhile: the kept state is dropped.
        for o in 2..4 {
            s.record(rec(o, o as u64), 0, &mut out);
        }
        s.dispatch(&mut out);
        let again: Vec<i64> = runs(&out).iter().map(|t| t.offset).collect();
        assert_eq!(again, [2, 3]);
        assert_eq!(s.skipped_finished(), 0);
    }

    #[test]
    fn a_planned_stop_runs_what_lies_below_the_highest_started_job() {
        let mut s = Scheduler::new(limits(8, 100));
        let mut out = Vec::new();
        s.assign(&[tp(0)], &mut out);
        // Key 1: offsets 0, 1, 2 (one lane); key 2: offset 3; key 3: offset 4.
        for (o, k) in [(0, 1), (1, 1), (2, 1), (3, 2), (4, 3)] {
            s.record(rec(o, k), 0, &mut out);
        }
        out.clear();
        s.dispatch(&mut out);
        let started = runs(&out);
        assert_eq!(
            started.iter().map(|t| t.offset).collect::<Vec<_>>(),
            vec![0, 3, 4]
        );
        out.clear();
        s.stop(true, &mut out);
        // 1 and 2 lie below 4 (started): they still run; nothing above 4 exists.
        for t in &started {
            s.finished(*t, true, &mut out);
        }
        out.clear();
        s.dispatch(&mut out);
        let next = runs(&out);
        assert_eq!(next.iter().map(|t| t.offset).collect::<Vec<_>>(), vec![1]);
        s.finished(next[0], true, &mut out);
        out.clear();
        s.dispatch(&mut out);
        let last = runs(&out);
        assert_eq!(last.iter().map(|t| t.offset).collect::<Vec<_>>(), vec![2]);
        s.finished(last[0], true, &mut out);
        assert!(s.idle());
        out.clear();
        s.commit_all(&mut out);
        assert!(
            matches!(&out[..], [Action::Commit(c)] if c == &vec![(tp(0), 5)]),
            "{out:?}"
        );
        // A SIGTERM-like stop drops them instead.
        let mut s = Scheduler::new(limits(8, 100));
        s.assign(&[tp(0)], &mut out);
        for (o, k) in [(0, 1), (1, 1), (2, 2)] {
            s.record(rec(o, k), 0, &mut out);
        }
        out.clear();
        s.dispatch(&mut out);
        let started = runs(&out);
        s.stop(false, &mut out);
        for t in &started {
            s.finished(*t, true, &mut out);
        }
        out.clear();
        s.dispatch(&mut out);
        assert!(runs(&out).is_empty() && s.idle());
    }

    /// Operations of the property test.
    #[derive(Clone, Debug)]
    enum Op {
        Poll(u8),
        Finish(u8),
        /// A revoke and re-assignment; `true` cancels the running jobs
        /// (past the revoke timeout) instead of letting them finish.
        Rebalance(bool),
        /// The partition is lost (session expired) and comes back: running
        /// jobs go on and finish later, as stale completions.
        Lost,
        /// A running job starts waiting for a downstream.
        Park(u8),
        /// A parked job can go on.
        Unpark(u8),
        Tick(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u8..6).prop_map(Op::Poll),
            4 => any::<u8>().prop_map(Op::Finish),
            1 => any::<bool>().prop_map(Op::Rebalance),
            1 => Just(Op::Lost),
            2 => any::<u8>().prop_map(Op::Park),
            2 => any::<u8>().prop_map(Op::Unpark),
            1 => (1u16..2_000).prop_map(Op::Tick),
        ]
    }

    /// An in-memory partition log, consumer position and pause flag, driven
    /// by the scheduler's actions, as the poll thread drives rdkafka.
    struct Sim {
        keys: Vec<u64>,
        due: Vec<Option<i64>>,
        pos: i64,
        paused: bool,
        running: Vec<Ticket>,
        done: BTreeSet<i64>,
        committed: i64,
        now: i64,
        /// Per assignment: offsets run, to catch a double run.
        run_this_epoch: HashSet<i64>,
        /// Per lane: the offsets run, in order.
        lane_order: HashMap<u64, Vec<i64>>,
        /// Running jobs that are parked (holding no slot), and those of
        /// them that asked for a slot again.
        parked: HashSet<Ticket>,
        asked: HashSet<Ticket>,
        concurrency: usize,
        /// Jobs of an earlier, lost assignment, still running.
        stale: Vec<Ticket>,
    }

    impl Sim {
        fn apply(&mut self, out: Vec<Action<i64>>) {
            for a in out {
                match a {
                    Action::Run(jobs) => {
                        for j in jobs {
                            assert!(
                                self.run_this_epoch.insert(j.ticket.offset),
                                "offset {} run twice in one assignment",
                                j.ticket.offset
                            );
                            let key = self.keys[j.ticket.offset as usize];
                            if let Some(last) = self.lane_order.get(&key).and_then(|v| v.last()) {
                                assert!(*last < j.ticket.offset, "key {key} ran out of order");
                            }
                            assert!(
                                self.running
                                    .iter()
                                    .all(|r| self.keys[r.offset as usize] != key),
                                "two jobs of key {key} at once"
                            );
                            self.lane_order
                                .entry(key)
                                .or_default()
                                .push(j.ticket.offset);
                            self.running.push(j.ticket);
                        }
                    }
                    Action::Grant(ts) => {
                        for t in ts {
                            assert!(self.asked.remove(&t), "a grant nobody asked for");
                            self.parked.remove(&t);
                        }
                    }
                    Action::Pause(_) => self.paused = true,
                    Action::Resume(_) => self.paused = false,
                    Action::Seek(_, o) => self.pos = o,
                    Action::Commit(c) => {
                        for (_, next) in c {
                            for o in 0..next {
                                assert!(
                                    self.done.contains(&o),
                                    "commit {next} passes unfinished offset {o}"
                                );
                            }
                            self.committed = self.committed.max(next);
                        }
                    }
                }
            }
        }

        fn incoming(&self, o: i64) -> Incoming<i64> {
            Incoming {
                offset: o,
                lane: LaneKey::Key(self.keys[o as usize]),
                timestamp_ms: None,
                due_ms: self.due[o as usize],
                foreign: false,
                item: o,
            }
        }

        fn poll(&mut self, s: &mut Scheduler<i64>, n: u8) {
            let mut out = Vec::new();
            for _ in 0..n {
                if self.paused || self.pos as usize >= self.keys.len() {
                    break;
                }
                let o = self.pos;
                self.pos += 1;
                s.record(self.incoming(o), self.now, &mut out);
                // An action (a hold's seek) may change the position.
                self.apply(std::mem::take(&mut out));
            }
            s.dispatch(&mut out);
            self.apply(out);
        }

        fn finish(&mut self, s: &mut Scheduler<i64>, i: usize, done: bool) {
            if self.running.is_empty() {
                return;
            }
            let t = self.running[i % self.running.len()];
            // A parked job cannot finish its handler; it only ends when
            // released (not done).
            let done = done && !self.parked.contains(&t);
            self.running.retain(|r| *r != t);
            self.parked.remove(&t);
            self.asked.remove(&t);
            if done {
                self.done.insert(t.offset);
            }
            let mut out = Vec::new();
            s.finished(t, done, &mut out);
            s.dispatch(&mut out);
            self.apply(out);
        }

        fn park(&mut self, s: &mut Scheduler<i64>, i: usize) {
            let free: Vec<Ticket> = self
                .running
                .iter()
                .filter(|t| !self.parked.contains(t))
                .copied()
                .collect();
            if let Some(t) = free.get(i % free.len().max(1)) {
                s.park(*t);
                self.parked.insert(*t);
                let mut out = Vec::new();
                s.dispatch(&mut out);
                self.apply(out);
            }
        }

        fn unpark(&mut self, s: &mut Scheduler<i64>, i: usize) {
            let waiting: Vec<Ticket> = self
                .parked
                .iter()
                .filter(|t| !self.asked.contains(t))
                .copied()
                .collect();
            if let Some(t) = waiting.get(i % waiting.len().max(1)) {
                if s.unpark(*t) {
                    self.parked.remove(t);
                } else {
                    self.asked.insert(*t);
                }
            }
        }

        /// Jobs holding a slot never exceed the limit.
        fn check_concurrency(&self) {
            let holding = self.running.len() - self.parked.len();
            assert!(holding <= self.concurrency, "{holding} jobs hold a slot");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Random interleavings of arrival, completion (and failure to
        /// complete), rebalance and time: the commit never passes an
        /// unfinished record, per-key order holds, no record runs twice in
        /// one assignment, and at the end every record ran, everything is
        /// committed and nothing is left paused.
        #[test]
        fn scheduler_invariants_hold_under_random_interleavings(
            keys in prop::collection::vec(0u64..4, 1..40),
            dues in prop::collection::vec(prop::option::weighted(0.2, 0i64..3_000), 40),
            ops in prop::collection::vec(op(), 1..120),
            concurrency in 1usize..4,
            bound in 1usize..6,
        ) {
            let n = keys.len();
            let mut s = Scheduler::new(Limits { concurrency, max_in_flight: bound, commit_interval_ms: 100 });
            let mut sim = Sim {
                due: dues[..n].to_vec(),
                keys,
                pos: 0,
                paused: false,
                running: Vec::new(),
                done: BTreeSet::new(),
                committed: 0,
                now: 0,
                run_this_epoch: HashSet::new(),
                lane_order: HashMap::new(),
                parked: HashSet::new(),
                asked: HashSet::new(),
                concurrency,
                stale: Vec::new(),
            };
            let mut out = Vec::new();
            s.assign(&[tp(0)], &mut out);
            sim.apply(std::mem::take(&mut out));
            for op in ops {
                match op {
                    Op::Poll(k) => sim.poll(&mut s, k),
                    Op::Finish(i) => {
                        // Now and then a lost assignment's job finishes.
                        if i % 4 == 0 {
                            if let Some(t) = sim.stale.pop() {
                                sim.done.insert(t.offset);
                                s.finished(t, true, &mut out);
                                s.dispatch(&mut out);
                                sim.apply(std::mem::take(&mut out));
                            }
                        }
                        // A parked job only ends when released (a rebalance).
                        let free: Vec<usize> = (0..sim.running.len())
                            .filter(|k| !sim.parked.contains(&sim.running[*k]))
                            .collect();
                        if !free.is_empty() {
                            sim.finish(&mut s, free[i as usize % free.len()], true);
                        }
                    }
                    Op::Park(i) => sim.park(&mut s, i as usize),
                    Op::Unpark(i) => sim.unpark(&mut s, i as usize),
                    Op::Lost => {
                        s.revoke(&[tp(0)]);
                        s.release(&[tp(0)], true, &mut out);
                        sim.apply(std::mem::take(&mut out));
                        // Running jobs go on; parked ones are released.
                        for t in std::mem::take(&mut sim.running) {
                            if sim.parked.remove(&t) {
                                sim.asked.remove(&t);
                                s.finished(t, false, &mut out);
                            } else {
                                sim.stale.push(t);
                            }
                        }
                        sim.apply(std::mem::take(&mut out));
                        // Nobody else took it: fetching starts where the
                        // group's position is.
                        sim.pos = sim.committed;
                        sim.run_this_epoch.clear();
                        sim.lane_order.clear();
                        s.assign(&[tp(0)], &mut out);
                        sim.apply(std::mem::take(&mut out));
                    }
                    Op::Tick(ms) => {
                        sim.now += i64::from(ms);
                        s.tick(sim.now, &mut out);
                        s.dispatch(&mut out);
                        sim.apply(std::mem::take(&mut out));
                    }

                    Op::Rebalance(cancel) => {
                        s.revoke(&[tp(0)]);
                        while !sim.running.is_empty() {
                            sim.finish(&mut s, 0, !cancel);
                        }
                        for t in std::mem::take(&mut sim.stale) {
                            sim.done.insert(t.offset);
                            s.finished(t, true, &mut out);
                        }
                        s.release(&[tp(0)], false, &mut out);
                        sim.apply(std::mem::take(&mut out));
                        // The new assignment fetches from the committed position.
                        sim.pos = sim.committed;
                        sim.run_this_epoch.clear();
                        sim.lane_order.clear();
                        s.assign(&[tp(0)], &mut out);
                        sim.apply(std::mem::take(&mut out));
                    }
                }
                sim.check_concurrency();
            }
            // Drain: everything finishes, time passes, nothing stays paused.
            for _ in 0..10_000 {
                let drained = sim.pos as usize == n && sim.running.is_empty() && s.ready_len() == 0;
                if drained && sim.done.len() == n && s.next_due_ms().is_none() {
                    break;
                }
                sim.poll(&mut s, 8);
                for t in std::mem::take(&mut sim.stale) {
                    sim.done.insert(t.offset);
                    s.finished(t, true, &mut out);
                }
                // Parked jobs can go on; they finish once granted.
                for _ in 0..sim.parked.len() {
                    sim.unpark(&mut s, 0);
                }
                s.dispatch(&mut out);
                sim.apply(std::mem::take(&mut out));
                while let Some(i) = sim.running.iter().position(|t| !sim.parked.contains(t)) {
                    sim.finish(&mut s, i, true);
                }
                sim.now += 500;
                s.tick(sim.now, &mut out);
                s.dispatch(&mut out);
                sim.apply(std::mem::take(&mut out));
            }
            prop_assert_eq!(sim.done.len(), n, "every record ran");
            s.commit_all(&mut out);
            sim.apply(std::mem::take(&mut out));
            prop_assert_eq!(sim.committed, n as i64, "committed equals end");
            prop_assert!(!sim.paused, "no partition left paused");
        }
    }
}
