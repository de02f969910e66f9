//! Hello, kjob: enqueue one job, handle it, exit. `cargo run -p kjob-example-hello`
use kjob::{Job, JobContext, JobError, KafkaConfig, Producer, Worker};
use serde::{Deserialize, Serialize};

/// Greet someone. The derive writes the Avro schema from the fields.
#[derive(Serialize, Deserialize, Job)]
#[job(name = "examples.hello", version = 1, key = name)]
struct Greet {
    name: String,
}

async fn greet(job: Greet, ctx: JobContext) -> Result<(), JobError> {
    println!(
        "hello, {}! (job {}, attempt {})",
        job.name, ctx.id, ctx.attempt
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = KafkaConfig::from_env(); // 127.0.0.1:9092 unless KJOB_BOOTSTRAP_SERVERS
    let worker = Worker::builder(config.clone(), "examples.hello") // the consumer group
        .handle(greet) // reads topic `examples.hello` (Greet::NAME)
        .create_main_topics(1) // development only: creates that topic if missing
        .stop_after_jobs(1) // a real worker runs until SIGTERM
        .build()?;
    let running = tokio::spawn(worker.run()); // logs to stdout; RUST_LOG filters
    let job = Greet {
        name: "world".into(),
    };
    let sent = Producer::new(&config)?.enqueue(&job).await?;
    println!("enqueued {} at offset {}", sent.id, sent.offset);
    running.await??;
    Ok(())
}
