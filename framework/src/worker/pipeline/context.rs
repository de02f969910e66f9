//! What an attempt's handler is given: its [`JobContext`] and the
//! consumer span it runs in.

use crate::headers::HeaderView;
use crate::headers::JobHeaders;
use crate::job::JobContext;
use crate::telemetry::spans::JobSpan;
use crate::worker::pipeline::Names;
use crate::worker::state::RouteEntry;
use crate::worker::state::TopicRole;
use opentelemetry::KeyValue;
use rdkafka::message::Message;
use std::borrow::Cow;
use std::sync::Arc;

/// The context a handler sees for `msg`, with the job id `id`. The topic's
/// and contract's names come from `names` when the record's match them
/// (always, but for a record whose `kjob-job` names another contract).
pub(crate) fn context_for<M: Message>(
    msg: &M,
    headers: &HeaderView<'_>,
    id: Arc<str>,
    group: &Arc<str>,
    names: Option<&Names>,
    job: &str,
) -> JobContext {
    let job = headers.job.unwrap_or(job);
    JobContext {
        id,
        job: match names {
            Some(n) if *n.job == *job => n.job.clone(),
            _ => Arc::from(job),
        },
        version: headers.version,
        attempt: headers.attempt.unwrap_or(1).max(1),
        topic: match names {
            Some(n) if *n.topic == *msg.topic() => n.topic.clone(),
            _ => Arc::from(msg.topic()),
        },
        partition: msg.partition(),
        offset: msg.offset(),
        key: msg.key().map(|k| match std::str::from_utf8(k) {
            Ok(k) => Arc::from(k),
            Err(_) => Arc::from(String::from_utf8_lossy(k)),
        }),
        timestamp_ms: msg.timestamp().to_millis(),
        tenant: headers.tenant.map(str::to_string),
        group: group.clone(),
        due_at_ms: headers.due_at_ms,
        batch: headers.batch.map(str::to_string),
        batch_report: headers
            .batch_report
            .and_then(crate::batch::report::BatchReport::parse),
    }
}

/// The consumer span `process <main topic>` of one attempt, with the
/// OpenTelemetry messaging attributes. The first attempt of a record
/// enqueued on the main topic continues its enqueue's trace; any other
/// (read from a retry tier or delay bucket, or re-driven from the DLQ: it
/// has been forwarded) starts its own, linked to the span that forwarded it
/// and to the enqueue (see `telemetry/spans.rs`).
pub(super) fn handle_span<M: Message>(
    msg: &M,
    entry: &RouteEntry,
    ctx: &JobContext,
    headers: &HeaderView<'_>,
    owned: Option<&JobHeaders>,
    server: &[KeyValue],
) -> JobSpan {
    let main = entry.main.as_str();
    let continues = entry.role == TopicRole::Main && headers.original_topic.is_none();
    // The trace headers, every one a propagator may read: parsed only when
    // spans are made, and only if the caller has not already.
    let carried = || match owned {
        Some(h) => Cow::Borrowed(h),
        None => Cow::Owned(JobHeaders::parse(msg.headers())),
    };
    JobSpan::consumer(carried, main, continues, || {
        let mut attrs = Vec::with_capacity(16);
        attrs.extend([
            KeyValue::new("messaging.system", "kafka"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.destination.name", main.to_string()),
            KeyValue::new(
                "messaging.destination.partition.id",
                msg.partition().to_string(),
            ),
            KeyValue::new("messaging.kafka.offset", msg.offset()),
            KeyValue::new("messaging.consumer.group.name", ctx.group.to_string()),
            KeyValue::new("messaging.message.id", ctx.id.to_string()),
            KeyValue::new("kjob.job", entry.handler.job_name()),
            KeyValue::new("kjob.version", i64::from(ctx.version.unwrap_or(0))),
            KeyValue::new("kjob.attempt", i64::from(ctx.attempt)),
        ]);
        if let Some(key) = &ctx.key {
            attrs.push(KeyValue::new(
                "messaging.kafka.message.key",
                key.to_string(),
            ));
        }
        if msg.topic() != main {
            attrs.push(KeyValue::new("kjob.topic", msg.topic().to_string()));
        }
        attrs.extend(server.iter().cloned());
        attrs
    })
}
