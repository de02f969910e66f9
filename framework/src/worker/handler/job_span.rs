//! The attempt's log span, in a room of its own below the pipeline (which
//! opens it around the handler) and the settle step (which opens it again
//! around the decision), so neither reaches into the other for it.

use rdkafka::message::Message;

use crate::worker::state::RouteEntry;

/// The attempt's log span (`tracing`, not OpenTelemetry): every line
/// logged while the handler runs and the attempt settles, the handler's own
/// events included, carries the job's id, key, route, attempt, partition
/// and offset, so "what happened to order 4711?" is one grep, in the human
/// format and in JSON. Without a subscriber at `info` it is a disabled span
/// and its fields are never computed.
#[inline]
pub(crate) fn log_span<M: Message>(
    entry: &RouteEntry,
    msg: &M,
    id: &str,
    attempt: u32,
) -> tracing::Span {
    tracing::info_span!(
        "job",
        job.id = %id,
        job.key = %String::from_utf8_lossy(msg.key().unwrap_or_default()),
        job.route = %entry.main,
        job.attempt = attempt,
        partition = msg.partition(),
        offset = msg.offset(),
    )
}
