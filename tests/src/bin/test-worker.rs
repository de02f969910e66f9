//! A worker *process* for the crash and shutdown tests: they need to SIGKILL
//! and SIGTERM a real process, which an in-process worker cannot simulate.
//!
//! Configured by environment: `KJOB_TEST_TOPIC`, `KJOB_TEST_GROUP`,
//! `KJOB_TEST_RECORD` (a file; `start <seq>` and `done <seq>` lines are
//! appended with one write each, so they survive SIGKILL), and
//! `KJOB_TEST_DELAY_MS` (simulated handler latency), `KJOB_TEST_COMMIT_MS`
//! (commit interval, default 200) and `KJOB_TEST_TIERS_MS` (comma-separated
//! retry tier delays, default 1000), `KJOB_TEST_CONCURRENCY` (default 64).
//! `KJOB_TEST_DELAYED=1` also serves the route's delay topics and appends
//! `ran <seq> <now ms> <due ms>` for each job (its lateness).
//! `KJOB_TEST_SCHEDULE=<name>=<cron>` runs that schedule (catch-up: all,
//! up to 1000), enqueueing `TestJob { seq: <fire time in s> }` on the topic, and
//! appends `leader <pid> <ms>` whenever this process becomes the leader.
//! `KJOB_TEST_TELEMETRY=1` logs through `kjob::telemetry::init`; `none`
//! installs no subscriber (kjob's default logs then apply).
//! `KJOB_TEST_BATCHES=<topic>` takes part in batches on that batch topic,
//! and `KJOB_TEST_CALLBACK_TOPIC=<topic>` handles `TestJob` callbacks there,
//! appending `callback <job id> <total> <succeeded> <dead-lettered>`.
//! A job whose behaviour is `permanent` fails as invalid input (to the DLQ).
//! A job whose behaviour is `fail-first`
//! fails its first attempt with a retryable error, `fail-twice` its first
//! two. `KJOB_TEST_STRICT=1` puts the route under strict ordered retries
//! (`WorkerBuilder::strict_order`) and appends `okat <seq> <now ms>` when a
//! job succeeds. `KJOB_TEST_DEBOUNCE_MS=<ms>` debounces the route
//! (`WorkerBuilder::debounce`). `KJOB_TEST_EFFECTS=<table>` (with
//! `KJOB_DATABASE_URL`) makes each successful job's effect a row
//! `(seq)` in `<table>`, written in one transaction with its
//! `PgMarkers` mark in `<table>_marks`, so a job run again after a crash
//! leaves no second row (`dup <seq>` is appended instead).
//! `KJOB_TEST_MAX_IN_FLIGHT=<n>` sets the partition buffer
//! (`WorkerBuilder::max_in_flight_per_partition`).
//! `KJOB_TEST_SHARED_TIERS=1` shares the retry tiers among the routes
//! (`WorkerBuilder::shared_retry_tiers`); `KJOB_TEST_SECOND_TOPIC=<topic>`
//! runs the same handler on a second route, with retry tiers of its own
//! `KJOB_TEST_SECOND_TIERS_MS` (default `1000,2000`); with
//! `KJOB_TEST_SHARED_DELAYS=1` too, the routes also share delay buckets
//! (`SharedTiers::delay_buckets`).
//! `KJOB_TEST_KJOB_SESSION=1` keeps kjob's own group settings instead of the
//! broker's minimum session (6 s) the crash tests use, and
//! `KJOB_TEST_TIMES=1` appends `doneat <seq> <epoch ms>` after each `done`
//! line and `callbackat <epoch ms>` after each `callback` line.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kjob::{JobContext, JobError, KafkaConfig, Worker};
use kjob_integration_tests::{append_line, TestJob};

fn env(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("missing environment variable {name}"))
}

/// Comma-separated milliseconds from `name` (or `default`), as delays.
fn delays_ms(name: &str, default: &str) -> Vec<Duration> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|t| t.trim().parse().ok())
        .map(Duration::from_millis)
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), String> {
    // `KJOB_TEST_TELEMETRY=1`: kjob's own log setup, as a service would
    // install it (`kjob::telemetry::init`), instead of the tests' one.
    // `none`: no subscriber at all, as a program that never set one up.
    let telemetry = std::env::var("KJOB_TEST_TELEMETRY").unwrap_or_default();
    let _telemetry = if telemetry == "1" {
        Some(kjob::telemetry::init().map_err(|e| e.to_string())?)
    } else if telemetry == "none" {
        None
    } else {
        kjob_integration_tests::init_logging();
        None
    };
    let topic = env("KJOB_TEST_TOPIC")?;
    let group = env("KJOB_TEST_GROUP")?;
    let record_path = PathBuf::from(env("KJOB_TEST_RECORD")?);
    let record = Arc::new(record_path.clone());
    let delay = Duration::from_millis(
        env("KJOB_TEST_DELAY_MS")
            .ok()
            .and_then(|d| d.parse().ok())
            .unwrap_or(0),
    );
    let ms = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|d| d.parse().ok())
            .unwrap_or(default)
    };
    let commit = Duration::from_millis(ms("KJOB_TEST_COMMIT_MS", 200));
    let concurrency = ms("KJOB_TEST_CONCURRENCY", 64) as usize;
    let tiers = delays_ms("KJOB_TEST_TIERS_MS", "1000");
    let delayed = std::env::var("KJOB_TEST_DELAYED").is_ok_and(|v| v == "1");
    let times = std::env::var("KJOB_TEST_TIMES").is_ok_and(|v| v == "1");
    let strict = std::env::var("KJOB_TEST_STRICT").is_ok_and(|v| v == "1");
    let effects = match std::env::var("KJOB_TEST_EFFECTS") {
        Ok(table) => Some(Arc::new(
            Effects::connect(&env("KJOB_DATABASE_URL")?, &table, concurrency).await?,
        )),
        Err(_) => None,
    };
    let handler = move |job: TestJob, ctx: JobContext| {
        let record = record.clone();
        let effects = effects.clone();
        async move {
            if delayed {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as i64)
                    .unwrap_or(0);
                let due = ctx.due_at_ms.unwrap_or(-1);
                append_line(&record, &format!("ran {} {now} {due}", job.seq));
            }
            append_line(&record, &format!("start {}", job.seq));
            tokio::time::sleep(delay).await;
            if job.behaviour == "permanent" {
                append_line(&record, &format!("dead {}", job.seq));
                return Err(JobError::invalid_input("test: permanent failure"));
            }
            if (job.behaviour == "fail-first" && ctx.attempt == 1)
                || (job.behaviour == "fail-twice" && ctx.attempt <= 2)
            {
                append_line(&record, &format!("failed {}", job.seq));
                return Err(JobError::server("test: planned failure"));
            }
            if let Some(effects) = &effects {
                if !effects.once(&ctx.id, job.seq).await? {
                    append_line(&record, &format!("dup {}", job.seq));
                }
            }
            append_line(&record, &format!("done {}", job.seq));
            if times {
                append_line(
                    &record,
                    &format!("doneat {} {}", job.seq, kjob::clock::now_ms()),
                );
            }
            if strict {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as i64)
                    .unwrap_or(0);
                append_line(&record, &format!("okat {} {now}", job.seq));
            }
            Ok::<(), JobError>(())
        }
    };
    // The broker's minimum session timeout: a SIGKILLed member is evicted in
    // 6 s instead of kjob's 10 s, which keeps the crash tests short. (Under
    // KIP-848 the session is the broker's, and the setting is refused.)
    let mut config = KafkaConfig::from_env();
    let kjob_session = std::env::var("KJOB_TEST_KJOB_SESSION").is_ok_and(|v| v == "1");
    if std::env::var("KJOB_GROUP_PROTOCOL").as_deref() != Ok("consumer") && !kjob_session {
        config = config.set("session.timeout.ms", "6000");
    }
    let mut builder = Worker::builder(config, group);
    let schedule = std::env::var("KJOB_TEST_SCHEDULE").ok();
    if let Some((name, expr)) = schedule.as_deref().and_then(|s| s.split_once('=')) {
        let tick_topic = topic.clone();
        builder = builder.schedule_with(
            kjob::schedule::Schedule::new(name, expr, || TestJob::ok("tick", 0))
                .on(&tick_topic, || {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs() as i64)
                        .unwrap_or(0);
                    TestJob::ok("tick", now)
                })
                .catch_up(kjob::schedule::CatchUp::All { max: 1000 }),
        );
    }
    if strict {
        builder = builder.strict_order(&topic);
    }
    if std::env::var("KJOB_TEST_FAIR").is_ok_and(|v| v == "1") {
        builder = builder.fair_by_tenant(&topic);
    }
    if let Ok(window) = std::env::var("KJOB_TEST_DEBOUNCE_MS") {
        let ms: u64 = window
            .parse()
            .map_err(|e| format!("KJOB_TEST_DEBOUNCE_MS={window}: {e}"))?;
        builder = builder.debounce(&topic, Duration::from_millis(ms));
    }
    if let Ok(n) = std::env::var("KJOB_TEST_MAX_IN_FLIGHT") {
        let n: usize = n
            .parse()
            .map_err(|e| format!("KJOB_TEST_MAX_IN_FLIGHT={n}: {e}"))?;
        builder = builder.max_in_flight_per_partition(n);
    }
    if let Ok(batches) = std::env::var("KJOB_TEST_BATCHES") {
        builder = builder.batches_on(&batches);
    }
    if let Ok(callbacks) = std::env::var("KJOB_TEST_CALLBACK_TOPIC") {
        let record = record_path.clone();
        builder = builder.handle_on(&callbacks, move |_job: TestJob, ctx: JobContext| {
            let record = record.clone();
            async move {
                let r = ctx
                    .batch_report
                    .ok_or_else(|| JobError::invalid_input("a callback without its report"))?;
                append_line(
                    &record,
                    &format!(
                        "callback {} {} {} {}",
                        ctx.id, r.total, r.succeeded, r.dead_lettered
                    ),
                );
                if times {
                    append_line(&record, &format!("callbackat {}", kjob::clock::now_ms()));
                }
                Ok::<(), JobError>(())
            }
        });
    }
    if std::env::var("KJOB_TEST_SHARED_TIERS").is_ok_and(|v| v == "1") {
        let mut shared = kjob::SharedTiers::new();
        if std::env::var("KJOB_TEST_SHARED_DELAYS").is_ok_and(|v| v == "1") {
            shared = shared.delay_buckets();
        }
        builder = builder.shared_retry_tiers_with(shared);
    }
    if let Ok(second) = std::env::var("KJOB_TEST_SECOND_TOPIC") {
        let tiers = delays_ms("KJOB_TEST_SECOND_TIERS_MS", "1000,2000");
        builder = builder
            .handle_on(&second, handler.clone())
            .retry_for(&second, kjob::retry::RetryPolicy::tiers(tiers));
    }
    let leader_record = record_path.clone();
    let worker = builder
        .handle_on(&topic, handler)
        .concurrency(concurrency)
        .commit_interval(commit)
        .retry(kjob::retry::RetryPolicy::tiers(tiers))
        .shutdown_grace(Duration::from_secs(20))
        .delayed_jobs(delayed)
        .build()
        .map_err(|e| e.to_string())?;
    let stats = worker.stats();
    tokio::spawn(async move {
        let mut was = false;
        loop {
            let now = stats
                .schedule_leader
                .load(std::sync::atomic::Ordering::Acquire);
            if now && !was {
                let ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as i64)
                    .unwrap_or(0);
                append_line(
                    &leader_record,
                    &format!("leader {} {ms}", std::process::id()),
                );
            }
            was = now;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    worker.run().await.or_else(|e| {
        // A worker limit (KJOB_STOP_*) exits with its own status.
        eprintln!("{e}");
        std::process::exit(i32::from(e.exit_code()))
    })
}

/// A job's effect (a row) and its idempotency mark in one transaction, on
/// one of a few connections (a job takes whichever is free).
struct Effects {
    clients: Vec<tokio::sync::Mutex<tokio_postgres::Client>>,
    next: std::sync::atomic::AtomicUsize,
    markers: kjob::idempotency::PgMarkers,
    table: String,
}

impl Effects {
    async fn connect(url: &str, table: &str, connections: usize) -> Result<Self, String> {
        let markers = kjob::idempotency::PgMarkers::new(&format!("{table}_marks"))
            .map_err(|e| e.to_string())?;
        let mut clients = Vec::new();
        for _ in 0..connections.clamp(1, 16) {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .map_err(|e| format!("{url}: {e}"))?;
            tokio::spawn(conn);
            clients.push(tokio::sync::Mutex::new(client));
        }
        Ok(Self {
            clients,
            next: Default::default(),
            markers,
            table: table.to_string(),
        })
    }

    /// Writes the effect of job `id` unless its mark says it was written
    /// before; false for a duplicate.
    async fn once(&self, id: &str, seq: i64) -> Result<bool, JobError> {
        let db = |e: tokio_postgres::Error| JobError::server(format!("test effects: {e}"));
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut client = self.clients[n % self.clients.len()].lock().await;
        let tx = client.transaction().await.map_err(db)?;
        let first = matches!(
            self.markers.mark(&tx, id, "test").await.map_err(db)?,
            kjob::idempotency::Mark::First
        );
        if first {
            tx.execute(
                &format!("INSERT INTO {} (seq) VALUES ($1)", self.table),
                &[&seq],
            )
            .await
            .map_err(db)?;
        }
        tx.commit().await.map_err(db)?;
        Ok(first)
    }
}
