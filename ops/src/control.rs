//! Routes paused for a whole group, as operators see and change them:
//! `kjob routes pause|resume|list` and the dashboard's route page read and
//! write through here.
//!
//! A pause is a record on the group's compacted control topic
//! (`<group>.control`, see [`kjob::control`]); every worker of the group
//! follows that topic and pauses the route's main-topic partitions it owns
//! within about a second (a worker that starts, or is assigned a partition,
//! applies what is in force before fetching). Jobs already fetched finish
//! and are committed as usual. Each action also writes an audit entry under
//! its own key in the same topic.

use kjob::control::{
    control_topic, read_control, route_audit_key, route_key, ControlAudit, ControlState,
    RouteControl,
};
use kjob::topics::{create_topics_with, partition_counts};
use kjob::{KafkaConfig, Producer};
use rdkafka::message::OwnedHeaders;

use crate::problem::Problem;

/// What [`act`] does to a route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteAction {
    /// Stop every worker of the group from fetching the route's main topic.
    Pause {
        /// Why (required: every dashboard page shows it meanwhile).
        reason: String,
    },
    /// Let them fetch it again.
    Resume,
}

/// `group`'s controls and their audit. Empty when no action was ever
/// taken. Blocking.
pub fn read(config: &KafkaConfig, group: &str) -> anyhow::Result<ControlState> {
    Ok(read_control(config, group)?)
}

/// Pauses or resumes the route on main topic `topic` for `group` as `by`,
/// audited. Refused (409) for a pause of a paused route or a resume of a
/// running one; a pause needs a reason (usage); not found for a topic that
/// does not exist.
pub async fn act(
    config: &KafkaConfig,
    group: &str,
    topic: &str,
    by: &str,
    action: RouteAction,
) -> anyhow::Result<ControlAudit> {
    if let RouteAction::Pause { reason } = &action {
        if reason.trim().is_empty() {
            return Err(Problem::usage(
                "a pause needs a reason: it is shown on every dashboard page while the route is paused",
            )
            .into());
        }
    }
    let (c, g, t) = (config.clone(), group.to_string(), topic.to_string());
    let (exists, state) = tokio::task::spawn_blocking(move || {
        let exists = partition_counts(&c, std::slice::from_ref(&t))?
            .first()
            .copied()
            .flatten()
            .is_some();
        anyhow::Ok((exists, read_control(&c, &g)?))
    })
    .await??;
    if !exists {
        return Err(
            Problem::not_found(format!("no topic `{topic}`: name a route's main topic")).into(),
        );
    }
    let now = kjob::clock::now_ms();
    let mut control = state
        .routes
        .get(topic)
        .cloned()
        .unwrap_or_else(|| RouteControl {
            topic: topic.to_string(),
            ..RouteControl::default()
        });
    let (name, reason) = match &action {
        RouteAction::Pause { reason } => {
            if control.paused {
                return Err(Problem::refused(format!(
                    "route `{topic}` is already paused for group `{group}` (by {} at {})",
                    control.by,
                    crate::time::format_ms(Some(control.at_ms))
                ))
                .into());
            }
            control.paused = true;
            control.reason = Some(reason.trim().to_string());
            ("paused", control.reason.clone())
        }
        RouteAction::Resume => {
            if !control.paused {
                return Err(Problem::refused(format!(
                    "route `{topic}` is not paused for group `{group}`"
                ))
                .into());
            }
            control.paused = false;
            control.reason = None;
            ("resumed", None)
        }
    };
    control.by = by.to_string();
    control.at_ms = now;
    let entry = ControlAudit {
        subject: route_key(topic),
        action: name.to_string(),
        by: by.to_string(),
        at_ms: now,
        reason,
    };
    let control_topic = control_topic(group);
    // Compacted, one partition: the latest control per key, in order.
    create_topics_with(
        config,
        &[(control_topic.clone(), 1)],
        kjob::control::TOPIC_CONFIG,
    )
    .await?;
    let producer = Producer::new(config)?;
    // The audit first: nothing is in force without its record.
    producer
        .send_raw(
            &control_topic,
            Some(route_audit_key(topic, now).as_bytes()),
            Some(&serde_json::to_vec(&entry)?),
            OwnedHeaders::new(),
        )
        .await?;
    producer
        .send_raw(
            &control_topic,
            Some(route_key(topic).as_bytes()),
            Some(&serde_json::to_vec(&control)?),
            OwnedHeaders::new(),
        )
        .await?;
    Ok(entry)
}

/// One worker of a group: its latest heartbeat and its group membership,
/// joined by `client.id`.
#[derive(Clone, Debug)]
pub struct WorkerRow {
    /// The member's (or the beat's) `client.id`.
    pub client_id: String,
    /// The latest heartbeat, if it published one.
    pub beat: Option<kjob::control::WorkerBeat>,
    /// The group member, if it is one now.
    pub member: Option<crate::groups::GroupMember>,
}

impl WorkerRow {
    /// Whether the beat is older than three intervals at `now_ms`: the
    /// worker died without its tombstone, or cannot reach Kafka.
    pub fn stale(&self, now_ms: i64) -> bool {
        self.beat
            .as_ref()
            .is_none_or(|b| now_ms - b.at_ms > 3 * kjob::control::BEAT_EVERY.as_millis() as i64)
    }
}

/// `group`'s workers: every member now and every heartbeat on the control
/// topic (a beat without a member is a worker that died uncleanly, or
/// whose `client.id` was overridden), members first. Blocking.
pub fn workers(config: &KafkaConfig, group: &str) -> anyhow::Result<Vec<WorkerRow>> {
    let mut beats = read_control(config, group)?.workers;
    let members: Vec<crate::groups::GroupMember> =
        crate::groups::describe_groups(config, Some(group))?
            .into_iter()
            .flat_map(|g| g.members)
            .collect();
    let mut rows: Vec<WorkerRow> = members
        .into_iter()
        .map(|m| WorkerRow {
            client_id: m.client_id.clone(),
            beat: beats.remove(&m.client_id),
            member: Some(m),
        })
        .collect();
    rows.sort_by(|a, b| a.client_id.cmp(&b.client_id));
    let mut rest: Vec<WorkerRow> = beats
        .into_iter()
        .map(|(id, b)| WorkerRow {
            client_id: id,
            beat: Some(b),
            member: None,
        })
        .collect();
    rest.sort_by(|a, b| a.client_id.cmp(&b.client_id));
    rows.extend(rest);
    Ok(rows)
}
