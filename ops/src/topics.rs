//! A route's topics by role, as the worker names them, and the cluster's
//! view of them: `kjob topics list | describe | create` and every topic
//! `kjob status` shows.
//!
//! For a route with main topic `orders` the worker uses `orders`,
//! `orders.retry.<delay>` per retry tier ([`kjob::retry::tier_topic`]),
//! `orders.delay.<bucket>` for delayed jobs ([`kjob::delay::delay_topic`]),
//! `orders.dlq` and its audit trail `orders.dlq.audit`
//! ([`kjob::topics::dlq_topic`]), `orders.order` on a strict-order route
//! ([`kjob::topics::order_topic`]) and, for a group with cron schedules,
//! `<group>.schedules` and `<group>.schedules.state`
//! ([`kjob::schedule::leader_topic`], [`kjob::schedule::state_topic`]).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{anyhow, Result};
use rdkafka::admin::{AdminClient, AdminOptions, ConfigSource, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;

use crate::problem::Problem;
use kjob::config::KafkaConfig;
use kjob::delay::delay_topics;
use kjob::topics::{dlq_topic, order_topic};

/// What a topic is to its route or group: kjob's one list
/// ([`kjob::deployment::Role`]), shared with the worker's model.
pub use kjob::deployment::Role;

/// One topic of a route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RouteTopic {
    /// The topic.
    pub topic: String,
    /// Its role.
    pub role: Role,
    /// For a retry tier or delay topic, its delay (`30s`, `1d`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
}

/// Every topic of the route of `main` that exists among `all_topics`, by
/// role, named by the worker's own rules ([`kjob::deployment::classify`]):
/// main, retry tiers (shortest first; with `group`, the group's shared
/// tiers for a route without tiers of its own), delay topics (shortest
/// first; likewise the group's shared buckets), DLQ, DLQ audit, strict
/// order, and with `group` the group's cron topics.
pub fn route_topics(main: &str, group: Option<&str>, all_topics: &[String]) -> Vec<RouteTopic> {
    let groups: Vec<String> = group.into_iter().map(str::to_string).collect();
    let found = kjob::deployment::classify(all_topics, &groups);
    let of = |role: Role, owner: &dyn Fn(&kjob::deployment::Classified) -> bool| {
        let mut v: Vec<RouteTopic> = found
            .iter()
            .filter(|(_, c)| c.role == role && owner(c))
            .map(|(t, c)| RouteTopic {
                topic: t.clone(),
                role,
                delay: c.delay.clone(),
            })
            .collect();
        // Shortest delay first (a bucket's `1d` too).
        v.sort_by_key(|t| {
            t.delay
                .as_deref()
                .and_then(kjob::deployment::delay_duration)
        });
        v
    };
    let mine = |c: &kjob::deployment::Classified| c.route.as_deref() == Some(main);
    let the_group =
        |c: &kjob::deployment::Classified| c.group.is_some() && c.group.as_deref() == group;
    let mut out = vec![RouteTopic {
        topic: main.to_string(),
        role: Role::Main,
        delay: None,
    }];
    let tiers = of(Role::RetryTier, &mine);
    let no_tiers = tiers.is_empty();
    out.extend(tiers);
    if no_tiers {
        out.extend(of(Role::SharedRetryTier, &the_group));
    }
    let delays = of(Role::Delay, &mine);
    let no_delays = delays.is_empty();
    out.extend(delays);
    if no_delays {
        out.extend(of(Role::SharedDelay, &the_group));
    }
    for role in [Role::Dlq, Role::DlqAudit, Role::StrictOrder] {
        out.extend(of(role, &mine));
    }
    for role in [Role::CronLeader, Role::CronState] {
        out.extend(of(role, &the_group));
    }
    out
}

/// A topic as the cluster describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TopicInfo {
    /// The topic.
    pub topic: String,
    /// Partition count.
    pub partitions: usize,
    /// Replicas of its first partition.
    pub replication_factor: usize,
    /// Per partition: leader, replicas and in-sync replicas (broker ids).
    pub partition_details: Vec<PartitionInfo>,
    /// The configs set on the topic itself (`kafka-topics --describe`'s
    /// `Configs:`), when they could be read.
    pub configs: BTreeMap<String, String>,
}

/// One partition of a [`TopicInfo`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PartitionInfo {
    /// Partition number.
    pub partition: i32,
    /// Broker id of its leader (-1: none).
    pub leader: i32,
    /// Broker ids of its replicas.
    pub replicas: Vec<i32>,
    /// Broker ids of its in-sync replicas.
    pub isr: Vec<i32>,
}

/// Every topic name in the cluster with its partition count, from one
/// metadata request. Blocking.
pub fn topic_partitions(config: &KafkaConfig) -> Result<BTreeMap<String, TopicInfo>> {
    let client: BaseConsumer = config
        .client_config(&[])
        .create()
        .map_err(|e| kjob::Error::kafka("creating metadata client", e))?;
    let md = client
        .fetch_metadata(None, Duration::from_secs(10))
        .map_err(|e| {
            kjob::Error::kafka(
                format!("fetching metadata from {}", config.bootstrap_servers),
                e,
            )
        })?;
    Ok(md
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .map(|t| {
            let parts: Vec<PartitionInfo> = t
                .partitions()
                .iter()
                .map(|p| PartitionInfo {
                    partition: p.id(),
                    leader: p.leader(),
                    replicas: p.replicas().to_vec(),
                    isr: p.isr().to_vec(),
                })
                .collect();
            let info = TopicInfo {
                topic: t.name().to_string(),
                partitions: parts.len(),
                replication_factor: parts.first().map_or(0, |p| p.replicas.len()),
                partition_details: parts,
                configs: BTreeMap::new(),
            };
            (t.name().to_string(), info)
        })
        .collect())
}

/// The configs set on each topic itself, as `kafka-topics --describe`
/// shows them (empty where they could not be read: no DescribeConfigs
/// permission).
pub async fn topic_configs(
    config: &KafkaConfig,
    topics: &[String],
) -> Result<Vec<BTreeMap<String, String>>> {
    let admin: AdminClient<DefaultClientContext> = config
        .client_config(&[])
        .create()
        .map_err(|e| kjob::Error::kafka("creating admin client", e))?;
    let specs: Vec<ResourceSpecifier<'_>> = topics
        .iter()
        .map(|t| ResourceSpecifier::Topic(t.as_str()))
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .describe_configs(&specs, &opts)
        .await
        .map_err(|e| kjob::Error::kafka("describing topic configs", e))?;
    Ok(results
        .into_iter()
        .map(|r| match r {
            Ok(resource) => resource
                .entries
                .into_iter()
                .filter(|e| e.source == ConfigSource::DynamicTopic)
                .filter_map(|e| {
                    let value = if e.is_sensitive {
                        "***".to_string()
                    } else {
                        e.value?
                    };
                    Some((e.name, value))
                })
                .collect(),
            Err(_) => BTreeMap::new(),
        })
        .collect())
}

/// `k=v` of a `--config` flag.
pub fn parse_config(arg: &str) -> Result<(String, String)> {
    match arg.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(anyhow!(Problem::usage(format!(
            "--config `{arg}` is not key=value (e.g. --config retention.ms=604800000)"
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn tiers_sort_by_their_delay_even_when_named_like_a_bucket() {
        // `1s` is also a delay bucket's name; a tier sorts by its duration.
        let all = names(&["orders", "orders.retry.5s", "orders.retry.1s", "orders.dlq"]);
        let got: Vec<String> = route_topics("orders", None, &all)
            .into_iter()
            .map(|t| t.topic)
            .collect();
        assert_eq!(
            got,
            names(&["orders", "orders.retry.1s", "orders.retry.5s", "orders.dlq"])
        );
    }

    #[test]
    fn every_topic_of_a_route_by_role() {
        let all = names(&[
            "orders",
            "orders.retry.30s",
            "orders.retry.5s",
            "orders.delay.1s",
            "orders.delay.1d",
            "orders.dlq",
            "orders.dlq.audit",
            "orders.order",
            "g.schedules",
            "g.schedules.state",
            "ordersx.dlq",
            "billing",
        ]);
        let got: Vec<(String, &str, Option<String>)> = route_topics("orders", Some("g"), &all)
            .into_iter()
            .map(|t| (t.topic, t.role.label(), t.delay))
            .collect();
        let want = vec![
            ("orders".to_string(), "main", None),
            (
                "orders.retry.5s".into(),
                "retry tier",
                Some("5s".to_string()),
            ),
            ("orders.retry.30s".into(), "retry tier", Some("30s".into())),
            ("orders.delay.1s".into(), "delay", Some("1s".into())),
            ("orders.delay.1d".into(), "delay", Some("1d".into())),
            ("orders.dlq".into(), "dlq", None),
            ("orders.dlq.audit".into(), "dlq audit", None),
            ("orders.order".into(), "strict order", None),
            ("g.schedules".into(), "cron leader", None),
            ("g.schedules.state".into(), "cron state", None),
        ];
        assert_eq!(got, want);
        assert!(parse_config("retention.ms=1").is_ok());
        assert!(parse_config("nope").is_err());
    }
}

/// What `kjob topics plan` proposes for one topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanAction {
    /// Exists and is needed.
    Keep,
    /// Needed, missing: a worker creates it at start (or `kjob topics create`).
    Create,
    /// Exists, no longer needed: delete it once it is drained (no records
    /// left unhandled by the route's group).
    DeleteOnceDrained,
}

impl PlanAction {
    /// How tables name it.
    pub fn label(&self) -> &'static str {
        match self {
            PlanAction::Keep => "keep",
            PlanAction::Create => "create",
            PlanAction::DeleteOnceDrained => "delete once drained",
        }
    }
}

/// One row of a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlanRow {
    /// The topic.
    pub topic: String,
    /// Its role.
    pub role: Role,
    /// Its partitions on the cluster now (`None`: it does not exist).
    pub today: Option<usize>,
    /// Its partitions in the planned layout (`None`: not needed).
    pub after: Option<usize>,
    /// What to do.
    pub action: PlanAction,
}

/// What a route's layout needs: its retry tiers, whether it takes delayed
/// jobs, whether it runs under strict order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteLayout {
    /// The main topic.
    pub main: String,
    /// Retry tier delays, shortest first.
    pub tiers: Vec<Duration>,
    /// Delay topics (`WorkerBuilder::delayed_jobs_on`).
    pub delays: bool,
    /// The order topic (`WorkerBuilder::strict_order`).
    pub strict: bool,
    /// Its retry tiers are the shared `<namespace>.retry.<delay>`
    /// (`WorkerBuilder::shared_retry_tiers`) instead of its own; see
    /// [`plan_shared`].
    pub shared: bool,
    /// Its delay buckets (when it takes delayed jobs) are the shared
    /// `<namespace>.delay.<bucket>` (`SharedTiers::delay_buckets`).
    pub shared_delays: bool,
    /// Partitions of its DLQ when it is created
    /// (`WorkerBuilder::dlq_partitions`); `None`: the main topic's.
    pub dlq_partitions: Option<usize>,
}

/// The topics `layout` needs and the route's topics it does not, against
/// the cluster's `topics` (name -> partitions). A missing topic gets the
/// main topic's partition count (`partitions` when the main topic is
/// missing too), as a worker creates it. The DLQ audit topic and the
/// group's cron topics are left out: nothing here changes them.
pub fn plan(
    layout: &RouteLayout,
    topics: &BTreeMap<String, usize>,
    partitions: usize,
) -> Vec<PlanRow> {
    let main_count = topics.get(&layout.main).copied().unwrap_or(partitions);
    let mut wanted: Vec<(String, Role)> = vec![(layout.main.clone(), Role::Main)];
    if !layout.shared {
        wanted.extend(
            layout
                .tiers
                .iter()
                .map(|d| (kjob::retry::tier_topic(&layout.main, *d), Role::RetryTier)),
        );
    }
    if layout.delays && !layout.shared_delays {
        wanted.extend(
            delay_topics(&layout.main)
                .into_iter()
                .map(|t| (t, Role::Delay)),
        );
    }
    wanted.push((dlq_topic(&layout.main), Role::Dlq));
    if layout.strict {
        wanted.push((order_topic(&layout.main), Role::StrictOrder));
    }
    let mut rows: Vec<PlanRow> = wanted
        .iter()
        .map(|(topic, role)| {
            let today = topics.get(topic).copied();
            let new_count = match role {
                Role::Dlq => layout.dlq_partitions.unwrap_or(main_count),
                _ => main_count,
            };
            PlanRow {
                topic: topic.clone(),
                role: *role,
                today,
                after: Some(today.unwrap_or(new_count)),
                action: if today.is_some() {
                    PlanAction::Keep
                } else {
                    PlanAction::Create
                },
            }
        })
        .collect();
    let names: Vec<String> = topics.keys().cloned().collect();
    for t in route_topics(&layout.main, None, &names) {
        let unused = matches!(t.role, Role::RetryTier | Role::Delay | Role::StrictOrder)
            && !wanted.iter().any(|(w, _)| *w == t.topic);
        if unused {
            rows.push(PlanRow {
                today: topics.get(&t.topic).copied(),
                after: None,
                action: PlanAction::DeleteOnceDrained,
                topic: t.topic,
                role: t.role,
            });
        }
    }
    rows
}

/// The shared retry tiers of the routes in `layouts` that share them
/// (`shared`), named after `namespace` (the group unless the worker names
/// another): one topic per distinct delay; and the shared delay buckets
/// `<namespace>.delay.<bucket>` when a route that takes delayed jobs shares
/// them (`shared_delays`). A missing one gets `shared_partitions`
/// (`SharedTiers::partitions`), else the largest sharing main topic's
/// partition count, as the worker creates it. Empty when no route shares.
pub fn plan_shared(
    namespace: &str,
    layouts: &[RouteLayout],
    topics: &BTreeMap<String, usize>,
    partitions: usize,
    shared_partitions: Option<usize>,
) -> Vec<PlanRow> {
    let widest = |sharing: &[&RouteLayout]| {
        sharing
            .iter()
            .map(|l| topics.get(&l.main).copied().unwrap_or(partitions))
            .max()
            .map(|w| shared_partitions.unwrap_or(w))
    };
    let row = |topic: String, role: Role, new_count: usize| {
        let today = topics.get(&topic).copied();
        PlanRow {
            after: Some(today.unwrap_or(new_count)),
            action: if today.is_some() {
                PlanAction::Keep
            } else {
                PlanAction::Create
            },
            today,
            topic,
            role,
        }
    };
    let mut rows = Vec::new();
    let sharing: Vec<&RouteLayout> = layouts.iter().filter(|l| l.shared).collect();
    if let Some(count) = widest(&sharing) {
        let mut delays: Vec<Duration> = sharing.iter().flat_map(|l| l.tiers.clone()).collect();
        delays.sort();
        delays.dedup();
        rows.extend(delays.into_iter().map(|d| {
            row(
                kjob::retry::tier_topic(namespace, d),
                Role::SharedRetryTier,
                count,
            )
        }));
    }
    let delaying: Vec<&RouteLayout> = layouts
        .iter()
        .filter(|l| l.delays && l.shared_delays)
        .collect();
    if let Some(count) = widest(&delaying) {
        rows.extend(
            delay_topics(namespace)
                .into_iter()
                .map(|t| row(t, Role::SharedDelay, count)),
        );
    }
    rows
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    #[test]
    fn a_plan_keeps_creates_and_lets_go_of_what_the_layout_no_longer_needs() {
        let mut topics = BTreeMap::new();
        topics.insert("orders".to_string(), 6);
        topics.insert("orders.retry.5s".to_string(), 6);
        topics.insert("orders.retry.30m".to_string(), 6);
        topics.insert("orders.dlq".to_string(), 6);
        for t in delay_topics("orders") {
            topics.insert(t, 6);
        }
        topics.insert("other".to_string(), 3);
        let layout = RouteLayout {
            main: "orders".into(),
            tiers: vec![Duration::from_secs(5), Duration::from_secs(30)],
            delays: false,
            strict: false,
            shared: false,
            shared_delays: false,
            dlq_partitions: None,
        };
        let rows = plan(&layout, &topics, 12);
        let of = |t: &str| {
            rows.iter()
                .find(|r| r.topic == t)
                .map(|r| (r.action, r.today, r.after))
        };
        assert_eq!(of("orders"), Some((PlanAction::Keep, Some(6), Some(6))));
        assert_eq!(
            of("orders.retry.30s"),
            Some((PlanAction::Create, None, Some(6)))
        );
        assert_eq!(
            of("orders.retry.30m"),
            Some((PlanAction::DeleteOnceDrained, Some(6), None))
        );
        assert_eq!(
            of("orders.delay.1d"),
            Some((PlanAction::DeleteOnceDrained, Some(6), None))
        );
        assert_eq!(of("orders.dlq"), Some((PlanAction::Keep, Some(6), Some(6))));
        assert_eq!(of("other"), None, "another route is not touched");
        assert_eq!(rows.len(), 1 + 2 + 1 + 1 + 7);
        // A new route: everything created with --partitions.
        let fresh = plan(
            &RouteLayout {
                main: "mail".into(),
                delays: true,
                ..layout
            },
            &topics,
            12,
        );
        assert!(fresh
            .iter()
            .all(|r| r.action == PlanAction::Create && r.after == Some(12)));
        assert_eq!(fresh.len(), 1 + 2 + 7 + 1);
    }

    #[test]
    fn shared_tiers_cost_one_set_for_every_route_and_free_the_routes_own() {
        let secs = Duration::from_secs;
        let mut topics = BTreeMap::new();
        for r in 0..100 {
            topics.insert(format!("r{r}"), 12);
        }
        topics.insert("r0.retry.5s".to_string(), 12);
        let layouts: Vec<RouteLayout> = (0..100)
            .map(|r| RouteLayout {
                main: format!("r{r}"),
                tiers: vec![secs(5), secs(30), secs(300)],
                delays: false,
                // One strict route keeps tiers of its own.
                strict: r == 99,
                shared: r != 99,
                shared_delays: false,
                dlq_partitions: Some(1),
            })
            .collect();
        let mut rows: Vec<PlanRow> = layouts.iter().flat_map(|l| plan(l, &topics, 6)).collect();
        rows.extend(plan_shared("g", &layouts, &topics, 6, None));
        let after: usize = rows.iter().filter_map(|r| r.after).sum();
        // 100 mains of 12 and DLQs of 1, 3 shared tiers of 12, the strict
        // route's 3 tiers and order topic of 12.
        assert_eq!(after, 100 * 12 + 100 + 3 * 12 + 4 * 12);
        let shared: Vec<(&str, Option<usize>)> = rows
            .iter()
            .filter(|r| r.role == Role::SharedRetryTier)
            .map(|r| (r.topic.as_str(), r.after))
            .collect();
        assert_eq!(
            shared,
            vec![
                ("g.retry.5s", Some(12)),
                ("g.retry.30s", Some(12)),
                ("g.retry.5m", Some(12))
            ]
        );
        let r0_tier = rows
            .iter()
            .find(|r| r.topic == "r0.retry.5s")
            .map(|r| r.action);
        assert_eq!(
            r0_tier,
            Some(PlanAction::DeleteOnceDrained),
            "the route's own tier is let go of"
        );
        assert!(rows
            .iter()
            .any(|r| r.topic == "r99.retry.5s" && r.action == PlanAction::Create));
    }

    #[test]
    fn shared_delay_buckets_replace_each_delaying_routes_own_and_take_the_set_partitions() {
        let secs = Duration::from_secs;
        let mut topics = BTreeMap::new();
        for r in ["a", "b", "c"] {
            topics.insert(r.to_string(), 6);
        }
        // Route a had delay topics of its own before the upgrade.
        for t in delay_topics("a") {
            topics.insert(t, 6);
        }
        let layouts: Vec<RouteLayout> = ["a", "b", "c"]
            .iter()
            .map(|r| RouteLayout {
                main: r.to_string(),
                tiers: vec![secs(5), secs(30)],
                delays: *r != "c",
                strict: false,
                shared: true,
                shared_delays: true,
                dlq_partitions: Some(1),
            })
            .collect();
        let mut rows: Vec<PlanRow> = layouts.iter().flat_map(|l| plan(l, &topics, 6)).collect();
        rows.extend(plan_shared("g", &layouts, &topics, 6, Some(2)));
        let shared: Vec<(String, Option<usize>)> = rows
            .iter()
            .filter(|r| r.role == Role::SharedDelay)
            .map(|r| (r.topic.clone(), r.after))
            .collect();
        let want: Vec<(String, Option<usize>)> = delay_topics("g")
            .into_iter()
            .map(|t| (t, Some(2)))
            .collect();
        assert_eq!(shared, want, "one set of seven buckets, at the set count");
        assert!(
            rows.iter()
                .filter(|r| r.topic.starts_with("a.delay."))
                .all(|r| r.action == PlanAction::DeleteOnceDrained && r.after.is_none()),
            "the route's own buckets are let go of once drained"
        );
        assert!(!rows.iter().any(|r| r.topic.starts_with("b.delay.")));
        // 3 mains of 6, 3 DLQs of 1, 2 shared tiers and 7 shared buckets of 2.
        let after: usize = rows.iter().filter_map(|r| r.after).sum();
        assert_eq!(after, 3 * 6 + 3 + 2 * 2 + 7 * 2);
    }

    #[test]
    fn a_route_lists_the_groups_shared_delay_buckets_when_it_has_none_of_its_own() {
        let mut all: Vec<String> = vec!["orders".into(), "mails".into()];
        all.extend(delay_topics("g"));
        all.extend(delay_topics("mails"));
        let orders = route_topics("orders", Some("g"), &all);
        let shared: Vec<&str> = orders
            .iter()
            .filter(|t| t.role == Role::SharedDelay)
            .map(|t| t.topic.as_str())
            .collect();
        assert_eq!(shared.len(), 7);
        assert_eq!(
            orders
                .iter()
                .find(|t| t.role == Role::SharedDelay)
                .and_then(|t| t.delay.as_deref()),
            Some("1s")
        );
        let mails = route_topics("mails", Some("g"), &all);
        assert!(
            mails.iter().all(|t| t.role != Role::SharedDelay),
            "a route with delay topics of its own lists those"
        );
    }
}
