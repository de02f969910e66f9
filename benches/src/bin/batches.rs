//! Batches: what counting costs, how soon the callback follows the last
//! job, and the newsletter under SIGKILLs.
//!
//! ```bash
//! ./dev stack up && cargo build --release -p kjob-benches --bin batches
//! target/release/batches --mode overhead --jobs 200000 --rounds 3
//! target/release/batches --mode latency --batches 30 --size 500
//! target/release/batches --mode newsletter --jobs 200000 --workers 3 --kills 5
//! target/release/batches --mode kills --rounds 4 --size 1000
//! ```
//!
//! * `overhead`: the same number of no-op jobs on two topics (8 partitions),
//!   one enqueued plainly, one into a single sealed batch; a worker (with
//!   batches on in both runs) handles each in a fresh group, alternating,
//!   `--rounds` times. Reports jobs/s and the ratio (target: the batch run
//!   within 10 %).
//! * `latency`: `--batches` batches of `--size` jobs one after the other;
//!   per batch, the time from the end of its last job's handler to the
//!   start of its callback's handler (target: p99 at most 1 s).
//! * `newsletter`: `--jobs` jobs (2 ms handlers) in one batch, served by
//!   `--workers` worker processes (this binary, `--mode worker`, 16
//!   concurrent handlers each), one of which is SIGKILLed and replaced
//!   every `--kill-every-ms` (3000), `--kills` times; reports
//!   how many times the callback ran and its counts (target: once, exact).
//! * `kills`: two worker processes at kjob's default group settings (no
//!   session set by hand); per round, one batch of `--size` jobs (50 ms
//!   handlers, 16 at a time per worker), and once its first snapshot names
//!   its partition, the process coordinating that partition is SIGKILLed and
//!   started again. Reports per round the time from the batch's last job
//!   to its callback and from the kill to the callback, then p50 and max
//!   (target: within the session timeout + 2 s of the kill).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kjob::batch::{BatchReport, When};
use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker, WorkerStats};
use kjob_benches::{arg, BenchJob};
use kjob_integration_tests::{create_topic, unique, wait_topics_exist};

fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let f = format!("--{name}");
    args.iter()
        .position(|a| *a == f)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

async fn enqueue_plain(p: &Producer, topic: &str, n: i64) -> anyhow::Result<()> {
    futures::stream::iter(0..n)
        .map(|i| async move { p.enqueue_to(topic, &BenchJob::new(i, 10_000)).await })
        .buffer_unordered(2000)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    Ok(())
}

async fn enqueue_batch(batch: &kjob::batch::Batch, topic: &str, n: i64) -> anyhow::Result<()> {
    futures::stream::iter(0..n)
        .map(|i| async move { batch.enqueue_to(topic, &BenchJob::new(i, 10_000)).await })
        .buffer_unordered(2000)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    batch.seal().await?;
    Ok(())
}

fn cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = stat.rsplit(')').next()?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Handles `n` jobs of `topic` with a no-op handler in a fresh group;
/// (jobs/s, CPU µs per job).
async fn run_worker(
    config: &KafkaConfig,
    batches: &str,
    topic: &str,
    n: u64,
) -> anyhow::Result<(f64, f64)> {
    let worker = Worker::builder(config.clone(), unique("bench-batch"))
        .batches_on(batches)
        .handle_on(topic, |_: BenchJob, _: JobContext| async {
            Ok::<(), JobError>(())
        })
        .build()?;
    let stats = worker.stats();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(worker.run_until(async {
        let _ = rx.await;
    }));
    let deadline = Instant::now() + Duration::from_secs(300);
    while WorkerStats::get(&stats.handled) == 0 {
        anyhow::ensure!(Instant::now() < deadline, "nothing handled");
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let (t0, c0) = (Instant::now(), cpu_secs());
    // Handled counts when a job is settled, just before a batch job's
    // completion is recorded (2 ms later at most): the in-flight bound
    // stalls the reading if recording falls behind, so it shows here.
    while WorkerStats::get(&stats.handled) < n {
        anyhow::ensure!(
            Instant::now() < deadline,
            "handled only {}",
            WorkerStats::get(&stats.handled)
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = match (c0, cpu_secs()) {
        (Some(a), Some(b)) => (b - a) * 1e6 / n as f64,
        _ => f64::NAN,
    };
    let _ = tx.send(());
    task.await??;
    Ok((n as f64 / secs, cpu))
}

async fn overhead(config: &KafkaConfig) -> anyhow::Result<()> {
    let n = arg("jobs", 200_000) as i64;
    let rounds = arg("rounds", 3);
    let (plain, batched, batches) = (
        unique("bench.batch.plain"),
        unique("bench.batch.in"),
        unique("bench.batches"),
    );
    create_topic(config, &plain, 8).await;
    create_topic(config, &batched, 8).await;
    // A first worker creates the batch topics.
    run_once_for_topics(config, &batches, &plain).await?;
    let p = Producer::new(config)?;
    enqueue_plain(&p, &plain, n).await?;
    let batch = p.batch("bench-overhead")?.topic(&batches);
    enqueue_batch(&batch, &batched, n).await?;
    println!("{n} jobs on each topic; worker with batches on in every run");
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let x = run_worker(config, &batches, &plain, n as u64).await?;
        let y = run_worker(config, &batches, &batched, n as u64).await?;
        println!(
            "round {r}: plain {:.0} jobs/s ({:.2} µs CPU/job), in a batch {:.0} jobs/s ({:.2} µs CPU/job): ratio {:.3}",
            x.0, x.1, y.0, y.1, y.0 / x.0
        );
        a.push(x.0);
        b.push(y.0);
    }
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (ma, mb) = (a[a.len() / 2], b[b.len() / 2]);
    println!(
        "median: plain {ma:.0} jobs/s, in a batch {mb:.0} jobs/s: ratio {:.3} (overhead {:.1} %)",
        mb / ma,
        (1.0 - mb / ma) * 100.0
    );
    Ok(())
}

/// Starts and stops a worker once so that it creates the batch topics.
async fn run_once_for_topics(
    config: &KafkaConfig,
    batches: &str,
    topic: &str,
) -> anyhow::Result<()> {
    let w = Worker::builder(config.clone(), unique("bench-batch-setup"))
        .batches_on(batches)
        .handle_on(topic, |_: BenchJob, _: JobContext| async {
            Ok::<(), JobError>(())
        })
        .build()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(w.run_until(async {
        let _ = rx.await;
    }));
    wait_topics_exist(
        config,
        &[batches.to_string(), kjob::batch::state_topic(batches)],
        "the batch topics",
    )
    .await;
    let _ = tx.send(());
    task.await??;
    Ok(())
}

async fn latency(config: &KafkaConfig) -> anyhow::Result<()> {
    let (count, size) = (arg("batches", 30) as usize, arg("size", 500) as i64);
    let (jobs, callbacks, batches) = (
        unique("bench.batch.jobs"),
        unique("bench.batch.cb"),
        unique("bench.batches"),
    );
    create_topic(config, &jobs, 8).await;
    create_topic(config, &callbacks, 1).await;
    let last_end = Arc::new(Mutex::new(None::<Instant>));
    let started: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let (le, st) = (last_end.clone(), started.clone());
    let w = Worker::builder(config.clone(), unique("bench-batch-lat"))
        .batches_on(&batches)
        .handle_on(&jobs, move |_: BenchJob, _: JobContext| {
            let le = le.clone();
            async move {
                *le.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                Ok::<(), JobError>(())
            }
        })
        .handle_on(&callbacks, move |_: BenchJob, ctx: JobContext| {
            let st = st.clone();
            async move {
                let batch = ctx.batch_report.map(|r| r.batch).unwrap_or_default();
                st.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((batch, Instant::now()));
                Ok::<(), JobError>(())
            }
        })
        .build()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(w.run_until(async {
        let _ = rx.await;
    }));
    wait_topics_exist(
        config,
        &[batches.clone(), kjob::batch::state_topic(&batches)],
        "the batch topics",
    )
    .await;
    let p = Producer::new(config)?;
    let mut lat = Vec::new();
    for i in 0..count {
        let id = format!("lat-{i}-{}", uuid::Uuid::new_v4().simple());
        let b = p.batch(&id)?.topic(&batches).callback_to(
            When::Complete,
            &callbacks,
            BenchJob::new(0, 1),
        );
        enqueue_batch(&b, &jobs, size).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let at = loop {
            anyhow::ensure!(Instant::now() < deadline, "no callback for {id}");
            if let Some((_, t)) = started
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .find(|(b, _)| *b == id)
            {
                break *t;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let end = last_end
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or(at);
        lat.push(at.saturating_duration_since(end).as_secs_f64() * 1000.0);
    }
    let _ = tx.send(());
    task.await??;
    lat.sort_by(f64::total_cmp);
    let pct = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize];
    println!(
        "{count} batches of {size} jobs: last job finished -> callback handled: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        pct(0.5),
        pct(0.99),
        lat[lat.len() - 1]
    );
    Ok(())
}

/// `--mode worker`: one newsletter worker process (see the module docs).
/// With `BENCH_DEFAULTS=1` it keeps kjob's own group settings and its
/// handlers take 50 ms, printing `done <seq> <epoch ms>` per job and the
/// epoch ms after each callback line (`--mode kills`).
async fn worker_process() -> anyhow::Result<()> {
    let topic = std::env::var("BENCH_TOPIC")?;
    let callbacks = std::env::var("BENCH_CALLBACKS")?;
    let batches = std::env::var("BENCH_BATCHES")?;
    let group = std::env::var("BENCH_GROUP")?;
    let defaults = std::env::var("BENCH_DEFAULTS").is_ok_and(|v| v == "1");
    let mut config = KafkaConfig::from_env();
    if !defaults {
        config = config.set("session.timeout.ms", "6000");
    }
    let handler_ms = if defaults { 50 } else { 2 };
    Worker::builder(config, group)
        .batches_on(&batches)
        .concurrency(16)
        .handle_on(&topic, move |job: BenchJob, _: JobContext| async move {
            tokio::time::sleep(Duration::from_millis(handler_ms)).await;
            if defaults {
                println!("done {} {}", job.seq, kjob::clock::now_ms());
            }
            Ok::<(), JobError>(())
        })
        .handle_on(&callbacks, move |_: BenchJob, ctx: JobContext| async move {
            if let Some(r) = ctx.batch_report {
                let at = if defaults {
                    format!(" {}", kjob::clock::now_ms())
                } else {
                    String::new()
                };
                println!(
                    "callback {} {} {} {} {}{at}",
                    ctx.id, r.batch, r.total, r.succeeded, r.dead_lettered
                );
            }
            Ok::<(), JobError>(())
        })
        .build()?
        .run()
        .await?;
    Ok(())
}

/// The worker processes of the `newsletter` and `kills` modes: this
/// binary in `--mode worker`, each writing its stdout to `w<i>` in a
/// directory of its own.
struct Workers {
    exe: std::path::PathBuf,
    out: std::path::PathBuf,
    env: Vec<(&'static str, String)>,
    started: usize,
}

impl Workers {
    fn new(out: &str, env: Vec<(&'static str, String)>) -> anyhow::Result<Self> {
        let out = std::env::temp_dir().join(unique(out));
        std::fs::create_dir_all(&out)?;
        Ok(Self {
            exe: std::env::current_exe()?,
            out,
            env,
            started: 0,
        })
    }

    /// Starts one more worker process.
    fn spawn(&mut self) -> anyhow::Result<std::process::Child> {
        let log = std::fs::File::create(self.out.join(format!("w{}", self.started)))?;
        self.started += 1;
        Ok(std::process::Command::new(&self.exe)
            .args(["--mode", "worker"])
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("RUST_LOG", "off")
            .stdout(log)
            .spawn()?)
    }

    /// Every line every worker printed so far.
    fn lines(&self) -> Vec<String> {
        (0..self.started)
            .flat_map(|i| {
                std::fs::read_to_string(self.out.join(format!("w{i}")))
                    .unwrap_or_default()
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

async fn newsletter(config: &KafkaConfig) -> anyhow::Result<()> {
    let n = arg("jobs", 200_000) as i64;
    let (workers, kills) = (arg("workers", 3) as usize, arg("kills", 5) as usize);
    let (topic, callbacks, batches, group) = (
        unique("bench.news"),
        unique("bench.news.cb"),
        unique("bench.batches"),
        unique("bench-news"),
    );
    create_topic(config, &topic, 12).await;
    create_topic(config, &callbacks, 1).await;
    let mut procs = Workers::new(
        "newsletter",
        vec![
            ("BENCH_TOPIC", topic.clone()),
            ("BENCH_CALLBACKS", callbacks.clone()),
            ("BENCH_BATCHES", batches.clone()),
            ("BENCH_GROUP", group.clone()),
        ],
    )?;
    let mut running: Vec<std::process::Child> = (0..workers)
        .map(|_| procs.spawn())
        .collect::<anyhow::Result<_>>()?;
    wait_topics_exist(
        config,
        &[batches.clone(), kjob::batch::state_topic(&batches)],
        "the batch topics",
    )
    .await;
    let p = Producer::new(config)?;
    let id = format!("newsletter-{}", uuid::Uuid::new_v4().simple());
    let b =
        p.batch(&id)?
            .topic(&batches)
            .callback_to(When::Complete, &callbacks, BenchJob::new(0, 1));
    let t0 = Instant::now();
    enqueue_batch(&b, &topic, n).await?;
    println!(
        "{n} jobs enqueued into {id} in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    for k in 0..kills {
        tokio::time::sleep(Duration::from_millis(arg("kill-every-ms", 3000))).await;
        let finished = finished_of(config, &batches, &id);
        println!(
            "SIGKILL {} at {finished} of {n} finished (last snapshot)",
            k + 1
        );
        let mut victim = running.remove(k % running.len());
        let _ = victim.kill();
        victim.wait()?;
        running.push(procs.spawn()?);
    }
    let lines = || -> Vec<String> {
        procs
            .lines()
            .into_iter()
            .filter(|l| l.starts_with("callback "))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    while lines().is_empty() {
        anyhow::ensure!(Instant::now() < deadline, "no callback after 10 minutes");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("callback after {:.1} s", t0.elapsed().as_secs_f64());
    tokio::time::sleep(Duration::from_secs(5)).await;
    for mut w in running {
        let _ = w.kill();
        let _ = w.wait();
    }
    let seen = lines();
    let written = kjob::topics::read_topic(config, &callbacks)?.map_or(0, |v| v.len());
    let report = BatchReport {
        batch: id.clone(),
        total: n as u64,
        succeeded: n as u64,
        dead_lettered: 0,
    };
    let want = format!(
        "callback {} {} {} {} {}",
        kjob::batch::callback_id(&id, When::Complete),
        report.batch,
        report.total,
        report.succeeded,
        report.dead_lettered
    );
    println!(
        "{workers} workers, {kills} SIGKILLs: callback records written {written}, handler runs {}, exact counts: {}",
        seen.len(),
        seen.iter().all(|l| *l == want)
    );
    Ok(())
}

/// `--mode kills` (see the module docs).
async fn kills(config: &KafkaConfig) -> anyhow::Result<()> {
    let (rounds, size) = (arg("rounds", 4) as i64, arg("size", 1000) as i64);
    let (topic, callbacks, batches, group) = (
        unique("bench.kills"),
        unique("bench.kills.cb"),
        unique("bench.kbatches"),
        unique("bench-kills"),
    );
    create_topic(config, &topic, 6).await;
    create_topic(config, &callbacks, 1).await;
    let mut procs = Workers::new(
        "batch-kills",
        vec![
            ("BENCH_TOPIC", topic.clone()),
            ("BENCH_CALLBACKS", callbacks.clone()),
            ("BENCH_BATCHES", batches.clone()),
            ("BENCH_GROUP", group.clone()),
            ("BENCH_DEFAULTS", "1".into()),
        ],
    )?;
    let mut running: Vec<std::process::Child> = vec![procs.spawn()?, procs.spawn()?];
    wait_topics_exist(
        config,
        &[batches.clone(), kjob::batch::state_topic(&batches)],
        "the batch topics",
    )
    .await;
    let coordinator = kjob::batch::coordinator_group(&batches);
    let p = Producer::new(config)?;
    let (mut after_last, mut after_kill) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        // Both processes hold partitions of the coordinator group: the
        // group has settled since the last kill.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let groups = kjob_ops::groups::describe_groups(config, Some(&coordinator))?;
            let holding = groups
                .iter()
                .flat_map(|g| g.members.iter())
                .filter(|m| !m.assignment.is_empty())
                .count();
            if holding == 2 {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the coordinator group did not settle"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let id = format!("kills-{r}-{}", uuid::Uuid::new_v4().simple());
        let b = p.batch(&id)?.topic(&batches).callback_to(
            When::Complete,
            &callbacks,
            BenchJob::new(0, 1),
        );
        let base = (r + 1) * 1_000_000;
        futures::stream::iter(base..base + size)
            .map(|i| {
                let b = &b;
                let topic = &topic;
                async move { b.enqueue_to(topic, &BenchJob::new(i, 1000)).await }
            })
            .buffer_unordered(500)
            .try_for_each(|_| async { Ok(()) })
            .await?;
        b.seal().await?;
        let partition = loop {
            let states = kjob::batch::read_states(config, &batches, None)?;
            if let Some(s) = states.get(&id) {
                break s.partition;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let owner = kjob_ops::groups::describe_groups(config, Some(&coordinator))?
            .iter()
            .flat_map(|g| g.members.iter())
            .find(|m| {
                m.assignment
                    .iter()
                    .any(|(t, ps)| *t == batches && ps.contains(&partition))
            })
            .and_then(|m| m.client_id.rsplit('-').next()?.parse::<u32>().ok());
        let Some(victim) = running.iter().position(|c| Some(c.id()) == owner) else {
            anyhow::bail!("round {r}: no process coordinates partition {partition}");
        };
        let finished = finished_of(config, &batches, &id);
        let mut killed = running.remove(victim);
        let killed_ms = kjob::clock::now_ms();
        let _ = killed.kill();
        killed.wait()?;
        running.push(procs.spawn()?);
        let deadline = Instant::now() + Duration::from_secs(300);
        let want = kjob::batch::callback_id(&id, When::Complete);
        let callback_ms = loop {
            let found = procs.lines().iter().find_map(|l| {
                let rest = l.strip_prefix("callback ")?;
                let f: Vec<&str> = rest.split_whitespace().collect();
                (f.first() == Some(&want.as_str())).then(|| f.last()?.parse::<i64>().ok())?
            });
            if let Some(ms) = found {
                break ms;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "round {r}: no callback in 5 minutes"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let last_ms = procs
            .lines()
            .iter()
            .filter_map(|l| {
                let mut f = l.strip_prefix("done ")?.split_whitespace();
                let seq: i64 = f.next()?.parse().ok()?;
                let ms: i64 = f.next()?.parse().ok()?;
                (base..base + size).contains(&seq).then_some(ms)
            })
            .max()
            .unwrap_or(killed_ms);
        let (l, k) = (callback_ms - last_ms, callback_ms - killed_ms);
        println!(
            "round {}: killed the coordinator at {finished} of {size} finished; last job -> callback {:.2} s, kill -> callback {:.2} s",
            r + 1,
            l as f64 / 1e3,
            k as f64 / 1e3
        );
        after_last.push(l);
        after_kill.push(k);
    }
    for mut w in running {
        let _ = w.kill();
        let _ = w.wait();
    }
    let summary = |v: &mut Vec<i64>| {
        v.sort_unstable();
        (v[v.len() / 2] as f64 / 1e3, v[v.len() - 1] as f64 / 1e3)
    };
    let (l50, lmax) = summary(&mut after_last);
    let (k50, kmax) = summary(&mut after_kill);
    println!(
        "{rounds} kills: last job -> callback p50 {l50:.2} s, max {lmax:.2} s; kill -> callback p50 {k50:.2} s, max {kmax:.2} s"
    );
    Ok(())
}

/// The batch's finished count in its last snapshot (0 before the first).
fn finished_of(config: &KafkaConfig, batches: &str, id: &str) -> u64 {
    kjob::topics::read_topic(config, &kjob::batch::state_topic(batches))
        .ok()
        .flatten()
        .unwrap_or_default()
        .iter()
        .filter_map(|m| {
            use rdkafka::Message as _;
            serde_json::from_slice::<kjob::batch::BatchState>(m.payload()?).ok()
        })
        .filter(|s| s.batch == id)
        .map(|s| s.finished())
        .next_back()
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    if flag("mode").as_deref() == Some("worker") {
        return worker_process().await;
    }
    let config = KafkaConfig::from_env();
    match flag("mode").as_deref().unwrap_or("overhead") {
        "overhead" => overhead(&config).await,
        "latency" => latency(&config).await,
        "newsletter" => newsletter(&config).await,
        "kills" => kills(&config).await,
        other => {
            anyhow::bail!("unknown --mode {other}: overhead, latency, newsletter, kills or worker")
        }
    }
}
