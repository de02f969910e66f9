//! The ACLs a worker needs, from its [`Deployment`]: one rule per role
//! ([`rows`]), applied to each topic and group the model lists, as literal
//! grants (least privilege: exactly the names the worker uses).
//!
//! `kjob acls --model model.json --principal User:worker` prints them as
//! `kafka-acls` commands; the book's table (`docs/src/security.md`) is
//! checked against [`rows`], so a role added here without a row there fails
//! the tests.
//!
//! Not in the model: the topic a batch callback goes to is named by the
//! producer that opens the batch, so the coordinator needs Write on it
//! (grant it with the route that handles the callback).

use serde::{Deserialize, Serialize};

use super::{Deployment, GroupRole, Role};

/// What kind of resource an ACL is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AclResource {
    /// A topic.
    Topic,
    /// A consumer group.
    Group,
}

/// A Kafka ACL operation, as `kafka-acls --operation` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum AclOperation {
    /// Consume (implies Describe).
    Read,
    /// Produce (implies Describe).
    Write,
    /// Create the topic.
    Create,
    /// Read the topic's configs (retention, `max.message.bytes`).
    DescribeConfigs,
}

impl AclOperation {
    /// `kafka-acls`' name.
    pub fn as_str(self) -> &'static str {
        match self {
            AclOperation::Read => "Read",
            AclOperation::Write => "Write",
            AclOperation::Create => "Create",
            AclOperation::DescribeConfigs => "DescribeConfigs",
        }
    }
}

/// One grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acl {
    /// Who (`User:worker`).
    pub principal: String,
    /// A topic or a group.
    pub resource: AclResource,
    /// Its exact name (a literal pattern).
    pub name: String,
    /// What it may do.
    pub operations: Vec<AclOperation>,
    /// Why the worker needs it.
    pub why: String,
}

impl Acl {
    /// The `kafka-acls` command that grants it.
    pub fn command(&self, bootstrap: &str) -> String {
        let mut out = format!(
            "kafka-acls --bootstrap-server {bootstrap} --add --allow-principal {}",
            self.principal
        );
        for op in &self.operations {
            out.push_str(" --operation ");
            out.push_str(op.as_str());
        }
        let flag = match self.resource {
            AclResource::Topic => "--topic",
            AclResource::Group => "--group",
        };
        out.push_str(&format!(" {flag} {}", shell_word(&self.name)));
        out
    }
}

/// Quotes a name for a POSIX shell when it holds anything but the
/// characters Kafka allows in a topic or group name.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// What the worker needs of one kind of resource: the rule the book's
/// table states, one row per role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The topic role, or `None` for a group row.
    pub role: Option<Role>,
    /// The group role, for a group row.
    pub group: Option<GroupRole>,
    /// The operations always needed.
    pub operations: Vec<AclOperation>,
    /// Why.
    pub why: &'static str,
}

impl Row {
    /// The label the book's table gives the row (the role's label).
    pub fn label(&self) -> &'static str {
        match (self.role, self.group) {
            (Some(r), _) => r.label(),
            (None, Some(g)) => g.label(),
            (None, None) => "",
        }
    }
}

/// The operations a worker needs on a topic of `role` (Create comes on top
/// for each topic the worker creates). `None` for a role the worker never
/// touches: the DLQ audit trail is the operators'.
pub fn operations(role: Role) -> Option<(Vec<AclOperation>, &'static str)> {
    use AclOperation::{DescribeConfigs, Read, Write};
    Some(match role {
        Role::Main => (vec![Read], "consume jobs"),
        Role::RetryTier => (
            vec![Read, Write],
            "forward failed jobs and consume them when due",
        ),
        Role::SharedRetryTier => (
            vec![Read, Write],
            "the same, for every route of the group that shares its tiers",
        ),
        Role::Delay => (
            vec![Read, Write, DescribeConfigs],
            "hop delayed jobs on; the delay producer checks the retention",
        ),
        Role::SharedDelay => (
            vec![Read, Write, DescribeConfigs],
            "the same, for every route of the group that shares its buckets",
        ),
        Role::Dlq => (vec![Write], "dead-letter"),
        Role::DlqAudit => return None,
        Role::StrictOrder => (
            vec![Read, Write],
            "record and read which key waits for which job",
        ),
        Role::CronLeader => (vec![Read], "the owner of partition 0 fires the schedules"),
        Role::CronState => (vec![Read, Write], "what each schedule fired last"),
        Role::Batch => (
            vec![Read, Write],
            "record finished jobs of a batch; the coordinator folds them",
        ),
        Role::BatchState => (vec![Read, Write], "the coordinator's snapshots"),
        Role::Control => (
            vec![Read, Write],
            "follow operators' pauses and cancellations; publish the heartbeat",
        ),
    })
}

/// The operations on a group of `role`.
pub fn group_operations(role: GroupRole) -> (Vec<AclOperation>, &'static str) {
    match role {
        GroupRole::Worker => (vec![AclOperation::Read], "join, commit"),
        GroupRole::BatchCoordinator => (
            vec![AclOperation::Read],
            "the batch coordinator joins and commits",
        ),
    }
}

/// Every row of the rule, in the book's order: one per topic role the
/// worker touches, then one per group role.
pub fn rows() -> Vec<Row> {
    let topics = Role::ALL.iter().filter_map(|r| {
        operations(*r).map(|(operations, why)| Row {
            role: Some(*r),
            group: None,
            operations,
            why,
        })
    });
    let groups = [GroupRole::Worker, GroupRole::BatchCoordinator]
        .into_iter()
        .map(|g| {
            let (operations, why) = group_operations(g);
            Row {
                role: None,
                group: Some(g),
                operations,
                why,
            }
        });
    topics.chain(groups).collect()
}

/// Every grant `model` needs, for `principal`.
pub(super) fn of(model: &Deployment, principal: &str) -> Vec<Acl> {
    let mut out = Vec::new();
    // A main topic is read for its max.message.bytes when the worker
    // creates a topic sized from it.
    let sized: std::collections::BTreeSet<&str> = model
        .topics
        .iter()
        .filter(|t| t.created_by_worker)
        .flat_map(|t| t.sized_from.iter().map(String::as_str))
        .collect();
    for t in &model.topics {
        let Some((mut ops, why)) = operations(t.role) else {
            continue;
        };
        let mut why = why.to_string();
        if t.role == Role::Main && sized.contains(t.topic.as_str()) {
            ops.push(AclOperation::DescribeConfigs);
            why.push_str("; its max.message.bytes sizes the topics the worker creates");
        }
        if t.created_by_worker {
            ops.push(AclOperation::Create);
            why.push_str("; created at start when missing");
        }
        out.push(Acl {
            principal: principal.to_string(),
            resource: AclResource::Topic,
            name: t.topic.clone(),
            operations: ops,
            why,
        });
    }
    for t in &model.writes_to {
        if model.topic(t).is_some() {
            if let Some(acl) = out.iter_mut().find(|a| a.name == *t) {
                if !acl.operations.contains(&AclOperation::Write) {
                    acl.operations.push(AclOperation::Write);
                    acl.why.push_str("; a cron schedule enqueues here");
                }
            }
            continue;
        }
        out.push(Acl {
            principal: principal.to_string(),
            resource: AclResource::Topic,
            name: t.clone(),
            operations: vec![AclOperation::Write],
            why: "a cron schedule enqueues here".into(),
        });
    }
    for g in &model.groups {
        let (operations, why) = group_operations(g.role);
        out.push(Acl {
            principal: principal.to_string(),
            resource: AclResource::Group,
            name: g.group.clone(),
            operations,
            why: why.to_string(),
        });
    }
    out
}
