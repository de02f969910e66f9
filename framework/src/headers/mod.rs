//! The `kjob-*` record headers: names, and reading/writing them.
//!
//! Headers let operators and tools understand a record (which job, which
//! attempt, why it failed, where it came from) without decoding the payload.
//! Every hop (retry tier, DLQ, re-drive) rebuilds the header set from a
//! [`JobHeaders`] value instead of appending, so a record that has failed ten
//! times carries one `kjob-attempt`, not ten.

use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders, OwnedMessage};

mod view;
pub(crate) use view::HeaderView;

/// Contract name.
pub const JOB: &str = "kjob-job";
/// Contract version the producer encoded with.
pub const VERSION: &str = "kjob-version";
/// Unique job id; the default idempotency key.
pub const ID: &str = "kjob-id";
/// Attempt number of the *next* run (1 on enqueue).
pub const ATTEMPT: &str = "kjob-attempt";
/// Absolute due time (epoch ms) for a record in a retry tier.
pub const DUE_AT: &str = "kjob-due-at";
/// When a delayed job is to run (epoch ms); its hops' `kjob-due-at` are
/// the planned releases on the way (see [`crate::delay`]).
pub const RUN_AT: &str = "kjob-run-at";
/// When the job first failed (epoch ms).
pub const FIRST_FAILED_AT: &str = "kjob-first-failed-at";
/// The [`crate::ErrorClass`] of the last failure.
pub const ERROR_CLASS: &str = "kjob-error-class";
/// The last failure's message, truncated to [`MAX_ERROR_BYTES`].
pub const ERROR: &str = "kjob-error";
/// Topic the job was first consumed from.
pub const ORIGINAL_TOPIC: &str = "kjob-original-topic";
/// Partition the job was first consumed from.
pub const ORIGINAL_PARTITION: &str = "kjob-original-partition";
/// Offset the job was first consumed from.
pub const ORIGINAL_OFFSET: &str = "kjob-original-offset";
/// Timestamp (epoch ms) of the original record.
pub const ORIGINAL_TIMESTAMP: &str = "kjob-original-timestamp";
/// Consumer group that failed the job.
pub const GROUP: &str = "kjob-group";
/// Tenant the job belongs to.
pub const TENANT: &str = "kjob-tenant";
/// On a record parked behind its key's job in the retry path (a route under
/// strict order, see [`crate::WorkerBuilder::strict_order`]): that job's id.
/// Informational; the order itself is kept in `<topic>.order`.
pub const FOLLOWS: &str = "kjob-follows";
/// W3C trace context.
pub const TRACEPARENT: &str = "traceparent";
/// W3C trace state.
pub const TRACESTATE: &str = "tracestate";
/// W3C baggage: the key-value pairs the enqueuing code put in its
/// OpenTelemetry context (with `OTEL_PROPAGATORS` naming `baggage`, as it
/// does by default). Other propagators' headers (B3's `b3`, `x-b3-*`) are
/// kept in [`JobHeaders::extra`].
pub const BAGGAGE: &str = "baggage";
/// The span that created the job (its enqueue), as a W3C `traceparent`
/// value, whatever `OTEL_PROPAGATORS` says: written on the first forward
/// (retry tier, DLQ) and kept on every later hop, so an attempt that starts
/// a trace of its own can still link to the job's first trace.
pub const TRACE_ORIGIN: &str = "kjob-trace-origin";
/// The batch a job belongs to ([`crate::batch`]); its worker records the
/// job's completion there.
pub const BATCH: &str = "kjob-batch";
/// On a batch's callback: its counts, as JSON ([`crate::batch::BatchReport`]).
pub const BATCH_REPORT: &str = "kjob-batch-report";

/// On a dead letter of a job enqueued from SQL (`kjob.enqueue`) that could
/// not be encoded: `json`, because the payload is the job as the
/// application wrote it, not Avro. `kjob dlq show` prints it as JSON and
/// `kjob dlq retry` encodes it against the topic's latest contract before
/// re-driving it. Kept in [`JobHeaders::extra`].
pub const PAYLOAD_FORMAT: &str = "kjob-payload-format";
/// On such a dead letter: the subject version the job was pinned to
/// (`kjob.enqueue(version => N)`), if it was. Kept in [`JobHeaders::extra`].
pub const SCHEMA_VERSION: &str = "kjob-schema-version";
/// On such a dead letter: the outbox row it came from, `<table>:<row id>`,
/// so an operator can find the row (and the transaction's other jobs).
/// Kept in [`JobHeaders::extra`].
pub const OUTBOX_ROW: &str = "kjob-outbox-row";

/// On a copy of a waiting job an operator moved to "now" (written to the
/// main topic): where the original waited, `topic:partition:offset`. Such a
/// copy also carries `kjob-group`, and other groups reading the main topic
/// skip it: the move was for that group only. Kept in [`JobHeaders::extra`].
pub const MOVED_FROM: &str = "kjob-moved-from";

/// On a record in a shared retry tier (`<namespace>.retry.<delay>`, see
/// `WorkerBuilder::shared_retry_tiers`): the main topic of the route it
/// belongs to, which decodes and handles it. Written on every forward to a
/// topic not named after the route, and carried on later hops. Kept in
/// [`JobHeaders::extra`].
pub const ROUTE: &str = "kjob-route";

/// Longest error message stored in a header. Stack traces and HTML error
/// pages from downstreams would otherwise bloat every retry record.
pub const MAX_ERROR_BYTES: usize = 1024;

/// The kjob view of a record's headers. Unknown (non-kjob) headers are kept
/// in `extra` and carried across hops unchanged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobHeaders {
    /// `kjob-job`.
    pub job: Option<String>,
    /// `kjob-version`.
    pub version: Option<u32>,
    /// `kjob-id`.
    pub id: Option<String>,
    /// `kjob-attempt`.
    pub attempt: Option<u32>,
    /// `kjob-due-at`.
    pub due_at_ms: Option<i64>,
    /// `kjob-run-at`.
    pub run_at_ms: Option<i64>,
    /// `kjob-first-failed-at`.
    pub first_failed_at_ms: Option<i64>,
    /// `kjob-error-class`.
    pub error_class: Option<String>,
    /// `kjob-error`.
    pub error: Option<String>,
    /// `kjob-original-topic`.
    pub original_topic: Option<String>,
    /// `kjob-original-partition`.
    pub original_partition: Option<i32>,
    /// `kjob-original-offset`.
    pub original_offset: Option<i64>,
    /// `kjob-original-timestamp`.
    pub original_timestamp_ms: Option<i64>,
    /// `kjob-group`.
    pub group: Option<String>,
    /// `kjob-tenant`.
    pub tenant: Option<String>,
    /// `traceparent`.
    pub traceparent: Option<String>,
    /// `tracestate`.
    pub tracestate: Option<String>,
    /// `baggage`.
    pub baggage: Option<String>,
    /// `kjob-trace-origin`.
    pub trace_origin: Option<String>,
    /// `kjob-batch`.
    pub batch: Option<String>,
    /// `kjob-batch-report`.
    pub batch_report: Option<String>,
    /// Any other headers, in their original order (last value per name wins).
    pub extra: Vec<(String, Vec<u8>)>,
}

impl JobHeaders {
    /// The route a record of a shared tier or delay bucket names
    /// ([`ROUTE`]), as raw bytes (a hostile value need not be UTF-8).
    pub fn route(&self) -> Option<&[u8]> {
        self.extra
            .iter()
            .find(|(k, _)| k == ROUTE)
            .map(|(_, v)| v.as_slice())
    }

    /// Names `main` as the record's route ([`ROUTE`]), replacing any value.
    pub fn set_route(&mut self, main: &str) {
        self.extra.retain(|(k, _)| k != ROUTE);
        self.extra
            .push((ROUTE.to_string(), main.as_bytes().to_vec()));
    }

    /// Parses a record's headers. Malformed kjob values (say, a non-numeric
    /// attempt) are treated as absent rather than failing the job: a header is
    /// metadata, and the payload may still be perfectly good.
    pub fn parse<H: Headers>(headers: Option<&H>) -> Self {
        let mut view = HeaderView::default();
        let mut extra: Vec<(String, Vec<u8>)> = Vec::new();
        for h in headers.into_iter().flat_map(|h| h.iter()) {
            if !view.read(h.key, h.value) {
                let value = h.value.map(<[u8]>::to_vec).unwrap_or_default();
                extra.retain(|(k, _)| k != h.key);
                extra.push((h.key.to_string(), value));
            }
        }
        view.into_job_headers(extra)
    }

    /// The job's id: `kjob-id` when the producer set one; otherwise an id
    /// derived from where the job first entered its route,
    /// `<topic>:<partition>:<offset>` of the original main-topic record (from
    /// the `kjob-original-*` headers on a forwarded hop, or the record
    /// itself). Records from producers that are not kjob's (a Java or Python
    /// service with its own Confluent serializer) carry no `kjob-id`; this
    /// gives each a stable, unique idempotency key, and forwarding writes it
    /// into `kjob-id` so it never changes across tiers, the DLQ or a
    /// re-drive. Topic names cannot contain `:`, so a derived id never
    /// collides with another record's.
    pub fn job_id(&self, topic: &str, partition: i32, offset: i64) -> String {
        self.view().job_id(topic, partition, offset)
    }

    /// Records a failure: class, message (truncated on a UTF-8 boundary) and,
    /// on the first failure only, the first-failed-at time.
    pub fn record_failure(&mut self, class: &str, message: &str, now_ms: i64) {
        self.error_class = Some(class.to_string());
        self.error = Some(truncate_utf8(message, MAX_ERROR_BYTES).to_string());
        if self.first_failed_at_ms.is_none() {
            self.first_failed_at_ms = Some(now_ms);
        }
    }

    /// Builds a fresh header set: one header per field that is set, then the
    /// extras. Never appends to an existing set, so hops cannot duplicate.
    pub fn to_owned_headers(&self) -> OwnedHeaders {
        let mut out = OwnedHeaders::new_with_capacity(20);
        let mut put = |key: &str, value: Option<String>| {
            if let Some(v) = value {
                out = std::mem::take(&mut out).insert(Header {
                    key,
                    value: Some(v.as_bytes()),
                });
            }
        };
        put(JOB, self.job.clone());
        put(VERSION, self.version.map(|v| v.to_string()));
        put(ID, self.id.clone());
        put(ATTEMPT, self.attempt.map(|v| v.to_string()));
        put(DUE_AT, self.due_at_ms.map(|v| v.to_string()));
        put(RUN_AT, self.run_at_ms.map(|v| v.to_string()));
        put(
            FIRST_FAILED_AT,
            self.first_failed_at_ms.map(|v| v.to_string()),
        );
        put(ERROR_CLASS, self.error_class.clone());
        put(ERROR, self.error.clone());
        put(ORIGINAL_TOPIC, self.original_topic.clone());
        put(
            ORIGINAL_PARTITION,
            self.original_partition.map(|v| v.to_string()),
        );
        put(ORIGINAL_OFFSET, self.original_offset.map(|v| v.to_string()));
        put(
            ORIGINAL_TIMESTAMP,
            self.original_timestamp_ms.map(|v| v.to_string()),
        );
        put(GROUP, self.group.clone());
        put(TENANT, self.tenant.clone());
        put(TRACEPARENT, self.traceparent.clone());
        put(TRACESTATE, self.tracestate.clone());
        put(BAGGAGE, self.baggage.clone());
        put(TRACE_ORIGIN, self.trace_origin.clone());
        put(BATCH, self.batch.clone());
        put(BATCH_REPORT, self.batch_report.clone());
        for (k, v) in &self.extra {
            out = std::mem::take(&mut out).insert(Header {
                key: k.as_str(),
                value: Some(v.as_slice()),
            });
        }
        out
    }
}

/// The last value of header `name` as UTF-8, without parsing the rest. Used
/// on the poll thread, where only the due time and group matter.
pub fn find<'a, H: Headers>(headers: Option<&'a H>, name: &str) -> Option<&'a str> {
    headers?
        .iter()
        .filter(|h| h.key == name)
        .last()
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// A polled record copied out of librdkafka as an [`OwnedMessage`], for
/// tools that keep records (a DLQ reader, a status view). Unlike rdkafka's
/// `detach()`, header names that are not UTF-8 (another producer's bug, or
/// a hostile one) are kept with their bad bytes replaced, so rdkafka's own
/// header accessors, which panic on such a name, are safe on the copy.
pub fn owned_record(m: &BorrowedMessage<'_>) -> OwnedMessage {
    crate::worker::intake::polled::Polled::copy(m, std::sync::Arc::from(m.topic()))
        .to_owned_message()
}

/// The longest prefix of `s` that fits in `max` bytes without splitting a
/// UTF-8 character.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_char_boundaries() {
        let s = "é".repeat(1000); // 2000 bytes
        let t = truncate_utf8(&s, MAX_ERROR_BYTES);
        assert!(t.len() <= MAX_ERROR_BYTES);
        assert_eq!(t.len(), 1024);
        assert_eq!(truncate_utf8("abc", 2), "ab");
        assert_eq!(truncate_utf8("abc", 10), "abc");
    }

    #[test]
    fn rebuilding_never_duplicates() {
        let mut h = JobHeaders {
            job: Some("orders.confirmation".into()),
            id: Some("j1".into()),
            attempt: Some(1),
            baggage: Some("tenant=acme".into()),
            trace_origin: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            extra: vec![("x-app".into(), b"1".to_vec())],
            ..Default::default()
        };
        h.record_failure("retryable.server", &"x".repeat(5000), 10);
        h.record_failure("retryable.server", "again", 20);
        h.attempt = Some(3);
        let owned = h.to_owned_headers();
        let parsed = JobHeaders::parse(Some(&owned));
        assert_eq!(parsed.attempt, Some(3));
        assert_eq!(
            parsed.first_failed_at_ms,
            Some(10),
            "first failure time is kept"
        );
        assert_eq!(parsed.error.as_deref(), Some("again"));
        assert_eq!(parsed.baggage.as_deref(), Some("tenant=acme"));
        assert_eq!(parsed.trace_origin, h.trace_origin, "trace headers travel");
        let attempts = owned.iter().filter(|x| x.key == ATTEMPT).count();
        assert_eq!(attempts, 1);
        // A second hop from the parsed form yields the same set.
        let again = JobHeaders::parse(Some(&parsed.to_owned_headers()));
        assert_eq!(again, parsed);
        assert_eq!(again.extra, vec![("x-app".to_string(), b"1".to_vec())]);
    }

    #[test]
    fn a_record_without_an_id_gets_one_from_where_it_entered_the_route() {
        let none = JobHeaders::default();
        assert_eq!(none.job_id("orders", 3, 17), "orders:3:17");
        let forwarded = JobHeaders {
            original_topic: Some("orders".into()),
            original_partition: Some(3),
            original_offset: Some(17),
            ..Default::default()
        };
        assert_eq!(
            forwarded.job_id("orders.retry.5s", 0, 99),
            "orders:3:17",
            "a hop keeps the id of the original record"
        );
        let own = JobHeaders {
            id: Some("j1".into()),
            ..Default::default()
        };
        assert_eq!(own.job_id("orders", 3, 17), "j1");
        let empty = OwnedHeaders::new().insert(Header {
            key: ID,
            value: Some(""),
        });
        assert_eq!(JobHeaders::parse(Some(&empty)).id, None);
    }

    #[test]
    fn malformed_values_are_absent_not_fatal() {
        let owned = OwnedHeaders::new()
            .insert(Header {
                key: ATTEMPT,
                value: Some("three"),
            })
            .insert(Header {
                key: DUE_AT,
                value: Some(&[0xff, 0xfe][..]),
            });
        let parsed = JobHeaders::parse(Some(&owned));
        assert_eq!(parsed.attempt, None);
        assert_eq!(parsed.due_at_ms, None);
    }
}
