//! What a worker with many routes costs at the group: join and rebalance
//! time and worker RSS, per-route topics against shared tiers and buckets.
//!
//! ```bash
//! ./dev stack up && cargo run --release -p kjob-benches --bin topology -- [RUNS]
//! ```
//!
//! Cells, each in fresh topics and fresh groups: 3 routes with topics per
//! route (today's demo-sized worker, the baseline), 20 routes with topics
//! per route, 20 routes sharing tiers and buckets (3 partitions,
//! 1-partition DLQs). Every route has 6 partitions and tiers 1 s, 5 s,
//! 15 s; route 0 takes delayed jobs. Each worker is a child process (this
//! binary with `--child`), so its RSS is its own.
//!
//! Per cell: the partitions the layout created (DLQs included) and those
//! the group consumes; **join**, from the first
//! worker's spawn (its topics already exist) to the group being `Stable`
//! with every consumed partition assigned; **rebalance**, from a second
//! worker's spawn to the group being `Stable` with both members assigned;
//! and the first worker's RSS once both are in.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use kjob::retry::RetryPolicy;
use kjob::{JobContext, JobError, KafkaConfig, SharedTiers, Worker};
use kjob_benches::BenchJob;

const PARTITIONS: i32 = 6;

fn tiers() -> RetryPolicy {
    RetryPolicy::tiers([
        Duration::from_secs(1),
        Duration::from_secs(5),
        Duration::from_secs(15),
    ])
}

/// The child: a worker on `routes` routes named `<prefix>.r<i>`, shared or
/// not, until killed.
async fn child(prefix: &str, routes: usize, shared: bool, group: &str) -> anyhow::Result<()> {
    let mut b = Worker::builder(KafkaConfig::from_env(), group)
        .retry(tiers())
        .delayed_jobs_on(&format!("{prefix}.r0"));
    for i in 0..routes {
        b = b.handle_on(
            &format!("{prefix}.r{i}"),
            |_j: BenchJob, _c: JobContext| async { Ok::<(), JobError>(()) },
        );
    }
    if shared {
        b = b
            .shared_retry_tiers_with(
                SharedTiers::new()
                    .namespace(&format!("{prefix}.shared"))
                    .delay_buckets()
                    .partitions(3),
            )
            .dlq_partitions(1);
    }
    b.build()?.run().await?;
    Ok(())
}

fn spawn(prefix: &str, routes: usize, shared: bool, group: &str) -> anyhow::Result<Child> {
    Command::new(std::env::current_exe()?)
        .args([
            "--child",
            prefix,
            &routes.to_string(),
            if shared { "shared" } else { "own" },
            group,
        ])
        .env("RUST_LOG", "error")
        .spawn()
        .context("spawning a worker")
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Waits until `group` is Stable with `members` members, each assigned,
/// and `partitions` partitions assigned in all; returns how long it took.
fn wait_stable(
    config: &KafkaConfig,
    group: &str,
    members: usize,
    partitions: usize,
    since: Instant,
) -> anyhow::Result<Duration> {
    let deadline = since + Duration::from_secs(120);
    loop {
        let groups = kjob_ops::groups::describe_groups(config, Some(group)).unwrap_or_default();
        let done = groups.iter().any(|g| {
            g.state == "Stable"
                && g.members.len() == members
                && g.members.iter().all(|m| !m.assignment.is_empty())
                && g.members
                    .iter()
                    .map(|m| m.assignment.iter().map(|(_, p)| p.len()).sum::<usize>())
                    .sum::<usize>()
                    == partitions
        });
        if done {
            return Ok(since.elapsed());
        }
        if Instant::now() > deadline {
            bail!("group {group} not stable with {members} members after 120 s: {groups:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// The partitions a cell's group consumes: each route's main topic and,
/// per route, its three tiers and route 0's seven delay buckets at the main
/// topic's count; shared, three tiers and seven buckets of 3.
fn expected(cell: &Cell) -> usize {
    let p = PARTITIONS as usize;
    match cell.shared {
        false => cell.routes * p * (1 + 3) + 7 * p,
        true => cell.routes * p + (3 + 7) * 3,
    }
}

struct Cell {
    name: &'static str,
    routes: usize,
    shared: bool,
}

async fn measure(config: &KafkaConfig, cell: &Cell) -> anyhow::Result<()> {
    let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let prefix = format!("kjob.bench.topo.{id}");
    let mains: Vec<(String, i32)> = (0..cell.routes)
        .map(|i| (format!("{prefix}.r{i}"), PARTITIONS))
        .collect();
    kjob::topics::create_topics(config, &mains).await?;
    // A first worker creates the layout's topics; the timed ones find them.
    let setup_group = format!("topo-{id}");
    let setup = spawn(&prefix, cell.routes, cell.shared, &setup_group)?;
    let partitions = expected(cell);
    let created = wait_stable(config, &setup_group, 1, partitions, Instant::now());
    kill(setup);
    created.context("the first worker")?;
    // The timed group (the shared topics are named after a namespace of
    // the cell, not after a group).
    let group = format!("topo-{id}-timed");
    let since = Instant::now();
    let a = spawn(&prefix, cell.routes, cell.shared, &group)?;
    let join = wait_stable(config, &group, 1, partitions, since)?;
    let since = Instant::now();
    let b = spawn(&prefix, cell.routes, cell.shared, &group)?;
    let rebalance = wait_stable(config, &group, 2, partitions, since)?;
    std::thread::sleep(Duration::from_secs(2));
    let rss = rss_kib(a.id()).unwrap_or(0);
    kill(b);
    kill(a);
    // Every partition the layout created for real: the routes' topics and
    // the shared ones (named after `<prefix>.shared`), DLQs included.
    let mine: Vec<String> = kjob::topics::list_topics(config)?
        .into_iter()
        .filter(|t| t.starts_with(&format!("{prefix}.")))
        .collect();
    let created: usize = kjob::topics::partition_counts(config, &mine)?
        .into_iter()
        .flatten()
        .sum();
    println!(
        "| {} | {} | {created} | {partitions} | {} ms | {} ms | {:.1} MiB |",
        cell.name,
        cell.routes,
        join.as_millis(),
        rebalance.as_millis(),
        rss as f64 / 1024.0
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        let [_, _, prefix, routes, layout, group] = &args[..] else {
            bail!("--child PREFIX ROUTES own|shared GROUP");
        };
        // `BENCH_LOG=1`: the worker's own log (RUST_LOG), to see its phases.
        let _telemetry = match std::env::var("BENCH_LOG").is_ok_and(|v| v == "1") {
            true => Some(kjob::telemetry::init()?),
            false => {
                kjob_benches::no_logs();
                None
            }
        };
        return child(prefix, routes.parse()?, layout == "shared", group).await;
    }
    let runs: usize = args.get(1).map(|r| r.parse()).transpose()?.unwrap_or(3);
    let config = KafkaConfig::from_env();
    let cells = [
        Cell {
            name: "per route (baseline)",
            routes: 3,
            shared: false,
        },
        Cell {
            name: "per route",
            routes: 20,
            shared: false,
        },
        Cell {
            name: "shared tiers and buckets",
            routes: 20,
            shared: true,
        },
    ];
    println!("| layout | routes | partitions created | consumed | join | rebalance (second worker) | first worker RSS |");
    println!("|---|---|---|---|---|---|---|");
    for _ in 0..runs {
        for cell in &cells {
            measure(&config, cell).await?;
        }
    }
    Ok(())
}
