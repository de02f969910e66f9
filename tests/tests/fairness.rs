//! Fair share among a route's tenants on the real stack: one tenant's flood
//! does not starve the others (and does without fairness, in the same
//! test), weights divide the slots, a cap bounds a tenant alone, and a
//! SIGKILL in the middle of a flood loses nothing, keeps per-key order and,
//! with `PgMarkers`, leaves no effect twice.

use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kjob::codec::Codec;
use kjob::{Fairness, JobContext, Producer, Worker};
use kjob_integration_tests::*;

/// Enqueues `job` as tenant `tenant` (`kjob-tenant`): `TestJob` has no
/// tenant field, so the record is written as `enqueue` would, plus it.
async fn enqueue_as(producer: &Producer, topic: &str, job: &TestJob, tenant: &str) {
    let contract = producer
        .codec()
        .register::<TestJob>(topic)
        .await
        .expect("contract");
    let bytes = Codec::encode(&contract, job).expect("encode");
    let mut h = kjob::producer::enqueue_headers(job, &kjob::producer::new_job_id());
    h.tenant = Some(tenant.to_string());
    producer
        .send_raw(
            topic,
            Some(job.key.as_bytes()),
            Some(&bytes),
            h.to_owned_headers(),
        )
        .await
        .expect("enqueue");
}

async fn enqueue_many(producer: &Producer, topic: &str, jobs: &[(TestJob, &str)]) {
    for chunk in jobs.chunks(500) {
        futures::future::join_all(chunk.iter().map(|(j, t)| enqueue_as(producer, topic, j, t)))
            .await;
    }
}

/// When each job (by seq) started, and how many of each tenant ran at once
/// at each start.
#[derive(Default)]
struct Seen {
    started: Mutex<HashMap<i64, Instant>>,
    running: Mutex<HashMap<String, usize>>,
    samples: Mutex<Vec<HashMap<String, usize>>>,
}

fn worker(
    config: &kjob::KafkaConfig,
    topic: &str,
    fairness: Option<Fairness>,
    seen: Arc<Seen>,
    handler_ms: u64,
    bound: Option<usize>,
) -> Worker {
    let mut b = Worker::builder(config.clone(), unique("g"))
        .handle_on(topic, move |_job: TestJob, ctx: JobContext| {
            let seen = seen.clone();
            async move {
                let tenant = ctx.tenant.clone().unwrap_or_default();
                seen.started
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(_job.seq, Instant::now());
                {
                    let mut r = seen.running.lock().unwrap_or_else(|e| e.into_inner());
                    *r.entry(tenant.clone()).or_default() += 1;
                    let snapshot = r.clone();
                    seen.samples
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(snapshot);
                }
                tokio::time::sleep(Duration::from_millis(handler_ms)).await;
                let mut r = seen.running.lock().unwrap_or_else(|e| e.into_inner());
                *r.entry(tenant).or_default() -= 1;
                Ok::<(), kjob::JobError>(())
            }
        })
        .concurrency(8);
    if let Some(f) = fairness {
        b = b.fair(topic, f);
    }
    if let Some(n) = bound {
        b = b.max_in_flight_per_partition(n);
    }
    b.build().expect("worker builds")
}

/// The longest wait (enqueue → start) of tenant B's 20 jobs behind a flood
/// of 3 000 of tenant A's, with or without fairness, and with a partition
/// buffer of `bound` records; and how many records were read past then.
async fn b_wait_behind_a_flood(fair: bool, bound: Option<usize>) -> (Duration, u64) {
    let config = ensure_stack();
    let topic = unique("fair.flood");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).expect("producer");
    let flood: Vec<(TestJob, &str)> = (0..3_000)
        // A product import: every job its own key, so all are ready at once.
        .map(|i| (TestJob::ok(format!("a-{i}"), i), "a"))
        .collect();
    enqueue_many(&producer, &topic, &flood).await;
    let seen = Arc::new(Seen::default());
    let fairness = fair.then(Fairness::by_tenant);
    let running = start(worker(&config, &topic, fairness, seen.clone(), 10, bound));
    // The flood is being worked through when B's jobs come.
    eventually(Duration::from_secs(60), "the flood runs", || {
        seen.started.lock().unwrap_or_else(|e| e.into_inner()).len() >= 200
    })
    .await;
    let mut enqueued = HashMap::new();
    for i in 0..20 {
        let seq = 10_000 + i;
        enqueued.insert(seq, Instant::now());
        enqueue_as(&producer, &topic, &TestJob::ok(format!("b-{i}"), seq), "b").await;
    }
    eventually(Duration::from_secs(90), "B's jobs ran", || {
        let s = seen.started.lock().unwrap_or_else(|e| e.into_inner());
        enqueued.keys().all(|k| s.contains_key(k))
    })
    .await;
    // The gauge behind `kjob_read_past`, refreshed about once a second.
    let mut read_past = 0;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until && read_past == 0 {
        read_past = running.stats.read_past.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.stop().await;
    let s = seen.started.lock().unwrap_or_else(|e| e.into_inner());
    let wait = enqueued
        .iter()
        .map(|(seq, at)| s[seq].saturating_duration_since(*at))
        .max()
        .unwrap_or_default();
    (wait, read_past)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_flood_does_not_starve_the_others() {
    init_logging();
    let (fair, _) = b_wait_behind_a_flood(true, None).await;
    let (unfair, _) = b_wait_behind_a_flood(false, None).await;
    println!("tenant B's longest wait behind a 3 000-job flood: {fair:?} fair, {unfair:?} without");
    // The flood alone takes about 3 000 × 10 ms / 8 slots ≈ 3.75 s.
    assert!(
        fair < Duration::from_millis(1_500),
        "with fairness B runs beside the flood: {fair:?}"
    );
    assert!(
        unfair > fair * 2,
        "without fairness B waits behind it: {unfair:?} against {fair:?}"
    );
}

/// A flood far larger than the partitions' buffers (200 records each, so
/// 2 800 of A's records are still unread when B's come): fairness reads
/// past A's excess (`scheduler/passing.rs`) to reach B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_larger_than_the_buffer_is_read_past() {
    init_logging();
    let (fair, passed) = b_wait_behind_a_flood(true, Some(200)).await;
    let (unfair, none) = b_wait_behind_a_flood(false, Some(200)).await;
    println!("tenant B's longest wait behind a 3 000-job flood, 200-record buffers: {fair:?} fair ({passed} of A's records read past), {unfair:?} without");
    assert!(passed > 0, "A's excess was read past");
    assert_eq!(none, 0, "only a fair route reads past");
    assert!(
        fair < Duration::from_millis(1_500),
        "with fairness B's records are read past the flood: {fair:?}"
    );
    assert!(
        unfair > fair * 2,
        "without fairness B waits behind it: {unfair:?} against {fair:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_divide_the_slots_and_a_cap_bounds_a_tenant() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("fair.weights");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).expect("producer");
    let mut jobs: Vec<(TestJob, &str)> = Vec::new();
    for i in 0..400 {
        jobs.push((TestJob::ok(format!("a-{i}"), i), "a"));
        jobs.push((TestJob::ok(format!("b-{i}"), 1_000 + i), "b"));
    }
    enqueue_many(&producer, &topic, &jobs).await;
    let seen = Arc::new(Seen::default());
    let running = start(worker(
        &config,
        &topic,
        Some(Fairness::by_tenant().weight("a", 3)),
        seen.clone(),
        20,
        None,
    ));
    // Every 2 ms, how many of each tenant run. Not the samples taken at
    // each start: 8 jobs of 20 ms started together end together, and of
    // the 8 starts that refill their slots only the last sees all 8 taken.
    let sampler = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut samples = Vec::new();
            loop {
                let snapshot = seen
                    .running
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                samples.push(snapshot);
                if seen.started.lock().unwrap_or_else(|e| e.into_inner()).len() >= 400 {
                    return samples;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    eventually(Duration::from_secs(60), "half of the jobs ran", || {
        seen.started.lock().unwrap_or_else(|e| e.into_inner()).len() >= 400
    })
    .await;
    let samples = sampler.await.expect("the sampler ends");
    running.stop().await;
    // Samples while both had work and every slot was taken: 6 and 2.
    let full: Vec<(usize, usize)> = samples
        .iter()
        .map(|m| {
            (
                m.get("a").copied().unwrap_or(0),
                m.get("b").copied().unwrap_or(0),
            )
        })
        .filter(|(a, b)| a + b == 8)
        .collect();
    assert!(
        full.len() > 50,
        "the slots were full most of the time: {}",
        full.len()
    );
    let share_a = full.iter().map(|(a, _)| *a).sum::<usize>() as f64 / full.len() as f64;
    println!(
        "{} of {} samples with every slot taken; tenant a held {share_a:.2} of 8",
        full.len(),
        samples.len()
    );
    assert!(
        (5.0..=7.0).contains(&share_a),
        "weight 3 against 1 of 8 slots: about 6 for a, not {share_a:.2}"
    );

    // A cap of 2: a tenant alone on the route runs at most 2 at once.
    let topic = unique("fair.cap");
    create_topic(&config, &topic, 2).await;
    let jobs: Vec<(TestJob, &str)> = (0..100)
        .map(|i| (TestJob::ok(format!("a-{i}"), i), "a"))
        .collect();
    enqueue_many(&producer, &topic, &jobs).await;
    let seen = Arc::new(Seen::default());
    let max_a = Arc::new(AtomicUsize::new(0));
    let running = start(worker(
        &config,
        &topic,
        Some(Fairness::by_tenant().cap(2)),
        seen.clone(),
        20,
        None,
    ));
    eventually(Duration::from_secs(60), "the capped jobs ran", || {
        seen.started.lock().unwrap_or_else(|e| e.into_inner()).len() >= 100
    })
    .await;
    running.stop().await;
    for m in seen
        .samples
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        max_a.fetch_max(m.get("a").copied().unwrap_or(0), Ordering::Relaxed);
    }
    assert_eq!(max_a.load(Ordering::Relaxed), 2, "capped at 2 of 8 slots");
}

fn spawn_worker(topic: &str, group: &str, record: &std::path::Path, effects: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .env("KJOB_TEST_EFFECTS", effects)
        .env("KJOB_DATABASE_URL", ensure_postgres())
        .env("KJOB_TEST_TOPIC", topic)
        .env("KJOB_TEST_GROUP", group)
        .env("KJOB_TEST_RECORD", record)
        .env("KJOB_TEST_FAIR", "1")
        // Buffers of 100 records: most of the flood is read past, and read
        // again, before and after the kill.
        .env("KJOB_TEST_MAX_IN_FLIGHT", "100")
        .env("KJOB_TEST_DELAY_MS", "5")
        .env("KJOB_TEST_CONCURRENCY", "8")
        .env("KJOB_INSTANCE_ID", "fair-0")
        .spawn()
        .expect("test-worker runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_in_a_fair_flood_loses_nothing_and_keeps_each_keys_order() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("fair.kill");
    let group = unique("g");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).expect("producer");
    // seq = key × 1000 + n: a key's jobs in seq order are its log order.
    let mut jobs: Vec<(TestJob, &str)> = Vec::new();
    for n in 0..60 {
        for k in 0..30 {
            jobs.push((TestJob::ok(format!("a-{k}"), k * 1000 + n), "a"));
        }
        for k in 30..35 {
            if n < 20 {
                jobs.push((TestJob::ok(format!("b-{k}"), k * 1000 + n), "b"));
            }
        }
    }
    // In key order per key: enqueue one key's jobs one after another.
    let mut by_key: HashMap<String, Vec<(TestJob, &str)>> = HashMap::new();
    for (j, t) in jobs {
        by_key.entry(j.key.clone()).or_default().push((j, t));
    }
    let total: usize = by_key.values().map(Vec::len).sum();
    let record = std::env::temp_dir().join(unique("fair-record"));
    // Each job's effect is a row, written with its PgMarkers mark.
    let (db, effects) = effects_table("fair_effects").await;
    let mut first = spawn_worker(&topic, &group, &record, &effects);
    let keyed: Vec<Vec<(TestJob, &str)>> = by_key.into_values().collect();
    let (p, t) = (&producer, topic.as_str());
    futures::future::join_all(keyed.iter().map(|jobs| async move {
        for (j, tenant) in jobs {
            enqueue_as(p, t, j, tenant).await;
        }
    }))
    .await;
    let done =
        |lines: &[String]| -> usize { lines.iter().filter(|l| l.starts_with("done ")).count() };
    eventually(Duration::from_secs(60), "a third ran", || {
        done(&read_lines(&record)) >= total / 3
    })
    .await;
    first.kill().expect("SIGKILL");
    let _ = first.wait();
    let mut second = spawn_worker(&topic, &group, &record, &effects);
    wait_committed_at_end(&config, &group, &topic, 2).await;
    let _ = second.kill();
    let _ = second.wait();
    let lines = read_lines(&record);
    let mut starts: HashMap<i64, usize> = HashMap::new();
    let mut order: HashMap<i64, Vec<i64>> = HashMap::new();
    for seq in lines
        .iter()
        .filter_map(|l| l.strip_prefix("start "))
        .filter_map(|s| s.parse::<i64>().ok())
    {
        let n = starts.entry(seq).or_default();
        *n += 1;
        if *n == 1 {
            order.entry(seq / 1000).or_default().push(seq);
        }
    }
    let finished: std::collections::HashSet<i64> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("done "))
        .filter_map(|s| s.parse().ok())
        .collect();
    assert_eq!(finished.len(), total, "0 lost");
    for (key, seqs) in &order {
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        assert_eq!(seqs, &sorted, "key {key}: first runs in log order");
    }
    let twice = starts.values().filter(|n| **n > 1).count();
    let (rows, distinct) = effects_once(&db, &effects).await;
    let dups = lines.iter().filter(|l| l.starts_with("dup ")).count();
    println!(
        "{total} jobs, {twice} run again after the SIGKILL (uncommitted at the kill); \
         {rows} effects, {dups} recognised as done before"
    );
    assert_eq!(rows, total as i64, "every job's effect, once");
    assert_eq!(distinct, rows, "no effect twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_metrics_stay_bounded_and_add_up() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("fair.metrics");
    create_topic(&config, &topic, 2).await;
    let producer = Producer::new(&config).expect("producer");
    // 30 tenants, 5 jobs each: more tenants than get a series of their own.
    let jobs: Vec<(TestJob, String)> = (0..150)
        .map(|i| {
            (
                TestJob::ok(format!("k-{i}"), i),
                format!("shop-{:02}", i % 30),
            )
        })
        .collect();
    for (j, t) in &jobs {
        enqueue_as(&producer, &topic, j, t.as_str()).await;
    }
    let w = Worker::builder(config.clone(), unique("g"))
        .handle_on(&topic, |_job: TestJob, _ctx: JobContext| async {
            Ok::<(), kjob::JobError>(())
        })
        .fair_by_tenant(&topic)
        .metrics_endpoint("127.0.0.1:0".parse().expect("address"))
        .build()
        .expect("worker builds");
    let running = start(w);
    eventually(Duration::from_secs(60), "every job handled", || {
        kjob::WorkerStats::get(&running.stats.handled) >= 150
    })
    .await;
    let addr = *running.stats.endpoint.get().expect("the metrics endpoint");
    let body = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body");
    running.stop().await;
    let series: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("kjob_tenant_jobs_total{") && l.contains(&topic))
        .collect();
    let tenants: std::collections::HashSet<&str> = series
        .iter()
        .filter_map(|l| l.split("tenant=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(
        tenants.len(),
        21,
        "20 tenants by name and other: {series:?}"
    );
    assert!(tenants.contains("other"));
    let total: f64 = series
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(total, 150.0, "every attempt counted once");
    assert!(
        body.lines()
            .any(|l| l.starts_with("kjob_tenant_wait_seconds_count{") && l.contains(&topic)),
        "the wait histogram is exported"
    );
}
