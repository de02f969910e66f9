//! The soak's fleet: worker processes supervised, SIGKILLed and replaced, and the brokers restarted.

use super::*;
use kjob::KafkaConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) struct Settings {
    pub(crate) jobs: i64,
    pub(crate) rate: u64,
    pub(crate) workers: usize,
    pub(crate) kills: usize,
    pub(crate) outage: Duration,
    pub(crate) seed: u64,
}

/// Worker processes kept running by a supervisor loop per slot.
pub(crate) struct Fleet {
    pub(crate) pids: Vec<AtomicU64>,
    pub(crate) stopping: AtomicBool,
    /// Exits the driver did not cause (a start during the registry outage
    /// fails preflight, for instance): restarted all the same.
    pub(crate) other_exits: AtomicUsize,
    pub(crate) starts: AtomicUsize,
}

impl Fleet {
    /// Sends `sig` to the slot's current process, if it has one.
    pub(crate) fn signal(&self, slot: usize, sig: &str) -> bool {
        signal_pid(self.pids[slot].load(Ordering::Acquire), sig)
    }

    /// SIGKILLs the slot's current process. Its pid is taken out at once, so
    /// a second kill planned a moment later finds another live process
    /// rather than the one already dying.
    pub(crate) fn kill(&self, slot: usize) -> bool {
        signal_pid(self.pids[slot].swap(0, Ordering::AcqRel), "-KILL")
    }
}

pub(crate) fn signal_pid(pid: u64, sig: &str) -> bool {
    pid != 0
        && std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success())
}

pub(crate) fn supervise(
    fleet: Arc<Fleet>,
    slot: usize,
    env: Vec<(String, String)>,
    logs: PathBuf,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if fleet.stopping.load(Ordering::Acquire) {
                return;
            }
            let log = std::fs::File::options()
                .create(true)
                .append(true)
                .open(logs.join(format!("worker{slot}.log")));
            let mut cmd = match std::env::current_exe() {
                Ok(exe) => tokio::process::Command::new(exe),
                Err(e) => {
                    eprintln!("chaos: cannot find own executable: {e}");
                    return;
                }
            };
            cmd.arg("worker")
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .kill_on_drop(true);
            // kjob's tracing logs go to stdout, errors to stderr: both to the log.
            if let Ok(log) = log {
                if let Ok(copy) = log.try_clone() {
                    cmd.stdout(copy);
                }
                cmd.stderr(log);
            }
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("chaos: starting worker {slot}: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            fleet.starts.fetch_add(1, Ordering::Relaxed);
            fleet.pids[slot].store(u64::from(child.id().unwrap_or(0)), Ordering::Release);
            let status = child.wait().await;
            fleet.pids[slot].store(0, Ordering::Release);
            let killed = {
                use std::os::unix::process::ExitStatusExt;
                status.as_ref().is_ok_and(|s| s.signal() == Some(9))
            };
            if !killed && !fleet.stopping.load(Ordering::Acquire) {
                fleet.other_exits.fetch_add(1, Ordering::Relaxed);
            }
            // A process manager's restart delay.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// SIGKILLs a live worker and returns once its replacement passed preflight
/// (it has not joined the group yet, so it has decoded nothing), or after
/// 30 s.
pub(crate) async fn fresh_worker(fleet: &Fleet, dir: &Path, t0: Instant) {
    let Some(slot) = (0..fleet.pids.len()).find(|i| fleet.pids[*i].load(Ordering::Acquire) != 0)
    else {
        return;
    };
    let log = dir.join(format!("worker{slot}.log"));
    let starts = || {
        std::fs::read_to_string(&log)
            .map(|t| t.matches("chaos worker: preflight passed").count())
            .unwrap_or(0)
    };
    let before = starts();
    if !fleet.kill(slot) {
        return;
    }
    note(
        t0,
        format!("SIGKILL worker {slot} (extra): its replacement meets the registry outage with nothing cached"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while starts() <= before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Prints what happened when (seconds since the start).
pub(crate) fn note(t0: Instant, what: String) {
    println!("chaos: {:7.1} s  {what}", t0.elapsed().as_secs_f64());
}

pub(crate) fn node_pid(node: u32) -> anyhow::Result<u32> {
    let f = repo_root().join(format!(".stack/cluster/pids/node{node}.pid"));
    std::fs::read_to_string(&f)
        .with_context(|| {
            format!(
                "{}: is the cluster up (./dev stack up --brokers 3)?",
                f.display()
            )
        })?
        .trim()
        .parse()
        .with_context(|| format!("{} holds no pid", f.display()))
}

/// Whether `pid` is a live process. A zombie is not: when `./dev chaos`
/// started the cluster itself, the brokers are children of this run's
/// parent, which never reaps them, so a killed broker stays a zombie.
pub(crate) fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// How one broker restart went.
pub(crate) struct BrokerRestart {
    /// From the signal until the process was gone (a SIGTERM is a
    /// controlled shutdown: leadership moves first).
    pub(crate) stopped: Duration,
    /// From the start until the node served a metadata request on its
    /// SASL_SSL listener.
    pub(crate) answering: Duration,
}

/// Whether cluster node `node` serves metadata for `topic` on its own
/// listener (one topic: the whole cluster's metadata, a thousand topics
/// left by test runs, can take longer than the timeout on a busy machine).
pub(crate) async fn node_answers(config: &KafkaConfig, node: u32, topic: &str) -> bool {
    let mut c = config.clone();
    c.bootstrap_servers = format!("127.0.0.1:{}", 19091 + node);
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        c.rdkafka_config().create::<BaseConsumer>().is_ok_and(|b| {
            b.fetch_metadata(Some(&topic), Duration::from_secs(5))
                .is_ok()
        })
    })
    .await
    .unwrap_or(false)
}

/// Stops cluster node `node` with `sig`, waits 5 s after it is gone and
/// starts it again through `./dev stack up --brokers 3`, timing the stop and
/// the start until the node answers.
pub(crate) async fn restart_broker(
    config: &KafkaConfig,
    topic: &str,
    node: u32,
    sig: &'static str,
    logs: &Path,
) -> anyhow::Result<BrokerRestart> {
    let pid = node_pid(node)?;
    let at = Instant::now();
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()?
        .success();
    anyhow::ensure!(ok, "kill {sig} {pid} (node {node}) failed");
    while alive(pid) {
        anyhow::ensure!(
            at.elapsed() < Duration::from_secs(120),
            "node {node} (pid {pid}) still running 120 s after {sig}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stopped = at.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(logs.join("cluster-up.log"))?;
    let started = Instant::now();
    let mut up = tokio::process::Command::new(repo_root().join("dev"))
        .args(["stack", "up", "--brokers", "3"])
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let answering = loop {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(180),
            "node {node} did not answer within 180 s of its start; see {}",
            logs.join("cluster-up.log").display()
        );
        if node_answers(config, node, topic).await {
            break started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let status = up.wait().await?;
    anyhow::ensure!(
        status.success(),
        "./dev stack up --brokers 3 failed restarting node {node}; see {}",
        logs.join("cluster-up.log").display()
    );
    Ok(BrokerRestart { stopped, answering })
}
