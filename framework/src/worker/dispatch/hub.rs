//! The completion hub: the scheduler behind one lock, shared by the poll
//! thread (records in, consumer actions out) and the dispatcher tasks
//! (completions in, released jobs out), and the dealing of `Run` batches to
//! the dispatchers.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use crate::worker::intake::polled::Polled;
use crate::worker::intake::read_ahead::{Full, ReadAhead};
use crate::worker::scheduler::{Action, Job, Scheduler, Ticket, Tp};

/// Completions, batched by the dispatcher that ran them.
pub(crate) type Done = Vec<(Ticket, bool)>;

/// The scheduler and what goes with it, behind the [`Hub`]'s lock. Taken
/// once per poll turn, chunk of a poll batch (64 records), rebalance
/// callback or completion batch, never per
/// record.
pub(crate) struct Core {
    pub sched: Scheduler<Polled>,
    /// Partitions kjob paused on the consumer and has not resumed since.
    pub applied_pause: HashSet<Tp>,
    /// Main-topic partitions at their in-flight bound that are read through
    /// their own queue: not paused on the consumer (a pause makes
    /// librdkafka fetch and parse again what it had prefetched), only left
    /// unread until the scheduler resumes them ([`crate::worker::intake`]).
    pub throttled: Throttled,
    /// Actions of an assignment, applied once it is in effect.
    pub post_assign: Vec<Action<Polled>>,
    /// Consumer actions that completions caused, for the poll thread.
    pub(in crate::worker) deferred: Vec<Action<Polled>>,
    /// Threads waiting for running jobs to finish (revoke, shutdown).
    pub(in crate::worker) waiters: usize,
    /// Parked jobs waiting for a slot, and how to tell each it has one.
    grants: rustc_hash::FxHashMap<Ticket, tokio::sync::oneshot::Sender<()>>,
    /// The scheduler's actions for one completion batch, kept for the next.
    actions: Vec<Action<Polled>>,
    /// How far the poll thread reads ahead of the handlers
    /// ([`crate::worker::intake::read_ahead`]).
    pub(in crate::worker) read_ahead: ReadAhead,
}

/// How long [`Hub::lock`] spins for a taken lock before it sleeps: longer
/// than the poll thread holds it for a chunk of records, far shorter than
/// a scheduler's time slice (the holder may have lost its core).
const SPIN: Duration = Duration::from_micros(50);
/// Tries of the lock between two looks at the clock while spinning.
const SPIN_ROUND: u32 = 64;

/// What the poll thread and the dispatchers share.
pub(crate) struct Hub {
    core: Mutex<Core>,
    /// Whether [`Hub::lock`] spins: not on one core, where the holder
    /// cannot run while a waiter spins.
    spin: bool,
    /// The version of [`Core::throttled`], read without the lock: the poll
    /// thread copies the set only when it changed, right before it reads,
    /// so a resume it has just carried out is read in the same turn.
    pub(in crate::worker) throttle_version: Arc<AtomicU64>,
    /// Signalled after completions while someone waits for them.
    progress: Condvar,
    pub(in crate::worker) dispatch: Dispatch,
    /// Finished records, back to the poll thread (crate::worker::intake::recycle).
    pub(in crate::worker) returned: crate::worker::intake::recycle::Returned<Polled>,
    /// The poll thread's wake-up. A consumer action that a completion
    /// causes, above all the resume of a partition that was at its
    /// in-flight bound, is the poll thread's to carry out; woken, it does
    /// so at once instead of after its wait (2 ms while jobs run). With a
    /// bound of 1 record per partition that wait was the cost of every
    /// job (CHANGELOG.md's benchmark history, issue 29's eighth step).
    wake: Arc<crate::worker::wake::Wake>,
}

impl Hub {
    pub(crate) fn new(
        sched: Scheduler<Polled>,
        senders: Vec<UnboundedSender<Vec<Job<Polled>>>>,
        wake: Arc<crate::worker::wake::Wake>,
    ) -> Self {
        let throttled = Throttled::default();
        let read_ahead = ReadAhead::new(ReadAhead::limit_for(sched.concurrency()));
        Self {
            throttle_version: throttled.version.clone(),
            core: Mutex::new(Core {
                sched,
                applied_pause: HashSet::new(),
                throttled,
                post_assign: Vec::new(),
                deferred: Vec::new(),
                waiters: 0,
                grants: Default::default(),
                actions: Vec::new(),
                read_ahead,
            }),
            spin: std::thread::available_parallelism().is_ok_and(|n| n.get() > 1),
            progress: Condvar::new(),
            dispatch: Dispatch::new(senders),
            returned: Default::default(),
            wake,
        }
    }

    /// The scheduler, for one poll turn, chunk of records, rebalance
    /// callback or completion batch.
    ///
    /// Held for microseconds at a time, so a thread that finds it taken
    /// first spins for up to [`SPIN`] (on more than one core) before it
    /// sleeps: falling asleep and being woken costs each side a system
    /// call and the sleeper tens of microseconds before it runs again,
    /// longer than it would have waited.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        if self.spin {
            if let Some(core) = self.try_lock_for(SPIN) {
                return core;
            }
        }
        // Every critical section leaves the state consistent before anything
        // that can panic, so a poisoned lock is still safe to use.
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock if it comes free within `spin`, spinning meanwhile.
    fn try_lock_for(&self, spin: Duration) -> Option<MutexGuard<'_, Core>> {
        let mut started = None;
        loop {
            // The clock is read once per round of tries, not per try.
            for _ in 0..SPIN_ROUND {
                match self.core.try_lock() {
                    Ok(core) => return Some(core),
                    Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
                    Err(TryLockError::WouldBlock) => std::hint::spin_loop(),
                }
            }
            let since = *started.get_or_insert_with(Instant::now);
            if since.elapsed() >= spin {
                return None;
            }
        }
    }

    /// Dispatcher `me` reports attempts that finished together. The jobs
    /// this releases are returned for `me` to run at once, except a share
    /// of a large release, which goes to the other dispatchers.
    /// `batch` is drained, not consumed, so the dispatcher reuses it.
    pub(crate) fn finished(&self, me: usize, batch: &mut Done) -> Vec<Job<Polled>> {
        let mut mine = Vec::new();
        let (waiters, for_poll) = {
            let mut core = self.lock();
            // Reused: no allocation per completion batch.
            let mut out = std::mem::take(&mut core.actions);
            let parked = !core.grants.is_empty();
            for (t, ok) in batch.drain(..) {
                core.sched.finished(t, ok, &mut out);
                // A job released while it waited for a slot (none is, but
                // while a job is parked: no ticket hashed per job).
                if parked {
                    core.grants.remove(&t);
                }
            }
            core.sched.dispatch(&mut out);
            // A level the poll thread held with enough jobs waiting, now
            // short of them: woken below, it reads the level again.
            let read_more = core.release_read_ahead();
            let deferred = core.deferred.len();
            for action in out.drain(..) {
                match action {
                    Action::Run(jobs) => {
                        let share = self.dispatch.share(me, jobs);
                        if mine.is_empty() {
                            mine = share;
                        } else {
                            mine.extend(share);
                        }
                    }
                    Action::Grant(tickets) => core.grant(tickets),
                    other => core.deferred.push(other),
                }
            }
            core.actions = out;
            (
                core.waiters > 0,
                core.deferred.len() > deferred || read_more,
            )
        };
        if waiters {
            self.progress.notify_all();
        }
        if for_poll {
            self.wake.notify();
        }
        mine
    }

    /// Waits, without holding the lock, until completions arrive or `wait`
    /// passes.
    pub(in crate::worker) fn wait<'a>(
        &self,
        mut core: MutexGuard<'a, Core>,
        wait: Duration,
    ) -> MutexGuard<'a, Core> {
        core.waiters += 1;
        let (mut core, _) = self
            .progress
            .wait_timeout(core, wait)
            .unwrap_or_else(PoisonError::into_inner);
        core.waiters -= 1;
        core
    }
}

/// Main-topic partitions left unread at their in-flight bound, with a
/// version that every change bumps (no change can forget to), readable
/// without the hub's lock through [`Hub::throttle_version`].
#[derive(Default)]
pub(crate) struct Throttled {
    set: HashSet<Tp>,
    version: Arc<AtomicU64>,
}

impl Throttled {
    /// The partitions left unread.
    pub(crate) fn set(&self) -> &HashSet<Tp> {
        &self.set
    }

    /// Leaves `tps` unread.
    pub(crate) fn add(&mut self, tps: Vec<Tp>) {
        if !tps.is_empty() {
            self.set.extend(tps);
            self.bump();
        }
    }

    /// Reads `tp` again. False if it was not left unread.
    pub(crate) fn remove(&mut self, tp: &Tp) -> bool {
        let removed = self.set.remove(tp);
        if removed {
            self.bump();
        }
        removed
    }

    fn bump(&self) {
        self.version.fetch_add(1, AtomicOrdering::AcqRel);
    }
}

impl Core {
    /// The poll thread, before it reads: the levels with enough jobs
    /// waiting for a slot to be left unread this turn
    /// ([`ReadAhead::full`]).
    pub(in crate::worker) fn read_ahead_full(&mut self) -> Full {
        self.read_ahead.full(&self.sched)
    }

    /// After a completion or a park: whether a held level is now short of
    /// jobs, so the poll thread should be woken to read it again
    /// ([`ReadAhead::release`]).
    pub(in crate::worker) fn release_read_ahead(&mut self) -> bool {
        self.read_ahead.release(&self.sched)
    }

    /// The consumer actions completions caused since the last call.
    pub(in crate::worker) fn take_deferred(&mut self, out: &mut Vec<Action<Polled>>) {
        out.append(&mut self.deferred);
    }

    /// Tells parked jobs that they have their slot back.
    pub(in crate::worker) fn grant(&mut self, tickets: Vec<Ticket>) {
        for t in tickets {
            if let Some(tx) = self.grants.remove(&t) {
                let _ = tx.send(());
            }
        }
    }
}

impl crate::worker::before::park::Slots for Hub {
    fn park(&self, ticket: Ticket) {
        let mut out = Vec::new();
        let mut core = self.lock();
        core.sched.park(ticket);
        // The freed slot goes to the next job at once.
        core.sched.dispatch(&mut out);
        let deferred = core.deferred.len();
        for action in out {
            match action {
                Action::Run(jobs) => self.dispatch.send(jobs),
                Action::Grant(tickets) => core.grant(tickets),
                other => core.deferred.push(other),
            }
        }
        let read_more = core.release_read_ahead();
        let for_poll = core.deferred.len() > deferred || read_more;
        drop(core);
        if for_poll {
            self.wake.notify();
        }
    }

    fn unpark(&self, ticket: Ticket) -> Option<tokio::sync::oneshot::Receiver<()>> {
        let mut core = self.lock();
        if core.sched.unpark(ticket) {
            return None;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        core.grants.insert(ticket, tx);
        Some(rx)
    }
}

/// Hands `Run` batches to the dispatcher tasks, round-robin, one message
/// per dispatcher per batch.
pub(crate) struct Dispatch {
    pub senders: Vec<UnboundedSender<Vec<Job<Polled>>>>,
    next: AtomicUsize,
}

impl Dispatch {
    pub(crate) fn new(senders: Vec<UnboundedSender<Vec<Job<Polled>>>>) -> Self {
        Self {
            senders,
            next: AtomicUsize::new(0),
        }
    }

    /// Keeps a small batch for dispatcher `me` (no wake-up of another
    /// thread) and deals a large one out to all, returning `me`'s share.
    fn share(&self, me: usize, jobs: Vec<Job<Polled>>) -> Vec<Job<Polled>> {
        let chunks = self.deal(jobs);
        if chunks.len() == 1 {
            return chunks.into_iter().next().unwrap_or_default();
        }
        let mut mine = Vec::new();
        for (i, chunk) in chunks.into_iter().enumerate() {
            if i == me {
                mine = chunk;
            } else {
                self.to(i, chunk);
            }
        }
        mine
    }

    /// Sends a batch from the poll thread: a small one to the next
    /// dispatcher in turn, a large one dealt out to all.
    pub(in crate::worker) fn send(&self, jobs: Vec<Job<Polled>>) {
        let next = self.next.fetch_add(1, AtomicOrdering::Relaxed);
        for (i, chunk) in self.deal(jobs).into_iter().enumerate() {
            self.to(next.wrapping_add(i), chunk);
        }
    }

    /// `jobs` as one chunk when small (or with one dispatcher), else dealt
    /// round-robin into one chunk per dispatcher.
    fn deal(&self, jobs: Vec<Job<Polled>>) -> Vec<Vec<Job<Polled>>> {
        let n = self.senders.len().max(1);
        if jobs.len() < 8 || n == 1 {
            return vec![jobs];
        }
        let each = jobs.len().div_ceil(n);
        let mut chunks: Vec<Vec<Job<Polled>>> = (0..n).map(|_| Vec::with_capacity(each)).collect();
        for (i, j) in jobs.into_iter().enumerate() {
            chunks[i % n].push(j);
        }
        chunks
    }

    /// Sends a non-empty `chunk` to dispatcher `i` (modulo their number).
    fn to(&self, i: usize, chunk: Vec<Job<Polled>>) {
        let n = self.senders.len().max(1);
        if let (false, Some(s)) = (chunk.is_empty(), self.senders.get(i % n)) {
            let _ = s.send(chunk);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::*;
    use crate::worker::scheduler::{Incoming, LaneKey, Limits};
    use crate::worker::wake::Wake;

    #[test]
    fn every_change_of_the_unread_partitions_bumps_their_version() {
        let mut t = Throttled::default();
        let version = t.version.clone();
        let seen = || version.load(Ordering::Acquire);
        let (a, b): (Tp, Tp) = (("t".into(), 0), ("t".into(), 1));
        t.add(Vec::new());
        assert_eq!(seen(), 0, "nothing added, nothing changed");
        t.add(vec![a.clone(), b.clone()]);
        assert_eq!(seen(), 1);
        assert!(t.remove(&a));
        assert_eq!(seen(), 2);
        assert!(!t.remove(&a), "already read again");
        assert_eq!(seen(), 2, "a remove that changes nothing bumps nothing");
        assert_eq!(t.set().iter().collect::<Vec<_>>(), [&b]);
    }

    #[test]
    fn a_lock_held_past_the_spin_is_still_taken_once_let_go() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let limits = Limits {
            concurrency: 1,
            max_in_flight: 1,
            commit_interval_ms: 0,
        };
        let hub = Arc::new(Hub::new(
            Scheduler::new(limits),
            vec![tx],
            Arc::new(Wake::default()),
        ));
        let held = hub.lock();
        assert!(
            hub.try_lock_for(SPIN).is_none(),
            "taken for the whole spin: the spin gives up"
        );
        let waiter = {
            let hub = hub.clone();
            std::thread::spawn(move || hub.lock().waiters)
        };
        // Held well past the spin: the waiter falls asleep on the lock.
        std::thread::sleep(SPIN * 40);
        let mut held = held;
        held.waiters = 7;
        drop(held);
        assert_eq!(
            waiter.join().ok(),
            Some(7),
            "the sleeper takes the lock after it is let go, and sees what its holder wrote"
        );
        assert!(hub.try_lock_for(SPIN).is_some(), "free: taken at once");
    }

    /// Assigns `tp` (partition 0 of topic "t"), records `n` unordered
    /// records of it and starts what the free slots take.
    fn assign_and_record(core: &mut Core, tp: &Tp, n: i64, out: &mut Vec<Action<Polled>>) {
        core.sched.assign(std::slice::from_ref(tp), out);
        for offset in 0..n {
            let rec = Incoming {
                offset,
                lane: LaneKey::Offset(offset),
                timestamp_ms: None,
                due_ms: None,
                foreign: false,
                item: Polled::for_test("t", 0, offset),
            };
            core.sched.record(rec, 0, out);
        }
        core.sched.dispatch(out);
    }

    #[test]
    fn a_completion_that_resumes_a_partition_wakes_the_poll_thread() {
        let wake = Arc::new(Wake::default());
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let limits = Limits {
            concurrency: 4,
            max_in_flight: 2,
            commit_interval_ms: 0,
        };
        let hub = Hub::new(Scheduler::new(limits), vec![tx], wake.clone());
        let tp: Tp = ("t".to_string(), 0);
        let mut out = Vec::new();
        {
            let mut core = hub.lock();
            assign_and_record(&mut core, &tp, 2, &mut out);
        }
        assert!(
            out.iter()
                .any(|a| matches!(a, Action::Pause(p) if *p == tp)),
            "two records fill a bound of two"
        );
        let tickets: Vec<Ticket> = out
            .iter()
            .flat_map(|a| match a {
                Action::Run(jobs) => jobs.iter().map(|j| j.ticket).collect(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(tickets.len(), 2);
        assert_eq!(wake.notified.load(Ordering::Relaxed), 0);

        // One finishes: the partition is under three quarters of its bound
        // again, and its resume is the poll thread's to carry out.
        hub.finished(0, &mut vec![(tickets[0], true)]);
        assert_eq!(
            wake.notified.load(Ordering::Relaxed),
            1,
            "the poll thread is woken for the resume"
        );
        let mut deferred = Vec::new();
        hub.lock().take_deferred(&mut deferred);
        assert!(
            deferred
                .iter()
                .any(|a| matches!(a, Action::Resume(p) if *p == tp)),
            "the resume waits for the poll thread"
        );

        // The other finishes: no action for the poll thread, no wake-up.
        hub.finished(0, &mut vec![(tickets[1], true)]);
        assert_eq!(wake.notified.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_completion_that_leaves_a_full_level_short_of_jobs_wakes_the_poll_thread() {
        let wake = Arc::new(Wake::default());
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let limits = Limits {
            concurrency: 1,
            max_in_flight: 100,
            commit_interval_ms: 0,
        };
        let hub = Hub::new(Scheduler::new(limits), vec![tx], wake.clone());
        let tp: Tp = ("t".to_string(), 0);
        let mut out = Vec::new();
        let held = {
            let mut core = hub.lock();
            core.read_ahead = ReadAhead::new(4);
            assign_and_record(&mut core, &tp, 5, &mut out);
            core.read_ahead_full()
        };
        assert_eq!(
            held,
            [false, true, false],
            "one job runs, four wait for its slot"
        );
        let mut running: Vec<Ticket> = out
            .iter()
            .flat_map(|a| match a {
                Action::Run(jobs) => jobs.iter().map(|j| j.ticket).collect(),
                _ => Vec::new(),
            })
            .collect();
        // Each completion starts the next job: 3, then 2 left waiting (not
        // under half the limit), then 1.
        for (waiting, woken) in [(3, 0), (2, 0), (1, 1)] {
            let ticket = running.pop().expect("a job runs");
            let next = hub.finished(0, &mut vec![(ticket, true)]);
            running.extend(next.iter().map(|j| j.ticket));
            assert_eq!(hub.lock().sched.ready_len_at(1), waiting);
            assert_eq!(
                wake.notified.load(Ordering::Relaxed),
                woken,
                "with {waiting} jobs waiting"
            );
        }
    }
}
