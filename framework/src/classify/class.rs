//! The closed set of error classes a failure is recorded under
//! (`kjob-error-class`), and what each one means for the job.

#[cfg(doc)]
use super::{JobError, PermanentReason, RetryReason};
use std::fmt;

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
