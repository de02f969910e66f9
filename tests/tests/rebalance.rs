//! Pause state across rebalances, under every group protocol.
//!
//! librdkafka keeps an application's pause on a partition across a revoke
//! and a re-assignment of that partition to the same consumer. kjob pauses
//! partitions at the in-flight bound and holds retry-tier partitions until
//! their due time, so a rebalance at the wrong moment used to strand them:
//! lag above zero forever, no error. These tests put partitions in exactly
//! that state, then make a second worker join (and leave), and require that
//! every job runs and every offset is committed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kjob::{GroupProtocol, JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;

#[derive(Clone, Copy, Debug)]
enum Protocol {
    Eager,
    Cooperative,
    Kip848,
}

fn builder(config: &KafkaConfig, group: &str, protocol: Protocol) -> kjob::WorkerBuilder {
    match protocol {
        Protocol::Eager => {
            Worker::builder(config.clone(), group).group_protocol(GroupProtocol::Classic)
        }
        Protocol::Cooperative => Worker::builder(
            config
                .clone()
                .set("partition.assignment.strategy", "cooperative-sticky"),
            group,
        )
        .group_protocol(GroupProtocol::Classic),
        Protocol::Kip848 => {
            Worker::builder(config.clone(), group).group_protocol(GroupProtocol::Consumer)
        }
    }
}

/// Handled seqs, with how often each ran.
type Seen = Arc<Mutex<HashMap<i64, u32>>>;

async fn backlog(protocol: Protocol) {
    init_logging();
    let config = ensure_stack();
    let topic = unique("rebalance.backlog");
    let group = unique("g");
    create_topic(&config, &topic, 4).await;
    let producer = Producer::new(&config).expect("producer");
    const N: i64 = 40_000;
    enqueue_n(&producer, &topic, N, 4_000, "ok").await;

    let seen: Seen = Default::default();
    let make = |seen: Seen| {
        builder(&config, &group, protocol)
            .handle_on(&topic, move |job: TestJob, _ctx: JobContext| {
                let seen = seen.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    *seen.lock().unwrap().entry(job.seq).or_default() += 1;
                    Ok::<(), JobError>(())
                }
            })
            .concurrency(64)
            // Far below the backlog per partition: every partition is paused
            // at the bound when the second worker joins.
            .max_in_flight_per_partition(2_000)
            .commit_interval(Duration::from_millis(200))
            .build()
            .expect("worker builds")
    };
    let a = start(make(seen.clone()));
    eventually(
        Duration::from_secs(60),
        "A is working through the backlog",
        || seen.lock().unwrap().len() >= 1_000,
    )
    .await;
    let b = start(make(seen.clone()));
    // 40 000 jobs at 64 x 20 ms per worker is about 6 s of work for two;
    // a stranded partition never finishes.
    eventually(Duration::from_secs(120), "every job handled", || {
        seen.lock().unwrap().len() as i64 == N
    })
    .await;
    wait_committed_at_end(&config, &group, &topic, 4).await;
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_paused_at_the_bound_survives_a_join_eager() {
    backlog(Protocol::Eager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_paused_at_the_bound_survives_a_join_cooperative() {
    backlog(Protocol::Cooperative).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_paused_at_the_bound_survives_a_join_kip848() {
    backlog(Protocol::Kip848).await;
}

/// For each seq: (due time of its retry, when the retry ran), epoch ms.
type Retries = Arc<Mutex<HashMap<i64, (i64, i64)>>>;

async fn tier_hold(protocol: Protocol) {
    init_logging();
    let config = ensure_stack();
    let topic = unique("rebalance.tier");
    let group = unique("g");
    create_topic(&config, &topic, 4).await;
    let producer = Producer::new(&config).expect("producer");
    const N: i64 = 200;
    enqueue_n(&producer, &topic, N, 50, "fail-first").await;

    let retries: Retries = Default::default();
    let make = |retries: Retries| {
        builder(&config, &group, protocol)
            .handle_on(&topic, move |job: TestJob, ctx: JobContext| {
                let retries = retries.clone();
                async move {
                    if ctx.attempt == 1 {
                        return Err(JobError::server("test: first attempt fails"));
                    }
                    let due = ctx.due_at_ms.unwrap_or(0);
                    retries
                        .lock()
                        .unwrap()
                        .insert(job.seq, (due, kjob::dlq::now_ms()));
                    Ok(())
                }
            })
            .retry(kjob::retry::RetryPolicy::tiers([Duration::from_secs(10)]).jitter(0.0))
            .commit_interval(Duration::from_millis(200))
            .build()
            .expect("worker builds")
    };
    let a = start(make(retries.clone()));
    let tier = format!("{topic}.retry.10s");
    eventually(
        Duration::from_secs(30),
        "every job sits in the 10 s tier",
        || try_end_offsets(&config, &tier, 4).is_some_and(|e| e.iter().sum::<i64>() == N),
    )
    .await;
    // The tier's partitions are now held until due. Join, then leave.
    let b = start(make(retries.clone()));
    tokio::time::sleep(Duration::from_secs(4)).await;
    b.stop().await;
    eventually(Duration::from_secs(60), "every retry fired", || {
        retries.lock().unwrap().len() as i64 == N
    })
    .await;
    let late: Vec<i64> = retries
        .lock()
        .unwrap()
        .values()
        .map(|(due, ran)| ran - due)
        .collect();
    assert!(late.iter().all(|l| *l >= 0), "no retry ran early: {late:?}");
    let worst = late.iter().copied().max().unwrap_or(0);
    assert!(worst < 5_000, "a retry fired {worst} ms late");
    wait_committed_at_end(&config, &group, &tier, 4).await;
    wait_committed_at_end(&config, &group, &topic, 4).await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_retry_tier_survives_a_join_and_a_leave_eager() {
    tier_hold(Protocol::Eager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_retry_tier_survives_a_join_and_a_leave_cooperative() {
    tier_hold(Protocol::Cooperative).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_retry_tier_survives_a_join_and_a_leave_kip848() {
    tier_hold(Protocol::Kip848).await;
}

/// Static membership: a member that restarts with the same instance id
/// within the session timeout takes its partitions back, and the other
/// member goes through no rebalance at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_member_restarting_gets_its_partitions_back_without_a_rebalance() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("rebalance.static");
    let group = unique("g");
    create_topic(&config, &topic, 4).await;
    let producer = Producer::new(&config).expect("producer");
    let seen: Seen = Default::default();
    let make = |instance: &str, seen: Seen| {
        Worker::builder(config.clone(), &group)
            .static_member(format!("{group}-{instance}"))
            .handle_on(&topic, move |job: TestJob, _ctx: JobContext| {
                let seen = seen.clone();
                async move {
                    *seen.lock().unwrap().entry(job.seq).or_default() += 1;
                    Ok::<(), JobError>(())
                }
            })
            .commit_interval(Duration::from_millis(200))
            .build()
            .expect("worker builds")
    };
    let a = start(make("a", seen.clone()));
    let b = start(make("b", seen.clone()));
    enqueue_n(&producer, &topic, 400, 40, "ok").await;
    eventually(
        Duration::from_secs(60),
        "both members settled and working",
        || seen.lock().unwrap().len() == 400,
    )
    .await;
    // Let the group settle completely, then take B's count as the baseline.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = kjob::WorkerStats::get(&b.stats.rebalances);

    a.stop().await;
    let a = start(make("a", seen.clone()));
    let more: Vec<TestJob> = (400..800)
        .map(|i| TestJob::ok(format!("k{}", i % 40), i))
        .collect();
    for r in producer.enqueue_batch_to(&topic, &more).await {
        r.expect("enqueued");
    }
    eventually(
        Duration::from_secs(60),
        "every job after the restart ran",
        || seen.lock().unwrap().len() == 800,
    )
    .await;
    wait_committed_at_end(&config, &group, &topic, 4).await;
    assert_eq!(
        kjob::WorkerStats::get(&b.stats.rebalances),
        before,
        "the other member saw no rebalance while A restarted"
    );
    a.stop().await;
    b.stop().await;
}

/// A lone worker SIGKILLed and started again by its supervisor 1 s later:
/// with a static-member id (`KJOB_INSTANCE_ID`) the new process replaces
/// the dead member at once instead of waiting out its session (kjob's
/// 10 s), so a job enqueued after the restart runs within half a session
/// of the kill. The failover bench measures it (1.5 s, against 9.8 s
/// without an id); this test holds the mechanism, with room for a slow
/// machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_member_killed_and_restarted_resumes_before_its_session_expires() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("rebalance.restart");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let dir = std::env::temp_dir().join(unique("kjob-restart"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let record = dir.join("record");
    let spawn = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_test-worker"))
            .env("KJOB_TEST_TOPIC", &topic)
            .env("KJOB_TEST_GROUP", &group)
            .env("KJOB_TEST_RECORD", &record)
            .env("KJOB_TEST_KJOB_SESSION", "1")
            .env("KJOB_INSTANCE_ID", format!("{group}-0"))
            .spawn()
            .expect("test-worker runs")
    };
    let producer = Producer::new(&config).expect("producer");
    let done = |seq: i64| read_lines(&record).contains(&format!("done {seq}"));
    let mut first = spawn();
    producer
        .enqueue_to(&topic, &TestJob::ok("a", 1))
        .await
        .expect("enqueued");
    eventually(
        Duration::from_secs(60),
        "the first worker ran a job",
        || done(1),
    )
    .await;
    first.kill().expect("SIGKILL the worker");
    let killed = std::time::Instant::now();
    let _ = first.wait();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut second = spawn();
    for (i, key) in ["a", "b", "c", "d"].into_iter().enumerate() {
        producer
            .enqueue_to(&topic, &TestJob::ok(key, 10 + i as i64))
            .await
            .expect("enqueued");
    }
    eventually(
        Duration::from_secs(60),
        "the restarted worker ran them",
        || (10..14).all(done),
    )
    .await;
    let took = killed.elapsed();
    let _ = second.kill();
    let _ = second.wait();
    println!("SIGKILL -> restarted static member's jobs done: {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "the restarted member waited {took:?}: it should replace the dead one at once, not wait out the 10 s session"
    );
}
