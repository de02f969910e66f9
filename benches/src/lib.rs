//! Shared pieces of the benchmark harnesses.

use kjob::Job;
use serde::{Deserialize, Serialize};

/// The benchmark job: the test contract's shape. The serde name equals the
/// Avro record name, so decoding takes the direct (no value tree) path.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename = "TestJob")]
pub struct BenchJob {
    /// Partition key.
    pub key: String,
    /// Sequence number.
    pub seq: i64,
    /// Unused by the benches ("ok").
    pub behaviour: String,
}

impl BenchJob {
    /// A job with key `k{seq % keys}`.
    pub fn new(seq: i64, keys: i64) -> Self {
        Self {
            key: format!("k{}", seq % keys.max(1)),
            seq,
            behaviour: "ok".into(),
        }
    }
}

impl Job for BenchJob {
    const NAME: &'static str = "kjob.bench.job";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = include_str!("../../schemas/kjob.test.job.v1.avsc");
    fn key(&self) -> String {
        self.key.clone()
    }
}
