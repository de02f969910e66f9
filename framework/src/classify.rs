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
//! be decoded get one of the `Decode*` classes, and JSON jobs enqueued from
//! SQL that the outbox relay cannot encode get [`ErrorClass::OutboxEncode`].
//!
//! ## `?` in handlers
//!
//! `JobError` converts from the errors handlers meet most, so `?` works and
//! picks a sensible class; the original error stays reachable through
//! [`std::error::Error::source`], and its `Display` chain becomes the message:
//!
//! | error | class |
//! |---|---|
//! | `std::io::Error` | `retryable.network` (connection kinds), `retryable.timeout` (`TimedOut`), else `retryable` |
//! | `tokio::time::error::Elapsed` | `retryable.timeout` |
//! | `serde_json::Error` | `permanent.invalid_input` (an I/O error while reading: `retryable.network`) |
//! | `tokio_postgres::Error` (feature `postgres`) | SQLSTATE 22: `permanent.invalid_input`; 23: `permanent`; 57014: `retryable.timeout`; no answer, 08, 53, 57: `retryable.network`; else `retryable` |
//! | `reqwest::Error` | by status ([`for_http_status`]), else timeout, network, or a bad URL: `permanent.invalid_input` |
//! | [`crate::Error`] | `permanent` for a refused record or a contract that does not fit, else retried |
//!
//! Where the default is wrong for a handler, [`ResultExt`] reclassifies
//! (`.permanent()`, `.not_found()`, `.retry_after(d)`, ...), [`OptionExt`]
//! turns a missing row into `permanent.not_found`, and
//! [`ResponseExt::classify_status`] classifies an HTTP response honouring
//! its `Retry-After`.

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
/// `From` impls pick a class: see the table in the [module
/// docs](crate::classify)), or reclassify any `Result` explicitly with
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

    /// A constructor for this error's class (and wait), for a new message.
    fn same_class(&self) -> Make {
        match self {
            JobError::Retryable { reason, .. } => {
                let reason = *reason;
                Box::new(move |m| JobError::retry(reason, m))
            }
            JobError::RetryAfter { after, .. } => {
                let after = *after;
                Box::new(move |m| JobError::retry_after(after, m))
            }
            JobError::Permanent { reason, .. } => {
                let reason = *reason;
                Box::new(move |m| JobError::perm(reason, m))
            }
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
        let make = io_class(&e);
        JobError::from_error(e, make)
    }
}

/// A class constructor: takes the message, returns the classified error.
type Make = Box<dyn FnOnce(String) -> JobError>;

fn io_class(e: &std::io::Error) -> fn(String) -> JobError {
    use std::io::ErrorKind as K;
    match e.kind() {
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
        let make = json_class(&e);
        JobError::from_error(e, make)
    }
}

fn json_class(e: &serde_json::Error) -> fn(String) -> JobError {
    if e.is_io() {
        JobError::network
    } else {
        JobError::invalid_input
    }
}

/// kjob's own errors, for handlers that enqueue follow-up jobs: a record the
/// broker refused for good ([`crate::Error::is_permanent`]) or a contract
/// that does not fit is permanent; everything else (an unreachable broker or
/// registry) is retried.
impl From<crate::Error> for JobError {
    fn from(e: crate::Error) -> Self {
        let make = kjob_class(&e);
        JobError::from_error(e, make)
    }
}

fn kjob_class(e: &crate::Error) -> fn(String) -> JobError {
    use crate::Error as E;
    match e {
        E::Rejected { .. } | E::Contract { .. } | E::Encode { .. } => JobError::permanent,
        E::Delivery { .. } | E::Registry { .. } | E::RegistryTimeout { .. } => JobError::network,
        _ => JobError::retryable,
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
            let make = pg_class(&e);
            JobError::from_error(e, make)
        }
    }

    pub(super) fn pg_class(e: &tokio_postgres::Error) -> fn(String) -> JobError {
        for_sqlstate(e.code().map(|c| c.code()))
    }
}

/// `anyhow::Error`, the usual error type of application code (a store
/// trait returning `anyhow::Result`): classified by the first error in its
/// chain that kjob knows (a `JobError`, an I/O, `Elapsed`, JSON, `reqwest`,
/// PostgreSQL or kjob error, each as above), else `retryable`. The message
/// is the whole chain, `.context(..)` included.
///
/// (`ResultExt` cannot cover `anyhow::Result`, because `anyhow::Error` is
/// not a `std::error::Error`; reclassify with `.map_err(JobError::from)`
/// and a constructor, or `?` for the default.)
impl From<anyhow::Error> for JobError {
    fn from(e: anyhow::Error) -> Self {
        let make = anyhow_class(&e);
        let message = format!("{e:#}");
        let source: Box<dyn std::error::Error + Send + Sync + 'static> = e.into();
        let mut out = make(message);
        out.set_source(Arc::from(source));
        out
    }
}

fn anyhow_class(e: &anyhow::Error) -> Make {
    for cause in e.chain() {
        if let Some(j) = cause.downcast_ref::<JobError>() {
            return j.same_class();
        }
        if let Some(x) = cause.downcast_ref::<std::io::Error>() {
            return Box::new(io_class(x));
        }
        if cause.is::<tokio::time::error::Elapsed>() {
            return Box::new(|m: String| JobError::timeout(m));
        }
        if let Some(x) = cause.downcast_ref::<serde_json::Error>() {
            return Box::new(json_class(x));
        }
        if let Some(x) = cause.downcast_ref::<reqwest::Error>() {
            return reqwest_class(x);
        }
        if let Some(x) = cause.downcast_ref::<crate::Error>() {
            return Box::new(kjob_class(x));
        }
        #[cfg(feature = "postgres")]
        if let Some(x) = cause.downcast_ref::<tokio_postgres::Error>() {
            return Box::new(postgres::pg_class(x));
        }
    }
    Box::new(|m: String| JobError::retryable(m))
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
        let make = reqwest_class(&e);
        JobError::from_error(e, make)
    }
}

fn reqwest_class(e: &reqwest::Error) -> Make {
    if let Some(make) = e.status().and_then(|s| status_class(s.as_u16(), None)) {
        return Box::new(make);
    }
    Box::new(if e.is_timeout() {
        JobError::timeout
    } else if e.is_connect() {
        JobError::network
    } else if e.is_builder() {
        JobError::invalid_input
    } else if e.is_request() {
        JobError::network
    } else {
        JobError::retryable
    })
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
    /// A job enqueued from SQL (`kjob.enqueue`) as JSON that the outbox
    /// relay could not encode against its topic's registered contract (a
    /// missing field, a wrong type, no schema registered under the
    /// subject). The dead letter holds the JSON as written, and
    /// `kjob dlq retry` encodes it again against the latest version (see
    /// the `kjob::outbox` module, feature `postgres`).
    OutboxEncode,
}

impl ErrorClass {
    /// Every class, for tools that list or check them (`kjob dlq list
    /// --class` refuses a class that is none of these nor their families).
    pub const ALL: [ErrorClass; 16] = [
        ErrorClass::RetryableTimeout,
        ErrorClass::RetryableNetwork,
        ErrorClass::RetryableServer,
        ErrorClass::Retryable,
        ErrorClass::RetryAfter,
        ErrorClass::PermanentInvalidInput,
        ErrorClass::PermanentNotFound,
        ErrorClass::Permanent,
        ErrorClass::Panic,
        ErrorClass::RetriesExhausted,
        ErrorClass::DecodeNotFramed,
        ErrorClass::DecodeUnknownSchema,
        ErrorClass::DecodeBody,
        ErrorClass::DecodeIncompatible,
        ErrorClass::ForwardRejected,
        ErrorClass::OutboxEncode,
    ];

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
            ErrorClass::OutboxEncode => "outbox.encode",
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

    use std::error::Error as _;
    use std::io;

    fn class_of(e: impl Into<JobError>) -> ErrorClass {
        e.into().class()
    }

    #[test]
    fn io_errors_retry_and_say_why() {
        assert_eq!(
            class_of(io::Error::from(io::ErrorKind::ConnectionRefused)),
            ErrorClass::RetryableNetwork
        );
        assert_eq!(
            class_of(io::Error::from(io::ErrorKind::ConnectionReset)),
            ErrorClass::RetryableNetwork
        );
        assert_eq!(
            class_of(io::Error::from(io::ErrorKind::TimedOut)),
            ErrorClass::RetryableTimeout
        );
        assert_eq!(
            class_of(io::Error::from(io::ErrorKind::PermissionDenied)),
            ErrorClass::Retryable
        );
        let e = JobError::from(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "peer hung up",
        ));
        assert_eq!(e.message(), "peer hung up");
        let source = e.source().and_then(|s| s.downcast_ref::<io::Error>());
        assert_eq!(
            source.map(io::Error::kind),
            Some(io::ErrorKind::ConnectionReset)
        );
    }

    #[derive(Debug)]
    struct Outer(io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("loading order 7")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn the_message_carries_the_whole_chain() {
        let e: Result<(), _> = Err(Outer(io::Error::other("disk on fire")));
        let e = e.permanent().err();
        assert_eq!(
            e.as_ref().map(JobError::message),
            Some("loading order 7: disk on fire")
        );
        assert!(e
            .as_ref()
            .and_then(|e| e.source())
            .is_some_and(|s| s.is::<Outer>()));
    }

    #[tokio::test]
    async fn an_elapsed_timeout_is_a_timeout() {
        let elapsed = tokio::time::timeout(Duration::ZERO, std::future::pending::<()>()).await;
        let e = elapsed.map_err(JobError::from).err();
        assert_eq!(e.map(|e| e.class()), Some(ErrorClass::RetryableTimeout));
    }

    #[test]
    fn bad_json_is_invalid_input() {
        let parsed = serde_json::from_str::<u32>("{\"not\": 7}").map_err(JobError::from);
        let e = parsed.err();
        assert_eq!(
            e.as_ref().map(|e| e.class()),
            Some(ErrorClass::PermanentInvalidInput)
        );
        assert!(e.is_some_and(|e| e.message().contains("expected u32")));
    }

    #[test]
    fn result_ext_reclassifies_and_keeps_the_source() {
        let io_err = || Err::<(), _>(io::Error::from(io::ErrorKind::ConnectionRefused));
        let cases: [(Result<(), JobError>, ErrorClass); 7] = [
            (io_err().permanent(), ErrorClass::Permanent),
            (io_err().invalid_input(), ErrorClass::PermanentInvalidInput),
            (io_err().not_found(), ErrorClass::PermanentNotFound),
            (io_err().retryable(), ErrorClass::Retryable),
            (io_err().timeout(), ErrorClass::RetryableTimeout),
            (io_err().server(), ErrorClass::RetryableServer),
            (
                io_err().retry_after(Duration::from_secs(9)),
                ErrorClass::RetryAfter,
            ),
        ];
        for (got, class) in cases {
            let e = got.err();
            assert_eq!(e.as_ref().map(JobError::class), Some(class));
            assert!(e.and_then(|e| e.source().map(|s| s.is::<io::Error>())) == Some(true));
        }
        let after = io_err().retry_after(Duration::from_secs(9)).err();
        assert_eq!(
            after.and_then(|e| e.retry_after_hint()),
            Some(Duration::from_secs(9))
        );
    }

    #[test]
    fn reclassifying_a_job_error_does_not_nest_it() {
        let first = JobError::from(io::Error::new(io::ErrorKind::ConnectionReset, "reset"));
        let again = Err::<(), _>(first).not_found().err();
        assert_eq!(again.as_ref().map(JobError::message), Some("reset"));
        assert_eq!(
            again.as_ref().map(JobError::class),
            Some(ErrorClass::PermanentNotFound)
        );
        assert!(again.and_then(|e| e.source().map(|s| s.is::<io::Error>())) == Some(true));
    }

    #[test]
    fn anyhow_errors_take_the_class_of_what_they_wrap() {
        use anyhow::Context as _;
        let io: anyhow::Result<()> =
            Err(io::Error::from(io::ErrorKind::ConnectionRefused)).context("loading order 7");
        let e = io.map_err(JobError::from).err();
        assert_eq!(
            e.as_ref().map(JobError::class),
            Some(ErrorClass::RetryableNetwork)
        );
        let message = e
            .as_ref()
            .map(|e| e.message().to_string())
            .unwrap_or_default();
        assert!(message.starts_with("loading order 7: "), "{message}");
        assert!(e.and_then(|e| e.source().map(|_| ())).is_some());

        let json = serde_json::from_str::<u32>("x").map_err(anyhow::Error::from);
        let e = json.map_err(JobError::from).err();
        assert_eq!(
            e.map(|e| e.class()),
            Some(ErrorClass::PermanentInvalidInput)
        );

        let inner: anyhow::Result<()> =
            Err(JobError::retry_after(Duration::from_secs(4), "429")).context("calling the CRM");
        let e = inner.map_err(JobError::from).err();
        assert_eq!(
            e.as_ref().and_then(JobError::retry_after_hint),
            Some(Duration::from_secs(4))
        );

        let plain = JobError::from(anyhow::anyhow!("something odd"));
        assert_eq!(plain.class(), ErrorClass::Retryable);
        assert_eq!(plain.message(), "something odd");
    }

    #[test]
    fn option_ext_names_what_is_missing() {
        let e = None::<u32>.or_not_found("order 7").err();
        assert_eq!(e, Some(JobError::not_found("order 7")));
        let e = None::<u32>.or_invalid_input("no email").err();
        assert_eq!(
            e.map(|e| e.class()),
            Some(ErrorClass::PermanentInvalidInput)
        );
    }

    #[test]
    fn equality_ignores_the_source_and_clone_keeps_it() {
        let with = JobError::server("503").with_source(io::Error::other("x"));
        assert_eq!(with, JobError::server("503"));
        assert_ne!(with, JobError::timeout("503"));
        assert_ne!(
            JobError::retry_after(Duration::from_secs(1), "429"),
            JobError::retry_after(Duration::from_secs(2), "429")
        );
        assert!(with.clone().source().is_some());
    }

    #[test]
    fn kjob_errors_map_by_permanence() {
        let rejected = crate::Error::Rejected {
            topic: "t".into(),
            reason: "record too large",
            message: "m".into(),
            hint: "h",
        };
        assert_eq!(class_of(rejected), ErrorClass::Permanent);
        let delivery = crate::Error::Delivery {
            topic: "t".into(),
            timeout: Duration::from_secs(1),
            bootstrap: "b".into(),
            message: "m".into(),
        };
        assert_eq!(class_of(delivery), ErrorClass::RetryableNetwork);
        assert_eq!(class_of(crate::Error::NoHandlers), ErrorClass::Retryable);
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_data_and_constraint_errors_are_permanent() {
        use super::postgres::for_sqlstate;
        let class = |code: Option<&str>| for_sqlstate(code)(String::new()).class();
        assert_eq!(
            class(Some("23505")),
            ErrorClass::Permanent,
            "unique_violation"
        );
        assert_eq!(
            class(Some("23503")),
            ErrorClass::Permanent,
            "foreign_key_violation"
        );
        assert_eq!(
            class(Some("22P02")),
            ErrorClass::PermanentInvalidInput,
            "bad text repr"
        );
        assert_eq!(
            class(Some("22001")),
            ErrorClass::PermanentInvalidInput,
            "too long"
        );
        assert_eq!(
            class(Some("40001")),
            ErrorClass::Retryable,
            "serialization_failure"
        );
        assert_eq!(class(Some("40P01")), ErrorClass::Retryable, "deadlock");
        assert_eq!(
            class(Some("57P01")),
            ErrorClass::RetryableNetwork,
            "admin_shutdown"
        );
        assert_eq!(
            class(Some("57014")),
            ErrorClass::RetryableTimeout,
            "query_canceled"
        );
        assert_eq!(class(Some("08006")), ErrorClass::RetryableNetwork);
        assert_eq!(
            class(None),
            ErrorClass::RetryableNetwork,
            "no server answer"
        );
        let timeout = JobError::from(tokio_postgres::Error::__private_api_timeout());
        assert_eq!(timeout.class(), ErrorClass::RetryableNetwork);
        assert!(timeout
            .source()
            .is_some_and(|s| s.is::<tokio_postgres::Error>()));
    }

    fn response(status: u16, retry_after: Option<&str>) -> reqwest::Response {
        let mut b = http::Response::builder().status(status);
        if let Some(v) = retry_after {
            b = b.header("retry-after", v);
        }
        let built = b.body(String::new());
        assert!(built.is_ok(), "test response for {status}");
        reqwest::Response::from(built.unwrap_or_default())
    }

    #[test]
    fn http_statuses_map_as_documented() {
        let expect = [
            (429, ErrorClass::RetryAfter),
            (408, ErrorClass::RetryableTimeout),
            (500, ErrorClass::RetryableServer),
            (503, ErrorClass::RetryableServer),
            (404, ErrorClass::PermanentNotFound),
            (410, ErrorClass::PermanentNotFound),
            (400, ErrorClass::PermanentInvalidInput),
            (422, ErrorClass::PermanentInvalidInput),
            (401, ErrorClass::Permanent),
            (409, ErrorClass::Permanent),
        ];
        for (status, class) in expect {
            // Through `?` on `error_for_status()`...
            let via_from = response(status, None)
                .error_for_status()
                .map_err(JobError::from);
            assert_eq!(via_from.err().map(|e| e.class()), Some(class), "{status}");
            // ...and through `classify_status()`.
            let via_ext = response(status, None).classify_status();
            assert_eq!(via_ext.err().map(|e| e.class()), Some(class), "{status}");
        }
        assert!(response(200, None).classify_status().is_ok());
        assert!(response(304, None).classify_status().is_ok());
    }

    #[test]
    fn a_429_honours_retry_after_when_it_can_see_it() {
        let hint =
            |r: reqwest::Response| r.classify_status().err().and_then(|e| e.retry_after_hint());
        assert_eq!(hint(response(429, Some("7"))), Some(Duration::from_secs(7)));
        assert_eq!(hint(response(429, None)), Some(DEFAULT_RETRY_AFTER));
        assert_eq!(hint(response(429, Some("soon"))), Some(DEFAULT_RETRY_AFTER));
        let in_90s =
            httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(90));
        let waited = hint(response(429, Some(&in_90s))).unwrap_or_default();
        assert!(
            waited > Duration::from_secs(85) && waited <= Duration::from_secs(90),
            "{waited:?}"
        );
        // `error_for_status` drops the headers: the default applies.
        let from = response(429, Some("7"))
            .error_for_status()
            .map_err(JobError::from);
        assert_eq!(
            from.err().and_then(|e| e.retry_after_hint()),
            Some(DEFAULT_RETRY_AFTER)
        );
    }

    #[test]
    fn retry_after_values_parse() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        // RFC 9110's example date is 784111777 s after the epoch.
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:37 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(parse_retry_after("-3", now), None);
    }

    #[tokio::test]
    async fn reqwest_transport_failures_are_network_or_timeout() {
        // Nothing listens on a port we bound and closed again.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port());
        let Ok(port) = closed else {
            panic!("cannot bind a loopback port: {closed:?}");
        };
        let refused = reqwest::get(format!("http://127.0.0.1:{port}/")).await;
        let e = refused.map_err(JobError::from).err();
        assert_eq!(e.map(|e| e.class()), Some(ErrorClass::RetryableNetwork));

        // A server that accepts and never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await;
        let Ok(silent) = silent else {
            panic!("cannot bind a loopback port: {silent:?}");
        };
        let addr = silent.local_addr().map_err(|e| e.to_string());
        let accept = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(200))
            .build();
        let (Ok(client), Ok(addr)) = (client, addr) else {
            panic!("client or address");
        };
        let hung = client.get(format!("http://{addr}/")).send().await;
        accept.abort();
        let e = hung.map_err(JobError::from).err();
        assert_eq!(e.map(|e| e.class()), Some(ErrorClass::RetryableTimeout));

        let bad_url = reqwest::Client::new().get("http://[::1").send().await;
        let e = bad_url.map_err(JobError::from).err();
        assert_eq!(
            e.map(|e| e.class()),
            Some(ErrorClass::PermanentInvalidInput)
        );
    }
}
