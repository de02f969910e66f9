//! Every environment variable kjob's crates read, declared once.
//!
//! The readers name their variable where they read it (`KafkaConfig::from_env`,
//! the worker's membership and limits, `telemetry::init`, the CLI's flags);
//! this table is the one list of them, and a test holds it to the sources
//! and to the book: a `"KJOB_..."` literal in non-test code of `kjob`,
//! `kjob-ops` or `kjob-cli` that is not declared here fails, and so does a
//! variable declared here without a row in `docs/src/settings.md`. The same
//! test holds every public `WorkerBuilder` method to a row of that chapter.

/// One environment variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variable {
    /// Its name, or a prefix ending in `_` for a family
    /// (`KJOB_KAFKA_<PROPERTY>`).
    pub name: &'static str,
    /// Who reads it.
    pub read_by: &'static str,
}

/// Every variable, in the book's order.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "KJOB_BOOTSTRAP_SERVERS",
        read_by: "KafkaConfig::from_env, the CLI",
    },
    Variable {
        name: "KJOB_SCHEMA_REGISTRY_URL",
        read_by: "KafkaConfig::from_env, the CLI",
    },
    Variable {
        name: "KJOB_SCHEMA_REGISTRY_CONNECT_TIMEOUT_MS",
        read_by: "the registry client",
    },
    Variable {
        name: "KJOB_SCHEMA_REGISTRY_TIMEOUT_MS",
        read_by: "the registry client",
    },
    Variable {
        name: "KJOB_SCHEMA_REGISTRY_USER",
        read_by: "the registry client",
    },
    Variable {
        name: "KJOB_SCHEMA_REGISTRY_PASSWORD",
        read_by: "the registry client",
    },
    Variable {
        name: "KJOB_SCHEMA_REGISTRY_TOKEN",
        read_by: "the registry client",
    },
    Variable {
        name: "KJOB_SECURITY_PROTOCOL",
        read_by: "KafkaConfig::from_env, the CLI",
    },
    Variable {
        name: "KJOB_SASL_MECHANISM",
        read_by: "KafkaConfig::from_env, the CLI",
    },
    Variable {
        name: "KJOB_SASL_USERNAME",
        read_by: "KafkaConfig::from_env, the CLI",
    },
    Variable {
        name: "KJOB_SASL_PASSWORD",
        read_by: "KafkaConfig::from_env, the CLI",
    },
    Variable {
        name: "KJOB_SSL_CA_LOCATION",
        read_by: "KafkaConfig::from_env, the CLI",
    },
    Variable {
        name: crate::config::CONFIG_FILE_ENV,
        read_by: "KafkaConfig::from_env",
    },
    Variable {
        name: crate::config::PROPERTY_ENV_PREFIX,
        read_by: "KafkaConfig::from_env",
    },
    Variable {
        name: crate::membership::GROUP_PROTOCOL_ENV,
        read_by: "the worker",
    },
    Variable {
        name: crate::membership::INSTANCE_ID_ENV,
        read_by: "the worker",
    },
    Variable {
        name: "KJOB_STOP_AFTER_JOBS",
        read_by: "the worker's limits",
    },
    Variable {
        name: "KJOB_STOP_ABOVE_RSS",
        read_by: "the worker's limits",
    },
    Variable {
        name: "KJOB_STOP_AFTER",
        read_by: "the worker's limits",
    },
    Variable {
        name: crate::deployment::DESCRIBE_ENV,
        read_by: "Worker::run",
    },
    Variable {
        name: "KJOB_LOG_FORMAT",
        read_by: "telemetry::init",
    },
    Variable {
        name: "KJOB_TRACES_FILTER",
        read_by: "telemetry::init",
    },
    Variable {
        name: "KJOB_SCHEMA_EXPORT",
        read_by: "kjob::schema::export::serve",
    },
    Variable {
        name: "KJOB_DATABASE_URL",
        read_by: "kjob outbox",
    },
    Variable {
        name: "KJOB_UI_TOKEN",
        read_by: "kjob ui",
    },
    Variable {
        name: "KJOB_OPERATOR",
        read_by: "the CLI's --by (audit records)",
    },
    Variable {
        name: "KJOB_KAFKA_JAVA",
        read_by: "./dev (not a librdkafka property)",
    },
];
