//! JSON jobs encoded against the contract registered for their topic.
//!
//! A job enqueued from SQL (`kjob.enqueue`, see the `kjob::outbox` module, feature `postgres`) is a JSON
//! object: a PHP or Python application has no Avro schema compiled in. The
//! outbox relay turns it into exactly what a Rust producer would have sent,
//! a Confluent-framed Avro record, against the schema registered under the
//! topic's subject (`<topic>-value`): the **latest** version by default, or
//! the version the caller pinned. `kjob dlq retry` does the same for a JSON
//! dead letter once the contract has been fixed.
//!
//! The conversion is [`crate::json_avro`]'s, so a job that does not fit
//! fails with the field named (`items[2].qty: expected an int, got the
//! string "two"`).
//!
//! **Cache.** One [`JsonContracts`] per [`Codec`](crate::codec::Codec)
//! keeps each subject's contracts:
//! * a pinned version is immutable in the registry, so it is kept for good;
//! * "latest" is kept for [`LATEST_TTL`], so a newly registered version is
//!   used within that time, and is fetched again at once when a job does
//!   not fit it (**refresh on a miss**: the job may be written for a version
//!   registered a moment ago), at most once per [`MISS_REFRESH`] per subject,
//!   so a stream of bad jobs does not become a stream of registry calls;
//! * a subject (or version) that is not registered, and a registry that did
//!   not answer, are remembered for [`NEGATIVE_TTL`], so a batch of a
//!   thousand such rows asks once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use apache_avro::Schema;

use super::wire::{frame, subject_for_topic};
use crate::json_avro::{Mismatch, PreparedSchema};
use crate::registry::RegistryClient;

/// How long the latest version of a subject is used before it is fetched
/// again.
pub(super) const LATEST_TTL: Duration = Duration::from_secs(30);

/// A job that does not fit the cached latest version fetches the latest
/// again, but not more often than this per subject.
pub(super) const MISS_REFRESH: Duration = Duration::from_secs(1);

/// How long "not registered" and "registry unavailable" are remembered.
pub(super) const NEGATIVE_TTL: Duration = Duration::from_secs(1);

/// A JSON job encoded for Kafka.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonEncoded {
    /// Confluent-framed Avro: magic byte, schema id, body.
    pub bytes: Vec<u8>,
    /// The registry subject.
    pub subject: String,
    /// The subject version encoded against.
    pub version: u32,
    /// The schema id in the frame.
    pub id: u32,
}

/// Why a JSON job could not be encoded. Every variant but
/// [`JsonEncodeError::Unavailable`] is about the job or its contract and
/// will not go away by asking again: the outbox relay dead-letters the row
/// (class `outbox.encode`). An unavailable registry is waited for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JsonEncodeError {
    /// The job does not fit the schema; `mismatch` names the field.
    #[error("{mismatch} (the job does not fit `{subject}` version {version}, schema id {id}: fix the data and enqueue it again, or register a version it fits and run `kjob dlq retry`)")]
    Mismatch {
        /// The subject.
        subject: String,
        /// The version it was checked against.
        version: u32,
        /// Its schema id.
        id: u32,
        /// Which field, and what is wrong with it.
        mismatch: Mismatch,
    },
    /// Nothing is registered under the subject: a topic that is not a
    /// route (a typo?), or a route whose contract was never registered.
    #[error("no schema is registered under subject `{subject}`: is `{topic}` a route? Register its contract (a kjob producer for it does, or `kjob schema register --dir <schemas>`), then run `kjob dlq retry`")]
    NoSubject {
        /// The topic.
        topic: String,
        /// The subject.
        subject: String,
    },
    /// The pinned version does not exist.
    #[error("subject `{subject}` has no version {version}: pin a registered version (GET /subjects/{subject}/versions on the registry lists them), or none for the latest")]
    NoVersion {
        /// The subject.
        subject: String,
        /// The version asked for.
        version: u32,
    },
    /// The registered schema is not Avro kjob can parse.
    #[error(
        "the schema registered as `{subject}` version {version} does not parse as Avro: {message}"
    )]
    BadSchema {
        /// The subject.
        subject: String,
        /// Its version.
        version: u32,
        /// The parser's reason.
        message: String,
    },
    /// The registry did not answer (or answered an error that is not about
    /// the subject). Transient: try again later.
    #[error("schema registry unavailable while fetching `{subject}`: {message}")]
    Unavailable {
        /// The subject.
        subject: String,
        /// The transport error.
        message: String,
    },
}

impl JsonEncodeError {
    /// Whether asking again later may succeed (the registry was away).
    pub fn is_transient(&self) -> bool {
        matches!(self, JsonEncodeError::Unavailable { .. })
    }

    /// The field the job failed on, when it is about one field.
    pub fn field(&self) -> Option<&str> {
        match self {
            JsonEncodeError::Mismatch { mismatch, .. } if !mismatch.path.is_empty() => {
                Some(&mismatch.path)
            }
            _ => None,
        }
    }
}

/// One registered version, prepared for encoding.
#[derive(Debug)]
struct Contract {
    subject: String,
    version: u32,
    id: u32,
    prepared: PreparedSchema,
}

impl Contract {
    fn encode(&self, json: &serde_json::Value) -> Result<JsonEncoded, JsonEncodeError> {
        let body = self
            .prepared
            .to_datum(json)
            .map_err(|mismatch| JsonEncodeError::Mismatch {
                subject: self.subject.clone(),
                version: self.version,
                id: self.id,
                mismatch,
            })?;
        Ok(JsonEncoded {
            bytes: frame(self.id, &body),
            subject: self.subject.clone(),
            version: self.version,
            id: self.id,
        })
    }
}

#[derive(Debug)]
enum Entry {
    Found {
        contract: Arc<Contract>,
        fetched: Instant,
    },
    Failed {
        error: JsonEncodeError,
        at: Instant,
    },
}

/// The contracts JSON jobs are encoded against, cached per subject and
/// version. Cheap to share; lives in the
/// [`Codec`](crate::codec::Codec).
pub struct JsonContracts {
    client: RegistryClient,
    cache: Mutex<HashMap<(String, Option<u32>), Entry>>,
}

impl std::fmt::Debug for JsonContracts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonContracts")
            .field("registry", &self.client.url())
            .finish_non_exhaustive()
    }
}

impl JsonContracts {
    /// Contracts fetched through `client`.
    pub fn new(client: RegistryClient) -> Self {
        Self {
            client,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Encodes `json` for `topic` against the subject's `version` (`None`:
    /// the latest).
    pub async fn encode(
        &self,
        topic: &str,
        version: Option<u32>,
        json: &serde_json::Value,
    ) -> Result<JsonEncoded, JsonEncodeError> {
        let subject = subject_for_topic(topic);
        let (contract, fetched) = self.contract(topic, &subject, version, false).await?;
        match contract.encode(json) {
            Ok(encoded) => Ok(encoded),
            Err(first) if version.is_none() && fetched.elapsed() >= MISS_REFRESH => {
                // Refresh on a miss: the job may be written for a version
                // registered after the cached one was fetched.
                let (fresh, _) = self.contract(topic, &subject, None, true).await?;
                if fresh.id == contract.id {
                    return Err(first);
                }
                fresh.encode(json)
            }
            Err(e) => Err(e),
        }
    }

    fn cached(
        &self,
        subject: &str,
        version: Option<u32>,
    ) -> Option<Result<(Arc<Contract>, Instant), JsonEncodeError>> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        match cache.get(&(subject.to_string(), version))? {
            Entry::Found { contract, fetched } => {
                let fresh = version.is_some() || fetched.elapsed() < LATEST_TTL;
                fresh.then(|| Ok((contract.clone(), *fetched)))
            }
            Entry::Failed { error, at } => {
                (at.elapsed() < NEGATIVE_TTL).then(|| Err(error.clone()))
            }
        }
    }

    async fn contract(
        &self,
        topic: &str,
        subject: &str,
        version: Option<u32>,
        refresh: bool,
    ) -> Result<(Arc<Contract>, Instant), JsonEncodeError> {
        if !refresh {
            if let Some(hit) = self.cached(subject, version) {
                return hit;
            }
        }
        let fetched = Instant::now();
        let result = self.fetch(topic, subject, version).await;
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (subject.to_string(), version);
        match result {
            Ok(contract) => {
                let contract = Arc::new(contract);
                cache.insert(
                    key,
                    Entry::Found {
                        contract: contract.clone(),
                        fetched,
                    },
                );
                Ok((contract, fetched))
            }
            Err(error) => {
                // A failed refresh keeps a contract that still works for
                // the jobs that fit it; only a first fetch is remembered
                // as failed.
                let keep = matches!(cache.get(&key), Some(Entry::Found { .. }));
                if !keep || !error.is_transient() {
                    cache.insert(
                        key,
                        Entry::Failed {
                            error: error.clone(),
                            at: Instant::now(),
                        },
                    );
                }
                Err(error)
            }
        }
    }

    async fn fetch(
        &self,
        topic: &str,
        subject: &str,
        version: Option<u32>,
    ) -> Result<Contract, JsonEncodeError> {
        let found = self
            .client
            .subject_version(subject, version)
            .await
            .map_err(|e| JsonEncodeError::Unavailable {
                subject: subject.to_string(),
                message: e.to_string(),
            })?;
        let Some(found) = found else {
            return Err(match version {
                Some(version) if self.subject_exists(subject).await? => {
                    JsonEncodeError::NoVersion {
                        subject: subject.to_string(),
                        version,
                    }
                }
                _ => JsonEncodeError::NoSubject {
                    topic: topic.to_string(),
                    subject: subject.to_string(),
                },
            });
        };
        let schema = Schema::parse_str(&found.schema).map_err(|e| JsonEncodeError::BadSchema {
            subject: subject.to_string(),
            version: found.version,
            message: e.to_string(),
        })?;
        Ok(Contract {
            subject: subject.to_string(),
            version: found.version,
            id: found.id,
            prepared: PreparedSchema::prepare(schema),
        })
    }

    async fn subject_exists(&self, subject: &str) -> Result<bool, JsonEncodeError> {
        self.client
            .versions(subject)
            .await
            .map(|v| !v.is_empty())
            .map_err(|e| JsonEncodeError::Unavailable {
                subject: subject.to_string(),
                message: e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::test_server::answering_in_turn;
    use crate::registry::RegistrySettings;

    const V1: &str = r#"{"subject":"orders-value","version":1,"id":7,"schema":"{\"type\":\"record\",\"name\":\"O\",\"fields\":[{\"name\":\"id\",\"type\":\"string\"}]}"}"#;
    const V2: &str = r#"{"subject":"orders-value","version":2,"id":8,"schema":"{\"type\":\"record\",\"name\":\"O\",\"fields\":[{\"name\":\"id\",\"type\":\"string\"},{\"name\":\"qty\",\"type\":\"int\",\"default\":1}]}"}"#;

    fn contracts(url: &str) -> JsonContracts {
        let settings = RegistrySettings::from_env(url).unwrap_or_else(|e| panic!("{e}"));
        JsonContracts::new(RegistryClient::new(settings).unwrap_or_else(|e| panic!("{e}")))
    }

    #[tokio::test]
    async fn a_job_that_fits_is_framed_with_the_versions_id() {
        let (url, server) = answering_in_turn(vec![(200, V1)])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let c = contracts(&url);
        let e = c
            .encode("orders", None, &serde_json::json!({"id": "4711"}))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&e.bytes[..5], &[0, 0, 0, 0, 7]);
        assert_eq!((e.version, e.subject.as_str()), (1, "orders-value"));
        server.abort();
    }

    #[tokio::test]
    async fn a_miss_refreshes_the_latest_version_and_errors_name_the_field() {
        // First the cached v1, then (on the miss) v2, which knows `qty`.
        let (url, server) = answering_in_turn(vec![(200, V1), (200, V2)])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let c = contracts(&url);
        assert!(c
            .encode("orders", None, &serde_json::json!({"id": "1"}))
            .await
            .is_ok());
        // Within MISS_REFRESH: the miss is reported, naming the field.
        let err = c
            .encode("orders", None, &serde_json::json!({"id": "1", "qty": 2}))
            .await
            .err()
            .unwrap_or_else(|| panic!("v1 has no qty"));
        assert_eq!(err.field(), Some("qty"));
        assert!(!err.is_transient());
        tokio::time::sleep(MISS_REFRESH).await;
        let ok = c
            .encode("orders", None, &serde_json::json!({"id": "1", "qty": 2}))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((ok.version, ok.id), (2, 8));
        server.abort();
    }

    #[tokio::test]
    async fn an_unregistered_subject_is_permanent_and_a_dead_registry_transient() {
        let (url, server) = answering_in_turn(vec![(404, r#"{"error_code":40401}"#)])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let c = contracts(&url);
        let err = c
            .encode("nope", None, &serde_json::json!({}))
            .await
            .err()
            .unwrap_or_else(|| panic!("encoded without a subject"));
        assert!(matches!(err, JsonEncodeError::NoSubject { .. }), "{err}");
        assert!(err.to_string().contains("nope-value"), "{err}");
        server.abort();
        let c = contracts("http://127.0.0.1:9");
        let err = c
            .encode("orders", None, &serde_json::json!({}))
            .await
            .err()
            .unwrap_or_else(|| panic!("encoded without a registry"));
        assert!(err.is_transient(), "{err}");
    }
}
