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

/// The error a handler returns. Closed and exhaustive on purpose: every
/// variant maps to exactly one routing decision, so there is no "unknown"
/// error that could be silently dropped or retried forever.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobError {
    /// Transient: try again later with backoff.
    Retryable {
        /// What kind of transient failure.
        reason: RetryReason,
        /// Human-readable detail, stored (truncated) in the `kjob-error` header.
        message: String,
    },
    /// Transient with a known wait (HTTP 429 `Retry-After`, a rate limit). The
    /// duration is honoured as a lower bound: kjob never retries sooner.
    RetryAfter {
        /// Minimum time before the next attempt.
        after: Duration,
        /// Human-readable detail.
        message: String,
    },
    /// Will never succeed: dead-letter at once, without retry traffic.
    Permanent {
        /// What kind of permanent failure.
        reason: PermanentReason,
        /// Human-readable detail.
        message: String,
    },
}

impl JobError {
    /// A transient failure of unspecified kind.
    pub fn retryable(message: impl Into<String>) -> Self {
        JobError::Retryable {
            reason: RetryReason::Other,
            message: message.into(),
        }
    }
    /// The downstream did not answer in time.
    pub fn timeout(message: impl Into<String>) -> Self {
        JobError::Retryable {
            reason: RetryReason::Timeout,
            message: message.into(),
        }
    }
    /// A connection-level failure.
    pub fn network(message: impl Into<String>) -> Self {
        JobError::Retryable {
            reason: RetryReason::Network,
            message: message.into(),
        }
    }
    /// A 5xx from a downstream.
    pub fn server(message: impl Into<String>) -> Self {
        JobError::Retryable {
            reason: RetryReason::Server,
            message: message.into(),
        }
    }
    /// Retry no earlier than `after` (a 429, a rate limit).
    pub fn retry_after(after: Duration, message: impl Into<String>) -> Self {
        JobError::RetryAfter {
            after,
            message: message.into(),
        }
    }
    /// A failure retrying cannot fix.
    pub fn permanent(message: impl Into<String>) -> Self {
        JobError::Permanent {
            reason: PermanentReason::Other,
            message: message.into(),
        }
    }
    /// The job's content is invalid.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        JobError::Permanent {
            reason: PermanentReason::InvalidInput,
            message: message.into(),
        }
    }
    /// A record the job refers to does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        JobError::Permanent {
            reason: PermanentReason::NotFound,
            message: message.into(),
        }
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

    /// The human-readable detail.
    pub fn message(&self) -> &str {
        match self {
            JobError::Retryable { message, .. }
            | JobError::RetryAfter { message, .. }
            | JobError::Permanent { message, .. } => message,
        }
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.class(), self.message())
    }
}

impl std::error::Error for JobError {}

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
