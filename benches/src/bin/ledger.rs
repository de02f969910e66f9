//! A strictly ordered ledger under failures and SIGKILLs: does a key flow
//! again as soon as its failed posting is done, is a copy of a finished
//! posting skipped, and is each posting dead-lettered once?
//!
//! ```bash
//! ./dev stack up && cargo run --release -p kjob-benches --bin ledger
//! ```
//!
//! Two worker processes (this binary re-run as `ledger worker`, each with a
//! static-member id) serve one `strict_order` route on 4 partitions with
//! tiers of 2 s and 5 s (3 attempts). The driver sends `--postings` (7 000)
//! postings over `--accounts` (200) accounts at `--rate` (100) per second;
//! `--fail-pct` (10) of them fail their first attempt, 1 in 200 fails every
//! attempt (dead-lettered). Every `--kill-every` (15) s one worker is
//! SIGKILLed and started again 1 s later, `--kills` (4) times.
//!
//! Each worker prints `S <seq> <attempt> <µs>` as an attempt starts and
//! `E <seq> <attempt> <ok|fail> <µs>` as it ends (epoch µs, one machine).
//! From those and the DLQ topic the driver reports:
//! * **inversions**: postings that started before the account's previous
//!   posting had finished (succeeded or failed its last attempt);
//! * **head in retry**: for a posting whose first attempt failed, the time
//!   from that failure to its finish;
//! * **held**: for a posting enqueued while its account's previous posting
//!   was unfinished, enqueue → first start; and **late after its turn**:
//!   first start minus the later of its enqueue and the previous posting's
//!   finish (0 when it runs the moment its turn comes);
//! * **copies re-run**: attempts started after the posting had already
//!   succeeded; **dead letters per dead job**, from the DLQ topic.
//!
//! The issue's bound: held p99 ≤ head-in-retry p99 + 1 s, and one dead
//! letter per job. `LEDGER_DEBUG=1` prints, to stderr, every posting that
//! started more than 1 s after its turn, with its and its predecessor's
//! attempts (ms relative to the predecessor's finish).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kjob::{KafkaConfig, Producer};
use kjob_benches::{arg, BenchJob};
use rand::{Rng as _, SeedableRng as _};
use rdkafka::Message as _;

const PARTITIONS: i32 = 4;
const ATTEMPTS: u32 = 3;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kjob_benches::no_logs();
    if std::env::args().nth(1).as_deref() == Some("worker") {
        return worker().await;
    }
    drive().await
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The worker process: `behaviour` says how a posting's attempts end.
async fn worker() -> anyhow::Result<()> {
    use kjob::retry::RetryPolicy;
    use kjob::{JobContext, JobError, Worker};
    let topic = std::env::var("BENCH_TOPIC")?;
    let group = std::env::var("BENCH_GROUP")?;
    let handler = |job: BenchJob, ctx: JobContext| async move {
        println!("S {} {} {}", job.seq, ctx.attempt, now_us());
        // A posting's write: a few milliseconds downstream.
        tokio::time::sleep(Duration::from_millis(3)).await;
        let fails = match job.behaviour.as_str() {
            "fail-once" => ctx.attempt == 1,
            "always-fails" => true,
            _ => false,
        };
        let end = if fails { "fail" } else { "ok" };
        println!("E {} {} {end} {}", job.seq, ctx.attempt, now_us());
        if fails {
            return Err(JobError::server("the ledger's database answered 503"));
        }
        Ok(())
    };
    Worker::builder(KafkaConfig::from_env(), group)
        .handle_on(&topic, handler)
        .retry(
            RetryPolicy::tiers([Duration::from_secs(2), Duration::from_secs(5)])
                .max_attempts(ATTEMPTS),
        )
        .strict_order(&topic)
        .build()?
        .run()
        .await?;
    Ok(())
}

/// One line a worker printed.
enum Line {
    Start {
        seq: i64,
        us: i64,
    },
    End {
        seq: i64,
        attempt: u32,
        ok: bool,
        us: i64,
    },
}

fn parse(line: &str) -> Option<Line> {
    let f: Vec<&str> = line.split_whitespace().collect();
    match f.as_slice() {
        ["S", seq, _attempt, us] => Some(Line::Start {
            seq: seq.parse().ok()?,
            us: us.parse().ok()?,
        }),
        ["E", seq, attempt, end, us] => Some(Line::End {
            seq: seq.parse().ok()?,
            attempt: attempt.parse().ok()?,
            ok: *end == "ok",
            us: us.parse().ok()?,
        }),
        _ => None,
    }
}

fn spawn(
    topic: &str,
    group: &str,
    instance: &str,
    tx: &mpsc::Sender<String>,
) -> anyhow::Result<Child> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("worker")
        .env("BENCH_TOPIC", topic)
        .env("BENCH_GROUP", group)
        .env("KJOB_INSTANCE_ID", instance)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting a worker process")?;
    let out = child.stdout.take().context("the worker's stdout")?;
    let tx = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    Ok(child)
}

fn kill(child: &mut Child) {
    // SIGKILL: no revoke, no final commit.
    let _ = child.kill();
    let _ = child.wait();
}

/// p50 / p99 / max of `v` in ms, and how many.
fn summary(mut v: Vec<i64>) -> String {
    v.sort_unstable();
    let Some(&max) = v.last() else {
        return "none".into();
    };
    let pct = |p: f64| v[((v.len() - 1) as f64 * p) as usize] as f64 / 1_000.0;
    format!(
        "{:.0} / {:.0} / {:.0} ms ({})",
        pct(0.5),
        pct(0.99),
        max as f64 / 1_000.0,
        v.len()
    )
}

fn p99(mut v: Vec<i64>) -> i64 {
    v.sort_unstable();
    v.get(((v.len().max(1) - 1) as f64 * 0.99) as usize)
        .copied()
        .unwrap_or(0)
}

/// What the workers printed about one posting.
#[derive(Default)]
struct Seen {
    starts: Vec<i64>,
    /// The first failure's end.
    first_fail: Option<i64>,
    /// The first success's end, or the end of a last attempt that failed.
    finished: Option<i64>,
}

async fn drive() -> anyhow::Result<()> {
    let postings = arg("postings", 7_000) as i64;
    let accounts = arg("accounts", 200) as i64;
    let rate = arg("rate", 100);
    let fail_pct = arg("fail-pct", 10);
    let kill_every = Duration::from_secs(arg("kill-every", 15));
    let kills = arg("kills", 4);
    let config = KafkaConfig::from_env();
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("bench.ledger.{}", &suffix[..8]);
    let group = format!("bench-ledger-{}", &suffix[..8]);
    kjob::topics::create_topics(&config, &[(topic.clone(), PARTITIONS)])
        .await
        .context("creating the bench topic")?;
    let producer = Producer::new(&config)?;
    producer.prepare::<BenchJob>().await?;
    let (tx, rx) = mpsc::channel::<String>();
    let ids = [format!("{group}-a"), format!("{group}-b")];
    let mut workers = [
        spawn(&topic, &group, &ids[0], &tx)?,
        spawn(&topic, &group, &ids[1], &tx)?,
    ];
    // Both joined and running: one probe per account comes back.
    for a in 0..accounts {
        let probe = BenchJob {
            key: format!("acct{a}"),
            seq: -1 - a,
            behaviour: "ok".into(),
        };
        producer.enqueue_to(&topic, &probe).await?;
    }
    let mut probes = 0;
    let warm = Instant::now();
    while probes < accounts {
        anyhow::ensure!(
            warm.elapsed() < Duration::from_secs(90),
            "the workers did not start"
        );
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
            probes += i64::from(matches!(parse(&l), Some(Line::End { seq, .. }) if seq < 0));
        }
    }

    let mut rng = rand::rngs::StdRng::seed_from_u64(55);
    let behaviours: Vec<&str> = (0..postings)
        .map(|_| {
            if rng.random_range(0..200) == 0 {
                "always-fails"
            } else if rng.random_range(0..100) < fail_pct {
                "fail-once"
            } else {
                "ok"
            }
        })
        .collect();
    let mut lines = Vec::new();
    let mut enqueued = vec![0i64; postings as usize];
    let tick = Duration::from_micros(1_000_000 / rate.max(1));
    let started = Instant::now();
    let mut next_kill = kill_every;
    let mut killed = 0;
    let mut restart: Option<(usize, Instant)> = None;
    let mut kill_times = Vec::new();
    for seq in 0..postings {
        let at = tick * seq as u32;
        if let Some(wait) = at.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        if let Some((w, at)) = restart {
            if Instant::now() >= at {
                workers[w] = spawn(&topic, &group, &ids[w], &tx)?;
                restart = None;
            }
        }
        if killed < kills && restart.is_none() && started.elapsed() >= next_kill {
            let w = (killed % 2) as usize;
            kill(&mut workers[w]);
            // Its supervisor starts it again a second later, while the
            // postings keep coming.
            restart = Some((w, Instant::now() + Duration::from_secs(1)));
            killed += 1;
            kill_times.push(now_us());
            next_kill += kill_every;
        }
        let job = posting(seq, accounts, behaviours[seq as usize]);
        enqueued[seq as usize] = now_us();
        send(&producer, &topic, &job).await?;
        lines.extend(rx.try_iter());
    }
    if let Some((w, at)) = restart {
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        workers[w] = spawn(&topic, &group, &ids[w], &tx)?;
    }
    let dead_jobs = behaviours.iter().filter(|b| **b == "always-fails").count();
    println!(
        "{postings} postings over {accounts} accounts at {rate}/s on {PARTITIONS} partitions, \
         tiers 2 s and 5 s ({ATTEMPTS} attempts); {} fail once, {dead_jobs} always; \
         {killed} SIGKILLs (a worker restarted 1 s later, static member)\n",
        behaviours.iter().filter(|b| **b == "fail-once").count()
    );
    // Until every posting finished, or a minute of nothing new.
    let mut seen: HashMap<i64, Seen> = HashMap::new();
    let mut last_new = Instant::now();
    loop {
        for l in lines.drain(..).chain(rx.try_iter()) {
            note(&mut seen, &l);
            last_new = Instant::now();
        }
        let done = (0..postings)
            .filter(|s| seen.get(s).is_some_and(|x| x.finished.is_some()))
            .count() as i64;
        if done == postings || last_new.elapsed() > Duration::from_secs(60) {
            println!("finished: {done} of {postings}");
            break;
        }
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            lines.push(l);
        }
    }
    // Copies arriving late (a re-delivery after the last kill) get 10 s.
    tokio::time::sleep(Duration::from_secs(10)).await;
    for l in rx.try_iter() {
        note(&mut seen, &l);
    }
    for w in &mut workers {
        kill(w);
    }
    let run = Run {
        postings,
        accounts,
        enqueued,
        kills: kill_times,
    };
    report(&config, &topic, &run, &seen, dead_jobs)
}

fn posting(seq: i64, accounts: i64, behaviour: &str) -> BenchJob {
    BenchJob {
        key: format!("acct{}", seq % accounts),
        seq,
        behaviour: behaviour.into(),
    }
}

async fn send(producer: &Producer, topic: &str, job: &BenchJob) -> anyhow::Result<()> {
    producer
        .enqueue_with_id_to(topic, job, Some(format!("posting-{}", job.seq)))
        .await
        .context("enqueueing a posting")?;
    Ok(())
}

fn note(seen: &mut HashMap<i64, Seen>, line: &str) {
    match parse(line) {
        Some(Line::Start { seq, us }) if seq >= 0 => seen.entry(seq).or_default().starts.push(us),
        Some(Line::End {
            seq,
            attempt,
            ok,
            us,
        }) if seq >= 0 => {
            let s = seen.entry(seq).or_default();
            if !ok && s.first_fail.is_none() {
                s.first_fail = Some(us);
            }
            if ok || attempt >= ATTEMPTS {
                s.finished = Some(s.finished.map_or(us, |f| f.min(us)));
            }
        }
        _ => {}
    }
}

/// What the driver sent, and when it killed a worker (epoch µs).
struct Run {
    postings: i64,
    accounts: i64,
    enqueued: Vec<i64>,
    kills: Vec<i64>,
}

/// A posting's turn came within this long after a SIGKILL: its worker's
/// partitions were moving (µs).
const NEAR_KILL_US: i64 = 5_000_000;

fn report(
    config: &KafkaConfig,
    topic: &str,
    run: &Run,
    seen: &HashMap<i64, Seen>,
    dead_jobs: usize,
) -> anyhow::Result<()> {
    let (postings, accounts, enqueued) = (run.postings, run.accounts, &run.enqueued);
    let near_kill = |t: i64| run.kills.iter().any(|k| t >= *k && t < k + NEAR_KILL_US);
    let (mut late_calm, mut late_kill) = (Vec::new(), Vec::new());
    let mut chained_copies = 0;
    let get = |s: i64| seen.get(&s);
    let (mut inversions, mut copies, mut in_retry, mut held, mut late) =
        (0, 0, Vec::new(), Vec::new(), Vec::new());
    for seq in 0..postings {
        let Some(me) = get(seq) else { continue };
        let first = me.starts.iter().min().copied();
        if let (Some(fail), Some(done)) = (me.first_fail, me.finished) {
            in_retry.push(done - fail);
        }
        let reruns = me
            .starts
            .iter()
            .filter(|s| me.finished.is_some_and(|f| **s > f))
            .count();
        copies += reruns;
        let prev = seq - accounts;
        if prev < 0 {
            continue;
        }
        let prev_done = get(prev).and_then(|p| p.finished);
        let (Some(first), Some(prev_done)) = (first, prev_done) else {
            continue;
        };
        if first < prev_done {
            inversions += 1;
        }
        let enq = enqueued[seq as usize];
        if prev_done > enq {
            held.push(first - enq);
            late.push(first - prev_done);
            if std::env::var_os("LEDGER_DEBUG").is_some() && first - prev_done > 1_000_000 {
                let p = get(prev);
                let rel = |v: &[i64]| {
                    v.iter()
                        .map(|t| (t - prev_done) / 1_000)
                        .collect::<Vec<_>>()
                };
                eprintln!(
                    "late seq {seq}: enq {} starts {:?} | prev {prev}: starts {:?} first_fail {:?}",
                    (enq - prev_done) / 1_000,
                    rel(&me.starts),
                    p.map(|p| rel(&p.starts)),
                    p.and_then(|p| p.first_fail)
                        .map(|f| (f - prev_done) / 1_000),
                );
            }
            if near_kill(prev_done) {
                late_kill.push(first - prev_done);
            } else {
                late_calm.push(first - prev_done);
            }
        }
        if prev_done > enq || me.first_fail.is_some() {
            chained_copies += reruns;
        }
    }
    let dlq =
        kjob::topics::read_topic(config, &kjob::topics::dlq_topic(topic))?.unwrap_or_default();
    let mut per_job: HashMap<String, usize> = HashMap::new();
    for m in &dlq {
        let id = kjob::headers::find(m.headers(), "kjob-id")
            .map(str::to_string)
            .unwrap_or_default();
        *per_job.entry(id).or_default() += 1;
    }
    let most = per_job.values().max().copied().unwrap_or(0);
    let (held_p99, retry_p99) = (p99(held.clone()), p99(in_retry.clone()));
    println!("| measure | p50 / p99 / max (postings) |");
    println!("|---|---|");
    println!(
        "| head in retry: first failure -> finished | {} |",
        summary(in_retry)
    );
    println!(
        "| held: enqueue -> first start, behind an unfinished posting | {} |",
        summary(held)
    );
    println!(
        "| late after its turn: first start - previous posting finished | {} |",
        summary(late)
    );
    println!(
        "| the same, turn more than 5 s after any SIGKILL | {} |",
        summary(late_calm)
    );
    println!(
        "| the same, turn within 5 s after a SIGKILL | {} |",
        summary(late_kill)
    );
    println!();
    println!(
        "inversions: {inversions}; copies re-run after the posting succeeded: {copies}, \
         {chained_copies} of them of postings that failed or waited (in a chain)"
    );
    println!(
        "dead letters: {} records for {} jobs ({dead_jobs} always fail), at most {most} for one job",
        dlq.len(),
        per_job.len()
    );
    println!(
        "bound held p99 <= head-in-retry p99 + 1 s: {:.2} s against {:.2} s: {}",
        held_p99 as f64 / 1e6,
        (retry_p99 + 1_000_000) as f64 / 1e6,
        if held_p99 <= retry_p99 + 1_000_000 {
            "within"
        } else {
            "NOT reached"
        }
    );
    Ok(())
}
