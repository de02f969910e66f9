//! An in-memory harness for unit-testing handlers: no broker, no registry,
//! and a virtual clock, so a 30-minute retry tier takes no time.
//!
//! It runs the *same* code as the worker, not a re-implementation: routes
//! are built by [`WorkerBuilder`] (so handlers, timeouts and retry policies
//! are registered once for both); records go through the worker's scheduler
//! (per-key ordering, the concurrency limit, the in-flight bound and its
//! pause, due-time holds of retry tiers, the commit watermark), and each
//! attempt through the worker's pipeline (Avro decoding with the contract
//! schemas, the handler runner with panics and timeouts,
//! the worker's decision between done, retry tier and DLQ,
//! the same headers, forward-then-finish, and the parking of a strict-order
//! route, [`WorkerBuilder::strict_order`]). Only the transport differs:
//! topics (and a strict route's order state) are in-memory logs, and the
//! clock is virtual.
//!
//! ```
//! # use kjob::{Job, JobContext, JobError, KafkaConfig, Worker};
//! # use kjob::testing::Harness;
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Mail { to: String }
//! # impl Job for Mail { const NAME: &'static str = "mail"; const VERSION: u32 = 1;
//! #   const SCHEMA: &'static str = r#"{"type":"record","name":"Mail","fields":[{"name":"to","type":"string"}]}"#;
//! #   fn key(&self) -> String { self.to.clone() } }
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> kjob::Result<()> {
//! async fn send(job: Mail, ctx: JobContext) -> Result<(), JobError> {
//!     if ctx.attempt == 1 { Err(JobError::server("SMTP 451")) } else { Ok(()) }
//! }
//! let builder = Worker::builder(KafkaConfig::from_env(), "mailer").handle(send);
//! let mut h = Harness::new(builder)?;
//! h.enqueue(&Mail { to: "a@example.com".into() })?;
//! h.run().await;
//! assert_eq!(h.waiting().len(), 1);        // in mail.retry.5s
//! h.run_until_idle().await;                // the clock jumps; no real waiting
//! assert_eq!(h.handled().len(), 1);
//! assert_eq!(h.handled()[0].attempt, 2);
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use apache_avro::Schema;
use futures::future::BoxFuture;
use futures::FutureExt;
use rdkafka::message::{Message, OwnedMessage, Timestamp};
use tokio_util::sync::CancellationToken;

use crate::classify::ErrorClass;
use crate::codec::{
    parse_contract, subject_for_topic, Codec, DecodeError, RegisteredContract, SchemaSource,
    WriterSchema,
};
use crate::error::{Error, Result};
use crate::headers::JobHeaders;
use crate::job::Job;
use crate::producer::{enqueue_headers, new_job_id};
use crate::telemetry::metrics::{Metrics, MetricsExporter};
use crate::worker::intake::record::incoming;
use crate::worker::pipeline::{Outcome, Pipeline, Sink};
use crate::worker::scheduler::{Action, Job as SchedJob, Scheduler};
use crate::worker::state::TopicRole;
use crate::worker::{WorkerBuilder, WorkerStats};

/// An in-memory schema registry: ids per subject and version.
#[derive(Default)]
pub struct MemorySchemas {
    by_id: Mutex<HashMap<u32, Arc<Schema>>>,
    ids: Mutex<HashMap<(String, String), u32>>,
}

impl MemorySchemas {
    /// Registers `raw` under `subject`, returning its id (idempotent).
    pub fn register(&self, subject: &str, raw: &str, schema: Schema) -> u32 {
        let mut ids = self
            .ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let next = ids.len() as u32 + 1;
        let id = *ids
            .entry((subject.to_string(), raw.to_string()))
            .or_insert(next);
        self.by_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id, Arc::new(schema));
        id
    }
}

impl SchemaSource for MemorySchemas {
    fn writer(&self, id: u32) -> BoxFuture<'_, std::result::Result<WriterSchema, DecodeError>> {
        let found = self
            .by_id
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .cloned();
        Box::pin(async move {
            found
                .map(WriterSchema::Owned)
                .ok_or_else(|| DecodeError::UnknownSchema {
                    id,
                    message: "not in the harness's schema store".into(),
                })
        })
    }
}

/// A job the harness saw handled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handled {
    /// Job id.
    pub id: String,
    /// Contract name.
    pub job: String,
    /// The attempt that succeeded.
    pub attempt: u32,
    /// The topic it was handled from (main topic or a tier).
    pub topic: String,
    /// Virtual time it ran at (epoch ms).
    pub at_ms: i64,
}

/// A job waiting in a retry tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// Tier topic.
    pub topic: String,
    /// Job id.
    pub id: String,
    /// The attempt it will run as.
    pub attempt: u32,
    /// When it is due (virtual epoch ms).
    pub due_at_ms: i64,
    /// Class of the failure that sent it there.
    pub class: String,
}

/// A dead letter, as the harness's DLQ holds it.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// DLQ topic.
    pub topic: String,
    /// Job id (empty for records that never had one, e.g. poison bytes).
    pub id: String,
    /// Its error class.
    pub class: String,
    /// Its error message.
    pub error: String,
    /// Attempts made.
    pub attempt: u32,
    /// All kjob headers.
    pub headers: JobHeaders,
}

/// What the scheduler did to the harness's topics, for backpressure and
/// concurrency assertions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    /// Times a topic was paused (in-flight bound or a retry's due time).
    pub pauses: usize,
    /// Times a topic was resumed.
    pub resumes: usize,
    /// Most attempts that ran at once.
    pub max_running: usize,
}

/// The in-memory transport: forwards append to these logs.
struct MemorySink {
    logs: Arc<Mutex<BTreeMap<String, Vec<OwnedMessage>>>>,
    clock: Arc<AtomicI64>,
}

impl Sink for MemorySink {
    fn send<'a>(
        &'a self,
        topic: &'a str,
        _partition: Option<i32>,
        key: Option<&'a [u8]>,
        payload: Option<&'a [u8]>,
        headers: rdkafka::message::OwnedHeaders,
    ) -> BoxFuture<'a, Result<(i32, i64)>> {
        let now = self.clock.load(AtomicOrdering::Relaxed);
        let mut logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        let log = logs.entry(topic.to_string()).or_default();
        let offset = log.len() as i64;
        log.push(OwnedMessage::new(
            payload.map(<[u8]>::to_vec),
            key.map(<[u8]>::to_vec),
            topic.to_string(),
            Timestamp::CreateTime(now),
            0,
            offset,
            Some(headers),
        ));
        Box::pin(async move { Ok((0, offset)) })
    }
}

/// The harness. See the module docs.
pub struct Harness {
    group: String,
    ordering: crate::worker::OrderingMode,
    order: Vec<String>,
    tiers: HashSet<String>,
    schemas: Arc<MemorySchemas>,
    logs: Arc<Mutex<BTreeMap<String, Vec<OwnedMessage>>>>,
    clock: Arc<AtomicI64>,
    pipeline: Pipeline,
    sched: Scheduler<OwnedMessage>,
    positions: HashMap<String, i64>,
    paused: HashSet<String>,
    committed: HashMap<String, i64>,
    jitter: Option<f64>,
    handled: Vec<Handled>,
    flow: Flow,
}

/// Where the virtual clock starts: 2026-01-01T00:00:00Z.
pub const EPOCH_MS: i64 = 1_767_225_600_000;

impl Harness {
    /// A harness running the handlers, timeouts, retry policies, ordering
    /// mode, concurrency and in-flight bound registered on `builder`,
    /// exactly as [`WorkerBuilder::build`] would.
    pub fn new(builder: WorkerBuilder) -> Result<Self> {
        let schemas = Arc::new(MemorySchemas::default());
        let routes = builder.build_routes(schemas.clone() as Arc<dyn SchemaSource>)?;
        let priorities = builder.topic_priorities(&routes.entries);
        let fairness = builder.topic_fairness(&routes.entries);
        let turns = builder.topic_turns(&routes.entries);
        let mut order: Vec<String> = routes.entries.keys().cloned().collect();
        // Main topics first, then tiers shortest-first, like a fair consumer.
        order.sort_by_key(|t| {
            let e = &routes.entries[t];
            (
                match e.role {
                    TopicRole::Tier(i) => i + 1,
                    _ => 0,
                },
                t.clone(),
            )
        });
        let tiers = routes
            .entries
            .iter()
            .filter(|(_, e)| e.role.holds())
            .map(|(t, _)| t.clone())
            .collect();
        let logs: Arc<Mutex<BTreeMap<String, Vec<OwnedMessage>>>> = Default::default();
        let clock = Arc::new(AtomicI64::new(EPOCH_MS));
        let settings = builder.scheduler_settings();
        let (stats, cancel) = (Arc::new(WorkerStats::default()), CancellationToken::new());
        let strict = builder.strict_state(
            Arc::new(crate::worker::before::strict::MemoryStore::default()),
            stats.clone(),
            cancel.clone(),
        );
        let mut pipeline = Pipeline::new(
            routes.entries.into_iter().collect(),
            builder.group().to_string(),
            Arc::new(MemorySink {
                logs: logs.clone(),
                clock: clock.clone(),
            }),
            Metrics::on(&MetricsExporter::disabled(), "", Arc::default()),
            stats,
            cancel,
            strict,
            crate::clock::Clock::Virtual(clock.clone()),
        );
        // The harness's waits keep their slot: nothing is parked.
        pipeline.park = false;
        let mut sched = Scheduler::new(settings.1)
            .with_priorities(priorities)
            .with_fairness(fairness)
            .with_turns(turns);
        let tps: Vec<(String, i32)> = order.iter().map(|t| (t.clone(), 0)).collect();
        let mut out = Vec::new();
        sched.assign(&tps, &mut out);
        Ok(Self {
            group: builder.group().to_string(),
            ordering: settings.0,
            order,
            tiers,
            schemas,
            logs,
            clock,
            pipeline,
            sched,
            positions: HashMap::new(),
            paused: HashSet::new(),
            committed: HashMap::new(),
            jitter: Some(0.0),
            handled: Vec::new(),
            flow: Flow::default(),
        })
    }

    /// Uses real random jitter for retry due times (default: none, so due
    /// times are exact and assertions simple).
    pub fn with_random_jitter(mut self) -> Self {
        self.jitter = None;
        self
    }

    /// Virtual now (epoch ms).
    pub fn now_ms(&self) -> i64 {
        self.clock.load(AtomicOrdering::Relaxed)
    }

    fn set_now(&self, ms: i64) {
        self.clock.store(ms, AtomicOrdering::Relaxed);
    }

    /// Enqueues a job on its main topic; returns its id.
    pub fn enqueue<J: Job>(&mut self, job: &J) -> Result<String> {
        self.enqueue_to(J::NAME, job)
    }

    /// Enqueues a job on `topic`, encoded exactly as the producer would.
    pub fn enqueue_to<J: Job>(&mut self, topic: &str, job: &J) -> Result<String> {
        let schema = parse_contract::<J>()?;
        let id = self
            .schemas
            .register(&subject_for_topic(topic), J::SCHEMA, schema.clone());
        let contract = RegisteredContract {
            id,
            subject: subject_for_topic(topic),
            schema: Arc::new(schema),
        };
        let payload = Codec::encode(&contract, job)?;
        let job_id = new_job_id();
        let headers = enqueue_headers(job, &job_id).to_owned_headers();
        self.append(topic, Some(job.key().into_bytes()), Some(payload), headers)?;
        Ok(job_id)
    }

    /// Delivers a copy of an existing record again (same key, payload and
    /// headers, hence the same job id), as Kafka does after a worker died
    /// between a side effect and its commit. Use it to prove a handler is
    /// idempotent.
    pub fn redeliver(&mut self, record: &OwnedMessage) -> Result<()> {
        let headers = record
            .headers()
            .cloned()
            .unwrap_or_else(rdkafka::message::OwnedHeaders::new);
        self.append(
            record.topic(),
            record.key().map(<[u8]>::to_vec),
            record.payload().map(<[u8]>::to_vec),
            headers,
        )
    }

    /// Appends raw bytes (a poison record) to `topic`.
    pub fn enqueue_raw(&mut self, topic: &str, key: &str, payload: &[u8]) -> Result<()> {
        self.append(
            topic,
            Some(key.as_bytes().to_vec()),
            Some(payload.to_vec()),
            rdkafka::message::OwnedHeaders::new(),
        )
    }

    fn append(
        &mut self,
        topic: &str,
        key: Option<Vec<u8>>,
        payload: Option<Vec<u8>>,
        headers: rdkafka::message::OwnedHeaders,
    ) -> Result<()> {
        let routed = self.pipeline.routes.contains_key(topic) || topic.ends_with(".dlq");
        if !routed {
            return Err(Error::MissingTopic {
                topic: topic.to_string(),
                bootstrap: "the test harness (no handler is registered for it)".into(),
            });
        }
        let sink = MemorySink {
            logs: self.logs.clone(),
            clock: self.clock.clone(),
        };
        // The in-memory send completes at once.
        let _ = sink
            .send(topic, None, key.as_deref(), payload.as_deref(), headers)
            .now_or_never();
        Ok(())
    }

    fn record_at(&self, topic: &str, offset: i64) -> Option<OwnedMessage> {
        let logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        logs.get(topic)?.get(usize::try_from(offset).ok()?).cloned()
    }

    /// Carries out the scheduler's actions on the in-memory topics; returns
    /// the jobs to run.
    fn apply(&mut self, out: &mut Vec<Action<OwnedMessage>>) -> Vec<SchedJob<OwnedMessage>> {
        let mut run = Vec::new();
        for action in out.drain(..) {
            match action {
                Action::Run(jobs) => run.extend(jobs),
                Action::Pause((t, _)) => {
                    if self.paused.insert(t) {
                        self.flow.pauses += 1;
                    }
                }
                Action::Resume((t, _)) => {
                    if self.paused.remove(&t) {
                        self.flow.resumes += 1;
                    }
                }
                Action::Seek((t, _), offset) => {
                    self.positions.insert(t, offset);
                }
                // The harness's waits keep their slot: nothing is parked.
                Action::Grant(_) => {}
                Action::Commit(offsets) => {
                    self.sched.committed(&offsets);
                    for ((t, _), next) in offsets {
                        self.committed.insert(t, next);
                    }
                }
            }
        }
        run
    }

    /// Runs every record that is due at the current virtual time, including
    /// retries that become due by it, until nothing more can run. Jobs the
    /// scheduler releases together run concurrently, as in the worker.
    /// Returns how many attempts ran.
    pub async fn run(&mut self) -> usize {
        let mut ran = 0;
        loop {
            let now = self.now_ms();
            let mut out = Vec::new();
            self.sched.tick(now, &mut out);
            let mut jobs = self.apply(&mut out);
            for topic in self.order.clone() {
                loop {
                    if self.paused.contains(&topic) {
                        break;
                    }
                    let pos = self.positions.get(&topic).copied().unwrap_or(0);
                    let Some(msg) = self.record_at(&topic, pos) else {
                        break;
                    };
                    self.positions.insert(topic.clone(), pos + 1);
                    let is_tier = self.tiers.contains(&topic);
                    let rec = incoming(msg, self.ordering, is_tier, &self.group);
                    self.sched.record(rec, now, &mut out);
                    jobs.extend(self.apply(&mut out));
                }
            }
            self.sched.dispatch(&mut out);
            jobs.extend(self.apply(&mut out));
            if jobs.is_empty() {
                // Commit what finished, as the worker's interval would.
                self.sched.commit_all(&mut out);
                self.apply(&mut out);
                return ran;
            }
            self.flow.max_running = self.flow.max_running.max(self.sched.running());
            let unit = self.jitter;
            let pipeline = &self.pipeline;
            let results = futures::future::join_all(jobs.iter().map(|j| async move {
                let waiter = crate::worker::before::park::Waiter::holding(j.released.clone());
                pipeline
                    .attempt(
                        &j.item,
                        &waiter,
                        unit.unwrap_or_else(rand::random::<f64>),
                        now,
                    )
                    .await
            }))
            .await;
            for (job, attempted) in jobs.into_iter().zip(results) {
                ran += 1;
                if attempted.outcome == Outcome::Handled {
                    self.handled.push(Handled {
                        id: attempted.id.to_string(),
                        job: attempted.job.to_string(),
                        attempt: attempted.attempt,
                        topic: job.item.topic().to_string(),
                        at_ms: now,
                    });
                }
                self.sched
                    .finished(job.ticket, attempted.outcome.is_final(), &mut out);
                let more = self.apply(&mut out);
                debug_assert!(more.is_empty(), "finished never runs jobs by itself");
            }
        }
    }

    /// Moves the virtual clock forward by `d`, then [`Harness::run`]s.
    pub async fn advance(&mut self, d: Duration) -> usize {
        self.set_now(self.now_ms() + d.as_millis() as i64);
        self.run().await
    }

    /// Runs, then jumps the clock to each next due retry, until no job is
    /// waiting (bounded to 10 000 steps). Returns the attempts that ran.
    pub async fn run_until_idle(&mut self) -> usize {
        let mut ran = self.run().await;
        for _ in 0..10_000 {
            let held = self.sched.next_due_ms();
            let waiting = self.waiting().iter().map(|w| w.due_at_ms).min();
            let Some(next_due) = held.into_iter().chain(waiting).min() else {
                break;
            };
            self.set_now(self.now_ms().max(next_due));
            ran += self.run().await;
        }
        ran
    }

    /// Jobs handled so far, in the order they finished.
    pub fn handled(&self) -> &[Handled] {
        &self.handled
    }

    /// What the scheduler did: pauses, resumes, most attempts at once.
    pub fn flow(&self) -> Flow {
        self.flow.clone()
    }

    /// The committed position (next offset to read) of `topic`, as the
    /// worker would commit it.
    pub fn committed(&self, topic: &str) -> Option<i64> {
        self.committed.get(topic).copied()
    }

    /// Jobs waiting in retry tiers.
    pub fn waiting(&self) -> Vec<Waiting> {
        let mut out = Vec::new();
        let logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        for topic in &self.tiers {
            // A record the scheduler holds until its due time is behind
            // the position already (it is kept, not fetched again).
            let read = self.positions.get(topic).copied().unwrap_or(0);
            let held = self.sched.held_offset(&(topic.clone(), 0));
            let pos = held.map_or(read, |h| h.min(read)).max(0) as usize;
            for m in logs
                .get(topic)
                .map(|l| &l[pos.min(l.len())..])
                .unwrap_or(&[])
            {
                let h = JobHeaders::parse(m.headers());
                out.push(Waiting {
                    topic: topic.clone(),
                    id: h.job_id(topic, m.partition(), m.offset()),
                    attempt: h.attempt.unwrap_or(1),
                    due_at_ms: h.due_at_ms.unwrap_or(self.now_ms()),
                    class: h.error_class.unwrap_or_default(),
                });
            }
        }
        out.sort_by_key(|w| (w.due_at_ms, w.topic.clone()));
        out
    }

    /// Every dead letter, across all DLQ topics.
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        let logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        logs.iter()
            .filter(|(t, _)| t.ends_with(".dlq"))
            .flat_map(|(t, log)| {
                log.iter().map(move |m| {
                    let h = JobHeaders::parse(m.headers());
                    DeadLetter {
                        topic: t.clone(),
                        id: h.job_id(t, m.partition(), m.offset()),
                        class: h.error_class.clone().unwrap_or_default(),
                        error: h.error.clone().unwrap_or_default(),
                        attempt: h.attempt.unwrap_or(1),
                        headers: h,
                    }
                })
            })
            .collect()
    }

    /// The records of any topic (main, tier or DLQ), for detailed assertions.
    pub fn records(&self, topic: &str) -> Vec<OwnedMessage> {
        let logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        logs.get(topic).cloned().unwrap_or_default()
    }

    /// The class of the dead letter for job `id`, if it was dead-lettered.
    pub fn dead_letter_class(&self, id: &str) -> Option<ErrorClass> {
        let class = self.dead_letters().into_iter().find(|d| d.id == id)?.class;
        // The one list of classes, so a new class is never read as `None`.
        ErrorClass::ALL.into_iter().find(|c| c.as_str() == class)
    }
}

#[cfg(test)]
mod tests;
