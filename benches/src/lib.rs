//! Shared pieces of the benchmark harnesses.

pub mod scratch_registry;

/// With `--features mimalloc`, every bench binary allocates through
/// mimalloc: the worker copies each record on its poll thread and frees it
/// on a runtime thread, which glibc's allocator serialises on arena locks.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use kjob::Job;
use serde::{Deserialize, Serialize};

/// The benchmark job: the test contract's shape. The serde name equals the
/// Avro record name, so decoding takes the direct (no value tree) path.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename = "TestJob")]
pub struct BenchJob {
    /// Partition key.
    pub key: String,
    /// Sequence number.
    pub seq: i64,
    /// Unused by the benches ("ok").
    pub behaviour: String,
}

impl BenchJob {
    /// A job with key `k{seq % keys}`.
    pub fn new(seq: i64, keys: i64) -> Self {
        Self {
            key: format!("k{}", seq % keys.max(1)),
            seq,
            behaviour: "ok".into(),
        }
    }
}

impl Job for BenchJob {
    const NAME: &'static str = "kjob.bench.job";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = include_str!("../../schemas/kjob.test.job.v1.avsc");
    fn key(&self) -> String {
        self.key.clone()
    }
}

/// A worker *process* for the multi-process harnesses (`failover`,
/// `rolling`): serves `BENCH_TOPIC` in `BENCH_GROUP` with a no-op handler
/// and prints `<partition> <seq>` for every job it handles, so the driver
/// can timestamp progress per partition. `BENCH_RDKAFKA=k=v,...` adds
/// librdkafka settings. The group protocol and a static-member id come from
/// `KJOB_GROUP_PROTOCOL` and `KJOB_INSTANCE_ID`, as in a deployment.
pub async fn printing_worker() -> anyhow::Result<()> {
    no_logs(); // stdout carries the `<partition> <seq>` lines the driver parses
    use kjob::{JobContext, JobError, KafkaConfig, Worker};
    let topic = std::env::var("BENCH_TOPIC")?;
    let group = std::env::var("BENCH_GROUP")?;
    let mut config = KafkaConfig::from_env();
    if let Ok(o) = std::env::var("BENCH_RDKAFKA") {
        for kv in o.split(',').filter(|s| !s.is_empty()) {
            if let Some((k, v)) = kv.split_once('=') {
                config = config.set(k, v);
            }
        }
    }
    let handler = |job: BenchJob, ctx: JobContext| async move {
        println!("{} {}", ctx.partition, job.seq);
        Ok::<(), JobError>(())
    };
    Worker::builder(config, group)
        .handle_on(&topic, handler)
        .build()?
        .run()
        .await?;
    Ok(())
}

/// Keeps kjob's default logs off: a worker without a subscriber of its
/// program's own logs to stdout at `info`, and a bench measures the
/// framework as it ran before that default (the figures in RESULTS.md),
/// and some drivers parse their children's stdout. Call first in `main`.
pub fn no_logs() {
    let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default());
}

/// The value after `--<name>` on the command line, parsed as a number, or
/// `default` when the flag is absent or not a number (the benches' flags
/// are all counts, rates and durations).
pub fn arg(name: &str, default: u64) -> u64 {
    let flag = format!("--{name}");
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| *a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Sends `record` through `producer`, waiting while librdkafka's queue is
/// full: the benches that write a million records at once outrun it.
pub fn send_waiting(
    producer: &rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext>,
    mut record: rdkafka::producer::BaseRecord<'_, String, Vec<u8>>,
) -> anyhow::Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((e, r)) => {
                if !matches!(
                    e.rdkafka_error_code(),
                    Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                ) {
                    anyhow::bail!("producing: {e}");
                }
                record = r;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
}

/// Prints one isolation promise's figures as a line the `floods` bench
/// collects (`FLOOD<TAB>scenario<TAB>class<TAB>alone p99<TAB>during p99`,
/// in ms): each flood bench keeps its own table, and `floods` puts every
/// scenario's isolated class against its bound (2 × alone + 20 ms) in one.
pub fn flood_row(scenario: &str, class: &str, alone_p99_ms: f64, during_p99_ms: f64) {
    println!("FLOOD\t{scenario}\t{class}\t{alone_p99_ms:.1}\t{during_p99_ms:.1}");
}
