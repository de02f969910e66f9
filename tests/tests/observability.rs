//! Metrics, lag, oldest-pending age, readiness and `kjob status`, scraped
//! and compared against Kafka's own tooling on the real stack.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kjob::retry::RetryPolicy;
use kjob::{JobContext, JobError, Producer, Worker, WorkerStats};
use kjob_integration_tests::*;
use tokio::sync::{oneshot, Notify};

async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let resp = reqwest::get(format!("http://{addr}{path}")).await.ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.text().await.ok()?))
}

/// Parses Prometheus text into `name{labels}` -> value.
fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn sum(metrics: &HashMap<String, f64>, prefix: &str, must_contain: &str) -> f64 {
    metrics
        .iter()
        .filter(|(k, _)| k.starts_with(prefix) && k.contains(must_contain))
        .map(|(_, v)| *v)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_lag_age_and_readiness_follow_the_work() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("obs");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let gate = Arc::new(Notify::new());
    let g = gate.clone();
    let worker = Worker::builder(config.clone(), &group)
        .handle_on(&topic, move |job: TestJob, ctx: JobContext| {
            let g = g.clone();
            async move {
                match job.behaviour.as_str() {
                    "retry" if ctx.attempt == 1 => Err(JobError::server("503")),
                    "dead" => Err(JobError::invalid_input("bad")),
                    "block" => {
                        g.notified().await;
                        Ok(())
                    }
                    _ => Ok(()),
                }
            }
        })
        .retry(RetryPolicy::tiers([Duration::from_secs(1)]))
        .commit_interval(Duration::from_millis(200))
        .metrics_endpoint("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    // A member that joined the group and then stopped polling: the worker's
    // join waits for it (up to its max.poll.interval.ms), so there is a
    // window where the worker runs but owns no partition.
    let blocker: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", &group)
        .set("session.timeout.ms", "6000")
        .set("max.poll.interval.ms", "7000")
        .create()
        .unwrap();
    {
        use rdkafka::consumer::Consumer;
        blocker.subscribe(&[&topic]).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while blocker.assignment().map(|a| a.count()).unwrap_or(0) == 0 {
            assert!(std::time::Instant::now() < deadline, "blocker never joined");
            let _ = blocker.poll(Duration::from_millis(100));
        }
    }
    let stats = worker.stats();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(worker.run_until(async {
        let _ = stop_rx.await;
    }));

    // Not ready before the assignment, ready after.
    eventually(Duration::from_secs(30), "endpoint bound", || {
        stats.endpoint.get().is_some()
    })
    .await;
    let addr = *stats.endpoint.get().unwrap();
    let mut saw_not_ready = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(std::time::Instant::now() < deadline, "never became ready");
        match get(addr, "/readyz").await {
            Some((503, _)) => saw_not_ready = true,
            Some((200, _)) => break,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        saw_not_ready,
        "/readyz answered 503 before the first assignment"
    );
    assert_eq!(get(addr, "/healthz").await.map(|r| r.0), Some(200));

    // 100 succeed, 10 fail once then succeed, 5 are dead-lettered.
    let producer = Producer::new(&config).unwrap();
    let mut jobs: Vec<TestJob> = (0..100).map(|i| TestJob::ok(format!("k{i}"), i)).collect();
    jobs.extend((100..110).map(|i| TestJob::with(format!("k{i}"), i, "retry")));
    jobs.extend((110..115).map(|i| TestJob::with(format!("k{i}"), i, "dead")));
    for r in producer.enqueue_batch_to(&topic, &jobs).await {
        r.unwrap();
    }
    eventually(Duration::from_secs(60), "all final", || {
        WorkerStats::get(&stats.handled) == 110 && WorkerStats::get(&stats.dead_lettered) == 5
    })
    .await;
    let m = parse(&get(addr, "/metrics").await.unwrap().1);
    let jobs_total = |outcome: &str| sum(&m, "kjob_jobs_total{", &format!("outcome=\"{outcome}\""));
    assert_eq!(jobs_total("ok"), 110.0, "{m:?}");
    assert_eq!(jobs_total("retried"), 10.0);
    assert_eq!(jobs_total("dead_lettered"), 5.0);
    assert_eq!(jobs_total("panicked"), 0.0);
    assert_eq!(
        sum(&m, "kjob_handler_seconds_count{", "kjob.test.job"),
        125.0,
        "one duration per attempt"
    );
    assert_eq!(sum(&m, "kjob_retry_due_lateness_seconds_count", ""), 10.0);
    assert!(sum(&m, "kjob_rebalances_total", "") >= 1.0);
    assert!(m.keys().any(|k| k.starts_with("kjob_in_flight{")));

    // Drained: lag and oldest age go to zero.
    let main_topic = format!("topic=\"{topic}\"");
    let drained = || async {
        let m = parse(&get(addr, "/metrics").await.map(|r| r.1).unwrap_or_default());
        let lag_seen = m
            .keys()
            .any(|k| k.starts_with("kjob_consumer_lag{") && k.contains(&main_topic));
        (
            lag_seen && sum(&m, "kjob_consumer_lag{", &main_topic) == 0.0,
            sum(&m, "kjob_oldest_pending_seconds{", &main_topic),
        )
    };
    let mut ok = false;
    for _ in 0..100 {
        let (lag_zero, age) = drained().await;
        if lag_zero && age == 0.0 {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(ok, "lag and oldest age reach 0 after draining");

    // A blocked handler: lag and age rise.
    producer
        .enqueue_to(&topic, &TestJob::with("stuck", 1000, "block"))
        .await
        .unwrap();
    for i in 0..5 {
        producer
            .enqueue_to(&topic, &TestJob::ok("stuck", 1001 + i))
            .await
            .unwrap();
    }
    let mut risen = false;
    for _ in 0..100 {
        let m = parse(&get(addr, "/metrics").await.unwrap().1);
        if sum(&m, "kjob_consumer_lag{", &main_topic) >= 6.0
            && sum(&m, "kjob_oldest_pending_seconds{", &main_topic) >= 2.0
        {
            risen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(risen, "lag and oldest age rise while a handler is blocked");

    // Shutdown begins while the blocked job is in flight: not ready any more.
    let _ = stop_tx.send(());
    let mut saw = None;
    for _ in 0..50 {
        if let Some((code, _)) = get(addr, "/readyz").await {
            saw = Some(code);
            if code == 503 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(saw, Some(503), "/readyz is 503 once shutdown begins");
    gate.notify_waiters();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kjob_status_agrees_with_kafkas_consumer_group_command() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("status");
    let group = unique("g");
    create_topic(&config, &topic, 3).await;
    let producer = Producer::new(&config).unwrap();
    let jobs: Vec<TestJob> = (0..30).map(|i| TestJob::ok(format!("k{i}"), i)).collect();
    for r in producer.enqueue_batch_to(&topic, &jobs).await {
        r.unwrap();
    }
    let w = Worker::builder(config.clone(), &group)
        .handle_on(&topic, |_j: TestJob, _c: JobContext| async {
            Ok::<(), JobError>(())
        })
        .retry(RetryPolicy::tiers([Duration::from_secs(1)]))
        .build()
        .unwrap();
    let stats = w.stats();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(w.run_until(async {
        let _ = rx.await;
    }));
    eventually(Duration::from_secs(30), "30 handled", || {
        WorkerStats::get(&stats.handled) == 30
    })
    .await;
    let _ = tx.send(());
    task.await.unwrap().unwrap();
    // 17 more that nobody handles yet.
    let more: Vec<TestJob> = (30..47).map(|i| TestJob::ok(format!("k{i}"), i)).collect();
    for r in producer.enqueue_batch_to(&topic, &more).await {
        r.unwrap();
    }

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args(["status", "--group", &group, "--topic", &topic, "--json"])
        .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
        .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_str(stdout.trim()).expect("status --json");
    let main = &status["topics"][0];
    assert_eq!(main["topic"], topic.as_str());
    assert_eq!(main["lag"], 17);
    assert!(main["oldest_pending_seconds"].as_f64().unwrap_or(0.0) >= 0.0);
    assert_eq!(status["topics"][1]["role"], "retry tier");
    assert_eq!(status["dlq_unresolved"], 0);

    let ours: HashMap<i64, i64> = main["partition_lag"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["partition"].as_i64().unwrap(), p["lag"].as_i64().unwrap()))
        .collect();
    let kafkas: HashMap<i64, i64> = kafka_describe_group(&config, &group, &topic)
        .into_iter()
        .map(|(p, _, _, lag)| (i64::from(p), lag.unwrap_or(-1)))
        .collect();
    assert_eq!(
        ours, kafkas,
        "kjob status and ConsumerGroupCommand --describe report the same lag"
    );

    // And the table form prints.
    let table = std::process::Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args(["status", "--group", &group, "--topic", &topic])
        .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("lag / waiting") && text.contains(&topic),
        "{text}"
    );
}

/// kjob's log setup (`kjob::telemetry::init`) with a filter by target, as
/// an operator narrows it (`RUST_LOG=kjob=info`): the worker's start line
/// must be there. With `RUST_LOG` as a per-layer filter it was dropped:
/// a `log` record refused just before it on the same thread (the Kafka
/// client logs through the `log` crate) left a stale verdict behind
/// (tokio-rs/tracing#2519).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_logs_its_start_under_a_filter_by_target() {
    let text = stdout_until_assigned("1", Some("kjob=info")).await;
    assert!(text.contains("worker started"), "no start line in:\n{text}");
}

/// A worker whose program installed no `tracing` subscriber logs to
/// stdout anyway (kjob's default): a newcomer's first worker is never
/// silent. `RUST_LOG` is unset, so the default filter (`info`) applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_logs_to_stdout_without_any_setup() {
    let text = stdout_until_assigned("none", None).await;
    assert!(
        text.contains("worker started") && text.contains("logs.default"),
        "no start line naming the topic in:\n{text}"
    );
}

/// Runs the test worker on a fresh topic (`logs.default.<id>`) with
/// `KJOB_TEST_TELEMETRY=telemetry` and `RUST_LOG` (unset when `None`), and
/// returns its stdout once it logged its assignment: the start line is
/// logged before it, so by then it had its chance.
async fn stdout_until_assigned(telemetry: &str, rust_log: Option<&str>) -> String {
    let config = ensure_stack();
    let topic = unique("logs.default");
    create_topic(&config, &topic, 1).await;
    let dir = std::env::temp_dir().join(unique("logs"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = dir.join("stdout");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_test-worker"));
    cmd.env("KJOB_TEST_TOPIC", &topic)
        .env("KJOB_TEST_GROUP", unique("g"))
        .env("KJOB_TEST_RECORD", dir.join("record"))
        .env("KJOB_TEST_TELEMETRY", telemetry)
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stdout(std::fs::File::create(&out).expect("stdout file"));
    if let Some(filter) = rust_log {
        cmd.env("RUST_LOG", filter);
    }
    let mut child = cmd.spawn().expect("spawning test-worker");
    let logged = |what: &str| {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .contains(what)
    };
    eventually(
        Duration::from_secs(60),
        "the worker logged its assignment on stdout",
        || logged("assigned"),
    )
    .await;
    let _ = child.kill();
    let _ = child.wait();
    std::fs::read_to_string(&out).unwrap_or_default()
}
