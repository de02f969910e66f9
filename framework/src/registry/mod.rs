//! The schema-registry HTTP client: one `reqwest::Client` per [`Codec`]
//! (shared by every producer, worker and CLI call that uses the codec), with
//! a connect timeout, a request timeout and optional credentials.
//!
//! Why kjob talks to the registry itself rather than through
//! `schema_registry_converter`'s functions: kjob needs a handful of calls
//! (register, schema by id, versions, compatibility config), and it needs to
//! tell their outcomes apart by **HTTP status**: a 404 for an unknown id
//! dead-letters a record, while a 401, a 500 or a timeout must leave it
//! waiting for the registry. That crate reports every non-2xx other than
//! 502/503 as one "non-retriable" error (so a 401 looked like an unknown
//! schema), and its settings own a client of their own, which kjob's
//! compatibility calls could not share.
//!
//! Settings come from [`KafkaConfig::registry`] and, where that leaves
//! something unset, from the environment:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `KJOB_SCHEMA_REGISTRY_USER`, `KJOB_SCHEMA_REGISTRY_PASSWORD` | HTTP basic auth (Confluent Cloud: API key and secret) | none |
//! | `KJOB_SCHEMA_REGISTRY_TOKEN` | bearer token | none |
//! | `KJOB_SCHEMA_REGISTRY_CONNECT_TIMEOUT_MS` | TCP/TLS connect timeout | 5000 |
//! | `KJOB_SCHEMA_REGISTRY_TIMEOUT_MS` | whole-request timeout | 10000 |
//!
//! A call that times out, cannot connect or gets a 5xx is made once more
//! after 250 ms (every call kjob makes is idempotent), so a registry that
//! never answers fails a call after two request timeouts.
//!
//! Credentials are never logged: their `Debug` prints `***`, and no
//! error message includes them.
//!
//! [`Codec`]: crate::codec::Codec
//! [`KafkaConfig::registry`]: crate::KafkaConfig::registry

pub(crate) mod compatibility;
mod settings;

pub use compatibility::{Compatibility, UnknownLevel};
pub use settings::{RegistrySettings, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT};

use std::fmt;

use reqwest::{Method, StatusCode};
use serde::Deserialize;

pub use crate::config::{redact_url, RegistryAuth, RegistryOptions};
use crate::error::{Error, Result};

const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";
/// The schema-registry client. Cheap to clone: clones share one connection
/// pool.
#[derive(Clone)]
pub struct RegistryClient {
    settings: RegistrySettings,
    /// The URL as messages show it (credentials redacted).
    shown: String,
    http: reqwest::Client,
}

impl fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryClient")
            .field("url", &self.shown)
            .field("connect_timeout", &self.settings.connect_timeout)
            .field("request_timeout", &self.settings.request_timeout)
            .field(
                "auth",
                &match &self.settings.auth {
                    None => "none",
                    Some(RegistryAuth::Basic { .. }) => "basic",
                    Some(RegistryAuth::Bearer(_)) => "bearer",
                },
            )
            .finish()
    }
}

/// What the registry said to a registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registration {
    /// Registered (or found: registering an identical schema is idempotent)
    /// under this id.
    Id(u32),
    /// Refused: 409 (incompatible with the subject's level) or 422 (not a
    /// valid schema), with the registry's message.
    Refused {
        /// 409 or 422.
        status: u16,
        /// The registry's reason.
        message: String,
    },
}

/// One registered version of a subject, as
/// [`RegistryClient::subject_version`] returns it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct SubjectVersion {
    /// The schema id records written with it carry.
    pub id: u32,
    /// The version number within the subject (1, 2, ...).
    pub version: u32,
    /// The schema text.
    pub schema: String,
}

#[derive(Deserialize)]
struct SchemaBody {
    schema: String,
}

#[derive(Deserialize)]
struct IdBody {
    id: u32,
}

#[derive(Deserialize)]
struct ErrorBody {
    message: Option<String>,
}

impl RegistryClient {
    /// Builds the HTTP client. Fails only if the TLS backend cannot start.
    pub fn new(settings: RegistrySettings) -> Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(settings.connect_timeout)
            .timeout(settings.request_timeout)
            .build()
            .map_err(|e| Error::Registry {
                url: redact_url(&settings.url),
                message: format!("building the HTTP client: {e}"),
            })?;
        Ok(Self {
            shown: redact_url(&settings.url),
            settings,
            http,
        })
    }

    /// The registry base URL, as messages and logs may show it
    /// (`user:password@` redacted).
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// The resolved settings (credentials print redacted).
    pub fn settings(&self) -> &RegistrySettings {
        &self.settings
    }

    /// One call: the status and the body, or a transport error that names
    /// the URL and, for a timeout, the timeout that ran out.
    ///
    /// A call that timed out, could not connect or got a 5xx (or 429) is
    /// made once more after [`RETRY_PAUSE`]; the second answer stands. Why:
    /// a registry under load can stall one request (Apicurio's in-memory
    /// store waits out a table lock; a Confluent node fails over), and the
    /// first enqueue of a topic, which registers its contract, then failed
    /// although the registry answered a moment later. Every call kjob makes
    /// is idempotent (reads, registering the same schema, setting the same
    /// level), so the second is safe. A registry that is down for good
    /// fails the call after two request timeouts, not one.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        during: &str,
    ) -> Result<(StatusCode, String)> {
        match self
            .call_once(method.clone(), path, body.clone(), during)
            .await
        {
            Err(e) if is_transient(&e) => {}
            Ok((status, _)) if is_transient_status(status) => {}
            done => return done,
        }
        tracing::debug!(url = %self.shown, during, "schema registry call failed, trying it once more");
        tokio::time::sleep(RETRY_PAUSE).await;
        self.call_once(method, path, body, during).await
    }

    async fn call_once(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        during: &str,
    ) -> Result<(StatusCode, String)> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.settings.url))
            .header(reqwest::header::ACCEPT, CONTENT_TYPE);
        if let Some(body) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
                .body(body);
        }
        req = match &self.settings.auth {
            None => req,
            Some(RegistryAuth::Basic { user, password }) => {
                req.basic_auth(user, Some(password.expose()))
            }
            Some(RegistryAuth::Bearer(token)) => req.bearer_auth(token.expose()),
        };
        let transport = |e: reqwest::Error| self.transport_error(e, during);
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let text = resp.text().await.map_err(transport)?;
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(Error::RegistryUnauthorized {
                url: self.shown.clone(),
                status: status.as_u16(),
                during: during.to_string(),
            });
        }
        Ok((status, text))
    }

    fn transport_error(&self, e: reqwest::Error, during: &str) -> Error {
        if e.is_timeout() {
            return Error::RegistryTimeout {
                url: self.shown.clone(),
                timeout: if e.is_connect() {
                    self.settings.connect_timeout
                } else {
                    self.settings.request_timeout
                },
                during: during.to_string(),
            };
        }
        let mut message = format!("{during}: {e}");
        let mut source = std::error::Error::source(&e);
        while let Some(inner) = source {
            let text = inner.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = inner.source();
        }
        Error::Registry {
            url: self.shown.clone(),
            message,
        }
    }

    fn unexpected(&self, status: StatusCode, body: &str, during: &str) -> Error {
        Error::Registry {
            url: self.shown.clone(),
            message: format!("{during}: HTTP {status}: {}", registry_message(body)),
        }
    }

    fn parse<T: for<'de> Deserialize<'de>>(&self, body: &str, during: &str) -> Result<T> {
        serde_json::from_str(body).map_err(|e| Error::Registry {
            url: self.shown.clone(),
            message: format!("{during}: unexpected answer ({e}); is this a Confluent-compatible API base URL (for Apicurio: .../apis/ccompat/v7)?"),
        })
    }

    /// `GET /subjects`: also how kjob checks that the URL is a registry.
    pub async fn subjects(&self) -> Result<Vec<String>> {
        let during = "listing subjects";
        let (status, body) = self.call(Method::GET, "/subjects", None, during).await?;
        if !status.is_success() {
            return Err(self.unexpected(status, &body, during));
        }
        self.parse(&body, during)
    }

    /// `GET /schemas/ids/{id}`: the schema text, or `None` if the registry
    /// answers 404 (no such id).
    pub async fn schema_by_id(&self, id: u32) -> Result<Option<String>> {
        let during = format!("fetching schema id {id}");
        let (status, body) = self
            .call(Method::GET, &format!("/schemas/ids/{id}"), None, &during)
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(self.unexpected(status, &body, &during));
        }
        Ok(Some(self.parse::<SchemaBody>(&body, &during)?.schema))
    }

    /// `POST /subjects/{subject}/versions`: registers an Avro schema (or
    /// finds the identical one already registered).
    pub async fn register(&self, subject: &str, schema: &str) -> Result<Registration> {
        let during = format!("registering a schema under `{subject}`");
        let body = serde_json::json!({ "schema": schema, "schemaType": "AVRO" }).to_string();
        let (status, text) = self
            .call(
                Method::POST,
                &format!("/subjects/{subject}/versions"),
                Some(body),
                &during,
            )
            .await?;
        match status.as_u16() {
            200..=299 => Ok(Registration::Id(self.parse::<IdBody>(&text, &during)?.id)),
            409 | 422 => Ok(Registration::Refused {
                status: status.as_u16(),
                message: registry_message(&text),
            }),
            _ => Err(self.unexpected(status, &text, &during)),
        }
    }

    /// `GET /subjects/{subject}/versions`: ascending; empty when the
    /// registry answers 404 (the subject does not exist yet).
    pub async fn versions(&self, subject: &str) -> Result<Vec<u32>> {
        let during = format!("listing versions of `{subject}`");
        let (status, body) = self
            .call(
                Method::GET,
                &format!("/subjects/{subject}/versions"),
                None,
                &during,
            )
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(Vec::new());
        }
        if !status.is_success() {
            return Err(self.unexpected(status, &body, &during));
        }
        let mut versions: Vec<u32> = self.parse(&body, &during)?;
        versions.sort_unstable();
        Ok(versions)
    }

    /// `GET /subjects/{subject}/versions/{version}`: the schema text.
    pub async fn version(&self, subject: &str, version: u32) -> Result<String> {
        let during = format!("fetching `{subject}` version {version}");
        let (status, body) = self
            .call(
                Method::GET,
                &format!("/subjects/{subject}/versions/{version}"),
                None,
                &during,
            )
            .await?;
        if !status.is_success() {
            return Err(self.unexpected(status, &body, &during));
        }
        Ok(self.parse::<SchemaBody>(&body, &during)?.schema)
    }

    /// `GET /subjects/{subject}/versions/{version}` (or `.../latest` when
    /// `version` is `None`): the schema, its id and its version number, or
    /// `None` when the registry answers 404 (no such subject, or no such
    /// version). The outbox relay encodes JSON jobs against it: the id is
    /// what the record's frame carries.
    pub async fn subject_version(
        &self,
        subject: &str,
        version: Option<u32>,
    ) -> Result<Option<SubjectVersion>> {
        let which = version.map_or_else(|| "latest".to_string(), |v| v.to_string());
        let during = format!("fetching `{subject}` version {which}");
        let (status, body) = self
            .call(
                Method::GET,
                &format!("/subjects/{subject}/versions/{which}"),
                None,
                &during,
            )
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(self.unexpected(status, &body, &during));
        }
        self.parse::<SubjectVersion>(&body, &during).map(Some)
    }

    /// `GET /config/{subject}`: the subject's own level, `None` when it has
    /// none (404) or names a level kjob does not know.
    pub async fn compatibility(&self, subject: &str) -> Result<Option<Compatibility>> {
        let during = format!("reading the compatibility level of `{subject}`");
        let (status, body) = self
            .call(Method::GET, &format!("/config/{subject}"), None, &during)
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(self.unexpected(status, &body, &during));
        }
        let body: serde_json::Value = self.parse(&body, &during)?;
        let level = body
            .get("compatibilityLevel")
            .or_else(|| body.get("compatibility"))
            .and_then(|v| v.as_str());
        Ok(level.and_then(|l| l.parse().ok()))
    }

    /// `PUT /config/{subject}`: sets the subject's level. Succeeds when the
    /// subject has `level` afterwards, whoever set it.
    ///
    /// Why a conflict is not an error: Apicurio keeps a subject's level as
    /// a rule that is created once, and when two clients create it at the
    /// same moment (producers enqueueing the first job of a new topic) one
    /// of them gets `409 Conflict: A rule named 'COMPATIBILITY' already
    /// exists`. The level *is* set then, by the other client, so kjob reads
    /// it back: the one it wanted is success, another one is
    /// [`Error::CompatibilityConflict`], naming both.
    pub async fn set_compatibility(&self, subject: &str, level: Compatibility) -> Result<()> {
        let during = format!("setting the compatibility level of `{subject}` to {level}");
        let body = serde_json::json!({ "compatibility": level.to_string() }).to_string();
        let (status, text) = self
            .call(
                Method::PUT,
                &format!("/config/{subject}"),
                Some(body),
                &during,
            )
            .await?;
        if status == StatusCode::CONFLICT {
            return match self.compatibility(subject).await? {
                Some(found) if found == level => Ok(()),
                Some(found) => Err(Error::CompatibilityConflict {
                    url: self.shown.clone(),
                    subject: subject.to_string(),
                    wanted: level,
                    found,
                }),
                // Not "already set" after all (or set to a level kjob does
                // not know): the registry's own words say more.
                None => Err(self.unexpected(status, &text, &during)),
            };
        }
        if !status.is_success() {
            return Err(self.unexpected(status, &text, &during));
        }
        Ok(())
    }
}

/// The pause before a failed registry call is made again (see
/// `RegistryClient::call`).
pub(crate) const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(250);

/// A transport failure worth one more try: a timeout or a failed connect.
/// A `Registry` error that is not a timeout comes from the transport only
/// when no status was read, so it counts too; a refusal by status (401,
/// 403) does not.
fn is_transient(e: &Error) -> bool {
    matches!(e, Error::RegistryTimeout { .. } | Error::Registry { .. })
}

/// A status worth one more try: the registry is overloaded or failing over.
fn is_transient_status(status: StatusCode) -> bool {
    status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS
}

/// The registry's `message` field, or the body itself (cut to 512 bytes).
fn registry_message(body: &str) -> String {
    if let Ok(ErrorBody {
        message: Some(message),
    }) = serde_json::from_str::<ErrorBody>(body)
    {
        return message;
    }
    let mut end = body.len().min(512);
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    body[..end].trim().to_string()
}

/// A one-answer HTTP server on 127.0.0.1 for tests: every request gets
/// `status` with `body`.
#[cfg(test)]
pub(crate) mod test_server {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Starts the server; returns its base URL and the task to abort.
    pub(crate) async fn answering(
        status: u16,
        body: &'static str,
    ) -> std::io::Result<(String, tokio::task::JoinHandle<()>)> {
        answering_in_turn(vec![(status, body)]).await
    }

    /// A server that gives the n-th request the n-th answer (the last one
    /// from then on): a conversation of several calls.
    pub(crate) async fn answering_in_turn(
        answers: Vec<(u16, &'static str)>,
    ) -> std::io::Result<(String, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let mut turn = 0;
            while let Ok((mut socket, _)) = listener.accept().await {
                let Some(&(status, body)) = answers.get(turn).or(answers.last()) else {
                    return;
                };
                turn += 1;
                let mut buf = vec![0u8; 8192];
                let mut read = 0;
                while read < buf.len() {
                    match socket.read(&mut buf[read..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => read += n,
                    }
                    if buf[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let resp = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(resp.as_bytes()).await;
                let _ = socket.shutdown().await;
            }
        });
        Ok((format!("http://{addr}"), task))
    }
}

#[cfg(test)]
mod tests;
