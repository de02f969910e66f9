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

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::pipeline::{Forwarded, Outcome, Pipeline};
use super::state::{RouteEntry, WorkerStats};
use crate::config::KafkaConfig;
use crate::error::{Error, Result};
use crate::headers::{JobHeaders, FOLLOWS};
pub(crate) use crate::topics::order_topic;

/// What a state record's value holds (JSON).
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    /// The chain, head first.
    ids: Vec<String>,
    /// When the head is due in its retry tier (epoch ms), if it waits in
    /// one: parked records are sent to a tier that brings them back about
    /// then, not every first-tier delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    head_due_ms: Option<i64>,
}

/// One key's chain.
#[derive(Debug, Default)]
struct Chain {
    /// Job ids, head first.
    ids: VecDeque<String>,
    /// When the head is due in its tier (set when it is forwarded there,
    /// cleared when another job becomes head).
    head_due_ms: Option<i64>,
}

/// The chains of one state partition: key to job ids, head first. Pure
/// data, unit tested without a broker.
#[derive(Debug, Default)]
pub(crate) struct Chains {
    by_key: HashMap<Vec<u8>, Chain>,
}

/// Whether a record may run now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Its key has no chain, or it is the chain's head.
    Run,
    /// It waits behind `head`; `appended` when its id was added now (the
    /// state must be written before it is parked).
    Follow {
        /// The id of the job in the retry path.
        head: String,
        /// When that job is due in its tier, if known.
        head_due_ms: Option<i64>,
        /// Whether the chain changed.
        appended: bool,
    },
}

impl Chains {
    /// Decides for the record `id` of `key`, appending it when it has to
    /// wait.
    pub(crate) fn admit(&mut self, key: &[u8], id: &str) -> Admit {
        let Some(chain) = self.by_key.get_mut(key) else {
            return Admit::Run;
        };
        match chain.ids.front() {
            None => Admit::Run,
            Some(head) if head == id => Admit::Run,
            Some(head) => {
                let head = head.clone();
                let appended = !chain.ids.iter().any(|x| x == id);
                if appended {
                    chain.ids.push_back(id.to_string());
                }
                Admit::Follow {
                    head,
                    head_due_ms: chain.head_due_ms,
                    appended,
                }
            }
        }
    }

    /// `id` of `key` failed and goes to a retry tier, due at `due_ms`: it
    /// starts the chain (or stays in it). Returns whether the chain
    /// changed.
    pub(crate) fn retrying(&mut self, key: &[u8], id: &str, due_ms: Option<i64>) -> bool {
        let chain = self.by_key.entry(key.to_vec()).or_default();
        let mut changed = false;
        if !chain.ids.iter().any(|x| x == id) {
            chain.ids.push_back(id.to_string());
            changed = true;
        }
        if chain.ids.front().is_some_and(|h| h == id) && chain.head_due_ms != due_ms {
            chain.head_due_ms = due_ms;
            changed = true;
        }
        changed
    }

    /// `id` of `key` finished (handled or dead-lettered): it leaves the
    /// chain. Returns whether the chain changed.
    pub(crate) fn finished(&mut self, key: &[u8], id: &str) -> bool {
        let Some(chain) = self.by_key.get_mut(key) else {
            return false;
        };
        let was_head = chain.ids.front().is_some_and(|h| h == id);
        let before = chain.ids.len();
        chain.ids.retain(|x| x != id);
        let changed = chain.ids.len() != before;
        if was_head {
            // The next head has not failed (yet): it is not waiting anywhere.
            chain.head_due_ms = None;
        }
        if chain.ids.is_empty() {
            self.by_key.remove(key);
        }
        changed
    }

    /// The chain of `key`, head first (empty when there is none).
    #[cfg(test)]
    fn chain(&self, key: &[u8]) -> Vec<String> {
        self.by_key
            .get(key)
            .map(|c| c.ids.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The state record's value for `key`: `None` (a tombstone) when its
    /// chain is empty.
    pub(crate) fn encode(&self, key: &[u8]) -> Option<Vec<u8>> {
        let chain = self.by_key.get(key).filter(|c| !c.ids.is_empty())?;
        serde_json::to_vec(&Stored {
            ids: chain.ids.iter().cloned().collect(),
            head_due_ms: chain.head_due_ms,
        })
        .ok()
    }

    /// Applies one state record read back from `<main>.order`. A value that
    /// is not a chain is logged and treated as an empty chain: the key's
    /// parked records then run as newcomers (out of order, never lost).
    pub(crate) fn apply(&mut self, topic: &str, key: &[u8], value: Option<&[u8]>) {
        let parsed = match value {
            None => None,
            Some(v) => match serde_json::from_slice::<Stored>(v) {
                Ok(s) => Some(s),
                Err(e) => {
                    warn!(
                        topic, key = %String::from_utf8_lossy(key), error = %e,
                        "unreadable strict-order state record; treating the key's chain as empty \
                         (its waiting jobs run as they come due, without strict order). Fix: \
                         only kjob workers may write to this topic"
                    );
                    None
                }
            },
        };
        match parsed {
            Some(s) if !s.ids.is_empty() => {
                self.by_key.insert(
                    key.to_vec(),
                    Chain {
                        ids: s.ids.into_iter().collect(),
                        head_due_ms: s.head_due_ms,
                    },
                );
            }
            _ => {
                self.by_key.remove(key);
            }
        }
    }

    /// Keys with a chain.
    fn len(&self) -> usize {
        self.by_key.len()
    }
}

/// The retry tier a waiting record is parked in: the longest one that
/// brings it back no later than its head is due (`head_due_ms`), so a
/// record behind a job waiting 30 minutes is not re-parked every few
/// seconds; the first tier when the head's due time is unknown or near.
/// A parked record is thus back at most one first-tier delay after the
/// head could have finished.
pub(crate) fn park_tier(tiers: &[Duration], now_ms: i64, head_due_ms: Option<i64>) -> usize {
    let Some(due) = head_due_ms else {
        return 0;
    };
    let left = due - now_ms;
    tiers
        .iter()
        .enumerate()
        .filter(|(_, t)| (t.as_millis() as i64) <= left)
        .max_by_key(|(_, t)| **t)
        .map_or(0, |(i, _)| i)
}

/// Where chains are persisted: `<main>.order` on Kafka for the worker,
/// memory for the test harness.
pub(crate) trait OrderStore: Send + Sync {
    /// Enqueues the record *now* (so callers holding a lock decide the log
    /// order) and resolves once it is acknowledged. `None` is a tombstone.
    fn write(
        &self,
        topic: &str,
        partition: i32,
        key: &[u8],
        value: Option<Vec<u8>>,
    ) -> BoxFuture<'static, Result<()>>;

    /// Every record of `topic`'s `partition` up to its current end, in log
    /// order.
    #[allow(clippy::type_complexity)]
    fn load(
        &self,
        topic: &str,
        partition: i32,
    ) -> BoxFuture<'static, Result<Vec<(Vec<u8>, Option<Vec<u8>>)>>>;
}

/// The Kafka store: the worker's idempotent producer (acks=all) and a
/// plain assigned consumer for loading.
pub(crate) struct KafkaStore {
    pub producer: FutureProducer,
    pub config: KafkaConfig,
}

impl OrderStore for KafkaStore {
    fn write(
        &self,
        topic: &str,
        partition: i32,
        key: &[u8],
        value: Option<Vec<u8>>,
    ) -> BoxFuture<'static, Result<()>> {
        let mut record: FutureRecord<'_, [u8], Vec<u8>> =
            FutureRecord::to(topic).partition(partition).key(key);
        if let Some(v) = &value {
            record = record.payload(v);
        }
        let topic = topic.to_string();
        match self.producer.send_result(record) {
            Ok(delivery) => Box::pin(async move {
                match delivery.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => Err(Error::kafka(format!("writing {topic}"), e)),
                    Err(_) => Err(Error::Worker(format!(
                        "writing {topic}: the producer was dropped before acknowledging"
                    ))),
                }
            }),
            Err((e, _)) => {
                let e = Error::kafka(format!("enqueueing to {topic}"), e);
                Box::pin(async move { Err(e) })
            }
        }
    }

    fn load(
        &self,
        topic: &str,
        partition: i32,
    ) -> BoxFuture<'static, Result<Vec<(Vec<u8>, Option<Vec<u8>>)>>> {
        let (config, topic) = (self.config.clone(), topic.to_string());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || read_partition(&config, &topic, partition))
                .await
                .map_err(|e| Error::Worker(format!("state loading task failed: {e}")))?
        })
    }
}

/// Reads one partition from its start to the end offset taken first.
/// Blocking.
#[allow(clippy::type_complexity)]
fn read_partition(
    config: &KafkaConfig,
    topic: &str,
    partition: i32,
) -> Result<Vec<(Vec<u8>, Option<Vec<u8>>)>> {
    let consumer: BaseConsumer = config
        .client_config(&[
            ("group.id", "kjob-order-reader"),
            ("enable.auto.commit", "false"),
            ("enable.partition.eof", "false"),
        ])
        .create()
        .map_err(|e| Error::kafka("creating the order-state reader", e))?;
    let timeout = Duration::from_secs(10);
    let (low, high) = consumer
        .fetch_watermarks(topic, partition, timeout)
        .map_err(|e| Error::kafka(format!("watermarks of {topic}:{partition}"), e))?;
    let mut out = Vec::new();
    if high <= low {
        return Ok(out);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(low))
        .map_err(|e| Error::kafka("building assignment", e))?;
    consumer
        .assign(&tpl)
        .map_err(|e| Error::kafka(format!("assigning {topic}:{partition}"), e))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if std::time::Instant::now() > deadline {
            return Err(Error::Worker(format!(
                "reading {topic}:{partition} timed out after 60 s"
            )));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                if m.offset() < high {
                    if let Some(k) = m.key() {
                        out.push((k.to_vec(), m.payload().map(<[u8]>::to_vec)));
                    }
                }
                if m.offset() + 1 >= high {
                    return Ok(out);
                }
            }
            Some(Err(e)) => return Err(Error::kafka(format!("reading {topic}:{partition}"), e)),
            // Compaction can leave gaps: done once the position passed the end.
            None => {
                let at = consumer.position().ok().and_then(|p| {
                    p.find_partition(topic, partition)
                        .and_then(|e| e.offset().to_raw())
                });
                if at.is_some_and(|o| o >= high) {
                    return Ok(out);
                }
            }
        }
    }
}

/// The harness's store: a log per (topic, partition) in memory.
#[derive(Default)]
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) struct MemoryStore {
    #[allow(clippy::type_complexity)]
    logs: Mutex<HashMap<(String, i32), Vec<(Vec<u8>, Option<Vec<u8>>)>>>,
}

impl OrderStore for MemoryStore {
    fn write(
        &self,
        topic: &str,
        partition: i32,
        key: &[u8],
        value: Option<Vec<u8>>,
    ) -> BoxFuture<'static, Result<()>> {
        self.logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((topic.to_string(), partition))
            .or_default()
            .push((key.to_vec(), value));
        Box::pin(async { Ok(()) })
    }

    fn load(
        &self,
        topic: &str,
        partition: i32,
    ) -> BoxFuture<'static, Result<Vec<(Vec<u8>, Option<Vec<u8>>)>>> {
        let records = self
            .logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(topic.to_string(), partition))
            .cloned()
            .unwrap_or_default();
        Box::pin(async move { Ok(records) })
    }
}

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
        entry.delay.is_none() && self.mains.contains(&entry.main)
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

impl Pipeline {
    /// Parks `msg` (not run) in a retry tier of its route ([`park_tier`]),
    /// on the same partition, its attempt unchanged, with `kjob-follows`
    /// naming the job it waits for. `None` when the route has no tier to
    /// park in (its policy lost them while a chain was open): the record
    /// then runs, out of strict order, rather than wait forever.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn park(
        &self,
        entry: &RouteEntry,
        msg: &OwnedMessage,
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
        let topic = crate::retry::tier_topic(&entry.main, tier);
        let mut next = headers.clone();
        next.id = Some(id.to_string());
        next.due_at_ms = Some(now_ms + tier.as_millis() as i64);
        next.group = Some(self.group.clone());
        if next.original_topic.is_none() {
            next.original_topic = Some(msg.topic().to_string());
            next.original_partition = Some(msg.partition());
            next.original_offset = Some(msg.offset());
            next.original_timestamp_ms = msg.timestamp().to_millis();
        }
        set_follows(&mut next, Some(head));
        debug!(job.id = id, follows = head, at = %format_args!("{}:{}:{}", msg.topic(), msg.partition(), msg.offset()), next = %topic, "strict order: waiting behind the key's job in the retry path");
        match self
            .forward(&topic, &entry.main, msg, &next, Some(msg.partition()))
            .await
        {
            Forwarded::Sent => {
                WorkerStats::bump(&self.stats.held);
                Some(Outcome::Held)
            }
            Forwarded::Enveloped => {
                WorkerStats::bump(&self.stats.dead_lettered);
                Some(Outcome::DeadLettered)
            }
            Forwarded::Cancelled => Some(Outcome::Abandoned),
        }
    }
}

impl Pipeline {
    /// The strict-order state and the record's key, when `msg` is under
    /// strict order (a keyed record of a strict route's main topic or
    /// tier).
    pub(crate) fn strict_key<'m>(
        &self,
        entry: &RouteEntry,
        msg: &'m OwnedMessage,
    ) -> Option<Gate<'_, 'm>> {
        let strict = self.strict.as_deref()?;
        let key = msg.key()?;
        strict.covers(entry).then_some(Gate {
            strict,
            key,
            partition: msg.partition(),
        })
    }
}

/// A record under strict order: the state, its key and its partition.
#[derive(Clone, Copy)]
pub(crate) struct Gate<'s, 'm> {
    strict: &'s Strict,
    key: &'m [u8],
    partition: i32,
}

impl Gate<'_, '_> {
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
    protocol: super::GroupProtocol,
    topics: &[String],
) -> Result<()> {
    let Some(first) = topics.first() else {
        return Ok(());
    };
    let (name, value) = match protocol {
        super::GroupProtocol::Classic => (
            "partition.assignment.strategy",
            config.overrides.get("partition.assignment.strategy"),
        ),
        super::GroupProtocol::Consumer => (
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

    #[test]
    fn a_free_key_runs_and_a_failure_starts_its_chain() {
        let mut c = Chains::default();
        assert_eq!(c.admit(b"k", "1"), Admit::Run);
        assert!(c.retrying(b"k", "1", None));
        assert!(
            !c.retrying(b"k", "1", None),
            "a second failure keeps it head"
        );
        assert_eq!(c.chain(b"k"), vec!["1"]);
        assert_eq!(c.admit(b"k", "1"), Admit::Run, "the head runs");
        assert_eq!(c.admit(b"other", "9"), Admit::Run, "other keys flow");
    }

    #[test]
    fn later_jobs_follow_in_arrival_order_and_run_after_the_head() {
        let mut c = Chains::default();
        c.retrying(b"k", "1", None);
        for id in ["2", "3", "4"] {
            assert_eq!(
                c.admit(b"k", id),
                Admit::Follow {
                    head: "1".into(),
                    head_due_ms: None,
                    appended: true
                }
            );
        }
        // A re-delivery (or a parked copy coming due) is not appended again.
        assert_eq!(
            c.admit(b"k", "3"),
            Admit::Follow {
                head: "1".into(),
                head_due_ms: None,
                appended: false
            }
        );
        assert_eq!(c.chain(b"k"), vec!["1", "2", "3", "4"]);
        assert!(c.finished(b"k", "1"));
        assert_eq!(
            c.admit(b"k", "3"),
            Admit::Follow {
                head: "2".into(),
                head_due_ms: None,
                appended: false
            }
        );
        assert_eq!(c.admit(b"k", "2"), Admit::Run);
        assert!(c.finished(b"k", "2"));
        assert!(c.finished(b"k", "3"));
        assert!(c.finished(b"k", "4"));
        assert_eq!(c.len(), 0, "an empty chain is dropped");
        assert!(c.encode(b"k").is_none(), "and written as a tombstone");
        assert!(!c.finished(b"k", "4"), "finishing twice changes nothing");
    }

    #[test]
    fn a_follower_that_fails_keeps_its_place_as_head() {
        let mut c = Chains::default();
        c.retrying(b"k", "1", None);
        c.admit(b"k", "2");
        c.admit(b"k", "3");
        c.finished(b"k", "1");
        assert_eq!(c.admit(b"k", "2"), Admit::Run);
        assert!(
            !c.retrying(b"k", "2", None),
            "already in the chain, at its head"
        );
        assert_eq!(c.chain(b"k"), vec!["2", "3"]);
    }

    #[test]
    fn a_dead_lettered_head_pops_and_unblocks_the_key() {
        let mut c = Chains::default();
        c.retrying(b"k", "bad", None);
        c.admit(b"k", "2");
        assert!(c.finished(b"k", "bad"));
        assert_eq!(c.admit(b"k", "2"), Admit::Run);
    }

    #[test]
    fn an_unknown_record_joins_the_back_of_a_busy_key() {
        // A stale copy of a finished job (or a pre-strict retry) while the
        // key has a chain: it waits its turn rather than being dropped.
        let mut c = Chains::default();
        c.retrying(b"k", "5", None);
        assert_eq!(
            c.admit(b"k", "1"),
            Admit::Follow {
                head: "5".into(),
                head_due_ms: None,
                appended: true
            }
        );
    }

    #[test]
    fn state_round_trips_and_garbage_reads_as_empty() {
        let mut c = Chains::default();
        c.retrying(b"k", "1", None);
        c.admit(b"k", "2");
        let value = c.encode(b"k");
        let mut loaded = Chains::default();
        loaded.apply("t.order", b"k", value.as_deref());
        assert_eq!(loaded.chain(b"k"), vec!["1", "2"]);
        loaded.apply("t.order", b"k", Some(b"not json"));
        assert_eq!(loaded.chain(b"k"), Vec::<String>::new());
        loaded.apply("t.order", b"j", value.as_deref());
        loaded.apply("t.order", b"j", None);
        assert_eq!(loaded.len(), 0, "a tombstone clears the key");
        loaded.apply("t.order", b"j", Some(br#"{"ids":[]}"#));
        assert_eq!(loaded.len(), 0);
    }

    #[test]
    fn the_heads_due_time_is_kept_for_its_followers_and_cleared_when_it_leaves() {
        let mut c = Chains::default();
        assert!(c.retrying(b"k", "1", Some(60_000)));
        assert!(!c.retrying(b"k", "1", Some(60_000)), "nothing new");
        assert!(
            c.retrying(b"k", "1", Some(90_000)),
            "failed again: due later"
        );
        assert_eq!(
            c.admit(b"k", "2"),
            Admit::Follow {
                head: "1".into(),
                head_due_ms: Some(90_000),
                appended: true
            }
        );
        // A follower's own failure never sets the head's due time.
        assert!(!c.retrying(b"k", "2", Some(5)));
        let mut loaded = Chains::default();
        loaded.apply("t.order", b"k", c.encode(b"k").as_deref());
        assert_eq!(
            loaded.admit(b"k", "2"),
            Admit::Follow {
                head: "1".into(),
                head_due_ms: Some(90_000),
                appended: false
            },
            "the due time survives a reload"
        );
        assert!(c.finished(b"k", "1"));
        assert!(
            c.retrying(b"k", "2", Some(7)),
            "the new head waits in a tier"
        );
        c.admit(b"k", "3");
        c.finished(b"k", "2");
        assert_eq!(
            c.admit(b"k", "4"),
            Admit::Follow {
                head: "3".into(),
                head_due_ms: None,
                appended: true
            },
            "a head that has not failed is due nowhere"
        );
    }

    #[test]
    fn a_parked_job_comes_back_no_later_than_its_head_is_due() {
        let s = Duration::from_secs;
        let tiers = [s(5), s(30), s(300), s(1800)];
        assert_eq!(park_tier(&tiers, 0, None), 0, "unknown: the first tier");
        assert_eq!(park_tier(&tiers, 0, Some(4_000)), 0, "near: the first tier");
        assert_eq!(park_tier(&tiers, 0, Some(-1)), 0, "overdue: the first tier");
        assert_eq!(park_tier(&tiers, 0, Some(30_000)), 1);
        assert_eq!(park_tier(&tiers, 0, Some(299_999)), 1);
        assert_eq!(park_tier(&tiers, 0, Some(1_980_000)), 3);
        assert_eq!(park_tier(&[], 0, Some(1_000_000)), 0);
        // Unsorted tiers: still the longest that fits.
        assert_eq!(park_tier(&[s(60), s(5), s(30)], 0, Some(45_000)), 2);
    }

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
    fn only_range_assignment_is_accepted() {
        let topics = vec!["ledger".to_string()];
        let plain = KafkaConfig::new("127.0.0.1:9092", "http://127.0.0.1:8081");
        assert!(check_assignment(&plain, super::super::GroupProtocol::Classic, &topics).is_ok());
        let range = plain
            .clone()
            .set("partition.assignment.strategy", "range,roundrobin");
        assert!(check_assignment(&range, super::super::GroupProtocol::Classic, &topics).is_ok());
        let sticky = plain
            .clone()
            .set("partition.assignment.strategy", "cooperative-sticky");
        let err = check_assignment(&sticky, super::super::GroupProtocol::Classic, &topics)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("range") && err.contains("ledger.order"),
            "{err}"
        );
        let uniform = plain.set("group.remote.assignor", "uniform");
        assert!(
            check_assignment(&uniform, super::super::GroupProtocol::Consumer, &topics).is_err()
        );
    }
}
