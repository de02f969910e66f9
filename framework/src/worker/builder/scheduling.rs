//! How a worker's routes share its handler slots and keep their order:
//! priorities, strict order, fair share, debounce and the ordering mode,
//! and what the scheduler is given of them at `build()`.

use crate::worker::before::strict;
use crate::worker::builder::WorkerBuilder;
use crate::worker::scheduler::Limits;
use crate::worker::state::OrderingMode;
use crate::worker::state::RouteEntry;
use crate::worker::state::TopicRole;
use crate::worker::Priority;
use crate::worker::WorkerStats;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

impl WorkerBuilder {
    /// How urgent the route on main topic `topic` (and its retry tiers) is
    /// against this worker's other routes (default [`Priority::Normal`]):
    /// free slots go to the most urgent active route first, and less urgent
    /// ones keep at most three quarters of them meanwhile. See
    /// [`Priority`].
    pub fn priority(mut self, topic: &str, priority: Priority) -> Self {
        self.priorities.insert(topic.to_string(), priority);
        self
    }

    /// Strict ordered retries for the route on main topic `topic`: while a
    /// key has a job in the retry path, the key's later jobs do not run
    /// before it. They are parked in one of the route's retry tiers (the
    /// longest that brings them back no later than that job is due; their
    /// attempt count untouched, `kjob-follows` naming the job they wait
    /// for) and run in arrival order once it was handled or dead-lettered.
    /// The order survives a crash or a rebalance: it is kept in a compacted
    /// topic `<topic>.order` (created with the main topic's partition count
    /// when [`WorkerBuilder::create_topics`] allows). Other keys are not
    /// delayed. Use it for contracts where order is the point (a ledger, a
    /// state machine); it costs one state write per failure, per parked
    /// record and per finished chain member, and a key's throughput drops
    /// to one job per retry delay while it waits.
    ///
    /// Needs keyed records (keyless ones run as on any route),
    /// [`OrderingMode::PerKey`] or [`OrderingMode::PerPartition`], and the
    /// `range` assignment kjob uses by default: `build()` refuses another
    /// `partition.assignment.strategy` or `group.remote.assignor`, and
    /// start-up refuses tier or order topics whose partition count differs
    /// from the main topic's. Delayed jobs are not ordered with their key's
    /// other jobs. A state record that is not kjob's is logged and read as
    /// an empty chain (the key's waiting jobs then run as they come due).
    /// The rules, the write order, what a crash and bad input do, and how
    /// to clear a key whose head is gone are in the book's ordering
    /// chapter (`docs/src/ordering.md`, "Strict order").
    pub fn strict_order(mut self, topic: &str) -> Self {
        self.strict.insert(topic.to_string());
        self
    }

    /// Share the handler slots of the route on main topic `topic` among
    /// its tenants, by weight, with an optional cap per tenant: see
    /// [`Fairness`](crate::worker::Fairness). Its retry tiers share it.
    pub fn fair(mut self, topic: &str, fairness: crate::worker::Fairness) -> Self {
        self.fair.insert(topic.to_string(), fairness);
        self
    }

    /// [`WorkerBuilder::fair`] by the `kjob-tenant` header, every tenant
    /// weighing the same.
    pub fn fair_by_tenant(self, topic: &str) -> Self {
        self.fair(topic, crate::worker::Fairness::by_tenant())
    }

    /// The fair routes for the scheduler: each with its topics (main and
    /// tiers) and settings.
    pub(crate) fn topic_fairness(
        &self,
        routes: &HashMap<String, RouteEntry>,
    ) -> Vec<(Vec<String>, crate::worker::scheduler::FairSpec)> {
        self.fair
            .iter()
            .map(|(main, f)| {
                let mut topics: Vec<String> = routes
                    .iter()
                    .filter(|(_, e)| e.main == *main)
                    .map(|(t, _)| t.clone())
                    .collect();
                topics.sort();
                (topics, f.spec(main))
            })
            .collect()
    }

    /// Debounce the route on main topic `topic`: of several jobs with the
    /// same key written within `window` of each other, only the newest
    /// runs; the others finish as superseded, without a handler call. Each
    /// job waits `window` after it was written before it may run (parked,
    /// holding no handler slot), so a burst of changes to one record costs
    /// one handler call. For refreshes and syncs whose newest job makes the
    /// older ones moot; not for jobs that each carry their own effect.
    /// Keyless records and retries are not debounced. Not with
    /// [`WorkerBuilder::strict_order`] on the same route. See the
    /// `debounce` module docs for what it keeps across a crash.
    pub fn debounce(mut self, topic: &str, window: Duration) -> Self {
        self.debounce.insert(topic.to_string(), window);
        self
    }

    /// The strict-order state for this builder's strict routes, stored in
    /// `store` (`None` without any).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn strict_state(
        &self,
        store: Arc<dyn strict::OrderStore>,
        stats: Arc<WorkerStats>,
        cancel: CancellationToken,
    ) -> Option<Arc<strict::Strict>> {
        (!self.strict.is_empty()).then(|| {
            Arc::new(strict::Strict::new(
                self.strict.iter().cloned().collect(),
                store,
                stats,
                cancel,
            ))
        })
    }

    /// Ordering mode (default [`OrderingMode::PerKey`]).
    pub fn ordering(mut self, ordering: OrderingMode) -> Self {
        self.settings.ordering = ordering;
        self
    }

    /// The ordering mode and the scheduler limits this builder configures,
    /// shared by the worker and the test harness.
    pub(crate) fn scheduler_settings(&self) -> (OrderingMode, Limits) {
        (
            self.settings.ordering,
            Limits {
                concurrency: self.concurrency,
                max_in_flight: self.settings.max_in_flight_per_partition,
                commit_interval_ms: self.settings.commit_interval.as_millis() as i64,
            },
        )
    }

    /// Which route each consumed topic's jobs belong to, so that the
    /// routes of one priority level take turns for slots: a route's own
    /// tiers and buckets are its own, a shared one's records name theirs.
    pub(crate) fn topic_turns(
        &self,
        routes: &HashMap<String, RouteEntry>,
    ) -> crate::worker::scheduler::Turns {
        let mut mains: Vec<&str> = routes.values().map(|e| e.main.as_str()).collect();
        mains.sort_unstable();
        mains.dedup();
        let mut turns = crate::worker::scheduler::Turns::default();
        for (topic, e) in routes {
            if !matches!(e.role, TopicRole::Main) {
                turns.back.insert(topic.clone());
            }
            if e.sharers.is_some() {
                turns.shared.insert(topic.clone());
            } else if let Ok(i) = mains.binary_search(&e.main.as_str()) {
                let i = u16::try_from(i).unwrap_or(u16::MAX);
                turns.own.insert(topic.clone(), i);
            }
        }
        turns
    }

    /// Every consumed topic's priority: a route's tiers take its main
    /// topic's.
    pub(crate) fn topic_priorities(
        &self,
        routes: &HashMap<String, RouteEntry>,
    ) -> HashMap<String, Priority> {
        routes
            .iter()
            .map(|(topic, e)| (topic.clone(), e.priority))
            .collect()
    }
}
