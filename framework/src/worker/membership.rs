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
//!   is safe; a SIGKILLed member's partitions move after about 10 s, not
//!   45 s. Members learn that a rebalance began from a heartbeat answer, so
//!   under eager assignment the heartbeat bounds how long a deploy stops
//!   every partition (measured: 0.4–0.7 s per restart, against 1.0–1.3 s at
//!   2 s heartbeats).
//!   The eager `range` assignor spreads each topic on its own, so a route's
//!   main topic is always balanced across members.
//! * **KIP-848** (`group.protocol=consumer`, [`GroupProtocol::Consumer`]):
//!   the broker computes assignments and members reconcile incrementally,
//!   so a join or a clean leave moves only the partitions that change
//!   owner. kjob asks for the broker's `range` assignor, which assigns each
//!   topic separately and co-partitions topics with equal partition counts:
//!   main-topic partitions spread evenly, and retry tier partition *n* goes
//!   to the owner of main partition *n*. The session timeout is then the
//!   broker's (`group.consumer.session.timeout.ms`, 45 s by default), which
//!   is what a crashed member costs.
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
//! second per client. (End to end, a broker outage longer than the session
//! timeout also costs a group rejoin: 10–12 s measured, see the README.)

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
    /// default; `partition.assignment.strategy` can be overridden).
    #[default]
    Classic,
    /// Kafka 4's consumer rebalance protocol (KIP-848): broker-side
    /// assignment with incremental reconciliation. Needs Kafka 4.0 or newer.
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
pub fn instance_id_from_env() -> Option<String> {
    std::env::var(INSTANCE_ID_ENV)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// kjob's consumer settings for `protocol`; the user's own overrides in
/// [`crate::KafkaConfig`] are applied on top of these.
pub(crate) fn consumer_settings(protocol: GroupProtocol) -> Vec<(&'static str, &'static str)> {
    let mut out = vec![
        ("group.protocol", protocol.as_str()),
        ("reconnect.backoff.ms", "100"),
        ("reconnect.backoff.max.ms", "1000"),
    ];
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
    fn kip848_settings_carry_no_classic_only_property() {
        let s = consumer_settings(GroupProtocol::Consumer);
        assert!(s.iter().all(|(k, _)| *k != "session.timeout.ms"
            && *k != "heartbeat.interval.ms"
            && *k != "partition.assignment.strategy"));
        let c = consumer_settings(GroupProtocol::Classic);
        assert!(c.contains(&("session.timeout.ms", "10000")));
    }
}
