//! Shared worker state: per-partition offset trackers, ordering lanes and
//! pause flags, behind one mutex.
//!
//! The poll thread (dispatch, rebalance, commit) and the handler tasks
//! (completion) both touch this state; a single `Mutex` with short critical
//! sections keeps the invariants easy to see: an offset enters the tracker
//! before its task can finish, and a completion from a previous assignment
//! (older `epoch`) is ignored.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::message::{Message, OwnedMessage};
use tokio::sync::Semaphore;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use super::route::Route;
use super::Ordering;
use crate::offsets::OffsetTracker;
use crate::producer::Producer;
use crate::retry::RetryPolicy;

/// A topic-partition.
pub(crate) type Tp = (String, i32);

/// Which records must run one after another.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) enum LaneKey {
    /// Same record key: sequential (per-key ordering).
    Key(Vec<u8>),
    /// Whole partition: sequential (per-partition ordering, and keyless
    /// records under per-key ordering).
    Partition,
    /// One record: no ordering constraint (unordered mode).
    Offset(i64),
}

impl LaneKey {
    pub(crate) fn for_message(ordering: Ordering, msg: &OwnedMessage) -> Self {
        match ordering {
            Ordering::PerKey => match msg.key() {
                Some(k) => LaneKey::Key(k.to_vec()),
                None => LaneKey::Partition,
            },
            Ordering::PerPartition => LaneKey::Partition,
            Ordering::Unordered => LaneKey::Offset(msg.offset()),
        }
    }
}

/// Everything kjob tracks for one assigned partition.
pub(crate) struct PartitionState {
    /// Assignment generation; completions from another epoch are stale.
    pub epoch: u64,
    pub tracker: OffsetTracker,
    /// Running lanes. The entry exists while a task runs the lane; the queue
    /// holds records waiting behind the running one.
    pub lanes: HashMap<LaneKey, VecDeque<OwnedMessage>>,
    pub tasks: HashMap<LaneKey, AbortHandle>,
    /// Paused by backpressure (kjob's own flag; re-applied after assignment).
    pub paused: bool,
    /// Revoked: dispatch nothing more, start nothing queued.
    pub revoked: bool,
    /// A retry-tier record that is not due yet: the partition is paused and
    /// was seeked back to it; nothing else of the partition is dispatched
    /// until that record comes back after the due time.
    pub delay: Option<Delay>,
    /// Cancelled when the partition is revoked or the worker stops: lanes
    /// still *waiting* for a concurrency slot give up at once (their records
    /// are uncommitted, so the next owner gets them); only handlers that are
    /// already running are waited for.
    pub cancel: CancellationToken,
}

/// A partition held back until its head record is due.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Delay {
    /// The not-yet-due record; the partition waits for exactly this offset.
    pub offset: i64,
    /// When to resume.
    pub due: Instant,
    /// Resumed (and seeked again) at the due time; waiting for the record.
    pub resumed: bool,
}

impl PartitionState {
    /// Whether kjob wants the consumer paused for this partition, for any
    /// reason (backpressure or a retry delay).
    pub(crate) fn wants_pause(&self) -> bool {
        self.paused || self.delay.is_some_and(|d| !d.resumed)
    }
}

impl PartitionState {
    pub(crate) fn new(epoch: u64, cancel: CancellationToken) -> Self {
        Self {
            cancel,
            epoch,
            tracker: OffsetTracker::new(),
            lanes: HashMap::new(),
            tasks: HashMap::new(),
            paused: false,
            revoked: false,
            delay: None,
        }
    }

    /// Drops every queued (not yet started) record. They stay unfinished in
    /// the tracker, so the watermark never passes them: they are re-delivered.
    pub(crate) fn drop_queued(&mut self) {
        for q in self.lanes.values_mut() {
            q.clear();
        }
    }
}

#[derive(Default)]
pub(crate) struct State {
    pub partitions: HashMap<Tp, PartitionState>,
    pub next_epoch: u64,
    /// Partitions whose backpressure cleared; the poll thread resumes them.
    pub to_resume: Vec<Tp>,
    /// An async commit failed; recommit everything at the next interval.
    pub commit_failed: bool,
    /// Partitions kjob has paused on the consumer and not resumed since.
    /// librdkafka keeps an application's pause across a revoke and a
    /// re-assignment of the same partition, so this outlives the partition's
    /// state: after every assignment the poll thread compares it with kjob's
    /// own view and corrects the consumer (see `poll::reapply_pause_view`).
    pub applied_pause: std::collections::HashSet<Tp>,
}

/// Worker settings resolved at build time.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub group: String,
    pub ordering: Ordering,
    pub max_in_flight_per_partition: usize,
    pub shutdown_grace: Duration,
    pub revoke_timeout: Duration,
    pub commit_interval: Duration,
    pub poll_timeout: Duration,
}

/// Counters a program can read while the worker runs (the demo's progress
/// line, tests). Monotonic; never reset.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Attempts that returned `Ok`.
    pub handled: AtomicU64,
    /// Failed attempts that were scheduled for another try.
    pub retried: AtomicU64,
    /// Records written to the DLQ (acknowledged).
    pub dead_lettered: AtomicU64,
    /// Attempts that panicked (also counted in `dead_lettered`).
    pub panicked: AtomicU64,
    /// Tier records skipped because another consumer group wrote them.
    pub skipped_foreign: AtomicU64,
    /// Rebalances (assign or revoke) this worker went through.
    pub rebalances: AtomicU64,
    /// Set while the worker is assigned partitions and consuming.
    pub ready: AtomicBool,
    /// The metrics endpoint's bound address, once it listens.
    pub endpoint: std::sync::OnceLock<std::net::SocketAddr>,
    /// The partitions currently assigned to this worker.
    assigned: Mutex<std::collections::BTreeSet<Tp>>,
}

impl WorkerStats {
    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(AtomicOrdering::Relaxed)
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, AtomicOrdering::Relaxed);
    }

    /// The `(topic, partition)`s this worker holds now, sorted: what an
    /// operator (or a test) checks to see how a group spread its work.
    pub fn assignment(&self) -> Vec<(String, i32)> {
        self.assigned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    pub(crate) fn set_assigned(&self, tps: &[Tp], assigned: bool) {
        let mut set = self.assigned.lock().unwrap_or_else(PoisonError::into_inner);
        for tp in tps {
            if assigned {
                set.insert(tp.clone());
            } else {
                set.remove(tp);
            }
        }
    }
}

/// What the worker knows about one subscribed topic.
#[derive(Clone)]
pub(crate) struct RouteEntry {
    pub route: Arc<dyn Route>,
    /// The main topic (itself for a main topic; the origin for a tier).
    pub main: String,
    /// `Some(i)` when this topic is retry tier `i` of `main`.
    pub tier: Option<usize>,
    pub retry: Arc<RetryPolicy>,
}

pub(crate) struct Shared {
    pub state: Mutex<State>,
    /// Signalled whenever a lane finishes a record (revoke and shutdown wait on it).
    pub changed: Condvar,
    pub routes: HashMap<String, RouteEntry>,
    pub producer: Producer,
    pub settings: Settings,
    pub stats: Arc<WorkerStats>,
    pub concurrency: Arc<Semaphore>,
    /// Stop dispatching and starting queued work.
    pub stopping: AtomicBool,
    /// Cancelled together with `stopping`; the parent of every partition's
    /// `cancel` token.
    pub stop_token: CancellationToken,
    /// Cancels retry waits and DLQ write retries at the end of the grace period.
    pub cancel: CancellationToken,
    pub runtime: tokio::runtime::Handle,
    pub metrics: crate::telemetry::metrics::Metrics,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent before anything
        // that can panic, so a poisoned lock is still safe to use.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(AtomicOrdering::Acquire)
    }

    /// Begins the shutdown: no more dispatch, and lanes waiting for a
    /// concurrency slot give up.
    pub(crate) fn begin_stop(&self) {
        self.stopping.store(true, AtomicOrdering::Release);
        self.stop_token.cancel();
    }

    /// Waits (bounded) until no lane of `tps` is running. Returns whether
    /// they all drained.
    pub(crate) fn wait_drained(&self, tps: &[Tp], deadline: Instant) -> bool {
        let mut st = self.lock();
        loop {
            let busy = tps
                .iter()
                .any(|tp| st.partitions.get(tp).is_some_and(|p| !p.lanes.is_empty()));
            if !busy {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let wait = (deadline - now).min(Duration::from_millis(100));
            st = self
                .changed
                .wait_timeout(st, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
