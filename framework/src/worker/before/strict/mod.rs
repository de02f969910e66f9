//! Strict ordered retries: an opt-in per route
//! ([`crate::WorkerBuilder::strict_order`]) under which a key's later jobs
//! never run before its job in the retry path.
//!
//! Without it, a failed job waits in a retry tier while its key's later
//! jobs run, which is right for mails and wrong for a ledger. With it, each
//! key of the route has a *chain*: the ordered ids of its jobs that are not
//! finished yet, the head being the one in the retry path. The chain lives
//! in memory per partition and is persisted to a compacted topic
//! `<main>.order` (key = the job key, value = the ids, a tombstone when the
//! chain empties), so a worker that is SIGKILLed, or a new owner after a
//! rebalance, continues where the last one stopped.
//!
//! The rules, for keyed records of a strict route (main topic and retry
//! tiers alike; keyless records and delay-topic records behave as on any
//! route):
//! * a record whose key has no chain, or whose id is the chain head, runs.
//!   A retryable failure makes it the head of a new chain (persisted before
//!   the record is forwarded to its tier); success or dead-lettering pops
//!   it (persisted after the forward to the DLQ, before the offset commit);
//! * any other record of a key with a chain is not run: its id is appended
//!   (unless it is already there, a re-delivery) and the record is parked
//!   in a retry tier, its attempt unchanged, with `kjob-follows` naming
//!   the head: the longest tier that brings it back no later than the head
//!   is due ([`park_tier`]; the chain keeps the head's due time), else the
//!   first. When it comes back and is still not the head, it is parked
//!   again. Once the jobs ahead of it finished, it runs, with the attempt
//!   count it arrived with (1 for a job that never ran).
//!
//! A tier record whose id is in no chain is treated as a newcomer, not
//! dropped: it is a re-delivered copy of a job that already finished (a
//! crash between the state write and the offset commit), a retry written
//! before strict mode was turned on, or a job whose state record was
//! unreadable. Running it again is a duplicate, which kjob's at-least-once
//! contract already allows after a crash; dropping it could lose a job.
//!
//! Write order: the state write is acknowledged before the forward, the
//! forward before the offset commit. Every check-and-modify of a
//! partition's chains happens under that partition's lock, and the state
//! record is enqueued under it too, so the writes of one key reach the log
//! in the order they were decided.
//!
//! Ownership: a key's chain is only correct with one writer. Records of a
//! strict route are forwarded to the *same partition number* in the tier
//! (not re-partitioned by key), the state record goes to that number in
//! `<main>.order`, and kjob's default assignment (classic eager `range`,
//! or KIP-848's `range` assignor) gives partition *n* of every topic of a
//! route to one member. [`crate::WorkerBuilder::build`] refuses a strict
//! route under any other assignment strategy, and start-up refuses one
//! whose tier or order topics have another partition count than the main
//! topic. A partition's chains are (re)loaded from `<main>.order` before its
//! first record after every rebalance, after this worker's own state
//! writes still waiting for their acknowledgement landed.
//!
//! Known limit: under eager assignment, a handler still running when the
//! revoke timeout ends keeps running while the next owner loads the
//! partition, and its late state write can then reach the log after the
//! new owner's (the same window in which kjob's forwards already give a
//! duplicate). The next owner may then run that key's jobs out of order
//! once, never drop one.

mod chains;
mod store;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use rdkafka::message::Message;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::config::KafkaConfig;
use crate::error::{Error, Result};
use crate::headers::{JobHeaders, FOLLOWS};
pub(crate) use crate::topics::order_topic;
use crate::worker::decision::Outcome;
use crate::worker::settle::forward::Forwarder;
use crate::worker::state::{RouteEntry, TopicRole, WorkerStats};
pub(crate) use chains::Admit;
use chains::{park_tier, Chains};
#[cfg_attr(not(feature = "testing"), allow(unused_imports))]
pub(crate) use store::MemoryStore;
pub(crate) use store::{KafkaStore, OrderStore};

/// One state partition: its chains, the rebalance generation they were
/// loaded in, and how many of its state writes are enqueued but not yet
/// acknowledged.
#[derive(Default)]
struct Part {
    generation: Option<u64>,
    chains: Chains,
    pending: Arc<AtomicUsize>,
}

/// Counts a state write as pending until its acknowledgement future
/// completes or is dropped.
struct PendingWrite(Arc<AtomicUsize>);

impl PendingWrite {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, AtomicOrdering::AcqRel);
        Self(count.clone())
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        self.0.fetch_sub(1, AtomicOrdering::AcqRel);
    }
}

/// The worker gave up (end of the shutdown grace period): the record
/// stays uncommitted and is re-delivered.
#[derive(Debug)]
pub(crate) struct Cancelled;

/// The strict-order state of a worker's strict routes.
pub(crate) struct Strict {
    mains: HashSet<String>,
    store: Arc<dyn OrderStore>,
    /// Bumped on every assign and revoke: a partition's chains are reloaded
    /// when it moved since they were loaded.
    stats: Arc<WorkerStats>,
    cancel: CancellationToken,
    #[allow(clippy::type_complexity)]
    parts: Mutex<HashMap<(String, i32), Arc<tokio::sync::Mutex<Part>>>>,
}

/// What a post-attempt state change must do.
enum Change {
    /// Forwarded to a tier, due then.
    Retrying(Option<i64>),
    Finished,
}

impl Strict {
    pub(crate) fn new(
        mains: HashSet<String>,
        store: Arc<dyn OrderStore>,
        stats: Arc<WorkerStats>,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            mains,
            store,
            stats,
            cancel,
            parts: Mutex::default(),
        }
    }

    /// Whether `entry`'s record is under strict order: a strict route's
    /// main topic or retry tier (delay topics are not ordered).
    pub(crate) fn covers(&self, entry: &RouteEntry) -> bool {
        !matches!(entry.role, TopicRole::Delay(_)) && self.mains.contains(&entry.main)
    }

    fn part(&self, main: &str, partition: i32) -> Arc<tokio::sync::Mutex<Part>> {
        self.parts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((main.to_string(), partition))
            .or_default()
            .clone()
    }

    /// Locks a partition's chains, (re)loading them first if the partition
    /// was (re)assigned since they were loaded. Loading failures are
    /// retried with backoff: the partition waits, the others flow.
    async fn locked(
        &self,
        main: &str,
        partition: i32,
    ) -> std::result::Result<tokio::sync::OwnedMutexGuard<Part>, Cancelled> {
        let mut part = self.part(main, partition).lock_owned().await;
        let generation = WorkerStats::get(&self.stats.rebalances);
        if part.generation == Some(generation) {
            return Ok(part);
        }
        let topic = order_topic(main);
        // Our own writes still waiting for their acknowledgement may not be
        // readable yet: wait for them (none can start, the lock is held),
        // or the reload would forget them.
        while part.pending.load(AtomicOrdering::Acquire) > 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                _ = self.cancel.cancelled() => return Err(Cancelled),
            }
        }
        let mut wait = Duration::from_millis(200);
        loop {
            match self.store.load(&topic, partition).await {
                Ok(records) => {
                    let mut chains = Chains::default();
                    for (k, v) in &records {
                        chains.apply(&topic, k, v.as_deref());
                    }
                    debug!(topic = %topic, partition, records = records.len(), keys = chains.len(), "strict-order state loaded");
                    part.chains = chains;
                    part.generation = Some(generation);
                    return Ok(part);
                }
                Err(e) => {
                    error!(topic = %topic, partition, error = %e, "loading strict-order state failed; the partition's records wait and the read is retried");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.cancel.cancelled() => return Err(Cancelled),
                    }
                    wait = (wait * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// Enqueues `key`'s chain as it is in `part` (whose lock the caller
    /// holds, so writes reach the log in decision order), counted as
    /// pending until acknowledged.
    fn write(
        &self,
        part: &Part,
        main: &str,
        partition: i32,
        key: &[u8],
    ) -> BoxFuture<'static, Result<()>> {
        let pending = PendingWrite::new(&part.pending);
        let ack = self
            .store
            .write(&order_topic(main), partition, key, part.chains.encode(key));
        Box::pin(async move {
            let result = ack.await;
            drop(pending);
            result
        })
    }

    /// Writes `key`'s current chain until acknowledged. `first` is a write
    /// already enqueued under the lock; a failure re-writes the chain as it
    /// is *then* (a full snapshot, so a newer state is never overwritten by
    /// an older one).
    async fn persist(
        &self,
        main: &str,
        partition: i32,
        key: &[u8],
        first: BoxFuture<'static, Result<()>>,
    ) -> std::result::Result<(), Cancelled> {
        let topic = order_topic(main);
        let mut pending = first;
        let mut wait = Duration::from_millis(200);
        loop {
            match pending.await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    error!(topic = %topic, partition, error = %e, "strict-order state write failed; the record stays uncommitted and the write is retried");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.cancel.cancelled() => return Err(Cancelled),
                    }
                    wait = (wait * 2).min(Duration::from_secs(10));
                    let part = self.locked(main, partition).await?;
                    pending = self.write(&part, main, partition, key);
                }
            }
        }
    }

    /// May the record `id` of `key` (partition `partition` of `main` or
    /// its tiers) run now? When it has to wait and was appended, the
    /// chain is persisted before this returns.
    pub(crate) async fn admit(
        &self,
        main: &str,
        partition: i32,
        key: &[u8],
        id: &str,
    ) -> std::result::Result<Admit, Cancelled> {
        let (admit, write) = {
            let mut part = self.locked(main, partition).await?;
            let admit = part.chains.admit(key, id);
            let write = match &admit {
                Admit::Follow { appended: true, .. } => {
                    Some(self.write(&part, main, partition, key))
                }
                _ => None,
            };
            (admit, write)
        };
        if let Some(write) = write {
            self.persist(main, partition, key, write).await?;
        }
        Ok(admit)
    }

    async fn change(
        &self,
        main: &str,
        partition: i32,
        key: &[u8],
        id: &str,
        change: Change,
    ) -> std::result::Result<(), Cancelled> {
        let write = {
            let mut part = self.locked(main, partition).await?;
            let changed = match change {
                Change::Retrying(due) => part.chains.retrying(key, id, due),
                Change::Finished => part.chains.finished(key, id),
            };
            changed.then(|| self.write(&part, main, partition, key))
        };
        match write {
            Some(w) => self.persist(main, partition, key, w).await,
            None => Ok(()),
        }
    }

    /// `id` failed and is about to be forwarded to a tier: it heads (or
    /// stays in) its key's chain, persisted before the forward.
    pub(crate) async fn retrying(
        &self,
        main: &str,
        partition: i32,
        key: &[u8],
        id: &str,
        due_ms: Option<i64>,
    ) -> std::result::Result<(), Cancelled> {
        self.change(main, partition, key, id, Change::Retrying(due_ms))
            .await
    }

    /// `id` was handled or dead-lettered: it leaves its key's chain,
    /// persisted before the offset is released.
    pub(crate) async fn finished(
        &self,
        main: &str,
        partition: i32,
        key: &[u8],
        id: &str,
    ) -> std::result::Result<(), Cancelled> {
        self.change(main, partition, key, id, Change::Finished)
            .await
    }
}

impl Strict {
    /// The gate of `msg`, when it is under strict order (a keyed record of
    /// a strict route's main topic or tier).
    pub(crate) fn gate<'s, 'm, M: Message>(
        &'s self,
        entry: &RouteEntry,
        msg: &'m M,
    ) -> Option<Gate<'s, 'm>> {
        let key = msg.key()?;
        self.covers(entry).then_some(Gate {
            strict: self,
            key,
            partition: msg.partition(),
        })
    }
}

/// Parks `msg` (not run) in a retry tier of its route ([`park_tier`]),
/// on the same partition, its attempt unchanged, with `kjob-follows`
/// naming the job it waits for. `None` when the route has no tier to
/// park in (its policy lost them while a chain was open): the record
/// then runs, out of strict order, rather than wait forever.
#[allow(clippy::too_many_arguments)]
async fn park<M: Message>(
    fw: &Forwarder,
    entry: &RouteEntry,
    msg: &M,
    headers: &JobHeaders,
    id: &str,
    head: &str,
    head_due_ms: Option<i64>,
    now_ms: i64,
) -> Option<Outcome> {
    let i = park_tier(&entry.retry.tiers, now_ms, head_due_ms);
    let Some(tier) = entry.retry.tiers.get(i).copied() else {
        warn!(
            job.id = id, follows = head,
            "strict order: the route has no retry tier to park this job in; running it out of order"
        );
        return None;
    };
    if let Some(late_ms) = overdue(&entry.retry.tiers, now_ms, head_due_ms) {
        // Order is never given up on a timer (a long outage would then
        // reorder every waiting key); an operator decides.
        warn!(
            job.id = id, follows = head, late_ms, order_topic = %order_topic(&entry.main),
            "strict order: the job this key waits for is overdue in its retry tier. If its \
             record is gone (a tier topic deleted, strict order turned off and on again), \
             the key waits forever: clear it by writing a tombstone for the key to the order \
             topic"
        );
    }
    let topic = crate::retry::tier_topic(&entry.main, tier);
    let mut next = headers.clone();
    next.id = Some(id.to_string());
    next.due_at_ms = Some(now_ms + tier.as_millis() as i64);
    next.group = Some(fw.group.clone());
    if next.original_topic.is_none() {
        next.original_topic = Some(msg.topic().to_string());
        next.original_partition = Some(msg.partition());
        next.original_offset = Some(msg.offset());
        next.original_timestamp_ms = msg.timestamp().to_millis();
    }
    set_follows(&mut next, Some(head));
    debug!(job.id = id, follows = head, at = %format_args!("{}:{}:{}", msg.topic(), msg.partition(), msg.offset()), next = %topic, "strict order: waiting behind the key's job in the retry path");
    let pin = Some(msg.partition());
    let outcome = fw
        .forward_as(&topic, &entry.main, msg, &next, pin, Outcome::Held)
        .await;
    if outcome == Outcome::Held {
        fw.metrics.outcome(entry.route.job_name(), "held");
    }
    Some(outcome)
}

/// A record under strict order: the state, its key and its partition.
#[derive(Clone, Copy)]
pub(crate) struct Gate<'s, 'm> {
    strict: &'s Strict,
    key: &'m [u8],
    partition: i32,
}

impl Gate<'_, '_> {
    /// Before the handler: `None` if the record is its key's head (or the
    /// key has no chain) and runs; otherwise it is parked in a retry tier
    /// behind the head and the attempt ends here.
    pub(crate) async fn before<M: Message>(
        &self,
        fw: &Forwarder,
        entry: &RouteEntry,
        msg: &M,
        headers: &JobHeaders,
        now_ms: i64,
    ) -> Option<Outcome> {
        let id = headers.job_id(msg.topic(), msg.partition(), msg.offset());
        match self.admit(&entry.main, &id).await {
            Ok(Admit::Run) => None,
            Ok(Admit::Follow {
                head, head_due_ms, ..
            }) => park(fw, entry, msg, headers, &id, &head, head_due_ms, now_ms).await,
            Err(_) => Some(Outcome::Released),
        }
    }

    /// See [`Strict::admit`].
    pub(crate) async fn admit(
        &self,
        main: &str,
        id: &str,
    ) -> std::result::Result<Admit, Cancelled> {
        self.strict.admit(main, self.partition, self.key, id).await
    }

    /// See [`Strict::retrying`]; `false` when the worker gave up.
    pub(crate) async fn retrying(&self, main: &str, id: &str, due_ms: Option<i64>) -> bool {
        self.strict
            .retrying(main, self.partition, self.key, id, due_ms)
            .await
            .is_ok()
    }

    /// See [`Strict::finished`]; `false` when the worker gave up.
    pub(crate) async fn finished(&self, main: &str, id: &str) -> bool {
        self.strict
            .finished(main, self.partition, self.key, id)
            .await
            .is_ok()
    }

    /// The partition a forward of this record is pinned to.
    pub(crate) fn partition(&self) -> i32 {
        self.partition
    }
}

/// How long (ms) the head is past its due time, when that is more than
/// the route's longest tier delay: longer than any tier hold or re-park
/// explains, so worth a warning.
fn overdue(tiers: &[Duration], now_ms: i64, head_due_ms: Option<i64>) -> Option<i64> {
    let longest = tiers.iter().max()?.as_millis() as i64;
    let late = now_ms - head_due_ms?;
    (late > longest).then_some(late)
}

/// Sets (or with `None` removes) the `kjob-follows` header.
pub(crate) fn set_follows(headers: &mut JobHeaders, head: Option<&str>) {
    headers.extra.retain(|(k, _)| k != FOLLOWS);
    if let Some(h) = head {
        headers
            .extra
            .push((FOLLOWS.to_string(), h.as_bytes().to_vec()));
    }
}

/// Refuses strict routes where partition *n* of a route's topics may go
/// to different members: only `range` assignment co-partitions them.
pub(crate) fn check_assignment(
    config: &KafkaConfig,
    protocol: crate::worker::GroupProtocol,
    topics: &[String],
) -> Result<()> {
    let Some(first) = topics.first() else {
        return Ok(());
    };
    let (name, value) = match protocol {
        crate::worker::GroupProtocol::Classic => (
            "partition.assignment.strategy",
            config.overrides.get("partition.assignment.strategy"),
        ),
        crate::worker::GroupProtocol::Consumer => (
            "group.remote.assignor",
            config.overrides.get("group.remote.assignor"),
        ),
    };
    let Some(value) = value else {
        return Ok(());
    };
    let primary = value.split(',').next().unwrap_or("").trim();
    if primary.eq_ignore_ascii_case("range") {
        return Ok(());
    }
    Err(Error::InvalidSetting {
        name: name.into(),
        value: value.clone(),
        reason: format!(
            "strict_order(\"{first}\") keeps a key's state with the owner of partition n of the \
             route's main topic, its retry tiers and {}, which only the `range` assignor \
             guarantees (other strategies may give tier partition n to another member); \
             remove the setting (kjob uses `range`) or drop strict_order",
            order_topic(first)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store whose writes become readable only when acknowledged, and
    /// are acknowledged only when the test hands out permits.
    struct GatedStore {
        gate: Arc<tokio::sync::Semaphore>,
        log: Arc<MemoryStore>,
    }

    impl OrderStore for GatedStore {
        fn write(
            &self,
            topic: &str,
            partition: i32,
            key: &[u8],
            value: Option<Vec<u8>>,
        ) -> BoxFuture<'static, Result<()>> {
            let (gate, log) = (self.gate.clone(), self.log.clone());
            let (topic, key) = (topic.to_string(), key.to_vec());
            Box::pin(async move {
                if let Ok(p) = gate.acquire().await {
                    p.forget();
                }
                log.write(&topic, partition, &key, value).await
            })
        }

        fn load(
            &self,
            topic: &str,
            partition: i32,
        ) -> BoxFuture<'static, Result<Vec<(Vec<u8>, Option<Vec<u8>>)>>> {
            self.log.load(topic, partition)
        }
    }

    #[tokio::test]
    async fn a_reload_waits_for_our_own_unacknowledged_writes() {
        let store = Arc::new(GatedStore {
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            log: Arc::default(),
        });
        let stats = Arc::new(WorkerStats::default());
        let strict = Arc::new(Strict::new(
            ["m".to_string()].into_iter().collect(),
            store.clone(),
            stats.clone(),
            CancellationToken::new(),
        ));
        store.gate.add_permits(1);
        assert!(strict.retrying("m", 0, b"k", "1", None).await.is_ok());
        // Job 2 is appended; its state write waits for the broker.
        let s = strict.clone();
        let two = tokio::spawn(async move { s.admit("m", 0, b"k", "2").await.ok() });
        tokio::time::sleep(Duration::from_millis(30)).await;
        // A rebalance that did not move the partition: the next access
        // reloads it, and must not read the log before job 2's write.
        WorkerStats::bump(&stats.rebalances);
        let s = strict.clone();
        let three = tokio::spawn(async move { s.admit("m", 0, b"k", "3").await.ok() });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(
            !three.is_finished(),
            "the reload waits for the pending write"
        );
        store.gate.add_permits(10);
        let follows = |appended| {
            Some(Admit::Follow {
                head: "1".into(),
                head_due_ms: None,
                appended,
            })
        };
        assert_eq!(two.await.ok().flatten(), follows(true));
        assert_eq!(three.await.ok().flatten(), follows(true));
        assert_eq!(
            strict.admit("m", 0, b"k", "2").await.ok(),
            follows(false),
            "job 2 is still in the chain after the reload"
        );
    }

    #[test]
    fn a_head_is_overdue_only_beyond_the_longest_tier() {
        let tiers = [Duration::from_secs(5), Duration::from_secs(30)];
        assert_eq!(overdue(&tiers, 100_000, None), None);
        assert_eq!(overdue(&tiers, 100_000, Some(90_000)), None);
        assert_eq!(overdue(&tiers, 100_000, Some(70_000)), None);
        assert_eq!(overdue(&tiers, 100_000, Some(60_000)), Some(40_000));
        assert_eq!(overdue(&[], 100_000, Some(0)), None);
    }

    #[test]
    fn only_range_assignment_is_accepted() {
        let topics = vec!["ledger".to_string()];
        let plain = KafkaConfig::new("127.0.0.1:9092", "http://127.0.0.1:8081");
        assert!(check_assignment(&plain, crate::worker::GroupProtocol::Classic, &topics).is_ok());
        let range = plain
            .clone()
            .set("partition.assignment.strategy", "range,roundrobin");
        assert!(check_assignment(&range, crate::worker::GroupProtocol::Classic, &topics).is_ok());
        let sticky = plain
            .clone()
            .set("partition.assignment.strategy", "cooperative-sticky");
        let err = check_assignment(&sticky, crate::worker::GroupProtocol::Classic, &topics)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("range") && err.contains("ledger.order"),
            "{err}"
        );
        let uniform = plain.set("group.remote.assignor", "uniform");
        assert!(
            check_assignment(&uniform, crate::worker::GroupProtocol::Consumer, &topics).is_err()
        );
    }
}
