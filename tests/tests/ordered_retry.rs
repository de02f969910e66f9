//! Strict ordered retries (`WorkerBuilder::strict_order`): key K's job 1
//! fails twice and then succeeds, K's jobs 2–5 arrive while it waits in a
//! retry tier, and K is handled in the order 1, 2, 3, 4, 5, none of 2–5
//! starting before 1 succeeded; jobs of other keys enqueued alongside
//! finish long before K's chain. Against the real stack with a worker
//! *process* (steady, and SIGKILLed while job 1 waits in its tier, a new
//! process taking over), and in the in-memory harness for the rules
//! themselves. Timings are printed (`-- --nocapture`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use kjob::retry::RetryPolicy;
use kjob::testing::Harness;
use kjob::{JobContext, JobError, KafkaConfig, Producer, Worker};
use kjob_integration_tests::*;
use rdkafka::Message;

const KEY: &str = "K";
/// Other keys' jobs enqueued together with K's jobs 2–5.
const OTHERS: i64 = 20;
/// Retry tiers (ms) of the SIGKILL scenario.
const TIERS_KILL: &str = "1000,8000";

fn spawn_worker(topic: &str, group: &str, record: &Path, instance: &str, tiers: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .env("KJOB_TEST_TOPIC", topic)
        .env("KJOB_TEST_GROUP", group)
        .env("KJOB_TEST_RECORD", record)
        .env("KJOB_TEST_STRICT", "1")
        .env("KJOB_TEST_TIERS_MS", tiers)
        .env("KJOB_TEST_COMMIT_MS", "200")
        // A restart within the session takes its partitions straight back.
        .env("KJOB_INSTANCE_ID", instance)
        .spawn()
        .expect("test-worker runs")
}

fn now_ms() -> i64 {
    kjob::dlq::now_ms()
}

async fn wait_line(record: &Path, line: &str, within: Duration) {
    let start = Instant::now();
    while !read_lines(record).iter().any(|l| l == line) {
        assert!(
            start.elapsed() < within,
            "no `{line}` within {within:?}; record: {:?}",
            read_lines(record)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a strict worker process and waits until it runs jobs (a probe).
async fn setup(tiers: &str) -> (KafkaConfig, String, String, PathBuf, Child) {
    init_logging();
    let config = ensure_stack();
    let topic = unique("strict");
    let group = unique("g");
    create_topic(&config, &topic, 3).await;
    let dir = std::env::temp_dir().join(unique("kjob-strict"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let record = dir.join("record");
    let child = spawn_worker(&topic, &group, &record, &format!("{group}-w"), tiers);
    let producer = Producer::new(&config).expect("producer");
    producer
        .enqueue_to(&topic, &TestJob::ok("probe", -1))
        .await
        .expect("probe enqueued");
    wait_line(&record, "done -1", Duration::from_secs(60)).await;
    (config, topic, group, record, child)
}

/// Enqueues K's job 1 (fails twice), waits for its `failures` first
/// failures, then enqueues K's jobs 2–5 and the other keys' jobs; returns
/// when it began enqueueing those (epoch ms).
async fn enqueue_scenario(producer: &Producer, topic: &str, record: &Path, failures: usize) -> i64 {
    producer
        .enqueue_to(topic, &TestJob::with(KEY, 1, "fail-twice"))
        .await
        .expect("job 1 enqueued");
    let start = Instant::now();
    while read_lines(record)
        .iter()
        .filter(|l| *l == "failed 1")
        .count()
        < failures
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "job 1 did not fail {failures} times"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = now_ms();
    for seq in 2..=5 {
        // One at a time, so their arrival order is 2, 3, 4, 5.
        producer
            .enqueue_to(topic, &TestJob::ok(KEY, seq))
            .await
            .expect("K's job enqueued");
    }
    for i in 0..OTHERS {
        producer
            .enqueue_to(topic, &TestJob::ok(format!("o{i}"), 100 + i))
            .await
            .expect("other key's job enqueued");
    }
    started
}

/// What the record file says about one run of the scenario.
struct Runs {
    /// Seqs of K in the order of their first successful handling.
    k_order: Vec<i64>,
    /// Line index of the first `done 1`.
    first_done_1: usize,
    /// Line index of the first `start` of each of K's jobs 2–5.
    first_start: HashMap<i64, usize>,
    /// First success time (epoch ms) per seq.
    ok_at: HashMap<i64, i64>,
    /// How many times each seq started.
    starts: HashMap<i64, usize>,
}

fn runs(record: &Path) -> Runs {
    let lines = read_lines(record);
    let mut k_order = Vec::new();
    let mut first_done_1 = usize::MAX;
    let mut first_start = HashMap::new();
    let mut ok_at = HashMap::new();
    let mut starts: HashMap<i64, usize> = HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        let f: Vec<&str> = l.split(' ').collect();
        let seq = f.get(1).and_then(|s| s.parse::<i64>().ok());
        match (f.first().copied(), seq) {
            (Some("done"), Some(s)) if (1..=5).contains(&s) && !k_order.contains(&s) => {
                k_order.push(s);
                if s == 1 {
                    first_done_1 = i;
                }
            }
            (Some("start"), Some(s)) => {
                *starts.entry(s).or_default() += 1;
                if (2..=5).contains(&s) {
                    first_start.entry(s).or_insert(i);
                }
            }
            (Some("okat"), Some(s)) => {
                if let Some(at) = f.get(2).and_then(|t| t.parse::<i64>().ok()) {
                    ok_at.entry(s).or_insert(at);
                }
            }
            _ => {}
        }
    }
    Runs {
        k_order,
        first_done_1,
        first_start,
        ok_at,
        starts,
    }
}

/// K's jobs 2–5 each started once: no copy of a finished job (a
/// re-delivery after the kill, a parked copy coming back) ran again.
fn assert_no_copy_ran(what: &str, record: &Path) {
    let r = runs(record);
    for seq in 2..=5 {
        assert_eq!(
            r.starts.get(&seq).copied(),
            Some(1),
            "{what}: K's job {seq} started {:?} times; record: {:?}",
            r.starts.get(&seq),
            read_lines(record)
        );
    }
}

/// The order and isolation assertions shared by both scenarios; prints
/// the timings.
fn check(what: &str, record: &Path, enqueued_at: i64) {
    let r = runs(record);
    assert_eq!(
        r.k_order,
        vec![1, 2, 3, 4, 5],
        "{what}: K's jobs were first handled out of order; record: {:?}",
        read_lines(record)
    );
    for seq in 2..=5 {
        let started = r.first_start[&seq];
        assert!(
            started > r.first_done_1,
            "{what}: K's job {seq} started (line {started}) before job 1 succeeded (line {})",
            r.first_done_1
        );
    }
    let others: Vec<i64> = (0..OTHERS)
        .map(|i| {
            let at = r.ok_at.get(&(100 + i)).copied();
            at.unwrap_or_else(|| panic!("{what}: other key's job {} never succeeded", 100 + i))
                - enqueued_at
        })
        .collect();
    let others_max = others.iter().copied().max().unwrap_or(0);
    let k_one = r.ok_at[&1] - enqueued_at;
    let k_done = r.ok_at[&5] - enqueued_at;
    let dups: usize = r
        .starts
        .iter()
        .filter(|(s, _)| **s >= 1)
        .map(|(_, n)| n - 1)
        .sum();
    println!(
        "{what}: counted from the enqueue of K's jobs 2-5 and the other keys' jobs: other \
         keys' {OTHERS} jobs all done after {others_max} ms; K's job 1 succeeded after \
         {k_one} ms, K's chain (job 5) after {k_done} ms; extra starts (job 1's retries, \
         duplicates) {dups}"
    );
    assert!(
        others_max < k_one,
        "{what}: other keys were held up ({others_max} ms) until after K's job 1 ({k_one} ms)"
    );
    assert!(
        others_max < 2_000,
        "{what}: other keys took {others_max} ms; they must not wait for K"
    );
}

/// Folds `<topic>.order` to its last value per key: every chain must have
/// been emptied once the scenario finished (a tombstone last, or a record
/// that only remembers finished jobs, so their copies are skipped).
fn assert_chains_empty(config: &KafkaConfig, topic: &str) {
    let mut last: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
    let records = read_all(config, &format!("{topic}.order"));
    assert!(
        !records.is_empty(),
        "the order topic holds K's chain history"
    );
    for m in records {
        if let Some(k) = m.key() {
            last.insert(k.to_vec(), m.payload().map(<[u8]>::to_vec));
        }
    }
    let waiting = |v: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(v)
            .ok()
            .and_then(|j| j.get("ids").and_then(|ids| ids.as_array()).map(Vec::len))
            != Some(0)
    };
    let open: Vec<String> = last
        .iter()
        .filter(|(_, v)| v.as_deref().is_some_and(waiting))
        .map(|(k, v)| {
            format!(
                "{} = {}",
                String::from_utf8_lossy(k),
                String::from_utf8_lossy(v.as_deref().unwrap_or_default())
            )
        })
        .collect();
    assert!(open.is_empty(), "chains left open: {open:?}");
}

fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_later_jobs_wait_for_its_job_in_the_retry_path() {
    let (config, topic, _group, record, child) = setup("1500,2000").await;
    let producer = Producer::new(&config).expect("producer");
    let enqueued_at = enqueue_scenario(&producer, &topic, &record, 1).await;
    wait_line(&record, "done 5", Duration::from_secs(60)).await;
    // Let the last state writes and commits land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop(child);
    check("steady worker", &record, enqueued_at);
    assert_no_copy_ran("steady worker", &record);
    // Jobs 2–5 arrived while job 1 was due within its 1.5 s tier: they
    // waited in memory, and ran the moment it succeeded instead of a tier
    // hop later.
    let r = runs(&record);
    let behind = r.ok_at[&5] - r.ok_at[&1];
    println!("steady worker: K's job 5 succeeded {behind} ms after job 1");
    assert!(
        behind < 1_000,
        "K's jobs 2-5 finished {behind} ms after job 1; they must flow at once"
    );
    assert_chains_empty(&config, &topic);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_survives_a_sigkill_while_job_1_waits_in_a_tier() {
    // Job 1 waits 8 s in the second tier while K's jobs 2–5, parked in the
    // 1 s first tier, come due again and again: only the persisted order
    // keeps the next process from running them before job 1.
    let (config, topic, group, record, mut child) = setup(TIERS_KILL).await;
    let producer = Producer::new(&config).expect("producer");
    let enqueued_at = enqueue_scenario(&producer, &topic, &record, 2).await;
    // Let the worker park K's jobs 2–5 (and re-park them once), then kill
    // it without a chance to clean up.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let before = runs(&record);
    assert_eq!(
        before.k_order,
        Vec::<i64>::new(),
        "job 1 was still in its tier at the kill, and nothing else of K ran"
    );
    assert!(before.first_start.is_empty(), "K's jobs 2–5 ran early");
    let killed_at = now_ms();
    // A new member id: under KIP-848 the broker keeps a SIGKILLed static
    // member's id until its session expires and refuses it meanwhile.
    let next = spawn_worker(&topic, &group, &record, &format!("{group}-w2"), TIERS_KILL);
    wait_line(&record, "done 5", Duration::from_secs(90)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop(next);
    println!(
        "after the SIGKILL: K's chain finished {} ms after the kill",
        runs(&record).ok_at[&5] - killed_at
    );
    check("SIGKILL and takeover", &record, enqueued_at);
    assert_no_copy_ran("SIGKILL and takeover", &record);
    assert_chains_empty(&config, &topic);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_holds_when_another_worker_takes_the_partition_over() {
    // As above, but the partitions move to a second, already running
    // process: it joins (an eager rebalance splits the partitions), then
    // the first is SIGKILLed and the second takes everything once the dead
    // member's session expired, reloading the order state of each
    // partition it gains.
    let (config, topic, group, record, mut first) = setup(TIERS_KILL).await;
    let producer = Producer::new(&config).expect("producer");
    let enqueued_at = enqueue_scenario(&producer, &topic, &record, 2).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let second = spawn_worker(&topic, &group, &record, &format!("{group}-b"), TIERS_KILL);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    first.kill().expect("SIGKILL");
    let _ = first.wait();
    assert!(
        runs(&record).first_start.is_empty(),
        "K's jobs 2–5 ran before the takeover"
    );
    wait_line(&record, "done 5", Duration::from_secs(90)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop(second);
    check("rebalance to a running worker", &record, enqueued_at);
    assert_no_copy_ran("rebalance to a running worker", &record);
    assert_chains_empty(&config, &topic);
}

/// The same rules in the in-memory harness (no broker): the exact order,
/// and that without strict order job 2 overtakes job 1 (what the mode is
/// for).
#[tokio::test]
async fn the_harness_applies_the_same_rules() {
    async fn handler(job: TestJob, ctx: JobContext) -> Result<(), JobError> {
        if job.behaviour == "fail-twice" && ctx.attempt <= 2 {
            return Err(JobError::server("planned"));
        }
        Ok(())
    }
    for strict in [true, false] {
        let topic = "strict.harness";
        let mut builder = Worker::builder(
            KafkaConfig::new("127.0.0.1:9092", "http://127.0.0.1:8081"),
            "g",
        )
        .handle_on(topic, handler)
        .retry(RetryPolicy::tiers([Duration::from_secs(5), Duration::from_secs(30)]).jitter(0.0));
        if strict {
            builder = builder.strict_order(topic);
        }
        let mut h = Harness::new(builder).expect("harness");
        let mut ids = vec![h
            .enqueue_to(topic, &TestJob::with(KEY, 1, "fail-twice"))
            .expect("enqueue")];
        h.run().await;
        for seq in 2..=5 {
            ids.push(
                h.enqueue_to(topic, &TestJob::ok(KEY, seq))
                    .expect("enqueue"),
            );
        }
        let other = h
            .enqueue_to(topic, &TestJob::ok("other", 100))
            .expect("enqueue");
        h.run_until_idle().await;
        let handled = h.handled();
        let order: Vec<usize> = handled
            .iter()
            .filter_map(|x| ids.iter().position(|id| *id == x.id))
            .map(|i| i + 1)
            .collect();
        let at = |id: &str| handled.iter().find(|x| x.id == id).map(|x| x.at_ms);
        if strict {
            assert_eq!(order, vec![1, 2, 3, 4, 5], "strict order");
            assert!(
                at(&other) < at(&ids[0]),
                "another key is not held up by K's retry"
            );
            let firsts: Vec<u32> = handled
                .iter()
                .filter(|x| ids[1..].contains(&x.id))
                .map(|x| x.attempt)
                .collect();
            assert_eq!(firsts, vec![1, 1, 1, 1], "parking burns no attempt");
            // While job 1 waits 30 s in the second tier, the others wait in
            // that tier too instead of coming back every 5 s.
            let parked_long = h
                .records(&format!("{topic}.retry.30s"))
                .iter()
                .filter(|m| kjob::headers::find(m.headers(), kjob::headers::FOLLOWS).is_some())
                .count();
            assert_eq!(parked_long, 4, "K's jobs 2-5 parked once in the 30 s tier");
            let parked_short = h
                .records(&format!("{topic}.retry.5s"))
                .iter()
                .filter(|m| kjob::headers::find(m.headers(), kjob::headers::FOLLOWS).is_some())
                .count();
            assert_eq!(parked_short, 4, "and once in the 5 s tier, on arrival");
        } else {
            assert_eq!(order, vec![2, 3, 4, 5, 1], "today's default behaviour");
        }
    }
}

/// A head that is dead-lettered (bad input) leaves the chain: the key's
/// next job runs instead of waiting forever.
#[tokio::test]
async fn a_dead_lettered_head_does_not_wedge_its_key() {
    async fn handler(job: TestJob, _ctx: JobContext) -> Result<(), JobError> {
        match job.behaviour.as_str() {
            "always-fails" => Err(JobError::server("downstream keeps failing")),
            _ => Ok(()),
        }
    }
    let topic = "strict.deadletter";
    let builder = Worker::builder(
        KafkaConfig::new("127.0.0.1:9092", "http://127.0.0.1:8081"),
        "g",
    )
    .handle_on(topic, handler)
    // Two attempts: job 1 fails, waits in the tier, fails again and is
    // dead-lettered as retries_exhausted.
    .retry(RetryPolicy::tiers([Duration::from_secs(5)]).jitter(0.0))
    .strict_order(topic);
    let mut h = Harness::new(builder).expect("harness");
    let first = h
        .enqueue_to(topic, &TestJob::with(KEY, 1, "always-fails"))
        .expect("enqueue");
    h.run().await;
    let second = h.enqueue_to(topic, &TestJob::ok(KEY, 2)).expect("enqueue");
    h.run_until_idle().await;
    assert_eq!(
        h.dead_letters()
            .iter()
            .map(|d| d.id.clone())
            .collect::<Vec<_>>(),
        vec![first]
    );
    let handled: Vec<String> = h.handled().iter().map(|x| x.id.clone()).collect();
    assert_eq!(
        handled,
        vec![second],
        "job 2 ran after job 1 was dead-lettered"
    );
}

/// A strict route is refused, with the fix named, where its order could not
/// hold: an unknown topic, unordered dispatch, a non-range assignor.
#[test]
fn unusable_strict_settings_are_refused_at_build() {
    async fn handler(_: TestJob, _: JobContext) -> Result<(), JobError> {
        Ok(())
    }
    let config = || KafkaConfig::new("127.0.0.1:9092", "http://127.0.0.1:8081");
    let err = |b: kjob::WorkerBuilder| match b.build() {
        Ok(_) => panic!("a strict route that cannot hold was accepted"),
        Err(e) => e.to_string(),
    };
    let typo = err(Worker::builder(config(), "g")
        .handle_on("ledger", handler)
        .strict_order("ledgr"));
    assert!(
        typo.contains("ledgr") && typo.contains("strict_order"),
        "{typo}"
    );
    let unordered = err(Worker::builder(config(), "g")
        .handle_on("ledger", handler)
        .ordering(kjob::OrderingMode::Unordered)
        .strict_order("ledger"));
    assert!(unordered.contains("PerKey"), "{unordered}");
    let sticky = err(Worker::builder(
        config().set("partition.assignment.strategy", "cooperative-sticky"),
        "g",
    )
    .group_protocol(kjob::GroupProtocol::Classic)
    .handle_on("ledger", handler)
    .strict_order("ledger"));
    assert!(
        sticky.contains("range") && sticky.contains("ledger.order"),
        "{sticky}"
    );
    assert!(Worker::builder(config(), "g")
        .handle_on("ledger", handler)
        .strict_order("ledger")
        .build()
        .is_ok());
}
