//! Unit tests of `testing`.

use super::*;
use crate::{JobContext, JobError, KafkaConfig, Worker};

#[derive(serde::Serialize, serde::Deserialize)]
struct Step {
    key: String,
    seq: i64,
}
impl Job for Step {
    const NAME: &'static str = "steps";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = r#"{"type":"record","name":"Step","fields":[{"name":"key","type":"string"},{"name":"seq","type":"long"}]}"#;
    fn key(&self) -> String {
        self.key.clone()
    }
}

type Log = Arc<Mutex<Vec<(String, i64)>>>;

fn recording(log: Log) -> impl crate::worker::Handler<Step, (JobContext,)> {
    move |job: Step, _ctx: JobContext| {
        let log = log.clone();
        async move {
            // Yield so jobs released together really interleave.
            tokio::task::yield_now().await;
            log.lock().unwrap().push((job.key, job.seq));
            Ok::<(), JobError>(())
        }
    }
}

#[tokio::test]
async fn the_harness_keeps_per_key_order_while_running_keys_in_parallel() {
    let log: Log = Default::default();
    let builder = Worker::builder(KafkaConfig::from_env(), "g")
        .handle(recording(log.clone()))
        .concurrency(8);
    let mut h = Harness::new(builder).unwrap();
    for seq in 0..5 {
        for key in ["a", "b", "c"] {
            h.enqueue(&Step {
                key: key.into(),
                seq,
            })
            .unwrap();
        }
    }
    assert_eq!(h.run().await, 15);
    let log = log.lock().unwrap().clone();
    for key in ["a", "b", "c"] {
        let seqs: Vec<i64> = log
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(seqs, vec![0, 1, 2, 3, 4], "key {key} in order");
    }
    assert_eq!(
        h.flow().max_running,
        3,
        "one job per key at a time, keys in parallel"
    );
    assert_eq!(h.committed("steps"), Some(15));
}

#[tokio::test]
async fn the_harness_pauses_a_partition_at_the_in_flight_bound_and_resumes_it() {
    let log: Log = Default::default();
    let builder = Worker::builder(KafkaConfig::from_env(), "g")
        .handle(recording(log.clone()))
        .concurrency(1)
        .max_in_flight_per_partition(4);
    let mut h = Harness::new(builder).unwrap();
    for seq in 0..20 {
        h.enqueue(&Step {
            key: format!("k{seq}"),
            seq,
        })
        .unwrap();
    }
    assert_eq!(h.run().await, 20);
    let flow = h.flow();
    assert!(flow.pauses >= 4, "paused at the bound: {flow:?}");
    assert_eq!(flow.pauses, flow.resumes, "and always resumed: {flow:?}");
    assert_eq!(flow.max_running, 1);
    assert_eq!(h.committed("steps"), Some(20));
}

#[tokio::test]
async fn a_retry_is_held_until_due_on_the_virtual_clock_and_the_watermark_waits() {
    let builder = Worker::builder(KafkaConfig::from_env(), "g")
        .handle(|job: Step, ctx: JobContext| async move {
            if job.seq == 0 && ctx.attempt == 1 {
                return Err(JobError::server("503"));
            }
            Ok(())
        })
        .retry(crate::retry::RetryPolicy::tiers([Duration::from_secs(5)]));
    let mut h = Harness::new(builder).unwrap();
    for seq in 0..3 {
        h.enqueue(&Step {
            key: "k".into(),
            seq,
        })
        .unwrap();
    }
    h.run().await;
    assert_eq!(h.handled().len(), 2, "the others do not wait for the retry");
    assert_eq!(h.committed("steps"), Some(3));
    assert_eq!(
        h.committed("steps.retry.5s"),
        Some(0),
        "the commit stays below the held record"
    );
    h.advance(Duration::from_millis(4_999)).await;
    assert_eq!(h.handled().len(), 2, "never early");
    h.advance(Duration::from_millis(1)).await;
    assert_eq!(h.handled().len(), 3);
    assert_eq!(h.handled()[2].attempt, 2);
    assert_eq!(h.committed("steps.retry.5s"), Some(1));
}

/// Fails the first `fails` attempts of every job with a retryable error.
fn failing(fails: u32) -> impl crate::worker::Handler<Step, (JobContext,)> {
    move |_job: Step, ctx: JobContext| async move {
        if ctx.attempt <= fails {
            Err(JobError::server("503 from the downstream"))
        } else {
            Ok(())
        }
    }
}

#[tokio::test]
async fn shared_retry_tiers_carry_two_routes_with_their_own_policies() {
    use crate::retry::RetryPolicy;
    let secs = Duration::from_secs;
    let builder = Worker::builder(KafkaConfig::from_env(), "g")
        .handle_on("mail", failing(1))
        .handle_on("crm", failing(2))
        .retry_for("mail", RetryPolicy::tiers([secs(1)]).jitter(0.0))
        .retry_for("crm", RetryPolicy::tiers([secs(1), secs(5)]).jitter(0.0))
        .shared_retry_tiers();
    let mut h = Harness::new(builder).unwrap();
    for seq in 0..3 {
        for topic in ["mail", "crm"] {
            h.enqueue_to(
                topic,
                &Step {
                    key: format!("k{seq}"),
                    seq,
                },
            )
            .unwrap();
        }
    }
    h.run_until_idle().await;
    let handled = h.handled();
    let on = |job_topic: &str, tier: &str| {
        handled
            .iter()
            .filter(|d| {
                d.topic == tier
                    && h.records(tier).iter().any(|r| {
                        crate::headers::find(r.headers(), crate::headers::ROUTE) == Some(job_topic)
                    })
            })
            .count()
    };
    assert_eq!(handled.len(), 6, "{handled:?}");
    assert!(
        handled.iter().all(|d| d.topic.starts_with("g.retry.")),
        "{handled:?}"
    );
    // mail succeeds on attempt 2 from the shared 1 s tier; crm on attempt 3
    // from the 5 s tier, the one both routes' 1 s tiers share before it.
    let attempts = |tier: &str| -> Vec<u32> {
        let mut a: Vec<u32> = handled
            .iter()
            .filter(|d| d.topic == tier)
            .map(|d| d.attempt)
            .collect();
        a.sort_unstable();
        a
    };
    assert_eq!(attempts("g.retry.1s"), vec![2, 2, 2]);
    assert_eq!(attempts("g.retry.5s"), vec![3, 3, 3]);
    assert!(on("mail", "g.retry.1s") > 0 && on("crm", "g.retry.5s") > 0);
    assert_eq!(
        h.records("g.retry.1s").len(),
        6,
        "both routes' first retries"
    );
    for r in h.records("g.retry.1s") {
        let route = crate::headers::find(r.headers(), crate::headers::ROUTE);
        assert!(matches!(route, Some("mail" | "crm")), "{route:?}");
    }
    assert!(h.records("mail.retry.1s").is_empty() && h.records("crm.retry.1s").is_empty());
    assert!(h.dead_letters().is_empty());
}

#[tokio::test]
async fn a_shared_tier_record_of_an_unknown_route_is_dead_lettered_naming_it() {
    let builder = Worker::builder(KafkaConfig::from_env(), "g")
        .handle_on("mail", failing(1))
        .retry_for(
            "mail",
            crate::retry::RetryPolicy::tiers([Duration::from_secs(1)]),
        )
        .shared_retry_tiers();
    let mut h = Harness::new(builder).unwrap();
    h.enqueue_to(
        "mail",
        &Step {
            key: "k".into(),
            seq: 1,
        },
    )
    .unwrap();
    h.run().await;
    let parked = h.records("g.retry.1s");
    assert_eq!(parked.len(), 1);
    // The same record, naming a route this worker does not serve.
    let mut hostile = JobHeaders::parse(parked[0].headers());
    hostile.extra.retain(|(k, _)| k != crate::headers::ROUTE);
    hostile.extra.push((
        crate::headers::ROUTE.into(),
        "invoices\u{202e}".as_bytes().to_vec(),
    ));
    hostile.id = Some("hostile".into());
    let copy = OwnedMessage::new(
        parked[0].payload().map(<[u8]>::to_vec),
        parked[0].key().map(<[u8]>::to_vec),
        parked[0].topic().to_string(),
        parked[0].timestamp(),
        parked[0].partition(),
        parked[0].offset(),
        Some(hostile.to_owned_headers()),
    );
    h.redeliver(&copy).unwrap();
    h.run_until_idle().await;
    let dead = h.dead_letters();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].topic, "mail.dlq");
    assert_eq!(dead[0].id, "hostile");
    assert_eq!(dead[0].class, "permanent.invalid_input");
    assert!(
        dead[0].error.contains("invoices") && dead[0].error.contains("does not serve"),
        "{}",
        dead[0].error
    );
    assert_eq!(
        h.handled().len(),
        1,
        "the real one still ran: {:?}",
        h.handled()
    );
}

#[tokio::test]
async fn shared_delay_buckets_carry_each_routes_delayed_jobs_back_to_its_handler() {
    let builder = Worker::builder(KafkaConfig::from_env(), "g")
        .handle_on("mail", failing(0))
        .handle_on("crm", failing(0))
        .handle_on("plain", failing(0))
        .delayed_jobs_on("mail")
        .delayed_jobs_on("crm")
        .priority("mail", crate::Priority::High)
        .shared_retry_tiers_with(crate::SharedTiers::new().delay_buckets());
    let mut h = Harness::new(builder).unwrap();
    // Jobs written to the main topics with a run time 75 s ahead (as a
    // producer that does not hop writes them): the worker hops them into
    // the group's buckets.
    let run_at = h.now_ms() + 75_000;
    for topic in ["mail", "crm"] {
        h.enqueue_to(
            topic,
            &Step {
                key: "k".into(),
                seq: 1,
            },
        )
        .unwrap();
        let first = h.records(topic).remove(0);
        let mut delayed = JobHeaders::parse(first.headers());
        delayed.id = Some(format!("{topic}-later"));
        delayed.run_at_ms = Some(run_at);
        h.append(
            topic,
            first.key().map(<[u8]>::to_vec),
            first.payload().map(<[u8]>::to_vec),
            delayed.to_owned_headers(),
        )
        .unwrap();
    }
    h.run().await;
    assert_eq!(h.handled().len(), 2, "the undelayed ones ran at once");
    let parked = h.records("g.delay.1m");
    assert_eq!(parked.len(), 2, "both routes hop into the one 1 m bucket");
    let mut routes: Vec<&str> = parked
        .iter()
        .filter_map(|r| crate::headers::find(r.headers(), crate::headers::ROUTE))
        .collect();
    routes.sort_unstable();
    assert_eq!(routes, vec!["crm", "mail"]);
    assert!(h.records("mail.delay.1m").is_empty() && h.records("crm.delay.1m").is_empty());
    h.run_until_idle().await;
    let later: Vec<(&str, &str, i64)> = h
        .handled()
        .iter()
        .filter(|d| d.id.ends_with("-later"))
        .map(|d| (d.id.as_str(), d.topic.as_str(), d.at_ms))
        .collect();
    assert_eq!(later.len(), 2, "{:?}", h.handled());
    // The last hop ends within LEAD plus the shortest bucket of the run
    // time; the worker waits the rest out on the real clock, which the
    // harness's virtual clock does not move.
    let remainder = (crate::delay::LEAD + crate::delay::BUCKETS[0]).as_millis() as i64;
    for (id, topic, at) in later {
        assert!(topic.starts_with("g.delay."), "{id} ran from {topic}");
        assert!(
            at < run_at && at >= run_at - remainder,
            "{id} released at {at}, run time {run_at}"
        );
    }
    assert!(h.dead_letters().is_empty());
}

#[test]
fn a_shared_bucket_of_mixed_priorities_is_read_at_normal_and_names_no_undelayed_route() {
    let builder = Worker::builder(KafkaConfig::from_env(), "g")
        .handle_on("mail", failing(0))
        .handle_on("crm", failing(0))
        .handle_on("plain", failing(0))
        .delayed_jobs_on("mail")
        .delayed_jobs_on("crm")
        .priority("mail", crate::Priority::High)
        .priority("crm", crate::Priority::Low)
        .shared_retry_tiers_with(crate::SharedTiers::new().delay_buckets());
    let routes = builder
        .build_routes(Arc::new(crate::testing::MemorySchemas::default()))
        .unwrap();
    let bucket = &routes.entries["g.delay.10s"];
    assert_eq!(
        bucket.priority,
        crate::Priority::Normal,
        "a Low route's hops must not compete at High"
    );
    let tier = &routes.entries["g.retry.5s"];
    assert_eq!(tier.priority, crate::Priority::Normal);
    let mut sharers: Vec<&String> = bucket.sharers.as_ref().unwrap().keys().collect();
    sharers.sort();
    assert_eq!(sharers, vec!["crm", "mail"], "plain takes no delays");
    assert!(!routes.entries.keys().any(|t| t.starts_with("mail.delay.")));
    assert!(!routes.entries.keys().any(|t| t.starts_with("plain.delay.")));
}

#[test]
fn a_shared_tier_of_routes_of_one_priority_is_read_at_it() {
    let builder = Worker::builder(KafkaConfig::from_env(), "g")
        .handle_on("mail", failing(0))
        .handle_on("sms", failing(0))
        .priority("mail", crate::Priority::High)
        .priority("sms", crate::Priority::High)
        .shared_retry_tiers();
    let routes = builder
        .build_routes(Arc::new(crate::testing::MemorySchemas::default()))
        .unwrap();
    assert_eq!(routes.entries["g.retry.5s"].priority, crate::Priority::High);
}

#[tokio::test]
async fn poison_bytes_enqueued_raw_are_dead_lettered_as_not_framed_and_committed() {
    let log: Log = Default::default();
    let builder = Worker::builder(KafkaConfig::from_env(), "g").handle(recording(log.clone()));
    let mut h = Harness::new(builder).unwrap();
    h.enqueue_raw("steps", "k", b"not avro at all").unwrap();
    h.enqueue(&Step {
        key: "k".into(),
        seq: 1,
    })
    .unwrap();
    h.run().await;
    let dead = h.dead_letters();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].class, "decode.not_framed");
    assert_eq!(dead[0].topic, "steps.dlq");
    assert_eq!(
        log.lock().unwrap().clone(),
        vec![("k".to_string(), 1)],
        "the key's next job still ran"
    );
    assert_eq!(h.committed("steps"), Some(2));
}

#[tokio::test]
async fn random_jitter_spreads_retry_due_times_that_are_exact_by_default() {
    async fn due_times(jitter: bool) -> Vec<i64> {
        let builder = Worker::builder(KafkaConfig::from_env(), "g")
            .handle(|_: Step, _: JobContext| async move { Err(JobError::server("503")) })
            .retry(crate::retry::RetryPolicy::tiers([Duration::from_secs(60)]));
        let mut h = Harness::new(builder).unwrap();
        if jitter {
            h = h.with_random_jitter();
        }
        for seq in 0..20 {
            h.enqueue(&Step {
                key: format!("k{seq}"),
                seq,
            })
            .unwrap();
        }
        h.run().await;
        let mut due: Vec<i64> = h.waiting().iter().map(|w| w.due_at_ms).collect();
        assert_eq!(due.len(), 20, "every job waits in the tier");
        due.sort_unstable();
        due.dedup();
        due
    }
    assert_eq!(due_times(false).await.len(), 1, "exact: one due time");
    assert!(
        due_times(true).await.len() > 1,
        "random jitter gives the jobs different due times"
    );
}
