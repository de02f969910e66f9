//! The scheduler's vocabulary: what comes in (records), what goes out
//! (actions, jobs to run), and the per-partition state it keeps.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use tokio_util::sync::CancellationToken;

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
    /// The route whose turn the job waits for in its level ([`Turns`]).
    pub(super) turn: u16,
    /// It comes back to its route (a delay bucket's or a retry tier's
    /// record), so it takes turns with the route's new jobs.
    pub(super) back: bool,
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
            turn: 0,
            back: false,
        }
    }
}

/// A partition's release signal, shared by its jobs: an `Arc` around one
/// token rather than clones of it, because cloning or dropping a
/// `CancellationToken` takes the mutex of its tree node. With a clone per
/// record, the poll thread (cloning) and the dispatchers (dropping) took
/// each partition's lock once per job; an `Arc` costs an atomic add.
pub(crate) type Released = std::sync::Arc<CancellationToken>;

/// A job to run now.
pub(crate) struct Job<R> {
    pub ticket: Ticket,
    pub item: R,
    /// Cancelled when this job's partition is revoked, lost or stopped: an
    /// attempt that is still *waiting* (for the schema registry, or parked
    /// by a layer such as the breaker) gives up then instead of holding the
    /// revoke or the shutdown; it is uncommitted, so the next owner runs it.
    /// A handler that already started is never cut short by it.
    pub released: Released,
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

/// Which route each topic's jobs belong to, so that the routes of one
/// priority level take turns for free slots (see the `ready` module).
/// Topics it does not name are all one route.
#[derive(Clone, Debug, Default)]
pub(crate) struct Turns {
    /// A route's own topics (main, tiers, delay buckets) -> the route's
    /// index; a route's main topic names it.
    pub own: std::collections::HashMap<String, u16>,
    /// Shared tiers and delay buckets: a record there takes the turn of
    /// the route it names (`kjob-route`, else `kjob-original-topic`).
    pub shared: std::collections::HashSet<String>,
    /// Delay buckets and retry tiers, own and shared: their jobs come back
    /// to their route and take turns with its new ones.
    pub back: std::collections::HashSet<String>,
}

impl Turns {
    /// The route a record of a shared topic belongs to, by the route or
    /// original topic its headers name; an unknown name goes with the
    /// topics `Turns` does not name.
    pub(super) fn named<L: Located>(&self, rec: &L) -> u16 {
        rec.header(crate::headers::ROUTE)
            .or_else(|| rec.header(crate::headers::ORIGINAL_TOPIC))
            .and_then(|main| self.own.get(main))
            .copied()
            .unwrap_or(0)
    }

    /// The turn of a partition of `topic` ([`Part::turn`]).
    pub(super) fn for_topic(&self, topic: &str) -> Option<u16> {
        match self.shared.contains(topic) {
            true => None,
            false => Some(self.own.get(topic).copied().unwrap_or(0)),
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

/// How long an urgent job may wait for a slot that less urgent levels
/// borrowed from its reserve: well under the latency an urgent job's
/// handler and intake add anyway.
pub(super) const BORROW_MS: usize = 2;

/// [`ACTIVE_MS`] for slot arithmetic.
pub(super) const ACTIVE_MS_USIZE: usize = ACTIVE_MS as usize;

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
    /// The route whose turn the topic's jobs wait for; `None` on a shared
    /// tier or bucket, where each record names its route ([`Turns`]).
    pub(super) turn: Option<u16>,
    /// A delay bucket or retry tier ([`Turns::back`]).
    pub(super) back: bool,
    pub(super) tracker: OffsetTracker,
    /// Cancelled when this assignment ends (see [`Job::released`]).
    pub(super) released: Released,
    /// Fx, not SipHash: looked up twice per record. Its keys are offsets
    /// or per-process randomly seeded hashes of record keys (see
    /// `record::incoming`), so a producer cannot aim keys at one bucket.
    pub(super) lanes: FxHashMap<LaneKey, Lane<R>>,
    pub(super) paused_bound: bool,
    pub(super) hold: Option<Hold>,
    /// The record the hold waits for, kept until its due time: given back
    /// then, not fetched again (see [`crate::worker::scheduler::hold`]).
    pub(super) held: Option<Incoming<R>>,
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
    /// On a fair route's main topic: what a flooding tenant's excess left
    /// unread ([`crate::worker::scheduler::passing`]).
    pub(super) pass: Option<crate::worker::scheduler::passing::Passing>,
}

/// The most lost partitions whose finished work is remembered (each costs
/// its in-flight offsets, at most the in-flight bound).
pub(super) const LOST_KEPT: usize = 4_096;

impl<R> Part<R> {
    /// Records in memory: started and unfinished, less the passed ones
    /// (their offsets are kept, not the records).
    pub(super) fn buffered(&self) -> usize {
        self.tracker.in_flight() - self.pass.as_ref().map_or(0, |p| p.passed())
    }

    /// Whether the partition must stop reading new records: its buffer is
    /// full, or so are its passed offsets.
    pub(super) fn over_bound(&self, bound: usize) -> bool {
        self.buffered() >= bound || self.pass.as_ref().is_some_and(|p| p.full(bound))
    }

    pub(super) fn wants_pause(&self) -> bool {
        self.paused_bound || self.hold.is_some_and(|h| !h.resumed)
    }
}
