//! Intake in priority order: the main topics of the more urgent routes are
//! read through queues of their own, polled before the consumer's main
//! queue.
//!
//! librdkafka delivers every assigned partition through one queue, in the
//! order its fetches returned. During a bulk enqueue burst that queue holds
//! thousands of bulk records, and an urgent record fetched behind them
//! waits until the poll thread has taken them all, a batch a turn, before
//! any priority lane can apply (issue 31 measured ack -> start p99 of
//! 54-125 ms for it). Here each assigned partition of a main topic whose
//! route is more urgent than the worker's least urgent level is split off
//! (`BaseConsumer::split_partition_queue`), and every turn reads those
//! queues first, most urgent level first.
//!
//! Two rules keep the commit guarantee:
//! * **Order within a partition.** Records fetched before a split stay in
//!   the main queue; newer ones go to the partition's own queue. The split
//!   queues are therefore read only once every entry the main queue held
//!   right after the split has left it: the main queue is first-in
//!   first-out, so that is when the poll thread has taken as many records
//!   from it as it held then, or has seen it empty. A partition's records
//!   so reach the scheduler in offset order (its watermark assumes that),
//!   and an urgent record waits at most for the backlog that was ahead of
//!   it anyway, not for the main queue to run dry during a flood.
//! * **Re-split after every assignment.** librdkafka points a partition's
//!   fetch queue back at the main queue when it assigns it, so each change
//!   of the assignment splits the urgent partitions again (a partition split
//!   twice is the same queue, its records stay in order) and gates them
//!   anew.
//!
//! A split queue does not end the main queue's blocking wait, so while
//! urgent partitions are split the poll thread waits at most
//! [`SPLIT_WAIT`] at a time, idle or not.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rustc_hash::FxHashMap;
use tracing::{debug, warn};

use super::poll::WorkerContext;
use super::polled::Polled;
use super::scheduler::Tp;
use super::state::{RouteEntry, TopicRole};

/// The longest the poll thread blocks in the main queue while partitions
/// are split: a record arriving in a split queue does not wake it.
pub(crate) const SPLIT_WAIT: Duration = Duration::from_millis(2);

type KjobConsumer = BaseConsumer<WorkerContext>;

/// The split partitions and what reading them needs.
pub(crate) struct Intake {
    /// Main topics read through their own queues, and their level (0 the
    /// most urgent).
    urgent: FxHashMap<String, usize>,
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
}

struct Split {
    tp: Tp,
    level: usize,
    queue: PartitionQueue<WorkerContext>,
    /// Records of the partition fetched before the split may still wait in
    /// the main queue: not read until it was seen empty.
    gated: bool,
    /// Set by librdkafka when the queue turns non-empty, and by the reader
    /// when it left records in it: an empty queue costs no poll.
    pending: Arc<AtomicBool>,
}

impl Intake {
    /// `None` when every route of the worker has the same priority: then
    /// there is nothing to read first, and the main queue serves all.
    pub(crate) fn new(
        routes: &FxHashMap<String, RouteEntry>,
        consumer: &Arc<KjobConsumer>,
    ) -> Option<Self> {
        let least = routes.values().map(|e| e.priority.level()).max()?;
        let urgent: FxHashMap<String, usize> = routes
            .iter()
            .filter(|(_, e)| e.role == TopicRole::Main && e.priority.level() < least)
            .map(|(t, e)| (t.clone(), e.priority.level()))
            .collect();
        if urgent.is_empty() {
            return None;
        }
        let main = MainQueue::of(consumer)?;
        Some(Self {
            urgent,
            queues: Vec::new(),
            generation: u64::MAX,
            main,
            backlog: 0,
            taken: 0,
        })
    }

    /// After an assignment changed (`generation` differs from the last
    /// one), splits the assigned urgent partitions again and gates them.
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
            let Some(&level) = self.urgent.get(topic) else {
                continue;
            };
            let Some(mut queue) = consumer.split_partition_queue(topic, *partition) else {
                warn!(%topic, partition, "could not read the partition through its own queue; it is read with the others");
                continue;
            };
            let pending = Arc::new(AtomicBool::new(true));
            let flag = pending.clone();
            queue.set_nonempty_callback(move || flag.store(true, Ordering::Release));
            self.queues.push(Split {
                tp: (topic.clone(), *partition),
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
            "urgent partitions read through their own queues"
        );
    }

    /// Whether any partition is read through its own queue.
    pub(crate) fn active(&self) -> bool {
        !self.queues.is_empty()
    }

    /// Takes up to `limit` records from the open split queues, most urgent
    /// level first, into `batch` (through `copy`). Returns the first error
    /// a queue reported, after which it reads no further.
    pub(crate) fn read(
        &mut self,
        batch: &mut Vec<Polled>,
        limit: usize,
        mut copy: impl FnMut(&rdkafka::message::BorrowedMessage<'_>) -> Polled,
    ) -> Option<rdkafka::error::KafkaError> {
        for split in self.queues.iter_mut().filter(|s| !s.gated) {
            if batch.len() >= limit {
                return None;
            }
            if !split.pending.swap(false, Ordering::AcqRel) {
                continue;
            }
            loop {
                if batch.len() >= limit {
                    // Records left behind: read again next turn.
                    split.pending.store(true, Ordering::Release);
                    break;
                }
                match split.queue.poll(Duration::ZERO) {
                    None => break,
                    Some(Ok(m)) => {
                        debug_assert_eq!(m.partition(), split.tp.1);
                        batch.push(copy(&m));
                    }
                    Some(Err(e)) => {
                        split.pending.store(true, Ordering::Release);
                        return Some(e);
                    }
                }
            }
        }
        None
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

/// A handle to the consumer's main queue, held to read its length.
struct MainQueue {
    queue: NonNull<rd::rd_kafka_queue_t>,
    /// Keeps the client alive for as long as the handle.
    _consumer: Arc<KjobConsumer>,
}

// SAFETY: a librdkafka queue handle may be used and destroyed from any
// thread; the poll thread is the only user.
unsafe impl Send for MainQueue {}

impl MainQueue {
    fn of(consumer: &Arc<KjobConsumer>) -> Option<Self> {
        // SAFETY: the client pointer is valid while `consumer` lives, which
        // the handle's clone of it guarantees.
        let ptr = unsafe { rd::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        NonNull::new(ptr).map(|queue| Self {
            queue,
            _consumer: consumer.clone(),
        })
    }

    /// How many entries (records and events) wait in the main queue.
    fn len(&self) -> usize {
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
