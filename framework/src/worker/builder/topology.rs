//! What topics a worker owns beyond its main topics: whether it creates
//! them, delay topics, shared tiers and buckets, DLQ partitions, batches
//! and cron schedules (its deployment model lists them:
//! `worker/builder/describe.rs`).

use crate::job::Job;
use crate::worker::builder::WorkerBuilder;

impl WorkerBuilder {
    /// Whether the worker creates its missing retry-tier and DLQ topics at
    /// start, with the main topic's partition count (default true). Disable
    /// where topics are managed elsewhere: a missing one is then an error.
    pub fn create_topics(mut self, yes: bool) -> Self {
        self.create_topics = yes;
        self
    }

    /// **Development only**: creates a missing main topic at start, with
    /// `partitions` partitions, and logs that it did. Without it a missing
    /// main topic stops the worker ([`crate::Error::MissingTopic`]), which
    /// is what production wants: a main topic's partition count caps how
    /// many workers share its jobs and fixes which key lands where, so it
    /// is chosen by whoever owns the cluster (`kjob topics create`), not
    /// by the first process that happens to start. `build()` refuses 0.
    pub fn create_main_topics(mut self, partitions: usize) -> Self {
        self.create_main_topics = Some(partitions);
        self
    }

    /// Whether the worker also serves its routes' delay topics
    /// (`<topic>.delay.<bucket>`, see [`crate::delay`]), creating them at
    /// start when [`WorkerBuilder::create_topics`] allows, so that
    /// [`Producer::enqueue_in`](crate::Producer::enqueue_in) and [`Producer::enqueue_at`](crate::Producer::enqueue_at) work for its
    /// routes (default false: seven more topics per route, consumed by the
    /// same consumer).
    pub fn delayed_jobs(mut self, yes: bool) -> Self {
        self.delayed_jobs = yes;
        self
    }

    /// [`delayed_jobs`](Self::delayed_jobs) for the route on `topic` alone:
    /// only the routes that delay jobs get the seven delay topics (times the
    /// main topic's partitions), the others none. `build()` refuses a topic
    /// that is not one of the worker's routes.
    pub fn delayed_jobs_on(mut self, topic: &str) -> Self {
        self.delayed_routes.insert(topic.to_string());
        self
    }

    /// Retry tiers shared by the worker's routes instead of a set per
    /// route: one topic per distinct tier delay, `<group>.retry.<delay>`
    /// (say `mailer.retry.30s`), where per route it would be
    /// `<topic>.retry.<delay>` for every route. A route of 12 partitions
    /// with three tiers costs 36 tier partitions per route; shared, the
    /// three tiers cost 36 for all routes together. Each record names its
    /// route (`kjob-route`), so retry policies, metrics and DLQs stay per
    /// route; routes whose policies have the same delay share that tier,
    /// and a tier still releases its records in arrival order, since all
    /// of them wait the same delay. Routes under
    /// [`strict_order`](Self::strict_order) or [`fair`](Self::fair) keep
    /// tiers of their own (strict order needs a key on one partition number
    /// across the main topic and its tiers; fairness counts a route's
    /// tenants across its topics). Per-route tiers stay the default: they
    /// isolate one route's retry storm from another's, at the partition
    /// cost above.
    pub fn shared_retry_tiers(self) -> Self {
        self.shared_retry_tiers_with(crate::worker::SharedTiers::default())
    }

    /// [`shared_retry_tiers`](Self::shared_retry_tiers) with a namespace
    /// other than the group (workers of several groups sharing one set, or
    /// a name that outlives a group rename) or a partition count of its own.
    pub fn shared_retry_tiers_with(mut self, tiers: crate::worker::SharedTiers) -> Self {
        self.shared_tiers = Some(tiers);
        self
    }

    /// Creates a missing DLQ (`<topic>.dlq`) with `n` partitions, at least
    /// one, instead of its main topic's count. Dead letters are few and read
    /// by operators, not by a group of workers, so one to three partitions
    /// serve them; with 50 routes of 12 partitions that is 50 to 150 DLQ
    /// partitions instead of 600. A dead letter's partition is chosen by
    /// its key, so a key's dead letters stay in order. An existing DLQ is
    /// used as it is.
    pub fn dlq_partitions(mut self, n: usize) -> Self {
        self.dlq_partitions = Some(n.max(1));
        self
    }

    /// Takes part in batches ([`crate::batch`]) on the batch topic
    /// [`crate::batch::DEFAULT_TOPIC`]: a finished job of a batch is
    /// recorded there before its offset is committed, and the worker joins
    /// the coordinators that fold the batches and fire their callbacks.
    /// Creates the batch topic and its state topic when missing (and
    /// [`create_topics`](Self::create_topics) allows). Every worker that
    /// runs jobs enqueued into a batch needs it: without it, a job's
    /// completion is not counted and its batch never completes.
    pub fn batches(self) -> Self {
        self.batches_on(crate::batch::DEFAULT_TOPIC)
    }

    /// [`batches`](Self::batches) on another batch topic (a namespace of
    /// its own; producers name it with [`crate::batch::Batch::topic`]).
    pub fn batches_on(mut self, topic: &str) -> Self {
        self.batches = Some(topic.to_string());
        self
    }

    /// Declares `J` as a batch callback this worker runs: `build()` fails
    /// if no route of the worker handles `J`, rather than callbacks
    /// waiting on a topic nobody reads.
    pub fn batch_callback<J: Job>(mut self) -> Self {
        self.batch_callbacks.push(J::NAME);
        self
    }

    /// Enqueues `make()` on `J`'s main topic at every tick of the cron
    /// expression `expr` (with seconds, UTC: `0 */5 * * * *` is every five
    /// minutes), once per tick across every worker of the group, whatever
    /// their number; see [`crate::schedule`] for leadership, ids and the
    /// catch-up policy ([`crate::schedule::CatchUp::Latest`] by default).
    pub fn schedule<J: Job>(
        self,
        name: &str,
        expr: &str,
        make: impl Fn() -> J + Send + Sync + 'static,
    ) -> Self {
        self.schedule_with(crate::schedule::Schedule::new(name, expr, make))
    }

    /// Adds a [`crate::schedule::Schedule`] configured in full (another
    /// topic, another catch-up policy).
    pub fn schedule_with(mut self, schedule: crate::schedule::Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }
}
