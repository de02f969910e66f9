//! The scheduler: every decision about partitions, lanes and offsets, as a
//! plain state machine with no Kafka client in it.
//!
//! It takes events (`assigned`, `revoke`/`release`, `record`, `finished`,
//! `tick`, `stop`) and answers with [`Action`]s (`Run`, `Pause`, `Resume`,
//! `Seek`, `Commit`) for an adapter to carry out: the worker's poll thread
//! against rdkafka ([`crate::worker::intake::poll`]), and the test harness against
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
//!   leave a reserve of slots free for it: twice the most it needed at
//!   once within the last second, at least 1 and at most a quarter of the
//!   slots. So an urgent job finds a free slot at once however slow the
//!   bulk handlers are, and a trickle of urgent jobs costs bulk a slot or
//!   two, not a quarter. Less urgent levels borrow from the reserve, all
//!   but one slot, as many slots as the worker frees within 2 ms at its
//!   current rate, so short bulk handlers pay one slot for it (an urgent
//!   job beyond the kept slot waits about that long for the next freed
//!   slot, which is its own). Less urgent
//!   partitions are never paused for it:
//!   polling goes on and their share of slots keeps them moving.
//! * **Turns.** Within a level, each route's ready jobs queue on their
//!   own and the routes with ready jobs take turns for free slots, one
//!   job each (a route alone takes all it can). A route's tiers and
//!   delay buckets count as the route; a record in a shared tier or
//!   bucket counts as the route it names. So a flood of one route's jobs
//!   costs another route of the same level a turn, not a place behind the
//!   whole flood ([`Turns`]).
//! * **Backpressure.** At `max_in_flight` accepted-but-unfinished records a
//!   partition is paused, and resumed at three quarters (so a single busy
//!   partition never drains while librdkafka refetches what the pause
//!   dropped). Polling never stops.
//! * **Holds.** A retry-tier record that is not due is kept, and its
//!   partition paused just past it; at the due time the record is given
//!   back as if just read, and the partition resumed. Nothing else of the
//!   partition runs meanwhile ([`hold`]).
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
//!   position (nobody else committed meanwhile: the adapter reads the
//!   position's commit tag back and calls [`Scheduler::forget_returning`]
//!   when another consumer wrote it), the kept state is taken up again: records it finished are skipped instead of run a second
//!   time, and its watermark is committed. Otherwise it is dropped.
//!   Independently of that, a record this assignment already saw finish is
//!   never run again within it.
//!
//! The room of step 4 in ARCHITECTURE.md. **Enters:** the events above,
//! from the intake and the dispatch. **Leaves:** [`Action`]s. The two
//! settings handler authors give it are beside it: [`fairness::Fairness`]
//! and [`priority::Priority`].

mod assignment;
mod commits;
mod fair;
#[cfg(test)]
mod fair_tests;
pub(in crate::worker) mod fairness;
mod hold;
mod parking;
mod passing;
#[cfg(test)]
mod passing_tests;
pub(in crate::worker) mod priority;
mod ready;
#[cfg(test)]
mod tests;
mod types;

use std::collections::{HashMap, VecDeque};

use rustc_hash::FxHashMap;

use crate::offsets::OffsetTracker;
use crate::worker::Priority;

pub(crate) use fair::FairSpec;
use ready::Ready;
pub(crate) use types::{
    Action, Incoming, Job, LaneKey, Limits, Located, Released, Ticket, Tp, Turns,
};
use types::{Lane, Part, ACTIVE_MS, ACTIVE_MS_USIZE, BORROW_MS};

/// See the module docs.
pub(crate) struct Scheduler<R> {
    limits: Limits,
    slots: Vec<Option<Part<R>>>,
    index: FxHashMap<String, FxHashMap<i32, usize>>,
    ready: Ready<R>,
    running: usize,
    /// Topic -> priority; unlisted topics are [`Priority::Normal`].
    priorities: HashMap<String, Priority>,
    /// Topic -> its fair route's index (main topic and tiers alike).
    fair_topics: HashMap<String, u16>,
    /// Which route each topic's jobs take their turn as.
    turns: Turns,
    /// Running jobs per priority level.
    running_at: [usize; Priority::LEVELS],
    /// When each level last took a record (ms).
    seen_ms: [i64; Priority::LEVELS],
    /// Per level: the most jobs it ran or had ready at once in the current
    /// one-second window, and when that window began (ms).
    demand: [(usize, i64); Priority::LEVELS],
    /// Slots freed (jobs finished, any level) in the previous and the
    /// current one-second window, and when the current one began (ms):
    /// how fast a slot frees, which decides how much of the reserve less
    /// urgent levels may borrow.
    turnover: (usize, usize, i64),
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
            fair_topics: HashMap::new(),
            turns: Turns::default(),
            running_at: [0; Priority::LEVELS],
            seen_ms: [i64::MIN; Priority::LEVELS],
            demand: [(0, i64::MIN); Priority::LEVELS],
            turnover: (0, 0, i64::MIN),
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

    /// Lets the routes of a level take turns for free slots (see the
    /// `ready` module). Applies to partitions assigned from now on.
    pub(crate) fn with_turns(mut self, turns: Turns) -> Self {
        self.turns = turns;
        self
    }

    /// Shares each fair route's slots among its tenants: `routes` are each
    /// route's topics (main and tiers) with its settings. Applies to
    /// partitions assigned from now on.
    pub(crate) fn with_fairness(mut self, routes: Vec<(Vec<String>, FairSpec)>) -> Self {
        for (i, (topics, spec)) in routes.into_iter().enumerate() {
            let i = u16::try_from(i).unwrap_or(u16::MAX);
            for t in topics {
                self.fair_topics.insert(t, i);
            }
            self.ready.fair.push(fair::FairRoute::new(spec));
        }
        self
    }

    /// `(route, tenant, ready, running)` of every tenant with work on a
    /// fair route, for the per-tenant gauges.
    pub(crate) fn tenants(&self) -> Vec<(String, String, usize, usize)> {
        self.ready
            .fair
            .iter()
            .flat_map(|f| {
                f.load().into_iter().map(move |(name, ready, running)| {
                    (f.route().to_string(), name.to_string(), ready, running)
                })
            })
            .collect()
    }

    /// Jobs running and jobs ready to run, per priority level.
    pub(crate) fn by_level(&self) -> [(usize, usize); Priority::LEVELS] {
        std::array::from_fn(|l| (self.running_at[l], self.ready.len_at(l)))
    }

    /// Slots less urgent levels leave free for the levels above `level`
    /// while one of those is active: twice the most those levels needed at
    /// once (running plus ready) within the last [`ACTIVE_MS`], at least 1
    /// and at most a quarter of the slots. A trickle of urgent jobs so
    /// keeps a slot or two free, not a quarter of the worker; a burst of
    /// them widens the reserve for the next second.
    ///
    /// Less urgent levels may borrow from it, all but one slot, as many
    /// slots as the worker frees within [`BORROW_MS`] at its rate of the
    /// last second: an urgent job beyond the one kept slot then waits
    /// about that long for one (freed slots go to the most urgent level
    /// first). With short bulk handlers (a slot frees every few
    /// microseconds) the reserve so costs bulk one slot; with slow ones it
    /// stays whole.
    fn reserve_for(&self, level: usize) -> usize {
        if !(0..level).any(|l| self.active(l)) {
            return 0;
        }
        let peak = (0..level).map(|l| self.demand[l].0).max().unwrap_or(0);
        let reserve = (2 * peak).clamp(1, (self.limits.concurrency / 4).max(1));
        // One slot is never lent: borrowed slots may meet bulk jobs that
        // turn slow (a downstream hangs), and the urgent level must still
        // find a slot at once.
        reserve.saturating_sub(self.borrowable()).max(1)
    }

    /// Slots the worker frees within [`BORROW_MS`] at its rate of finishes
    /// in the last second: the fuller of the previous and the current
    /// window, counting only windows that began less than two seconds ago.
    fn borrowable(&self) -> usize {
        let (prev, cur, since) = self.turnover;
        let age = self.now_ms.saturating_sub(since);
        let per_second = match age {
            a if a < ACTIVE_MS => prev.max(cur),
            a if a < 2 * ACTIVE_MS => cur,
            _ => 0,
        };
        per_second.saturating_mul(BORROW_MS) / ACTIVE_MS_USIZE
    }

    /// Counts a freed slot in the turnover window.
    fn note_freed(&mut self) {
        let (prev, cur, since) = &mut self.turnover;
        let age = self.now_ms.saturating_sub(*since);
        if age >= ACTIVE_MS {
            *prev = if age < 2 * ACTIVE_MS { *cur } else { 0 };
            *cur = 0;
            *since = self.now_ms;
        }
        *cur += 1;
    }

    /// Records each level's demand now (running plus ready) in its
    /// one-second peak.
    fn note_demand(&mut self) {
        for level in 0..Priority::LEVELS {
            let now = self.running_at[level] + self.ready.len_at(level);
            let (peak, since) = &mut self.demand[level];
            if self.now_ms.saturating_sub(*since) >= ACTIVE_MS {
                *peak = now;
                *since = self.now_ms;
            } else {
                *peak = (*peak).max(now);
            }
        }
    }

    /// Whether `level` had work recently (see the module docs).
    fn active(&self, level: usize) -> bool {
        self.running_at[level] > 0
            || self.ready.len_at(level) > 0
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

    /// Jobs waiting for a concurrency slot.
    pub(crate) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Jobs of priority `level` waiting for a concurrency slot.
    pub(crate) fn ready_len_at(&self, level: usize) -> usize {
        self.ready.len_at(level)
    }

    /// Handlers running at once across all partitions.
    pub(crate) fn concurrency(&self) -> usize {
        self.limits.concurrency
    }

    /// Whether the scheduler holds `tp` paused (bound or due-time hold).
    #[cfg(test)]
    pub(crate) fn wants_pause(&self, tp: &Tp) -> bool {
        self.stopping || self.part(tp).is_some_and(Part::wants_pause)
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
        let rec = match rec.due_ms.filter(|d| *d > now_ms) {
            Some(due) => return Self::hold(p, rec, due, out),
            None => rec,
        };
        // The record a hold kept, given back at its due time.
        let was_held = p.hold.is_some_and(|h| h.offset == rec.offset);
        p.hold = None;
        // A fair route's job belongs to the tenant its header names.
        let fair = p.fair.filter(|_| !rec.foreign).and_then(|r| {
            let route = self.ready.fair.get_mut(usize::from(r))?;
            let tenant = rec.item.header(route.header()).unwrap_or("");
            Some((r, route.intern(tenant)))
        });
        // Reading past a flood: a tenant over its share is read past.
        if let (Some(pass), Some((_, tenant))) = (p.pass.as_mut(), fair) {
            let seen = match was_held {
                true => Some(rec.offset - 1),
                false => p.tracker.highest_seen(),
            };
            let started = p.tracker.is_in_flight(rec.offset);
            match pass.record(rec.offset, seen, started, tenant, rec.lane) {
                passing::Verdict::Admit => pass.admitted(tenant),
                passing::Verdict::Skip => return,
                passing::Verdict::Pass => {
                    // Unfinished in the tracker: never committed past.
                    p.tracker.start_at(rec.offset, rec.timestamp_ms);
                    Self::pause_if_over(p, self.limits.max_in_flight, out);
                    return;
                }
                passing::Verdict::SeekForward(to) => {
                    out.push(Action::Seek(p.tp.clone(), to));
                    Self::pause_if_over(p, self.limits.max_in_flight, out);
                    return;
                }
            }
        }
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
                fair,
                turn: p.turn.unwrap_or_else(|| self.turns.named(&rec.item)),
                back: p.back,
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
        Self::pause_if_over(p, self.limits.max_in_flight, out);
    }

    /// Pauses a partition whose buffer (or passed offsets) reached the bound.
    fn pause_if_over(p: &mut Part<R>, bound: usize, out: &mut Vec<Action<R>>) {
        if !p.paused_bound && p.over_bound(bound) {
            let was = p.wants_pause();
            p.paused_bound = true;
            if !was {
                out.push(Action::Pause(p.tp.clone()));
            }
        }
    }

    /// Seeks a partition back to read what it passed, when that is due
    /// (see [`passing`]), and resumes it if only its passed offsets had
    /// paused it.
    fn reread_if_due(p: &mut Part<R>, bound: usize, stopping: bool, out: &mut Vec<Action<R>>) {
        // A hold keeps the fetch position at its record: read back after.
        if p.revoked || stopping || p.hold.is_some() {
            return;
        }
        let seen = p.tracker.highest_seen();
        let Some(back) = p.pass.as_mut().and_then(|pass| pass.reread(seen)) else {
            return;
        };
        out.push(Action::Seek(p.tp.clone(), back));
        Self::resume_if_under(p, bound, out);
    }

    /// Resumes a partition paused for its bound once its buffer is down to
    /// three quarters of it.
    fn resume_if_under(p: &mut Part<R>, bound: usize, out: &mut Vec<Action<R>>) {
        if p.paused_bound && !p.revoked && p.buffered() <= bound * 3 / 4 && !p.over_bound(bound) {
            p.paused_bound = false;
            if !p.wants_pause() {
                out.push(Action::Resume(p.tp.clone()));
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
        // Sized once: growing it job by job was a visible share of the
        // dispatcher's time under a no-op load (issue 29).
        let room = self.limits.concurrency.saturating_sub(self.running);
        let mut batch: Vec<Job<R>> = Vec::with_capacity(room.min(self.ready.len()));
        let mut grants: Vec<Ticket> = Vec::new();
        self.note_demand();
        for level in 0..Priority::LEVELS {
            // Slots kept free for a more urgent level that is active.
            let reserve = self.reserve_for(level);
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
                    self.ready.resumed(&t);
                    self.running += 1;
                    self.running_at[level] += 1;
                    free -= 1;
                }
            }
            let n = free.min(self.ready.len_at(level));
            if n == 0 {
                continue;
            }
            let got = self.ready.take(level, n, &mut batch);
            self.running += got;
            self.running_at[level] += got;
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
        let holding = !self.parked.remove(&ticket);
        if holding {
            self.running = self.running.saturating_sub(1);
            self.running_at[ticket.level] = self.running_at[ticket.level].saturating_sub(1);
            self.note_freed();
        }
        self.ready.finished(&ticket, holding);
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
        if let (Some(pass), Some((_, tenant))) = (p.pass.as_mut(), ticket.fair) {
            pass.finished(tenant);
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
        if !self.stopping {
            Self::reread_if_due(p, self.limits.max_in_flight, false, out);
            Self::resume_if_under(p, self.limits.max_in_flight, out);
        }
    }

    /// Time passed: gives back the records of holds that are due, and
    /// commits moved watermarks once per commit interval.
    pub(crate) fn tick(&mut self, now_ms: i64, out: &mut Vec<Action<R>>) {
        self.now_ms = self.now_ms.max(now_ms);
        let mut due = Vec::new();
        for p in self.slots.iter_mut().flatten() {
            Self::reread_if_due(p, self.limits.max_in_flight, self.stopping, out);
            due.extend(Self::end_hold_if_due(
                p,
                now_ms,
                self.limits.max_in_flight,
                self.stopping,
                out,
            ));
        }
        for rec in due {
            self.record(rec, now_ms, out);
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
}
