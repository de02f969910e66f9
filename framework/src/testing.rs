//! An in-memory harness for unit-testing handlers: no broker, no registry,
//! and a virtual clock, so a 30-minute retry tier takes no time.
//!
//! It runs the *same* code as the worker, not a re-implementation: routes
//! are built by [`WorkerBuilder`] (so handlers, timeouts and retry policies
//! are registered once for both), records are Avro-encoded with the contract
//! schemas and decoded through the worker's resolution code, attempts are
//! classified by the worker's handler runner (panics and timeouts included),
//! and [`crate::routing::next_step`] decides between done, retry tier and
//! DLQ, building the same headers.
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
//! let builder = Worker::builder(KafkaConfig::from_env(), "mailer").handle::<Mail, _>(send);
//! let mut h = Harness::new(builder)?;
//! h.enqueue(&Mail { to: "a@example.com".into() })?;
//! h.run().await;
//! assert_eq!(h.waiting().len(), 1);        // in mail.retry.5s
//! h.run_until_idle().await;                // the clock jumps; no real waiting
//! assert_eq!(h.handled().len(), 1);
//! assert_eq!(h.handled()[0].attempt, 2);
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use apache_avro::Schema;
use futures::future::BoxFuture;
use rdkafka::message::{Message, OwnedMessage, Timestamp};

use crate::classify::ErrorClass;
use crate::codec::{
    parse_contract, subject_for_topic, Codec, DecodeError, RegisteredContract, SchemaSource,
    WriterSchema,
};
use crate::error::{Error, Result};
use crate::headers::{self, JobHeaders};
use crate::job::Job;
use crate::producer::{enqueue_headers, new_job_id};
use crate::routing::{next_step, Next};
use crate::worker::lane::context_for;
use crate::worker::state::RouteEntry;
use crate::worker::WorkerBuilder;

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

/// The harness. See the module docs.
pub struct Harness {
    group: String,
    routes: HashMap<String, RouteEntry>,
    order: Vec<String>,
    schemas: Arc<MemorySchemas>,
    logs: BTreeMap<String, Vec<OwnedMessage>>,
    positions: HashMap<String, usize>,
    now_ms: i64,
    jitter: Option<f64>,
    handled: Vec<Handled>,
}

/// Where the virtual clock starts: 2026-01-01T00:00:00Z.
pub const EPOCH_MS: i64 = 1_767_225_600_000;

impl Harness {
    /// A harness running the handlers, timeouts and retry policies registered
    /// on `builder`, exactly as [`WorkerBuilder::build`] would.
    pub fn new(builder: WorkerBuilder) -> Result<Self> {
        let schemas = Arc::new(MemorySchemas::default());
        let routes = builder.build_routes(schemas.clone() as Arc<dyn SchemaSource>)?;
        let mut order: Vec<String> = routes.entries.keys().cloned().collect();
        // Main topics first, then tiers shortest-first, like a fair consumer.
        order.sort_by_key(|t| {
            let e = &routes.entries[t];
            (e.tier.map_or(0, |i| i + 1), t.clone())
        });
        Ok(Self {
            group: builder.group().to_string(),
            routes: routes.entries,
            order,
            schemas,
            logs: BTreeMap::new(),
            positions: HashMap::new(),
            now_ms: EPOCH_MS,
            jitter: Some(0.0),
            handled: Vec::new(),
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
        self.now_ms
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
        let routed = self.routes.contains_key(topic) || topic.ends_with(".dlq");
        if !routed {
            return Err(Error::MissingTopic {
                topic: topic.to_string(),
                bootstrap: "the test harness (no handler is registered for it)".into(),
            });
        }
        let log = self.logs.entry(topic.to_string()).or_default();
        let offset = log.len() as i64;
        log.push(OwnedMessage::new(
            payload,
            key,
            topic.to_string(),
            Timestamp::CreateTime(self.now_ms),
            0,
            offset,
            Some(headers),
        ));
        Ok(())
    }

    /// Runs every record that is due at the current virtual time, including
    /// retries that become due by it, until nothing more can run. Returns how
    /// many attempts ran.
    pub async fn run(&mut self) -> usize {
        let mut ran = 0;
        loop {
            let mut progressed = false;
            for topic in self.order.clone() {
                while let Some(msg) = self.next_due(&topic) {
                    self.attempt(&topic, &msg).await;
                    *self.positions.entry(topic.clone()).or_default() += 1;
                    ran += 1;
                    progressed = true;
                }
            }
            if !progressed {
                return ran;
            }
        }
    }

    /// Moves the virtual clock forward by `d`, then [`Harness::run`]s.
    pub async fn advance(&mut self, d: Duration) -> usize {
        self.now_ms += d.as_millis() as i64;
        self.run().await
    }

    /// Runs, then jumps the clock to each next due retry, until no job is
    /// waiting (bounded to 10 000 steps). Returns the attempts that ran.
    pub async fn run_until_idle(&mut self) -> usize {
        let mut ran = self.run().await;
        for _ in 0..10_000 {
            let Some(next_due) = self.waiting().iter().map(|w| w.due_at_ms).min() else {
                break;
            };
            self.now_ms = self.now_ms.max(next_due);
            ran += self.run().await;
        }
        ran
    }

    fn next_due(&self, topic: &str) -> Option<OwnedMessage> {
        let pos = self.positions.get(topic).copied().unwrap_or(0);
        let msg = self.logs.get(topic)?.get(pos)?;
        let is_tier = self.routes.get(topic).is_some_and(|e| e.tier.is_some());
        if is_tier {
            // First in, first out per tier, as with a paused partition.
            let due =
                headers::find(msg.headers(), headers::DUE_AT).and_then(|d| d.parse::<i64>().ok());
            if due.is_some_and(|d| d > self.now_ms) {
                return None;
            }
        }
        Some(msg.clone())
    }

    async fn attempt(&mut self, topic: &str, msg: &OwnedMessage) {
        let Some(entry) = self.routes.get(topic).cloned() else {
            return;
        };
        let headers = JobHeaders::parse(msg.headers());
        let ctx = context_for(msg, &headers, &self.group, entry.route.job_name());
        let attempt = ctx.attempt;
        let id = ctx.id.clone();
        let outcome = entry.route.run(msg.payload(), ctx).await;
        let unit = self.jitter.unwrap_or_else(rand::random::<f64>);
        let next = next_step(
            &outcome,
            msg,
            &entry.main,
            &self.group,
            &entry.retry,
            attempt,
            unit,
            self.now_ms,
        );
        match next {
            Next::Done => self.handled.push(Handled {
                id,
                job: headers
                    .job
                    .unwrap_or_else(|| entry.route.job_name().to_string()),
                attempt,
                topic: topic.to_string(),
                at_ms: self.now_ms,
            }),
            Next::Retry {
                topic: target,
                headers,
                ..
            }
            | Next::DeadLetter {
                topic: target,
                headers,
                ..
            } => {
                let log = self.logs.entry(target.clone()).or_default();
                let offset = log.len() as i64;
                log.push(OwnedMessage::new(
                    msg.payload().map(<[u8]>::to_vec),
                    msg.key().map(<[u8]>::to_vec),
                    target,
                    Timestamp::CreateTime(self.now_ms),
                    0,
                    offset,
                    Some(headers.to_owned_headers()),
                ));
            }
        }
    }

    /// Jobs handled so far, in the order they ran.
    pub fn handled(&self) -> &[Handled] {
        &self.handled
    }

    /// Jobs waiting in retry tiers.
    pub fn waiting(&self) -> Vec<Waiting> {
        let mut out = Vec::new();
        for (topic, entry) in &self.routes {
            if entry.tier.is_none() {
                continue;
            }
            let pos = self.positions.get(topic).copied().unwrap_or(0);
            for m in self
                .logs
                .get(topic)
                .map(|l| &l[pos.min(l.len())..])
                .unwrap_or(&[])
            {
                let h = JobHeaders::parse(m.headers());
                out.push(Waiting {
                    topic: topic.clone(),
                    id: h.job_id(topic, m.partition(), m.offset()),
                    attempt: h.attempt.unwrap_or(1),
                    due_at_ms: h.due_at_ms.unwrap_or(self.now_ms),
                    class: h.error_class.unwrap_or_default(),
                });
            }
        }
        out.sort_by_key(|w| (w.due_at_ms, w.topic.clone()));
        out
    }

    /// Every dead letter, across all DLQ topics.
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        self.logs
            .iter()
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
    pub fn records(&self, topic: &str) -> &[OwnedMessage] {
        self.logs.get(topic).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The class of the dead letter for job `id`, if it was dead-lettered.
    pub fn dead_letter_class(&self, id: &str) -> Option<ErrorClass> {
        let class = self.dead_letters().into_iter().find(|d| d.id == id)?.class;
        [
            ErrorClass::PermanentInvalidInput,
            ErrorClass::PermanentNotFound,
            ErrorClass::Permanent,
            ErrorClass::Panic,
            ErrorClass::RetriesExhausted,
            ErrorClass::DecodeNotFramed,
            ErrorClass::DecodeUnknownSchema,
            ErrorClass::DecodeBody,
            ErrorClass::DecodeIncompatible,
        ]
        .into_iter()
        .find(|c| c.as_str() == class)
    }
}
