//! `kjob schema check --in-flight` over a large backlog: how long counting
//! the writers of a million waiting jobs takes, against a plain read of
//! the same records by one consumer in the same run (the floor: Kafka
//! cannot send headers without bodies).
//!
//! ```bash
//! ./dev stack up && cargo run --release -p kjob-benches --bin in_flight -- --records 1000000
//! ```
//!
//! 1. Registers a contract under a fresh main topic (`--partitions`, 4)
//!    with a 5 m retry tier, and writes `--records` framed records of about
//!    100 bytes with kjob's headers: nine in ten on the main topic, one in
//!    ten in the tier; half of them with a second writer id.
//! 2. Times, `--rounds` (3) times each, interleaved: the plain read (assign
//!    every partition from its start, poll to the end, count) and the
//!    gate's read (`places` + `writers_waiting`, the group having committed
//!    nothing), and prints the medians and their ratio.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::Consumer;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use kjob::KafkaConfig;
use kjob_benches::arg;
use kjob_integration_tests::unique;
use kjob_ops::contracts::in_flight::{places, writers_waiting};

fn produce(
    config: &KafkaConfig,
    topic: &str,
    n: u64,
    partitions: i32,
    ids: [u32; 2],
) -> anyhow::Result<()> {
    let p: ThreadedProducer<DefaultProducerContext> = config
        .rdkafka_config()
        .set("linger.ms", "50")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "500000")
        .create()
        .context("producer")?;
    for i in 0..n {
        let job_id = uuid::Uuid::new_v4().to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "kjob-job",
                value: Some("bench.invoice"),
            })
            .insert(Header {
                key: "kjob-id",
                value: Some(&job_id),
            })
            .insert(Header {
                key: "kjob-version",
                value: Some("1"),
            });
        let key = format!("order-{i:07}");
        let id = ids[(i % 2) as usize].to_be_bytes();
        let mut payload = vec![0u8, id[0], id[1], id[2], id[3]];
        payload.extend_from_slice(format!("\x1aorder-{i:07}").as_bytes());
        payload.extend(std::iter::repeat_n(b'x', 70));
        kjob_benches::send_waiting(
            &p,
            BaseRecord::to(topic)
                .partition((i % partitions as u64) as i32)
                .key(&key)
                .payload(&payload)
                .headers(headers),
        )?;
    }
    p.flush(Duration::from_secs(120)).context("flushing")?;
    Ok(())
}

/// The floor: one consumer reads every record of `topics` and counts them.
fn plain_read(config: &KafkaConfig, topics: &[String], partitions: i32) -> anyhow::Result<u64> {
    let consumer = kjob::topics::operator_consumer(config)?;
    let mut tpl = TopicPartitionList::new();
    let mut left = 0;
    let mut ends = std::collections::HashMap::new();
    for t in topics {
        for p in 0..partitions {
            let (low, high) = consumer.fetch_watermarks(t, p, Duration::from_secs(10))?;
            if high > low {
                tpl.add_partition_offset(t, p, Offset::Offset(low))?;
                ends.insert((t.clone(), p), high);
                left += 1;
            }
        }
    }
    consumer.assign(&tpl)?;
    let mut n = 0;
    while left > 0 {
        let Some(m) = consumer.poll(Duration::from_secs(10)) else {
            bail!("no record for 10 s with {left} partitions unread");
        };
        let m = m?;
        n += 1;
        use rdkafka::Message as _;
        if ends.get(&(m.topic().to_string(), m.partition())) == Some(&(m.offset() + 1)) {
            left -= 1;
        }
    }
    Ok(n)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    let records = arg("records", 1_000_000);
    let partitions = arg("partitions", 4) as i32;
    let rounds = arg("rounds", 3) as usize;
    let config = KafkaConfig::from_env();
    let main = unique("bench.inflight");
    let group = unique("bench.g");
    let tier = kjob::retry::tier_topic(&main, Duration::from_secs(300));
    kjob::topics::create_topics(
        &config,
        &[(main.clone(), partitions), (tier.clone(), partitions)],
    )
    .await?;
    let codec = kjob::codec::Codec::from_config(&config)?;
    let subject = kjob::codec::subject_for_topic(&main);
    let mut ids = [0u32; 2];
    for (i, extra) in ["", r#",{"name":"note","type":"string","default":""}"#]
        .iter()
        .enumerate()
    {
        let schema = format!(
            r#"{{"type":"record","name":"BenchInvoice","fields":[{{"name":"order_id","type":"string"}},{{"name":"pad","type":"string","default":""}}{extra}]}}"#
        );
        match codec.client().register(&subject, &schema).await? {
            kjob::registry::Registration::Id(id) => ids[i] = id,
            other => bail!("registering: {other:?}"),
        }
    }
    let started = Instant::now();
    let in_tier = records / 10;
    produce(&config, &main, records - in_tier, partitions, ids)?;
    produce(&config, &tier, in_tier, partitions, ids)?;
    println!(
        "produced {records} records in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let topics = [main.clone(), tier.clone()];
    let (mut plain, mut gate) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let t = Instant::now();
        let n = plain_read(&config, &topics, partitions)?;
        plain.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let found = places(&config, &group, None, std::slice::from_ref(&main))?;
        let located = t.elapsed().as_secs_f64();
        let known = std::iter::once(main.clone()).collect();
        let counts = writers_waiting(&config, &group, &found, &known, &mut |_, _| {})?;
        gate.push(t.elapsed().as_secs_f64());
        let counted: u64 = counts.iter().map(|c| c.count).sum();
        if counted != records || n != records {
            bail!("round {round}: read {n}, counted {counted} of {records}");
        }
        println!(
            "round {round}: plain read {:.2} s, gate {:.2} s (finding the topics {located:.2} s; {} writer rows)",
            plain[round],
            gate[round],
            counts.len()
        );
    }
    let (p, g) = (median(&mut plain), median(&mut gate));
    println!(
        "{records} waiting records: plain read median {p:.2} s ({:.0} k records/s), gate median {g:.2} s ({:.0} k records/s), gate/plain {:.2}",
        records as f64 / p / 1e3,
        records as f64 / g / 1e3,
        g / p
    );
    let admin: AdminClient<DefaultClientContext> = config.rdkafka_config().create()?;
    admin
        .delete_topics(&[&main, &tier], &AdminOptions::new())
        .await
        .ok();
    Ok(())
}
