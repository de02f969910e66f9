//! What each outbox row becomes before it is produced: its record as
//! written (an Avro row), its JSON encoded against the topic's contract,
//! a hop into the route's delay topics (a future `run_at`), or a dead
//! letter (a JSON job that does not fit its contract).

use crate::codec::Codec;
use crate::codec::JsonEncodeError;
use crate::delay;
use crate::headers;
use crate::producer::DelayTopicCheck;
use crate::topics::dlq_topic;
use crate::ErrorClass;

use super::rows::{Body, Row};
use super::OutboxTable;

/// A record ready to produce for one row.
#[derive(Debug)]
pub(super) struct Outgoing {
    pub topic: String,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, String)>,
    /// Set for a dead letter: what to note on the row once it is
    /// acknowledged (where it went and why).
    pub dead_letter: Option<String>,
}

/// What to do with one row in this batch.
#[derive(Debug)]
pub(super) enum Prepared {
    /// Produce this record.
    Send(Outgoing),
    /// Not now: what the row needs is not available (the registry did not
    /// answer, a delay topic is missing). It is retried with a backoff and
    /// holds its key back, like a failed publish.
    Defer(String),
}

/// Sets header `name` (replacing any value it had).
fn set(headers: &mut Vec<(String, String)>, name: &str, value: String) {
    headers.retain(|(k, _)| k != name);
    headers.push((name.to_string(), value));
}

/// Prepares `row` at `now_ms`. Never fails the batch: every outcome is a
/// record to send or a reason to wait.
pub(super) async fn prepare(
    row: &Row,
    codec: &Codec,
    delay_topics: &DelayTopicCheck,
    table: &OutboxTable,
    now_ms: i64,
) -> Prepared {
    let mut headers = row.headers.clone();
    let payload = match &row.body {
        Body::Avro(bytes) => bytes.clone(),
        Body::Json { job, version } => match codec.encode_json(&row.topic, *version, job).await {
            Ok(encoded) => encoded.bytes,
            Err(e) if e.is_transient() => return Prepared::Defer(e.to_string()),
            Err(e) => return Prepared::Send(dead_letter(row, job, *version, &e, table, now_ms)),
        },
    };
    let topic = match row.run_at_ms {
        Some(run_at_ms) if run_at_ms > now_ms => {
            // The delayed-job path, as Producer::enqueue_at takes it. A
            // delay topic that is missing or keeps records too briefly is
            // waited for (its worker creates it), not a reason to drop the
            // job or run it early.
            if let Err(e) = delay_topics.check(&row.topic, now_ms, run_at_ms).await {
                return Prepared::Defer(e.to_string());
            }
            set(&mut headers, headers::RUN_AT, run_at_ms.to_string());
            match delay::first_hop(now_ms, run_at_ms) {
                Some(hop) => {
                    set(&mut headers, headers::DUE_AT, hop.release_ms.to_string());
                    if delay_topics.is_shared() {
                        set(&mut headers, headers::ROUTE, row.topic.clone());
                    }
                    delay_topics.topic(&row.topic, hop.bucket)
                }
                // Due too soon for a bucket: the worker waits out the rest.
                None => row.topic.clone(),
            }
        }
        // A run time already passed (the row waited for the relay, or it
        // was asked so): the main topic at once, keeping the time asked in
        // `kjob-run-at`, as `Producer::enqueue_at` does.
        Some(run_at_ms) => {
            set(&mut headers, headers::RUN_AT, run_at_ms.to_string());
            row.topic.clone()
        }
        None => row.topic.clone(),
    };
    Prepared::Send(Outgoing {
        topic,
        payload,
        headers,
        dead_letter: None,
    })
}

/// How the outbox row of a dead-lettered job's note (`last_error`) begins:
/// `kjob outbox status` counts the rows by it.
pub(crate) const DEAD_LETTER_NOTE: &str = "dead-lettered to ";

/// The dead letter of a JSON job that cannot be encoded: the JSON as the
/// application wrote it, the usual kjob failure headers (class
/// `outbox.encode`, the error naming the field, when, where it was headed),
/// and what `kjob dlq retry` needs to encode it later.
fn dead_letter(
    row: &Row,
    job: &serde_json::Value,
    version: Option<u32>,
    error: &JsonEncodeError,
    table: &OutboxTable,
    now_ms: i64,
) -> Outgoing {
    let class = ErrorClass::OutboxEncode.as_str();
    let message = error.to_string();
    let mut h = row.headers.clone();
    set(&mut h, headers::ERROR_CLASS, class.to_string());
    set(
        &mut h,
        headers::ERROR,
        headers::truncate_utf8(&message, headers::MAX_ERROR_BYTES).to_string(),
    );
    set(&mut h, headers::FIRST_FAILED_AT, now_ms.to_string());
    set(&mut h, headers::ORIGINAL_TOPIC, row.topic.clone());
    set(&mut h, headers::ORIGINAL_TIMESTAMP, now_ms.to_string());
    set(&mut h, headers::PAYLOAD_FORMAT, "json".to_string());
    set(
        &mut h,
        headers::OUTBOX_ROW,
        format!("{}:{}", table.name(), row.id),
    );
    if let Some(v) = version {
        set(&mut h, headers::SCHEMA_VERSION, v.to_string());
    }
    if let Some(run_at) = row.run_at_ms {
        set(&mut h, headers::RUN_AT, run_at.to_string());
    }
    let topic = dlq_topic(&row.topic);
    Outgoing {
        dead_letter: Some(format!(
            "{DEAD_LETTER_NOTE}{topic} ({class}): {}",
            headers::truncate_utf8(&message, 900)
        )),
        topic,
        // serde_json writes a Value without failing.
        payload: serde_json::to_vec(job).unwrap_or_default(),
        headers: h,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_avro::Mismatch;

    #[tokio::test]
    async fn a_run_time_already_passed_goes_to_the_main_topic_keeping_the_time_asked() {
        let row = Row {
            id: 7,
            attempts: 0,
            topic: "orders".into(),
            key: "k1".into(),
            body: Body::Avro(vec![0, 0, 0, 0, 1, 2]),
            headers: vec![("kjob-id".into(), "j7".into())],
            run_at_ms: Some(1_000),
        };
        let codec = Codec::new("http://127.0.0.1:9").unwrap_or_else(|e| panic!("{e}"));
        let delays = DelayTopicCheck::new(&crate::KafkaConfig::new(
            "127.0.0.1:9",
            "http://127.0.0.1:9",
        ));
        let Prepared::Send(out) =
            prepare(&row, &codec, &delays, &OutboxTable::default(), 5_000).await
        else {
            panic!("a passed run time is sent, not deferred");
        };
        assert_eq!(out.topic, "orders");
        let run_at: Vec<&str> = out
            .headers
            .iter()
            .filter(|(k, _)| k == "kjob-run-at")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(run_at, ["1000"], "the time asked, not the send time");
    }

    #[test]
    fn a_dead_letter_keeps_the_json_and_names_the_field() {
        let job = serde_json::json!({"key": "k1", "seq": 3});
        let row = Row {
            id: 42,
            attempts: 0,
            topic: "orders".into(),
            key: "k1".into(),
            body: Body::Json {
                job: job.clone(),
                version: Some(2),
            },
            headers: vec![
                ("kjob-id".into(), "j1".into()),
                ("kjob-attempt".into(), "1".into()),
            ],
            run_at_ms: None,
        };
        let error = JsonEncodeError::Mismatch {
            subject: "orders-value".into(),
            version: 2,
            id: 9,
            mismatch: Mismatch {
                path: "behaviour".into(),
                reason: "missing, and the schema gives it no default (type string)".into(),
            },
        };
        let out = dead_letter(&row, &job, Some(2), &error, &OutboxTable::default(), 1_000);
        assert_eq!(out.topic, "orders.dlq");
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&out.payload).ok(),
            Some(job)
        );
        let get = |k: &str| {
            out.headers
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("kjob-error-class"), Some("outbox.encode"));
        assert!(get("kjob-error").is_some_and(|e| e.starts_with("behaviour: missing")));
        assert_eq!(get("kjob-id"), Some("j1"), "the job keeps its id");
        assert_eq!(get("kjob-original-topic"), Some("orders"));
        assert_eq!(get("kjob-payload-format"), Some("json"));
        assert_eq!(get("kjob-schema-version"), Some("2"));
        assert_eq!(get("kjob-outbox-row"), Some("kjob_outbox:42"));
        assert!(out.dead_letter.is_some_and(|n| n.contains("orders.dlq")));
    }
}
