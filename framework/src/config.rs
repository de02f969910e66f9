//! Connection settings shared by producers, workers and the CLI.
//!
//! kjob passes Kafka settings straight through to librdkafka under their
//! standard names (`bootstrap.servers`, `group.id`, ...), so anything an
//! operator already knows from Kafka's own tooling keeps working. The two
//! addresses every component needs come from the environment so one variable
//! repoints a whole deployment.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;

use crate::registry::{RegistryAuth, RegistryOptions, Secret};

/// Bootstrap servers used when `KJOB_BOOTSTRAP_SERVERS` is unset: the local
/// stack started by `./dev stack up`.
pub const DEFAULT_BOOTSTRAP_SERVERS: &str = "127.0.0.1:9092";
/// Registry base URL used when `KJOB_SCHEMA_REGISTRY_URL` is unset: Apicurio's
/// Confluent-compatible API on the local stack.
pub const DEFAULT_SCHEMA_REGISTRY_URL: &str = "http://127.0.0.1:8081/apis/ccompat/v7";

/// Where Kafka and the schema registry are, plus any librdkafka overrides.
///
/// Cloning is cheap enough for setup code; nothing clones it per message.
/// `Debug` prints credentials as `<redacted>`: the registry's, any
/// `user:password@` in its URL, and librdkafka overrides such as
/// `sasl.password`.
#[derive(Clone)]
pub struct KafkaConfig {
    /// Comma-separated `host:port` list, Kafka's `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// Base URL of a Confluent-compatible schema registry API.
    pub schema_registry_url: String,
    /// Extra librdkafka properties applied to every client kjob creates.
    /// They win over kjob's defaults, so an operator can always override.
    pub overrides: BTreeMap<String, String>,
    /// Schema-registry timeouts and credentials. Unset fields fall back to
    /// `KJOB_SCHEMA_REGISTRY_*` variables, then to defaults (5 s connect,
    /// 10 s per request): see [`crate::registry`].
    pub registry: RegistryOptions,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field(
                "schema_registry_url",
                &crate::registry::redact_url(&self.schema_registry_url),
            )
            .field(
                "overrides",
                &self
                    .overrides
                    .iter()
                    .map(|(k, v)| {
                        let secret = ["password", "secret", "token", "sasl.jaas"]
                            .iter()
                            .any(|s| k.contains(s));
                        (k.as_str(), if secret { "<redacted>" } else { v.as_str() })
                    })
                    .collect::<BTreeMap<_, _>>(),
            )
            .field("registry", &self.registry)
            .finish()
    }
}

impl KafkaConfig {
    /// Reads `KJOB_BOOTSTRAP_SERVERS` and `KJOB_SCHEMA_REGISTRY_URL`, falling
    /// back to the local stack's addresses. This is what every example, test
    /// and the CLI use, so one environment variable repoints all of them.
    pub fn from_env() -> Self {
        let bootstrap_servers = std::env::var("KJOB_BOOTSTRAP_SERVERS")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_BOOTSTRAP_SERVERS.to_string());
        let schema_registry_url = std::env::var("KJOB_SCHEMA_REGISTRY_URL")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_SCHEMA_REGISTRY_URL.to_string());
        Self::new(bootstrap_servers, schema_registry_url)
    }

    /// Explicit addresses, for programs that take them from their own config.
    pub fn new(
        bootstrap_servers: impl Into<String>,
        schema_registry_url: impl Into<String>,
    ) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            schema_registry_url: schema_registry_url.into().trim_end_matches('/').to_string(),
            overrides: BTreeMap::new(),
            registry: RegistryOptions::default(),
        }
    }

    /// Schema-registry timeouts: `connect` bounds the TCP/TLS handshake,
    /// `request` a whole call. An enqueue that has to register its contract
    /// first fails after at most a few `request`s when the registry hangs,
    /// instead of hanging with it.
    pub fn registry_timeouts(mut self, connect: Duration, request: Duration) -> Self {
        self.registry.connect_timeout = Some(connect);
        self.registry.request_timeout = Some(request);
        self
    }

    /// HTTP basic auth for the schema registry (Confluent Cloud: API key and
    /// secret). Overrides `KJOB_SCHEMA_REGISTRY_USER`/`_PASSWORD`.
    pub fn registry_basic_auth(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.registry.auth = Some(RegistryAuth::Basic {
            user: user.into(),
            password: Secret::new(password),
        });
        self
    }

    /// A bearer token for the schema registry. Overrides
    /// `KJOB_SCHEMA_REGISTRY_TOKEN`.
    pub fn registry_bearer_token(mut self, token: impl Into<String>) -> Self {
        self.registry.auth = Some(RegistryAuth::Bearer(Secret::new(token)));
        self
    }

    /// Sets a librdkafka property (standard Kafka name) on every client kjob
    /// builds from this config, e.g. `security.protocol` or
    /// `statistics.interval.ms`.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.overrides.insert(key.into(), value.into());
        self
    }

    /// A librdkafka config with the bootstrap servers, the given kjob
    /// defaults, and then the user's overrides on top.
    pub(crate) fn client_config(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", &self.bootstrap_servers);
        for (k, v) in defaults {
            cfg.set(*k, *v);
        }
        for (k, v) in &self.overrides {
            cfg.set(k, v);
        }
        cfg
    }
}
