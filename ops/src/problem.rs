//! What kind of failure an operator action met, so a script can tell them
//! apart: the `kjob` CLI turns a [`Kind`] into its exit code.
//!
//! | kind | meaning | e.g. |
//! |---|---|---|
//! | [`Kind::Usage`] | the request itself is wrong; fix the flags | an unknown error class, a malformed duration, an unknown librdkafka property |
//! | [`Kind::NotFound`] | something named does not exist | a group, a topic, a DLQ, a dead letter, a contract directory |
//! | [`Kind::Refused`] | the cluster or registry said no | an incompatible schema, an ACL, a group with live members |
//! | [`Kind::Unreachable`] | Kafka or the registry did not answer | connection refused, DNS, a timeout |
//! | [`Kind::Failed`] | anything else | |
//!
//! Errors are classified from what they are (a [`Problem`] raised here or
//! in the CLI, a [`kjob::Error`] variant, librdkafka's error code), never
//! from where they were raised; only the registry's transport errors, which
//! kjob reports as text, are recognised by reqwest's words.

use std::fmt;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// The kind of a failure (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The request is wrong.
    Usage,
    /// Something named does not exist.
    NotFound,
    /// Kafka or the registry refused.
    Refused,
    /// Kafka or the registry did not answer.
    Unreachable,
    /// Anything else.
    Failed,
}

/// An error of a known [`Kind`], raised where the kind is known (an unknown
/// class, a missing group), with the message an operator reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Its kind.
    pub kind: Kind,
    /// What went wrong and, where there is one, the fix.
    pub message: String,
}

impl Problem {
    /// A [`Kind::Usage`] problem.
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(Kind::Usage, message)
    }
    /// A [`Kind::NotFound`] problem.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Kind::NotFound, message)
    }
    /// A [`Kind::Refused`] problem.
    pub fn refused(message: impl Into<String>) -> Self {
        Self::new(Kind::Refused, message)
    }
    /// A [`Kind::Unreachable`] problem.
    pub fn unreachable(message: impl Into<String>) -> Self {
        Self::new(Kind::Unreachable, message)
    }
    fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Problem {}

/// The kind of `err`: the first link of its chain that says.
pub fn kind_of(err: &anyhow::Error) -> Kind {
    for cause in err.chain() {
        if let Some(p) = cause.downcast_ref::<Problem>() {
            return p.kind;
        }
        if let Some(e) = cause.downcast_ref::<kjob::Error>() {
            if let Some(kind) = kjob_kind(e) {
                return kind;
            }
        }
        if let Some(e) = cause.downcast_ref::<KafkaError>() {
            if let Some(kind) = kafka_kind(e) {
                return kind;
            }
        }
        if let Some(e) = cause.downcast_ref::<std::io::Error>() {
            if e.kind() == std::io::ErrorKind::NotFound {
                return Kind::NotFound;
            }
        }
    }
    Kind::Failed
}

fn kjob_kind(e: &kjob::Error) -> Option<Kind> {
    use kjob::Error as E;
    Some(match e {
        E::MissingTopic { .. } | E::UnknownGroup { .. } | E::NoRetryTiers { .. } => Kind::NotFound,
        E::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => Kind::NotFound,
        E::InvalidSetting { .. } | E::ContractFileName { .. } | E::ReplayTarget { .. } => {
            Kind::Usage
        }
        E::NotAuthorized { .. }
        | E::Authentication { .. }
        | E::RegistryUnauthorized { .. }
        | E::SchemaRejected { .. }
        | E::CompatibilityConflict { .. }
        | E::GroupHasMembers { .. }
        | E::Rejected { .. } => Kind::Refused,
        E::CreateTopic { reason, .. } if reason.contains("not authorized") => Kind::Refused,
        E::RegistryTimeout { .. } | E::Delivery { .. } => Kind::Unreachable,
        E::Registry { message, .. } if registry_transport(message) => Kind::Unreachable,
        E::Kafka { source, .. } => return kafka_kind(source),
        _ => return None,
    })
}

/// Whether a registry error is reqwest failing to reach it (connect, DNS,
/// a reset), rather than an answer.
fn registry_transport(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "error sending request",
        "(connect)",
        "dns error",
        "connection refused",
        "connection reset",
        "failed to lookup address",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

fn kafka_kind(e: &KafkaError) -> Option<Kind> {
    use RDKafkaErrorCode as C;
    let code = e.rdkafka_error_code()?;
    Some(match code {
        C::BrokerTransportFailure
        | C::AllBrokersDown
        | C::OperationTimedOut
        | C::MessageTimedOut
        | C::RequestTimedOut
        | C::Resolve
        | C::TimedOutQueue
        | C::NetworkException => Kind::Unreachable,
        C::UnknownTopicOrPartition | C::UnknownTopic | C::GroupIdNotFound => Kind::NotFound,
        C::TopicAuthorizationFailed
        | C::GroupAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::TransactionalIdAuthorizationFailed
        | C::Authentication
        | C::SSL
        | C::SaslAuthenticationFailed
        | C::PolicyViolation => Kind::Refused,
        C::InvalidConfig
        | C::InvalidArgument
        | C::InvalidPartitions
        | C::InvalidReplicationFactor => Kind::Usage,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_come_from_what_the_error_is() {
        let e = anyhow::Error::new(Problem::not_found("no group `x`"));
        assert_eq!(kind_of(&e), Kind::NotFound);
        let e = anyhow::Error::new(kjob::Error::MissingTopic {
            topic: "t".into(),
            bootstrap: "b".into(),
        })
        .context("listing");
        assert_eq!(kind_of(&e), Kind::NotFound);
        let e = anyhow::Error::new(kjob::Error::Registry {
            url: "http://r".into(),
            message: "listing subjects: error sending request for url (http://r/subjects): client error (Connect): tcp connect error: Connection refused (os error 111)".into(),
        });
        assert_eq!(kind_of(&e), Kind::Unreachable);
        let e = anyhow::Error::new(kjob::Error::Registry {
            url: "http://r".into(),
            message: "listing subjects: HTTP 500: boom".into(),
        });
        assert_eq!(kind_of(&e), Kind::Failed);
        let e = anyhow::Error::new(kjob::Error::Kafka {
            context: "metadata".into(),
            source: KafkaError::MetadataFetch(RDKafkaErrorCode::BrokerTransportFailure),
        });
        assert_eq!(kind_of(&e), Kind::Unreachable);
        let e = anyhow::Error::new(kjob::Error::GroupHasMembers {
            group: "g".into(),
            members: vec![],
        });
        assert_eq!(kind_of(&e), Kind::Refused);
        assert_eq!(kind_of(&anyhow::anyhow!("something")), Kind::Failed);
    }
}
