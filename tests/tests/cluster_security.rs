//! kjob on the three-broker SASL_SSL cluster (`./dev test --cluster`): a
//! worker principal with exactly one route's ACLs processes it (retries and
//! DLQ included); the same worker is refused, clearly and quickly, on a
//! topic or group it was not granted and with a wrong password; and no
//! captured log line ever contains a password.
//!
//! These tests are `#[ignore]`d in the default suite (CI has no cluster):
//! `./dev test --cluster` brings the cluster up and runs them with
//! `--ignored`.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kjob::batch::When;
use kjob::retry::RetryPolicy;
use kjob::topics::{create_topics, create_topics_with, dlq_audit_topic, dlq_topic};
use kjob::{JobContext, JobError, KafkaConfig, Producer, Secret, Worker};
use kjob_integration_tests::*;
use rdkafka::message::Message;

/// Everything every test logged (kjob's tracing and librdkafka's own log,
/// with librdkafka's `security` and `conf` debug contexts on), plus the
/// text of every error the tests saw: the haystack the password grep runs on.
static CAPTURE: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct CaptureWriter;

impl Write for CaptureWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let r = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "debug,hyper=info,hyper_util=info,reqwest=info,h2=info,tower=info",
            ))
            .with_ansi(false)
            .with_writer(|| CaptureWriter)
            .try_init();
        assert!(r.is_ok(), "installing the log capture failed: {r:?}");
    });
}

fn captured() -> String {
    String::from_utf8_lossy(&CAPTURE.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

fn note(text: &str) {
    let _ = writeln!(CaptureWriter, "test saw: {text}");
}

/// The grep: no password of the stack (nor `extra`) appears in anything
/// captured so far. Where the test's clients served their log queue, the
/// capture must hold librdkafka's SASL lines, or the grep would prove
/// nothing.
fn assert_no_secret_logged(cluster: &Cluster, extra: &[&str], expect_sasl_lines: bool) {
    let logs = captured();
    assert!(
        !expect_sasl_lines || logs.contains("SASL"),
        "the capture holds no SASL log lines, so the password grep would be vacuous ({} bytes)",
        logs.len()
    );
    for secret in cluster
        .secrets
        .iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
    {
        assert!(
            !logs.contains(secret),
            "a password appears in the captured logs ({} bytes)",
            logs.len()
        );
    }
}

/// librdkafka's security and configuration debug output: the noisiest a
/// client gets about credentials.
fn verbose(config: &KafkaConfig) -> KafkaConfig {
    config.clone().set("debug", "security,conf,broker")
}

/// Admin creates a route's topics (the worker principal may not).
async fn create_route(admin: &KafkaConfig, topic: &str, tiers: &RetryPolicy) {
    let mut topics = vec![(topic.to_string(), 3), (dlq_topic(topic), 3)];
    topics.extend(tiers.tier_topics(topic).into_iter().map(|t| (t, 3)));
    create_topics(admin, &topics)
        .await
        .expect("creating the route as admin");
    create_topics_with(
        admin,
        &[(dlq_audit_topic(topic), 1)],
        &[("cleanup.policy", "compact")],
    )
    .await
    .expect("creating the audit topic as admin");
}

type Handled = Arc<Mutex<HashMap<i64, Vec<u32>>>>;

fn handler(
    handled: Handled,
) -> impl Fn(TestJob, JobContext) -> futures::future::BoxFuture<'static, Result<(), JobError>>
       + Send
       + Sync
       + 'static {
    move |job: TestJob, ctx: JobContext| {
        let handled = handled.clone();
        Box::pin(async move {
            handled
                .lock()
                .unwrap()
                .entry(job.seq)
                .or_default()
                .push(ctx.attempt);
            match job.behaviour.as_str() {
                "fail-first" if ctx.attempt == 1 => Err(JobError::server("test: 503 once")),
                "permanent" => Err(JobError::invalid_input("test: bad input")),
                _ => Ok(()),
            }
        })
    }
}

/// Runs a worker that is expected to be refused; fails the test if it is
/// still running after `within` (the "not a hang" half of the claim).
async fn refused(worker: Worker, within: Duration) -> (String, Duration) {
    let start = Instant::now();
    let outcome = tokio::time::timeout(within, worker.run_until(std::future::pending())).await;
    let took = start.elapsed();
    let err = match outcome {
        Err(_) => panic!("the worker neither failed nor processed anything for {within:?}: a hang"),
        Ok(Ok(())) => panic!("the worker stopped without an error"),
        Ok(Err(e)) => e.to_string(),
    };
    note(&err);
    eprintln!("refused after {took:.1?}: {err}");
    (err, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the three-broker SASL_SSL cluster: ./dev test --cluster"]
async fn worker_principal_processes_its_route_with_retries_and_dlq() {
    capture_logs();
    let cluster = cluster();
    let topic = unique("sec");
    let group = unique("sec-g");
    let policy = RetryPolicy::tiers([Duration::from_secs(1)]).max_attempts(3);
    create_route(&cluster.admin, &topic, &policy).await;
    cluster.grant_worker(&topic, &group);

    // The admin enqueues: the worker principal may not write its main topic.
    let producer = Producer::new(&cluster.admin).expect("admin producer");
    let mut jobs = Vec::new();
    for seq in 0..300_i64 {
        let behaviour = match seq % 10 {
            0 => "fail-first",
            1 if seq % 20 == 1 => "permanent",
            _ => "ok",
        };
        jobs.push(TestJob::with(format!("k{}", seq % 17), seq, behaviour));
    }
    let mut permanent: Vec<(i32, i64)> = Vec::new(); // where the permanent jobs landed
    for (r, job) in producer
        .enqueue_batch_to(&topic, &jobs)
        .await
        .into_iter()
        .zip(&jobs)
    {
        let at = r.expect("enqueue as admin");
        if job.behaviour == "permanent" {
            permanent.push((at.partition, at.offset));
        }
    }
    permanent.sort_unstable();
    let retried = jobs.iter().filter(|j| j.behaviour == "fail-first").count();

    let handled: Handled = Arc::default();
    let worker = Worker::builder(verbose(&cluster.worker), &group)
        .handle_on(&topic, handler(handled.clone()))
        .retry(policy.clone())
        .create_topics(false)
        .commit_interval(Duration::from_millis(200))
        .build()
        .expect("worker builds");
    let running = start(worker);
    let done = |h: &HashMap<i64, Vec<u32>>| {
        jobs.iter().all(|j| match j.behaviour.as_str() {
            "fail-first" => h.get(&j.seq).is_some_and(|a| a.contains(&2)),
            _ => h.contains_key(&j.seq),
        })
    };
    eventually(
        Duration::from_secs(90),
        "every job handled, retries included",
        || done(&handled.lock().unwrap()),
    )
    .await;
    let dlq = dlq_topic(&topic);
    eventually(
        Duration::from_secs(30),
        "permanent failures dead-lettered",
        || total(&cluster.admin, &dlq) >= permanent.len() as i64,
    )
    .await;
    let tier = policy.tier_topics(&topic)[0].clone();
    eventually(
        Duration::from_secs(30),
        "main topic and tier committed to their end",
        || {
            committed_offsets(&cluster.admin, &group, &topic, 3)
                == end_offsets(&cluster.admin, &topic, 3)
                    .into_iter()
                    .map(Some)
                    .collect::<Vec<_>>()
                && committed_offsets(&cluster.admin, &group, &tier, 3)
                    == end_offsets(&cluster.admin, &tier, 3)
                        .into_iter()
                        .map(Some)
                        .collect::<Vec<_>>()
        },
    )
    .await;
    running.stop().await;

    let h = handled.lock().unwrap().clone();
    assert_eq!(h.len(), jobs.len(), "every job handled");
    assert_eq!(
        total(&cluster.admin, &tier),
        retried as i64,
        "one retry per fail-first job"
    );
    let mut dead: Vec<(i32, i64)> = read_all(&cluster.admin, &dlq)
        .iter()
        .map(|m| {
            let h = kjob::headers::JobHeaders::parse(m.headers());
            assert_eq!(h.error_class.as_deref(), Some("permanent.invalid_input"));
            assert_eq!(h.group.as_deref(), Some(group.as_str()));
            (
                h.original_partition.expect("kjob-original-partition"),
                h.original_offset.expect("kjob-original-offset"),
            )
        })
        .collect();
    dead.sort_unstable();
    assert_eq!(dead, permanent, "exactly the permanent jobs are in the DLQ");
    assert_no_secret_logged(&cluster, &[], true);
}

/// Records in all partitions of a topic (0 while it does not exist).
fn total(config: &KafkaConfig, topic: &str) -> i64 {
    try_end_offsets(config, topic, 3).map_or(0, |e| e.iter().sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the three-broker SASL_SSL cluster: ./dev test --cluster"]
async fn a_topic_without_acls_fails_at_start_naming_the_acl() {
    capture_logs();
    let cluster = cluster();
    let topic = unique("sec-denied");
    let group = unique("sec-denied-g");
    let policy = RetryPolicy::tiers([Duration::from_secs(1)]);
    create_route(&cluster.admin, &topic, &policy).await;
    // No grant: the topic exists, but the worker principal may not see it.
    let worker = Worker::builder(verbose(&cluster.worker), &group)
        .handle_on(&topic, handler(Arc::default()))
        .retry(policy)
        .create_topics(false)
        .build()
        .expect("worker builds");
    let (err, took) = refused(worker, Duration::from_secs(60)).await;
    assert!(err.contains("not authorized by Kafka ACLs"), "{err}");
    assert!(
        err.contains(&format!("User:{}", cluster.worker_user)),
        "{err}"
    );
    assert!(err.contains(&format!("topic `{topic}`")), "{err}");
    assert!(err.contains("kafka-acls"), "{err}");
    assert!(
        !err.contains("does not exist"),
        "must not claim the topic is missing: {err}"
    );
    assert!(took < Duration::from_secs(20), "refused after {took:?}");
    // Refused in preflight: no client of this test polled its log queue.
    assert_no_secret_logged(&cluster, &[], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the three-broker SASL_SSL cluster: ./dev test --cluster"]
async fn a_group_without_acls_fails_naming_the_acl_not_a_hang() {
    capture_logs();
    let cluster = cluster();
    let topic = unique("sec-group");
    let granted = unique("sec-group-g");
    let other = unique("sec-group-other");
    let policy = RetryPolicy::tiers([Duration::from_secs(1)]);
    create_route(&cluster.admin, &topic, &policy).await;
    cluster.grant_worker(&topic, &granted);
    // Every topic is readable, but the worker runs in a group it was not granted.
    let worker = Worker::builder(verbose(&cluster.worker), &other)
        .handle_on(&topic, handler(Arc::default()))
        .retry(policy)
        .create_topics(false)
        .build()
        .expect("worker builds");
    let (err, took) = refused(worker, Duration::from_secs(60)).await;
    assert!(err.contains("not authorized by Kafka ACLs"), "{err}");
    assert!(err.contains(&format!("group `{other}`")), "{err}");
    assert!(err.contains(&format!("--group {other}")), "{err}");
    assert!(took < Duration::from_secs(30), "refused after {took:?}");
    assert_no_secret_logged(&cluster, &[], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the three-broker SASL_SSL cluster: ./dev test --cluster"]
async fn a_wrong_password_fails_clearly_at_start() {
    capture_logs();
    let cluster = cluster();
    let topic = unique("sec-pw");
    let group = unique("sec-pw-g");
    let policy = RetryPolicy::tiers([Duration::from_secs(1)]);
    create_route(&cluster.admin, &topic, &policy).await;
    cluster.grant_worker(&topic, &group);
    let wrong = format!("wrong-{}", unique("pw"));
    let mut config = cluster.worker.clone();
    config.sasl_password = Some(Secret::new(wrong.clone()));
    let worker = Worker::builder(verbose(&config), &group)
        .handle_on(&topic, handler(Arc::default()))
        .retry(policy)
        .create_topics(false)
        .build()
        .expect("worker builds");
    let (err, took) = refused(worker, Duration::from_secs(60)).await;
    assert!(err.contains("authentication with Kafka"), "{err}");
    assert!(
        err.contains("KJOB_SASL_PASSWORD"),
        "names the setting to fix: {err}"
    );
    assert!(
        err.contains("invalid credentials") || err.contains("Authentication failed"),
        "carries the broker's reason: {err}"
    );
    assert!(took < Duration::from_secs(10), "refused after {took:?}");
    assert_no_secret_logged(&cluster, &[&wrong], true);
}

/// Grants `acls` as the admin (`kafka-acls`, through Kafka's own
/// AclCommand on the cluster), exactly as `kjob acls` prints them.
fn grant(cluster: &Cluster, acls: &[kjob::deployment::Acl]) {
    let props = cluster.dir.join("admin.properties");
    for acl in acls {
        let printed = acl.command(&cluster.admin.bootstrap_servers);
        let args: Vec<&str> = printed
            .split_whitespace()
            .skip(1) // `kafka-acls`
            .collect();
        let out = std::process::Command::new(repo_root().join("dev"))
            .args(["kafka-class", "org.apache.kafka.tools.AclCommand"])
            .args(&args)
            .arg("--command-config")
            .arg(&props)
            .output()
            .expect("running AclCommand");
        assert!(
            out.status.success(),
            "{printed}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every row of the security chapter's ACL table, run under ACLs: two
/// workers with every feature that adds a topic or a group (per-route and
/// shared tiers and delay buckets, strict order, cron, batches with their
/// coordinator group, the control topic and its heartbeat), each under a
/// principal granted exactly what `kjob acls` derives from its model, plus
/// Write on the batch callback's topic (the one grant the book says a
/// model cannot know). The workers create their own topics (the model's
/// Create grants) and handle retries, dead letters, delayed jobs, a cron
/// tick and a batch with its callback.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the three-broker SASL_SSL cluster: ./dev test --cluster"]
async fn workers_with_every_feature_run_under_exactly_their_model_s_acls() {
    capture_logs();
    let cluster = cluster();
    let principal = format!("User:{}", cluster.worker_user);
    let (a, callbacks, batches, group) = (
        unique("model.a"),
        unique("model.cb"),
        unique("model.batches"),
        unique("model-g"),
    );
    let (b, c, shared) = (unique("model.b"), unique("model.c"), unique("model-sh"));
    create_topics(
        &cluster.admin,
        &[
            (a.clone(), 3),
            (callbacks.clone(), 1),
            (b.clone(), 3),
            (c.clone(), 3),
        ],
    )
    .await
    .expect("the main topics, as admin");
    let handled: Handled = Arc::default();
    let reports: Arc<Mutex<Vec<kjob::batch::BatchReport>>> = Arc::default();
    let policy = RetryPolicy::tiers([Duration::from_secs(1)]).max_attempts(3);
    let got = reports.clone();
    let first = Worker::builder(verbose(&cluster.worker), &group)
        .handle_on(&a, handler(handled.clone()))
        .handle_on(&callbacks, move |_: TestJob, ctx: JobContext| {
            let got = got.clone();
            async move {
                if let Some(r) = ctx.batch_report {
                    got.lock().unwrap().push(r);
                }
                Ok::<(), JobError>(())
            }
        })
        .retry(policy.clone())
        .strict_order(&a)
        .delayed_jobs_on(&a)
        .schedule_with(
            kjob::schedule::Schedule::new("tick", "* * * * * *", || TestJob::ok("tick", -1))
                .on(&a, || TestJob::ok("tick", -1)),
        )
        .batches_on(&batches)
        .commit_interval(Duration::from_millis(200))
        .build()
        .expect("the first worker builds");
    let second = Worker::builder(verbose(&cluster.worker), &shared)
        .handle_on(&b, handler(handled.clone()))
        .handle_on(&c, handler(handled.clone()))
        .retry(policy.clone())
        .fair_by_tenant(&b)
        .delayed_jobs_on(&c)
        .shared_retry_tiers_with(kjob::SharedTiers::new().delay_buckets())
        .commit_interval(Duration::from_millis(200))
        .build()
        .expect("the second worker builds");
    let (m1, m2) = (first.deployment(), second.deployment());
    let mut acls = m1.acls(&principal);
    acls.extend(m2.acls(&principal));
    acls.push(kjob::deployment::Acl {
        principal: principal.clone(),
        resource: kjob::deployment::AclResource::Topic,
        name: callbacks.clone(),
        operations: vec![kjob::deployment::AclOperation::Write],
        why: "the batch callback's topic".into(),
    });
    let roles: std::collections::BTreeSet<&str> = m1
        .topics
        .iter()
        .chain(&m2.topics)
        .map(|t| t.role.label())
        .collect();
    for row in kjob::deployment::acls::rows() {
        if row.role.is_some() {
            assert!(
                roles.contains(row.label()),
                "no topic of role {}",
                row.label()
            );
        }
    }
    grant(&cluster, &acls);
    let (stop1, stopped1) = tokio::sync::oneshot::channel::<()>();
    let (stop2, stopped2) = tokio::sync::oneshot::channel::<()>();
    let first = tokio::spawn(first.run_until(async move {
        let _ = stopped1.await;
    }));
    let second = tokio::spawn(second.run_until(async move {
        let _ = stopped2.await;
    }));

    // The admin enqueues (the worker principal may not write main topics).
    let producer = Producer::new(&cluster.admin).expect("admin producer");
    let jobs: Vec<(String, TestJob)> = vec![
        (a.clone(), TestJob::with("a1", 1, "ok")),
        (a.clone(), TestJob::with("a2", 2, "fail-first")),
        (a.clone(), TestJob::with("a3", 3, "permanent")),
        (b.clone(), TestJob::with("b4", 4, "fail-first")),
        (c.clone(), TestJob::with("c5", 5, "ok")),
    ];
    for (topic, job) in &jobs {
        producer
            .enqueue_to(topic, job)
            .await
            .expect("enqueue as admin");
    }
    for (m, what) in [
        (&m1, "the first worker's topics"),
        (&m2, "the second worker's topics"),
    ] {
        let names = m.topic_names();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let have = kjob::topics::partition_counts(&cluster.admin, &names).unwrap_or_default();
            let missing: Vec<&String> = names
                .iter()
                .zip(have.iter().chain(std::iter::repeat(&None)))
                .filter(|(_, c)| c.is_none())
                .map(|(n, _)| n)
                .collect();
            if missing.is_empty() {
                break;
            }
            if first.is_finished() {
                panic!("the first worker stopped: {:?}", first.await);
            }
            if second.is_finished() {
                panic!("the second worker stopped: {:?}", second.await);
            }
            if Instant::now() > deadline {
                let logs = captured();
                let bad: Vec<&str> = logs
                    .lines()
                    .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("test saw"))
                    .take(40)
                    .collect();
                panic!(
                    "{what}: {missing:?} missing after 60 s; warnings:\n{}",
                    bad.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    producer
        .enqueue_in_to(&a, &TestJob::with("a6", 6, "ok"), Duration::from_secs(2))
        .await
        .expect("a delayed job as admin");
    let sharing = Producer::new(&cluster.admin)
        .expect("admin producer")
        .shared_delay_buckets(&shared);
    sharing
        .enqueue_in_to(&c, &TestJob::with("c7", 7, "ok"), Duration::from_secs(2))
        .await
        .expect("a delayed job into the shared buckets as admin");
    let batch = producer
        .batch(&unique("model-batch"))
        .expect("a batch")
        .topic(&batches)
        .callback_to(When::Complete, &callbacks, TestJob::ok("report", 0));
    for seq in 10..13 {
        batch
            .enqueue_to(&a, &TestJob::with(format!("k{seq}"), seq, "ok"))
            .await
            .expect("a batch job as admin");
    }
    batch.seal().await.expect("sealing the batch");
    eventually(
        Duration::from_secs(120),
        "every job handled, the retries, the delayed jobs, a cron tick and the callback",
        || {
            let h = handled.lock().unwrap();
            let retried = |seq: i64| h.get(&seq).is_some_and(|a| a.contains(&2));
            [1, 3, 5, 6, 7, 10, 11, 12]
                .iter()
                .all(|s| h.contains_key(s))
                && retried(2)
                && retried(4)
                && h.contains_key(&-1)
                && !reports.lock().unwrap().is_empty()
        },
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "the permanent job dead-lettered",
        || total(&cluster.admin, &dlq_topic(&a)) >= 1,
    )
    .await;
    let report = reports.lock().unwrap()[0].clone();
    assert_eq!((report.total, report.succeeded), (3, 3), "{report:?}");
    // Both workers publish their heartbeat on their control topics.
    for g in [&group, &shared] {
        eventually(Duration::from_secs(30), "a heartbeat", || {
            read_all(&cluster.admin, &kjob::control::control_topic(g))
                .iter()
                .any(|m| m.key().is_some_and(|k| k.starts_with(b"worker:")))
        })
        .await;
    }
    let _ = (stop1.send(()), stop2.send(()));
    for w in [first, second] {
        w.await
            .expect("the worker task")
            .expect("the worker stopped cleanly");
    }
    let logs = captured();
    let refused: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("AuthorizationFailed") || l.contains("not authorized"))
        // The other tests of this binary are refused on purpose; a refusal
        // of these workers names one of their topics or groups (librdkafka's
        // own global errors name none, but kjob logs each with the group).
        .filter(|l| {
            [&a, &callbacks, &batches, &group, &b, &c, &shared]
                .iter()
                .any(|n| l.contains(n.as_str()))
        })
        .collect();
    assert!(refused.is_empty(), "refused by an ACL: {refused:#?}");
    assert_no_secret_logged(&cluster, &[], true);
}
