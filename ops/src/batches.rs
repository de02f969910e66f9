//! Batches as operators see them: the state topic's snapshots (one per
//! batch, written by its coordinator at most half a second after a change)
//! and the cancel command.
//!
//! Cancelling writes a `cancelled` event with who and why to the batch
//! topic: the coordinator applies it in order with the batch's other
//! events, fires no callback afterwards, and keeps counting the jobs that
//! still finish. The event itself is the audit record, shown by
//! `kjob batches show`.

use kjob::batch::{state_topic, BatchState, Event};
use kjob::{KafkaConfig, Producer};
use rdkafka::message::OwnedHeaders;

use crate::problem::Problem;

/// Every batch recorded on the state topic of `topic`, the newest first.
/// Empty when the state topic does not exist yet. Blocking.
pub fn list(config: &KafkaConfig, topic: &str) -> anyhow::Result<Vec<BatchState>> {
    let latest = kjob::batch::read_states(config, topic, None)?;
    let mut out: Vec<BatchState> = latest.into_values().collect();
    out.sort_by(|a, b| {
        b.opened_ms
            .cmp(&a.opened_ms)
            .then_with(|| a.batch.cmp(&b.batch))
    });
    Ok(out)
}

/// One batch; a usage problem naming the known ones when it is unknown.
pub fn show(config: &KafkaConfig, topic: &str, batch: &str) -> anyhow::Result<BatchState> {
    let all = list(config, topic)?;
    let names: Vec<String> = all.iter().map(|b| b.batch.clone()).collect();
    all.into_iter().find(|b| b.batch == batch).ok_or_else(|| {
        let hint = crate::suggest::did_you_mean(batch, names.iter().map(String::as_str));
        Problem::not_found(format!(
            "no batch `{batch}` on `{}`{hint}; `kjob batches list` lists them",
            state_topic(topic)
        ))
        .into()
    })
}

/// Cancels `batch`: no callback fires. Refused for a batch that is
/// complete or already cancelled.
pub async fn cancel(
    config: &KafkaConfig,
    topic: &str,
    batch: &str,
    by: &str,
    reason: &str,
) -> anyhow::Result<BatchState> {
    let state = {
        let (c, t, b) = (config.clone(), topic.to_string(), batch.to_string());
        tokio::task::spawn_blocking(move || show(&c, &t, &b)).await??
    };
    if !state.is_open() {
        return Err(Problem::refused(format!(
            "batch `{batch}` is {}: only an open or running batch can be cancelled",
            state.status().as_str()
        ))
        .into());
    }
    let producer = Producer::new(config)?;
    let event = Event::Cancelled {
        batch: batch.to_string(),
        at_ms: kjob::clock::now_ms(),
        by: by.to_string(),
        reason: reason.to_string(),
    };
    producer
        .send_raw(
            topic,
            Some(batch.as_bytes()),
            Some(&event.to_json()),
            OwnedHeaders::new(),
        )
        .await?;
    Ok(state)
}
