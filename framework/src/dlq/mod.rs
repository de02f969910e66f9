//! Dead-lettering: moving a failed record to `<topic>.dlq` with full context.
//!
//! The payload and key travel byte-for-byte (so a record that failed to
//! decode is preserved exactly as it arrived), and the headers are rebuilt
//! with the failure's class, message, attempt count and the coordinates of
//! the original record. The source offset is released only after the broker
//! acknowledged the DLQ write: a crash in between yields a duplicate in the
//! DLQ, never a lost job.
//!
//! The operator side (reading a DLQ and its audit trail, re-driving and
//! resolving dead letters) is in `kjob-ops` (`kjob_ops::dlq`): a worker only
//! writes dead letters.

use rdkafka::message::Message;

use crate::headers::JobHeaders;

/// Kept for callers from before it moved: the clock is [`crate::clock::now_ms`].
pub use crate::clock::now_ms;

/// Builds the headers of a dead letter (or any forwarded hop) from the
/// source record: previous kjob headers are parsed and rebuilt, the failure
/// recorded, and the original coordinates set on the first hop only (a
/// record re-driven from a retry tier still points at its main-topic origin).
pub fn forward_headers<M: Message>(
    source: &M,
    group: &str,
    attempt: u32,
    class: &str,
    message: &str,
    now_ms: i64,
) -> JobHeaders {
    let mut h = JobHeaders::parse(source.headers());
    // A record from a foreign producer has no kjob-id; its derived id is
    // written now, so it stays the same on every later hop.
    h.id = Some(h.job_id(source.topic(), source.partition(), source.offset()));
    h.record_failure(class, message, now_ms);
    h.attempt = Some(attempt);
    h.group = Some(group.to_string());
    h.due_at_ms = None;
    if h.original_topic.is_none() {
        h.original_topic = Some(source.topic().to_string());
        h.original_partition = Some(source.partition());
        h.original_offset = Some(source.offset());
        h.original_timestamp_ms = source.timestamp().to_millis();
    }
    h
}

/// Header naming the dead letter a re-driven record came from
/// (`<topic>.dlq:<partition>:<offset>`), written by `kjob dlq retry`.
pub const REDRIVEN_FROM: &str = "kjob-redriven-from";

/// Header on a dead letter of a handler panic: the panic's backtrace, cut
/// to 8 KiB, with the panic machinery's own frames left out. Written only
/// for a panic, and removed on the next hop, so it always describes the
/// failure in `kjob-error`. Absent when the process's panic hook was
/// replaced after the worker started.
pub const BACKTRACE: &str = "kjob-backtrace";

/// Header on a dead-letter envelope: the payload is not in this record,
/// and where the original can still be read (`<size> bytes at
/// <topic>:<partition>:<offset>`).
pub const PAYLOAD_OMITTED: &str = "kjob-payload-omitted";

/// The headers of an envelope: what kjob dead-letters when the broker
/// refused the record itself (too large for the tier or DLQ, not
/// authorized). Everything the forward would have carried, re-classed as
/// [`ErrorClass::ForwardRejected`](crate::ErrorClass::ForwardRejected), plus
/// [`PAYLOAD_OMITTED`] naming the source record, which still holds the
/// payload until its topic's retention removes it.
pub fn envelope_headers<M: Message>(
    intended: &JobHeaders,
    source: &M,
    target: &str,
    cause: &str,
) -> JobHeaders {
    let mut h = intended.clone();
    h.due_at_ms = None;
    h.record_failure(
        crate::ErrorClass::ForwardRejected.as_str(),
        &format!("could not write the record to `{target}`: {cause}"),
        now_ms(),
    );
    let size = source.payload().map_or(0, <[u8]>::len);
    h.extra.retain(|(k, _)| k != PAYLOAD_OMITTED);
    h.extra.push((
        PAYLOAD_OMITTED.to_string(),
        format!(
            "{size} bytes at {}:{}:{}",
            source.topic(),
            source.partition(),
            source.offset()
        )
        .into_bytes(),
    ));
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage, Timestamp};

    fn record(topic: &str, headers: OwnedHeaders) -> OwnedMessage {
        OwnedMessage::new(
            Some(b"payload".to_vec()),
            Some(b"key".to_vec()),
            topic.to_string(),
            Timestamp::CreateTime(1_000),
            2,
            42,
            Some(headers),
        )
    }

    #[test]
    fn first_hop_records_origin() {
        let src = record(
            "orders",
            OwnedHeaders::new().insert(Header {
                key: "kjob-id",
                value: Some("j1"),
            }),
        );
        let h = forward_headers(&src, "g", 3, "permanent", "boom", 7);
        assert_eq!(h.original_topic.as_deref(), Some("orders"));
        assert_eq!(h.original_partition, Some(2));
        assert_eq!(h.original_offset, Some(42));
        assert_eq!(h.original_timestamp_ms, Some(1_000));
        assert_eq!(h.id.as_deref(), Some("j1"));
        assert_eq!(h.attempt, Some(3));
        assert_eq!(h.group.as_deref(), Some("g"));
    }

    #[test]
    fn later_hops_keep_the_origin_and_one_header_each() {
        let first = forward_headers(
            &record("orders", OwnedHeaders::new()),
            "g",
            2,
            "retryable",
            "503",
            1,
        );
        let hop = record("orders.retry.5s", first.to_owned_headers());
        let second = forward_headers(&hop, "g", 3, "permanent", "404", 2);
        assert_eq!(second.original_topic.as_deref(), Some("orders"));
        assert_eq!(
            second.id.as_deref(),
            Some("orders:2:42"),
            "a foreign record's derived id is written on the first hop and kept"
        );
        assert_eq!(second.error_class.as_deref(), Some("permanent"));
        let owned = second.to_owned_headers();
        assert_eq!(
            owned.iter().filter(|h| h.key == "kjob-error-class").count(),
            1
        );
        assert_eq!(
            owned
                .iter()
                .filter(|h| h.key == "kjob-original-topic")
                .count(),
            1
        );
    }
}
