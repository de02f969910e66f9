//! Cron schedules across a fleet: three worker *processes* run a 1-second
//! schedule for 30 s and the schedule leader is SIGKILLed twice. Every tick
//! in the window must be enqueued (counted by job id `cron:<name>:<tick>`),
//! a tick fired twice must carry the same id (so `PgMarkers` reports it as
//! a duplicate), and no tick may be skipped: the test runs the `All`
//! catch-up policy. `kjob schedules` then shows the schedule.
//!
//! Takeover in seconds, at kjob's own group settings (10 s session): a
//! leader stopped with SIGTERM leaves the group, so a survivor leads
//! within a heartbeat and a rebalance; a SIGKILLed leader with an instance
//! id (`KJOB_INSTANCE_ID`) restarted 1 s later leads again before its
//! session would have expired.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use kjob::headers::JobHeaders;
use kjob::idempotency::{Mark, PgMarkers};
use kjob_integration_tests::*;

fn spawn_worker(topic: &str, group: &str, record: &Path) -> Child {
    worker_command(topic, group, record)
        .spawn()
        .expect("test-worker runs")
}

fn worker_command(topic: &str, group: &str, record: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_test-worker"));
    c.env("KJOB_TEST_TOPIC", topic)
        .env("KJOB_TEST_GROUP", group)
        .env("KJOB_TEST_RECORD", record)
        .env("KJOB_TEST_SCHEDULE", "tick=* * * * * *");
    c
}

/// `(pid, ms)` of every `leader` line, in order.
fn leaders(record: &Path) -> Vec<(u32, i64)> {
    read_lines(record)
        .iter()
        .filter_map(|l| {
            let mut f = l.strip_prefix("leader ")?.split(' ');
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect()
}

async fn wait_new_leader(record: &Path, seen: usize, within: Duration) -> (u32, i64) {
    let start = Instant::now();
    loop {
        let l = leaders(record);
        if l.len() > seen {
            return l[l.len() - 1];
        }
        assert!(
            start.elapsed() < within,
            "no schedule leader after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tick_once_across_three_workers_with_the_leader_killed_twice() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("cron");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let dir = std::env::temp_dir().join(unique("kjob-cron"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let record = dir.join("record");
    let mut children: Vec<Child> = (0..3)
        .map(|_| spawn_worker(&topic, &group, &record))
        .collect();

    wait_new_leader(&record, 0, Duration::from_secs(60)).await;
    let started = kjob::dlq::now_ms();
    let mut killed = Vec::new();
    for round in 1..=2 {
        tokio::time::sleep(Duration::from_secs(8)).await;
        // The current leader: the latest to announce it (leadership may
        // have moved while the three members joined).
        let before = leaders(&record);
        let leader = before[before.len() - 1].0;
        let i = children
            .iter()
            .position(|c| c.id() == leader)
            .expect("the leader is one of ours");
        let mut c = children.remove(i);
        c.kill().expect("SIGKILL the leader");
        let _ = c.wait();
        killed.push((leader, kjob::dlq::now_ms()));
        println!("round {round}: SIGKILLed leader {leader}");
        let (next, at) = wait_new_leader(&record, before.len(), Duration::from_secs(60)).await;
        assert_ne!(next, leader, "a surviving worker took over");
        println!(
            "  new leader {next} after {} ms",
            at - killed[killed.len() - 1].1
        );
    }
    // Run to 30 s after the first leader started, then stop the survivor.
    let until = started + 30_000;
    while kjob::dlq::now_ms() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Catch-up of the last failover has fired by now; stop gracefully.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for mut c in children {
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let _ = c.wait();
    }

    // Count by job id.
    let mut by_id: BTreeMap<String, usize> = BTreeMap::new();
    let records = read_all(&config, &topic);
    for m in &records {
        let id = JobHeaders::parse(rdkafka::message::Message::headers(m))
            .id
            .expect("a scheduled job has an id");
        assert!(id.starts_with("cron:tick:"), "{id}");
        *by_id.entry(id).or_default() += 1;
    }
    let ticks: Vec<i64> = by_id
        .keys()
        .map(|id| {
            let t = id.trim_start_matches("cron:tick:");
            humantime::parse_rfc3339(t)
                .map(|t| {
                    t.duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_millis() as i64)
                        .unwrap_or(0)
                })
                .unwrap_or_else(|e| panic!("tick `{t}` is not RFC 3339: {e}"))
        })
        .collect();
    let (lo, hi) = (ticks[0], ticks[ticks.len() - 1]);
    let missing: Vec<i64> = (0..=(hi - lo) / 1000)
        .map(|i| lo + i * 1000)
        .filter(|t| !ticks.contains(t))
        .collect();
    let extra = records.len() - by_id.len();
    println!(
        "{} ticks from {} to {}, {} records, {} duplicate record(s); leaders killed at {:?}",
        by_id.len(),
        kjob::schedule::format_tick(lo),
        kjob::schedule::format_tick(hi),
        records.len(),
        extra,
        killed
    );
    assert!(missing.is_empty(), "ticks never enqueued: {missing:?}");
    assert!(
        hi - lo >= 29_000,
        "the window covers the 30 s run: {lo}..{hi}"
    );
    for (_, t) in &killed {
        assert!(lo < *t && *t < hi, "each kill fell inside the window");
    }

    // Duplicates are recognised: PgMarkers sees each id once as First.
    let url = ensure_postgres();
    let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("postgres");
    tokio::spawn(conn);
    let table = format!("cron_markers_{}", &group.replace(['.', '-'], "_"));
    let markers = PgMarkers::new(&table).expect("table name");
    markers.create_table(&client).await.expect("markers table");
    let (mut first, mut dup) = (0, 0);
    for m in &records {
        let id = JobHeaders::parse(rdkafka::message::Message::headers(m))
            .id
            .unwrap_or_default();
        let tx = client.transaction().await.expect("tx");
        match markers.mark(&tx, &id, "tick").await.expect("mark") {
            Mark::First => first += 1,
            Mark::Duplicate => dup += 1,
        }
        tx.commit().await.expect("commit");
    }
    assert_eq!(first, by_id.len(), "each tick is new exactly once");
    assert_eq!(dup, extra, "every extra record is a recognised duplicate");
    client
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .expect("drop markers");

    // `kjob schedules` shows it.
    let out = Command::new(env!("CARGO_BIN_EXE_kjob-cli"))
        .args(["schedules", "--group", &group])
        .env("KJOB_BOOTSTRAP_SERVERS", &config.bootstrap_servers)
        .env("KJOB_SCHEMA_REGISTRY_URL", &config.schema_registry_url)
        .output()
        .expect("running kjob");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("tick")
            && stdout.contains("* * * * * *")
            && (stdout.contains(&kjob::schedule::format_tick(hi))
                || stdout.contains(&kjob::schedule::format_tick(hi - 1000))),
        "lists the schedule and its last fired tick: {stdout}"
    );
    // Every worker has left the group: the state topic still names the
    // last leader, but nobody fires now.
    assert!(
        stdout.contains("leader: no leader"),
        "a vacant leadership shows as such: {stdout}"
    );
}

/// The test's workers, SIGKILLed when it ends, also when an assertion
/// fails (an orphan would hold the test's stdout open).
struct Fleet(Vec<Child>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The first leader of two: `(its index, the record's leader lines so far)`.
async fn first_leader(children: &[Child], record: &Path) -> (usize, usize) {
    let (pid, _) = wait_new_leader(record, 0, Duration::from_secs(60)).await;
    // Let the second member's join settle, then take the newest leader.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = leaders(record);
    let pid = seen.last().map_or(pid, |l| l.0);
    let i = children
        .iter()
        .position(|c| c.id() == pid)
        .expect("the leader is one of ours");
    (i, seen.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_with_sigterm_is_replaced_within_seconds() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("cron-term");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let dir = std::env::temp_dir().join(unique("kjob-cron-term"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let record = dir.join("record");
    let mut fleet = Fleet(
        (0..2)
            .map(|_| {
                worker_command(&topic, &group, &record)
                    .env("KJOB_TEST_KJOB_SESSION", "1")
                    .spawn()
                    .expect("test-worker runs")
            })
            .collect(),
    );
    let (i, seen) = first_leader(&fleet.0, &record).await;
    let leader_pid = fleet.0[i].id();
    let stopped = kjob::clock::now_ms();
    let _ = Command::new("kill")
        .args(["-TERM", &leader_pid.to_string()])
        .status();
    let (next, at) = wait_new_leader(&record, seen, Duration::from_secs(30)).await;
    let _ = fleet.0[i].wait();
    println!("SIGTERM -> new leader {next} after {} ms", at - stopped);
    assert_ne!(next, leader_pid, "the survivor leads");
    // A stopped leader leaves the group; without the leave the survivor
    // would wait out the 10 s session.
    assert!(
        at - stopped < 5_000,
        "a survivor led {} ms after the leader's SIGTERM",
        at - stopped
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_leader_killed_and_restarted_leads_again_before_its_session_expires() {
    init_logging();
    let config = ensure_stack();
    let topic = unique("cron-static");
    let group = unique("g");
    create_topic(&config, &topic, 1).await;
    let dir = std::env::temp_dir().join(unique("kjob-cron-static"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let record = dir.join("record");
    let spawn = |n: usize| {
        worker_command(&topic, &group, &record)
            .env("KJOB_TEST_KJOB_SESSION", "1")
            .env("KJOB_INSTANCE_ID", format!("{group}-{n}"))
            .spawn()
            .expect("test-worker runs")
    };
    let mut fleet = Fleet((0..2).map(spawn).collect());
    let (i, seen) = first_leader(&fleet.0, &record).await;
    fleet.0[i].kill().expect("SIGKILL the leader");
    let killed = kjob::clock::now_ms();
    let _ = fleet.0[i].wait();
    tokio::time::sleep(Duration::from_secs(1)).await;
    fleet.0[i] = spawn(i);
    let (next, at) = wait_new_leader(&record, seen, Duration::from_secs(30)).await;
    println!(
        "SIGKILL -> restarted static leader {next} leads after {} ms",
        at - killed
    );
    assert_eq!(
        next,
        fleet.0[i].id(),
        "the restarted member got its partition back, not the survivor"
    );
    assert!(
        at - killed < 5_000,
        "the restarted leader led {} ms after the kill (its session is 10 s)",
        at - killed
    );
}
