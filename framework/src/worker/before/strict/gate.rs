//! The gate a record of a strict route passes before its handler: it
//! runs (its key's head, or a key with no chain), is skipped (a copy of a
//! finished job), waits in memory for a head that finishes soon, or is
//! parked in a retry tier behind the head.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rdkafka::message::Message;
use tokio::sync::Notify;
use tracing::{debug, warn};

use super::chains::park_tier;
use super::{keep_ms, order_topic, set_follows, Admit, Admitted, Cancelled, Strict};
use crate::headers::JobHeaders;
use crate::worker::before::park::Waiter;
use crate::worker::decision::Outcome;
use crate::worker::settle::forward::Forwarder;
use crate::worker::state::{RouteEntry, WorkerStats};

/// How long past its due time a head that has not come back is still
/// waited for in memory: beyond it, the head's record may be queued
/// behind the waiting one (the same lane), which then parks to let it by.
const DUE_GRACE_MS: i64 = 500;

/// The longest a follower waits in memory for its turn before it is
/// parked in a tier (its offset stays uncommitted meanwhile).
const WAIT_MAX: Duration = Duration::from_secs(5);

/// A partition's followers waiting in memory for their turn, and what
/// wakes them when one of its chains changed.
#[derive(Default)]
pub(crate) struct Waiting {
    pub(super) changed: Notify,
    /// How many records of each job id wait here now.
    ids: Mutex<HashMap<String, usize>>,
}

impl Waiting {
    pub(super) fn contains(&self, id: &str) -> bool {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(id)
    }
}

/// Counts a record of `id` as waiting in memory while it lives.
struct WaitingHere<'w> {
    waiting: &'w Waiting,
    id: &'w str,
}

impl<'w> WaitingHere<'w> {
    fn new(waiting: &'w Waiting, id: &'w str) -> Self {
        *waiting
            .ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id.to_string())
            .or_default() += 1;
        Self { waiting, id }
    }
}

impl Drop for WaitingHere<'_> {
    fn drop(&mut self) {
        let mut ids = self
            .waiting
            .ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = ids.get_mut(self.id) {
            *n -= 1;
            if *n == 0 {
                ids.remove(self.id);
            }
        }
    }
}

impl Strict {
    /// The gate of `msg`, when it is under strict order (a keyed record of
    /// a strict route's main topic or tier).
    pub(crate) fn gate<'s, 'm, M: Message>(
        &'s self,
        entry: &RouteEntry,
        msg: &'m M,
    ) -> Option<Gate<'s, 'm>> {
        let key = msg.key()?;
        self.covers(entry).then_some(Gate {
            strict: self,
            key,
            partition: msg.partition(),
        })
    }
}

/// Parks `msg` (not run) in a retry tier of its route ([`park_tier`]),
/// on the same partition, its attempt unchanged, with `kjob-follows`
/// naming the job it waits for; answers the outcome, the tier and when
/// the record comes back (epoch ms). `None` when the route has no tier to
/// park in (its policy lost them while a chain was open): the record
/// then runs, out of strict order, rather than wait forever.
#[allow(clippy::too_many_arguments)]
async fn park<M: Message>(
    fw: &Forwarder,
    entry: &RouteEntry,
    msg: &M,
    headers: &JobHeaders,
    id: &str,
    head: &str,
    head_due_ms: Option<i64>,
    now_ms: i64,
) -> Option<(Outcome, String, i64)> {
    let i = park_tier(&entry.retry.tiers, now_ms, head_due_ms);
    let Some(tier) = entry.retry.tiers.get(i).copied() else {
        warn!(
            job.id = id, follows = head,
            "strict order: the route has no retry tier to park this job in; running it out of order"
        );
        return None;
    };
    if let Some(late_ms) = overdue(&entry.retry.tiers, now_ms, head_due_ms) {
        // Order is never given up on a timer (a long outage would then
        // reorder every waiting key); an operator decides.
        warn!(
            job.id = id, follows = head, late_ms, order_topic = %order_topic(&entry.main),
            "strict order: the job this key waits for is overdue in its retry tier. If its \
             record is gone (a tier topic deleted, strict order turned off and on again), \
             the key waits forever: clear it by writing a tombstone for the key to the order \
             topic"
        );
    }
    let topic = crate::retry::tier_topic(&entry.main, tier);
    let mut next = headers.clone();
    next.id = Some(id.to_string());
    let due_ms = now_ms + tier.as_millis() as i64;
    next.due_at_ms = Some(due_ms);
    next.group = Some(fw.group.clone());
    if next.original_topic.is_none() {
        next.original_topic = Some(msg.topic().to_string());
        next.original_partition = Some(msg.partition());
        next.original_offset = Some(msg.offset());
        next.original_timestamp_ms = msg.timestamp().to_millis();
    }
    set_follows(&mut next, Some(head));
    debug!(job.id = id, follows = head, at = %format_args!("{}:{}:{}", msg.topic(), msg.partition(), msg.offset()), next = %topic, "strict order: waiting behind the key's job in the retry path");
    let pin = Some(msg.partition());
    let outcome = fw
        .forward_as(&topic, &entry.main, msg, &next, pin, Outcome::Held)
        .await;
    if outcome == Outcome::Held {
        fw.metrics.outcome(entry.handler.job_name(), "held");
    }
    Some((outcome, topic, due_ms))
}

/// A record under strict order: the state, its key and its partition.
#[derive(Clone, Copy)]
pub(crate) struct Gate<'s, 'm> {
    strict: &'s Strict,
    key: &'m [u8],
    partition: i32,
}

impl Gate<'_, '_> {
    /// Before the handler: `None` if the record is its key's head (or the
    /// key has no chain) and runs. A copy of a finished job ends here,
    /// not run. Any other record follows the head: it waits in memory,
    /// its slot given back, when the head runs here now or is due within
    /// the wait ([`wait_until`]), and runs the moment its turn comes;
    /// otherwise (or when that wait is over) it is parked in a retry tier
    /// behind the head and the attempt ends here.
    pub(crate) async fn before<M: Message>(
        &self,
        fw: &Forwarder,
        entry: &RouteEntry,
        msg: &M,
        headers: &JobHeaders,
        waiter: &Waiter,
        now_ms: i64,
    ) -> Option<Outcome> {
        let id = headers.job_id(msg.topic(), msg.partition(), msg.offset());
        let waiting = self.strict.waiting(&entry.main, self.partition);
        // Counted from the first wait on, so a follower of this record that
        // looks meanwhile knows it runs soon.
        let mut here = None;
        // The head seen last, and until when a new head is waited for
        // while its record reaches the worker (it may be queued behind the
        // old head's, on the same lane).
        let mut seen: Option<String> = None;
        let mut new_head_until = i64::MIN;
        // Only a waiter that gives its slot back waits in memory (the
        // harness's keeps it, and runs on a virtual clock).
        let mut now_ms = now_ms;
        // A new head that is due soon extends the wait by one window, up
        // to two in all: the key is moving, and a park now would cost a
        // whole tier delay.
        let window = wait_window(&entry.retry.tiers).as_millis() as i64;
        let entered = crate::clock::now_ms();
        let mut window_end = waiter.parks().then_some(entered + window);
        loop {
            // Registered before the chain is read, so a change between the
            // read and the wait is not missed.
            let notified = waiting.changed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let Ok(Admitted {
                admit,
                head_running,
                head_topic,
            }) = self.admit(&entry.main, &id).await
            else {
                return Some(Outcome::Released);
            };
            let (head, head_due_ms) = match admit {
                Admit::Run => return None,
                Admit::Duplicate => return Some(duplicate(fw, entry, msg, &id)),
                Admit::Follow {
                    head, head_due_ms, ..
                } => (head, head_due_ms),
            };
            let now = crate::clock::now_ms();
            if seen.as_ref().is_some_and(|s| *s != head) {
                new_head_until = now + DUE_GRACE_MS;
                window_end =
                    window_end.map(|end| end.max((now + window).min(entered + 2 * window)));
            }
            seen = Some(head.clone());
            // The head's record waits in the topic this one came from: it
            // may be queued behind this one on the key's lane there, so
            // this one parks (behind it) rather than wait.
            let same_lane = !head_running && head_topic.as_deref() == Some(msg.topic());
            let until = window_end.filter(|_| !same_lane).and_then(|end| {
                if !head_running && now < new_head_until {
                    return Some(end.min(new_head_until)).filter(|u| *u > now);
                }
                wait_until(now, end, head_running, head_due_ms)
            });
            let Some(until) = until else {
                let parked = park(fw, entry, msg, headers, &id, &head, head_due_ms, now_ms).await;
                if let Some((Outcome::Held, tier, due_ms)) = &parked {
                    // Best effort: a worker giving up here loses only the hint.
                    let _ = self
                        .strict
                        .parked(&entry.main, self.partition, self.key, &id, tier, *due_ms)
                        .await;
                }
                return parked.map(|(outcome, ..)| outcome);
            };
            if here.is_none() {
                debug!(job.id = %id, follows = %head, wait_ms = until - now, "strict order: waiting in memory for the key's turn");
                here = Some(WaitingHere::new(&waiting, &id));
            }
            let wait =
                tokio::time::timeout(Duration::from_millis((until - now).max(0) as u64), notified);
            if waiter.wait(wait).await.is_none() {
                return Some(Outcome::Released);
            }
            now_ms = now_ms.max(crate::clock::now_ms());
            // Changed or timed out: look again (a wait that is over parks).
        }
    }

    /// See [`Strict::admit`].
    pub(crate) async fn admit(
        &self,
        main: &str,
        id: &str,
    ) -> std::result::Result<Admitted, Cancelled> {
        self.strict.admit(main, self.partition, self.key, id).await
    }

    /// See [`Strict::retrying`] (`topic`: the tier it goes to); `false`
    /// when the worker gave up.
    pub(crate) async fn retrying(
        &self,
        main: &str,
        id: &str,
        due_ms: Option<i64>,
        topic: &str,
    ) -> bool {
        self.strict
            .retrying(main, self.partition, self.key, id, due_ms, topic)
            .await
            .is_ok()
    }

    /// The head's retry record was forwarded (or given up on): its
    /// followers look again ([`Strict::wake`]).
    pub(crate) fn forwarded(&self, main: &str) {
        self.strict.wake(main, self.partition);
    }

    /// See [`Strict::finished`]; `false` when the worker gave up.
    pub(crate) async fn finished(&self, entry: &RouteEntry, id: &str) -> bool {
        self.strict
            .finished(
                &entry.main,
                self.partition,
                self.key,
                id,
                keep_ms(&entry.retry.tiers),
            )
            .await
            .is_ok()
    }

    /// The partition a forward of this record is pinned to.
    pub(crate) fn partition(&self) -> i32 {
        self.partition
    }
}

/// Until when (epoch ms) a follower looked at at `now_ms` waits in memory
/// rather than being parked, `window_end` being the end of its wait: while
/// the job it follows runs here (it finishes soon), or while that job is
/// due in its tier within the window (and until shortly past its due
/// time). `None`: park it.
fn wait_until(
    now_ms: i64,
    window_end: i64,
    head_running: bool,
    head_due_ms: Option<i64>,
) -> Option<i64> {
    if now_ms >= window_end {
        return None;
    }
    if head_running {
        return Some(window_end);
    }
    let due = head_due_ms.filter(|d| *d <= window_end)?;
    let until = window_end.min(due + DUE_GRACE_MS);
    (until > now_ms).then_some(until)
}

/// How long a follower of a route with `tiers` may wait in memory: two
/// first-tier delays (a head that just failed is due within one, plus its
/// jitter), at most [`WAIT_MAX`].
fn wait_window(tiers: &[Duration]) -> Duration {
    tiers
        .first()
        .map_or(Duration::ZERO, |t| (*t * 2).min(WAIT_MAX))
}

/// A copy of a finished job: not run, its offset done.
fn duplicate<M: Message>(fw: &Forwarder, entry: &RouteEntry, msg: &M, id: &str) -> Outcome {
    WorkerStats::bump(&fw.stats.duplicates);
    fw.metrics.outcome(entry.handler.job_name(), "duplicate");
    debug!(
        job.id = id,
        topic = msg.topic(),
        partition = msg.partition(),
        offset = msg.offset(),
        outcome = "duplicate",
        "strict order: a copy of a job its key already finished; not run"
    );
    Outcome::Duplicate
}

/// How long (ms) the head is past its due time, when that is more than
/// the route's longest tier delay: longer than any tier hold or re-park
/// explains, so worth a warning.
fn overdue(tiers: &[Duration], now_ms: i64, head_due_ms: Option<i64>) -> Option<i64> {
    let longest = tiers.iter().max()?.as_millis() as i64;
    let late = now_ms - head_due_ms?;
    (late > longest).then_some(late)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_waits_in_memory_only_for_a_head_that_finishes_soon() {
        // The window ends at 2 000.
        assert_eq!(
            wait_until(0, 2_000, true, None),
            Some(2_000),
            "the head runs here"
        );
        assert_eq!(
            wait_until(0, 2_000, false, None),
            None,
            "the head is somewhere in a tier"
        );
        assert_eq!(
            wait_until(0, 2_000, false, Some(1_000)),
            Some(1_500),
            "due soon"
        );
        assert_eq!(wait_until(0, 2_000, false, Some(1_800)), Some(2_000));
        assert_eq!(
            wait_until(0, 2_000, false, Some(9_000)),
            None,
            "due too late"
        );
        assert_eq!(
            wait_until(1_600, 2_000, false, Some(1_000)),
            None,
            "past its due time: its record may be behind this one"
        );
        assert_eq!(
            wait_until(2_000, 2_000, true, None),
            None,
            "the wait is over"
        );
        let s = Duration::from_secs;
        assert_eq!(
            wait_window(&[s(1), s(10)]),
            s(2),
            "a head just failed is due in 1.1 s"
        );
        assert_eq!(wait_window(&[s(30)]), WAIT_MAX);
        assert_eq!(
            wait_window(&[]),
            Duration::ZERO,
            "no tier: nothing to wait for"
        );
    }

    #[test]
    fn a_head_is_overdue_only_beyond_the_longest_tier() {
        let tiers = [Duration::from_secs(5), Duration::from_secs(30)];
        assert_eq!(overdue(&tiers, 100_000, None), None);
        assert_eq!(overdue(&tiers, 100_000, Some(90_000)), None);
        assert_eq!(overdue(&tiers, 100_000, Some(70_000)), None);
        assert_eq!(overdue(&tiers, 100_000, Some(60_000)), Some(40_000));
        assert_eq!(overdue(&[], 100_000, Some(0)), None);
    }
}
