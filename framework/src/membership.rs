//! Consumer-group membership: which rebalance protocol a worker speaks, how
//! fast a dead member is noticed, and static membership.
//!
//! These settings decide how long partitions stand still when a worker
//! crashes, restarts or is deployed, so kjob chooses them deliberately
//! instead of inheriting librdkafka's general-purpose defaults:
//!
//! * **Classic protocol** (`group.protocol=classic`, the default): a session
//!   timeout of 10 s with a heartbeat every 500 ms instead of librdkafka's
//!   45 s / 3 s. kjob polls on a dedicated thread that never runs handler
//!   code, so heartbeats are never starved by slow jobs and a short session
//!   is safe; a SIGKILLed member's partitions move after about 10 s.
//!   Members learn that a rebalance began from a heartbeat answer, so under
//!   eager assignment the heartbeat bounds how long a deploy stops every
//!   partition (measured: 0.8–0.9 s per restart on one broker, 0.8–1.7 s on
//!   three brokers at 2 000 jobs/s, the shortest of all protocols). The
//!   eager `range` assignor spreads each topic on its own, so a route's
//!   main topic is always balanced across members. Its weak spot is a
//!   coordinator outage longer than the session (a single broker down for
//!   more than 10 s): the member drops its assignment and rejoins under a
//!   new id, and the restarted coordinator holds the rebalance until the old
//!   id expires (measured: work resumed 12.7 s after the broker answered,
//!   and uncommitted jobs ran again). An outage shorter than the session
//!   costs nothing but the reconnect.
//! * **KIP-848** (`group.protocol=consumer`, [`GroupProtocol::Consumer`]):
//!   the broker computes assignments and members reconcile incrementally,
//!   so a join or a clean leave moves only the partitions that change
//!   owner. kjob asks for the broker's `range` assignor, which assigns each
//!   topic separately and co-partitions topics with equal partition counts:
//!   main-topic partitions spread evenly, and retry tier partition *n* goes
//!   to the owner of main partition *n*. A member keeps its id and epoch
//!   across a coordinator outage, so a broker coming back costs no rejoin
//!   (measured: 1.1 s, 0 duplicates, after the same 18 s outage): choose it
//!   for a single broker. Deploys stall longer than under classic (2.1–8.4 s
//!   per restart on three brokers). Session and heartbeat are the broker's
//!   (`group.consumer.session.timeout.ms` / `group.consumer.heartbeat.interval.ms`,
//!   45 s / 5 s by default, with minimums of the same value): `./dev` and
//!   `docker/compose.yml` set 10 s / 500 ms (with the `group.consumer.min.*`
//!   bounds lowered) so a crashed member's partitions move in about 10 s.
//!   Needs Kafka 4.0 or newer.
//! * **Static membership** (`group.instance.id`, from
//!   [`crate::WorkerBuilder::static_member`] or `KJOB_INSTANCE_ID`): a member
//!   that restarts within the session timeout gets its partitions back
//!   without a rebalance of the others. Set it from a StatefulSet pod name
//!   or a systemd instance name; never share one id between two live
//!   processes.
//!
//! Reconnects: librdkafka backs off up to 10 s between attempts to reach a
//! broker that is down, so a worker could sit idle for seconds after the
//! broker came back. kjob caps the backoff at 1 s (starting at 100 ms, with
//! librdkafka's jitter), so a client tries a returning broker at least once a
//! second, while a down broker costs at most one connection attempt per
//! second per client.

use crate::error::{Error, Result};

/// Environment variable that selects the group protocol (`classic` or
/// `consumer`).
pub const GROUP_PROTOCOL_ENV: &str = "KJOB_GROUP_PROTOCOL";
/// Environment variable that turns on static membership with this instance id.
pub const INSTANCE_ID_ENV: &str = "KJOB_INSTANCE_ID";

/// The consumer-group rebalance protocol a worker uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GroupProtocol {
    /// The classic protocol with client-side assignment (eager `range` by
    /// default; `partition.assignment.strategy` can be overridden). The
    /// default: the shortest deploy stalls measured, on every broker.
    #[default]
    Classic,
    /// Kafka 4's consumer rebalance protocol (KIP-848): broker-side
    /// assignment with incremental reconciliation, and a member that
    /// survives a coordinator outage without a rejoin. Needs Kafka 4.0 or
    /// newer.
    Consumer,
}

impl GroupProtocol {
    /// Parses `classic` or `consumer` (as in librdkafka's `group.protocol`).
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "classic" => Ok(Self::Classic),
            "consumer" => Ok(Self::Consumer),
            other => Err(Error::InvalidSetting {
                name: "group.protocol".into(),
                value: other.to_string(),
                reason: "use `classic` or `consumer` (KIP-848)".into(),
            }),
        }
    }

    /// The protocol named by `KJOB_GROUP_PROTOCOL`, if set.
    pub fn from_env() -> Result<Option<Self>> {
        match std::env::var(GROUP_PROTOCOL_ENV) {
            Ok(v) if !v.trim().is_empty() => {
                Self::parse(&v)
                    .map(Some)
                    .map_err(|_| Error::InvalidSetting {
                        name: GROUP_PROTOCOL_ENV.into(),
                        value: v.clone(),
                        reason: "use `classic` or `consumer` (KIP-848)".into(),
                    })
            }
            _ => Ok(None),
        }
    }

    /// librdkafka's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Classic => "classic",
            Self::Consumer => "consumer",
        }
    }
}

/// The static-member id from `KJOB_INSTANCE_ID`, if set.
pub(crate) fn instance_id_from_env() -> Option<String> {
    std::env::var(INSTANCE_ID_ENV)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// Settings of the classic protocol that librdkafka refuses under KIP-848,
/// where the broker decides them.
const CLASSIC_ONLY: [&str; 3] = [
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
];

/// Refuses, at build time and with the fix named, a classic-only setting
/// under KIP-848: a config written for kjob's earlier classic default
/// would otherwise fail later, as a client creation error.
pub(crate) fn reject_classic_only(config: &crate::KafkaConfig) -> Result<()> {
    match CLASSIC_ONLY
        .iter()
        .find_map(|k| Some((*k, config.overrides.get(*k)?)))
    {
        None => Ok(()),
        Some((name, value)) => Err(Error::InvalidSetting {
            name: name.into(),
            value: value.clone(),
            reason: "a classic-protocol setting: under KIP-848 (`group.protocol=consumer`) the \
                     broker decides it (`group.consumer.session.timeout.ms`, \
                     `group.consumer.heartbeat.interval.ms`, `group.remote.assignor`); drop \
                     it, or keep the classic protocol with KJOB_GROUP_PROTOCOL=classic"
                .into(),
        }),
    }
}

/// How every consumer-group member kjob runs joins its group: the
/// worker's consumer and the batch coordinator's take the same protocol,
/// session, heartbeat, reconnect backoff and instance id from here, so a
/// crashed process's partitions move after the same time whichever of its
/// consumers held them. (The batch coordinator once built its own list and
/// ran on librdkafka's 45 s session: callbacks a minute late after a
/// SIGKILL.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct GroupSettings {
    /// The rebalance protocol.
    pub protocol: GroupProtocol,
    /// The static-member id (`group.instance.id`), when set. Instance ids
    /// are unique per group, so one process uses the same id in each group
    /// it joins.
    pub instance_id: Option<String>,
}

impl GroupSettings {
    /// The client config of a member of `group`: kjob's group defaults,
    /// then `own` (what this consumer needs beyond them), then the user's
    /// overrides from `config` (which win), then the instance id.
    pub(crate) fn member(
        &self,
        config: &crate::KafkaConfig,
        group: &str,
        own: &[(&str, &str)],
    ) -> rdkafka::ClientConfig {
        // `kjob-<group>-<host>-<pid>`: which process holds which partitions
        // shows in `kafka-consumer-groups --describe`. A default only: a
        // client.id the user configured wins.
        let client_id = crate::config::default_client_id(group);
        let mut defaults: Vec<(&str, &str)> = vec![
            ("group.id", group),
            ("client.id", client_id.as_str()),
            ("enable.auto.commit", "false"),
            ("auto.offset.reset", "earliest"),
            ("enable.partition.eof", "false"),
        ];
        defaults.extend(consumer_settings(self.protocol));
        defaults.extend_from_slice(own);
        let mut cfg = config.client_config(&defaults);
        if let Some(id) = &self.instance_id {
            cfg.set("group.instance.id", id);
        }
        cfg
    }
}

/// The client config of a consumer that assigns its partitions itself and
/// never joins or commits (the control reader, the order-state reader, a
/// topic read): no group settings apply, but it gets the same client id
/// form and reconnect backoff as the members. librdkafka wants a `group.id`
/// for a manual assignment and looks that group's coordinator up, which a
/// cluster with ACLs refuses unless the principal may describe the group,
/// so a worker's readers use its own group (`group`), which its model
/// grants (found running a worker under exactly its model's ACLs: fixed
/// reader names were refused). Nothing joins or commits under it.
pub(crate) fn reader(config: &crate::KafkaConfig, group: &str) -> rdkafka::ClientConfig {
    let client_id = crate::config::default_client_id(group);
    config.client_config(&[
        ("group.id", group),
        ("client.id", client_id.as_str()),
        ("enable.auto.commit", "false"),
        ("enable.partition.eof", "false"),
        RECONNECT_BACKOFF[0],
        RECONNECT_BACKOFF[1],
    ])
}

/// librdkafka's reconnect backoff, capped at 1 s (see the module docs):
/// every consumer kjob creates tries a returning broker at least once a
/// second.
const RECONNECT_BACKOFF: [(&str, &str); 2] = [
    ("reconnect.backoff.ms", "100"),
    ("reconnect.backoff.max.ms", "1000"),
];

/// kjob's consumer settings for `protocol`; the user's own overrides in
/// [`crate::KafkaConfig`] are applied on top of these.
pub(crate) fn consumer_settings(protocol: GroupProtocol) -> Vec<(&'static str, &'static str)> {
    let mut out = vec![("group.protocol", protocol.as_str())];
    out.extend(RECONNECT_BACKOFF);
    match protocol {
        GroupProtocol::Classic => {
            out.push(("session.timeout.ms", "10000"));
            out.push(("heartbeat.interval.ms", "500"));
        }
        // Session and heartbeat are the broker's under KIP-848; librdkafka
        // refuses the classic settings with this protocol.
        GroupProtocol::Consumer => out.push(("group.remote.assignor", "range")),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_parse_and_reject_unknown_names() {
        assert_eq!(
            GroupProtocol::parse(" Consumer ").ok(),
            Some(GroupProtocol::Consumer)
        );
        assert_eq!(
            GroupProtocol::parse("classic").ok(),
            Some(GroupProtocol::Classic)
        );
        let err = GroupProtocol::parse("cooperative").unwrap_err().to_string();
        assert!(err.contains("`classic` or `consumer`"), "{err}");
    }

    #[test]
    fn a_classic_only_setting_is_refused_under_kip848_with_the_fix_named() {
        let config = crate::KafkaConfig::new("127.0.0.1:9092", "http://127.0.0.1:8081")
            .set("session.timeout.ms", "6000");
        let err = reject_classic_only(&config).unwrap_err().to_string();
        assert!(err.contains("session.timeout.ms"), "{err}");
        assert!(err.contains("KJOB_GROUP_PROTOCOL=classic"), "{err}");
        let plain = crate::KafkaConfig::new("127.0.0.1:9092", "http://127.0.0.1:8081");
        assert!(reject_classic_only(&plain).is_ok());
    }

    #[test]
    fn kip848_settings_carry_no_classic_only_property() {
        let s = consumer_settings(GroupProtocol::Consumer);
        assert!(s.iter().all(|(k, _)| *k != "session.timeout.ms"
            && *k != "heartbeat.interval.ms"
            && *k != "partition.assignment.strategy"));
        let c = consumer_settings(GroupProtocol::Classic);
        assert!(c.contains(&("session.timeout.ms", "10000")));
    }
}
