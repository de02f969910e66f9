//! The stages a record may pass before its handler, chosen by its topic's
//! role ([`TopicRole`]): a main-topic record goes straight to the handler,
//! unless it carries a run time still ahead (a job enqueued due too soon for
//! any delay bucket, which the producer writes to the main topic); a
//! delay-bucket record hops on to the next bucket until its run time is
//! close ([`crate::delay`]); a retry-tier record that is not due yet (a
//! `Retry-After` longer than the last tier) hops on through the tiers.
//! Either way the remainder of less than one hop is waited out parked,
//! without a handler slot ([`crate::worker::before::park`]).
//!
//! `None` means "run it now"; `Some(outcome)` that the attempt ended here.

use std::time::Duration;

use rdkafka::message::Message;
use tracing::debug;

use crate::headers::JobHeaders;
use crate::worker::before::park::Waiter;
use crate::worker::decision::Outcome;
use crate::worker::settle::forward::Forwarder;
use crate::worker::state::{RouteEntry, TopicRole};

/// The stages of `entry`'s role for `msg`, at `now_ms`.
pub(in crate::worker) async fn before<M: Message>(
    fw: &Forwarder,
    entry: &RouteEntry,
    msg: &M,
    headers: &JobHeaders,
    waiter: &Waiter,
    now_ms: i64,
) -> Option<Outcome> {
    match entry.role {
        TopicRole::Main => match headers.run_at_ms.filter(|r| *r > now_ms) {
            Some(run_at) => due_soon(fw, entry, msg, headers, waiter, now_ms, run_at).await,
            None => None,
        },
        TopicRole::Delay(_) => delayed(fw, entry, msg, headers, waiter, now_ms).await,
        TopicRole::Tier(_) => match headers.run_at_ms.filter(|r| *r > now_ms) {
            Some(run_at) => not_due(fw, entry, msg, headers, waiter, now_ms, run_at).await,
            None => None,
        },
    }
}

/// A record of a delay topic, released at its planned hop time: forwarded
/// to the next delay topic while at least the shortest bucket is left,
/// otherwise the sub-second remainder is waited out.
async fn delayed<M: Message>(
    fw: &Forwarder,
    entry: &RouteEntry,
    msg: &M,
    headers: &JobHeaders,
    waiter: &Waiter,
    now_ms: i64,
) -> Option<Outcome> {
    // Without a run time (a record written by hand) it is due now.
    let run_at = headers.run_at_ms?;
    hop_or_wait(fw, entry, msg, headers, waiter, now_ms, run_at, true).await
}

/// A main-topic record whose run time is still ahead: what is left is
/// waited out parked. A record that has more than a bucket left (written to
/// the main topic by hand, or by a producer that does not hop) takes the
/// delay buckets when its route has them, instead of holding its
/// partition's commit that long.
async fn due_soon<M: Message>(
    fw: &Forwarder,
    entry: &RouteEntry,
    msg: &M,
    headers: &JobHeaders,
    waiter: &Waiter,
    now_ms: i64,
    run_at: i64,
) -> Option<Outcome> {
    hop_or_wait(
        fw,
        entry,
        msg,
        headers,
        waiter,
        now_ms,
        run_at,
        entry.delays,
    )
    .await
}

/// The next delay bucket for a job due at `run_at` (when `may_hop` and at
/// least the shortest bucket is left), or the wait for the rest. The hop is
/// planned from the clock, not from the record's planned release: the next
/// bucket then releases in write order (see `crate::delay`), and a hop
/// released late (after a restart) is followed by a shorter one.
#[allow(clippy::too_many_arguments)] // the stages' common inputs, plus the two that differ
async fn hop_or_wait<M: Message>(
    fw: &Forwarder,
    entry: &RouteEntry,
    msg: &M,
    headers: &JobHeaders,
    waiter: &Waiter,
    now_ms: i64,
    run_at: i64,
    may_hop: bool,
) -> Option<Outcome> {
    let Some(hop) = crate::delay::next_hop(now_ms, run_at).filter(|_| may_hop) else {
        // Against the pipeline's clock, as every other stage waits: the
        // harness's virtual clock then decides this wait too.
        return wait_out(waiter, run_at - now_ms).await;
    };
    let target = crate::delay::delay_topic(&entry.delays_at, hop.bucket);
    let next = hop_headers(fw, msg, headers, hop.release_ms);
    debug!(job.id = next.id.as_deref().unwrap_or(""), at = %format_args!("{}:{}", msg.partition(), msg.offset()), next = %target, release_ms = hop.release_ms, run_at_ms = run_at, "delayed job hops on");
    Some(
        fw.forward_as(&target, &entry.main, msg, &next, None, Outcome::Delayed)
            .await,
    )
}

/// A retry-tier record released before its run time (see
/// [`crate::retry::RetryPlan::release`]): forwarded to the longest tier that
/// does not overshoot what is left, its attempt unchanged, or, when less
/// than the shortest tier is left, waited out.
async fn not_due<M: Message>(
    fw: &Forwarder,
    entry: &RouteEntry,
    msg: &M,
    headers: &JobHeaders,
    waiter: &Waiter,
    now_ms: i64,
    run_at: i64,
) -> Option<Outcome> {
    let left = Duration::from_millis(u64::try_from(run_at - now_ms).unwrap_or(0));
    let hop = entry.retry.hop(left).and_then(|t| {
        let delay = entry.retry.tier_delay(t)?;
        Some((entry.retry.tier_topic(&entry.tiers_at, t)?, delay))
    });
    let Some((target, delay)) = hop else {
        return wait_out(waiter, run_at - now_ms).await;
    };
    let release_ms = now_ms.saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX));
    let next = hop_headers(fw, msg, headers, release_ms);
    debug!(job.id = next.id.as_deref().unwrap_or(""), at = %format_args!("{}:{}", msg.partition(), msg.offset()), next = %target, run_at_ms = run_at, "retry not due yet hops on");
    Some(
        fw.forward_as(&target, &entry.main, msg, &next, None, Outcome::Delayed)
            .await,
    )
}

/// The headers of a hop: the same job (its id written, for a record that
/// had none), released at `release_ms`, hopped on by this group only
/// (another group reading the same topic skips it, as it skips our retries).
fn hop_headers<M: Message>(
    fw: &Forwarder,
    msg: &M,
    headers: &JobHeaders,
    release_ms: i64,
) -> JobHeaders {
    let mut next = headers.clone();
    next.id = Some(headers.job_id(msg.topic(), msg.partition(), msg.offset()));
    next.due_at_ms = Some(release_ms);
    next.group = Some(fw.group.clone());
    next
}

/// Waits `left_ms` parked: `None` (run it) once it passed, `Released` if
/// the job was released meanwhile.
async fn wait_out(waiter: &Waiter, left_ms: i64) -> Option<Outcome> {
    let Ok(ms) = u64::try_from(left_ms) else {
        return None;
    };
    if ms == 0 {
        return None;
    }
    let due = tokio::time::sleep(Duration::from_millis(ms));
    waiter
        .wait(due)
        .await
        .is_none()
        .then_some(Outcome::Released)
}
