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
mod gate;
mod store;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error};

use crate::config::KafkaConfig;
use crate::error::{Error, Result};
use crate::headers::{JobHeaders, FOLLOWS};
pub(crate) use crate::topics::order_topic;
use crate::worker::state::{RouteEntry, TopicRole, WorkerStats};
pub(crate) use chains::Admit;
use chains::Chains;
pub(crate) use gate::Gate;
use gate::Waiting;
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
    /// Heads admitted to run here and not finished or retrying yet: a
    /// follower waits in memory behind one of them, and a second copy of
    /// one waits for the first instead of running beside it.
    running: HashSet<String>,
    /// When the partition's finished ids were last expired (epoch ms).
    swept_ms: i64,
}

/// How often a partition's remembered finished ids are expired, and keys
/// with nothing left tombstoned.
const SWEEP_MS: i64 = 60_000;

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
    /// Each state partition, and its followers waiting in memory.
    #[allow(clippy::type_complexity)]
    parts: Mutex<HashMap<(String, i32), (Arc<tokio::sync::Mutex<Part>>, Arc<Waiting>)>>,
}

/// What [`Strict::admit`] found, beyond the rule itself.
pub(crate) struct Admitted {
    pub(crate) admit: Admit,
    /// The job waited for runs in this worker now, or waits here in memory
    /// and runs the moment its turn comes: either way it finishes soon.
    pub(crate) head_running: bool,
    /// The topic the head's record waits in, if known.
    pub(crate) head_topic: Option<String>,
}

/// What a post-attempt state change must do.
enum Change {
    /// Forwarded to a tier (this topic), due then.
    Retrying(Option<i64>, String),
    /// Handled or dead-lettered; copies of it are recognised for this long
    /// (ms).
    Finished(i64),
}

/// How long copies of a finished job of a route with `tiers` are
/// recognised: a parked copy comes back within the longest tier delay, a
/// re-delivery after a crash within a restart; twice the longest tier, and
/// at least ten minutes.
pub(crate) fn keep_ms(tiers: &[Duration]) -> i64 {
    let longest = tiers.iter().max().map_or(0, |t| t.as_millis() as i64);
    (2 * longest).max(600_000)
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
        self.slot(main, partition).0
    }

    /// A partition's followers waiting in memory.
    pub(crate) fn waiting(&self, main: &str, partition: i32) -> Arc<Waiting> {
        self.slot(main, partition).1
    }

    fn slot(&self, main: &str, partition: i32) -> (Arc<tokio::sync::Mutex<Part>>, Arc<Waiting>) {
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
                    part.running.clear();
                    // The first change after a load expires what it read.
                    part.swept_ms = 0;
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
    /// chain is persisted before this returns. A second copy of a head
    /// that runs here already is told to follow it.
    pub(crate) async fn admit(
        &self,
        main: &str,
        partition: i32,
        key: &[u8],
        id: &str,
    ) -> std::result::Result<Admitted, Cancelled> {
        let (admitted, write) = {
            let mut part = self.locked(main, partition).await?;
            let part = &mut *part;
            let mut admit = part.chains.admit(key, id, crate::clock::now_ms());
            let (mut head_running, mut head_topic) = (false, None);
            match &admit {
                Admit::Run if part.running.contains(id) => {
                    admit = Admit::Follow {
                        head: id.to_string(),
                        head_due_ms: None,
                        appended: false,
                    };
                    head_running = true;
                }
                Admit::Run if part.chains.has_head(key, id) => {
                    part.running.insert(id.to_string());
                }
                Admit::Follow { head, .. } => {
                    head_running =
                        part.running.contains(head) || self.waiting(main, partition).contains(head);
                    head_topic = part.chains.head_topic(key).map(str::to_string);
                }
                Admit::Run | Admit::Duplicate => {}
            }
            let write = match &admit {
                Admit::Follow { appended: true, .. } => {
                    Some(self.write(part, main, partition, key))
                }
                _ => None,
            };
            (
                Admitted {
                    admit,
                    head_running,
                    head_topic,
                },
                write,
            )
        };
        if let Some(write) = write {
            self.persist(main, partition, key, write).await?;
        }
        Ok(admitted)
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
            let now_ms = crate::clock::now_ms();
            let ran = part.running.remove(id);
            let finished = matches!(change, Change::Finished(_));
            let changed = match change {
                Change::Retrying(due, topic) => {
                    let changed = part.chains.retrying(key, id, due);
                    part.chains.head_in(key, id, &topic);
                    changed
                }
                Change::Finished(keep_ms) => part.chains.finished(key, id, now_ms, keep_ms),
            };
            if now_ms - part.swept_ms >= SWEEP_MS {
                part.swept_ms = now_ms;
                self.sweep(&mut part, main, partition, now_ms);
            }
            // A head going to a tier wakes its followers only once its
            // record is there ([`Strict::wake`]): a follower parked before
            // it would sit ahead of it in the tier, on its lane.
            (
                (changed || ran) && finished,
                changed.then(|| self.write(&part, main, partition, key)),
            )
        };
        let (wake, write) = write;
        if let Some(w) = write {
            self.persist(main, partition, key, w).await?;
        }
        if wake {
            // Waiting followers look again, once the change is in the log.
            self.waiting(main, partition).changed.notify_waiters();
        }
        Ok(())
    }

    /// Forgets the partition's finished ids whose time is up and
    /// tombstones the keys left with nothing (best effort: a lost
    /// tombstone is written again by the next sweep after a reload).
    fn sweep(&self, part: &mut Part, main: &str, partition: i32, now_ms: i64) {
        let gone = part.chains.expire(now_ms);
        if gone.is_empty() {
            return;
        }
        debug!(topic = %order_topic(main), partition, keys = gone.len(), "strict order: forgetting finished jobs");
        let writes: Vec<_> = gone
            .iter()
            .map(|key| self.write(part, main, partition, key))
            .collect();
        tokio::spawn(async move {
            for w in writes {
                if let Err(e) = w.await {
                    debug!(error = %e, "strict-order tombstone not written; the next sweep retries");
                }
            }
        });
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
        topic: &str,
    ) -> std::result::Result<(), Cancelled> {
        let change = Change::Retrying(due_ms, topic.to_string());
        self.change(main, partition, key, id, change).await
    }

    /// Wakes the followers waiting in memory on `partition` of `main`: a
    /// head's retry record is in its tier now.
    pub(crate) fn wake(&self, main: &str, partition: i32) {
        self.waiting(main, partition).changed.notify_waiters();
    }

    /// `id`, a follower, was parked in a tier and comes back at `due_ms`
    /// (kept in memory: see [`Chains::parked`]).
    pub(crate) async fn parked(
        &self,
        main: &str,
        partition: i32,
        key: &[u8],
        id: &str,
        topic: &str,
        due_ms: i64,
    ) -> std::result::Result<(), Cancelled> {
        let mut part = self.locked(main, partition).await?;
        part.chains.parked(key, id, topic, due_ms);
        Ok(())
    }

    /// `id` was handled or dead-lettered: it leaves its key's chain,
    /// persisted before the offset is released, and copies of it are
    /// skipped for `keep_ms` ([`keep_ms`]).
    pub(crate) async fn finished(
        &self,
        main: &str,
        partition: i32,
        key: &[u8],
        id: &str,
        keep_ms: i64,
    ) -> std::result::Result<(), Cancelled> {
        self.change(main, partition, key, id, Change::Finished(keep_ms))
            .await
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
        assert!(strict
            .retrying("m", 0, b"k", "1", None, "m.retry.5s")
            .await
            .is_ok());
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
        let admit = |a: Option<Admitted>| a.map(|a| a.admit);
        assert_eq!(admit(two.await.ok().flatten()), follows(true));
        assert_eq!(admit(three.await.ok().flatten()), follows(true));
        assert_eq!(
            admit(strict.admit("m", 0, b"k", "2").await.ok()),
            follows(false),
            "job 2 is still in the chain after the reload"
        );
    }

    #[test]
    fn copies_of_finished_jobs_are_kept_in_mind_for_twice_the_longest_tier() {
        let s = Duration::from_secs;
        assert_eq!(keep_ms(&[s(1), s(8)]), 600_000, "at least ten minutes");
        assert_eq!(keep_ms(&[s(60), s(3_600)]), 7_200_000);
        assert_eq!(keep_ms(&[]), 600_000);
    }

    #[tokio::test]
    async fn a_second_copy_of_a_running_head_follows_it_and_is_then_a_duplicate() {
        let strict = Strict::new(
            ["m".to_string()].into_iter().collect(),
            Arc::new(MemoryStore::default()),
            Arc::new(WorkerStats::default()),
            CancellationToken::new(),
        );
        assert!(strict
            .retrying("m", 0, b"k", "1", None, "m.retry.5s")
            .await
            .is_ok());
        let first = strict.admit("m", 0, b"k", "1").await.ok().map(|a| a.admit);
        assert_eq!(first, Some(Admit::Run));
        let second = strict.admit("m", 0, b"k", "1").await.ok();
        assert!(
            second
                .as_ref()
                .is_some_and(|a| a.head_running
                    && matches!(&a.admit, Admit::Follow { head, .. } if head == "1")),
            "the copy waits for the running one"
        );
        let follower = strict.admit("m", 0, b"k", "2").await.ok();
        assert!(
            follower.is_some_and(|a| a.head_running),
            "its head runs here"
        );
        assert!(strict.finished("m", 0, b"k", "1", 60_000).await.is_ok());
        let again = strict.admit("m", 0, b"k", "1").await.ok().map(|a| a.admit);
        assert_eq!(
            again,
            Some(Admit::Duplicate),
            "finished: the copy is skipped"
        );
        let next = strict.admit("m", 0, b"k", "2").await.ok().map(|a| a.admit);
        assert_eq!(next, Some(Admit::Run));
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
