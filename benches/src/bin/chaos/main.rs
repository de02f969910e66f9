//! The chaos soak (`./dev chaos`): 100 000 jobs through worker processes on
//! the three-broker SASL_SSL cluster while workers are SIGKILLed, brokers
//! restart and the schema registry is down for 30 s. At the end: nothing
//! lost, every effect exactly once in PostgreSQL, committed offsets at the
//! end of every topic of the route, and a DLQ holding only the deliberate
//! poison.
//!
//! ```bash
//! ./dev chaos [--jobs 100000] [--rate 500] [--workers 4] [--kills 20] [--seed N]
//! ```
//!
//! `./dev chaos` brings up the cluster (`./dev stack up --brokers 3`) and
//! PostgreSQL, exports the cluster's client settings, and runs this binary.
//! What it breaks is its own: the cluster's nodes (restarted through
//! `./dev stack up --brokers 3`), a throwaway registry on 28081 with its
//! storage in a file (so the restart is an outage, not amnesia), and its
//! worker processes. The shared single-node stack and registry are never
//! touched. PostgreSQL is the shared one, with tables named `chaos_<run>_*`
//! (dropped at the end of a passing run, kept for inspection otherwise).
//! Worker logs stay in `.stack/cluster/chaos-<run>/`.
//!
//! The handler is idempotent through `PgMarkers`: one transaction writes the
//! marker (keyed by the job's domain key, its seq) and the effect row. Each
//! delivery is also logged (outside the transaction), which gives the
//! duplicate-delivery count.
//!
//! The same binary is the worker (`chaos worker`, started by the driver with
//! `CHAOS_*` variables), restarted by the driver's supervisor whenever it
//! exits, as a process manager would.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kjob::idempotency::{Mark, PgMarkers};
use kjob::retry::RetryPolicy;
use kjob::{JobContext, JobError, KafkaConfig, Producer, State, Worker};
use kjob_benches::scratch_registry::ScratchRegistry;
use kjob_benches::BenchJob;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use rdkafka::message::OwnedHeaders;

use tokio_postgres::NoTls;

mod checks;
mod fleet;
mod load;
use checks::*;
use fleet::*;
use load::*;

const PARTITIONS: i32 = 12;
/// Deliberate poison: this many records that are not Avro at all, and as
/// many valid jobs the handler refuses as invalid input.
const POISON_EACH: i64 = 10;
/// Seqs of the refused jobs start here, apart from the real ones.
const POISON_SEQ: i64 = 1_000_000_000;
const REGISTRY_PORT: u16 = 28081;
const REGISTRY_MANAGEMENT_PORT: u16 = 28091;
/// Retry tiers for the soak: short, so a job that met the registry outage
/// (a fresh worker with no cached schema) is back within a minute, and
/// enough attempts that a 30 s outage plus the registry's restart cannot
/// exhaust them (2 + 10 + 30 + 60 s before the fifth attempt).
const TIERS: [Duration; 4] = [
    Duration::from_secs(2),
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(60),
];
const MAX_ATTEMPTS: u32 = 8;

fn arg<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} needs a number")),
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("worker") {
        return worker().await;
    }
    const FLAGS: [&str; 7] = [
        "--jobs",
        "--rate",
        "--workers",
        "--kills",
        "--seed",
        "--registry-outage",
        "--help",
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(bad) = args
        .iter()
        .step_by(2)
        .find(|a| !FLAGS.contains(&a.as_str()) || *a == "--help")
    {
        anyhow::ensure!(
            bad == "--help",
            "unknown argument {bad:?}; use --jobs N --rate PER_SEC --workers N --kills N --seed N --registry-outage SECS"
        );
        println!("./dev chaos [--jobs 100000] [--rate 500] [--workers 4] [--kills 20] [--seed N] [--registry-outage 30]");
        return Ok(());
    }
    let settings = Settings {
        jobs: arg("--jobs", 100_000)?,
        rate: arg("--rate", 500)?,
        workers: arg("--workers", 4)?,
        kills: arg("--kills", 20)?,
        outage: Duration::from_secs(arg("--registry-outage", 30)?),
        seed: arg("--seed", rand::random::<u64>())?,
    };
    anyhow::ensure!(settings.jobs > 0 && settings.rate > 0 && settings.workers > 0);
    let passed = drive(settings).await?;
    if !passed {
        std::process::exit(1);
    }
    Ok(())
}

// ------------------------------------------------------------------ worker

/// A few PostgreSQL connections, handed out round-robin (a handler holds
/// one for its transaction).
struct Db {
    conns: Vec<tokio::sync::Mutex<tokio_postgres::Client>>,
    next: AtomicUsize,
    markers: PgMarkers,
    tables: String,
}

impl Db {
    async fn connect(url: &str, tables: &str, n: usize) -> anyhow::Result<Self> {
        let mut conns = Vec::new();
        for _ in 0..n {
            let (client, connection) = tokio_postgres::connect(url, NoTls)
                .await
                .with_context(|| format!("connecting to PostgreSQL at {url}"))?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    eprintln!("chaos worker: PostgreSQL connection ended: {e}");
                }
            });
            conns.push(tokio::sync::Mutex::new(client));
        }
        Ok(Self {
            conns,
            next: AtomicUsize::new(0),
            markers: PgMarkers::new(&format!("{tables}_markers"))?,
            tables: tables.to_string(),
        })
    }
}

/// The idempotent handler: the marker and the effect in one transaction.
async fn apply(job: BenchJob, ctx: JobContext, State(db): State<Arc<Db>>) -> Result<(), JobError> {
    if job.behaviour == "poison" {
        return Err(JobError::invalid_input(format!(
            "deliberate poison {}",
            job.key
        )));
    }
    let i = db.next.fetch_add(1, Ordering::Relaxed) % db.conns.len();
    let mut conn = db.conns[i].lock().await;
    let t = &db.tables;
    conn.execute(
        &format!("INSERT INTO {t}_deliveries (seq, attempt) VALUES ($1, $2)"),
        &[&job.seq, &i32::try_from(ctx.attempt).unwrap_or(i32::MAX)],
    )
    .await?;
    let tx = conn.transaction().await?;
    match db
        .markers
        .mark(&tx, &format!("seq:{}", job.seq), "chaos")
        .await?
    {
        Mark::Duplicate => {
            tx.execute(
                &format!("INSERT INTO {t}_skips (seq) VALUES ($1)"),
                &[&job.seq],
            )
            .await?;
        }
        Mark::First => {
            tx.execute(
                &format!("INSERT INTO {t}_effects (seq) VALUES ($1)"),
                &[&job.seq],
            )
            .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

async fn worker() -> anyhow::Result<()> {
    let _telemetry = kjob::telemetry::init()?;
    let topic = std::env::var("CHAOS_TOPIC")?;
    let group = std::env::var("CHAOS_GROUP")?;
    let tables = std::env::var("CHAOS_TABLES")?;
    let url = std::env::var("KJOB_DATABASE_URL")?;
    let db = Arc::new(Db::connect(&url, &tables, 8).await?);
    let worker = Worker::builder(KafkaConfig::from_env(), group)
        .state(db)
        .handle_on(&topic, apply)
        .retry(RetryPolicy::tiers(TIERS).max_attempts(MAX_ATTEMPTS))
        .concurrency(32)
        // Bound right after preflight, before the consumer subscribes: the
        // driver takes the registry down when it sees the line below
        // (`fresh_worker`), so this process has decoded nothing yet.
        .metrics_endpoint(SocketAddr::from(([127, 0, 0, 1], 0)))
        .build()?;
    let stats = worker.stats();
    tokio::spawn(async move {
        while stats.endpoint.get().is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        println!("chaos worker: preflight passed");
    });
    worker.run().await?;
    Ok(())
}

// ------------------------------------------------------------------ driver

async fn drive(s: Settings) -> anyhow::Result<bool> {
    let t0 = Instant::now();
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let mut config = KafkaConfig::from_env();
    anyhow::ensure!(
        config.security_protocol.is_some(),
        "KJOB_SECURITY_PROTOCOL is not set: run the soak with ./dev chaos (it targets the three-broker cluster)"
    );
    let dir = repo_root().join(format!(".stack/cluster/chaos-{run}"));
    std::fs::create_dir_all(&dir)?;
    println!(
        "chaos: run {run}, seed {}, {} jobs at {}/s, {} workers, {} SIGKILLs, 2 broker restarts, registry down {:?}; logs in {}",
        s.seed,
        s.jobs,
        s.rate,
        s.workers,
        s.kills,
        s.outage,
        dir.display()
    );

    // The registry this run may take down.
    let java = std::env::var("KJOB_CHAOS_REGISTRY_JAVA").unwrap_or_else(|_| "java".into());
    let apicurio = std::env::var("KJOB_CHAOS_APICURIO_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join(".stack/apicurio"));
    let mut registry = ScratchRegistry::new(
        java,
        apicurio,
        REGISTRY_PORT,
        REGISTRY_MANAGEMENT_PORT,
        dir.join("registry"),
    )?;
    registry.start()?;
    let took = registry.wait_answering(Duration::from_secs(120)).await?;
    println!(
        "chaos: throwaway registry answering at {} after {took:.1?}",
        registry.url()
    );
    config.schema_registry_url = registry.url();

    // PostgreSQL: this run's tables.
    let db_url = std::env::var("KJOB_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:54329/kjob".into());
    let tables = format!("chaos_{run}");
    let (pg, connection) = tokio_postgres::connect(&db_url, NoTls)
        .await
        .with_context(|| format!("connecting to {db_url}"))?;
    tokio::spawn(connection);
    PgMarkers::new(&format!("{tables}_markers"))?
        .create_table(&pg)
        .await?;
    pg.batch_execute(&format!(
        "CREATE TABLE {tables}_effects (seq bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE TABLE {tables}_deliveries (seq bigint NOT NULL, attempt int NOT NULL);
         CREATE TABLE {tables}_skips (seq bigint NOT NULL);"
    ))
    .await?;

    // The route, created up front by the admin.
    let topic = format!("chaos.{run}");
    let group = format!("chaos-{run}");
    let policy = RetryPolicy::tiers(TIERS).max_attempts(MAX_ATTEMPTS);
    let dlq = kjob::topics::dlq_topic(&topic);
    let tiers = policy.tier_topics(&topic);
    let mut route: Vec<(String, i32)> =
        vec![(topic.clone(), PARTITIONS), (dlq.clone(), PARTITIONS)];
    route.extend(tiers.iter().map(|t| (t.clone(), PARTITIONS)));
    kjob::topics::create_topics(&config, &route).await?;
    let producer = Producer::new(&config)?;
    producer.prepare::<BenchJob>().await?;

    // The fleet.
    let fleet = Arc::new(Fleet {
        pids: (0..s.workers).map(|_| AtomicU64::new(0)).collect(),
        stopping: AtomicBool::new(false),
        other_exits: AtomicUsize::new(0),
        starts: AtomicUsize::new(0),
    });
    let env = vec![
        ("CHAOS_TOPIC".to_string(), topic.clone()),
        ("CHAOS_GROUP".to_string(), group.clone()),
        ("CHAOS_TABLES".to_string(), tables.clone()),
        ("KJOB_DATABASE_URL".to_string(), db_url.clone()),
        ("KJOB_SCHEMA_REGISTRY_URL".to_string(), registry.url()),
        ("RUST_LOG".to_string(), "warn".to_string()),
    ];
    let supervisors: Vec<_> = (0..s.workers)
        .map(|slot| supervise(fleet.clone(), slot, env.clone(), dir.clone()))
        .collect();

    // The plan: when each fault happens, from a seeded generator.
    let feed_secs = s.jobs as f64 / s.rate as f64;
    let mut rng = StdRng::seed_from_u64(s.seed);
    let mut kills: Vec<(f64, usize)> = (0..s.kills)
        .map(|_| {
            (
                rng.random_range(5.0..feed_secs.max(6.0)),
                rng.random_range(0..s.workers),
            )
        })
        .collect();
    kills.sort_by(|a, b| a.0.total_cmp(&b.0));
    let brokers = [
        (
            rng.random_range(0.15..0.3) * feed_secs,
            rng.random_range(1..=3u32),
            "-TERM",
        ),
        (
            rng.random_range(0.7..0.85) * feed_secs,
            rng.random_range(1..=3u32),
            "-KILL",
        ),
    ];
    let outage_at = rng.random_range(0.4..0.55) * feed_secs;

    let feed_start = Instant::now();
    let at = move |secs: f64| feed_start + Duration::from_secs_f64(secs);

    let killer = {
        let fleet = fleet.clone();
        tokio::spawn(async move {
            let mut done = 0usize;
            for (when, slot) in kills {
                tokio::time::sleep_until(at(when).into()).await;
                // A slot between restarts has no process: take the next live
                // one. While none is (every worker restarting during the
                // registry outage, or the one found exits first), keep
                // trying rather than skip the kill.
                let give_up = Instant::now() + Duration::from_secs(90);
                let mut killed = None;
                while killed.is_none() && Instant::now() < give_up {
                    killed = (0..fleet.pids.len())
                        .map(|i| (slot + i) % fleet.pids.len())
                        .find(|i| fleet.pids[*i].load(Ordering::Acquire) != 0 && fleet.kill(*i));
                    if killed.is_none() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                match killed {
                    Some(i) => {
                        done += 1;
                        note(t0, format!("SIGKILL worker {i} ({done})"));
                    }
                    None => note(t0, "no live worker to SIGKILL for 90 s; skipped".into()),
                }
            }
            done
        })
    };
    let broker_task = {
        let (dir, config, topic) = (dir.clone(), config.clone(), topic.clone());
        tokio::spawn(async move {
            let mut out = Vec::new();
            for (when, node, sig) in brokers {
                tokio::time::sleep_until(at(when).into()).await;
                note(t0, format!("broker node {node}: kill {sig}"));
                let r = restart_broker(&config, &topic, node, sig, &dir).await;
                match &r {
                    Ok(b) => note(
                        t0,
                        format!(
                            "broker node {node} stopped {:.1} s after the signal, answering {:.1} s after its start",
                            b.stopped.as_secs_f64(),
                            b.answering.as_secs_f64()
                        ),
                    ),
                    Err(e) => {
                        note(t0, format!("broker node {node} restart failed: {e:#}"))
                    }
                }
                out.push((node, sig, r.map_err(|e| format!("{e:#}"))));
            }
            out
        })
    };
    let (registry_tx, registry_rx) = tokio::sync::oneshot::channel();
    let registry_task = {
        let (fleet, dir) = (fleet.clone(), dir.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(at(outage_at).into()).await;
            // Workers that have decoded a record keep its writer schema
            // cached and never notice the outage. So one worker is replaced
            // just before it: the registry goes down right after the new
            // process passed preflight, before it decoded anything, and its
            // jobs must wait for the registry (not walk the retry tiers).
            fresh_worker(&fleet, &dir, t0).await;
            registry.kill();
            let down = Instant::now();
            note(t0, "registry SIGKILLed".into());
            tokio::time::sleep(s.outage).await;
            let r = match registry.start() {
                Ok(()) => registry.wait_answering(Duration::from_secs(120)).await,
                Err(e) => Err(e),
            };
            let unavailable = down.elapsed();
            note(
                t0,
                format!(
                    "registry answering again, unavailable {:.1} s",
                    unavailable.as_secs_f64()
                ),
            );
            let _ = registry_tx.send(registry);
            r.map(|_| unavailable).map_err(|e| format!("{e:#}"))
        })
    };

    let retried = AtomicUsize::new(0);
    let poison_task = {
        let (producer, topic) = (producer.clone(), topic.clone());
        let over = Duration::from_secs_f64(feed_secs * 0.9);
        tokio::spawn(async move { poison(&producer, &topic, over).await })
    };
    feed(&producer, &topic, s.jobs, s.rate, &retried).await?;
    let fed = feed_start.elapsed();
    note(t0, format!("all {} jobs acknowledged", s.jobs));
    let (poison_keys, poison_retried) = poison_task.await??;
    retried.fetch_add(poison_retried, Ordering::Relaxed);
    let poison_keys: HashSet<String> = poison_keys.into_iter().collect();
    let kills_done = killer.await?;
    let broker_results = broker_task.await?;
    let outage = registry_task.await?;
    let faults_over = Instant::now();
    note(t0, "every fault is over".into());
    // Keep the registry alive until the end (its drop kills it).
    let _registry = registry_rx.await.ok();

    // Drain: every job's effect in PostgreSQL.
    let t = &tables;
    let drain_deadline = Instant::now() + Duration::from_secs(900);
    let mut distinct;
    loop {
        distinct = count(
            &pg,
            &format!(
                "SELECT count(DISTINCT seq) FROM {t}_effects WHERE seq < {}",
                s.jobs
            ),
        )
        .await?;
        if distinct == s.jobs || Instant::now() > drain_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let drained_at = Instant::now();
    let drain_after_feed = drained_at.duration_since(feed_start + fed);
    let drain_after_faults = drained_at.saturating_duration_since(faults_over);
    note(t0, format!("drained: {distinct} of {} effects", s.jobs));

    // Committed == end on the main topic and every tier; the DLQ filled.
    let mut route_topics = vec![topic.clone()];
    route_topics.extend(tiers.iter().cloned());
    let mut committed_ok = false;
    let mut ends = Vec::new();
    let commit_deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < commit_deadline {
        let (c, g) = (config.clone(), group.clone());
        let topics = route_topics.clone();
        let r = tokio::task::spawn_blocking(move || {
            topics
                .iter()
                .map(|t| committed_at_end(&c, &g, t))
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .await?;
        if let Ok(v) = r {
            committed_ok = v.iter().all(|(_, ok)| *ok);
            ends = v.iter().map(|(e, _)| *e).collect();
            if committed_ok {
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let dlq_deadline = Instant::now() + Duration::from_secs(120);
    let mut dlq_keys = Vec::new();
    while Instant::now() < dlq_deadline {
        let (c, d) = (config.clone(), dlq.clone());
        dlq_keys = tokio::task::spawn_blocking(move || keys_in(&c, &d)).await??;
        if dlq_keys.iter().collect::<HashSet<_>>().len() >= poison_keys.len() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // Stop the fleet: SIGTERM, as a deploy would.
    fleet.stopping.store(true, Ordering::Release);
    for slot in 0..s.workers {
        fleet.signal(slot, "-TERM");
    }
    for sup in supervisors {
        let _ = tokio::time::timeout(Duration::from_secs(40), sup).await;
    }

    // The verdict.
    let effects = count(&pg, &format!("SELECT count(*) FROM {t}_effects")).await?;
    let effect_seqs = count(&pg, &format!("SELECT count(DISTINCT seq) FROM {t}_effects")).await?;
    let stray = count(
        &pg,
        &format!("SELECT count(*) FROM {t}_effects WHERE seq >= {}", s.jobs),
    )
    .await?;
    let deliveries = count(&pg, &format!("SELECT count(*) FROM {t}_deliveries")).await?;
    let delivered = count(
        &pg,
        &format!("SELECT count(DISTINCT seq) FROM {t}_deliveries"),
    )
    .await?;
    let skips = count(&pg, &format!("SELECT count(*) FROM {t}_skips")).await?;
    let retried_attempts = count(
        &pg,
        &format!("SELECT count(*) FROM {t}_deliveries WHERE attempt > 1"),
    )
    .await?;
    let in_main = ends.first().copied().unwrap_or(0);
    let in_tiers: i64 = ends.iter().skip(1).sum();
    let dlq_set: HashSet<&String> = dlq_keys.iter().collect();
    let unexpected_dlq: Vec<&String> = dlq_keys
        .iter()
        .filter(|k| !poison_keys.contains(*k))
        .collect();
    let missing_poison = poison_keys.iter().filter(|k| !dlq_set.contains(k)).count();
    let lost = s.jobs - distinct;
    let exactly_once = effects == effect_seqs && stray == 0;

    let checks = [
        ("lost = 0", lost == 0, format!("{lost}")),
        (
            "effects exactly once in PostgreSQL",
            exactly_once,
            format!("{effects} effect rows, {effect_seqs} distinct jobs, {stray} for poison"),
        ),
        (
            "committed == end (main topic and every tier)",
            committed_ok,
            format!("main {in_main} records, tiers {in_tiers}"),
        ),
        (
            "DLQ holds only the deliberate poison",
            unexpected_dlq.is_empty() && missing_poison == 0,
            format!(
                "{} records, {} distinct keys, {} unexpected, {missing_poison} poison missing",
                dlq_keys.len(),
                dlq_set.len(),
                unexpected_dlq.len()
            ),
        ),
        (
            "the planned faults happened",
            kills_done == s.kills
                && broker_results.iter().all(|(_, _, r)| r.is_ok())
                && outage.is_ok(),
            format!("{kills_done} of {} SIGKILLs", s.kills),
        ),
    ];
    let passed = checks.iter().all(|c| c.1);

    println!("\n## chaos soak {run} (seed {})\n", s.seed);
    println!("| what | result |\n|---|---|");
    println!(
        "| jobs | {} at {}/s offered, fed in {:.1} s ({:.0}/s), {} enqueues retried by the feed |",
        s.jobs,
        s.rate,
        fed.as_secs_f64(),
        s.jobs as f64 / fed.as_secs_f64(),
        retried.load(Ordering::Relaxed)
    );
    println!(
        "| worker SIGKILLs | {kills_done}; {} worker starts, {} other exits (restarted) |",
        fleet.starts.load(Ordering::Relaxed),
        fleet.other_exits.load(Ordering::Relaxed)
    );
    for (node, sig, r) in &broker_results {
        let r = match r {
            Ok(b) => format!(
                "stopped {:.1} s after the signal, down 5 s, answering {:.1} s after its start",
                b.stopped.as_secs_f64(),
                b.answering.as_secs_f64()
            ),
            Err(e) => format!("FAILED: {e}"),
        };
        println!("| broker restart | node {node}, kill {sig}, {r} |");
    }
    match &outage {
        Ok(d) => println!(
            "| registry outage | unavailable {:.1} s (SIGKILL, {} s down, restart) |",
            d.as_secs_f64(),
            s.outage.as_secs()
        ),
        Err(e) => println!("| registry outage | FAILED: {e} |"),
    }
    println!("| deliveries | {deliveries} handler runs for {delivered} jobs: {} duplicate deliveries ({skips} stopped by the marker), {retried_attempts} retry attempts |", deliveries - delivered);
    println!(
        "| time to drain | {:.1} s after the last enqueue, {:.1} s after the last fault ended |",
        drain_after_feed.as_secs_f64(),
        drain_after_faults.as_secs_f64()
    );
    for (name, ok, detail) in &checks {
        println!("| {name} | {} ({detail}) |", if *ok { "yes" } else { "NO" });
    }
    println!("\nchaos: {}", if passed { "PASSED" } else { "FAILED" });

    if passed {
        pg.batch_execute(&format!(
            "DROP TABLE {t}_effects, {t}_deliveries, {t}_skips, {t}_markers"
        ))
        .await?;
        let _ = std::fs::remove_dir_all(dir.join("registry"));
        println!("chaos: worker logs in {}", dir.display());
    } else {
        println!(
            "chaos: kept tables {t}_* and {} (logs, registry) for inspection",
            dir.display()
        );
    }
    Ok(passed)
}
