//! HTTP downstreams: the class of a failed status, `Retry-After`, and the
//! `reqwest` conversions.

use std::time::Duration;

#[cfg(doc)]
use super::ResultExt;
use super::{JobError, Make};

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

pub(super) fn reqwest_class(e: &reqwest::Error) -> Make {
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
