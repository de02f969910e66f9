//! One description of everything a worker owns: its topics (role, route,
//! partitions, configs), the consumer groups it joins, the registry
//! subjects it reads, and the ACLs all of that needs.
//!
//! [`crate::Worker::deployment`] computes it from the builder's settings
//! without connecting to anything, and every part that needs to know what a
//! worker owns reads it from here: provisioning creates the topics it lists
//! (`worker/builder/provision.rs`), `kjob topics list` names roles by the same rules
//! ([`classify()`]), `kjob acls` prints the grants ([`Deployment::acls`]), and
//! the book's ACL table is checked against [`acls::rows`]. A subsystem that
//! adds a topic or a group adds it here, never beside it.
//!
//! A worker binary prints its model and exits, without connecting, when
//! `KJOB_DESCRIBE=json` is set ([`DESCRIBE_ENV`]): `KJOB_DESCRIBE=json
//! ./my-worker > model.json`, then `kjob acls --model model.json
//! --principal User:worker`.
//!
//! What the model cannot know before connecting it says as a rule: a main
//! topic's partition count is the application's ([`Partitions::Given`]),
//! a tier takes its main topic's ([`Partitions::SameAs`]).

pub mod acls;
mod classify;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use acls::{Acl, AclOperation, AclResource};
pub use classify::{classify, delay_duration, Classified};

/// The variable that makes [`crate::Worker::run`] print the worker's
/// [`Deployment`] as JSON on stdout and return without connecting.
pub const DESCRIBE_ENV: &str = "KJOB_DESCRIBE";

/// Whether `KJOB_DESCRIBE` asks for the model (`json`, the one form); an
/// unset or empty variable is no, another value is refused naming the one
/// that works. [`crate::Worker::run`] checks it itself; a program that does
/// setup before it builds its worker (creates tables, enqueues) checks it
/// first, prints [`crate::Worker::deployment`] and skips the setup.
pub fn describe_requested() -> crate::Result<bool> {
    let Ok(value) = std::env::var(DESCRIBE_ENV) else {
        return Ok(false);
    };
    match value.trim() {
        "" => Ok(false),
        "json" => Ok(true),
        other => Err(crate::Error::InvalidSetting {
            name: DESCRIBE_ENV.into(),
            value: other.to_string(),
            reason: "the one form is `json` (KJOB_DESCRIBE=json prints the worker's model and exits); unset it to run".into(),
        }),
    }
}

/// What a topic is to the worker that owns it. One list for the worker,
/// `kjob topics`, `kjob status`, the dashboard and the ACL table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The route's main topic: where jobs are enqueued.
    Main,
    /// A retry tier: failed jobs wait there for their next attempt.
    RetryTier,
    /// A retry tier the group's routes share (`<group>.retry.<delay>`,
    /// `WorkerBuilder::shared_retry_tiers`): its lag counts every route's
    /// retries, each record naming its route in `kjob-route`.
    SharedRetryTier,
    /// A delay topic: delayed jobs wait there until their time.
    Delay,
    /// A delay bucket the group's routes share (`<group>.delay.<bucket>`,
    /// `SharedTiers::delay_buckets`), each record naming its route in
    /// `kjob-route`.
    SharedDelay,
    /// The dead-letter topic.
    Dlq,
    /// The audit trail of what operators did with dead letters (written by
    /// `kjob dlq`, not by the worker).
    DlqAudit,
    /// The compacted order state of a strict-order route.
    StrictOrder,
    /// The group's cron leader topic (one partition).
    CronLeader,
    /// The group's cron state (last tick fired per schedule).
    CronState,
    /// A batch topic: batch openings, seals and finished jobs.
    Batch,
    /// A batch topic's compacted snapshots (`<batch topic>.state`).
    BatchState,
    /// The group's control topic (`<group>.control`): operators' pauses
    /// and cancellations, and every worker's heartbeat.
    Control,
}

impl Role {
    /// Every role, in table order.
    pub const ALL: [Role; 13] = [
        Role::Main,
        Role::RetryTier,
        Role::SharedRetryTier,
        Role::Delay,
        Role::SharedDelay,
        Role::Dlq,
        Role::DlqAudit,
        Role::StrictOrder,
        Role::CronLeader,
        Role::CronState,
        Role::Batch,
        Role::BatchState,
        Role::Control,
    ];

    /// How tables name it.
    pub fn label(&self) -> &'static str {
        match self {
            Role::Main => "main",
            Role::RetryTier => "retry tier",
            Role::SharedRetryTier => "shared retry tier",
            Role::Delay => "delay",
            Role::SharedDelay => "shared delay",
            Role::Dlq => "dlq",
            Role::DlqAudit => "dlq audit",
            Role::StrictOrder => "strict order",
            Role::CronLeader => "cron leader",
            Role::CronState => "cron state",
            Role::Batch => "batch",
            Role::BatchState => "batch state",
            Role::Control => "control",
        }
    }

    /// Whether the worker's consumer group reads it through its
    /// subscription (so its lag means jobs waiting): the main topic, the
    /// tiers, the delay topics and the cron leader topic. The others are
    /// written and read by other means (the coordinator's group reads the
    /// batch topic).
    pub fn consumed(&self) -> bool {
        matches!(
            self,
            Role::Main
                | Role::RetryTier
                | Role::SharedRetryTier
                | Role::Delay
                | Role::SharedDelay
                | Role::CronLeader
        )
    }

    /// Whether the topic belongs to the whole group rather than one route.
    pub fn group_wide(&self) -> bool {
        matches!(
            self,
            Role::SharedRetryTier
                | Role::SharedDelay
                | Role::CronLeader
                | Role::CronState
                | Role::Control
        )
    }
}

/// How many partitions a topic is created with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Partitions {
    /// The application's choice: a main topic exists before the worker
    /// starts (or is created by `kjob topics create`).
    Given,
    /// This many.
    Fixed(i32),
    /// The same as this topic's (a tier and its main topic).
    SameAs(String),
    /// The largest of these topics' (a shared tier and its routes' main
    /// topics).
    LargestOf(Vec<String>),
}

/// One topic the worker owns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSpec {
    /// The topic's name.
    pub topic: String,
    /// What it is to the worker.
    pub role: Role,
    /// The route (its main topic) it belongs to; `None` for a topic of the
    /// whole group or a batch topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// On a shared tier or delay bucket: the routes whose records pass
    /// through it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_by: Vec<String>,
    /// A retry tier's or delay topic's delay (`30s`, `1d`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// Its partition count.
    pub partitions: Partitions,
    /// The configs it is created with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub configs: BTreeMap<String, String>,
    /// When set, it is created with `max.message.bytes` = the largest of
    /// these topics' plus kjob's headers
    /// ([`crate::topics::FORWARD_HEADROOM_BYTES`]): a record its main topic
    /// accepted can always be forwarded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sized_from: Vec<String>,
    /// Whether the worker creates it at start when it is missing (with
    /// `WorkerBuilder::create_topics`, the default). A main topic is the
    /// application's; with `create_topics(false)` an admin creates them all.
    pub created_by_worker: bool,
}

/// What a consumer group is to the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupRole {
    /// The worker's own group: routes, tiers, delays, the cron leader.
    Worker,
    /// The batch coordinator's group (`<batch topic>.coordinator`).
    BatchCoordinator,
}

impl GroupRole {
    /// How tables name it.
    pub fn label(&self) -> &'static str {
        match self {
            GroupRole::Worker => "worker group",
            GroupRole::BatchCoordinator => "batch coordinator group",
        }
    }
}

/// One consumer group the worker joins. Every one gets its settings from
/// the same place (`crate::membership`), so they are listed once here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSpec {
    /// The group id.
    pub group: String,
    /// What it is to the worker.
    pub role: GroupRole,
    /// The topics its members subscribe to.
    pub topics: Vec<String>,
    /// `classic` or `consumer` (KIP-848).
    pub protocol: String,
    /// The static-member id, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
}

/// One registry subject the worker reads (TopicNameStrategy:
/// `<topic>-value`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubjectSpec {
    /// The subject.
    pub subject: String,
    /// The topic it is named from.
    pub topic: String,
    /// The contract read from it.
    pub job: String,
}

/// Everything one worker owns, as [`crate::Worker::deployment`] computes
/// it. Serialises to the JSON that `KJOB_DESCRIBE=json` prints and `kjob
/// acls --model` and `kjob topics list --model` read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    /// The worker's consumer group.
    pub group: String,
    /// Every topic, sorted by name.
    pub topics: Vec<TopicSpec>,
    /// Every consumer group it joins.
    pub groups: Vec<GroupSpec>,
    /// Every registry subject it reads.
    pub subjects: Vec<SubjectSpec>,
    /// Topics the worker writes to without owning them (a cron schedule's
    /// target, a batch callback's topic named at enqueue time is not
    /// known here: see [`acls`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writes_to: Vec<String>,
}

impl Deployment {
    /// The topic named `name`, when the worker owns it.
    pub fn topic(&self, name: &str) -> Option<&TopicSpec> {
        self.topics.iter().find(|t| t.topic == name)
    }

    /// The names of every topic, sorted.
    pub fn topic_names(&self) -> Vec<String> {
        self.topics.iter().map(|t| t.topic.clone()).collect()
    }

    /// Every ACL the worker needs, with `principal` (`User:worker`).
    pub fn acls(&self, principal: &str) -> Vec<Acl> {
        acls::of(self, principal)
    }

    /// Pretty JSON, as `KJOB_DESCRIBE=json` prints it.
    pub fn to_json(&self) -> String {
        // A plain data struct of strings, numbers and maps: serialising it
        // cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Reads the JSON [`Deployment::to_json`] wrote.
    pub fn from_json(text: &str) -> crate::Result<Self> {
        serde_json::from_str(text).map_err(|e| crate::Error::InvalidSetting {
            name: "deployment model".into(),
            value: text.chars().take(60).collect(),
            reason: format!(
                "not a worker model ({e}); write one with `KJOB_DESCRIBE=json ./your-worker > model.json`"
            ),
        })
    }
}

#[cfg(test)]
mod tests;
