//! Unit tests of `testing`.

use super::*;
use crate::{JobContext, JobError, KafkaConfig, Worker};

#[derive(serde::Serialize, serde::Deserialize)]
struct Step {
    key: String,
    seq: i64,
}
impl Job for Step {
    const NAME: &'static str = "steps";
    const VERSION: u32 = 1;
    const SCHEMA: &'static str = r#"{"type":"record","name":"Step","fields":[{"name":"key","type":"string"},{"name":"seq","type":"long"}]}"#;
    fn key(&self) -> String {
        self.key.clone()
    }
}

type Log = Arc<Mutex<Vec<(String, i64)>>>;

fn recording(log: Log) -> impl crate::worker::Handler<Step, (JobContext,)> {
    move |job: Step, _ctx: JobContext| {
        let log = log.clone();
        async move {
            // Yield so jobs released together really interleave.
            tokio::task::yield_now().await;
            log.lock().unwrap().push((job.key, job.seq));
            Ok::<(), JobError>(())
        }
    }
}

#[tokio::test]
async fn the_harness_keeps_per_key_order_while_running_keys_in_parallel() {
    let log: Log = Default::default();
    let builder = Worker::builder(KafkaConfig::from_env(), "g")
        .handle(recording(log.clone()))
        .concurrency(8);
    let mut h = Harness::new(builder).unwrap();
    for seq in 0..5 {
        for key in ["a", "b", "c"] {
            h.enqueue(&Step {
                key: key.into(),
                seq,
            })
            .unwrap();
        }
    }
    assert_eq!(h.run().await, 15);
    let log = log.lock().unwrap().clone();
    for key in ["a", "b", "c"] {
        let seqs: Vec<i64> = log
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(seqs, vec![0, 1, 2, 3, 4], "key {key} in order");
    }
    assert_eq!(
        h.flow().max_running,
        3,
        "one job per key at a time, keys in parallel"
    );
    assert_eq!(h.committed("steps"), Some(15));
}

#[tokio::test]
async fn the_harness_pauses_a_partition_at_the_in_flight_bound_and_resumes_it() {
    let log: Log = Default::default();
    let builder = Worker::builder(KafkaConfig::from_env(), "g")
        .handle(recording(log.clone()))
        .concurrency(1)
        .max_in_flight_per_partition(4);
    let mut h = Harness::new(builder).unwrap();
    for seq in 0..20 {
        h.enqueue(&Step {
            key: format!("k{seq}"),
            seq,
        })
        .unwrap();
    }
    assert_eq!(h.run().await, 20);
    let flow = h.flow();
    assert!(flow.pauses >= 4, "paused at the bound: {flow:?}");
    assert_eq!(flow.pauses, flow.resumes, "and always resumed: {flow:?}");
    assert_eq!(flow.max_running, 1);
    assert_eq!(h.committed("steps"), Some(20));
}

#[tokio::test]
async fn a_retry_is_held_until_due_on_the_virtual_clock_and_the_watermark_waits() {
    let builder = Worker::builder(KafkaConfig::from_env(), "g")
        .handle(|job: Step, ctx: JobContext| async move {
            if job.seq == 0 && ctx.attempt == 1 {
                return Err(JobError::server("503"));
            }
            Ok(())
        })
        .retry(crate::retry::RetryPolicy::tiers([Duration::from_secs(5)]));
    let mut h = Harness::new(builder).unwrap();
    for seq in 0..3 {
        h.enqueue(&Step {
            key: "k".into(),
            seq,
        })
        .unwrap();
    }
    h.run().await;
    assert_eq!(h.handled().len(), 2, "the others do not wait for the retry");
    assert_eq!(h.committed("steps"), Some(3));
    assert_eq!(
        h.committed("steps.retry.5s"),
        Some(0),
        "the commit stays below the held record"
    );
    h.advance(Duration::from_millis(4_999)).await;
    assert_eq!(h.handled().len(), 2, "never early");
    h.advance(Duration::from_millis(1)).await;
    assert_eq!(h.handled().len(), 3);
    assert_eq!(h.handled()[2].attempt, 2);
    assert_eq!(h.committed("steps.retry.5s"), Some(1));
}
