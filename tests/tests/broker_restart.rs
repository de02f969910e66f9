//! Single-node mode: the only broker is SIGKILLed and restarted in the middle
//! of a run, and the worker recovers on its own, without a restart.
//!
//! The shared single-node stack on 9092 serves other test runs, so this test
//! starts a throwaway single node of its own (KRaft, 127.0.0.1:29092 and
//! 29093, data in `.stack/cluster/scratch-*`, deleted afterwards) from the
//! stack's Kafka jars. `#[ignore]`d in the default suite (it starts a JVM of
//! its own); `./dev test --cluster` runs it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;

const PORT: u16 = 29092;

/// The scratch broker's ports are fixed, so this file's tests (which
/// `./dev test --cluster` runs two at a time) take turns.
static SCRATCH_PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const CONTROLLER_PORT: u16 = 29093;
const JOBS: i64 = 5_000;
const PARTITIONS: i32 = 3;

fn java() -> String {
    std::env::var("KJOB_KAFKA_JAVA").unwrap_or_else(|_| "java".into())
}

fn kafka_classpath() -> String {
    let libs = repo_root().join(".stack/kafka-libs");
    assert!(
        libs.join(".complete").exists(),
        "{} is missing: run ./dev stack up once to fetch the Kafka jars",
        libs.display()
    );
    format!("{}/*", libs.display())
}

/// A throwaway single-node KRaft broker, killed and removed on drop.
struct Scratch {
    dir: PathBuf,
    child: Option<Child>,
}

impl Scratch {
    /// A broker with the stack's settings plus `extra` (properties lines).
    fn new(extra: &str) -> Self {
        for port in [PORT, CONTROLLER_PORT] {
            assert!(
                std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
                "port {port} is taken; the broker-restart test needs it free"
            );
        }
        let dir = repo_root().join(".stack/cluster").join(unique("scratch"));
        std::fs::create_dir_all(dir.join("data")).expect("scratch dir");
        std::fs::write(
            dir.join("server.properties"),
            format!(
                "process.roles=broker,controller\nnode.id=1\n\
                 controller.quorum.bootstrap.servers=127.0.0.1:{CONTROLLER_PORT}\n\
                 listeners=PLAINTEXT://127.0.0.1:{PORT},CONTROLLER://127.0.0.1:{CONTROLLER_PORT}\n\
                 advertised.listeners=PLAINTEXT://127.0.0.1:{PORT}\n\
                 controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n\
                 listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n\
                 log.dirs={}\nnum.partitions={PARTITIONS}\nauto.create.topics.enable=false\n\
                 offsets.topic.replication.factor=1\noffsets.topic.num.partitions=3\n\
                 transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n\
                 share.coordinator.state.topic.replication.factor=1\n\
                 share.coordinator.state.topic.min.isr=1\n\
                 group.initial.rebalance.delay.ms=0\nnum.network.threads=2\nnum.io.threads=2\n\
                 group.consumer.min.session.timeout.ms=6000\n\
                 group.consumer.session.timeout.ms=10000\n\
                 group.consumer.min.heartbeat.interval.ms=500\n\
                 group.consumer.heartbeat.interval.ms=500\n{extra}",
                dir.join("data").display()
            ),
        )
        .expect("writing server.properties");
        let out = Command::new(java())
            .args([
                "-Xmx128m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
            ])
            .arg(kafka_classpath())
            .args(["kafka.tools.StorageTool", "random-uuid"])
            .output()
            .expect("running StorageTool random-uuid");
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(out.status.success() && !id.is_empty(), "random-uuid failed");
        let status = Command::new(java())
            .args([
                "-Xmx128m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
            ])
            .arg(kafka_classpath())
            .args([
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                "-t",
                &id,
                "-c",
            ])
            .arg(dir.join("server.properties"))
            .stdout(Stdio::null())
            .status()
            .expect("formatting scratch storage");
        assert!(status.success(), "formatting the scratch broker failed");
        Self { dir, child: None }
    }

    fn start(&mut self) {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("broker.out"))
            .expect("broker log");
        let child = Command::new(java())
            .args([
                "-Xms128m",
                "-Xmx384m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Djava.awt.headless=true",
            ])
            .arg(format!("-Dkafka.logs.dir={}", self.dir.display()))
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                repo_root().join(".stack/kafka/log4j2.properties").display()
            ))
            .arg("-cp")
            .arg(kafka_classpath())
            .arg("kafka.Kafka")
            .arg(self.dir.join("server.properties"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting the scratch broker");
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn wait_answering(config: &KafkaConfig, within: Duration) {
    let start = Instant::now();
    loop {
        let c = config.clone();
        let ok = tokio::task::spawn_blocking(move || kjob::topics::list_topics(&c).is_ok())
            .await
            .unwrap_or(false);
        if ok {
            return;
        }
        assert!(
            start.elapsed() < within,
            "the scratch broker did not answer within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn dir_hint(dir: &Path) -> String {
    format!("see {}", dir.join("broker.out").display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "starts its own single-node Kafka on 29092: ./dev test --cluster"]
async fn the_worker_recovers_by_itself_when_the_single_broker_restarts() {
    init_logging();
    let registry = KafkaConfig::from_env().schema_registry_url;
    let config = KafkaConfig::new(format!("127.0.0.1:{PORT}"), registry);
    let _ports = SCRATCH_PORTS.lock().await;
    let mut broker = Scratch::new("");
    broker.start();
    wait_answering(&config, Duration::from_secs(90)).await;
    let hint = dir_hint(&broker.dir);

    let topic = unique("restart");
    let group = unique("restart-g");
    create_topic(&config, &topic, PARTITIONS).await;
    let producer = Producer::new(&config).expect("producer");
    // Half before the restart, half after it: the worker must fetch again.
    enqueue_seqs(&producer, &topic, 0..JOBS / 2, 31).await;

    let deliveries = Deliveries::new(JOBS);
    let d = deliveries.clone();
    // A small prefetch, so the records are not all in the client's memory
    // before the broker goes away.
    let worker_config = config
        .clone()
        .set("queued.max.messages.kbytes", "64")
        .set("max.partition.fetch.bytes", "16384");
    let worker = Worker::builder(worker_config, &group)
        .handle_on(&topic, move |job: TestJob, _ctx: JobContext| {
            let d = d.clone();
            async move {
                // Slow enough that the restart lands mid-run.
                tokio::time::sleep(Duration::from_millis(20)).await;
                d.record(job.seq);
                Ok::<(), JobError>(())
            }
        })
        .concurrency(16)
        .max_in_flight_per_partition(50)
        .commit_interval(Duration::from_millis(300))
        .build()
        .expect("worker builds");
    let running = start(worker);

    eventually(
        Duration::from_secs(60),
        "1 000 jobs handled before the restart",
        || deliveries.total() >= 1_000,
    )
    .await;
    broker.kill();
    let at_kill = deliveries.total();
    let killed_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    broker.start();
    wait_answering(&config, Duration::from_secs(90)).await;
    let back_after = killed_at.elapsed();
    let back_at = Instant::now();
    let at_back = deliveries.total();
    enqueue_seqs(&producer, &topic, JOBS / 2..JOBS, 31).await;
    // Broker back -> the worker handles jobs that only the restarted broker
    // has (the second half), through its own reconnect and the producer's.
    eventually(
        Duration::from_secs(60),
        "a job enqueued after the restart was handled",
        || deliveries.any_in(JOBS / 2..JOBS),
    )
    .await;
    let working_again = back_at.elapsed();

    eventually(
        Duration::from_secs(180),
        "every job handled after the restart",
        || deliveries.distinct() == JOBS,
    )
    .await;
    let resumed = killed_at.elapsed();
    let ends =
        wait_committed_at_end_within(&config, &group, &topic, PARTITIONS, Duration::from_secs(60))
            .await;
    running.stop().await;
    eprintln!(
        "restart: broker SIGKILLed after {at_kill} of {JOBS} jobs, answering again {back_after:?} later \
         ({at_back} handled by then); a job enqueued after the restart handled {working_again:?} after the broker answered; \
         all handled {resumed:?} after the kill by the same worker; duplicate deliveries {}",
        deliveries.duplicates()
    );
    // The broker dies mid-run; what the worker had already fetched it may
    // finish while the broker is down (at_back), the rest needs the broker.
    assert!(
        at_kill < (JOBS / 2) as u64,
        "the kill must land mid-run ({at_kill} done)"
    );
    assert_eq!(deliveries.distinct(), JOBS, "no job lost ({hint})");
    assert_eq!(ends.iter().sum::<i64>(), JOBS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "starts its own single-node Kafka on 29092: ./dev test --cluster"]
async fn a_broker_without_kip848_groups_is_refused_with_an_error_naming_the_fix() {
    init_logging();
    let registry = KafkaConfig::from_env().schema_registry_url;
    let config = KafkaConfig::new(format!("127.0.0.1:{PORT}"), registry);
    // As a broker older than Kafka 4.0 would: no KIP-848 consumer groups.
    let _ports = SCRATCH_PORTS.lock().await;
    let mut broker = Scratch::new("group.coordinator.rebalance.protocols=classic\n");
    broker.start();
    wait_answering(&config, Duration::from_secs(90)).await;
    let topic = unique("nokip848");
    create_topic(&config, &topic, 1).await;
    let worker = Worker::builder(config.clone(), unique("nokip848-g"))
        .handle_on(&topic, |_job: TestJob, _ctx: JobContext| async {
            Ok::<(), JobError>(())
        })
        .group_protocol(kjob::GroupProtocol::Consumer)
        .build()
        .expect("worker builds");
    let ran = tokio::time::timeout(
        Duration::from_secs(60),
        worker.run_until(std::future::pending()),
    )
    .await
    .expect("the worker stops on its own instead of polling forever");
    let error = ran
        .expect_err("the default protocol cannot work here")
        .to_string();
    assert!(
        error.contains("KJOB_GROUP_PROTOCOL=classic") && error.contains("KIP-848"),
        "the error names the protocol and the fix: {error}"
    );
    // And the classic protocol works against the same broker.
    let producer = Producer::new(&config).expect("producer");
    enqueue_n(&producer, &topic, 10, 10, "ok").await;
    let handled = Arc::new(AtomicU64::new(0));
    let h = handled.clone();
    let worker = Worker::builder(config.clone(), unique("nokip848-classic"))
        .handle_on(&topic, move |_job: TestJob, _ctx: JobContext| {
            let h = h.clone();
            async move {
                h.fetch_add(1, Ordering::Relaxed);
                Ok::<(), JobError>(())
            }
        })
        .group_protocol(kjob::GroupProtocol::Classic)
        .build()
        .expect("worker builds");
    let running = start(worker);
    eventually(Duration::from_secs(60), "classic handles the jobs", || {
        handled.load(Ordering::Relaxed) == 10
    })
    .await;
    running.stop().await;
}
