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
//! (`kjob.enqueue(...)`) is dead-lettered until a contract is. A registry
//! that cannot answer the question (a permission, a schema this Avro
//! library does not parse) is a warning as well: only a verdict on the
//! newest version stops a start.

use tracing::warn;

use crate::codec::subject_for_topic;
use crate::error::{Error, Result};
use apache_avro::Schema;

use crate::schema::can_read;

use crate::worker::state::TopicRole;
use crate::worker::Worker;

impl Worker {
    /// Checks every route's reader against its topic's subject (see the
    /// module's docs).
    pub(in crate::worker) async fn check_readers(&self) -> Result<()> {
        let client = self.codec.client();
        for (topic, entry) in &self.routes {
            if entry.role != TopicRole::Main || *topic != entry.main {
                continue;
            }
            let route = &entry.handler;
            let reader = route.reader().schema();
            let subject = subject_for_topic(topic);
            // The newest version: what producers write now. Only its
            // verdict can stop the start; a registry that cannot say (a
            // 403, a schema kjob's Avro library cannot parse) is a warning,
            // and decoding will tell per record.
            let newest = match client.subject_version(&subject, None).await {
                Ok(Some(v)) => v,
                Ok(None) => {
                    warn!(
                        topic = %topic, subject = %subject, job = route.job_name(),
                        "no contract is registered under this topic's subject yet: producers register theirs at their first enqueue, but a SQL enqueue (kjob.enqueue) to this topic is dead-lettered until one is; register it with `kjob schema register --topic {topic}`"
                    );
                    continue;
                }
                Err(e) => {
                    warn!(topic = %topic, subject = %subject, error = %e, "could not read the newest version under this topic's subject; the route's reader is not checked at start");
                    continue;
                }
            };
            let writer = match Schema::parse_str(&newest.schema) {
                Ok(w) => w,
                Err(e) => {
                    warn!(topic = %topic, subject = %subject, version = newest.version, error = %e, "the newest version under this topic's subject does not parse; the route's reader is not checked at start");
                    continue;
                }
            };
            if let Err(reason) = can_read(&writer, reader) {
                return Err(Error::ReaderCannotRead {
                    job: route.job_name().to_string(),
                    version: route.job_version(),
                    topic: topic.clone(),
                    subject,
                    writer_version: newest.version,
                    reason,
                });
            }
            // Older versions: a warning each, never a refusal.
            let older = match client.versions(&subject).await {
                Ok(v) => v,
                Err(_) => continue,
            };
            for version in older.into_iter().filter(|v| *v < newest.version) {
                let Ok(text) = client.version(&subject, version).await else {
                    continue;
                };
                let Ok(writer) = Schema::parse_str(&text) else {
                    continue;
                };
                if let Err(reason) = can_read(&writer, reader) {
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
