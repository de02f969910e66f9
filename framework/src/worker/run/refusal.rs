//! What a worker refused by the cluster says: a consumer error the cluster
//! will not change its mind about (an ACL, credentials, a protocol the
//! brokers do not serve), turned into an error that names the fix.

use crate::error::Error;

use crate::membership::{self, GroupProtocol};
use crate::worker::{intake::poll, Worker};

impl Worker {
    /// Turns a consumer error the cluster will not change its mind about
    /// into an error naming the credentials or the ACL to grant.
    pub(in crate::worker) fn refused(&self, fatal: poll::FatalConsumerError) -> Error {
        use rdkafka::types::RDKafkaErrorCode as C;
        let group = &self.settings.group;
        let (operation, resource, acl_args) = match fatal.code {
            C::GroupAuthorizationFailed => (
                "Read",
                format!("group `{group}`"),
                format!("--group {group}"),
            ),
            C::ClusterAuthorizationFailed => {
                ("ClusterAction", "the cluster".into(), "--cluster".into())
            }
            C::TopicAuthorizationFailed => {
                let topics = self.topics().join(" --topic ");
                (
                    "Read",
                    "one of its topics (see the broker's words)".into(),
                    format!("--topic {topics}"),
                )
            }
            C::SaslAuthenticationFailed | C::Authentication => {
                return Error::Authentication {
                    bootstrap: self.config.bootstrap_servers.clone(),
                    message: fatal.message,
                }
            }
            C::UnreleasedInstanceId => {
                return Error::InvalidSetting {
                    name: membership::INSTANCE_ID_ENV.into(),
                    value: self.static_member.clone().unwrap_or_default(),
                    reason: format!(
                        "another member of group `{group}` still holds this static-member id: \
                         a second live process with the same id, or (under KIP-848) a previous \
                         run that stopped without leaving, whose id the broker releases when its \
                         session (group.consumer.session.timeout.ms) expires. Give every live \
                         process its own id, or start again after the session timeout. \
                         librdkafka said: {}",
                        fatal.message
                    ),
                }
            }
            C::UnsupportedVersion | C::UnsupportedFeature
                if self.protocol == GroupProtocol::Consumer =>
            {
                return Error::InvalidSetting {
                    name: "group.protocol".into(),
                    value: "consumer".into(),
                    reason: format!(
                        "the brokers at {} do not serve KIP-848 consumer groups (Kafka 4.0 or \
                         newer, with `consumer` in `group.coordinator.rebalance.protocols`); \
                         set KJOB_GROUP_PROTOCOL=classic (or .group_protocol(GroupProtocol::Classic)) \
                         for older brokers. librdkafka said: {}",
                        self.config.bootstrap_servers, fatal.message
                    ),
                }
            }
            _ => {
                return Error::FatalClient {
                    message: fatal.message,
                }
            }
        };
        self.config
            .not_authorized(operation, resource, &acl_args, fatal.message)
    }
}
