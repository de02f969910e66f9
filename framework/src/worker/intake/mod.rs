//! Intake: every main-topic partition is read through a queue of its own
//! (librdkafka's partition queue, split off as rdkafka's `split_partition_queue`
//! does, and read in batches: [`crate::worker::intake::split_queue`]), for two reasons.
//!
//! * **Priority order.** librdkafka delivers every partition through one
//!   queue, in the order its fetches returned. During a bulk enqueue burst
//!   that queue holds thousands of bulk records, and an urgent record
//!   fetched behind them waits until the poll thread has taken them all
//!   (issue 31 measured ack -> start p99 of 54-125 ms for it). Read a queue
//!   per partition, most urgent level first, it waits for nothing.
//! * **Backpressure without a pause.** A partition at its in-flight bound
//!   is left unread, not paused. A pause makes librdkafka drop what it had
//!   prefetched for the partition and fetch and parse it again on resume
//!   (issue 29 counted 2.2 records parsed per no-op job); an unread queue
//!   only stops growing at librdkafka's prefetch limits, which the worker
//!   sets from the bound (`queued.min.messages`, in `run.rs`). In the
//!   no-op bench that is about 14 % less CPU per job and 1.5 times the
//!   jobs/s on 2 cores (CHANGELOG.md's benchmark history, issue 29's fifth step).
//!
//! Within a level the first queue read rotates from turn to turn, and each
//! queue gives at most its share of the batch before the next is read. A
//! level is skipped while enough of its jobs already wait for a slot
//! ([`crate::worker::intake::read_ahead`]), the others are read as usual.
//! Fair routes stay in the main queue: they read past a flooding tenant
//! with seeks, and so do the tier topics, whose holds pause.
//!
//! Two rules keep the commit guarantee:
//! * **Order within a partition.** Records fetched before a split stay in
//!   the main queue; newer ones go to the partition's own queue. The split
//!   queues are therefore read only once every entry the main queue held
//!   right after the split has left it: the main queue is first-in
//!   first-out, so that is when the poll thread has taken as many records
//!   from it as it held then, or has seen it empty. A partition's records
//!   so reach the scheduler in offset order (its watermark assumes that).
//! * **Re-split after every assignment.** librdkafka points a partition's
//!   fetch queue back at the main queue when it assigns it, so each change
//!   of the assignment splits the partitions again (a partition split twice
//!   is the same queue, its records stay in order) and gates them anew.
//!
//! A blocking wait in one librdkafka queue is not ended by another, so the
//! poll thread waits in none: it parks, and each queue's non-empty callback
//! unparks it ([`Wake`]).
//!
//! The room of step 3 in ARCHITECTURE.md, the poll.
//! **Enters:** records from librdkafka, and the scheduler's actions.
//! **Leaves:** each record copied out as a `Polled` (`polled`; its box and
//! buffer reused through `recycle`) with its lane and due time (`record`),
//! handed to the scheduler in batches; pauses, resumes, seeks and commits
//! carried out on the consumer (`poll`: the poll thread, its consumer
//! context, rebalances and consumer actions). This file reads the split
//! queues (`split_queue`); `read_ahead` says how far it reads ahead.

pub(in crate::worker) mod poll;
pub(crate) mod polled;
pub(in crate::worker) mod read_ahead;
pub(crate) mod record;
pub(in crate::worker) mod recycle;
pub(in crate::worker) mod split_queue;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rustc_hash::{FxHashMap, FxHashSet};
use tracing::{debug, warn};

use crate::worker::intake::poll::context::WorkerContext;
use crate::worker::intake::polled::Polled;
use crate::worker::intake::read_ahead::Full;
use crate::worker::intake::split_queue::{Fetched, SplitQueue};
use crate::worker::scheduler::priority::Priority;
use crate::worker::scheduler::Tp;
use crate::worker::state::{RouteEntry, TopicRole};
use crate::worker::wake::Wake;

type KjobConsumer = BaseConsumer<WorkerContext>;

/// The split partitions and what reading them needs.
pub(crate) struct Intake {
    /// Main topics read through their own queues, and their level (0 the
    /// most urgent).
    split: FxHashMap<String, usize>,
    /// The split partitions, most urgent level first.
    queues: Vec<Split>,
    /// The assignment generation the queues were split for.
    generation: u64,
    /// The consumer's main queue, to see it empty.
    main: MainQueue,
    /// Entries (records and events) the main queue held right after the
    /// last split: the split queues open once as many records were taken.
    backlog: usize,
    /// Records taken from the main queue since the last split. Events it
    /// served and stale records it dropped are not counted, so the count
    /// can only open the gate late, never early.
    taken: usize,
    /// Partitions left unread for now: at their in-flight bound.
    stopped: FxHashSet<Tp>,
    /// The poll thread's wake-up, given to every split queue's callback.
    wake: Arc<Wake>,
    /// Turns read so far: the first queue read within a level rotates, so
    /// no partition of a level is always read last.
    turn: usize,
    /// Levels left unread this turn: enough of their jobs wait for a slot
    /// ([`crate::worker::intake::read_ahead`]).
    full: Full,
}

struct Split {
    tp: Tp,
    level: usize,
    queue: SplitQueue<WorkerContext>,
    /// Records of the partition fetched before the split may still wait in
    /// the main queue: not read until it was seen empty.
    gated: bool,
    /// At its in-flight bound: not read until the scheduler resumes it.
    stopped: bool,
    /// Set by librdkafka when the queue turns non-empty, and by the reader
    /// when it left records in it: an empty queue costs no poll.
    pending: Arc<AtomicBool>,
}

impl Intake {
    /// `None` when the worker has no main topic to read through its own
    /// queues (fair routes read past floods with seeks, through the main
    /// queue).
    pub(crate) fn new(
        routes: &FxHashMap<String, RouteEntry>,
        consumer: &Arc<KjobConsumer>,
        wake: Arc<Wake>,
    ) -> Option<Self> {
        let split: FxHashMap<String, usize> = routes
            .iter()
            .filter(|(_, e)| reads_split(e))
            .map(|(t, e)| (t.clone(), e.priority.level()))
            .collect();
        if split.is_empty() {
            return None;
        }
        let main = MainQueue::of(consumer)?;
        Some(Self {
            split,
            queues: Vec::new(),
            generation: u64::MAX,
            main,
            backlog: 0,
            taken: 0,
            stopped: FxHashSet::default(),
            wake,
            turn: 0,
            full: [false; Priority::LEVELS],
        })
    }

    /// The partitions the scheduler holds at their bound changed: they are
    /// left unread, the others read again.
    pub(crate) fn stop_only(&mut self, stopped: &std::collections::HashSet<Tp>) {
        self.stopped = stopped.iter().cloned().collect();
        for s in &mut self.queues {
            let now = self.stopped.contains(&s.tp);
            if s.stopped && !now {
                // Records may have arrived meanwhile without a callback.
                s.pending.store(true, Ordering::Release);
            }
            s.stopped = now;
        }
    }

    /// The levels to leave unread until the next call: enough of their
    /// jobs wait for a slot ([`crate::worker::intake::read_ahead`]).
    pub(crate) fn leave_unread(&mut self, full: Full) {
        self.full = full;
    }

    /// After an assignment changed (`generation` differs from the last
    /// one), splits the assigned main-topic partitions again and gates them.
    pub(crate) fn refresh(
        &mut self,
        consumer: &Arc<KjobConsumer>,
        generation: u64,
        assigned: impl FnOnce() -> Vec<Tp>,
    ) {
        if generation == self.generation {
            return;
        }
        self.generation = generation;
        // Dropped first: dropping a queue handle disables the non-empty
        // callback of the partition's queue, which a new handle of the same
        // partition would have just set.
        self.queues.clear();
        for (topic, partition) in &assigned() {
            let Some(&level) = self.split.get(topic) else {
                continue;
            };
            let Some(mut queue) =
                SplitQueue::split(consumer, Arc::from(topic.as_str()), *partition)
            else {
                warn!(%topic, partition, "could not read the partition through its own queue; it is read with the others");
                continue;
            };
            let pending = Arc::new(AtomicBool::new(true));
            let flag = pending.clone();
            let wake = self.wake.clone();
            queue.on_nonempty(move || {
                flag.store(true, Ordering::Release);
                wake.notify();
            });
            let tp = (topic.clone(), *partition);
            self.queues.push(Split {
                stopped: self.stopped.contains(&tp),
                tp,
                level,
                queue,
                gated: true,
                pending,
            });
        }
        self.queues.sort_by_key(|s| s.level);
        // Measured after the splits: it covers every entry fetched before
        // them (and perhaps a few after, which only opens the gate later).
        self.backlog = self.main.len();
        self.taken = 0;
        debug!(
            split = self.queues.len(),
            "main-topic partitions read through their own queues"
        );
    }

    /// Waits up to `timeout` for a record or an event in any queue the
    /// poll thread reads; returns at once if one already waits.
    pub(crate) fn wait(&self, timeout: Duration) {
        let waiting = self.main.len() > 0
            || self
                .queues
                .iter()
                .any(|s| self.open(s) && s.pending.load(Ordering::Acquire));
        if !waiting {
            std::thread::park_timeout(timeout);
        }
    }

    /// Takes up to `limit` records from the open split queues, most urgent
    /// level first, into `batch` (through `copy`, given each record and
    /// its topic's shared name). Within a level each
    /// queue gives at most its share of what is left before the next is
    /// read, the first one rotating from turn to turn, so one busy
    /// partition does not crowd out the others. Returns the first error a
    /// queue reported, after which it reads no further.
    pub(crate) fn read(
        &mut self,
        batch: &mut Vec<Polled>,
        limit: usize,
        mut copy: impl FnMut(&Fetched, &Arc<str>) -> Polled,
    ) -> Option<rdkafka::error::KafkaError> {
        self.turn = self.turn.wrapping_add(1);
        let mut start = 0;
        while start < self.queues.len() {
            let level = self.queues[start].level;
            let end = start
                + self.queues[start..]
                    .iter()
                    .take_while(|s| s.level == level)
                    .count();
            if self.level_full(level) {
                start = end;
                continue;
            }
            let group = &mut self.queues[start..end];
            let n = group.len();
            // Passes over the level until it is empty or the batch full.
            loop {
                let before = batch.len();
                let share = (limit.saturating_sub(before) / n).max(MIN_SHARE);
                for i in 0..n {
                    let split = &mut group[(self.turn + i) % n];
                    if batch.len() >= limit {
                        return None;
                    }
                    if split.gated || split.stopped {
                        continue;
                    }
                    if let Some(e) =
                        read_one(split, batch, (batch.len() + share).min(limit), &mut copy)
                    {
                        return Some(e);
                    }
                }
                if batch.len() >= limit || batch.len() == before {
                    break;
                }
            }
            if batch.len() >= limit {
                return None;
            }
            start = end;
        }
        None
    }

    /// Whether the poll thread left `level` unread this turn, its jobs
    /// waiting for a slot at the read-ahead limit.
    fn level_full(&self, level: usize) -> bool {
        self.full.get(level).copied().unwrap_or(false)
    }

    /// Whether `split` is read this turn: past its gate, under its bound,
    /// its level not full.
    fn open(&self, split: &Split) -> bool {
        !split.gated && !split.stopped && !self.level_full(split.level)
    }

    /// Called after the poll thread took `taken` records from the main
    /// queue this turn: once it took as many as the queue held after the
    /// splits, or sees it empty, every record fetched before the splits
    /// has been taken, and the split queues open.
    pub(crate) fn main_drained(&mut self, taken: usize) {
        self.taken = self.taken.saturating_add(taken);
        if self.queues.iter().any(|s| s.gated)
            && (self.taken >= self.backlog || self.main.len() == 0)
        {
            for s in &mut self.queues {
                s.gated = false;
            }
        }
    }
}

/// The fewest records a queue gives per pass: reading a queue costs a lock
/// and a callback check, so tiny shares would waste them.
const MIN_SHARE: usize = 64;

/// Whether a route's main topic is read through a queue per partition: a
/// fair route reads past a flooding tenant with seeks, and its records
/// stay in the main queue.
pub(crate) fn reads_split(e: &RouteEntry) -> bool {
    e.role == TopicRole::Main && e.fair.is_none()
}

/// Takes records from one split queue until it is empty or `batch` holds
/// `upto`; records left behind are read again next turn.
fn read_one(
    split: &mut Split,
    batch: &mut Vec<Polled>,
    upto: usize,
    copy: &mut impl FnMut(&Fetched, &Arc<str>) -> Polled,
) -> Option<rdkafka::error::KafkaError> {
    if !split.pending.swap(false, Ordering::AcqRel) {
        return None;
    }
    let room = upto.saturating_sub(batch.len());
    let (error, emptied) = split.queue.read(room, |m| {
        debug_assert_eq!(m.partition(), split.tp.1);
        batch.push(copy(m, split.queue.topic()));
    });
    if !emptied || error.is_some() {
        split.pending.store(true, Ordering::Release);
    }
    error
}

/// A handle to the consumer's main queue, held to read its length.
pub(crate) struct MainQueue {
    queue: NonNull<rd::rd_kafka_queue_t>,
    /// Keeps the client alive for as long as the handle.
    _consumer: Arc<KjobConsumer>,
}

// SAFETY: a librdkafka queue handle may be used and destroyed from any
// thread; the poll thread is the only user.
unsafe impl Send for MainQueue {}

impl MainQueue {
    pub(crate) fn of(consumer: &Arc<KjobConsumer>) -> Option<Self> {
        // SAFETY: the client pointer is valid while `consumer` lives, which
        // the handle's clone of it guarantees.
        let ptr = unsafe { rd::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        NonNull::new(ptr).map(|queue| Self {
            queue,
            _consumer: consumer.clone(),
        })
    }

    /// How many entries (records and events) wait in the main queue.
    pub(crate) fn len(&self) -> usize {
        // SAFETY: the handle is valid until dropped.
        unsafe { rd::rd_kafka_queue_length(self.queue.as_ptr()) }
    }
}

impl Drop for MainQueue {
    fn drop(&mut self) {
        // SAFETY: obtained from rd_kafka_queue_get_consumer, destroyed once,
        // while the client still lives.
        unsafe { rd::rd_kafka_queue_destroy(self.queue.as_ptr()) }
    }
}
