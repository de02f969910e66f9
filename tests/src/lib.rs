//! Shared helpers for kjob's integration tests.
//!
//! Every test here runs against the real local stack (Kafka 4.x in KRaft
//! mode, Apicurio Registry 3.x). [`ensure_stack`] starts it through the
//! project's `./dev stack up` if it is not answering, and panics loudly if it
//! still is not: no test is ever skipped silently.

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use apache_avro::AvroSchema;
use kjob::{Job, KafkaConfig};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

/// The test contract (`schemas/kjob.test.job.v1.avsc`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, AvroSchema)]
#[avro(namespace = "kjob.test")]
pub struct TestJob {
    /// Partition key; jobs with one key run in order.
    pub key: String,
    /// Sequence number, unique per test run.
    pub seq: i64,
    /// What the test handler should do: "ok", "permanent", "panic", "block", "retry-once", ...
    pub behaviour: String,
}

impl Job for TestJob {
    const NAME: &'static str = "kjob.test.job";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = include_str!("../../schemas/kjob.test.job.v1.avsc");
    fn key(&self) -> String {
        self.key.clone()
    }
}

impl TestJob {
    /// A job that succeeds.
    pub fn ok(key: impl Into<String>, seq: i64) -> Self {
        Self {
            key: key.into(),
            seq,
            behaviour: "ok".into(),
        }
    }
    /// A job with a named behaviour.
    pub fn with(key: impl Into<String>, seq: i64, behaviour: &str) -> Self {
        Self {
            key: key.into(),
            seq,
            behaviour: behaviour.into(),
        }
    }
}

/// The repository root (where `./dev` lives).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

static STACK: Mutex<bool> = Mutex::new(false);

fn answers(addr: &str) -> bool {
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok())
}

fn registry_host_port(url: &str) -> String {
    let rest = url.split("://").nth(1).unwrap_or(url);
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// Makes sure Kafka and the registry answer, starting the local stack if
/// needed. Panics with the reason if they cannot be brought up.
pub fn ensure_stack() -> KafkaConfig {
    let config = KafkaConfig::from_env();
    let mut checked = STACK.lock().unwrap_or_else(|e| e.into_inner());
    if *checked {
        return config;
    }
    let bootstrap = config
        .bootstrap_servers
        .split(',')
        .next()
        .unwrap_or("")
        .to_string();
    let registry = registry_host_port(&config.schema_registry_url);
    if !(answers(&bootstrap) && answers(&registry)) {
        let status = Command::new(repo_root().join("dev"))
            .args(["stack", "up"])
            .status()
            .expect("running ./dev stack up");
        assert!(
            status.success(),
            "./dev stack up failed; the integration tests need the local stack"
        );
        assert!(
            answers(&bootstrap),
            "Kafka at {bootstrap} does not answer after ./dev stack up"
        );
        assert!(
            answers(&registry),
            "registry at {registry} does not answer after ./dev stack up"
        );
    }
    *checked = true;
    config
}

/// The PostgreSQL URL of the local stack (or `KJOB_DATABASE_URL`), after
/// making sure it answers (starting the stack if needed, failing loudly).
pub fn ensure_postgres() -> String {
    ensure_stack();
    let url = std::env::var("KJOB_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:54329/kjob".to_string());
    let host_port = url
        .split('@')
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or("127.0.0.1:54329")
        .to_string();
    if !answers(&host_port) {
        let status = Command::new(repo_root().join("dev"))
            .args(["stack", "up"])
            .status()
            .expect("running ./dev stack up");
        assert!(
            status.success(),
            "./dev stack up failed; the PostgreSQL tests need it"
        );
        assert!(
            answers(&host_port),
            "PostgreSQL at {host_port} does not answer after ./dev stack up"
        );
    }
    url
}

/// A name unique to this test run, so tests never share topics or groups.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}.{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Creates a topic (and waits until its metadata is visible).
pub async fn create_topic(config: &KafkaConfig, topic: &str, partitions: i32) {
    kjob::topics::create_topics(config, &[(topic.to_string(), partitions)])
        .await
        .expect("creating topic");
}

fn base_consumer(config: &KafkaConfig, group: &str) -> BaseConsumer {
    config
        .rdkafka_config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("creating consumer")
}

/// High watermarks (end offsets) per partition.
pub fn end_offsets(config: &KafkaConfig, topic: &str, partitions: i32) -> Vec<i64> {
    try_end_offsets(config, topic, partitions).expect("fetching watermarks")
}

/// End offsets, or `None` while the topic does not exist (yet).
pub fn try_end_offsets(config: &KafkaConfig, topic: &str, partitions: i32) -> Option<Vec<i64>> {
    let c = base_consumer(config, "kjob-tests-watermarks");
    (0..partitions)
        .map(|p| {
            c.fetch_watermarks(topic, p, Duration::from_secs(10))
                .ok()
                .map(|w| w.1)
        })
        .collect()
}

/// The group's committed offsets per partition (`None` where nothing is committed).
pub fn committed_offsets(
    config: &KafkaConfig,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Vec<Option<i64>> {
    let c = base_consumer(config, group);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("fetching committed offsets");
    (0..partitions)
        .map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        })
        .collect()
}

/// Waits (at most 30 s) until every topic of `topics` exists, as a worker
/// creates its tier and delay topics when it starts. A metadata timeout (a
/// busy broker with many topics) is "not yet", not a failure.
pub async fn wait_topics_exist(config: &KafkaConfig, topics: &[String], what: &str) {
    let start = std::time::Instant::now();
    loop {
        let (c, t) = (config.clone(), topics.to_vec());
        let counts = tokio::task::spawn_blocking(move || kjob::topics::partition_counts(&c, &t))
            .await
            .expect("metadata task");
        if counts.is_ok_and(|c| c.iter().all(Option::is_some)) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: not all of {topics:?} exist after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls `cond` every 100 ms until it holds or `timeout` passes.
pub async fn eventually<F: FnMut() -> bool>(timeout: Duration, what: &str, mut cond: F) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Produces raw bytes (for poison records), bypassing kjob's encoder.
pub fn produce_raw(config: &KafkaConfig, topic: &str, partition: i32, key: &str, payload: &[u8]) {
    let p: ThreadedProducer<DefaultProducerContext> =
        config.rdkafka_config().create().expect("creating producer");
    p.send(
        BaseRecord::to(topic)
            .partition(partition)
            .key(key)
            .payload(payload),
    )
    .map_err(|(e, _)| e)
    .expect("queueing raw record");
    p.flush(Duration::from_secs(10))
        .expect("flushing raw record");
}

/// Reads every record currently in `topic` (all partitions) with its headers.
pub fn read_all(config: &KafkaConfig, topic: &str) -> Vec<rdkafka::message::OwnedMessage> {
    use rdkafka::Message;
    let c: BaseConsumer = config
        .rdkafka_config()
        .set("group.id", unique("kjob-tests-reader"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("creating reader");
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let parts = md
        .topics()
        .first()
        .map(|t| t.partitions().len())
        .unwrap_or(0) as i32;
    let ends = end_offsets(config, topic, parts);
    let mut tpl = TopicPartitionList::new();
    for p in 0..parts {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    let total: i64 = ends.iter().sum();
    let mut out = Vec::new();
    let start = Instant::now();
    while (out.len() as i64) < total && start.elapsed() < Duration::from_secs(30) {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            out.push(m.detach());
        }
    }
    out.sort_by_key(|m| (m.partition(), m.offset()));
    out
}

/// Runs Kafka's own `ConsumerGroupCommand --describe` (from the fetched
/// kafka-tools) and returns `(partition, current offset, log end, lag)` rows
/// for `topic`. This is the independent check that kjob's commits are what
/// Kafka itself reports.
pub fn kafka_describe_group(
    config: &KafkaConfig,
    group: &str,
    topic: &str,
) -> Vec<(i32, Option<i64>, i64, Option<i64>)> {
    let out = Command::new(repo_root().join("dev"))
        .args([
            "kafka-class",
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
            "--bootstrap-server",
            &config.bootstrap_servers,
            "--describe",
            "--group",
            group,
        ])
        .output()
        .expect("running ConsumerGroupCommand");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ConsumerGroupCommand failed: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    let num = |s: &str| s.parse::<i64>().ok();
    text.lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG ...
            if cols.len() >= 6 && cols[1] == topic {
                Some((
                    cols[2].parse().ok()?,
                    num(cols[3]),
                    num(cols[4])?,
                    num(cols[5]),
                ))
            } else {
                None
            }
        })
        .collect()
}

/// The three-broker SASL_SSL cluster of `./dev stack up --brokers 3`, as
/// its `.stack/cluster/client.env` describes it.
pub struct Cluster {
    /// The stack's super user (creates topics, grants ACLs, enqueues).
    pub admin: KafkaConfig,
    /// The worker principal, which has only the ACLs `grant_worker` gives it.
    pub worker: KafkaConfig,
    /// The worker principal's name (`User:<this>` in ACLs).
    pub worker_user: String,
    /// Every password of the stack, for checking logs never show one.
    pub secrets: Vec<String>,
    /// `.stack/cluster`.
    pub dir: PathBuf,
}

/// Reads the cluster's client settings, failing loudly (never skipping) if
/// the cluster is not up: run these tests with `./dev test --cluster`.
pub fn cluster() -> Cluster {
    let dir = repo_root().join(".stack/cluster");
    let env = std::fs::read_to_string(dir.join("client.env")).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; the cluster tests need `./dev stack up --brokers 3` (./dev test --cluster does it)",
            dir.join("client.env").display()
        )
    });
    let vars: std::collections::HashMap<String, String> = env
        .lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let var = |k: &str| {
        vars.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("{k} missing from .stack/cluster/client.env"))
    };
    let bootstrap = var("KJOB_BOOTSTRAP_SERVERS");
    assert!(
        bootstrap.split(',').all(answers),
        "the three-broker cluster at {bootstrap} does not answer: ./dev stack up --brokers 3"
    );
    let registry = KafkaConfig::from_env().schema_registry_url;
    assert!(
        answers(&registry_host_port(&registry)),
        "the schema registry at {registry} does not answer: ./dev stack up"
    );
    let base = |user: &str, password: &str| {
        KafkaConfig::new(&bootstrap, &registry)
            .security_protocol(var("KJOB_SECURITY_PROTOCOL"))
            .sasl(
                var("KJOB_SASL_MECHANISM"),
                user,
                kjob::Secret::new(password),
            )
            .ssl_ca_location(var("KJOB_SSL_CA_LOCATION"))
    };
    let worker_user = var("KJOB_CLUSTER_WORKER_USERNAME");
    Cluster {
        admin: base(&var("KJOB_SASL_USERNAME"), &var("KJOB_SASL_PASSWORD")),
        worker: base(&worker_user, &var("KJOB_CLUSTER_WORKER_PASSWORD")),
        worker_user,
        secrets: vec![
            var("KJOB_SASL_PASSWORD"),
            var("KJOB_CLUSTER_WORKER_PASSWORD"),
        ],
        dir,
    }
}

impl Cluster {
    /// Grants the worker principal one route (`./dev stack grant-worker`):
    /// read the main topic and the group, read and write the tiers, write
    /// the DLQ and its audit topic.
    pub fn grant_worker(&self, topic: &str, group: &str) {
        let out = Command::new(repo_root().join("dev"))
            .args([
                "stack",
                "grant-worker",
                "--brokers",
                "3",
                "--topic",
                topic,
                "--group",
                group,
            ])
            .output()
            .expect("running ./dev stack grant-worker");
        assert!(
            out.status.success(),
            "./dev stack grant-worker failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The pid of cluster node `id` (from `.stack/cluster/pids`).
    pub fn node_pid(&self, id: i32) -> u32 {
        let f = self.dir.join(format!("pids/node{id}.pid"));
        std::fs::read_to_string(&f)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
            .trim()
            .parse()
            .expect("pid file holds a number")
    }

    /// Starts whatever node is not running (`./dev stack up --brokers 3`).
    pub fn up(&self) {
        let status = Command::new(repo_root().join("dev"))
            .args(["stack", "up", "--brokers", "3"])
            .status()
            .expect("running ./dev stack up --brokers 3");
        assert!(status.success(), "./dev stack up --brokers 3 failed");
    }
}

/// Appends a line to a file with one `write` call, so a SIGKILL right after
/// still leaves the line on disk (the kernel has it; no user-space buffer).
pub fn append_line(path: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("opening record file");
    f.write_all(format!("{line}\n").as_bytes())
        .expect("appending record line");
}

/// Lines of a record file (empty if it does not exist yet).
pub fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

/// A worker running on the test's runtime until [`Running::stop`].
pub struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<kjob::Result<()>>,
    /// The worker's live counters.
    pub stats: std::sync::Arc<kjob::WorkerStats>,
}

impl Running {
    /// Asks the worker to shut down gracefully and waits for it, failing the
    /// test if it did not stop cleanly.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.task
            .await
            .expect("worker task")
            .expect("worker stopped cleanly");
    }

    /// Starts the graceful shutdown without waiting for it.
    pub fn begin_stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Runs `worker` in a task until [`Running::stop`].
pub fn start(worker: kjob::Worker) -> Running {
    let stats = worker.stats();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(worker.run_until(async move {
        let _ = rx.await;
    }));
    Running {
        stop: Some(tx),
        task,
        stats,
    }
}

/// A worker whose handler records each job's seq in `handled`, unless
/// `broken` is set: then every job fails as invalid input, as after a bad
/// deploy, and goes to the DLQ (one 1 s retry tier before it). The DLQ
/// CLI's and the dashboard's tests flip `broken` to fill the DLQ, then
/// clear it to check what a re-drive delivers.
pub fn start_breakable_worker(
    config: &KafkaConfig,
    topic: &str,
    group: &str,
    broken: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handled: std::sync::Arc<Mutex<Vec<i64>>>,
) -> Running {
    let w = kjob::Worker::builder(config.clone(), group)
        .handle_on(topic, move |job: TestJob, _ctx: kjob::JobContext| {
            let broken = broken.clone();
            let handled = handled.clone();
            async move {
                if broken.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err(kjob::JobError::invalid_input(
                        "bad deploy: cannot parse order",
                    ));
                }
                handled
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(job.seq);
                Ok(())
            }
        })
        .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(1)]))
        .build()
        .expect("worker builds");
    start(w)
}

/// Enqueues `n` test jobs with `behaviour` over `keys` distinct keys
/// (seq `0..n`), failing the test if the broker did not take one.
pub async fn enqueue_n(producer: &kjob::Producer, topic: &str, n: i64, keys: i64, behaviour: &str) {
    let jobs: Vec<TestJob> = (0..n)
        .map(|i| TestJob::with(format!("k{}", i % keys), i, behaviour))
        .collect();
    for r in producer.enqueue_batch_to(topic, &jobs).await {
        r.expect("enqueue acknowledged");
    }
}

/// Waits (30 s at most) until `group` has committed the end offset of every
/// non-empty partition of `topic`: nothing is pending, nothing was skipped.
pub async fn wait_committed_at_end(
    config: &KafkaConfig,
    group: &str,
    topic: &str,
    partitions: i32,
) {
    wait_committed_at_end_within(config, group, topic, partitions, Duration::from_secs(30)).await;
}

/// [`wait_committed_at_end`] with its own bound (a cluster that just lost
/// a broker may take longer to settle). Returns the end offsets.
pub async fn wait_committed_at_end_within(
    config: &KafkaConfig,
    group: &str,
    topic: &str,
    partitions: i32,
    within: Duration,
) -> Vec<i64> {
    let ends = end_offsets(config, topic, partitions);
    eventually(within, "committed offsets == end offsets", || {
        let committed = committed_offsets(config, group, topic, partitions);
        committed
            .iter()
            .zip(&ends)
            .all(|(c, e)| *e == 0 || *c == Some(*e))
    })
    .await;
    ends
}

/// Enqueues the test jobs `seqs` (keys `k{seq % keys}`) in chunks of
/// 2 500, failing the test if the broker did not acknowledge one.
pub async fn enqueue_seqs(
    producer: &kjob::Producer,
    topic: &str,
    seqs: std::ops::Range<i64>,
    keys: i64,
) {
    let seqs: Vec<i64> = seqs.collect();
    for chunk in seqs.chunks(2_500) {
        let jobs: Vec<TestJob> = chunk
            .iter()
            .map(|s| TestJob::ok(format!("k{}", s % keys.max(1)), *s))
            .collect();
        for r in producer.enqueue_batch_to(topic, &jobs).await {
            r.expect("enqueue acknowledged");
        }
    }
}

/// How often each job `0..n` (by `seq`) was delivered to a handler: the
/// lost and duplicate counts of a failure test.
#[derive(Clone)]
pub struct Deliveries {
    counts: std::sync::Arc<Vec<std::sync::atomic::AtomicU32>>,
    total: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Deliveries {
    /// Counters for seqs `0..n`.
    pub fn new(n: i64) -> Self {
        Self {
            counts: std::sync::Arc::new(
                (0..n)
                    .map(|_| std::sync::atomic::AtomicU32::new(0))
                    .collect(),
            ),
            total: Default::default(),
        }
    }

    /// One delivery of `seq` (out-of-range seqs count only in the total).
    pub fn record(&self, seq: i64) {
        use std::sync::atomic::Ordering;
        if let Some(slot) = usize::try_from(seq).ok().and_then(|i| self.counts.get(i)) {
            slot.fetch_add(1, Ordering::Relaxed);
        }
        self.total.fetch_add(1, Ordering::Relaxed);
    }

    /// Deliveries so far, duplicates included.
    pub fn total(&self) -> u64 {
        self.total.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Jobs delivered at least once.
    pub fn distinct(&self) -> i64 {
        self.counts
            .iter()
            .filter(|c| c.load(std::sync::atomic::Ordering::Relaxed) > 0)
            .count() as i64
    }

    /// Whether any job in `seqs` was delivered.
    pub fn any_in(&self, seqs: std::ops::Range<i64>) -> bool {
        seqs.filter_map(|s| usize::try_from(s).ok().and_then(|i| self.counts.get(i)))
            .any(|c| c.load(std::sync::atomic::Ordering::Relaxed) > 0)
    }

    /// Deliveries beyond the first of each job.
    pub fn duplicates(&self) -> u64 {
        self.counts
            .iter()
            .map(|c| u64::from(c.load(std::sync::atomic::Ordering::Relaxed)).saturating_sub(1))
            .sum()
    }
}

/// Initialises test logging once (RUST_LOG controls it; warnings by default).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// A TCP proxy that a test can cut, so one client sees a shared service
/// (the broker, the registry) go down without stopping it for everyone.
///
/// [`CutProxy::tcp`] forwards bytes as they are (enough for HTTP). For
/// Kafka, [`CutProxy::kafka`], plain forwarding is not enough: after bootstrap, librdkafka connects to
/// the address the broker *advertises* (127.0.0.1:9092), bypassing a plain
/// proxy. So broker-to-client frames (Kafka's 4-byte size prefix, then the
/// response) are scanned for the upstream `host` + big-endian int32 `port`
/// (how Metadata and FindCoordinator responses carry a broker address) and
/// the port is rewritten to the proxy's. The length does not change, so no
/// frame needs re-encoding.
pub struct CutProxy {
    addr: std::net::SocketAddr,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cuts: tokio::sync::watch::Sender<u64>,
    accept: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// A Kafka-aware proxy on a free loopback port in front of the broker
    /// at `upstream` (`host:port`).
    pub async fn kafka(upstream: &str) -> Self {
        Self::start(upstream, true).await
    }

    /// A plain TCP proxy on a free loopback port in front of `upstream`
    /// (`host:port`).
    pub async fn tcp(upstream: &str) -> Self {
        Self::start(upstream, false).await
    }

    async fn start(upstream: &str, kafka: bool) -> Self {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (host, port) = upstream.rsplit_once(':').expect("upstream is host:port");
        let port: i32 = port.parse().expect("upstream port");
        let mut needle = host.as_bytes().to_vec();
        needle.extend_from_slice(&port.to_be_bytes());
        let needle = std::sync::Arc::new(needle);
        let replacement = i32::from(addr.port()).to_be_bytes();
        let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (cuts, _) = tokio::sync::watch::channel(0u64);
        let upstream = upstream.to_string();
        let (up2, cuts2) = (up.clone(), cuts.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if !up2.load(Ordering::Acquire) {
                    drop(client); // the broker is "down": reset at once
                    continue;
                }
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let mut cut = cuts2.subscribe();
                let needle = needle.clone();
                tokio::spawn(async move {
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let to_server = tokio::io::copy(&mut cr, &mut sw);
                    let to_client = async {
                        if kafka {
                            forward_patched(&mut sr, &mut cw, &needle, replacement).await
                        } else {
                            tokio::io::copy(&mut sr, &mut cw).await.map(|_| ())
                        }
                    };
                    tokio::select! {
                        _ = to_server => {}
                        _ = to_client => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self {
            addr,
            up,
            cuts,
            accept,
        }
    }

    /// The address clients should use (`host:port`).
    pub fn bootstrap(&self) -> String {
        self.addr.to_string()
    }

    /// The service goes away: open connections are closed, new ones reset.
    pub fn cut(&self) {
        self.up.store(false, std::sync::atomic::Ordering::Release);
        self.cuts.send_modify(|n| *n += 1);
    }

    /// The service is back.
    pub fn restore(&self) {
        self.up.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Copies Kafka response frames from `from` to `to`, rewriting `needle`'s
/// trailing 4 bytes (the broker port) to `port` wherever it occurs.
async fn forward_patched(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    needle: &[u8],
    port: [u8; 4],
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let mut size = [0u8; 4];
        from.read_exact(&mut size).await?;
        let len = usize::try_from(i32::from_be_bytes(size)).unwrap_or(0);
        let mut frame = vec![0u8; len];
        from.read_exact(&mut frame).await?;
        let mut i = 0;
        while i + needle.len() <= frame.len() {
            if &frame[i..i + needle.len()] == needle {
                let at = i + needle.len() - 4;
                frame[at..at + 4].copy_from_slice(&port);
                i += needle.len();
            } else {
                i += 1;
            }
        }
        to.write_all(&size).await?;
        to.write_all(&frame).await?;
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cuts.send_modify(|n| *n += 1);
    }
}

/// What one run of the `kjob` CLI printed.
pub struct CliOut {
    /// The exit status (-1 when killed by a signal).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs the `kjob` CLI binary `exe` (a test passes
/// `env!("CARGO_BIN_EXE_kjob-cli")`, which only integration tests see)
/// against the stack `config` points at, as operator `ops-tester` (the name
/// audit records carry).
pub fn run_kjob(exe: &str, config: &KafkaConfig, args: &[&str]) -> CliOut {
    let out = Command::new(exe)
        .args(args)
        .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
        .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
        .env("USER", "ops-tester")
        .output()
        .expect("running kjob");
    CliOut {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the `kjob` CLI binary `exe` with exactly the environment given
/// (nothing of the stack's is added): for tests of where settings come
/// from. `stdin` is written to its standard input when given.
pub fn run_kjob_env(exe: &str, args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> CliOut {
    let mut cmd = Command::new(exe);
    cmd.args(args).env_clear().env("USER", "ops-tester");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(if stdin.is_some() {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    })
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("running kjob");
    if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
        input
            .write_all(text.as_bytes())
            .expect("writing kjob's stdin");
    }
    let out = child.wait_with_output().expect("waiting for kjob");
    CliOut {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Commits `offsets` (`(partition, offset)`) of `topic` for `group`, as a
/// worker that got that far would have.
pub fn commit_offsets(config: &KafkaConfig, group: &str, topic: &str, offsets: &[(i32, i64)]) {
    use rdkafka::consumer::CommitMode;
    let c = base_consumer(config, group);
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o))
            .expect("building the commit");
    }
    c.commit(&tpl, CommitMode::Sync)
        .expect("committing offsets");
}

/// [`run_kjob`] that must succeed; returns its standard output.
pub fn kjob_ok(exe: &str, config: &KafkaConfig, args: &[&str]) -> String {
    let o = run_kjob(exe, config, args);
    assert_eq!(o.code, 0, "kjob {args:?} failed: {}{}", o.stdout, o.stderr);
    o.stdout
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_contract_matches_the_rust_type() {
        let file = apache_avro::Schema::parse_str(TestJob::SCHEMA).expect("schema parses");
        assert_eq!(
            file.canonical_form(),
            TestJob::get_schema().canonical_form()
        );
    }
}
pub mod sql_enqueue;

/// A table of job effects for the test-worker's `KJOB_TEST_EFFECTS`: one
/// `seq` row per successful job, written with its `PgMarkers` mark in
/// `<table>_marks`, so a crash test can count effects. Returns a client
/// and the table's name; [`effects_once`] counts and drops both tables.
pub async fn effects_table(prefix: &str) -> (tokio_postgres::Client, String) {
    let (db, conn) = tokio_postgres::connect(&ensure_postgres(), tokio_postgres::NoTls)
        .await
        .expect("postgres");
    tokio::spawn(conn);
    let effects = unique(prefix).replace(['.', '-'], "_");
    let markers = kjob::idempotency::PgMarkers::new(&format!("{effects}_marks")).expect("name");
    markers.create_table(&db).await.expect("marks table");
    db.batch_execute(&format!("CREATE TABLE {effects} (seq BIGINT NOT NULL)"))
        .await
        .expect("effects table");
    (db, effects)
}

/// The rows and distinct `seq`s in an [`effects_table`], which it drops
/// with its marks table.
pub async fn effects_once(db: &tokio_postgres::Client, effects: &str) -> (i64, i64) {
    let row = db
        .query_one(
            &format!("SELECT count(*), count(DISTINCT seq) FROM {effects}"),
            &[],
        )
        .await
        .expect("effects");
    db.batch_execute(&format!("DROP TABLE {effects}; DROP TABLE {effects}_marks"))
        .await
        .expect("drop");
    (row.get(0), row.get(1))
}
