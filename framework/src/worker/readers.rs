//! The check at start that each route can read what producers write to
//! its topic: the route's reader schema against every version registered
//! under the topic's subject (TopicNameStrategy, `<topic>-value`), before
//! the first poll.
//!
//! Why at start: a rolling deploy changes the reader of every record still
//! waiting. A reader that cannot read the newest writer would turn each
//! job producers send now into a dead letter, so the worker refuses to
//! start and names the subject, the version and the field
//! ([`Error::ReaderCannotRead`]). An older version it cannot read is a
//! warning: records of it may be long gone, and `kjob schema check
//! --in-flight` tells whether any still wait. An empty subject is a warning
//! too: nothing was registered under the topic yet, so a SQL enqueue to it
//! (`kjob.enqueue(...)`) is dead-lettered until a contract is.

use tracing::warn;

use crate::codec::subject_for_topic;
use crate::error::{Error, Result};
use crate::schema::{can_read, registered_versions};

use super::state::TopicRole;
use super::Worker;

impl Worker {
    /// Checks every route's reader against its topic's subject (see the
    /// module's docs).
    pub(super) async fn check_readers(&self) -> Result<()> {
        let client = self.codec.client();
        for (topic, entry) in &self.routes {
            if entry.role != TopicRole::Main || *topic != entry.main {
                continue;
            }
            let route = &entry.route;
            let subject = subject_for_topic(topic);
            let versions = registered_versions(client, &subject).await?;
            let Some(((newest, writer), older)) = versions.split_last() else {
                warn!(
                    topic = %topic, subject = %subject, job = route.job_name(),
                    "no contract is registered under this topic's subject yet: producers register theirs at their first enqueue, but a SQL enqueue (kjob.enqueue) to this topic is dead-lettered until one is; register it with `kjob schema register --topic {topic}`"
                );
                continue;
            };
            let reader = route.reader().schema();
            if let Err(reason) = can_read(writer, reader) {
                return Err(Error::ReaderCannotRead {
                    job: route.job_name().to_string(),
                    version: route.job_version(),
                    topic: topic.clone(),
                    subject,
                    writer_version: *newest,
                    reason,
                });
            }
            for (version, writer) in older {
                if let Err(reason) = can_read(writer, reader) {
                    warn!(
                        topic = %topic, subject = %subject, job = route.job_name(),
                        writer_version = version, reason = %reason,
                        "this reader cannot read an older registered version: any of its records still waiting will be dead-lettered; see which wait with `kjob schema check --in-flight`"
                    );
                }
            }
        }
        Ok(())
    }
}
