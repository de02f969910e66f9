//! Each worker's heartbeat on its group's control topic: what it runs,
//! how busy it is, its tenants and handler durations, every
//! [`BEAT_EVERY`]; a clean stop writes a tombstone.

use super::control_topic;
use crate::error::Error;
use serde::Deserialize;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::PoisonError;
use std::sync::RwLock;
use std::time::Duration;
use tracing::warn;

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
    pub(super) counts: HashMap<u16, u64>,
}

impl DurationBuckets {
    pub(super) fn index(seconds: f64) -> u16 {
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
    let started_ms = crate::clock::now_ms();
    let (host, pid) = (crate::config::hostname(), std::process::id());
    let mut last: Option<(i64, u64)> = None;
    let mut warned = false;
    loop {
        let now = crate::clock::now_ms();
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
