//! Framework errors: what goes wrong *around* a job (connecting, encoding,
//! producing), as opposed to [`crate::JobError`], which a handler returns
//! about the job itself.
//!
//! Every variant names the thing that failed (the topic, the subject, the
//! registry URL), because the person reading it is usually an operator at
//! 3 a.m. who did not write the code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::retry::RetryPolicyError;

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything kjob itself can fail at.
///
/// `Clone` (wrapped sources are `Arc`ed) so a setup error can be kept and
/// reported again, as the worker builder does with a codec that failed to
/// build. `#[non_exhaustive]`: new failure modes get their own variant
/// rather than a catch-all string, so match with a `_` arm.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The schema registry could not be reached or answered with an error.
    #[error("schema registry at {url}: {message}")]
    Registry {
        /// The registry base URL that was called.
        url: String,
        /// What the registry (or the HTTP client) said.
        message: String,
    },
    /// The schema registry did not answer within the configured timeout.
    #[error("schema registry at {url} did not answer within {timeout:?} while {during}; check that it is up and reachable from here, or raise the timeout (KafkaConfig::registry_timeouts / KJOB_SCHEMA_REGISTRY_TIMEOUT_MS and KJOB_SCHEMA_REGISTRY_CONNECT_TIMEOUT_MS)")]
    RegistryTimeout {
        /// The registry base URL that was called.
        url: String,
        /// The timeout that ran out (connect or request).
        timeout: Duration,
        /// What kjob was asking for.
        during: String,
    },
    /// The schema registry refused kjob's credentials (HTTP 401 or 403).
    #[error("schema registry at {url} answered HTTP {status} while {during}: set KJOB_SCHEMA_REGISTRY_USER and KJOB_SCHEMA_REGISTRY_PASSWORD, or KJOB_SCHEMA_REGISTRY_TOKEN (or KafkaConfig::registry_basic_auth / registry_bearer_token), to credentials allowed to do that")]
    RegistryUnauthorized {
        /// The registry base URL that was called.
        url: String,
        /// 401 or 403.
        status: u16,
        /// What kjob was asking for.
        during: String,
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
    /// A worker's reader schema cannot read the newest writer schema
    /// registered under the subject of a topic it consumes: every record
    /// producers write now would become a dead letter. Checked at start,
    /// before the first poll, so a deploy fails there instead of hours
    /// later in the DLQ.
    #[error(
        "contract `{job}` v{version} cannot read what producers write to `{topic}`: the newest writer under subject `{subject}` is version {writer_version}, and {reason}; deploy a reader that can (add a default to the field), or check the change first with `kjob schema check --topic {topic}`"
    )]
    ReaderCannotRead {
        /// Contract name.
        job: String,
        /// Contract version compiled into this binary.
        version: u32,
        /// The topic the route consumes.
        topic: String,
        /// Its subject (TopicNameStrategy: `<topic>-value`).
        subject: String,
        /// The registered version the reader cannot read.
        writer_version: u32,
        /// The Avro library's reason, naming the field.
        reason: String,
    },
    /// Another client set a subject's compatibility level at the same
    /// moment as kjob, to a level other than the one kjob was setting. kjob
    /// never overrides a level someone chose, and it does not guess which of
    /// the two was meant, so it stops and names both.
    #[error("schema registry at {url}: while kjob set the compatibility level of `{subject}` to {wanted}, another client set it to {found}; decide which level the subject should have, set it (`curl -X PUT -H 'Content-Type: application/json' -d '{{\"compatibility\":\"{wanted}\"}}' {url}/config/{subject}` for kjob's default), and start again: kjob keeps a level that is already set")]
    CompatibilityConflict {
        /// The registry base URL that was called.
        url: String,
        /// The subject whose level was set twice.
        subject: String,
        /// The level kjob was setting.
        wanted: crate::registry::compatibility::Compatibility,
        /// The level the registry holds now.
        found: crate::registry::compatibility::Compatibility,
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
    /// A topic the caller relies on does not exist. The message names the
    /// command that creates it: for a route's DLQ, retry tier or delay
    /// topic the route's (`kjob topics create --topic <main>`), never a
    /// route whose main topic is the DLQ.
    #[error("{}", missing_topic(topic, bootstrap))]
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
    /// A setting (a builder argument, an environment variable, a librdkafka
    /// property kjob interprets) has a value kjob cannot use.
    #[error("invalid setting `{name}` = `{value}`: {reason}")]
    InvalidSetting {
        /// The setting's name, as the user spells it (`group.protocol`,
        /// `KJOB_SCHEMA_REGISTRY_USER`, ...).
        name: String,
        /// The value given (never a secret: credentials are redacted).
        value: String,
        /// What is wrong and what would be accepted.
        reason: String,
    },
    /// `WorkerBuilder::build` was called without any handler.
    #[error("a worker needs at least one handler: register one with WorkerBuilder::handle (or handle_on) before build()")]
    NoHandlers,
    /// Two routes of one worker would consume the same topic.
    #[error("topic `{topic}` is used twice in one worker (two handlers, or one route's main topic equal to another's retry tier); give each route its own topic")]
    DuplicateTopic {
        /// The topic claimed twice.
        topic: String,
    },
    /// A handler takes `State<T>` for a `T` the builder was not given.
    #[error("the handler for `{topic}` takes State<{state}>, which is not registered: call WorkerBuilder::state(...) with it")]
    MissingState {
        /// The route's main topic.
        topic: String,
        /// The state's type name.
        state: &'static str,
    },
    /// A per-route setting names a topic no handler is registered for.
    #[error("{setting}(`{topic}`) names a topic no handler is registered for; register a handler for it or fix the topic name")]
    NoSuchRoute {
        /// The topic named.
        topic: String,
        /// The builder method (`layer_for`, ...).
        setting: &'static str,
    },
    /// A retry policy is unusable for this route.
    #[error("retry policy for `{topic}`: {reason}")]
    RetryPolicy {
        /// The route's main topic.
        topic: String,
        /// What is wrong with the policy.
        #[source]
        reason: RetryPolicyError,
    },
    /// The Prometheus exporter could not be set up.
    #[error("metrics: {reason}")]
    Metrics {
        /// The exporter's error.
        reason: String,
    },
    /// The metrics/health endpoint could not listen.
    #[error("metrics endpoint on {addr}: {source}; pick a free port (or port 0)")]
    Endpoint {
        /// The address asked for.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// Logging or trace export could not be set up.
    #[error("telemetry: {what}: {reason}")]
    Telemetry {
        /// Which part (`OTLP trace exporter`, `tracing subscriber`).
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The caller asked for something this build of kjob left out.
    #[error("{what} needs kjob's `{feature}` cargo feature, which this build was compiled without; enable it in Cargo.toml (it is on by default)")]
    FeatureDisabled {
        /// The cargo feature.
        feature: &'static str,
        /// What was asked for.
        what: &'static str,
    },
    /// A file or directory kjob reads (contracts) could not be read.
    #[error("reading {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A contract file's name does not say which contract and version it is.
    #[error("{}: contract files are named <name>.v<N>.avsc (e.g. orders.confirmation.v2.avsc)", path.display())]
    ContractFileName {
        /// The offending file.
        path: PathBuf,
    },
    /// Creating a topic failed for a reason other than its existing already.
    #[error("creating topic `{topic}` failed: {reason}")]
    CreateTopic {
        /// The topic.
        topic: String,
        /// The broker's reason, with what to do about it.
        reason: String,
    },
    /// A consumer group kjob was asked about has no members and no offsets.
    #[error("group `{group}` is unknown: no members and no committed offsets for {topics:?}; check the group name (`kjob groups list` lists the groups)")]
    UnknownGroup {
        /// The group.
        group: String,
        /// The topics looked at.
        topics: Vec<String>,
    },
    /// An offset reset was refused because the group is running.
    #[error("group `{group}` has {} live member(s): {}; stop them first (or replay into a --shadow-group)", members.len(), members.join(", "))]
    GroupHasMembers {
        /// The group.
        group: String,
        /// `id (client on host)` of each live member.
        members: Vec<String>,
    },
    /// A replay target does not exist in the log.
    #[error("replay target: {reason}")]
    ReplayTarget {
        /// What is out of range, with the valid range.
        reason: String,
    },
    /// A re-drive into the first retry tier of a route that has none.
    #[error("`{topic}` has no retry tier topics (`{topic}.retry.<delay>`); re-drive with `--to main` instead")]
    NoRetryTiers {
        /// The main topic.
        topic: String,
    },
    /// kjob could not serialize one of its own JSON records (an audit entry).
    #[error("serializing {what}: {source}")]
    Json {
        /// What was being written.
        what: &'static str,
        /// The serializer's error.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// Encoding a job to Avro failed (the value does not fit its schema).
    #[error("encoding `{job}`: {message}")]
    Encode {
        /// Contract name.
        job: String,
        /// The Avro library's reason.
        message: String,
    },
    /// A delayed job cannot be accepted (too long, or its delay topics are
    /// missing or keep records too briefly); nothing was written.
    #[error("delayed job on `{topic}`: {reason}")]
    Delay {
        /// The main topic.
        topic: String,
        /// What is wrong, and the fix (in the message, not as a `source()`,
        /// so an error chain printer does not say it twice).
        reason: crate::delay::DelayError,
    },
    /// A blocking task (a metadata lookup, a state read) ended without an
    /// answer: it panicked, or the runtime is shutting down.
    #[error("{what} failed before it answered ({reason}); this is a bug unless the process is shutting down: the log above says why")]
    Task {
        /// What the task was doing.
        what: &'static str,
        /// How it ended.
        reason: String,
    },
    /// The worker could not start its poll thread.
    #[error("could not start the worker's poll thread: {reason}; the process is out of threads or memory (check ulimit -u and the container's limits)")]
    PollThread {
        /// What the OS said.
        reason: String,
    },
    /// The poll thread ended while the worker ran.
    #[error("the worker's poll thread ended unexpectedly (a panic: the log above names it); offsets up to the last commit are safe, restart the worker")]
    PollThreadEnded,
    /// The consumer did not close within its bound after the grace period.
    #[error("the consumer did not close within {bound:?} after the grace period; offsets up to the last commit are safe, and the group notices the member's departure within its session timeout")]
    CloseTimeout {
        /// How long the worker waited.
        bound: Duration,
    },
    /// librdkafka gave up on the client for a reason kjob has no advice for.
    #[error("the Kafka client stopped on a fatal error: {message}; restart the worker, and if it recurs check the broker's log for this client")]
    FatalClient {
        /// librdkafka's description.
        message: String,
    },
    /// Reading a topic to its end took longer than allowed.
    #[error("reading {topic} timed out after {after:?}; check that the brokers are up and that the topic's partition leaders are available (kafka-topics --describe --topic {topic})")]
    ReadTimeout {
        /// The topic (and partition) being read.
        topic: String,
        /// How long it was read.
        after: Duration,
    },
    /// The broker answered without offsets for a partition.
    #[error("the broker returned no offsets for {topic}:{partition}; is its leader available? (kafka-topics --describe --topic {topic})")]
    NoOffsets {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// The producer went away before it acknowledged a write.
    #[error("writing {topic}: the producer was dropped before it acknowledged the record; the write is repeated by the caller's retry")]
    Unacknowledged {
        /// The topic written to.
        topic: String,
    },
    /// A worker limit fired and the worker stopped gracefully (drained,
    /// committed, left the group); a supervisor should start a new one.
    #[error("worker limit reached: {0}; stopped gracefully, restart the worker")]
    LimitReached(StopLimit),
    /// A batch call that cannot be done: an id that is empty or too long,
    /// an enqueue after `seal()`, a callback no route handles.
    #[error("batch `{batch}`: {reason}")]
    Batch {
        /// The batch id (cut to 200 bytes).
        batch: String,
        /// What is wrong and what to do.
        reason: String,
    },
}

/// The [`Error::MissingTopic`] message.
fn missing_topic(topic: &str, bootstrap: &str) -> String {
    let main = crate::topics::names::route_of(topic);
    if main == topic {
        return format!("topic `{topic}` does not exist on {bootstrap}; create it first, e.g. `kjob topics create --topic {topic} --partitions 6 --execute` (in development, `.create_main_topics(n)` on the worker creates it)");
    }
    format!(
        "topic `{topic}` (of route `{main}`) does not exist on {bootstrap}; a worker of the route creates its DLQ and retry tiers at start, or create the missing ones with `kjob topics create --topic {main} --execute` (its existing topics are left alone; without --execute it shows what it would create; add --delays for delay topics, --tiers none for no retry tiers)"
    )
}

impl Error {
    /// A process exit status for this error: a worker limit's own code
    /// (81 jobs, 82 memory, 83 time, see `WorkerBuilder::stop_after_jobs`) so a
    /// supervisor and a human can tell a planned restart from a failure
    /// (1).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::LimitReached(limit) => limit.exit_code(),
            _ => 1,
        }
    }

    /// Whether retrying the same operation can never succeed (a refused
    /// record), as opposed to a transient failure such as an unreachable
    /// broker.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Error::Rejected { .. })
    }

    /// Wraps an rdkafka error with what kjob was trying to do (and, when
    /// librdkafka lacks TLS, the cargo feature that builds it in). Public so
    /// that tools built on kjob (kjob-ops) report Kafka errors alike.
    pub fn kafka(context: impl Into<String>, source: rdkafka::error::KafkaError) -> Self {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::retry::RetryPolicy;
    use crate::{Job, JobContext, JobError, KafkaConfig, Worker, WorkerBuilder};

    #[derive(Serialize, Deserialize)]
    struct Ping {
        id: String,
    }

    impl Job for Ping {
        const NAME: &'static str = "kjob.unit.ping";
        const VERSION: u32 = 1;
        const SCHEMA: &'static str =
            r#"{"type":"record","name":"Ping","fields":[{"name":"id","type":"string"}]}"#;
        fn key(&self) -> String {
            self.id.clone()
        }
    }

    fn builder() -> WorkerBuilder {
        // Nothing is contacted before `run`: no stack needed.
        Worker::builder(KafkaConfig::new("127.0.0.1:1", "http://127.0.0.1:1"), "g")
    }

    async fn ok(_: Ping, _: JobContext) -> std::result::Result<(), JobError> {
        Ok(())
    }

    fn build_error(b: WorkerBuilder) -> Option<Error> {
        b.build().err()
    }

    #[test]
    fn worker_setup_errors_are_precise() {
        assert!(matches!(build_error(builder()), Some(Error::NoHandlers)));

        let twice = builder().handle_on("t", ok).handle_on("t", ok);
        assert!(matches!(
            build_error(twice),
            Some(Error::DuplicateTopic { topic }) if topic == "t"
        ));

        // A main topic equal to another route's retry tier.
        let clash = builder()
            .retry(RetryPolicy::tiers([Duration::from_secs(5)]))
            .handle_on("a", ok)
            .handle_on("a.retry.5s", ok);
        assert!(matches!(
            build_error(clash),
            Some(Error::DuplicateTopic { topic }) if topic == "a.retry.5s"
        ));

        let no_tiers = builder()
            .handle_on("t", ok)
            .retry(RetryPolicy::tiers([]).max_attempts(3));
        let err = build_error(no_tiers);
        assert!(
            matches!(
                &err,
                Some(Error::RetryPolicy { topic, reason: RetryPolicyError::NoTiers { max_attempts: 3 } })
                    if topic == "t"
            ),
            "{err:?}"
        );
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("add a tier"), "says what to change: {text}");

        let unknown = builder()
            .handle_on("t", ok)
            .retry_for("typo", RetryPolicy::default());
        assert!(matches!(
            build_error(unknown),
            Some(Error::RetryPolicy { topic, reason: RetryPolicyError::NoSuchRoute }) if topic == "typo"
        ));
    }

    #[test]
    fn missing_state_and_unknown_layer_routes_are_named() {
        async fn needs_state(
            _: Ping,
            _: JobContext,
            crate::State(_n): crate::State<u64>,
        ) -> std::result::Result<(), JobError> {
            Ok(())
        }
        let err = build_error(builder().handle_on("t", needs_state));
        assert!(
            matches!(&err, Some(Error::MissingState { topic, state }) if topic == "t" && state.contains("u64")),
            "{err:?}"
        );
        assert!(builder()
            .handle_on("t", needs_state)
            .state(7u64)
            .build()
            .is_ok());

        let err = build_error(
            builder()
                .handle_on("t", ok)
                .layer_for("typo", tower::layer::util::Identity::new()),
        );
        assert!(
            matches!(&err, Some(Error::NoSuchRoute { topic, setting: "layer_for" }) if topic == "typo"),
            "{err:?}"
        );
    }

    #[test]
    fn errors_name_the_fix() {
        assert!(Error::NoHandlers
            .to_string()
            .contains("WorkerBuilder::handle"));
        let e = Error::FeatureDisabled {
            feature: "metrics-http",
            what: "a metrics endpoint",
        };
        assert!(e.to_string().contains("`metrics-http` cargo feature"));
        let e = Error::RegistryTimeout {
            url: "http://r:8081".into(),
            timeout: Duration::from_millis(1500),
            during: "listing subjects".into(),
        };
        let text = e.to_string();
        assert!(
            text.contains("http://r:8081") && text.contains("1.5s"),
            "{text}"
        );
        // Clone keeps the source.
        let io = Error::Io {
            path: "schemas".into(),
            source: Arc::new(std::io::Error::from(std::io::ErrorKind::NotFound)),
        };
        let copy = io.clone();
        assert!(std::error::Error::source(&copy).is_some());
    }
}

/// Which limit ended a worker's run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopLimit {
    /// `stop_after_jobs(n)`: `n` jobs were handled.
    Jobs(u64),
    /// `stop_above_rss(bytes)`: the resident set grew above `bytes`.
    Rss(u64),
    /// `stop_after(d)`: the worker ran for `d`.
    Time(Duration),
}

impl StopLimit {
    /// The process exit status for this limit: 81 jobs, 82 memory, 83 time.
    pub fn exit_code(&self) -> u8 {
        match self {
            StopLimit::Jobs(_) => 81,
            StopLimit::Rss(_) => 82,
            StopLimit::Time(_) => 83,
        }
    }
}

impl std::fmt::Display for StopLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopLimit::Jobs(n) => write!(f, "stop_after_jobs={n} (KJOB_STOP_AFTER_JOBS)"),
            StopLimit::Rss(b) => write!(f, "stop_above_rss={b} bytes (KJOB_STOP_ABOVE_RSS)"),
            StopLimit::Time(d) => write!(f, "stop_after={d:?} (KJOB_STOP_AFTER)"),
        }
    }
}
