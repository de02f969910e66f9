//! Samples every route in the background: lag, rates and group members,
//! through the same `status` functions `kjob status` uses, keeping the
//! last minutes of history for the sparklines and the lag chart.

use crate::groups::{describe_groups, Group, GroupMember};
use crate::lag::PartitionLag;
use kjob::schedule::{leader_topic, state_topic};
use kjob::topics::{dlq_audit_topic, dlq_topic, list_topics, route_of};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Shared;
use crate::status::{route_topics, sample, status_between, RouteSample, RouteStatus};

/// Samples kept per route (at the default 5 s: ten minutes).
pub(super) const HISTORY: usize = 120;

/// A route: a main topic and the group that consumes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteKey {
    /// The main topic.
    pub topic: String,
    /// The consumer group.
    pub group: String,
}

/// One point of a route's history.
#[derive(Clone, Copy, Debug, Default)]
pub struct Point {
    /// Epoch ms of the sample.
    pub at_ms: i64,
    /// Lag over the main topic and tiers.
    pub lag: i64,
    /// Handled per second (main and tiers).
    pub handled: f64,
    /// Written to retry tiers per second.
    pub retried: f64,
    /// Written to the DLQ per second.
    pub dead_lettered: f64,
}

/// What the pages show of a route.
#[derive(Clone, Debug)]
pub struct RouteView {
    /// Which route.
    pub key: RouteKey,
    /// The latest status (`None` until the first sample worked).
    pub status: Option<RouteStatus>,
    /// Per-partition positions from the latest sample.
    pub rows: Vec<PartitionLag>,
    /// The latest sampling error, shown instead of stale numbers' silence.
    pub error: Option<String>,
    /// Coordinator state of the group.
    pub group_state: String,
    /// Live members and their assignments.
    pub members: Vec<GroupMember>,
    /// Oldest first.
    pub history: VecDeque<Point>,
}

/// Starts the sampling loop.
pub(super) fn spawn(state: Shared, fixed: Vec<RouteKey>, discover: bool, only: Vec<String>) {
    // Only a weak hold: once the server that owns the pages is gone (a
    // worker that stopped), sampling ends.
    let weak = Arc::downgrade(&state);
    drop(state);
    tokio::spawn(async move {
        let mut previous: HashMap<RouteKey, RouteSample> = HashMap::new();
        let mut known: Vec<RouteKey> = fixed;
        let mut offline = Offline::default();
        while let Some(state) = weak.upgrade() {
            let st = state.clone();
            let (prev, keys) = (std::mem::take(&mut previous), known.clone());
            let mut off = std::mem::take(&mut offline);
            let only = only.clone();
            let out = tokio::task::spawn_blocking(move || {
                let (prev, keys) = tick(&st, prev, keys, (discover, &only), &mut off);
                (prev, keys, off)
            })
            .await;
            if let Ok((prev, keys, off)) = out {
                previous = prev;
                known = keys;
                offline = off;
            }
            tokio::time::sleep(state.sample_every).await;
        }
    });
}

/// The route a topic assigned to `group` belongs to, named by its main
/// topic: a retry tier or delay topic folds into its route through
/// [`route_of`], as `kjob status` folds them, so `orders.delay.1m` is not a
/// route of its own. The group's cron leader topic (and its state topic)
/// belongs to every route of the group, and is shown on each (see
/// `status::route_topics`): it is no route either, and neither are the
/// group's shared retry tiers. Nor is a DLQ (kjob
/// workers never consume one; a group that does is some other program).
fn route_for<'t>(topic: &'t str, group: &str) -> Option<&'t str> {
    if topic == leader_topic(group) || topic == state_topic(group) {
        return None;
    }
    let main = route_of(topic);
    if main != topic && (topic == dlq_topic(main) || topic == dlq_audit_topic(main)) {
        return None;
    }
    // The group's shared retry tiers (`<group>.retry.<delay>`) and delay
    // buckets (`<group>.delay.<bucket>`) belong to every route of the
    // group, as the cron topics do.
    if main == group && main != topic {
        return None;
    }
    Some(main)
}

type TickOut = (HashMap<RouteKey, RouteSample>, Vec<RouteKey>);

/// How long the committed topics of a group without members are trusted:
/// they change only when a member commits, so they are read again every
/// half minute rather than at every sample (one request per group).
const OFFLINE_REFRESH: Duration = Duration::from_secs(30);

/// At most this many groups' committed offsets are read per sample (one
/// admin client, one request each), so a cluster with many idle groups
/// costs a sample a bounded time and their routes appear over a few rounds.
const OFFLINE_READS_PER_TICK: usize = 200;

/// The topics each group without live members has committed offsets on,
/// when they were read.
#[derive(Default)]
struct Offline {
    committed: HashMap<String, (Instant, Vec<String>)>,
}

impl Offline {
    /// Reads the committed topics of those of `groups` never read or read
    /// longer than [`OFFLINE_REFRESH`] ago, the never-read first, at most
    /// [`OFFLINE_READS_PER_TICK`]; forgets groups no longer idle.
    fn refresh(&mut self, config: &kjob::KafkaConfig, groups: &[&str]) {
        let idle: std::collections::HashSet<&str> = groups.iter().copied().collect();
        self.committed.retain(|g, _| idle.contains(g.as_str()));
        let mut stale: Vec<(Option<Instant>, String)> = groups
            .iter()
            .filter_map(|g| match self.committed.get(*g) {
                None => Some((None, g.to_string())),
                Some((at, _)) if at.elapsed() >= OFFLINE_REFRESH => {
                    Some((Some(*at), g.to_string()))
                }
                Some(_) => None,
            })
            .collect();
        stale.sort();
        stale.truncate(OFFLINE_READS_PER_TICK);
        if stale.is_empty() {
            return;
        }
        let names: Vec<String> = stale.into_iter().map(|(_, g)| g).collect();
        let read = crate::groups::committed_topics_of(config, &names).unwrap_or_default();
        for (g, topics) in read {
            self.committed
                .insert(g, (Instant::now(), topics.unwrap_or_default()));
        }
    }

    /// `group`'s committed topics as last read (empty before the first).
    fn topics(&self, group: &str) -> Vec<String> {
        self.committed
            .get(group)
            .map(|(_, t)| t.clone())
            .unwrap_or_default()
    }
}

/// Adds to `keys` the route of every topic a kjob worker's group reads
/// (or, with no member left, last committed), sorted: batch topics are a
/// coordinator's, not routes, and only groups with a control topic are
/// kjob workers'.
fn discover_routes(
    config: &kjob::KafkaConfig,
    groups: &[Group],
    all_topics: &[String],
    offline: &mut Offline,
    keys: &mut Vec<RouteKey>,
) {
    // A batch topic is folded by its coordinator group, not a route:
    // the worker's own naming rules tell (kjob::deployment::classify).
    let names: Vec<String> = groups.iter().map(|g| g.name.clone()).collect();
    let roles = kjob::deployment::classify(all_topics, &names);
    let routed = |t: &str| {
        !matches!(
            roles.get(t).map(|c| c.role),
            Some(kjob::deployment::Role::Batch | kjob::deployment::Role::BatchState)
        )
    };
    // Only kjob workers' groups: every worker creates its group's
    // control topic at start.
    let existing: std::collections::HashSet<&str> = all_topics.iter().map(String::as_str).collect();
    let kjob_group = |g: &str| existing.contains(kjob::control::control_topic(g).as_str());
    let idle: Vec<&str> = groups
        .iter()
        .filter(|g| g.members.is_empty() && kjob_group(&g.name))
        .map(|g| g.name.as_str())
        .collect();
    offline.refresh(config, &idle);
    for g in groups
        .iter()
        .filter(|g| !g.members.is_empty() || kjob_group(&g.name))
    {
        // A group whose workers are all gone (the demo ended, every
        // worker crashed) keeps its routes on the overview through the
        // offsets it committed, marked as having no member, its lag
        // still counted.
        let topics = match g.members.is_empty() {
            false => g.assigned_topics(),
            true => offline.topics(&g.name),
        };
        for t in topics.iter().filter(|t| routed(t)) {
            if let Some(main) = route_for(t, &g.name) {
                let key = RouteKey {
                    topic: main.to_string(),
                    group: g.name.clone(),
                };
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
    }
    keys.sort();
}

fn tick(
    state: &Shared,
    mut previous: HashMap<RouteKey, RouteSample>,
    mut keys: Vec<RouteKey>,
    (discover, only): (bool, &[String]),
    offline: &mut Offline,
) -> TickOut {
    let config = &state.config;
    let mut problems = Vec::new();
    let all_topics = list_topics(config).unwrap_or_else(|e| {
        problems.push(format!("listing topics: {e}"));
        Vec::new()
    });
    let groups: Vec<Group> = if discover && only.is_empty() {
        describe_groups(config, None).unwrap_or_else(|e| {
            problems.push(format!("finding routes from the consumer groups: {e}"));
            Vec::new()
        })
    } else if discover {
        only.iter()
            .chain(keys.iter().map(|k| &k.group))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter_map(|g| describe_groups(config, Some(g)).ok())
            .flatten()
            .collect()
    } else {
        keys.iter()
            .filter_map(|k| describe_groups(config, Some(&k.group)).ok())
            .flatten()
            .collect()
    };
    if let Ok(mut p) = state.problem.write() {
        *p = (!problems.is_empty()).then(|| problems.join("; "));
    }
    if discover {
        discover_routes(config, &groups, &all_topics, offline, &mut keys);
    }
    let old: HashMap<RouteKey, RouteView> = state
        .routes
        .read()
        .map(|r| r.iter().map(|v| (v.key.clone(), v.clone())).collect())
        .unwrap_or_default();
    let mut views = Vec::new();
    for key in &keys {
        let mut view = old.get(key).cloned().unwrap_or_else(|| RouteView {
            key: key.clone(),
            status: None,
            rows: Vec::new(),
            error: None,
            group_state: "unknown".into(),
            members: Vec::new(),
            history: VecDeque::new(),
        });
        match groups.iter().find(|g| g.name == key.group) {
            Some(g) => {
                view.group_state = g.state.clone();
                view.members = g.members.clone();
            }
            None => {
                view.group_state = "unknown".into();
                view.members.clear();
            }
        }
        let topics = route_topics(&key.topic, Some(&key.group), &all_topics);
        let read = sample(config, Some(&key.group), &topics).and_then(|now| {
            let first = previous.get(key).unwrap_or(&now);
            let status = status_between(config, Some(&key.group), first, &now)?;
            Ok((now, status))
        });
        match read {
            Ok((now, status)) => {
                view.history.push_back(Point {
                    at_ms: kjob::clock::now_ms(),
                    // A shared topic counts this route's part of its lag.
                    lag: status.topics.iter().filter_map(|t| t.route_lag()).sum(),
                    // A fold from +0.0: `sum()` of no floats is -0.0.
                    handled: status
                        .topics
                        .iter()
                        .filter_map(|t| t.handled_per_second)
                        .fold(0.0, |a, b| a + b),
                    retried: status.retried_per_second,
                    dead_lettered: status.dead_lettered_per_second,
                });
                while view.history.len() > HISTORY {
                    view.history.pop_front();
                }
                view.rows = now.rows.clone();
                view.status = Some(status);
                view.error = None;
                previous.insert(key.clone(), now);
            }
            Err(e) => view.error = Some(format!("{e:#}")),
        }
        views.push(view);
    }
    if let Ok(mut w) = state.routes.write() {
        *w = views;
    }
    (previous, keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_delay_topics_and_cron_topics_fold_into_their_routes() {
        assert_eq!(route_for("orders.retry.5s", "g"), Some("orders"));
        assert_eq!(
            route_for("orders.retry.later", "g"),
            Some("orders.retry.later")
        );
        assert_eq!(route_for("orders", "g"), Some("orders"));
        for delay in kjob::delay::delay_topics("orders") {
            assert_eq!(route_for(&delay, "g"), Some("orders"), "{delay}");
        }
        assert_eq!(route_for("g.schedules", "g"), None);
        assert_eq!(route_for("g.schedules.state", "g"), None);
        assert_eq!(
            route_for("g.retry.30s", "g"),
            None,
            "a shared tier is no route"
        );
        assert_eq!(route_for("g.delay.1m", "g"), None, "nor a shared bucket");
        // Another group's topic of that name is a main topic like any.
        assert_eq!(route_for("g.schedules", "h"), Some("g.schedules"));
        assert_eq!(route_for("orders.dlq", "g"), None);
        assert_eq!(route_for("orders.dlq.audit", "g"), None);
    }
}
