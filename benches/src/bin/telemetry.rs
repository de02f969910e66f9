//! Telemetry overhead: the same worker over the same records, first with
//! telemetry off (no subscriber, no metrics endpoint), then with tracing
//! spans exported to an in-process tracer provider (every attempt gets a
//! real, sampled span with messaging attributes, and trace context is
//! propagated) and Prometheus metrics recorded. The last line is the ratio.

use std::time::{Duration, Instant};

use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker, WorkerStats};
use kjob_benches::BenchJob;
use opentelemetry_sdk::trace::SdkTracerProvider;

async fn rate(config: &KafkaConfig, topic: &str, n: u64, metrics: bool) -> anyhow::Result<f64> {
    let group = format!("bench-tel-{}", uuid::Uuid::new_v4().simple());
    let mut b = Worker::builder(config.clone(), group)
        .handle_on(topic, |_j: BenchJob, _c: JobContext| async {
            Ok::<(), JobError>(())
        });
    if metrics {
        b = b.metrics_endpoint("127.0.0.1:0".parse()?);
    }
    let worker = b.build()?;
    let stats = worker.stats();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = rx.await;
    }));
    let deadline = Instant::now() + Duration::from_secs(300);
    while WorkerStats::get(&stats.handled) == 0 {
        anyhow::ensure!(Instant::now() < deadline, "nothing handled");
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let first = Instant::now();
    while WorkerStats::get(&stats.handled) < n {
        anyhow::ensure!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let r = n as f64 / first.elapsed().as_secs_f64();
    let _ = tx.send(());
    running.await??;
    Ok(r)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs one measurement in a child process (telemetry state is global per
/// process), returning its rate.
fn measure(topic: &str, n: u64, mode: &str) -> anyhow::Result<f64> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(["--child", mode, topic, &n.to_string()])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "child {mode} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find_map(|l| l.strip_prefix("rate "))
        .and_then(|r| r.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("child {mode} printed no rate: {text}"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let config = KafkaConfig::from_env();
    if args.get(1).map(String::as_str) == Some("--child") {
        let (mode, topic) = (args[2].as_str(), args[3].as_str());
        let n: u64 = args[4].parse()?;
        if mode == "sampled" {
            // The standard sampler variables, read by the SDK: 10% of traces.
            std::env::set_var("OTEL_TRACES_SAMPLER", "parentbased_traceidratio");
            std::env::set_var("OTEL_TRACES_SAMPLER_ARG", "0.1");
        }
        let _guard = if mode == "all" || mode == "sampled" {
            // Spans are created, sampled and ended for every attempt; the
            // provider has no exporter, so this measures kjob's
            // instrumentation, not a network.
            std::env::set_var("RUST_LOG", "warn");
            Some(kjob::telemetry::init_with_provider(
                SdkTracerProvider::builder().build(),
            )?)
        } else {
            kjob_benches::no_logs();
            None
        };
        let r = rate(&config, topic, n, mode != "off").await?;
        println!("rate {r}");
        return Ok(());
    }
    let n = 100_000u64;
    let topic = format!(
        "kjob.bench.tel.{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    kjob::topics::create_topics(&config, &[(topic.clone(), 6)]).await?;
    let producer = Producer::new(&config)?;
    let jobs: Vec<BenchJob> = (0..n as i64)
        .map(|i| BenchJob {
            key: format!("k{}", i % 10_000),
            seq: i,
            behaviour: "ok".into(),
        })
        .collect();
    for chunk in jobs.chunks(20_000) {
        for r in producer.enqueue_batch_to(&topic, chunk).await {
            r?;
        }
    }
    // Alternate the modes, three rounds, each in a fresh process and group.
    let (mut off, mut metrics, mut all, mut sampled) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        off.push(measure(&topic, n, "off")?);
        metrics.push(measure(&topic, n, "metrics")?);
        sampled.push(measure(&topic, n, "sampled")?);
        all.push(measure(&topic, n, "all")?);
    }
    let (off, metrics, all, sampled) = (median(off), median(metrics), median(all), median(sampled));
    println!(
        "tracing 10% sampled + metrics:      {sampled:>9.0} jobs/s  (ratio {:.2})",
        sampled / off
    );
    println!("telemetry off (median of 3):        {off:>9.0} jobs/s");
    println!("metrics on (median of 3):           {metrics:>9.0} jobs/s");
    println!("tracing + metrics on (median of 3): {all:>9.0} jobs/s");
    println!("metrics-only/off ratio: {:.2}", metrics / off);
    println!("telemetry on/off ratio: {:.2}", all / off);
    Ok(())
}
