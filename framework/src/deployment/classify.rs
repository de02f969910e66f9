//! A topic's role from its name alone, by the rules the worker names its
//! topics with: what `kjob topics list` and `kjob status` show for a
//! cluster whose workers are not at hand (no model file).
//!
//! A name says only so much: `<x>.retry.30s` is a route's tier when `x` is
//! a topic and the group's shared tier when `x` is a consumer group, so the
//! caller passes both lists. With a worker's [`super::Deployment`] the
//! roles are exact; these rules agree with it for every name it produces
//! (tested in `tests.rs`).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::Role;
use crate::delay::delay_topics;
use crate::retry::{format_delay, parse_delay};

/// What [`classify`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classified {
    /// The role.
    pub role: Role,
    /// The route (main topic) it belongs to, for a route's topic.
    pub route: Option<String>,
    /// The consumer group it belongs to, for a group-wide topic (shared
    /// tiers, control, cron) or a batch topic's coordinator group.
    pub group: Option<String>,
    /// A tier's or delay topic's delay (`30s`, `1d`).
    pub delay: Option<String>,
}

impl Classified {
    fn route(role: Role, route: &str) -> Self {
        Classified {
            role,
            route: Some(route.to_string()),
            group: None,
            delay: None,
        }
    }

    fn group(role: Role, group: &str) -> Self {
        Classified {
            role,
            route: None,
            group: Some(group.to_string()),
            delay: None,
        }
    }

    fn delayed(mut self, delay: String) -> Self {
        self.delay = Some(delay);
        self
    }
}

/// The delay a tier's or delay bucket's name says (`30s`, `5m`, `1d`).
pub fn delay_duration(name: &str) -> Option<std::time::Duration> {
    parse_delay(name).or_else(|| crate::delay::bucket_delay(name))
}

/// The role of every topic among `topics` (every topic of the cluster)
/// that a kjob rule names, with `groups` the consumer groups the caller
/// knows. A topic no rule names (an unrelated topic, or a main topic with
/// none of its own topics yet) is left out.
pub fn classify(topics: &[String], groups: &[String]) -> BTreeMap<String, Classified> {
    let names = Names {
        topics: topics.iter().map(String::as_str).collect(),
        groups: groups.iter().map(String::as_str).collect(),
    };
    let mut out: BTreeMap<String, Classified> = topics
        .iter()
        .filter_map(|t| Some((t.clone(), names.own(t)?)))
        .collect();
    // A main topic: one that has a topic of its own among the others.
    let mains: BTreeSet<String> = out
        .values()
        .filter_map(|c| c.route.clone())
        .filter(|r| names.topics.contains(r.as_str()) && !out.contains_key(r))
        .collect();
    for main in mains {
        out.insert(main.clone(), Classified::route(Role::Main, &main));
    }
    out
}

/// The cluster's names, for look-ups.
struct Names<'a> {
    topics: HashSet<&'a str>,
    groups: HashSet<&'a str>,
}

impl Names<'_> {
    fn exists(&self, t: &str) -> bool {
        self.topics.contains(t)
    }

    fn is_group(&self, g: &str) -> bool {
        self.groups.contains(g)
    }

    /// A name that is both a topic and a group reads as the route's (the
    /// worker's own rules refuse a shared namespace named like a route).
    fn shared(&self, owner: &str) -> bool {
        self.is_group(owner) && !self.exists(owner)
    }

    /// The role of a topic that is not a main topic.
    fn own(&self, topic: &str) -> Option<Classified> {
        if let Some(main) = topic.strip_suffix(".dlq.audit") {
            return Some(Classified::route(Role::DlqAudit, main));
        }
        if let Some(main) = topic.strip_suffix(".dlq") {
            return Some(Classified::route(Role::Dlq, main));
        }
        if let Some((owner, delay)) = topic.rsplit_once(".retry.") {
            if let Some(d) = parse_delay(delay) {
                let found = match self.shared(owner) {
                    true => Classified::group(Role::SharedRetryTier, owner),
                    false => Classified::route(Role::RetryTier, owner),
                };
                return Some(found.delayed(format_delay(d)));
            }
        }
        if let Some((owner, bucket)) = topic.rsplit_once(".delay.") {
            if delay_topics(owner).iter().any(|t| t == topic) {
                let found = match self.shared(owner) {
                    true => Classified::group(Role::SharedDelay, owner),
                    false => Classified::route(Role::Delay, owner),
                };
                return Some(found.delayed(bucket.to_string()));
            }
        }
        if let Some(group) = topic.strip_suffix(".schedules.state") {
            return Some(Classified::group(Role::CronState, group));
        }
        if let Some(group) = topic.strip_suffix(".schedules") {
            if self.is_group(group) || self.exists(&format!("{topic}.state")) {
                return Some(Classified::group(Role::CronLeader, group));
            }
        }
        if let Some(group) = topic.strip_suffix(".control") {
            if self.is_group(group) {
                return Some(Classified::group(Role::Control, group));
            }
        }
        let coordinator = |t: &str| {
            let g = crate::batch::coordinator_group(t);
            self.is_group(&g).then_some(g)
        };
        if let Some(batch) = topic.strip_suffix(".state") {
            if let Some(g) = coordinator(batch).filter(|_| self.exists(batch)) {
                return Some(Classified::group(Role::BatchState, &g));
            }
        }
        if let Some(g) = coordinator(topic) {
            return Some(Classified::group(Role::Batch, &g));
        }
        if let Some(main) = topic.strip_suffix(".order") {
            if self.exists(main) {
                return Some(Classified::route(Role::StrictOrder, main));
            }
        }
        None
    }
}
