//! `/metrics` as a Prometheus user reads it, scraped from running workers on
//! the real stack: explicit duration buckets, Prometheus names and labels,
//! no `otel_scope_name`, each partition's lag exported once per group,
//! per-worker gauges, schedule metrics, and one exporter shared by two
//! workers.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use kjob::layers::breaker::Breaker;
use kjob::schedule::Schedule;
use kjob::telemetry::{MetricsExporter, DURATION_BUCKETS};
use kjob::{JobContext, JobError, Producer, Worker, WorkerStats};
use kjob_integration_tests::*;

async fn scrape(addr: SocketAddr) -> String {
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body")
}

/// The series of `name` as (labels, value), labels parsed into a map.
fn series(text: &str, name: &str) -> Vec<(HashMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let (n, labels) = match key.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (key, ""),
            };
            if n != name {
                return None;
            }
            let labels = labels
                .split(',')
                .filter(|kv| !kv.is_empty())
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_string(), v.trim_matches('"').to_string()))
                })
                .collect();
            Some((labels, value.parse().ok()?))
        })
        .collect()
}

async fn ok(_: TestJob, _: JobContext) -> Result<(), JobError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_prometheus_conventions() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("conv");
    let ticks = unique("conv-ticks");
    let group = unique("g");
    create_topic(&config, &topic, 4).await;
    create_topic(&config, &ticks, 1).await;
    let worker = Worker::builder(config.clone(), &group)
        .handle_on(&topic, ok)
        .layer_for(&topic, Breaker::new("conv-downstream"))
        .handle_on(&ticks, ok)
        .schedule_with(
            Schedule::new("conv-tick", "* * * * * *", || TestJob::ok("t", 0))
                .on(&ticks, || TestJob::ok("t", 0)),
        )
        .commit_interval(Duration::from_millis(200))
        .metrics_endpoint("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let running = start(worker);
    let stats = running.stats.clone();
    eventually(Duration::from_secs(60), "assigned", || {
        stats.ready.load(std::sync::atomic::Ordering::Acquire)
    })
    .await;
    let producer = Producer::new(&config).unwrap();
    let jobs: Vec<TestJob> = (0..40).map(|i| TestJob::ok(format!("k{i}"), i)).collect();
    for r in producer.enqueue_batch_to(&topic, &jobs).await {
        r.unwrap();
    }
    eventually(Duration::from_secs(60), "jobs and a tick handled", || {
        WorkerStats::get(&stats.handled) >= 41 && WorkerStats::get(&stats.schedule_fired) >= 1
    })
    .await;
    let addr = *stats.endpoint.get().unwrap();
    // The lag is refreshed every 2 s; the schedule gauge every 100 ms.
    let mut text = scrape(addr).await;
    for _ in 0..50 {
        if !series(&text, "kjob_consumer_lag").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        text = scrape(addr).await;
    }

    assert!(
        !text.contains("otel_scope_name"),
        "no series carries otel_scope_name"
    );

    // Explicit buckets in seconds, 1 ms to 5 min, on every duration histogram.
    let want: Vec<String> = DURATION_BUCKETS
        .iter()
        .map(|b| b.to_string())
        .chain(["+Inf".to_string()])
        .collect();
    for h in [
        "kjob_handler_duration_seconds",
        "kjob_priority_latency_seconds",
        "kjob_schedule_lateness_seconds",
    ] {
        let les: Vec<String> = series(&text, &format!("{h}_bucket"))
            .into_iter()
            .filter_map(|(l, _)| l.get("le").cloned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut sorted_want = want.clone();
        sorted_want.sort();
        assert_eq!(les, sorted_want, "{h}: the buckets are the documented ones");
    }
    // The old name stays for one release, with the same buckets.
    assert!(
        series(&text, "kjob_handler_seconds_count")
            .iter()
            .map(|(_, v)| v)
            .sum::<f64>()
            >= 41.0
    );

    // Rebalances by kind.
    let assigned: f64 = series(&text, "kjob_rebalances_total")
        .iter()
        .filter(|(l, _)| l.get("kind").map(String::as_str) == Some("assigned"))
        .map(|(_, v)| v)
        .sum();
    assert!(
        assigned >= 1.0,
        "kjob_rebalances_total{{kind=\"assigned\"}}"
    );

    // The breaker's state is a label; exactly one state is 1.
    let states = series(&text, "kjob_breaker_state");
    let mine: Vec<_> = states
        .iter()
        .filter(|(l, _)| l.get("breaker").map(String::as_str) == Some("conv-downstream"))
        .collect();
    assert_eq!(mine.len(), 3, "closed, half_open, open: {mine:?}");
    let on: Vec<_> = mine.iter().filter(|(_, v)| *v == 1.0).collect();
    assert_eq!(on.len(), 1);
    assert_eq!(on[0].0["state"], "closed");
    assert_eq!(on[0].0["group"], group);

    // Schedules: leader, fired, lateness per schedule.
    let leader = series(&text, "kjob_schedule_leader");
    assert!(
        leader
            .iter()
            .any(|(l, v)| l.get("schedule").map(String::as_str) == Some("conv-tick") && *v == 1.0),
        "{leader:?}"
    );
    let fired: f64 = series(&text, "kjob_schedule_fired_total")
        .iter()
        .filter(|(l, _)| l.get("schedule").map(String::as_str) == Some("conv-tick"))
        .map(|(_, v)| v)
        .sum();
    assert!(fired >= 1.0);

    // Gauges carry the group.
    for g in ["kjob_parked", "kjob_registry_waiting"] {
        let s = series(&text, g);
        assert!(
            s.iter().any(|(l, _)| l.get("group") == Some(&group)),
            "{g} carries group: {s:?}"
        );
    }
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_export_each_partitions_lag_once() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("lagonce");
    let group = unique("g");
    create_topic(&config, &topic, 4).await;
    let build = || {
        Worker::builder(config.clone(), &group)
            .handle_on(&topic, ok)
            .commit_interval(Duration::from_millis(200))
            .metrics_endpoint("127.0.0.1:0".parse().unwrap())
            .build()
            .unwrap()
    };
    let a = start(build());
    let b = start(build());
    let producer = Producer::new(&config).unwrap();
    let jobs: Vec<TestJob> = (0..40).map(|i| TestJob::ok(format!("k{i}"), i)).collect();
    for r in producer.enqueue_batch_to(&topic, &jobs).await {
        r.unwrap();
    }
    let (sa, sb) = (a.stats.clone(), b.stats.clone());
    eventually(
        Duration::from_secs(90),
        "both members own main partitions",
        || {
            let owns = |s: &WorkerStats| s.assignment().iter().any(|(t, _)| *t == topic);
            owns(&sa) && owns(&sb)
        },
    )
    .await;
    let main_partitions = |text: &str| -> Vec<String> {
        series(text, "kjob_consumer_lag")
            .into_iter()
            .filter(|(l, _)| l.get("topic") == Some(&topic))
            .map(|(l, _)| l["partition"].clone())
            .collect()
    };
    let (addr_a, addr_b) = (*sa.endpoint.get().unwrap(), *sb.endpoint.get().unwrap());
    // Each member exports the partitions it owns, and together they cover
    // the topic once. Retried while the lag refresh (2 s) catches up.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (pa, pb) = (
            main_partitions(&scrape(addr_a).await),
            main_partitions(&scrape(addr_b).await),
        );
        let mut all = pa.clone();
        all.extend(pb.clone());
        all.sort();
        if all == ["0", "1", "2", "3"] {
            assert!(!pa.is_empty() && !pb.is_empty(), "{pa:?} {pb:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "each partition exported once across members: a {pa:?}, b {pb:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_one_exporter_and_keep_their_gauges_apart() {
    init_logging();
    let config = ensure_stack();
    let (t1, t2) = (unique("share1"), unique("share2"));
    let (g1, g2) = (unique("g"), unique("g"));
    create_topic(&config, &t1, 1).await;
    create_topic(&config, &t2, 1).await;
    let exporter = MetricsExporter::prometheus().unwrap();
    // The first serves the endpoint; the second only records into it.
    let w1 = Worker::builder(config.clone(), &g1)
        .handle_on(&t1, ok)
        .layer_for(&t1, Breaker::new("only-in-w1"))
        .metrics_exporter(exporter.clone())
        .metrics_endpoint("127.0.0.1:0".parse().unwrap())
        .build()
        .unwrap();
    let w2 = Worker::builder(config.clone(), &g2)
        .handle_on(&t2, ok)
        .metrics_exporter(exporter.clone())
        .build()
        .unwrap();
    let (r1, r2) = (start(w1), start(w2));
    let producer = Producer::new(&config).unwrap();
    producer
        .enqueue_to(&t1, &TestJob::ok("a", 1))
        .await
        .unwrap();
    producer
        .enqueue_to(&t2, &TestJob::ok("b", 2))
        .await
        .unwrap();
    let (s1, s2) = (r1.stats.clone(), r2.stats.clone());
    eventually(Duration::from_secs(60), "both handled", || {
        WorkerStats::get(&s1.handled) == 1 && WorkerStats::get(&s2.handled) == 1
    })
    .await;
    let text = scrape(*s1.endpoint.get().unwrap()).await;
    let parked_groups: BTreeSet<String> = series(&text, "kjob_parked")
        .into_iter()
        .filter_map(|(l, _)| l.get("group").cloned())
        .collect();
    assert!(
        parked_groups.contains(&g1) && parked_groups.contains(&g2),
        "one endpoint shows both workers, apart: {parked_groups:?}"
    );
    let breaker_groups: BTreeSet<String> = series(&text, "kjob_breaker_state")
        .into_iter()
        .filter_map(|(l, _)| l.get("group").cloned())
        .collect();
    assert_eq!(
        breaker_groups,
        BTreeSet::from([g1.clone()]),
        "a breaker shows only on the worker whose jobs use it"
    );
    r1.stop().await;
    r2.stop().await;
}
