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

/// A class constructor: takes the message, returns the classified error.
type Make = Box<dyn FnOnce(String) -> JobError>;

mod class;
mod from;
mod http;
#[cfg(test)]
mod tests;

pub use class::ErrorClass;
pub use http::{for_http_status, parse_retry_after, ResponseExt, DEFAULT_RETRY_AFTER};
