//! Broker failure on the three-broker cluster (`./dev test --cluster`):
//! SIGKILL the leader of a partition while 50 000 jobs are being enqueued
//! and processed. Nothing acknowledged may be lost, the idempotent producer
//! may not duplicate, and the group's committed offsets must reach the end
//! of every partition once the work is done.
//!
//! `#[ignore]`d in the default suite (CI has no cluster); `./dev test
//! --cluster` runs it with `--ignored`.

use std::time::{Duration, Instant};

use kjob::{JobContext, JobError, Producer, Worker};
use kjob_integration_tests::*;
use rdkafka::consumer::{BaseConsumer, Consumer};

const JOBS: i64 = 50_000;
const PARTITIONS: i32 = 6;

/// The node id leading `partition` of `topic`.
fn leader(config: &kjob::KafkaConfig, topic: &str, partition: i32) -> i32 {
    let c: BaseConsumer = config.rdkafka_config().create().expect("metadata client");
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    md.topics()
        .first()
        .and_then(|t| t.partitions().iter().find(|p| p.id() == partition))
        .map(|p| p.leader())
        .expect("partition has a leader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the three-broker SASL_SSL cluster: ./dev test --cluster"]
async fn sigkill_of_a_partition_leader_loses_nothing() {
    init_logging();
    let cluster = cluster();
    let config = cluster.admin.clone();
    let topic = unique("failover");
    let group = unique("failover-g");
    create_topic(&config, &topic, PARTITIONS).await;
    let producer = Producer::new(&config).expect("producer");

    // Half the jobs are in before the worker starts; the rest are enqueued
    // while the leader is killed.
    enqueue_seqs(&producer, &topic, 0..JOBS / 2, 97).await;

    let deliveries = Deliveries::new(JOBS);
    let d = deliveries.clone();
    let worker = Worker::builder(config.clone(), &group)
        .handle_on(&topic, move |job: TestJob, _ctx: JobContext| {
            let d = d.clone();
            async move {
                d.record(job.seq);
                Ok::<(), JobError>(())
            }
        })
        .commit_interval(Duration::from_millis(500))
        .build()
        .expect("worker builds");
    let started = Instant::now();
    let running = start(worker);

    eventually(
        Duration::from_secs(120),
        "10 000 jobs handled before the kill",
        || deliveries.total() >= 10_000,
    )
    .await;
    let victim = leader(&config, &topic, 0);
    let pid = cluster.node_pid(victim);
    let second_half = {
        let (producer, topic) = (producer.clone(), topic.clone());
        tokio::spawn(async move { enqueue_seqs(&producer, &topic, JOBS / 2..JOBS, 97).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_kill = deliveries.total();
    let killed_at = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(
        status.success(),
        "SIGKILL of node {victim} (pid {pid}) failed"
    );
    eprintln!("failover: SIGKILLed node {victim} (pid {pid}), leader of partition 0, after {at_kill} jobs");

    second_half.await.expect("enqueue task");
    let all_enqueued = killed_at.elapsed();
    eventually(
        Duration::from_secs(300),
        "every job handled after the kill",
        || deliveries.distinct() == JOBS,
    )
    .await;
    let drained = started.elapsed();
    let ends =
        wait_committed_at_end_within(&config, &group, &topic, PARTITIONS, Duration::from_secs(60))
            .await;
    running.stop().await;
    let new_leader = leader(&config, &topic, 0);

    // Bring the killed node back, so the cluster is whole for whatever runs next.
    cluster.up();

    let total: i64 = ends.iter().sum();
    let duplicates = deliveries.duplicates();
    eprintln!(
        "failover: {JOBS} jobs, lost 0, log holds {total}, duplicate deliveries {duplicates}, \
         second half enqueued {all_enqueued:?} after the kill, all handled {drained:?} after the worker started, \
         partition 0 leader {victim} -> {new_leader}"
    );
    assert_eq!(
        total, JOBS,
        "the idempotent producer wrote every job exactly once"
    );
    assert_eq!(deliveries.distinct(), JOBS, "no job lost");
    assert_ne!(new_leader, victim, "leadership moved off the killed node");
}
