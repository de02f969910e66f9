//! Connection settings shared by producers, workers and the CLI.
//!
//! kjob passes Kafka settings straight through to librdkafka under their
//! standard names (`bootstrap.servers`, `group.id`, ...), so anything an
//! operator already knows from Kafka's own tooling keeps working. The two
//! addresses every component needs come from the environment so one variable
//! repoints a whole deployment.
//!
//! **Security.** A production cluster usually wants TLS and SASL. The five
//! `KJOB_SECURITY_PROTOCOL`, `KJOB_SASL_MECHANISM`, `KJOB_SASL_USERNAME`,
//! `KJOB_SASL_PASSWORD` and `KJOB_SSL_CA_LOCATION` variables (or the builder
//! methods [`KafkaConfig::security_protocol`], [`KafkaConfig::sasl`] and
//! [`KafkaConfig::ssl_ca_location`]) become librdkafka's `security.protocol`,
//! `sasl.mechanism`, `sasl.username`, `sasl.password` and `ssl.ca.location`.
//! TLS needs librdkafka built with OpenSSL: kjob's `tls` feature. The password
//! is held in a [`Secret`], whose `Debug` prints `***`, and the `Debug` of
//! [`KafkaConfig`] redacts every override that looks like a credential, so a
//! config logged at startup never leaks one.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;

use crate::registry::{RegistryAuth, RegistryOptions};

/// Bootstrap servers used when `KJOB_BOOTSTRAP_SERVERS` is unset: the local
/// stack started by `./dev stack up`.
pub const DEFAULT_BOOTSTRAP_SERVERS: &str = "127.0.0.1:9092";
/// Registry base URL used when `KJOB_SCHEMA_REGISTRY_URL` is unset: Apicurio's
/// Confluent-compatible API on the local stack.
pub const DEFAULT_SCHEMA_REGISTRY_URL: &str = "http://127.0.0.1:8081/apis/ccompat/v7";

/// A credential. Its `Debug` and `Display` print `***`, so it can sit in
/// structs that are logged with `{:?}` without leaking; [`Secret::expose`]
/// is the one, greppable, way to read it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The credential itself, for handing it to the client library.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// Whether a librdkafka property name holds a credential (`sasl.password`,
/// `ssl.key.password`, `sasl.oauthbearer.client.secret`, `sasl.jaas.config`,
/// `ssl.key.pem`, ...), so [`KafkaConfig`]'s `Debug` prints `***` for it.
pub fn is_secret_property(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password")
        || k.contains("secret")
        || k.contains("jaas")
        || k.contains("token")
        || (k.starts_with("ssl.") && k.contains("key") && !k.ends_with("location"))
}

/// Where Kafka and the schema registry are, how to authenticate, plus any
/// librdkafka overrides.
///
/// Cloning is cheap enough for setup code; nothing clones it per message.
/// `Debug` redacts credentials: the SASL password, every credential-like
/// override, the registry's credentials and any `user:password@` in its URL.
#[derive(Clone)]
pub struct KafkaConfig {
    /// Comma-separated `host:port` list, Kafka's `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// Base URL of a Confluent-compatible schema registry API.
    pub schema_registry_url: String,
    /// `security.protocol`: `PLAINTEXT` (librdkafka's default when unset),
    /// `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`.
    pub security_protocol: Option<String>,
    /// `sasl.mechanism`, e.g. `SCRAM-SHA-512`.
    pub sasl_mechanism: Option<String>,
    /// `sasl.username`: the principal the cluster's ACLs name.
    pub sasl_username: Option<String>,
    /// `sasl.password`; never printed.
    pub sasl_password: Option<Secret>,
    /// `ssl.ca.location`: the CA file that signed the brokers' certificates
    /// (unset: the system's trust store).
    pub ssl_ca_location: Option<String>,
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
        let overrides: BTreeMap<&str, &str> = self
            .overrides
            .iter()
            .map(|(k, v)| {
                let shown = if is_secret_property(k) { "***" } else { v };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field(
                "schema_registry_url",
                &crate::registry::redact_url(&self.schema_registry_url),
            )
            .field("registry", &self.registry)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &self.sasl_password)
            .field("ssl_ca_location", &self.ssl_ca_location)
            .field("overrides", &overrides)
            .finish()
    }
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl KafkaConfig {
    /// Reads `KJOB_BOOTSTRAP_SERVERS` and `KJOB_SCHEMA_REGISTRY_URL`, falling
    /// back to the local stack's addresses, plus the security variables (see
    /// [`KafkaConfig::security_from_env`]). This is what every example, test
    /// and the CLI use, so one environment variable repoints all of them.
    pub fn from_env() -> Self {
        let bootstrap_servers = env_var("KJOB_BOOTSTRAP_SERVERS")
            .unwrap_or_else(|| DEFAULT_BOOTSTRAP_SERVERS.to_string());
        let schema_registry_url = env_var("KJOB_SCHEMA_REGISTRY_URL")
            .unwrap_or_else(|| DEFAULT_SCHEMA_REGISTRY_URL.to_string());
        Self::new(bootstrap_servers, schema_registry_url).security_from_env()
    }

    /// Takes `KJOB_SECURITY_PROTOCOL`, `KJOB_SASL_MECHANISM`,
    /// `KJOB_SASL_USERNAME`, `KJOB_SASL_PASSWORD` and `KJOB_SSL_CA_LOCATION`
    /// from the environment where set (and non-empty), keeping the current
    /// value otherwise. Credentials come from the environment (or a secret
    /// store), never from a command line, where `ps` would show them.
    pub fn security_from_env(mut self) -> Self {
        if let Some(v) = env_var("KJOB_SECURITY_PROTOCOL") {
            self.security_protocol = Some(v);
        }
        if let Some(v) = env_var("KJOB_SASL_MECHANISM") {
            self.sasl_mechanism = Some(v);
        }
        if let Some(v) = env_var("KJOB_SASL_USERNAME") {
            self.sasl_username = Some(v);
        }
        if let Ok(v) = std::env::var("KJOB_SASL_PASSWORD") {
            if !v.is_empty() {
                self.sasl_password = Some(Secret::new(v));
            }
        }
        if let Some(v) = env_var("KJOB_SSL_CA_LOCATION") {
            self.ssl_ca_location = Some(v);
        }
        self
    }

    /// Explicit addresses, for programs that take them from their own config.
    pub fn new(
        bootstrap_servers: impl Into<String>,
        schema_registry_url: impl Into<String>,
    ) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            schema_registry_url: schema_registry_url.into().trim_end_matches('/').to_string(),
            security_protocol: None,
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            ssl_ca_location: None,
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

    /// `security.protocol` (`SSL`, `SASL_SSL`, ...). TLS protocols need kjob
    /// built with its `tls` feature (librdkafka with OpenSSL).
    pub fn security_protocol(mut self, protocol: impl Into<String>) -> Self {
        self.security_protocol = Some(protocol.into());
        self
    }

    /// SASL credentials: `sasl.mechanism` (e.g. `SCRAM-SHA-512`),
    /// `sasl.username` and `sasl.password`.
    pub fn sasl(
        mut self,
        mechanism: impl Into<String>,
        username: impl Into<String>,
        password: Secret,
    ) -> Self {
        self.sasl_mechanism = Some(mechanism.into());
        self.sasl_username = Some(username.into());
        self.sasl_password = Some(password);
        self
    }

    /// `ssl.ca.location`: the CA certificate (PEM) the brokers' certificates
    /// are checked against, for clusters with a private CA.
    pub fn ssl_ca_location(mut self, path: impl Into<String>) -> Self {
        self.ssl_ca_location = Some(path.into());
        self
    }

    /// Sets a librdkafka property (standard Kafka name) on every client kjob
    /// builds from this config, e.g. `security.protocol` or
    /// `statistics.interval.ms`.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.overrides.insert(key.into(), value.into());
        self
    }

    /// The principal Kafka's ACLs see for this config, for error messages:
    /// `User:<sasl.username>`, or a description when SASL is not used.
    pub fn principal(&self) -> String {
        match (&self.sasl_username, self.overrides.get("sasl.username")) {
            (_, Some(u)) | (Some(u), None) => format!("User:{u}"),
            (None, None) => "User:ANONYMOUS (or the TLS certificate's principal)".to_string(),
        }
    }

    /// A librdkafka config with the bootstrap servers and the security
    /// settings, for clients kjob does not build itself (tools, tests, an
    /// application's own consumer), so they reach a secured cluster the same
    /// way. Overrides are applied on top.
    pub fn rdkafka_config(&self) -> ClientConfig {
        self.client_config(&[])
    }

    /// A librdkafka config with the bootstrap servers, the security
    /// settings, the given defaults (what the caller's client needs unless
    /// the user says otherwise, e.g. `enable.auto.commit=false`), and then
    /// the user's overrides on top: how every kjob and kjob-ops client is
    /// configured, so one override reaches all of them.
    pub fn client_config(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", &self.bootstrap_servers);
        let security = [
            ("security.protocol", self.security_protocol.as_deref()),
            ("sasl.mechanism", self.sasl_mechanism.as_deref()),
            ("sasl.username", self.sasl_username.as_deref()),
            (
                "sasl.password",
                self.sasl_password.as_ref().map(Secret::expose),
            ),
            ("ssl.ca.location", self.ssl_ca_location.as_deref()),
        ];
        for (k, v) in security {
            if let Some(v) = v {
                cfg.set(k, v);
            }
        }
        for (k, v) in defaults {
            cfg.set(*k, *v);
        }
        for (k, v) in &self.overrides {
            cfg.set(k, v);
        }
        cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_a_secret() {
        let c = KafkaConfig::new("b:9092", "http://r")
            .security_protocol("SASL_SSL")
            .sasl("SCRAM-SHA-512", "worker", Secret::new("hunter2-pw"))
            .set("ssl.key.password", "keypw-123")
            .set("sasl.oauthbearer.client.secret", "oauth-456")
            .set("linger.ms", "5");
        let shown = format!("{c:?} {c:#?}");
        for secret in ["hunter2-pw", "keypw-123", "oauth-456"] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }
        assert!(shown.contains("worker") && shown.contains("SASL_SSL"));
        assert!(shown.contains("\"linger.ms\": \"5\""), "{shown}");
        assert_eq!(format!("{}", Secret::new("x")), "***");
    }

    #[test]
    fn security_reaches_librdkafka_and_overrides_win() {
        let c = KafkaConfig::new("b:9092", "http://r")
            .security_protocol("SASL_SSL")
            .sasl("SCRAM-SHA-512", "worker", Secret::new("pw"))
            .ssl_ca_location("/tmp/ca.crt")
            .set("sasl.mechanism", "SCRAM-SHA-256");
        let cfg = c.client_config(&[]);
        assert_eq!(cfg.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(cfg.get("sasl.username"), Some("worker"));
        assert_eq!(cfg.get("sasl.password"), Some("pw"));
        assert_eq!(cfg.get("ssl.ca.location"), Some("/tmp/ca.crt"));
        assert_eq!(cfg.get("sasl.mechanism"), Some("SCRAM-SHA-256"));
        let plain = KafkaConfig::new("b:9092", "http://r").client_config(&[]);
        assert_eq!(plain.get("security.protocol"), None);
    }

    #[test]
    fn sasl_ssl_without_openssl_names_the_tls_feature() {
        let config = KafkaConfig::new("127.0.0.1:1", "http://r")
            .security_protocol("SASL_SSL")
            .sasl("SCRAM-SHA-512", "u", Secret::new("p"));
        let created: std::result::Result<rdkafka::consumer::BaseConsumer, _> =
            config.client_config(&[]).create();
        let tls = cfg!(feature = "tls");
        match created {
            Ok(_) => assert!(tls, "SASL_SSL accepted without OpenSSL"),
            Err(e) => {
                assert!(!tls, "{e}");
                let err = crate::Error::kafka("creating consumer", e).to_string();
                assert!(err.contains("`tls` feature"), "{err}");
            }
        }
    }

    #[test]
    fn secret_property_names() {
        for k in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "sasl.oauthbearer.client.secret",
            "sasl.jaas.config",
            "ssl.key.pem",
        ] {
            assert!(is_secret_property(k), "{k}");
        }
        for k in [
            "ssl.ca.location",
            "ssl.key.location",
            "sasl.username",
            "linger.ms",
        ] {
            assert!(!is_secret_property(k), "{k}");
        }
    }
}
