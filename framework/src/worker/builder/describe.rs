//! The worker's [`Deployment`]: every topic, group and subject it owns,
//! computed from what the builder configured, without connecting.
//!
//! Provisioning (`provision.rs`) creates what this lists; a test starts
//! workers with every feature on and compares the broker's topics with it.

use std::collections::{BTreeMap, BTreeSet};

use crate::deployment::{
    Deployment, GroupRole, GroupSpec, Partitions, Role, SubjectSpec, TopicSpec,
};

use crate::worker::state::{RouteEntry, TopicRole};
use crate::worker::Worker;

impl Worker {
    /// Everything this worker owns: its topics (role, route, partitions,
    /// configs), the consumer groups it joins, the registry subjects it
    /// reads, and (through [`Deployment::acls`]) the ACLs it needs.
    /// Computed without connecting; `KJOB_DESCRIBE=json` makes
    /// [`Worker::run`] print it and return.
    ///
    /// Topics adopted at start from an earlier layout (a route's own tiers
    /// after it moved to shared ones) are not in it: they are read until
    /// drained, never created.
    pub fn deployment(&self) -> Deployment {
        let group = self.settings.group.clone();
        let mut topics: Vec<TopicSpec> = self
            .routes
            .iter()
            .map(|(topic, e)| self.route_topic(topic, e))
            .collect();
        self.dlq_and_order_topics(&mut topics);
        let mut groups = vec![GroupSpec {
            group: group.clone(),
            role: GroupRole::Worker,
            topics: Vec::new(),
            protocol: self.protocol.as_str().to_string(),
            instance_id: self.static_member.clone(),
        }];
        self.group_topics(&mut topics, &mut groups);
        topics.sort_by(|a, b| a.topic.cmp(&b.topic));
        groups[0].topics = topics
            .iter()
            .filter(|t| t.role.consumed())
            .map(|t| t.topic.clone())
            .collect();
        let writes_to: BTreeSet<String> = self.schedules.iter().map(|s| s.topic.clone()).collect();
        Deployment {
            group,
            topics,
            groups,
            subjects: self.subjects(),
            writes_to: writes_to.into_iter().collect(),
        }
    }

    /// A topic of the model with what every one starts from.
    fn spec(&self, topic: String, role: Role, partitions: Partitions) -> TopicSpec {
        TopicSpec {
            topic,
            role,
            route: None,
            shared_by: Vec::new(),
            delay: None,
            partitions,
            configs: BTreeMap::new(),
            sized_from: Vec::new(),
            created_by_worker: self.create_topics,
        }
    }

    /// A route table topic: a main topic, a retry tier or a delay topic,
    /// the route's own or shared.
    fn route_topic(&self, topic: &str, e: &RouteEntry) -> TopicSpec {
        let shared_by: Vec<String> = e
            .sharers
            .as_ref()
            .map(|s| {
                s.keys()
                    .cloned()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect()
            })
            .unwrap_or_default();
        let (role, delay) = match (e.role, shared_by.is_empty()) {
            (TopicRole::Main, _) => (Role::Main, None),
            (TopicRole::Tier(_), own) => (
                if own {
                    Role::RetryTier
                } else {
                    Role::SharedRetryTier
                },
                topic.rsplit_once(".retry.").map(|(_, d)| d.to_string()),
            ),
            (TopicRole::Delay(_), own) => (
                if own { Role::Delay } else { Role::SharedDelay },
                topic.rsplit_once(".delay.").map(|(_, d)| d.to_string()),
            ),
        };
        let mut t = self.spec(topic.to_string(), role, Partitions::Given);
        t.delay = delay;
        match role {
            Role::Main => {
                t.route = Some(topic.to_string());
                // Only the development setting creates a main topic.
                t.created_by_worker = self.create_main_topics.is_some();
            }
            Role::RetryTier | Role::Delay => {
                t.route = Some(e.main.clone());
                t.partitions = Partitions::SameAs(e.main.clone());
                t.sized_from = vec![e.main.clone()];
            }
            _ => {
                t.partitions = match self.shared_tier_partitions {
                    Some(n) => Partitions::Fixed(n as i32),
                    None => Partitions::LargestOf(shared_by.clone()),
                };
                t.sized_from = shared_by.clone();
                t.shared_by = shared_by;
            }
        }
        if matches!(role, Role::Delay | Role::SharedDelay) {
            t.configs.insert(
                "retention.ms".into(),
                crate::delay::CREATED_RETENTION.as_millis().to_string(),
            );
        }
        t
    }

    /// Each route's DLQ and, for strict order, its order topic.
    fn dlq_and_order_topics(&self, topics: &mut Vec<TopicSpec>) {
        for main in &self.mains {
            let mut t = self.spec(
                crate::topics::dlq_topic(main),
                Role::Dlq,
                match self.dlq_partitions {
                    Some(n) => Partitions::Fixed(n as i32),
                    None => Partitions::SameAs(main.clone()),
                },
            );
            t.route = Some(main.clone());
            t.sized_from = vec![main.clone()];
            topics.push(t);
        }
        for main in &self.strict {
            let mut t = self.spec(
                crate::topics::order_topic(main),
                Role::StrictOrder,
                Partitions::SameAs(main.clone()),
            );
            t.route = Some(main.clone());
            t.configs.insert("cleanup.policy".into(), "compact".into());
            topics.push(t);
        }
    }

    /// The group's own topics: the cron leader's and state, the batches'
    /// events and state (with the coordinator's group) and the control
    /// topic.
    fn group_topics(&self, topics: &mut Vec<TopicSpec>, groups: &mut Vec<GroupSpec>) {
        let group = &self.settings.group;
        if !self.schedules.is_empty() {
            topics.push(self.spec(
                crate::schedule::leader_topic(group),
                Role::CronLeader,
                Partitions::Fixed(1),
            ));
            let mut state = self.spec(
                crate::schedule::state_topic(group),
                Role::CronState,
                Partitions::Fixed(1),
            );
            state
                .configs
                .insert("cleanup.policy".into(), "compact".into());
            topics.push(state);
        }
        if let Some(batch) = &self.batches {
            let mut events = self.spec(
                batch.clone(),
                Role::Batch,
                Partitions::Fixed(crate::batch::DEFAULT_PARTITIONS),
            );
            events
                .configs
                .insert("retention.ms".into(), "604800000".into());
            topics.push(events);
            let mut state = self.spec(
                crate::batch::state_topic(batch),
                Role::BatchState,
                Partitions::SameAs(batch.clone()),
            );
            state
                .configs
                .insert("cleanup.policy".into(), "compact".into());
            state.configs.insert(
                "max.message.bytes".into(),
                crate::producer::MAX_MESSAGE_BYTES.into(),
            );
            topics.push(state);
            groups.push(GroupSpec {
                group: crate::batch::coordinator_group(batch),
                role: GroupRole::BatchCoordinator,
                topics: vec![batch.clone()],
                protocol: self.protocol.as_str().to_string(),
                instance_id: self.static_member.clone(),
            });
        }
        let mut control = self.spec(
            crate::control::control_topic(group),
            Role::Control,
            Partitions::Fixed(1),
        );
        control.configs = crate::control::TOPIC_CONFIG
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        topics.push(control);
    }

    /// The registry subject of each main topic, by TopicNameStrategy.
    fn subjects(&self) -> Vec<SubjectSpec> {
        let mut subjects: Vec<SubjectSpec> = self
            .routes
            .iter()
            .filter(|(topic, e)| e.role == TopicRole::Main && **topic == e.main)
            .map(|(topic, e)| SubjectSpec {
                subject: crate::codec::subject_for_topic(topic),
                topic: topic.clone(),
                job: e.handler.job_name().to_string(),
            })
            .collect();
        subjects.sort_by(|a, b| a.subject.cmp(&b.subject));
        subjects
    }
}
