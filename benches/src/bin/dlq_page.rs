//! The dashboard's DLQ page over a million dead letters: how long the
//! index takes to build, what it holds in memory, and the p50/p99 of page
//! requests once it is warm (target: p99 at most 500 ms).
//!
//! ```bash
//! ./dev stack up && cargo run --release -p kjob-benches --bin dlq_page -- --records 1000000
//! ```
//!
//! 1. Produces `--records` (1 000 000) dead letters to a fresh
//!    `<topic>.dlq` of `--partitions` (4): keys `order-0000042`, job ids,
//!    errors of about 60 bytes, six error classes, four jobs, a small
//!    Avro-framed payload holding `customer-0000042`.
//! 2. Starts the dashboard in this process (`Dashboard::serve`, read-only)
//!    and asks for the DLQ page until the index has caught up: the build
//!    time, and the RSS it added per dead letter.
//! 3. Warms up (`--warmup`, 20 requests per kind), then sends `--requests`
//!    (200) sequential requests of each kind and reports p50/p99: the first
//!    page (newest first), a deep page (offset 500 000), a search
//!    (`customer-00012`, in the payload: 100 matches), a sort by key
//!    (ascending, page 2), a class filter, and the detail page of one record.
//!
//! The DLQ and its topic are deleted at the end unless `--keep 1`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};

use kjob::KafkaConfig;
use kjob_benches::arg;
use kjob_integration_tests::{create_topic, unique};
use kjob_ops::ui::Dashboard;

const CLASSES: [&str; 6] = [
    "permanent.invalid",
    "permanent.missing",
    "retryable.timeout",
    "retryable.http5xx",
    "bug.panic",
    "decode.schema",
];
const JOBS: [&str; 4] = [
    "mail.confirmation",
    "invoice.pdf",
    "crm.sync",
    "payment.capture",
];

fn produce(config: &KafkaConfig, dlq: &str, n: u64, partitions: i32) -> anyhow::Result<()> {
    let p: ThreadedProducer<DefaultProducerContext> = config
        .rdkafka_config()
        .set("linger.ms", "50")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "500000")
        .create()
        .context("producer")?;
    for i in 0..n {
        let id = uuid::Uuid::new_v4().to_string();
        let error = format!("downstream answered 503 Service Unavailable after 30s (try {i})");
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "kjob-job",
                value: Some(JOBS[(i % 4) as usize]),
            })
            .insert(Header {
                key: "kjob-error-class",
                value: Some(CLASSES[(i % 6) as usize]),
            })
            .insert(Header {
                key: "kjob-id",
                value: Some(&id),
            })
            .insert(Header {
                key: "kjob-error",
                value: Some(&error),
            })
            .insert(Header {
                key: "kjob-attempt",
                value: Some(&(1 + i % 5).to_string()),
            });
        let key = format!("order-{i:07}");
        let mut payload = vec![0u8, 0, 0, 0, 1, 0x20];
        payload.extend_from_slice(format!("customer-{i:07}").as_bytes());
        payload.extend_from_slice(b"\x04EUR\x02");
        kjob_benches::send_waiting(
            &p,
            BaseRecord::to(dlq)
                .partition((i % partitions as u64) as i32)
                .key(&key)
                .payload(&payload)
                .headers(headers),
        )?;
    }
    p.flush(Duration::from_secs(120)).context("flushing")?;
    Ok(())
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    let records = arg("records", 1_000_000);
    let partitions = arg("partitions", 4) as i32;
    let requests = arg("requests", 200) as usize;
    let warmup = arg("warmup", 20) as usize;
    let keep = arg("keep", 0) == 1;
    let config = KafkaConfig::from_env();
    let topic = unique("dlqbench");
    let dlq = format!("{topic}.dlq");
    create_topic(&config, &topic, partitions).await;
    create_topic(&config, &dlq, partitions).await;

    let t = Instant::now();
    let (cfg, d) = (config.clone(), dlq.clone());
    tokio::task::spawn_blocking(move || produce(&cfg, &d, records, partitions)).await??;
    println!(
        "produced {records} dead letters to {dlq} in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr: SocketAddr = listener.local_addr()?;
    drop(listener);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let dashboard = Dashboard::new(config.clone()).discover(false);
    let server = tokio::spawn(async move {
        dashboard
            .serve(addr, async {
                let _ = stop_rx.await;
            })
            .await
    });
    let http = reqwest::Client::new();
    let base = format!("http://{addr}");
    let get = |target: String| {
        let http = http.clone();
        let url = format!("{base}{target}");
        async move {
            let r = http.get(&url).send().await?;
            let status = r.status();
            let body = r.text().await?;
            if !status.is_success() {
                bail!("{url}: {status}");
            }
            anyhow::Ok(body)
        }
    };
    let list = format!("/dlq?topic={topic}");
    let start = Instant::now();
    while reqwest::get(format!("{base}/assets/style.css"))
        .await
        .is_err()
    {
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the dashboard did not answer");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rss_before = rss_kib();
    let t = Instant::now();
    loop {
        let page = get(list.clone()).await?;
        if !page.contains("id=\"indexing\"") {
            break;
        }
        if t.elapsed() > Duration::from_secs(900) {
            bail!("the index did not catch up within 15 min");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let build = t.elapsed();
    let rss_after = rss_kib();
    println!(
        "index built in {:.1} s; RSS {} -> {} MiB ({:.0} bytes per dead letter)",
        build.as_secs_f64(),
        rss_before / 1024,
        rss_after / 1024,
        (rss_after.saturating_sub(rss_before) * 1024) as f64 / records as f64
    );

    let deep = records / 2 / 50 + 1;
    let kinds: Vec<(&str, String)> = vec![
        ("first page (newest first)", list.clone()),
        ("deep page (offset 500 000)", format!("{list}&page={deep}")),
        ("search in payload", format!("{list}&q=customer-00012")),
        (
            "sort by key, page 2",
            format!("{list}&sort=key&dir=asc&page=2"),
        ),
        ("class filter", format!("{list}&class=bug.panic")),
        ("detail page", format!("/dlq/show?topic={topic}&at=0:12345")),
    ];
    let mut table = Vec::new();
    for (what, target) in &kinds {
        for _ in 0..warmup {
            get(target.clone()).await?;
        }
        let mut ms = Vec::with_capacity(requests);
        for _ in 0..requests {
            let t = Instant::now();
            get(target.clone()).await?;
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        ms.sort_by(f64::total_cmp);
        table.push((what, percentile(&ms, 0.5), percentile(&ms, 0.99)));
    }
    println!();
    println!("| request ({records} dead letters) | p50 | p99 |");
    println!("|---|---|---|");
    for (what, p50, p99) in &table {
        println!("| {what} | {p50:.1} ms | {p99:.1} ms |");
    }
    let _ = stop_tx.send(());
    let _ = server.await;
    if !keep {
        let admin: AdminClient<DefaultClientContext> = config.rdkafka_config().create()?;
        admin
            .delete_topics(&[&topic, &dlq], &AdminOptions::new())
            .await?;
    }
    Ok(())
}
