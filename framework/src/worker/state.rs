//! What the worker's parts share: settings, the live counters, and the
//! route table. Partition, lane and offset state lives in the scheduler.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::retry::RetryPolicy;
use crate::worker::handler::route::RouteHandler;

pub(crate) use crate::worker::scheduler::Tp;

/// Which jobs of a partition may run at the same time.
///
/// Named `OrderingMode`, not `Ordering`, so a handler crate can import it
/// next to `std::sync::atomic::Ordering` and `std::cmp::Ordering`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OrderingMode {
    /// Same key: one after another; different keys: in parallel, even within
    /// one partition. The right default for entity-scoped jobs.
    #[default]
    PerKey,
    /// One job at a time per partition (parallelism = partition count).
    PerPartition,
    /// No ordering: every record may run in parallel.
    Unordered,
}

/// Worker settings resolved at build time.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub group: String,
    pub ordering: OrderingMode,
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
    /// Delayed jobs forwarded from one delay topic to the next.
    pub delay_hops: AtomicU64,
    /// Records of a strict-order route parked in a retry tier, not run,
    /// behind their key's job in the retry path (every park counts).
    pub held: AtomicU64,
    /// Jobs not run because a newer job of their key reached the worker
    /// within the route's debounce window.
    pub superseded: AtomicU64,
    /// Copies of finished jobs not run again on a strict-order route (a
    /// re-delivery after a crash, or a parked copy coming back).
    pub duplicates: AtomicU64,
    /// Waiting jobs not run because an operator cancelled them (or moved
    /// them to "now", which cancels the waiting copy).
    pub cancelled: AtomicU64,
    /// Scheduled (cron) jobs this worker enqueued as the schedule leader.
    pub schedule_fired: AtomicU64,
    /// Set while this worker is the group's schedule leader.
    pub schedule_leader: AtomicBool,
    /// Rebalances (assign or revoke) this worker went through.
    pub rebalances: AtomicU64,
    /// Records not run again because this worker had finished them before
    /// it lost their partition, which then came back to it unchanged (a
    /// coordinator outage longer than the session).
    pub skipped_finished: AtomicU64,
    /// Records of a fair route's flooding tenant read past (to reach the
    /// other tenants behind them) and not yet read again, now.
    pub read_past: AtomicU64,
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

/// What a subscribed topic is to its route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TopicRole {
    /// The route's main topic, where jobs are enqueued.
    Main,
    /// Retry tier `n` (0 the shortest) of the route's policy.
    Tier(usize),
    /// Delay bucket `n` of [`crate::delay::BUCKETS`].
    Delay(usize),
}

impl TopicRole {
    /// A tier or a delay bucket: its records carry a due time, and the
    /// worker holds them until it comes.
    pub(crate) fn holds(self) -> bool {
        !matches!(self, TopicRole::Main)
    }
}

/// What the worker knows about one subscribed topic.
#[derive(Clone)]
pub(crate) struct RouteEntry {
    pub handler: Arc<dyn RouteHandler>,
    /// The main topic (itself for a main topic; the origin for a tier).
    pub main: String,
    /// What this topic is to its route.
    pub role: TopicRole,
    pub retry: Arc<RetryPolicy>,
    /// The route's priority (its tiers share it).
    pub priority: crate::worker::Priority,
    /// Whether the route has delay topics (`WorkerBuilder::delayed_jobs`).
    pub delays: bool,
    /// The header naming the tenant when the route shares its slots
    /// among tenants (`WorkerBuilder::fair`): its attempts are counted per
    /// tenant.
    pub fair: Option<Arc<str>>,
    /// What the route's retry tier topics are named after: its main topic
    /// (`<main>.retry.<delay>`), or the namespace of the shared tiers
    /// (`<namespace>.retry.<delay>`, `WorkerBuilder::shared_retry_tiers`).
    pub tiers_at: Arc<str>,
    /// What the route's delay buckets are named after: its main topic
    /// (`<main>.delay.<bucket>`), or the shared namespace
    /// (`SharedTiers::delay_buckets`).
    pub delays_at: Arc<str>,
    /// On a shared tier or delay bucket only: the entry of each route
    /// whose records pass through it, by main topic. A record there names its route in
    /// `kjob-route` ([`crate::headers::ROUTE`]).
    pub sharers: Option<Arc<rustc_hash::FxHashMap<String, RouteEntry>>>,
}

impl RouteEntry {
    /// The entry a record of this topic runs under: this one, or on a
    /// shared tier the entry of the route the record names
    /// (`kjob-route`, else the topic it was first consumed from). `None`
    /// for a record in a shared tier that names no route of this worker.
    pub(crate) fn for_record<'a>(
        &'a self,
        headers: &crate::headers::HeaderView<'_>,
    ) -> Option<&'a RouteEntry> {
        let Some(sharers) = &self.sharers else {
            return Some(self);
        };
        let named = headers.route.and_then(|v| std::str::from_utf8(v).ok());
        named
            .or(headers.original_topic)
            .and_then(|main| sharers.get(main))
    }
}
