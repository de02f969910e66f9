//! [`SharedTiers`]: one set of retry tier topics (and, if asked, delay
//! buckets) for all of a worker's routes, instead of a set per route.

/// How a worker's routes share retry tiers
/// ([`WorkerBuilder::shared_retry_tiers_with`](crate::WorkerBuilder::shared_retry_tiers_with)).
///
/// The tiers are `<namespace>.retry.<delay>`, one per distinct delay of the
/// routes' policies. The namespace is the consumer group unless
/// [`SharedTiers::namespace`] names another. Their partition count is, unless
/// [`SharedTiers::partitions`] sets one, the largest of the sharing routes'
/// main topics: a retry storm after an outage can then spread over as many
/// workers as the busiest route's jobs do, and the cost is paid once per
/// tier, not once per route.
///
/// With [`SharedTiers::delay_buckets`] the routes that take delayed jobs
/// share `<namespace>.delay.<bucket>` too.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedTiers {
    pub(crate) namespace: Option<String>,
    pub(crate) partitions: Option<usize>,
    pub(crate) delays: bool,
}

impl SharedTiers {
    /// Tiers named `<group>.retry.<delay>` (the default namespace).
    pub fn new() -> Self {
        Self::default()
    }

    /// Tiers named `<name>.retry.<delay>`: several groups (or a renamed
    /// group) use one set. Every group that reads them skips the records
    /// another group forwarded, as on per-route tiers.
    pub fn namespace(mut self, name: &str) -> Self {
        self.namespace = Some(name.to_string());
        self
    }

    /// Creates missing shared tiers with `n` partitions (at least 1).
    pub fn partitions(mut self, n: usize) -> Self {
        self.partitions = Some(n.max(1));
        self
    }

    /// The routes that take delayed jobs
    /// ([`delayed_jobs_on`](crate::WorkerBuilder::delayed_jobs_on)) share
    /// delay buckets as well: `<namespace>.delay.<bucket>` (seven topics for
    /// the worker, where each delaying route would have seven of its own).
    /// A bucket releases every record exactly its bucket after it was
    /// written, whichever route it belongs to, so sharing keeps the buckets
    /// first-in first-out. Producers must write there too: give them the
    /// same namespace with
    /// [`Producer::shared_delay_buckets`](crate::Producer::shared_delay_buckets)
    /// (the outbox relay and `kjob enqueue` have the same setting); a
    /// producer that still writes to a route's own delay topics is served
    /// while those exist.
    pub fn delay_buckets(mut self) -> Self {
        self.delays = true;
        self
    }

    /// What the tier topics are named after for a worker of `group`.
    pub(crate) fn namespace_for<'a>(&'a self, group: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(group)
    }
}
