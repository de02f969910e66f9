//! The soak's load: jobs fed at a steady rate, and the deliberate poison records.

use super::*;

/// Enqueues `0..jobs` at `rate`/s in batches, retrying whatever the broker
/// did not acknowledge until it does (same seq: the marker is keyed by it).
pub(crate) async fn feed(
    producer: &Producer,
    topic: &str,
    jobs: i64,
    rate: u64,
    retried: &AtomicUsize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut next = 0i64;
    let mut inflight = Vec::new();
    while next < jobs {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * rate as f64) as i64).min(jobs);
        if due <= next {
            continue;
        }
        let batch: Vec<BenchJob> = (next..due).map(|s| BenchJob::new(s, 1_000)).collect();
        next = due;
        let (producer, topic) = (producer.clone(), topic.to_string());
        inflight.push(tokio::spawn(async move {
            let mut pending = batch;
            let mut failures = 0usize;
            while !pending.is_empty() {
                let results = producer.enqueue_batch_to(&topic, &pending).await;
                let failed: Vec<BenchJob> = pending
                    .into_iter()
                    .zip(results)
                    .filter(|(_, r)| r.is_err())
                    .map(|(j, _)| j)
                    .collect();
                failures += failed.len();
                pending = failed;
                if !pending.is_empty() {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            failures
        }));
    }
    for t in inflight {
        retried.fetch_add(t.await?, Ordering::Relaxed);
    }
    Ok(())
}

/// Deliberate poison, spread over the feed: records that are not Avro, and
/// valid jobs the handler refuses. Each is retried until the broker
/// acknowledges it, as the feed does (a broker restart can time a send
/// out). Returns their keys and how many sends were retried.
pub(crate) async fn poison(
    producer: &Producer,
    topic: &str,
    over: Duration,
) -> anyhow::Result<(Vec<String>, usize)> {
    let mut keys = Vec::new();
    let mut retried = 0usize;
    for i in 0..POISON_EACH {
        tokio::time::sleep(over / POISON_EACH as u32).await;
        let raw = format!("poison-raw-{i}");
        while producer
            .send_raw(
                topic,
                Some(raw.as_bytes()),
                Some(b"not a Confluent-framed record"),
                OwnedHeaders::new(),
            )
            .await
            .is_err()
        {
            retried += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let refused = format!("poison-job-{i}");
        let job = BenchJob {
            key: refused.clone(),
            seq: POISON_SEQ + i,
            behaviour: "poison".into(),
        };
        while producer.enqueue_to(topic, &job).await.is_err() {
            retried += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        keys.push(raw);
        keys.push(refused);
    }
    Ok((keys, retried))
}
