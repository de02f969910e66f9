//! Avro encoding and decoding in the Confluent wire format.
//!
//! Wire format: `0x00` (magic byte), a 4-byte big-endian schema id, then the
//! Avro binary body. The schema id points into the registry.
//!
//! **Subject strategy.** kjob registers a job's schema under
//! `<main topic>-value` (Confluent's `TopicNameStrategy`), because one main
//! topic carries exactly one contract. Retry-tier and DLQ records are
//! forwarded byte-for-byte, so they keep the id of the schema they were
//! written with and need no subject of their own.
//!
//! **Writer side.** A producer registers (or looks up: registering an
//! identical schema is idempotent) *its own compiled-in schema* and encodes
//! with that id. It never asks for "latest", which during a rolling deploy
//! could be a newer version the old binary cannot fill in.
//!
//! **Reader side.** A worker fetches the writer schema by id (cached after the
//! first fetch, so nothing is parsed per message) and resolves it to the
//! reader schema compiled into the binary: fields added with defaults, fields
//! removed, aliases, all work in both directions of a deploy.

mod json;
mod reader;
mod wire;

pub use json::{JsonContracts, JsonEncodeError, JsonEncoded};
pub use reader::{
    bound_decode_allocations, decode_body, decode_value, split_frame, DecodeError, ReaderSchema,
    SchemaSource, WriterSchema, MAX_DECODE_ALLOCATION,
};
pub use wire::{frame, subject_for_topic, MAGIC_BYTE};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;

use crate::config::KafkaConfig;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::registry::{Registration, RegistryClient, RegistrySettings};
use crate::schema::Compatibility;

/// A schema the registry assigned an id to, ready for encoding.
#[derive(Clone, Debug)]
pub struct RegisteredContract {
    /// Registry schema id written into every record.
    pub id: u32,
    /// The registry subject it lives under.
    pub subject: String,
    /// The parsed schema (this binary's own).
    pub schema: Arc<Schema>,
}

/// Parses a job's compiled-in schema, with an error that names the contract.
pub fn parse_contract<J: Job>() -> Result<Schema> {
    Schema::parse_str(J::SCHEMA).map_err(|e| Error::Contract {
        job: J::NAME.to_string(),
        message: format!("schema v{} does not parse: {e}", J::VERSION),
    })
}

/// topic -> (contract name, version) -> registered contract.
type ContractCache = HashMap<String, HashMap<(&'static str, u32), RegisteredContract>>;

/// A writer schema being fetched or fetched: concurrent decoders of the same
/// id wait for one request; a failed fetch leaves the cell empty, so the next
/// record asks again (a registry outage is never cached).
type WriterCell = Arc<tokio::sync::OnceCell<Arc<Schema>>>;

/// Registry client plus caches. One per process is plenty; clone the `Arc`.
///
/// **Locks.** No lock is held across a registry call except one per
/// *subject*, during the first registration of a contract under it
/// ([`Codec::register`]): concurrent first enqueues of the same contract
/// wait for that one registration (they would make the same calls), while
/// other subjects, cached contracts and every decode go ahead. Writer-schema
/// fetches are deduplicated per schema id the same way. The std mutexes
/// around the caches are only held for a map lookup or insert.
pub struct Codec {
    client: RegistryClient,
    /// Writer schemas by id, for decoding.
    writers: RwLock<HashMap<u32, WriterCell>>,
    /// topic -> (contract name, version) -> contract. Nested so the hot
    /// path (every enqueue) looks up by `&str` without allocating a key.
    registered: Mutex<ContractCache>,
    /// subject -> lock serialising that subject's first registration.
    registering: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Whether writer-schema fetches are failing, and when to ask again.
    outage: Mutex<Outage>,
    /// Contracts JSON jobs are encoded against (the outbox's SQL enqueue).
    json: crate::codec::JsonContracts,
}

/// Paces writer-schema fetches while the registry does not answer.
///
/// Jobs whose writer schema is not cached wait for the registry (see
/// `worker::route`) and keep asking. Without a gate every waiting job would
/// send its own request; with it the codec sends at most one per interval
/// (100 ms, doubling up to [`Outage::MAX_INTERVAL`]) and answers the others
/// at once. It also logs the outage once when it starts and once when the
/// registry answers again, instead of once per job.
#[derive(Debug, Default)]
struct Outage {
    /// When the current outage began (`None`: the last fetch worked).
    since: Option<std::time::Instant>,
    /// No request before this.
    next_try: Option<std::time::Instant>,
    interval: std::time::Duration,
}

impl Outage {
    const FIRST_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);
    const MAX_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

    /// Whether a request may be sent at `now`.
    fn may_ask(&self, now: std::time::Instant) -> bool {
        self.next_try.is_none_or(|t| now >= t)
    }

    /// A fetch failed for want of the registry. True when this starts an
    /// outage.
    fn failed(&mut self, now: std::time::Instant) -> bool {
        let first = self.since.is_none();
        self.interval = if first {
            Self::FIRST_INTERVAL
        } else {
            (self.interval * 2).min(Self::MAX_INTERVAL)
        };
        self.since.get_or_insert(now);
        self.next_try = Some(now + self.interval);
        first
    }

    /// A fetch got an answer. Returns how long the outage lasted, if one
    /// was on.
    fn answered(&mut self, now: std::time::Instant) -> Option<std::time::Duration> {
        self.next_try = None;
        self.since.take().map(|s| now.saturating_duration_since(s))
    }
}

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codec")
            .field("client", &self.client)
            .finish()
    }
}

impl Codec {
    /// A codec for the registry at `url` (a Confluent-compatible base URL
    /// such as Apicurio's `/apis/ccompat/v7`), with timeouts and credentials
    /// from the `KJOB_SCHEMA_REGISTRY_*` environment (see
    /// [`crate::registry`]). Prefer [`Codec::from_config`], which also
    /// honours what was set on the [`KafkaConfig`].
    pub fn new(url: &str) -> Result<Self> {
        Ok(Self::with_client(RegistryClient::new(
            RegistrySettings::from_env(url)?,
        )?))
    }

    /// A codec for the config's registry, with its timeouts and
    /// credentials (the environment fills in what the config leaves unset).
    pub fn from_config(config: &KafkaConfig) -> Result<Self> {
        // Every worker, producer and relay starts here: a properties file
        // that could not be read, or a property librdkafka refuses, stops
        // them before anything connects, naming it.
        config.check()?;
        Ok(Self::with_client(RegistryClient::new(
            RegistrySettings::resolve(config)?,
        )?))
    }

    /// A codec over an existing client (sharing its connection pool).
    pub fn with_client(client: RegistryClient) -> Self {
        Self {
            json: crate::codec::JsonContracts::new(client.clone()),
            client,
            writers: RwLock::new(HashMap::new()),
            registered: Mutex::new(HashMap::new()),
            registering: Mutex::new(HashMap::new()),
            outage: Mutex::new(Outage::default()),
        }
    }

    /// The registry base URL.
    pub fn url(&self) -> &str {
        self.client.url()
    }

    /// The registry client, for registry calls the codec does not wrap
    /// (the CLI's `schema` commands).
    pub fn client(&self) -> &RegistryClient {
        &self.client
    }

    /// Checks that the registry answers, so a worker fails at start with a
    /// clear message instead of dead-lettering... nothing, or retrying forever.
    pub async fn ping(&self) -> Result<()> {
        match self.client.subjects().await {
            Ok(_) => Ok(()),
            Err(Error::Registry { url, message }) => Err(Error::Registry {
                url,
                message: format!("not reachable or not a schema registry: {message}"),
            }),
            Err(e) => Err(e),
        }
    }

    /// Registers (or looks up) this binary's schema for `J` under the subject
    /// of `topic`. Cached per topic and contract version after the first call.
    ///
    /// A subject without its own compatibility level gets `BACKWARD` first
    /// (kjob's contract rule: a new version must read the previous one), so
    /// the registry itself refuses a breaking change. A level someone set on
    /// the subject is never changed. Producers of a new topic that start
    /// together all set `BACKWARD` at once; the registry's "already exists"
    /// answer to the later ones counts as set (see
    /// [`RegistryClient::set_compatibility`]). A refused schema fails here,
    /// at startup, with the subject, the versions and the offending field.
    ///
    /// A registry that does not answer fails this call after two of the
    /// client's request timeouts (each call is tried once more; a first
    /// registration makes up to four calls),
    /// with [`Error::RegistryTimeout`] naming the URL and the timeout.
    pub async fn register<J: Job>(&self, topic: &str) -> Result<RegisteredContract> {
        // One binary may carry two versions of a contract (a migration
        // tool, a test): cache per topic *and* version.
        if let Some(c) = self.cached::<J>(topic) {
            return Ok(c);
        }
        let subject = subject_for_topic(topic);
        let lock = self
            .registering
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(subject.clone())
            .or_default()
            .clone();
        let _one_at_a_time = lock.lock().await;
        if let Some(c) = self.cached::<J>(topic) {
            return Ok(c);
        }
        let schema = parse_contract::<J>()?;
        let level = match self.client.compatibility(&subject).await? {
            Some(level) => level,
            None => {
                self.client
                    .set_compatibility(&subject, Compatibility::Backward)
                    .await?;
                Compatibility::Backward
            }
        };
        let id = match self.client.register(&subject, J::SCHEMA).await? {
            Registration::Id(id) => id,
            Registration::Refused { status, message } => {
                // Explain the refusal with the same rules, locally.
                let versions = crate::schema::registered_versions(&self.client, &subject).await?;
                let reasons: Vec<String> = crate::schema::check(&schema, &versions, level)
                    .into_iter()
                    .map(|i| {
                        format!(
                            "breaks registered version {} ({}): {}",
                            i.version, i.direction, i.reason
                        )
                    })
                    .collect();
                let message = if reasons.is_empty() {
                    format!("HTTP {status}: {message}")
                } else {
                    format!("{level}: {}", reasons.join("; "))
                };
                return Err(Error::SchemaRejected {
                    job: J::NAME.to_string(),
                    version: J::VERSION,
                    subject,
                    message,
                });
            }
        };
        let contract = RegisteredContract {
            id,
            subject,
            schema: Arc::new(schema),
        };
        self.lock_registered()
            .entry(topic.to_string())
            .or_default()
            .insert((J::NAME, J::VERSION), contract.clone());
        Ok(contract)
    }

    fn cached<J: Job>(&self, topic: &str) -> Option<RegisteredContract> {
        self.lock_registered()
            .get(topic)?
            .get(&(J::NAME, J::VERSION))
            .cloned()
    }

    fn lock_registered(&self) -> std::sync::MutexGuard<'_, ContractCache> {
        // A poisoned cache is still a valid cache: entries are inserted whole.
        self.registered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_outage(&self) -> std::sync::MutexGuard<'_, Outage> {
        self.outage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The writer schema with `id`, fetched once and then cached.
    async fn fetch_writer(&self, id: u32) -> std::result::Result<Arc<Schema>, DecodeError> {
        let known = self
            .writers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .cloned();
        let cell = match known {
            Some(cell) => cell,
            None => self
                .writers
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(id)
                .or_default()
                .clone(),
        };
        if let Some(schema) = cell.get() {
            return Ok(schema.clone());
        }
        cell.get_or_try_init(|| async {
            let now = std::time::Instant::now();
            if !self.lock_outage().may_ask(now) {
                return Err(DecodeError::RegistryUnavailable {
                    id,
                    message: format!(
                        "{} did not answer the last request; asking again shortly",
                        self.client.url()
                    ),
                });
            }
            let answer = self.client.schema_by_id(id).await;
            let now = std::time::Instant::now();
            match &answer {
                Err(e) => {
                    if self.lock_outage().failed(now) {
                        tracing::warn!(registry = %self.client.url(), error = %e, "schema registry unavailable: jobs whose writer schema is not cached wait for it (their attempts do not count)");
                    }
                }
                Ok(_) => {
                    if let Some(lasted) = self.lock_outage().answered(now) {
                        tracing::info!(registry = %self.client.url(), outage_ms = lasted.as_millis() as u64, "schema registry answers again; waiting jobs resume");
                    }
                }
            }
            match answer {
                Ok(Some(raw)) => {
                    Schema::parse_str(&raw)
                        .map(Arc::new)
                        .map_err(|e| DecodeError::UnknownSchema {
                            id,
                            message: format!("the registry's schema does not parse: {e}"),
                        })
                }
                Ok(None) => Err(DecodeError::UnknownSchema {
                    id,
                    message: format!("{} answered 404 for this id", self.client.url()),
                }),
                Err(e) => Err(DecodeError::RegistryUnavailable {
                    id,
                    message: e.to_string(),
                }),
            }
        })
        .await
        .cloned()
    }

    /// Encodes a JSON job for `topic` against the schema registered under
    /// its subject: `version`, or the latest when `None`. See
    /// [`crate::codec::JsonContracts`] for the cache and the errors.
    pub async fn encode_json(
        &self,
        topic: &str,
        version: Option<u32>,
        json: &serde_json::Value,
    ) -> std::result::Result<crate::codec::JsonEncoded, crate::codec::JsonEncodeError> {
        self.json.encode(topic, version, json).await
    }

    /// Encodes a job with an already registered contract. Serializes straight
    /// from serde into Avro, without an intermediate value tree.
    pub fn encode<J: Job>(contract: &RegisteredContract, job: &J) -> Result<Vec<u8>> {
        let writer = GenericDatumWriter::builder(&contract.schema)
            .build()
            .map_err(|e| Error::Encode {
                job: J::NAME.to_string(),
                message: e.to_string(),
            })?;
        let mut out = Vec::with_capacity(64);
        out.push(MAGIC_BYTE);
        out.extend_from_slice(&contract.id.to_be_bytes());
        writer.write_ser(&mut out, job).map_err(|e| Error::Encode {
            job: J::NAME.to_string(),
            message: e.to_string(),
        })?;
        Ok(out)
    }
}

impl Codec {
    /// Decodes a framed record with its writer schema alone, to JSON: what an
    /// operator inspecting a dead letter wants, without any Rust type.
    pub async fn decode_to_json(
        &self,
        bytes: Option<&[u8]>,
    ) -> std::result::Result<serde_json::Value, DecodeError> {
        let (id, body) = split_frame(bytes)?;
        let writer = self.writer(id).await?;
        let mut cursor = body;
        let value = GenericDatumReader::builder(writer.schema())
            .build()
            .and_then(|r| r.read_value(&mut cursor))
            .map_err(|e| DecodeError::Body {
                id,
                message: e.to_string(),
            })?;
        serde_json::Value::try_from(value).map_err(|e| DecodeError::Body {
            id,
            message: e.to_string(),
        })
    }
}

/// A 404 for the id is [`DecodeError::UnknownSchema`] (the record is
/// dead-lettered); anything else that goes wrong talking to the registry (a
/// timeout, a 5xx, refused credentials) is
/// [`DecodeError::RegistryUnavailable`], so the record waits for the
/// registry instead of being dead-lettered for it.
impl SchemaSource for Codec {
    fn writer(
        &self,
        id: u32,
    ) -> futures::future::BoxFuture<'_, std::result::Result<WriterSchema, DecodeError>> {
        Box::pin(async move { self.fetch_writer(id).await.map(WriterSchema::Registry) })
    }

    fn cached(&self, id: u32) -> Option<WriterSchema> {
        let writers = self
            .writers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let schema = writers.get(&id)?.get()?.clone();
        Some(WriterSchema::Registry(schema))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::ErrorClass;
    use std::time::Duration;

    #[test]
    fn an_outage_paces_requests_and_ends_with_the_first_answer() {
        let t0 = std::time::Instant::now();
        let ms = std::time::Duration::from_millis;
        let mut o = Outage::default();
        assert!(o.may_ask(t0));
        assert!(o.failed(t0), "the first failure starts an outage");
        assert!(!o.may_ask(t0 + ms(99)));
        assert!(o.may_ask(t0 + ms(100)));
        let mut at = t0 + ms(100);
        let mut intervals = Vec::new();
        for _ in 0..6 {
            assert!(!o.failed(at), "later failures continue it");
            intervals.push(o.interval);
            at += o.interval;
        }
        assert_eq!(
            intervals,
            [200, 400, 800, 1600, 2000, 2000].map(ms).to_vec(),
            "doubling, capped at two seconds"
        );
        assert_eq!(o.answered(at), Some(at - t0));
        assert!(o.may_ask(at));
        assert_eq!(o.answered(at), None, "no outage to end twice");
        assert!(o.failed(at), "a new failure starts a new outage");
        assert_eq!(o.interval, ms(100));
    }

    #[test]
    fn frames_round_trip() {
        let f = frame(258, b"abc");
        assert_eq!(f, vec![0, 0, 0, 1, 2, b'a', b'b', b'c']);
        let (id, body) = split_frame(Some(&f))
            .map_err(|e| e.to_string())
            .unwrap_or((0, b""));
        assert_eq!((id, body), (258, &b"abc"[..]));
    }

    #[test]
    fn bad_frames_are_classified() {
        for bad in [
            None,
            Some(&b""[..]),
            Some(&b"\0\0\0"[..]),
            Some(&b"\x01\0\0\0\x01x"[..]),
        ] {
            let err = split_frame(bad).err();
            assert!(
                matches!(err, Some(DecodeError::NotFramed(_))),
                "{bad:?} -> {err:?}"
            );
        }
    }

    async fn decode_error_for(status: u16, body: &'static str) -> Option<DecodeError> {
        let (url, server) = crate::registry::test_server::answering(status, body)
            .await
            .ok()?;
        let codec = Codec::with_client(
            RegistryClient::new(RegistrySettings {
                url,
                connect_timeout: Duration::from_secs(2),
                request_timeout: Duration::from_secs(2),
                auth: None,
            })
            .ok()?,
        );
        let got = codec.writer(7).await.err();
        server.abort();
        got
    }

    #[tokio::test]
    async fn only_a_404_dead_letters_a_record_for_its_schema() {
        let unknown = decode_error_for(404, "{}").await;
        assert!(
            matches!(unknown, Some(DecodeError::UnknownSchema { id: 7, .. })),
            "{unknown:?}"
        );
        assert_eq!(
            unknown.and_then(|e| e.class()),
            Some(ErrorClass::DecodeUnknownSchema)
        );
        // Refused credentials, a broken registry, a rate limit: the record
        // waits for the registry (no class: not dead-lettered).
        for status in [401, 403, 429, 500, 503] {
            let e = decode_error_for(status, r#"{"message":"x"}"#).await;
            assert!(
                matches!(e, Some(DecodeError::RegistryUnavailable { id: 7, .. })),
                "{status}: {e:?}"
            );
            assert_eq!(e.and_then(|e| e.class()), None, "{status}");
        }
    }

    #[tokio::test]
    async fn writer_schemas_are_fetched_once() {
        let Ok((url, server)) =
            crate::registry::test_server::answering(200, r#"{"schema":"\"string\""}"#).await
        else {
            panic!("test server");
        };
        let Ok(client) = RegistryClient::new(RegistrySettings {
            url,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(2),
            auth: None,
        }) else {
            panic!("client");
        };
        let codec = Codec::with_client(client);
        let first = codec.writer(3).await.map(|w| w.schema().clone());
        assert_eq!(first.ok(), Some(Schema::String));
        // The registry is gone; the cached schema still decodes.
        server.abort();
        let _ = server.await;
        let again = codec.writer(3).await.map(|w| w.schema().clone());
        assert_eq!(again.ok(), Some(Schema::String));
    }

    /// The record value of a job with strings, an array and a map.
    const FUZZ_SCHEMA: &str = r#"{"type":"record","name":"F","fields":[
      {"name":"key","type":"string"},
      {"name":"tags","type":{"type":"array","items":"string"}},
      {"name":"attrs","type":{"type":"map","values":"long"}}]}"#;

    fn zigzag(n: i64) -> Vec<u8> {
        let mut z = ((n << 1) ^ (n >> 63)) as u64;
        let mut out = Vec::new();
        while z >= 0x80 {
            out.push((z as u8 & 0x7f) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
        out
    }

    #[test]
    fn a_hostile_length_prefix_is_a_classified_error_not_an_allocation() {
        let schema = Schema::parse_str(FUZZ_SCHEMA).expect("the test schema parses");
        let schema = &schema;
        for claim in [1_i64 << 40, 1 << 62, (MAX_DECODE_ALLOCATION as i64) + 1] {
            let body = zigzag(claim);
            let err = decode_value(1, schema, &body, schema).err();
            assert!(
                matches!(err, Some(DecodeError::Body { .. })),
                "claim {claim}: {err:?}"
            );
        }
        assert_eq!(bound_decode_allocations(), MAX_DECODE_ALLOCATION);
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 2_000, failure_persistence: None, ..Default::default()
        })]

        /// The quick version of `benches/src/bin/fuzz_decoder.rs` (a million
        /// cases): any bytes are either a job or a classified decode error.
        #[test]
        fn any_bytes_decode_or_are_classified(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48)) {
            let schema = Schema::parse_str(FUZZ_SCHEMA).map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            let framed = frame(1, &bytes);
            for input in [&bytes[..], &framed[..]] {
                match split_frame(Some(input)) {
                    Err(e) => proptest::prop_assert!(e.class().is_some()),
                    Ok((id, body)) => {
                        if let Err(e) = decode_value(id, &schema, body, &schema) {
                            proptest::prop_assert!(e.class().is_some(), "{e}");
                        }
                    }
                }
            }
        }
    }
}
