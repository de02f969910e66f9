//! The counts a batch's callback is told, in its own module: the job
//! context carries one (`JobContext::batch_report`), and the job module
//! must not depend on the batch machinery that depends on it.

use serde::{Deserialize, Serialize};

/// What a batch's callback is told: the counts when it fired.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchReport {
    /// The batch id.
    pub batch: String,
    /// Jobs enqueued into the batch.
    pub total: u64,
    /// Jobs that succeeded.
    pub succeeded: u64,
    /// Jobs that were dead-lettered.
    pub dead_lettered: u64,
}

impl BatchReport {
    /// Reads the `kjob-batch-report` header; `None` if it is not one.
    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }
}
