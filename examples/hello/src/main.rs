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
    let _telemetry = kjob::telemetry::init()?; // logs to stdout, RUST_LOG filters
    let config = KafkaConfig::from_env(); // 127.0.0.1:9092 unless KJOB_BOOTSTRAP_SERVERS
    kjob::topics::create_topics(&config, &[(Greet::NAME.into(), 1)]).await?; // the main topic
    let job = Greet {
        name: "world".into(),
    };
    let sent = Producer::new(&config)?.enqueue(&job).await?;
    println!("enqueued {} at offset {}", sent.id, sent.offset);
    Worker::builder(config, "examples.hello")
        .handle(greet)
        .stop_after_jobs(1) // a real worker runs until SIGTERM
        .build()?
        .run()
        .await?;
    Ok(())
}
