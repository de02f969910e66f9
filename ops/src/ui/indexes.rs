//! The dashboard's DLQ indexes, one per route, started by the first request
//! for that route's DLQ and kept (and followed) for the process's life, so
//! no later request reads the topic (see [`crate::dlq::index`]).

use std::sync::Arc;

use anyhow::{anyhow, Result};

use super::AppState;
use crate::dlq::index::{tail, DlqIndex};
use crate::dlq::missing_dlq;

impl AppState {
    /// The index of the DLQ of `topic` (the main topic or the DLQ itself),
    /// started if this is its first request. A DLQ that does not exist is
    /// the error `kjob dlq list` gives for it, and no index is kept.
    pub(super) async fn dlq_index(&self, topic: &str) -> Result<Arc<DlqIndex>> {
        let main = topic.strip_suffix(".dlq").unwrap_or(topic).to_string();
        if let Some(i) = self.indexes.lock().ok().and_then(|m| m.get(&main).cloned()) {
            return Ok(i);
        }
        let (cfg, dlq) = (self.config.clone(), kjob::topics::dlq_topic(&main));
        let exists =
            tokio::task::spawn_blocking(move || kjob::topics::partition_counts(&cfg, &[dlq]))
                .await
                .map_err(|e| anyhow!("background task: {e}"))??
                .pop()
                .flatten()
                .is_some();
        if !exists {
            return Err(missing_dlq(&self.config, &main).await);
        }
        let mut map = self
            .indexes
            .lock()
            .map_err(|_| anyhow!("the index registry is poisoned"))?;
        if let Some(i) = map.get(&main) {
            return Ok(i.clone());
        }
        let index = Arc::new(DlqIndex::new(&main));
        tail::spawn(&self.config, &index)?;
        map.insert(main, index.clone());
        Ok(index)
    }
}
