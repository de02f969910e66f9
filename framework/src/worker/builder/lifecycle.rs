//! How a worker joins its group, commits, stops and hands partitions
//! over: membership, commit interval, grace periods and run limits.

use crate::membership::GroupProtocol;
use crate::worker::builder::WorkerBuilder;
use std::time::Duration;

impl WorkerBuilder {
    /// How long in-flight jobs may run after SIGTERM before they are cancelled
    /// (default 30 s). Keep it below your orchestrator's kill timeout.
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.settings.shutdown_grace = d;
        self
    }

    /// How long a revoke waits for in-flight jobs before giving the partition
    /// up anyway (default 15 s).
    pub fn revoke_timeout(mut self, d: Duration) -> Self {
        self.settings.revoke_timeout = d;
        self
    }

    /// How often finished work is committed (default 1 s). Shorter means
    /// fewer duplicates after a crash, at the cost of more commit traffic.
    pub fn commit_interval(mut self, d: Duration) -> Self {
        self.settings.commit_interval = d;
        self
    }

    /// Static group membership (`group.instance.id`): a member that restarts
    /// within the session timeout gets its partitions back without a
    /// rebalance of the others, which suits rolling deploys and crash loops.
    /// Defaults to `KJOB_INSTANCE_ID` when that is set. Use a stable,
    /// per-replica name (a StatefulSet pod name); two live processes must
    /// never share one. See the book's chapter on deploys and rebalances.
    pub fn static_member(mut self, instance_id: impl Into<String>) -> Self {
        self.static_member = Some(instance_id.into());
        self
    }

    /// Stops gracefully after `n` jobs were handled, and `run` returns
    /// `Ok`: a run of `n` jobs (a script, a test, the hello). The same
    /// count from `KJOB_STOP_AFTER_JOBS` is a supervisor's restart policy
    /// and ends with `Error::LimitReached` (exit status 81); see the book's
    /// chapter on limits.
    pub fn stop_after_jobs(mut self, n: u64) -> Self {
        self.stop_limits.jobs = Some(n);
        self
    }

    /// Stops gracefully once the process's resident memory exceeds `bytes`
    /// (see the book's chapter on limits; also `KJOB_STOP_ABOVE_RSS`).
    pub fn stop_above_rss(mut self, bytes: u64) -> Self {
        self.stop_limits.rss = Some(bytes);
        self
    }

    /// Stops gracefully after running for `d` (see the book's chapter on limits; also
    /// `KJOB_STOP_AFTER`).
    pub fn stop_after(mut self, d: Duration) -> Self {
        self.stop_limits.time = Some(d);
        self
    }

    /// The rebalance protocol (default: `KJOB_GROUP_PROTOCOL`, else
    /// [`GroupProtocol::Classic`]). A `group.protocol` set on the
    /// [`KafkaConfig`](crate::KafkaConfig) is honoured too. See the book's chapter on deploys and rebalances for what each
    /// costs on a deploy and on a crash.
    pub fn group_protocol(mut self, protocol: GroupProtocol) -> Self {
        self.protocol = Some(protocol);
        self
    }
}
