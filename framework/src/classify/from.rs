//! `From` impls: what `?` makes of the errors handlers meet most (I/O,
//! timeouts, JSON, kjob's own, PostgreSQL, `anyhow`), each classified as the
//! module docs of [`crate::classify`] list.

use std::sync::Arc;

use super::http::reqwest_class;
#[cfg(doc)]
use super::ResultExt;
use super::{JobError, Make};

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
pub(super) mod postgres {
    use super::JobError;

    /// The class for a PostgreSQL SQLSTATE (`None`: no server error, i.e.
    /// the connection failed or closed).
    pub(crate) fn for_sqlstate(code: Option<&str>) -> fn(String) -> JobError {
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
