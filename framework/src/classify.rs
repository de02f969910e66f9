//! Failure classification: what a handler says about a failed job, and the
//! class kjob records for every way a job can fail.
//!
//! The classification decides where the job goes next, so it is a closed set:
//!
//! | [`JobError`]           | meaning                               | next stop                  |
//! |------------------------|---------------------------------------|----------------------------|
//! | `Retryable`            | timeout, network, 5xx: may heal       | retried with backoff       |
//! | `RetryAfter`           | 429 / rate limit: heals after *d*     | retried no earlier than *d* |
//! | `Permanent`            | invalid input, missing record         | dead-letter topic at once  |
//!
//! A handler panic is a bug, not an error the handler chose: it is dead-lettered
//! with [`ErrorClass::Panic`] and counted separately. Records that cannot even
//! be decoded get one of the `Decode*` classes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Why a retryable failure happened. Recorded for operators; all retry alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryReason {
    /// The handler (or kjob's per-job timeout) gave up waiting.
    Timeout,
    /// A connection failed or was reset.
    Network,
    /// A downstream answered 5xx.
    Server,
    /// Any other transient condition.
    Other,
}

/// Why a permanent failure happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PermanentReason {
    /// The job's content can never be processed.
    InvalidInput,
    /// A record the job refers to does not exist.
    NotFound,
    /// Any other condition that retrying cannot fix.
    Other,
}

/// The underlying error a [`JobError`] was made from, kept so callers (a
/// layer, a test, an error reporter) can walk or downcast the chain.
///
/// An `Arc` rather than a `Box` so `JobError` stays `Clone`: the worker hands
/// the same failure to tracing, metrics and the forwarding path.
pub type ErrorSource = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// The error a handler returns. Closed and exhaustive on purpose: every
/// variant maps to exactly one routing decision, so there is no "unknown"
/// error that could be silently dropped or retried forever.
///
/// Build one with the constructors ([`JobError::server`],
/// [`JobError::not_found`], ...), with `?` on a common error type (the
/// `From` impls below pick a class: see the module docs of
/// [`crate::classify`]), or reclassify any `Result` explicitly with
/// [`ResultExt`].
///
/// Equality compares the class, the message and the retry delay, not the
/// source: two failures that route the same way and say the same thing are
/// equal, whatever error object they were made from.
#[derive(Clone, Debug)]
pub enum JobError {
    /// Transient: try again later with backoff.
    Retryable {
        /// What kind of transient failure.
        reason: RetryReason,
        /// Human-readable detail, stored (truncated) in the `kjob-error` header.
        message: String,
        /// The error this was made from, if any.
        source: Option<ErrorSource>,
    },
    /// Transient with a known wait (HTTP 429 `Retry-After`, a rate limit). The
    /// duration is honoured as a lower bound: kjob never retries sooner.
    RetryAfter {
        /// Minimum time before the next attempt.
        after: Duration,
        /// Human-readable detail.
        message: String,
        /// The error this was made from, if any.
        source: Option<ErrorSource>,
    },
    /// Will never succeed: dead-letter at once, without retry traffic.
    Permanent {
        /// What kind of permanent failure.
        reason: PermanentReason,
        /// Human-readable detail.
        message: String,
        /// The error this was made from, if any.
        source: Option<ErrorSource>,
    },
}

impl PartialEq for JobError {
    fn eq(&self, other: &Self) -> bool {
        self.class() == other.class()
            && self.message() == other.message()
            && self.retry_after_hint() == other.retry_after_hint()
    }
}

impl Eq for JobError {}

impl JobError {
    fn retry(reason: RetryReason, message: impl Into<String>) -> Self {
        JobError::Retryable {
            reason,
            message: message.into(),
            source: None,
        }
    }
    fn perm(reason: PermanentReason, message: impl Into<String>) -> Self {
        JobError::Permanent {
            reason,
            message: message.into(),
            source: None,
        }
    }

    /// A transient failure of unspecified kind.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self::retry(RetryReason::Other, message)
    }
    /// The downstream did not answer in time.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::retry(RetryReason::Timeout, message)
    }
    /// A connection-level failure.
    pub fn network(message: impl Into<String>) -> Self {
        Self::retry(RetryReason::Network, message)
    }
    /// A 5xx from a downstream.
    pub fn server(message: impl Into<String>) -> Self {
        Self::retry(RetryReason::Server, message)
    }
    /// Retry no earlier than `after` (a 429, a rate limit).
    pub fn retry_after(after: Duration, message: impl Into<String>) -> Self {
        JobError::RetryAfter {
            after,
            message: message.into(),
            source: None,
        }
    }
    /// A failure retrying cannot fix.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::perm(PermanentReason::Other, message)
    }
    /// The job's content is invalid.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::perm(PermanentReason::InvalidInput, message)
    }
    /// A record the job refers to does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::perm(PermanentReason::NotFound, message)
    }

    /// Attaches the error this failure was made from. The class and message
    /// stay as they are; the source is only for callers that walk or
    /// downcast the chain ([`std::error::Error::source`]).
    pub fn with_source<E>(mut self, error: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let new: ErrorSource = Arc::new(error);
        match &mut self {
            JobError::Retryable { source, .. }
            | JobError::RetryAfter { source, .. }
            | JobError::Permanent { source, .. } => *source = Some(new),
        }
        self
    }

    /// The class recorded in headers and metrics for this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            JobError::Retryable { reason, .. } => match reason {
                RetryReason::Timeout => ErrorClass::RetryableTimeout,
                RetryReason::Network => ErrorClass::RetryableNetwork,
                RetryReason::Server => ErrorClass::RetryableServer,
                RetryReason::Other => ErrorClass::Retryable,
            },
            JobError::RetryAfter { .. } => ErrorClass::RetryAfter,
            JobError::Permanent { reason, .. } => match reason {
                PermanentReason::InvalidInput => ErrorClass::PermanentInvalidInput,
                PermanentReason::NotFound => ErrorClass::PermanentNotFound,
                PermanentReason::Other => ErrorClass::Permanent,
            },
        }
    }

    /// The human-readable detail. For an error made with `?` or
    /// [`ResultExt`], this is the whole `Display` chain of the original
    /// error (`outer: inner: root`), because it is what an operator reads in
    /// the `kjob-error` header of a dead letter.
    pub fn message(&self) -> &str {
        match self {
            JobError::Retryable { message, .. }
            | JobError::RetryAfter { message, .. }
            | JobError::Permanent { message, .. } => message,
        }
    }

    /// The minimum wait of a [`JobError::RetryAfter`], `None` otherwise.
    pub fn retry_after_hint(&self) -> Option<Duration> {
        match self {
            JobError::RetryAfter { after, .. } => Some(*after),
            _ => None,
        }
    }

    /// Whether another attempt may heal this failure.
    pub fn is_retryable(&self) -> bool {
        self.class().is_retryable()
    }

    /// Builds `class` from any error, keeping it as the source. A `JobError`
    /// passed in is unwrapped first (its message and source are reused), so
    /// reclassifying never nests one `JobError` inside another.
    fn from_error<E>(error: E, make: impl FnOnce(String) -> JobError) -> JobError
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let any: Box<dyn std::any::Any> = Box::new(error);
        match any.downcast::<JobError>() {
            Ok(job) => {
                let source = job.source_arc();
                let mut out = make(job.message().to_string());
                if let Some(s) = source {
                    out.set_source(s);
                }
                out
            }
            Err(any) => match any.downcast::<E>() {
                Ok(e) => {
                    let mut out = make(chain(&*e));
                    out.set_source(Arc::new(*e));
                    out
                }
                // Unreachable: the box holds an `E`. Keep the class anyway.
                Err(_) => make(String::from("error")),
            },
        }
    }

    fn source_arc(&self) -> Option<ErrorSource> {
        match self {
            JobError::Retryable { source, .. }
            | JobError::RetryAfter { source, .. }
            | JobError::Permanent { source, .. } => source.clone(),
        }
    }

    fn set_source(&mut self, new: ErrorSource) {
        match self {
            JobError::Retryable { source, .. }
            | JobError::RetryAfter { source, .. }
            | JobError::Permanent { source, .. } => *source = Some(new),
        }
    }
}

/// `outer: inner: root`, without repeating a cause whose text the outer
/// message already contains (many libraries print their source too).
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut next = error.source();
    while let Some(inner) = next {
        let text = inner.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = inner.source();
    }
    out
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.class(), self.message())
    }
}

impl std::error::Error for JobError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JobError::Retryable { source, .. }
            | JobError::RetryAfter { source, .. }
            | JobError::Permanent { source, .. } => source
                .as_deref()
                .map(|e| e as &(dyn std::error::Error + 'static)),
        }
    }
}

/// Explicit reclassification of any error, for the cases the `From` impls
/// guess wrong: `store.load(id).await.not_found()?` turns a lookup failure
/// into a dead letter instead of a retry.
///
/// Each method keeps the original error as the [`JobError`]'s source and its
/// `Display` chain as the message.
pub trait ResultExt<T> {
    /// Dead-letter at once ([`PermanentReason::Other`]).
    fn permanent(self) -> Result<T, JobError>;
    /// The job's content is invalid ([`PermanentReason::InvalidInput`]).
    fn invalid_input(self) -> Result<T, JobError>;
    /// A record the job refers to is missing ([`PermanentReason::NotFound`]).
    fn not_found(self) -> Result<T, JobError>;
    /// Retry with backoff ([`RetryReason::Other`]).
    fn retryable(self) -> Result<T, JobError>;
    /// Retry with backoff, recorded as a timeout.
    fn timeout(self) -> Result<T, JobError>;
    /// Retry with backoff, recorded as a connection failure.
    fn network(self) -> Result<T, JobError>;
    /// Retry with backoff, recorded as a downstream 5xx.
    fn server(self) -> Result<T, JobError>;
    /// Retry no earlier than `after`.
    fn retry_after(self, after: Duration) -> Result<T, JobError>;
}

impl<T, E> ResultExt<T> for Result<T, E>
where
    E: std::error::Error + Send + Sync + 'static,
{
    fn permanent(self) -> Result<T, JobError> {
        self.map_err(|e| JobError::from_error(e, JobError::permanent))
    }
    fn invalid_input(self) -> Result<T, JobError> {
        self.map_err(|e| JobError::from_error(e, JobError::invalid_input))
    }
    fn not_found(self) -> Result<T, JobError> {
        self.map_err(|e| JobError::from_error(e, JobError::not_found))
    }
    fn retryable(self) -> Result<T, JobError> {
        self.map_err(|e| JobError::from_error(e, JobError::retryable))
    }
    fn timeout(self) -> Result<T, JobError> {
        self.map_err(|e| JobError::from_error(e, JobError::timeout))
    }
    fn network(self) -> Result<T, JobError> {
        self.map_err(|e| JobError::from_error(e, JobError::network))
    }
    fn server(self) -> Result<T, JobError> {
        self.map_err(|e| JobError::from_error(e, JobError::server))
    }
    fn retry_after(self, after: Duration) -> Result<T, JobError> {
        self.map_err(|e| JobError::from_error(e, |m| JobError::retry_after(after, m)))
    }
}

/// Turns a missing value into a classified failure: `store.find(id).await?
/// .or_not_found(format!("order {id}"))?`.
pub trait OptionExt<T> {
    /// `None` becomes [`JobError::not_found`] with `what` as the message.
    fn or_not_found(self, what: impl Into<String>) -> Result<T, JobError>;
    /// `None` becomes [`JobError::invalid_input`] with `what` as the message.
    fn or_invalid_input(self, what: impl Into<String>) -> Result<T, JobError>;
}

impl<T> OptionExt<T> for Option<T> {
    fn or_not_found(self, what: impl Into<String>) -> Result<T, JobError> {
        self.ok_or_else(|| JobError::not_found(what))
    }
    fn or_invalid_input(self, what: impl Into<String>) -> Result<T, JobError> {
        self.ok_or_else(|| JobError::invalid_input(what))
    }
}

/// I/O failures are transient by default: a reset connection or a full
/// disk may heal. Connection-level kinds are recorded as network failures,
/// `TimedOut` as a timeout. Reclassify with [`ResultExt`] where an I/O error
/// means the job itself is bad (a missing input file, say).
impl From<std::io::Error> for JobError {
    fn from(e: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        let make = match e.kind() {
            K::TimedOut => JobError::timeout,
            K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::NotConnected
            | K::AddrInUse
            | K::AddrNotAvailable
            | K::BrokenPipe
            | K::UnexpectedEof
            | K::HostUnreachable
            | K::NetworkUnreachable
            | K::NetworkDown => JobError::network,
            _ => JobError::retryable,
        };
        JobError::from_error(e, make)
    }
}

/// A `tokio::time::timeout` around a call ran out: recorded as a timeout and
/// retried.
impl From<tokio::time::error::Elapsed> for JobError {
    fn from(e: tokio::time::error::Elapsed) -> Self {
        JobError::from_error(e, JobError::timeout)
    }
}

/// JSON that does not parse or does not fit the type is bad input and will
/// not get better: dead-lettered as `permanent.invalid_input`. The one
/// exception is an I/O failure while reading the JSON, which is retried.
impl From<serde_json::Error> for JobError {
    fn from(e: serde_json::Error) -> Self {
        let make = if e.is_io() {
            JobError::network
        } else {
            JobError::invalid_input
        };
        JobError::from_error(e, make)
    }
}

/// kjob's own errors, for handlers that enqueue follow-up jobs: a record the
/// broker refused for good ([`crate::Error::is_permanent`]) or a contract
/// that does not fit is permanent; everything else (an unreachable broker or
/// registry) is retried.
impl From<crate::Error> for JobError {
    fn from(e: crate::Error) -> Self {
        use crate::Error as E;
        let make = match &e {
            E::Rejected { .. } | E::Contract { .. } | E::Encode { .. } => JobError::permanent,
            E::Delivery { .. } | E::Registry { .. } | E::RegistryTimeout { .. } => {
                JobError::network
            }
            _ => JobError::retryable,
        };
        JobError::from_error(e, make)
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::JobError;

    /// The class for a PostgreSQL SQLSTATE (`None`: no server error, i.e.
    /// the connection failed or closed).
    pub(super) fn for_sqlstate(code: Option<&str>) -> fn(String) -> JobError {
        let Some(code) = code else {
            return JobError::network;
        };
        match code.get(..2) {
            // data_exception: a value the job carries does not fit.
            Some("22") => JobError::invalid_input,
            // integrity_constraint_violation: a unique key, a foreign key,
            // a check: the same statement will fail the same way.
            Some("23") => JobError::permanent,
            // connection_exception, operator intervention (shutdown),
            // insufficient resources: the server or the link.
            Some("08") | Some("57") | Some("53") => {
                if code == "57014" {
                    // query_canceled, e.g. by statement_timeout.
                    JobError::timeout
                } else {
                    JobError::network
                }
            }
            // Serialization failures, deadlocks and everything else: retry.
            _ => JobError::retryable,
        }
    }

    /// A database failure is retried (the database restarts, a deadlock
    /// clears) unless PostgreSQL says the *data* is wrong: SQLSTATE class 22
    /// (data exception) is `permanent.invalid_input`, class 23 (a constraint
    /// violated) is `permanent`. A lost connection is a network failure.
    impl From<tokio_postgres::Error> for JobError {
        fn from(e: tokio_postgres::Error) -> Self {
            let make = for_sqlstate(e.code().map(|c| c.code()));
            JobError::from_error(e, make)
        }
    }
}

/// Default wait for a 429 that says nothing about when to come back.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(30);

/// How a failed HTTP status is classified, `None` for 1xx-3xx.
fn status_class(
    status: u16,
    retry_after: Option<Duration>,
) -> Option<impl FnOnce(String) -> JobError> {
    if !(400..=599).contains(&status) {
        return None;
    }
    Some(move |message: String| match status {
        429 => JobError::retry_after(retry_after.unwrap_or(DEFAULT_RETRY_AFTER), message),
        408 => JobError::timeout(message),
        500..=599 => JobError::server(message),
        404 | 410 => JobError::not_found(message),
        400 | 422 => JobError::invalid_input(message),
        _ => JobError::permanent(message),
    })
}

/// The class for an HTTP status from a downstream, `None` for a success.
///
/// | status | class |
/// |---|---|
/// | 429 | `retry_after` (the `Retry-After` header, else [`DEFAULT_RETRY_AFTER`]) |
/// | 408 | `retryable.timeout` |
/// | 5xx | `retryable.server` |
/// | 404, 410 | `permanent.not_found` |
/// | 400, 422 | `permanent.invalid_input` |
/// | other 4xx | `permanent` |
pub fn for_http_status(
    status: u16,
    retry_after: Option<Duration>,
    message: impl Into<String>,
) -> Option<JobError> {
    status_class(status, retry_after).map(|make| make(message.into()))
}

/// Parses a `Retry-After` value: delta-seconds or an HTTP date (a date in
/// the past means "now", i.e. zero).
pub fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `reqwest` errors, classified by what went wrong:
///
/// * a status (from `error_for_status`): see [`for_http_status`]; a 429
///   waits [`DEFAULT_RETRY_AFTER`], because the error no longer carries the
///   response's headers: use [`ResponseExt::classify_status`] on the
///   response to honour `Retry-After`;
/// * a timeout: `retryable.timeout`; a connection failure:
///   `retryable.network`;
/// * a request that cannot even be built (a malformed URL from the job's
///   data): `permanent.invalid_input`;
/// * anything else (a body cut off, a response that does not decode):
///   `retryable`.
///
/// The impl is for the `reqwest` version kjob depends on (0.13); a handler
/// crate on another major version gets no `From` and uses [`ResultExt`].
impl From<reqwest::Error> for JobError {
    fn from(e: reqwest::Error) -> Self {
        if let Some(make) = e.status().and_then(|s| status_class(s.as_u16(), None)) {
            return JobError::from_error(e, make);
        }
        let make = if e.is_timeout() {
            JobError::timeout
        } else if e.is_connect() {
            JobError::network
        } else if e.is_builder() {
            JobError::invalid_input
        } else if e.is_request() {
            JobError::network
        } else {
            JobError::retryable
        };
        JobError::from_error(e, make)
    }
}

/// Classifies an HTTP response by its status, honouring `Retry-After`:
///
/// ```no_run
/// # async fn f(client: reqwest::Client) -> Result<(), kjob::JobError> {
/// use kjob::prelude::*;
/// let resp = client.post("https://crm.example/api/sync").send().await?.classify_status()?;
/// # let _ = resp; Ok(()) }
/// ```
pub trait ResponseExt: Sized {
    /// `Ok(self)` for a 1xx-3xx response, else the [`JobError`] for the
    /// status ([`for_http_status`]), naming the URL.
    fn classify_status(self) -> Result<Self, JobError>;
}

impl ResponseExt for reqwest::Response {
    fn classify_status(self) -> Result<Self, JobError> {
        let status = self.status();
        let retry_after = self
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
        let message = format!("HTTP {status} from {}", self.url());
        match for_http_status(status.as_u16(), retry_after, message) {
            Some(e) => Err(e),
            None => Ok(self),
        }
    }
}

/// Every way a job can fail, as recorded in the `kjob-error-class` header and
/// the metrics. The string forms are stable: dashboards and `kjob dlq list
/// --class` filter on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// [`JobError::Retryable`] with [`RetryReason::Timeout`], or a handler
    /// that exceeded its per-job timeout.
    RetryableTimeout,
    /// [`JobError::Retryable`] with [`RetryReason::Network`].
    RetryableNetwork,
    /// [`JobError::Retryable`] with [`RetryReason::Server`].
    RetryableServer,
    /// [`JobError::Retryable`] with [`RetryReason::Other`].
    Retryable,
    /// [`JobError::RetryAfter`].
    RetryAfter,
    /// [`JobError::Permanent`] with [`PermanentReason::InvalidInput`].
    PermanentInvalidInput,
    /// [`JobError::Permanent`] with [`PermanentReason::NotFound`].
    PermanentNotFound,
    /// [`JobError::Permanent`] with [`PermanentReason::Other`].
    Permanent,
    /// The handler panicked: a bug in the handler, not a property of the job.
    Panic,
    /// A retryable failure that used up its attempts.
    RetriesExhausted,
    /// The record is not in the Confluent wire format (empty, too short, or
    /// a magic byte other than 0).
    DecodeNotFramed,
    /// The record names a schema id the registry does not know.
    DecodeUnknownSchema,
    /// The Avro body is truncated or corrupt for its writer schema.
    DecodeBody,
    /// The writer schema cannot be resolved to this binary's reader schema.
    DecodeIncompatible,
    /// The broker refused to take the record where kjob had to forward it
    /// (too large for the target topic, not authorized, invalid): the DLQ
    /// holds an envelope with every header and the coordinates where the
    /// original can still be read, but not the payload.
    ForwardRejected,
}

impl ErrorClass {
    /// The stable string used in headers, metrics and CLI filters.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::RetryableTimeout => "retryable.timeout",
            ErrorClass::RetryableNetwork => "retryable.network",
            ErrorClass::RetryableServer => "retryable.server",
            ErrorClass::Retryable => "retryable",
            ErrorClass::RetryAfter => "retry_after",
            ErrorClass::PermanentInvalidInput => "permanent.invalid_input",
            ErrorClass::PermanentNotFound => "permanent.not_found",
            ErrorClass::Permanent => "permanent",
            ErrorClass::Panic => "bug.panic",
            ErrorClass::RetriesExhausted => "retries_exhausted",
            ErrorClass::DecodeNotFramed => "decode.not_framed",
            ErrorClass::DecodeUnknownSchema => "decode.unknown_schema",
            ErrorClass::DecodeBody => "decode.body",
            ErrorClass::DecodeIncompatible => "decode.incompatible",
            ErrorClass::ForwardRejected => "forward.rejected",
        }
    }

    /// Whether a failure of this class is worth another attempt.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorClass::RetryableTimeout
                | ErrorClass::RetryableNetwork
                | ErrorClass::RetryableServer
                | ErrorClass::Retryable
                | ErrorClass::RetryAfter
        )
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_route_as_documented() {
        assert!(JobError::server("503").class().is_retryable());
        assert!(JobError::retry_after(Duration::from_secs(3), "429")
            .class()
            .is_retryable());
        assert!(!JobError::not_found("order 7").class().is_retryable());
        assert!(!ErrorClass::Panic.is_retryable());
        assert!(!ErrorClass::DecodeUnknownSchema.is_retryable());
        assert_eq!(JobError::timeout("x").class().as_str(), "retryable.timeout");
        assert_eq!(
            JobError::invalid_input("x").to_string(),
            "permanent.invalid_input: x"
        );
    }
}
