//! Framework errors: what goes wrong *around* a job (connecting, encoding,
//! producing), as opposed to [`crate::JobError`], which a handler returns
//! about the job itself.
//!
//! Every variant names the thing that failed (the topic, the subject, the
//! registry URL), because the person reading it is usually an operator at
//! 3 a.m. who did not write the code.

use std::time::Duration;

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything kjob itself can fail at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The schema registry could not be reached or answered with an error.
    #[error("schema registry at {url}: {message}")]
    Registry {
        /// The registry base URL that was called.
        url: String,
        /// What the registry (or the HTTP client) said.
        message: String,
    },
    /// The registry refused to register this binary's contract, typically
    /// because it is incompatible with versions already registered.
    #[error(
        "schema registry refused contract `{job}` v{version} under subject `{subject}`: {message}"
    )]
    SchemaRejected {
        /// Contract name.
        job: String,
        /// Contract version compiled into this binary.
        version: u32,
        /// Registry subject the schema was registered under.
        subject: String,
        /// The registry's reason.
        message: String,
    },
    /// A compiled-in `.avsc` does not parse or does not fit the Rust type.
    #[error("contract `{job}`: {message}")]
    Contract {
        /// Contract name.
        job: String,
        /// What is wrong with it.
        message: String,
    },
    /// The broker did not acknowledge a record within the delivery timeout.
    #[error("could not deliver to topic `{topic}` within {timeout:?} (is the broker at {bootstrap} reachable?): {message}")]
    Delivery {
        /// Target topic.
        topic: String,
        /// The configured delivery timeout.
        timeout: Duration,
        /// The bootstrap servers in use.
        bootstrap: String,
        /// librdkafka's error.
        message: String,
    },
    /// The broker (or librdkafka, before sending) refused this record for
    /// good: retrying the same write cannot succeed. Distinct from
    /// [`Error::Delivery`] so forwarding can route around it instead of
    /// retrying forever.
    #[error("topic `{topic}` refused the record ({reason}): {message}; {hint}")]
    Rejected {
        /// Target topic.
        topic: String,
        /// Short cause, e.g. `record too large`.
        reason: &'static str,
        /// librdkafka's error.
        message: String,
        /// What an operator can do about it.
        hint: &'static str,
    },
    /// A topic the caller relies on does not exist.
    #[error("topic `{topic}` does not exist on {bootstrap}; create it first, e.g. `kjob topics create --topic {topic} --partitions 6`")]
    MissingTopic {
        /// The missing topic.
        topic: String,
        /// The bootstrap servers in use.
        bootstrap: String,
    },
    /// The cluster refused this client's credentials (SASL or TLS).
    #[error("authentication with Kafka at {bootstrap} failed: {message}. Check KJOB_SASL_USERNAME and KJOB_SASL_PASSWORD (and KJOB_SECURITY_PROTOCOL, KJOB_SASL_MECHANISM, KJOB_SSL_CA_LOCATION)")]
    Authentication {
        /// The bootstrap servers in use.
        bootstrap: String,
        /// librdkafka's reason (never contains the password).
        message: String,
    },
    /// Kafka's ACLs do not allow an operation kjob needs, so it stops
    /// instead of waiting for a permission that will not come.
    #[error("not authorized by Kafka ACLs: principal {principal} may not {operation} {resource}; grant it, e.g. `{grant}` (broker said: {message})")]
    NotAuthorized {
        /// The principal (`User:<sasl.username>`), as ACLs name it.
        principal: String,
        /// The ACL operation needed (`Describe`, `Read`, `Write`, ...).
        operation: String,
        /// What it is needed on, e.g. ``topic `orders` ``.
        resource: String,
        /// The `kafka-acls` command that grants it.
        grant: String,
        /// The broker's or librdkafka's words.
        message: String,
    },
    /// An rdkafka call failed; `context` says which.
    #[error("kafka: {context}: {source}")]
    Kafka {
        /// What kjob was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// A configuration value was invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Encoding a job to Avro failed (the value does not fit its schema).
    #[error("encoding `{job}`: {message}")]
    Encode {
        /// Contract name.
        job: String,
        /// The Avro library's reason.
        message: String,
    },
    /// A worker's internal thread failed or shutdown exceeded its bound.
    #[error("worker: {0}")]
    Worker(String),
}

impl Error {
    /// Whether retrying the same operation can never succeed (a refused
    /// record), as opposed to a transient failure such as an unreachable
    /// broker.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Error::Rejected { .. })
    }

    /// [`Error::NotAuthorized`] for `config`'s principal, with the
    /// `kafka-acls` command that grants `operation` on the resource that
    /// `acl_args` names (e.g. `--topic orders`).
    pub(crate) fn not_authorized(
        config: &crate::KafkaConfig,
        operation: &str,
        resource: String,
        acl_args: &str,
        message: String,
    ) -> Self {
        let principal = config.principal();
        Error::NotAuthorized {
            grant: format!(
                "kafka-acls --bootstrap-server {} --add --allow-principal {principal} --operation {operation} {acl_args}",
                config.bootstrap_servers
            ),
            principal,
            operation: operation.to_string(),
            resource,
            message,
        }
    }

    /// Wraps an rdkafka error with what kjob was trying to do.
    pub(crate) fn kafka(context: impl Into<String>, source: rdkafka::error::KafkaError) -> Self {
        let mut context = context.into();
        // librdkafka built without OpenSSL refuses SSL settings at client
        // creation; say which switch builds it in.
        let text = source.to_string();
        if text.contains("OpenSSL not available")
            || text.contains("SSL") && text.contains("not available")
        {
            context.push_str(
                " (this build of librdkafka has no TLS: enable kjob's `tls` feature, which needs libssl-dev)",
            );
        }
        Error::Kafka { context, source }
    }
}
