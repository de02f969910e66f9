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
//!
//! **Any librdkafka property.** Client certificates, OAUTHBEARER,
//! `client.rack` or a tuned `fetch.max.bytes` need no code change either:
//!
//! * a properties file (`key=value` lines, Java-properties syntax, the
//!   `--command-config` file of Kafka's own tools), named by
//!   `KJOB_KAFKA_CONFIG_FILE` for a worker or producer, or by
//!   `kjob --command-config FILE` for the CLI;
//! * `KJOB_KAFKA_<PROPERTY>` variables: the property upper-cased with `.`
//!   written `_`, e.g. `KJOB_KAFKA_CLIENT_RACK=r1` is `client.rack=r1`
//!   (`KJOB_KAFKA_CONFIG_FILE` itself, and `KJOB_KAFKA_JAVA`, which `./dev`
//!   uses for the broker's Java, are not properties).
//!
//! Precedence, lowest first: kjob's defaults for each client, the file, the
//! `KJOB_KAFKA_<PROPERTY>` variables, the named variables
//! (`KJOB_BOOTSTRAP_SERVERS`, `KJOB_SCHEMA_REGISTRY_URL` and the five
//! security ones above), then whatever the program sets afterwards (the
//! CLI's flags, [`KafkaConfig::set`] and the other builder methods). In the
//! file and the `KJOB_KAFKA_` variables, `bootstrap.servers`,
//! `security.protocol`, `sasl.mechanism(s)`, `sasl.username`,
//! `sasl.password` and `ssl.ca.location` fill the named settings (so the
//! named variables win over them), and `schema.registry.url` (as Confluent's
//! client files spell it) the registry URL.
//!
//! A property librdkafka does not know, or a value it refuses, fails with
//! an error naming the property and where it came from (`file:line` or the
//! variable): at once from [`KafkaConfig::try_from_env`] and
//! [`KafkaConfig::check`], and otherwise when the first codec, producer or
//! worker is built from the config. Java-only properties of such files
//! (`sasl.jaas.config`, `ssl.truststore.*`) are refused with their librdkafka
//! equivalent named.

mod properties;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdkafka::ClientConfig;

use crate::error::{Error, Result};

pub use properties::{parse as parse_properties, Property};

/// The variable naming a properties file for workers and producers (the CLI
/// also takes `--command-config`).
pub const CONFIG_FILE_ENV: &str = "KJOB_KAFKA_CONFIG_FILE";

/// The prefix of `KJOB_KAFKA_<PROPERTY>` variables.
pub const PROPERTY_ENV_PREFIX: &str = "KJOB_KAFKA_";

/// `KJOB_KAFKA_` variables that are not librdkafka properties.
const NOT_PROPERTIES: [&str; 2] = [CONFIG_FILE_ENV, "KJOB_KAFKA_JAVA"];

/// The librdkafka property a `KJOB_KAFKA_<PROPERTY>` variable sets:
/// `KJOB_KAFKA_CLIENT_RACK` is `client.rack`. `None` for other variables
/// and for the `KJOB_KAFKA_` variables that are not properties
/// ([`CONFIG_FILE_ENV`], `KJOB_KAFKA_JAVA`).
pub fn property_for_variable(name: &str) -> Option<String> {
    if NOT_PROPERTIES.contains(&name) {
        return None;
    }
    let rest = name.strip_prefix(PROPERTY_ENV_PREFIX)?;
    if rest.is_empty() {
        return None;
    }
    Some(rest.to_ascii_lowercase().replace('_', "."))
}

/// Where a property of a [`KafkaConfig`] came from, so an error about it
/// says where to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PropertySource {
    /// A properties file, and the line of the entry.
    File {
        /// The file.
        path: PathBuf,
        /// The entry's line (1-based).
        line: usize,
    },
    /// A `KJOB_KAFKA_<PROPERTY>` variable.
    Variable(String),
}

impl std::fmt::Display for PropertySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PropertySource::File { path, line } => write!(f, "{}:{line}", path.display()),
            PropertySource::Variable(v) => write!(f, "variable {v}"),
        }
    }
}

/// Properties of Java clients' files that librdkafka does not have, with
/// what to write instead.
fn java_only_hint(key: &str) -> Option<&'static str> {
    Some(match key {
        "sasl.jaas.config" => "librdkafka has no JAAS: write sasl.username and sasl.password (PLAIN, SCRAM) or the sasl.oauthbearer.* properties (OAUTHBEARER) instead",
        k if k.starts_with("ssl.truststore.") => "librdkafka reads no Java trust store: give the CA certificate as PEM with ssl.ca.location",
        k if k.ends_with(".class") || k.contains(".callback.handler") => "a Java class; librdkafka has none (for OAUTHBEARER set sasl.oauthbearer.method=oidc and its sasl.oauthbearer.* properties)",
        "key.serializer" | "value.serializer" | "key.deserializer" | "value.deserializer" => "kjob encodes jobs itself (Avro via the registry): leave it out",
        "basic.auth.user.info" | "basic.auth.credentials.source" => "the registry's credentials are KJOB_SCHEMA_REGISTRY_USER and KJOB_SCHEMA_REGISTRY_PASSWORD",
        _ => return None,
    })
}

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
    /// Where each override loaded from a file or variable came from.
    sources: BTreeMap<String, PropertySource>,
    /// A properties file that could not be read or parsed: reported by
    /// [`KafkaConfig::check`] (and so by the first codec built from it).
    problem: Option<Error>,
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
                &redact_url(&self.schema_registry_url),
            )
            .field("registry", &self.registry)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &self.sasl_password)
            .field("ssl_ca_location", &self.ssl_ca_location)
            .field("overrides", &overrides)
            .field("problem", &self.problem)
            .finish()
    }
}

impl KafkaConfig {
    /// [`Error::NotAuthorized`] for this configuration's principal, with the
    /// `kafka-acls` command that grants `operation` on the resource that
    /// `acl_args` names (e.g. `--topic orders`). Public so that tools built
    /// on kjob (kjob-ops) name the grant the same way.
    pub fn not_authorized(
        &self,
        operation: &str,
        resource: String,
        acl_args: &str,
        message: String,
    ) -> crate::Error {
        let principal = self.principal();
        crate::Error::NotAuthorized {
            grant: format!(
                "kafka-acls --bootstrap-server {} --add --allow-principal {principal} --operation {operation} {acl_args}",
                self.bootstrap_servers
            ),
            principal,
            operation: operation.to_string(),
            resource,
            message,
        }
    }

    /// Reads `KJOB_BOOTSTRAP_SERVERS` and `KJOB_SCHEMA_REGISTRY_URL`, falling
    /// back to the local stack's addresses, plus the security variables (see
    /// [`KafkaConfig::security_from_env`]), the properties file named by
    /// `KJOB_KAFKA_CONFIG_FILE` and the `KJOB_KAFKA_<PROPERTY>` variables
    /// (see the [module docs](self) for the precedence). This is what every
    /// example, test and the CLI use, so one environment variable repoints
    /// all of them.
    ///
    /// It does not fail: a file that cannot be read, or a property
    /// librdkafka refuses, is reported by [`KafkaConfig::check`], which
    /// [`Codec::from_config`](crate::codec::Codec::from_config) calls, so a
    /// worker or producer fails at start naming it. Use
    /// [`KafkaConfig::try_from_env`] to fail here instead.
    pub fn from_env() -> Self {
        Self::from_env_with_file(None)
    }

    /// [`KafkaConfig::from_env`], failing at once (naming the property and
    /// where it came from) when the file or a property is unusable.
    pub fn try_from_env() -> Result<Self> {
        let config = Self::from_env();
        config.check()?;
        Ok(config)
    }

    /// [`KafkaConfig::from_env`] with `file` as the properties file instead
    /// of `KJOB_KAFKA_CONFIG_FILE`'s (`kjob --command-config FILE`).
    pub fn from_env_with_file(file: Option<&Path>) -> Self {
        let mut vars: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, _)| k.starts_with(PROPERTY_ENV_PREFIX))
            .collect();
        vars.sort();
        Self::from_sources(&|name| std::env::var(name).ok(), &vars, file)
    }

    /// The loading behind [`KafkaConfig::from_env`], over any variables:
    /// `var` looks one up, `kafka_vars` are the `KJOB_KAFKA_*` ones, applied
    /// in the given order.
    fn from_sources(
        var: &dyn Fn(&str) -> Option<String>,
        kafka_vars: &[(String, String)],
        file: Option<&Path>,
    ) -> Self {
        let named = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let mut config = Self::new(DEFAULT_BOOTSTRAP_SERVERS, DEFAULT_SCHEMA_REGISTRY_URL);
        let file = file
            .map(Path::to_path_buf)
            .or_else(|| named(CONFIG_FILE_ENV).map(PathBuf::from));
        if let Some(path) = file {
            if let Err(e) = config.load_properties(&path) {
                config.problem = Some(e);
            }
        }
        for (name, value) in kafka_vars {
            if let Some(key) = property_for_variable(name) {
                config.apply_property(&key, value, PropertySource::Variable(name.clone()));
            }
        }
        if let Some(v) = named("KJOB_BOOTSTRAP_SERVERS") {
            config.bootstrap_servers = v;
        }
        if let Some(v) = named("KJOB_SCHEMA_REGISTRY_URL") {
            config.schema_registry_url = v.trim_end_matches('/').to_string();
        }
        config.security_from(var)
    }

    /// Applies every property of the Java-properties file at `path` (see the
    /// [module docs](self)), as if each were a `KJOB_KAFKA_` variable.
    /// Fails naming the file when it cannot be read or parsed; properties
    /// librdkafka refuses are reported by [`KafkaConfig::check`].
    pub fn load_properties(&mut self, path: &Path) -> Result<()> {
        let bytes = std::fs::read(path).map_err(|e| Error::InvalidSetting {
            name: "Kafka properties file".into(),
            value: path.display().to_string(),
            reason: format!("cannot be read: {e}"),
        })?;
        let entries =
            properties::parse(&properties::decode(&bytes)).map_err(|e| Error::InvalidSetting {
                name: "Kafka properties file".into(),
                value: path.display().to_string(),
                reason: e,
            })?;
        for p in entries {
            self.apply_property(
                &p.key,
                &p.value,
                PropertySource::File {
                    path: path.to_path_buf(),
                    line: p.line,
                },
            );
        }
        Ok(())
    }

    /// One property from a file or variable: the named settings take theirs,
    /// everything else becomes an override.
    fn apply_property(&mut self, key: &str, value: &str, source: PropertySource) {
        let value = value.to_string();
        match key {
            "bootstrap.servers" | "metadata.broker.list" => self.bootstrap_servers = value,
            "schema.registry.url" => {
                self.schema_registry_url = value.trim_end_matches('/').to_string()
            }
            "security.protocol" => self.security_protocol = Some(value),
            "sasl.mechanism" | "sasl.mechanisms" => self.sasl_mechanism = Some(value),
            "sasl.username" => self.sasl_username = Some(value),
            "sasl.password" => self.sasl_password = Some(Secret::new(value)),
            "ssl.ca.location" => self.ssl_ca_location = Some(value),
            _ => {
                self.overrides.insert(key.to_string(), value);
                self.sources.insert(key.to_string(), source);
            }
        }
    }

    /// Whether librdkafka accepts every property this config sets (each
    /// checked on its own, so the error names the one it refuses, its value
    /// unless it is a credential, where it came from and, for a Java-only
    /// property, what to write instead), and whether its properties file
    /// could be read. No broker is contacted.
    pub fn check(&self) -> Result<()> {
        if let Some(problem) = &self.problem {
            return Err(problem.clone());
        }
        for (key, value) in self.client_config(&[]).config_map() {
            let mut one = ClientConfig::new();
            one.set(key, value);
            let Err(e) = one.create_native_config() else {
                continue;
            };
            let said = match &e {
                rdkafka::error::KafkaError::ClientConfig(_, desc, _, _) => desc.clone(),
                other => other.to_string(),
            };
            let mut reason = said;
            if let Some(hint) = java_only_hint(key) {
                reason = format!("{reason}; {hint}");
            } else if reason.contains("OpenSSL not available") {
                reason.push_str("; this build of librdkafka has no TLS: enable kjob's `tls` feature (needs libssl-dev)");
            }
            if let Some(source) = self.sources.get(key) {
                reason = format!("{reason} (set in {source})");
            }
            return Err(Error::InvalidSetting {
                name: key.to_string(),
                value: if is_secret_property(key) {
                    "***".into()
                } else {
                    value.to_string()
                },
                reason,
            });
        }
        Ok(())
    }

    /// Takes `KJOB_SECURITY_PROTOCOL`, `KJOB_SASL_MECHANISM`,
    /// `KJOB_SASL_USERNAME`, `KJOB_SASL_PASSWORD` and `KJOB_SSL_CA_LOCATION`
    /// from the environment where set (and non-empty), keeping the current
    /// value otherwise. Credentials come from the environment (or a secret
    /// store), never from a command line, where `ps` would show them.
    pub fn security_from_env(self) -> Self {
        self.security_from(&|name| std::env::var(name).ok())
    }

    fn security_from(mut self, var: &dyn Fn(&str) -> Option<String>) -> Self {
        let named = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if let Some(v) = named("KJOB_SECURITY_PROTOCOL") {
            self.security_protocol = Some(v);
        }
        if let Some(v) = named("KJOB_SASL_MECHANISM") {
            self.sasl_mechanism = Some(v);
        }
        if let Some(v) = named("KJOB_SASL_USERNAME") {
            self.sasl_username = Some(v);
        }
        if let Some(v) = var("KJOB_SASL_PASSWORD") {
            if !v.is_empty() {
                self.sasl_password = Some(Secret::new(v));
            }
        }
        if let Some(v) = named("KJOB_SSL_CA_LOCATION") {
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
            sources: BTreeMap::new(),
            problem: None,
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

/// How kjob authenticates to the schema registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryAuth {
    /// HTTP basic auth (Confluent Cloud: the API key and secret).
    Basic {
        /// User name or API key.
        user: String,
        /// Password or API secret.
        password: Secret,
    },
    /// `Authorization: Bearer <token>` (an OAuth access token).
    Bearer(Secret),
}

/// Registry client settings kept on [`KafkaConfig`]. `None` fields fall back
/// to the environment, then to the defaults (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryOptions {
    /// TCP (and TLS) connect timeout.
    pub connect_timeout: Option<Duration>,
    /// Timeout for a whole request, connect included.
    pub request_timeout: Option<Duration>,
    /// Credentials.
    pub auth: Option<RegistryAuth>,
}

/// The `client.id` a worker's consumer gets unless the user set one (a
/// `client.id` in the properties file, `KJOB_KAFKA_CLIENT_ID`, or
/// [`KafkaConfig::set`]): `kjob-<group>-<host>-<pid>`.
///
/// librdkafka's default is `rdkafka` for every client, so neither
/// `kafka-consumer-groups --describe --members` nor the dashboard's
/// members table could tell one worker process from another; the host and
/// the process id say which machine and which process to look at. Characters
/// other than ASCII letters, digits, `.`, `_` and `-` become `_`, so the id
/// reads the same in every tool and in the brokers' metrics.
pub fn default_client_id(group: &str) -> String {
    client_id_for(group, &hostname(), std::process::id())
}

fn client_id_for(group: &str, host: &str, pid: u32) -> String {
    format!(
        "kjob-{}-{}-{pid}",
        client_id_safe(group),
        client_id_safe(host)
    )
}

/// The host and process id in a client id that [`default_client_id`] made
/// for `group`; `None` for any other id (one the user chose). The group is
/// needed because both it and the host may hold a `-`.
pub fn host_and_pid(client_id: &str, group: &str) -> Option<(String, u32)> {
    let rest = client_id
        .strip_prefix("kjob-")?
        .strip_prefix(client_id_safe(group).as_str())?
        .strip_prefix('-')?;
    let (host, pid) = rest.rsplit_once('-')?;
    if host.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((host.to_string(), pid.parse().ok()?))
}

fn client_id_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// This machine's name: `HOSTNAME` (what containers set to the pod or
/// container name), else the kernel's (Linux), else `unknown-host`.
pub(crate) fn hostname() -> String {
    let from_env = std::env::var("HOSTNAME").ok();
    let from_kernel = || {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
    };
    from_env
        .filter(|h| !h.trim().is_empty())
        .or_else(from_kernel)
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// `url` with any `user:password@` replaced by `***@`, for messages
/// and logs. (A URL may carry credentials: reqwest sends them as basic auth.)
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://***@{host}{path}"),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests;
