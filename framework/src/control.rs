//! Group-wide controls: a route paused for every worker of a group.
//!
//! Operators write to the group's compacted control topic,
//! `<group>.control` (one partition, created by the first action): the
//! latest [`RouteControl`] of a route under `route:<topic>`, and one
//! [`ControlAudit`] per action under `route:<topic>:audit:<ms>` (its own
//! key, so compaction keeps every one). Topic names hold no `:`, so the
//! keys cannot be confused.
//!
//! The same topic carries operators' cancels of single waiting jobs
//! ([`JobCancel`], under `cancel:<main topic>:<topic>:<partition>:<offset>`
//! of the record the operator saw): a worker that reaches a record of the
//! route's retry tiers or delay topics with that job id and due time
//! finishes it as cancelled, without running it. Matching by id and due
//! time, not by offset, also catches the copies a delayed job leaves as it
//! hops from bucket to bucket.
//!
//! Every worker reads the topic to its end before it subscribes (a worker
//! that starts while a route is paused never fetches it), then tails it on
//! a thread of its own. The poll thread pauses the assigned partitions of a
//! paused route's main topic at the consumer, after every assignment too,
//! and resumes them on resume unless the scheduler holds them for its own
//! reasons. Pausing only stops fetching: jobs already fetched or running
//! finish and are committed as usual. Only the main topic is paused: the
//! route's retry tiers and delay topics keep flowing, so its retries and
//! delayed jobs already waiting still run when due.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::config::KafkaConfig;
use crate::error::{Error, Result};

/// The compacted topic of `group`'s controls.
pub fn control_topic(group: &str) -> String {
    format!("{group}.control")
}

/// The control topic's settings: compacted, with small segments so that
/// the heartbeats (one per worker every five seconds) are compacted away
/// within minutes and a full read stays short.
pub const TOPIC_CONFIG: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("segment.ms", "600000"),
    ("min.cleanable.dirty.ratio", "0.1"),
    ("delete.retention.ms", "600000"),
];

/// The key of a route's [`RouteControl`].
pub fn route_key(topic: &str) -> String {
    format!("route:{topic}")
}

/// The key of one [`ControlAudit`] of a route.
pub fn route_audit_key(topic: &str, at_ms: i64) -> String {
    format!("route:{topic}:audit:{at_ms}")
}

/// Whether a route (its main topic) is paused for the whole group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteControl {
    /// The route's main topic.
    pub topic: String,
    /// While true no worker of the group fetches the main topic.
    pub paused: bool,
    /// Who paused or resumed it last.
    pub by: String,
    /// When (epoch ms).
    pub at_ms: i64,
    /// Why it was paused.
    #[serde(default)]
    pub reason: Option<String>,
}

/// One operator action on the control topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlAudit {
    /// What it is about: `route:<topic>`.
    pub subject: String,
    /// `paused` or `resumed`.
    pub action: String,
    /// Who.
    pub by: String,
    /// When (epoch ms).
    pub at_ms: i64,
    /// Why (a pause needs one).
    #[serde(default)]
    pub reason: Option<String>,
}

/// The key of the [`JobCancel`] of the record at `topic:partition:offset`
/// of route `main`.
pub fn cancel_key(main: &str, topic: &str, partition: i32, offset: i64) -> String {
    format!("cancel:{main}:{topic}:{partition}:{offset}")
}

/// How long past its due time a cancel is kept: a record is normally
/// reached at its due time, but a group that is down or far behind reaches
/// it later. Older cancels are ignored by workers and removed by the next
/// operator action.
pub const CANCEL_KEPT_MS: i64 = 7 * 24 * 3_600_000;

/// An operator's cancel of one job waiting in a route's retry tier or
/// delay topic: the worker that reaches it (or a copy of it a delay hop
/// wrote) finishes it without running it. "Move to now" is a copy on the
/// main topic followed by one of these for the original.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobCancel {
    /// The route's main topic.
    pub topic: String,
    /// The job id (`kjob-id`).
    pub id: String,
    /// Its due time as written (`kjob-run-at`, else `kjob-due-at`): with
    /// the id, what tells this waiting record (and its hop copies) from
    /// another attempt of the same job.
    pub due_ms: i64,
    /// Where the operator saw it: `topic:partition:offset`.
    pub source: String,
    /// `cancelled`, or `moved to now` (a copy runs on the main topic).
    pub action: String,
    /// Who.
    pub by: String,
    /// When (epoch ms).
    pub at_ms: i64,
    /// Why.
    #[serde(default)]
    pub reason: Option<String>,
}

/// The key of a worker's [`WorkerBeat`].
pub fn worker_key(client_id: &str) -> String {
    format!("worker:{client_id}")
}

/// What a worker publishes about itself every [`BEAT_EVERY`] under
/// `worker:<client.id>` (JSON): enough for a "workers" page without
/// scraping each process. A clean stop writes a tombstone; a crashed
/// worker's last beat stays, and readers tell it by its age.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerBeat {
    /// The consumer's default `client.id` (`kjob-<group>-<host>-<pid>`),
    /// which is how the group's member list names it.
    pub client_id: String,
    /// The host name.
    pub host: String,
    /// The process id.
    pub pid: u32,
    /// When the worker started (epoch ms).
    pub started_ms: i64,
    /// When this beat was written (epoch ms).
    pub at_ms: i64,
    /// Resident memory of the process, where the OS tells (Linux).
    #[serde(default)]
    pub rss_bytes: Option<u64>,
    /// Handlers running now.
    pub busy: usize,
    /// Handlers that may run at once (the concurrency limit).
    pub slots: usize,
    /// Jobs handled since the start (all outcomes but retries).
    pub handled: u64,
    /// Handled per second over the last beat interval.
    pub jobs_per_second: f64,
    /// Partitions owned, per topic.
    pub assignment: Vec<(String, Vec<i32>)>,
    /// Handler durations since the previous beat, per main topic, as
    /// sparse [`DurationBuckets`] (mergeable across workers, unlike
    /// quantiles).
    #[serde(default)]
    pub durations: Vec<(String, Vec<(u16, u64)>)>,
    /// The tenants of this worker's fair routes with work now (the busiest
    /// 20 per route, the rest as `other`).
    #[serde(default)]
    pub tenants: Vec<TenantLoad>,
}

/// One tenant's jobs on a fair route of one worker, in its [`WorkerBeat`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantLoad {
    /// The route's main topic.
    pub topic: String,
    /// The tenant (`other` for the rest beyond the busiest).
    pub tenant: String,
    /// Jobs ready and waiting for a slot.
    pub ready: usize,
    /// Jobs running.
    pub running: usize,
}

/// Buckets per doubling of a duration: a quantile read from them is
/// within about 9 % of the true one.
const PER_OCTAVE: f64 = 4.0;
/// Buckets from 1 µs up: 4 × 32 octaves reach past an hour.
const BUCKETS: usize = 128;

/// A histogram of durations on a log scale, to merge and read quantiles
/// from (the dashboard's p50 and p99).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DurationBuckets {
    counts: HashMap<u16, u64>,
}

impl DurationBuckets {
    fn index(seconds: f64) -> u16 {
        let micros = (seconds * 1e6).max(1.0);
        ((micros.log2() * PER_OCTAVE) as usize).min(BUCKETS - 1) as u16
    }

    /// The middle of bucket `i`, in milliseconds.
    fn millis(i: u16) -> f64 {
        2f64.powf((f64::from(i) + 0.5) / PER_OCTAVE) / 1000.0
    }

    /// Adds a sparse list of `(bucket, count)`.
    pub fn merge(&mut self, sparse: &[(u16, u64)]) {
        for (i, n) in sparse {
            *self.counts.entry((*i).min(BUCKETS as u16 - 1)).or_default() += n;
        }
    }

    /// Durations counted.
    pub fn count(&self) -> u64 {
        self.counts.values().sum()
    }

    /// The `q` quantile (0..=1) in milliseconds; `None` when empty.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut keys: Vec<&u16> = self.counts.keys().collect();
        keys.sort();
        let mut seen = 0;
        for k in keys {
            seen += self.counts[k];
            if seen >= rank {
                return Some(Self::millis(*k));
            }
        }
        None
    }
}

/// Per job, the handler durations since the last [`Durations::take`]:
/// one atomic add per finished attempt (a read lock to find the job's
/// buckets, a write lock only the first time a job is seen).
#[derive(Debug, Default)]
pub(crate) struct Durations {
    /// Read once per finished job, keyed by the routes' own names: Fx.
    jobs: RwLock<rustc_hash::FxHashMap<&'static str, Arc<[AtomicU64; BUCKETS]>>>,
}

impl Durations {
    pub(crate) fn record(&self, job: &'static str, seconds: f64) {
        let i = usize::from(DurationBuckets::index(seconds));
        if let Some(b) = self
            .jobs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(job)
        {
            b[i].fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut jobs = self.jobs.write().unwrap_or_else(PoisonError::into_inner);
        let b = jobs
            .entry(job)
            .or_insert_with(|| Arc::new(std::array::from_fn(|_| AtomicU64::new(0))));
        b[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Each job's counts since the last call, sparse, and zeroes them.
    pub(crate) fn take(&self) -> HashMap<&'static str, Vec<(u16, u64)>> {
        let jobs = self.jobs.read().unwrap_or_else(PoisonError::into_inner);
        jobs.iter()
            .map(|(job, b)| {
                let sparse: Vec<(u16, u64)> = b
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| {
                        let n = c.swap(0, Ordering::Relaxed);
                        (n > 0).then_some((i as u16, n))
                    })
                    .collect();
                (*job, sparse)
            })
            .collect()
    }
}

/// How often a worker publishes its [`WorkerBeat`].
pub const BEAT_EVERY: Duration = Duration::from_secs(5);

/// What the control topic holds.
#[derive(Clone, Debug, Default)]
pub struct ControlState {
    /// The latest control per route (main topic).
    pub routes: HashMap<String, RouteControl>,
    /// The latest beat per worker (`client.id`).
    pub workers: HashMap<String, WorkerBeat>,
    /// Every beat read, in order (those compaction has not removed yet):
    /// the handler durations of each interval, for the dashboard's history.
    pub beats: Vec<WorkerBeat>,
    /// Every audited action, oldest first.
    pub audit: Vec<ControlAudit>,
    /// Operators' cancels of waiting jobs, by key ([`cancel_key`]).
    pub cancels: HashMap<String, JobCancel>,
}

impl ControlState {
    /// The main topics paused now.
    pub fn paused(&self) -> HashSet<String> {
        self.routes
            .iter()
            .filter(|(_, c)| c.paused)
            .map(|(topic, _)| topic.clone())
            .collect()
    }

    /// Applies one record (`None`: a tombstone).
    fn apply(&mut self, topic: &str, key: &str, payload: Option<&[u8]>) {
        if let Some(id) = key.strip_prefix("worker:") {
            match payload.map(serde_json::from_slice::<WorkerBeat>) {
                None => {
                    self.workers.remove(id);
                }
                Some(Ok(b)) => {
                    if !b.durations.is_empty() {
                        self.beats.push(b.clone());
                    }
                    self.workers.insert(id.to_string(), b);
                }
                Some(Err(e)) => {
                    warn!(topic = %topic, key = %key, error = %e, "unreadable worker beat; ignored")
                }
            }
            return;
        }
        if key.starts_with("cancel:") {
            match payload.map(serde_json::from_slice::<JobCancel>) {
                None => {
                    self.cancels.remove(key);
                }
                Some(Ok(c)) => {
                    self.cancels.insert(key.to_string(), c);
                }
                Some(Err(e)) => {
                    warn!(topic = %topic, key = %key, error = %e, "unreadable job cancel; ignored")
                }
            }
            return;
        }
        let Some(rest) = key.strip_prefix("route:") else {
            return; // a key of a later version of kjob
        };
        if rest.contains(":audit:") {
            match payload.map(serde_json::from_slice::<ControlAudit>) {
                Some(Ok(a)) => self.audit.push(a),
                Some(Err(e)) => {
                    warn!(topic = %topic, key = %key, error = %e, "unreadable control audit; ignored")
                }
                None => {}
            }
        } else if !rest.contains(':') {
            match payload.map(serde_json::from_slice::<RouteControl>) {
                None => {
                    self.routes.remove(rest);
                }
                Some(Ok(c)) => {
                    self.routes.insert(rest.to_string(), c);
                }
                Some(Err(e)) => {
                    warn!(topic = %topic, key = %key, error = %e, "unreadable route control; ignored")
                }
            }
        }
    }
}

/// Reads `group`'s control topic to its end. Empty when it does not
/// exist. Blocking.
pub fn read_control(config: &KafkaConfig, group: &str) -> Result<ControlState> {
    let topic = control_topic(group);
    let mut out = ControlState::default();
    let Some(records) = crate::topics::read_topic_as(config, &topic, group)? else {
        return Ok(out);
    };
    for m in &records {
        let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) else {
            continue;
        };
        out.apply(&topic, &key, m.payload());
    }
    out.audit.sort_by_key(|a| a.at_ms);
    Ok(out)
}

/// Resident memory of this process, from `/proc/self/status` (Linux).
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// What [`beat`] reads of the worker each time.
pub(crate) struct BeatSource {
    pub(crate) group: String,
    pub(crate) client_id: String,
    pub(crate) slots: usize,
    pub(crate) stats: Arc<crate::worker::WorkerStats>,
    /// Handlers running now (the scheduler's count, under its lock).
    pub(crate) busy: Box<dyn Fn() -> usize + Send + Sync>,
    /// The fair routes' tenants with work now.
    pub(crate) tenants: Box<dyn Fn() -> Vec<TenantLoad> + Send + Sync>,
    /// Handler durations by job, taken at each beat.
    pub(crate) durations: Arc<Durations>,
    /// Each main topic's job.
    pub(crate) jobs: Vec<(String, &'static str)>,
}

/// Creates `group`'s control topic (compacted, one partition) when it is
/// missing: part of the worker's provisioning, before its first poll, as
/// its deployment model lists it. A worker that may not (an ACL) logs it
/// and runs on: no pause reaches it and it beats only once an operator's
/// first action (or an admin) created the topic.
pub(crate) async fn provision(config: &KafkaConfig, group: &str) {
    let topic = control_topic(group);
    if let Err(e) =
        crate::topics::create_topics_with(config, &[(topic.clone(), 1)], TOPIC_CONFIG).await
    {
        warn!(topic = %topic, error = %e, "the control topic could not be created: no operator pause reaches this worker and it publishes no heartbeat until it exists");
    }
}

/// Publishes a [`WorkerBeat`] every [`BEAT_EVERY`] until `stop`, then a
/// tombstone, on the control topic provisioning created; a worker that may
/// not write it (an ACL) logs it once and retries quietly.
pub(crate) async fn beat(
    src: BeatSource,
    producer: crate::producer::Producer,
    stop: tokio_util::sync::CancellationToken,
) {
    let topic = control_topic(&src.group);
    let key = worker_key(&src.client_id);
    let started_ms = crate::dlq::now_ms();
    let (host, pid) = (crate::config::hostname(), std::process::id());
    let mut last: Option<(i64, u64)> = None;
    let mut warned = false;
    loop {
        let now = crate::dlq::now_ms();
        let handled = crate::worker::WorkerStats::get(&src.stats.handled);
        let jobs_per_second = match last {
            Some((at, n)) if now > at => {
                (handled.saturating_sub(n)) as f64 * 1000.0 / (now - at) as f64
            }
            _ => 0.0,
        };
        last = Some((now, handled));
        let mut assignment: Vec<(String, Vec<i32>)> = Vec::new();
        let mut owned = src.stats.assignment();
        owned.sort();
        for (t, p) in owned {
            match assignment.last_mut() {
                Some((last, ps)) if *last == t => ps.push(p),
                _ => assignment.push((t, vec![p])),
            }
        }
        let taken = src.durations.take();
        let durations: Vec<(String, Vec<(u16, u64)>)> = src
            .jobs
            .iter()
            .filter_map(|(topic, job)| {
                let d = taken.get(job)?;
                (!d.is_empty()).then(|| (topic.clone(), d.clone()))
            })
            .collect();
        let b = WorkerBeat {
            client_id: src.client_id.clone(),
            host: host.clone(),
            pid,
            started_ms,
            at_ms: now,
            rss_bytes: rss_bytes(),
            busy: (src.busy)(),
            slots: src.slots,
            handled,
            jobs_per_second,
            assignment,
            durations,
            tenants: (src.tenants)(),
        };
        let sent = match serde_json::to_vec(&b) {
            Ok(body) => producer
                .send_raw(
                    &topic,
                    Some(key.as_bytes()),
                    Some(&body),
                    rdkafka::message::OwnedHeaders::new(),
                )
                .await
                .map(|_| ()),
            Err(e) => Err(Error::Json {
                what: "worker beat",
                source: Arc::new(e),
            }),
        };
        if let Err(e) = sent {
            if !std::mem::replace(&mut warned, true) {
                warn!(topic = %topic, error = %e, "could not publish a worker heartbeat; retrying quietly");
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(BEAT_EVERY) => {}
        }
    }
    // Gone: a clean stop removes the worker from the page at once.
    let _ = producer
        .send_raw(
            &topic,
            Some(key.as_bytes()),
            None,
            rdkafka::message::OwnedHeaders::new(),
        )
        .await;
}

/// The paused main topics as the worker last read them, shared by the
/// tail thread (writer) and the poll thread (reader, which compares
/// `version` to see a change without taking the lock).
#[derive(Debug, Default)]
pub(crate) struct Holds {
    paused: RwLock<HashSet<String>>,
    version: AtomicU64,
    /// Cancelled waiting jobs: `(main topic, job id)` to their due times.
    cancels: RwLock<HashMap<(String, String), Vec<i64>>>,
    /// Whether any cancel is in force: the hot path's one atomic load.
    any_cancel: AtomicBool,
}

impl Holds {
    /// Whether `topic`'s partitions are held paused.
    pub(crate) fn held(&self, topic: &str) -> bool {
        self.paused
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(topic)
    }

    /// Bumped at every change.
    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Whether an operator cancelled the job `id` of route `main` due at
    /// `due_ms` (see [`JobCancel`]).
    pub(crate) fn cancelled(&self, main: &str, id: &str, due_ms: i64) -> bool {
        if !self.any_cancel.load(Ordering::Acquire) {
            return false;
        }
        self.cancels
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(main.to_string(), id.to_string()))
            .is_some_and(|due| due.contains(&due_ms))
    }

    /// Replaces the cancels in force by those of `all` not older than
    /// [`CANCEL_KEPT_MS`] past their due time at `now_ms`.
    fn set_cancels<'a>(&self, all: impl IntoIterator<Item = &'a JobCancel>, now_ms: i64) {
        let mut map: HashMap<(String, String), Vec<i64>> = HashMap::new();
        for c in all {
            if c.due_ms.saturating_add(CANCEL_KEPT_MS) >= now_ms {
                map.entry((c.topic.clone(), c.id.clone()))
                    .or_default()
                    .push(c.due_ms);
            }
        }
        let any = !map.is_empty();
        *self.cancels.write().unwrap_or_else(PoisonError::into_inner) = map;
        self.any_cancel.store(any, Ordering::Release);
    }

    fn set(&self, now: HashSet<String>) {
        let mut paused = self.paused.write().unwrap_or_else(PoisonError::into_inner);
        if *paused != now {
            info!(paused = ?now, "routes paused for the group");
            *paused = now;
            self.version.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The tail thread of one worker: it stops when this is dropped (the
/// worker's run ends, however it ends).
#[derive(Debug)]
pub(crate) struct Following {
    pub(crate) holds: Arc<Holds>,
    stop: Arc<AtomicBool>,
}

impl Drop for Following {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// How long the tail waits for a record before it looks at `stop`.
const TAIL_POLL: Duration = Duration::from_millis(300);

/// Reads the control topic of `group` to its end (so the caller starts
/// with what is in force), then follows it on a thread until the returned
/// [`Following`] is dropped. Blocking. A first read that fails (the topic
/// is not readable by this principal, say) is logged and the worker starts
/// with nothing held: a worker that cannot start is worse than a pause
/// applied late, and the tail keeps trying.
pub(crate) fn follow(config: &KafkaConfig, group: &str, holds: Arc<Holds>) -> Result<Following> {
    match read_control(config, group) {
        Ok(first) => {
            holds.set(first.paused());
            holds.set_cancels(first.cancels.values(), crate::dlq::now_ms());
        }
        Err(e) => {
            warn!(topic = %control_topic(group), error = %e, "could not read the group's controls; starting with no route paused")
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let following = Following {
        holds: holds.clone(),
        stop: stop.clone(),
    };
    let (config, group, h) = (config.clone(), group.to_string(), holds);
    std::thread::Builder::new()
        .name("kjob-control".into())
        .spawn(move || tail(&config, &group, &h, &stop))
        .map_err(|e| Error::PollThread {
            reason: format!("starting the control tail: {e}"),
        })?;
    Ok(following)
}

/// Follows the control topic from its start (it is compacted: small),
/// waiting for it to exist. Errors are logged and retried: the last
/// state read stays in force meanwhile.
fn tail(config: &KafkaConfig, group: &str, holds: &Holds, stop: &AtomicBool) {
    let topic = control_topic(group);
    let mut warned = false;
    while !stop.load(Ordering::Acquire) {
        match crate::topics::partition_counts(config, std::slice::from_ref(&topic)) {
            Ok(c) if c.first().copied().flatten().is_some() => {}
            Ok(_) => {
                std::thread::sleep(Duration::from_secs(2));
                continue;
            }
            Err(e) => {
                // Once: an ACL that refuses it refuses it every time.
                if !std::mem::replace(&mut warned, true) {
                    warn!(topic = %topic, error = %e, "control topic metadata; retrying");
                }
                std::thread::sleep(Duration::from_secs(2));
                continue;
            }
        }
        let consumer: BaseConsumer = match crate::membership::reader(config, group).create() {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "creating the control reader; retrying");
                std::thread::sleep(Duration::from_secs(2));
                continue;
            }
        };
        let mut tpl = TopicPartitionList::new();
        // Manual assignment: no group membership, no commits.
        if tpl
            .add_partition_offset(&topic, 0, Offset::Beginning)
            .and_then(|()| consumer.assign(&tpl))
            .is_err()
        {
            std::thread::sleep(Duration::from_secs(2));
            continue;
        }
        let mut state = ControlState::default();
        while !stop.load(Ordering::Acquire) {
            match consumer.poll(TAIL_POLL) {
                Some(Ok(m)) => {
                    if let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) {
                        let cancel = key.starts_with("cancel:");
                        state.apply(&topic, &key, m.payload());
                        state.audit.clear();
                        state.beats.clear();
                        holds.set(state.paused());
                        if cancel {
                            holds.set_cancels(state.cancels.values(), crate::dlq::now_ms());
                        }
                    }
                }
                Some(Err(e)) => warn!(topic = %topic, error = %e, "reading the control topic"),
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_controls_fold_latest_first_and_audit_in_order() {
        let pause = RouteControl {
            topic: "orders".into(),
            paused: true,
            by: "ops".into(),
            at_ms: 1,
            reason: Some("db".into()),
        };
        let resume = RouteControl {
            paused: false,
            at_ms: 2,
            ..pause.clone()
        };
        let audit = ControlAudit {
            subject: route_key("orders"),
            action: "paused".into(),
            by: "ops".into(),
            at_ms: 1,
            reason: None,
        };
        let mut s = ControlState::default();
        let (p, r, a) = (
            serde_json::to_vec(&pause).unwrap_or_default(),
            serde_json::to_vec(&resume).unwrap_or_default(),
            serde_json::to_vec(&audit).unwrap_or_default(),
        );
        s.apply("t", &route_key("orders"), Some(&p));
        s.apply("t", &route_audit_key("orders", 1), Some(&a));
        assert_eq!(s.paused(), HashSet::from(["orders".to_string()]));
        s.apply("t", &route_key("orders"), Some(&r));
        assert!(s.paused().is_empty());
        s.apply("t", &route_key("orders"), None);
        assert!(s.routes.is_empty());
        s.apply("t", "worker:x", Some(b"{}"));
        s.apply("t", &route_key("broken"), Some(b"nope"));
        assert!(s.routes.is_empty());
        assert_eq!(s.audit, [audit]);
    }

    #[test]
    fn duration_quantiles_are_within_a_tenth_and_merge_across_workers() {
        let d = Durations::default();
        for ms in 1..=100 {
            d.record("j", f64::from(ms) / 1000.0);
        }
        let taken = d.take();
        let mut b = DurationBuckets::default();
        b.merge(&taken["j"]);
        assert_eq!(b.count(), 100);
        let p50 = b.quantile_ms(0.5).unwrap_or_default();
        let p99 = b.quantile_ms(0.99).unwrap_or_default();
        assert!((45.0..=55.0).contains(&p50), "p50 {p50}");
        assert!((90.0..=109.0).contains(&p99), "p99 {p99}");
        // Taken means zeroed.
        assert!(d.take()["j"].is_empty());
        // Another worker's slow jobs move the merged p99.
        let mut other = DurationBuckets::default();
        for _ in 0..10 {
            other.merge(&[(DurationBuckets::index(2.0), 1)]);
        }
        b.merge(
            &other
                .counts
                .iter()
                .map(|(k, v)| (*k, *v))
                .collect::<Vec<_>>(),
        );
        let p99 = b.quantile_ms(0.99).unwrap_or_default();
        assert!((1800.0..=2200.0).contains(&p99), "merged p99 {p99}");
        assert_eq!(DurationBuckets::default().quantile_ms(0.5), None);
    }

    #[test]
    fn a_cancel_matches_its_job_and_due_time_and_expires() {
        let c = JobCancel {
            topic: "orders".into(),
            id: "j1".into(),
            due_ms: 1_000,
            source: "orders.delay.1h:0:7".into(),
            action: "cancelled".into(),
            by: "ops".into(),
            at_ms: 10,
            reason: None,
        };
        let mut s = ControlState::default();
        let key = cancel_key("orders", "orders.delay.1h", 0, 7);
        s.apply("t", &key, Some(&serde_json::to_vec(&c).unwrap_or_default()));
        let h = Holds::default();
        assert!(
            !h.cancelled("orders", "j1", 1_000),
            "nothing before it is read"
        );
        h.set_cancels(s.cancels.values(), 500);
        assert!(h.cancelled("orders", "j1", 1_000));
        // Another attempt of the same job, another job, another route.
        assert!(!h.cancelled("orders", "j1", 2_000));
        assert!(!h.cancelled("orders", "j2", 1_000));
        assert!(!h.cancelled("mails", "j1", 1_000));
        // Long past its due time it is no longer held.
        h.set_cancels(s.cancels.values(), 1_000 + CANCEL_KEPT_MS + 1);
        assert!(!h.cancelled("orders", "j1", 1_000));
        // A tombstone removes it.
        s.apply("t", &key, None);
        assert!(s.cancels.is_empty());
    }

    #[test]
    fn holds_bump_their_version_only_on_a_change() {
        let h = Holds::default();
        let v0 = h.version();
        h.set(HashSet::from(["a".to_string()]));
        assert!(h.held("a") && !h.held("b"));
        let v1 = h.version();
        assert_ne!(v0, v1);
        h.set(HashSet::from(["a".to_string()]));
        assert_eq!(h.version(), v1);
    }
}
