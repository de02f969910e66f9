//! Worker limits, as Symfony Messenger's `--limit`, `--memory-limit` and
//! `--time-limit`: after so many jobs, above so much memory, or after so
//! long, the worker stops gracefully (drops what has not started, finishes
//! what runs, commits, leaves the group) so that a supervisor starts a
//! fresh process. A leak or a slow fragmentation then costs a restart, not
//! an OOM kill in the middle of jobs.
//!
//! Set them on the builder ([`crate::WorkerBuilder::stop_after_jobs`],
//! `stop_above_rss`, `stop_after`) or with `KJOB_STOP_AFTER_JOBS`,
//! `KJOB_STOP_ABOVE_RSS` (bytes, or with a `K`/`M`/`G` suffix, powers of
//! 1024) and `KJOB_STOP_AFTER` (`90s`, `1h`). The worker's run then ends
//! with [`crate::Error::LimitReached`], whose [`crate::Error::exit_code`]
//! tells a supervisor (and a human) which limit fired, except for a job
//! count the program set itself: `.stop_after_jobs(n)` in code is a run of
//! `n` jobs (a script, a test, the hello), which ends with `Ok`. The same
//! count from `KJOB_STOP_AFTER_JOBS`, a supervisor's restart policy, keeps
//! its exit status 81.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result, StopLimit};
use crate::worker::WorkerStats;

/// The limits a worker runs under.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StopLimits {
    pub jobs: Option<u64>,
    /// Whether `jobs` came from `KJOB_STOP_AFTER_JOBS` (a supervisor's
    /// setting: the run ends with the limit's error) rather than the
    /// builder (the program's own plan: the run ends with `Ok`).
    pub jobs_from_env: bool,
    pub rss: Option<u64>,
    pub time: Option<Duration>,
}

impl StopLimits {
    /// Fills what the builder left unset from the environment.
    pub(crate) fn with_env(mut self) -> Result<Self> {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if self.jobs.is_none() {
            if let Some(v) = var("KJOB_STOP_AFTER_JOBS") {
                self.jobs = Some(v.parse().map_err(|_| Error::InvalidSetting {
                    name: "KJOB_STOP_AFTER_JOBS".into(),
                    value: v.clone(),
                    reason: "not a whole number of jobs".into(),
                })?);
                self.jobs_from_env = true;
            }
        }
        if self.rss.is_none() {
            if let Some(v) = var("KJOB_STOP_ABOVE_RSS") {
                self.rss = Some(parse_bytes(&v).ok_or_else(|| Error::InvalidSetting {
                    name: "KJOB_STOP_ABOVE_RSS".into(),
                    value: v.clone(),
                    reason: "not a size: use bytes or a K/M/G suffix, e.g. 512M".into(),
                })?);
            }
        }
        if self.time.is_none() {
            if let Some(v) = var("KJOB_STOP_AFTER") {
                self.time =
                    Some(
                        humantime::parse_duration(&v).map_err(|e| Error::InvalidSetting {
                            name: "KJOB_STOP_AFTER".into(),
                            value: v.clone(),
                            reason: format!("{e} (e.g. 90s, 1h)"),
                        })?,
                    );
            }
        }
        Ok(self)
    }

    /// Whether `limit` firing ends the run with `Ok`: the job count the
    /// program set itself (see the module docs).
    pub(crate) fn planned(&self, limit: &StopLimit) -> bool {
        matches!(limit, StopLimit::Jobs(_)) && !self.jobs_from_env
    }

    fn any(&self) -> bool {
        self.jobs.is_some() || self.rss.is_some() || self.time.is_some()
    }

    /// Resolves when a limit fires (never, without limits).
    pub(crate) async fn watch(self, stats: Arc<WorkerStats>) -> StopLimit {
        if !self.any() {
            return std::future::pending().await;
        }
        let started = Instant::now();
        loop {
            if let Some(n) = self.jobs.filter(|n| WorkerStats::get(&stats.handled) >= *n) {
                return StopLimit::Jobs(n);
            }
            // Memory is judged once work has started: a limit below the
            // process's idle size would otherwise stop it before any job,
            // in a restart loop without progress.
            let working = WorkerStats::get(&stats.handled) > 0;
            if let Some(max) = self
                .rss
                .filter(|max| working && rss_bytes().is_some_and(|r| r > *max))
            {
                return StopLimit::Rss(max);
            }
            if let Some(d) = self.time.filter(|d| started.elapsed() >= *d) {
                return StopLimit::Time(d);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `512`, `64K`, `512M`, `2G` (powers of 1024; a trailing `B`/`iB` is fine).
fn parse_bytes(v: &str) -> Option<u64> {
    let v = v.trim().trim_end_matches("iB").trim_end_matches('B');
    let (num, mult) = match v.chars().last()? {
        'k' | 'K' => (&v[..v.len() - 1], 1u64 << 10),
        'm' | 'M' => (&v[..v.len() - 1], 1 << 20),
        'g' | 'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}

/// This process's resident set size, from `/proc/self/statm` (Linux).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_bytes("512"), Some(512));
        assert_eq!(parse_bytes("64K"), Some(64 << 10));
        assert_eq!(parse_bytes("512MiB"), Some(512 << 20));
        assert_eq!(parse_bytes("2G"), Some(2 << 30));
        assert_eq!(parse_bytes("lots"), None);
        assert!(rss_bytes().is_some_and(|r| r > 0));
    }

    #[test]
    fn each_limit_has_its_own_exit_code() {
        let codes = [
            StopLimit::Jobs(1).exit_code(),
            StopLimit::Rss(1).exit_code(),
            StopLimit::Time(Duration::from_secs(1)).exit_code(),
        ];
        assert_eq!(codes, [81, 82, 83]);
    }

    #[test]
    fn a_job_count_set_in_code_is_a_plan_and_from_the_environment_a_restart() {
        let in_code = StopLimits {
            jobs: Some(1),
            ..StopLimits::default()
        };
        assert!(in_code.planned(&StopLimit::Jobs(1)));
        assert!(
            !in_code.planned(&StopLimit::Rss(1)),
            "memory keeps its exit code"
        );
        let from_env = StopLimits {
            jobs: Some(1),
            jobs_from_env: true,
            ..StopLimits::default()
        };
        assert!(!from_env.planned(&StopLimit::Jobs(1)));
    }
}
