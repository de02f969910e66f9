//! An operator's hand on one waiting job: cancel it, or move it to "now".
//! `kjob waiting cancel|now` and the dashboard's waiting page act through
//! here.
//!
//! Both are records on the group's control topic, next to route pauses
//! ([`kjob::control::JobCancel`]): every worker of the group follows it,
//! and the one that reaches the record (at its hop or due time) finishes it
//! as cancelled, without running it. A cancel names the job by its id and
//! due time, so the copies a delayed job leaves as it hops from bucket to
//! bucket are cancelled too.
//!
//! "Move to now" first writes a copy of the record to the route's main
//! topic, without its due time and with its attempt count and job id, and
//! only once that copy is acknowledged cancels the waiting original. Not a
//! retry tier: a tier record not due yet holds its partition until it is,
//! so a copy behind it would wait as long. The copy names the group
//! (`kjob-group`, with [`MOVED_FROM`]) and other groups reading the main
//! topic skip it. A crash in between leaves two copies of the job, never
//! none: at-least-once, as everywhere, and a handler that dedupes by job id
//! runs it once.
//!
//! What it cannot promise: a record a worker is already running (it fell
//! due while the operator looked) runs anyway, and on a strict-order route
//! a job moved to now runs ahead of its key's earlier jobs.

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};

use kjob::control::{
    cancel_key, control_topic, read_control, route_audit_key, ControlAudit, JobCancel,
    CANCEL_KEPT_MS, TOPIC_CONFIG,
};
use kjob::headers::JobHeaders;
use kjob::topics::create_topics_with;
use kjob::{KafkaConfig, Producer};
use rdkafka::message::OwnedHeaders;

use crate::problem::Problem;
use crate::topics::route_topics;

pub use kjob::headers::MOVED_FROM;

/// What [`act`] does to a waiting job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitingAction {
    /// Finish it without running it.
    Cancel {
        /// Why (required: it is in the audit).
        reason: String,
    },
    /// Run it now: a copy on the main topic, then a cancel of the original.
    Now,
}

/// The record an operator points at: `topic`'s `partition` at `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingAt {
    /// A retry tier or delay topic of the route.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
}

impl std::fmt::Display for WaitingAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.topic, self.partition, self.offset)
    }
}

impl std::str::FromStr for WaitingAt {
    type Err = Problem;

    /// `topic:partition:offset` (a topic name holds no `:`).
    fn from_str(s: &str) -> Result<Self, Problem> {
        let bad = || {
            Problem::usage(format!(
                "`{s}` is not topic:partition:offset (e.g. orders.delay.1h:0:42)"
            ))
        };
        let mut parts = s.rsplitn(3, ':');
        let (Some(offset), Some(partition), Some(topic)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let (Ok(partition), Ok(offset)) = (partition.parse::<i32>(), offset.parse::<i64>()) else {
            return Err(bad());
        };
        if topic.is_empty() || partition < 0 || offset < 0 {
            return Err(bad());
        }
        Ok(Self {
            topic: topic.to_string(),
            partition,
            offset,
        })
    }
}

/// What [`act`] did, or would do without `execute`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acted {
    /// The audit entry written (or that would be).
    pub audit: ControlAudit,
    /// The job id.
    pub id: String,
    /// Its contract (`kjob-job`), if the record names it.
    pub job: Option<String>,
    /// When it was due (epoch ms).
    pub due_ms: i64,
    /// Where the copy went (`topic:partition:offset`) for "now"; with a
    /// dry run, the topic it would go to.
    pub copy: Option<String>,
    /// False for a dry run: nothing was written.
    pub executed: bool,
}

/// Cancels the job waiting at `at` in a retry tier or delay topic of route
/// `main` for `group`, or moves it to "now", as `by`, audited. Refused when
/// the topic is not one of the route's tiers or delay topics, when the
/// group already committed past the record (it ran, or was cancelled), when
/// it carries no job id or due time, or when it was already cancelled.
/// Without `execute` it checks all that and writes nothing.
pub async fn act(
    config: &KafkaConfig,
    group: &str,
    main: &str,
    at: &WaitingAt,
    by: &str,
    action: WaitingAction,
    execute: bool,
) -> anyhow::Result<Acted> {
    if let WaitingAction::Cancel { reason } = &action {
        if reason.trim().is_empty() {
            return Err(Problem::usage("a cancel needs a reason: it is kept in the audit").into());
        }
    }
    let (c, g, m, a) = (
        config.clone(),
        group.to_string(),
        main.to_string(),
        at.clone(),
    );
    let (record, state) =
        tokio::task::spawn_blocking(move || -> anyhow::Result<(OwnedMessage, _)> {
            check_topic(&c, &m, &g, &a.topic)?;
            check_uncommitted(&c, &g, &a)?;
            Ok((read_one(&c, &a)?, read_control(&c, &g)?))
        })
        .await??;
    let headers = JobHeaders::parse(record.headers());
    let id = headers.id.clone().ok_or_else(|| {
        Problem::refused(format!(
            "the record at {at} has no kjob-id header, so no worker could tell it from another attempt; re-drive or replay it instead"
        ))
    })?;
    let due_ms = headers.run_at_ms.or(headers.due_at_ms).ok_or_else(|| {
        Problem::refused(format!(
            "the record at {at} has no kjob-run-at or kjob-due-at header: it is due now already"
        ))
    })?;
    let key = cancel_key(main, &at.topic, at.partition, at.offset);
    if let Some(done) = state.cancels.get(&key) {
        return Err(Problem::refused(format!(
            "job `{id}` at {at} was already {} by {} at {}",
            done.action,
            done.by,
            crate::time::format_ms(Some(done.at_ms))
        ))
        .into());
    }
    let now = kjob::clock::now_ms();
    let (name, reason) = match &action {
        WaitingAction::Cancel { reason } => ("cancelled", Some(reason.trim().to_string())),
        WaitingAction::Now => ("moved to now", None),
    };
    let audit = ControlAudit {
        subject: format!("job:{id}"),
        action: name.to_string(),
        by: by.to_string(),
        at_ms: now,
        reason: reason.clone(),
    };
    let mut acted = Acted {
        audit: audit.clone(),
        id: id.clone(),
        job: headers.job.clone(),
        due_ms,
        copy: None,
        executed: execute,
    };
    if !execute {
        if action == WaitingAction::Now {
            acted.copy = Some(main.to_string());
        }
        return Ok(acted);
    }
    let producer = Producer::new(config)?;
    if action == WaitingAction::Now {
        acted.copy = Some(copy_now(&producer, group, main, at, &record, &headers).await?);
    }
    let cancel = JobCancel {
        topic: main.to_string(),
        id: id.clone(),
        due_ms,
        source: at.to_string(),
        action: name.to_string(),
        by: by.to_string(),
        at_ms: now,
        reason,
    };
    let topic = control_topic(group);
    create_topics_with(config, &[(topic.clone(), 1)], TOPIC_CONFIG).await?;
    // The audit first: nothing is in force without its record.
    send_json(&producer, &topic, &route_audit_key(main, now), &audit).await?;
    send_json(&producer, &topic, &key, &cancel).await?;
    // Cancels kept long past their due time serve no one: removed here,
    // by the next action, since compaction keeps every key's latest.
    for (old, c) in &state.cancels {
        if c.due_ms.saturating_add(CANCEL_KEPT_MS) < now {
            producer
                .send_raw(&topic, Some(old.as_bytes()), None, OwnedHeaders::new())
                .await?;
        }
    }
    Ok(acted)
}

/// Refuses a topic that is not a retry tier or delay topic of route `main`.
fn check_topic(config: &KafkaConfig, main: &str, group: &str, topic: &str) -> anyhow::Result<()> {
    let names = kjob::topics::list_topics(config)?;
    if !names.iter().any(|n| n == main) {
        return Err(
            Problem::not_found(format!("no topic `{main}`: name a route's main topic")).into(),
        );
    }
    let waiting: Vec<String> = route_topics(main, Some(group), &names)
        .into_iter()
        .filter(|t| super::holds(&t.role))
        .map(|t| t.topic)
        .collect();
    if waiting.iter().any(|t| t == topic) {
        return Ok(());
    }
    Err(Problem::usage(format!(
        "`{topic}` is not a retry tier or delay topic of route `{main}` for group `{group}`; it has: {}",
        if waiting.is_empty() {
            "none".to_string()
        } else {
            waiting.join(", ")
        }
    ))
    .into())
}

/// Refuses a record the group already committed past: it ran, was
/// cancelled, or hopped on to another topic.
fn check_uncommitted(config: &KafkaConfig, group: &str, at: &WaitingAt) -> anyhow::Result<()> {
    let lag = crate::lag::group_lag(config, group, std::slice::from_ref(&at.topic))?;
    let Some(p) = lag.iter().find(|l| l.partition == at.partition) else {
        return Err(Problem::not_found(format!(
            "`{}` has no partition {}",
            at.topic, at.partition
        ))
        .into());
    };
    let from = p.committed.unwrap_or(p.start).max(p.start);
    if at.offset < from {
        return Err(Problem::refused(format!(
            "group `{group}` already committed past {at} (at {from}): that record no longer waits; a delayed job that hopped waits at a later offset of a shorter bucket, see the waiting page"
        ))
        .into());
    }
    if at.offset >= p.end {
        return Err(Problem::not_found(format!(
            "no record at {at}: the partition ends at {}",
            p.end
        ))
        .into());
    }
    Ok(())
}

/// The record at `at`, copied out of librdkafka. Blocking; 10 s at most.
fn read_one(config: &KafkaConfig, at: &WaitingAt) -> anyhow::Result<OwnedMessage> {
    let consumer = super::reader(config)?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&at.topic, at.partition, Offset::Offset(at.offset))
        .and_then(|()| consumer.assign(&tpl))
        .map_err(|e| kjob::Error::kafka("assigning the waiting reader", e))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) if m.offset() == at.offset => return Ok(kjob::headers::owned_record(&m)),
            // Compaction or a transaction marker moved past it.
            Some(Ok(m)) if m.offset() > at.offset => break,
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(kjob::Error::kafka("reading the waiting record", e).into()),
            None => {}
        }
    }
    Err(Problem::not_found(format!("no record could be read at {at}")).into())
}

/// Writes the waiting record to the main topic, due now and for `group`
/// only, and says where it landed.
async fn copy_now(
    producer: &Producer,
    group: &str,
    target: &str,
    at: &WaitingAt,
    record: &OwnedMessage,
    headers: &JobHeaders,
) -> anyhow::Result<String> {
    let mut h = headers.clone();
    h.run_at_ms = None;
    h.due_at_ms = None;
    h.group = Some(group.to_string());
    h.extra.retain(|(k, _)| k != MOVED_FROM);
    h.extra
        .push((MOVED_FROM.to_string(), at.to_string().into_bytes()));
    let (partition, offset) = producer
        .send_raw(target, record.key(), record.payload(), h.to_owned_headers())
        .await?;
    Ok(format!("{target}:{partition}:{offset}"))
}

async fn send_json<T: serde::Serialize>(
    producer: &Producer,
    topic: &str,
    key: &str,
    value: &T,
) -> anyhow::Result<()> {
    producer
        .send_raw(
            topic,
            Some(key.as_bytes()),
            Some(&serde_json::to_vec(value)?),
            OwnedHeaders::new(),
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_parse_from_the_right() {
        let at: WaitingAt = "orders.delay.1h:3:42"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            at,
            WaitingAt {
                topic: "orders.delay.1h".into(),
                partition: 3,
                offset: 42
            }
        );
        assert_eq!(at.to_string(), "orders.delay.1h:3:42");
        for bad in ["orders", "orders:1", ":1:2", "t:x:2", "t:1:-2", "t:-1:2"] {
            assert!(bad.parse::<WaitingAt>().is_err(), "{bad}");
        }
    }
}
