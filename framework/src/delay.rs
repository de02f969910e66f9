//! Delayed jobs: where a job waits until its time, and how it gets there.
//!
//! A delayed job never waits in the worker's memory for long, and never in
//! a side database: it waits in *delay topics* `<topic>.delay.<bucket>`, one
//! per bucket of [`BUCKETS`] (1 s, 3 s, 10 s, 1 m, 10 m, 1 h, 1 d), with the same
//! due-time hold as the retry tiers (`kjob-due-at`: the worker pauses the
//! partition, seeks back to the record and resumes at the due time).
//!
//! **Why buckets, and why hops.** A hold pauses a whole partition, so a
//! partition must release its records in the order they were written. Every
//! record written to bucket `b` is therefore released exactly `b` after its
//! hop began, whatever its own delay. A job whose run time is `D` goes to the
//! longest bucket not longer than what is left, hops again when released,
//! each time to the longest bucket that still fits, and when less than the
//! shortest bucket is left it runs from the delay topic it is in (after
//! waiting out the sub-second remainder in the worker, see below).
//!
//! **Every record of a bucket is released in write order, by construction.**
//! A record written to bucket `b` at time `w` is released at `w + b`: the
//! producer and the worker both plan a hop from the clock when they write
//! it, never from an earlier plan. So a record can never be due before
//! the records ahead of it in its partition. (Planning from the previous
//! hop's planned release, as kjob did before, broke this after a restart:
//! catch-up hops written late were due before records already waiting, and
//! waited behind them, late at every later hop.) Lateness does not add up
//! either: each hop picks its bucket from what is left until the absolute
//! run time, so a late hop is followed by a shorter one.
//!
//! **A job due now never enters a bucket.** A job with less than the
//! shortest bucket plus [`LEAD`] left when it is enqueued (a short delay, or
//! a time already passed) is written to the main topic with its run time,
//! and the worker waits out the rest there, parked. In a bucket it would
//! wait behind records due up to a bucket later.
//!
//! **The remainder.** Hops are planned towards `D` minus [`LEAD`] (250 ms),
//! so what is left after the last hop is between `LEAD` and `LEAD` plus the
//! shortest bucket. The worker waits it out as part of the attempt, so a job
//! runs no earlier than `D` and typically a few milliseconds after it, even
//! when resuming the held partition took a few hundred milliseconds. The
//! job waits 0.25 to 1.5 s (records are released up to [`HOLD_SLACK`]
//! early, so that one resume of a held partition takes a batch) parked,
//! without a concurrency slot, so other jobs run meanwhile.
//!
//! **Run where it is.** The last hop does not go back to the main topic: the
//! job runs from its delay topic, like a retry runs from its tier. It never
//! queues behind a main-topic backlog, and it never blocks its key: while it
//! waits, later jobs with the same key on the main topic run; when it runs,
//! it runs in its own partition's lane. A delayed job is *not* ordered with
//! the main-topic jobs of its key (as a retry is not).
//!
//! **Retention.** A record sits in bucket `b` for about `b`. A delay is
//! refused unless each delay topic it passes through keeps records for at
//! least [`RETENTION_FACTOR`] times its bucket, so a worker outage as long as
//! the bucket loses nothing; topics the worker creates keep 7 days.
//!
//! This module is pure arithmetic, shared by the producer and the worker.

use std::time::Duration;

/// The delay buckets, shortest first. Each is a topic `<topic>.delay.<b>`.
/// The 3 s bucket keeps short delays to a few hops: with 1 s and 10 s
/// alone a 9 s delay hopped nine times through the 1 s topic, and a burst
/// of short delays kept that topic's partitions hopping every second.
pub const BUCKETS: [Duration; 7] = [
    Duration::from_secs(1),
    Duration::from_secs(3),
    Duration::from_secs(10),
    Duration::from_secs(60),
    Duration::from_secs(600),
    Duration::from_secs(3600),
    Duration::from_secs(86_400),
];

/// The last hop is planned to end this long before the run time, and the
/// rest is waited out in the attempt: a partition resumed at its due time
/// needs a fetch round trip (and, on a busy machine, a scheduling delay)
/// before the record is back, so a job released exactly at its run time
/// would run that much late.
pub const LEAD: Duration = Duration::from_millis(250);

/// A delay-topic record is released this much before its planned hop time.
/// Harmless (a hop's next time is planned from the planned time, not the
/// clock, and the last stage waits until the run time), and it lets one
/// resume of a held partition take every record due in the next 250 ms,
/// instead of a pause, seek and resume per record.
pub const HOLD_SLACK: Duration = Duration::from_millis(250);

/// The longest delay accepted (30 days).
pub const MAX_DELAY: Duration = Duration::from_secs(30 * 86_400);

/// A delay topic must keep records this many times its bucket.
pub const RETENTION_FACTOR: u32 = 2;

/// `retention.ms` of the delay topics a worker or `kjob topics create` makes
/// (7 days): three and a half times the longest bucket.
pub const CREATED_RETENTION: Duration = Duration::from_secs(7 * 86_400);

/// `<topic>.delay.<bucket>`, e.g. `orders.confirmation.delay.10s`.
pub fn delay_topic(topic: &str, bucket: usize) -> String {
    let b = BUCKETS[bucket.min(BUCKETS.len() - 1)];
    format!("{topic}.delay.{}", bucket_name(b))
}

/// Every delay topic of main topic `topic`, shortest bucket first.
pub fn delay_topics(topic: &str) -> Vec<String> {
    (0..BUCKETS.len()).map(|i| delay_topic(topic, i)).collect()
}

/// The delay of the bucket named `name` (`1s` ... `1d`, as in
/// `<topic>.delay.<name>`), `None` for a name no bucket has.
pub fn bucket_delay(name: &str) -> Option<Duration> {
    BUCKETS.iter().copied().find(|b| bucket_name(*b) == name)
}

/// `1s`, `3s`, `10s`, `1m`, `10m`, `1h`, `1d`.
fn bucket_name(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 86_400 && s.is_multiple_of(86_400) {
        format!("{}d", s / 86_400)
    } else {
        crate::retry::format_delay(d)
    }
}

/// One hop: the bucket to write to and the record's planned release
/// (`kjob-due-at`, epoch ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hop {
    /// Index into [`BUCKETS`].
    pub bucket: usize,
    /// When the record is released from that bucket (epoch ms).
    pub release_ms: i64,
}

/// The hop that starts at `from_ms` for a job due at `run_at_ms`: the
/// longest bucket not longer than what is left until [`LEAD`] before the
/// run time. `None` when less than the shortest bucket is left: the job
/// runs (after waiting out the remainder, at least `LEAD`).
pub fn next_hop(from_ms: i64, run_at_ms: i64) -> Option<Hop> {
    let left = (run_at_ms - LEAD.as_millis() as i64).saturating_sub(from_ms);
    let bucket = BUCKETS.iter().rposition(|b| b.as_millis() as i64 <= left)?;
    Some(Hop {
        bucket,
        release_ms: from_ms + BUCKETS[bucket].as_millis() as i64,
    })
}

/// The first hop of a job enqueued at `now_ms` to run at `run_at_ms`, or
/// `None` when it is due too soon for any bucket: it is then written to the
/// main topic with its run time, and the worker waits out the rest.
pub fn first_hop(now_ms: i64, run_at_ms: i64) -> Option<Hop> {
    next_hop(now_ms, run_at_ms)
}

/// The buckets a job enqueued at `now_ms` for `run_at_ms` passes through
/// (with repeats) if every hop is on time, for the retention check. Empty
/// for a job due too soon for any bucket.
pub fn path(now_ms: i64, run_at_ms: i64) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = now_ms;
    while let Some(h) = next_hop(at, run_at_ms) {
        out.push(h.bucket);
        at = h.release_ms;
    }
    out
}

/// Why a delay cannot be accepted. Each message says what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DelayError {
    /// Longer than [`MAX_DELAY`].
    #[error("a delay of {requested:?} is longer than the 30 days kjob accepts; enqueue it later (or from a cron schedule) instead")]
    TooLong {
        /// The delay asked for.
        requested: Duration,
    },
    /// The delay topic does not exist.
    #[error("delay topic `{topic}` does not exist: start the worker with `WorkerBuilder::delayed_jobs_on(\"{main}\")` or `delayed_jobs(true)` (it creates the route's delay topics) or run `kjob topics create --topic {main} --delays --execute`")]
    NoTopic {
        /// The missing topic.
        topic: String,
        /// Its main topic.
        main: String,
    },
    /// A shared delay bucket does not exist.
    #[error("shared delay bucket `{topic}` does not exist: start a worker whose routes share delay buckets under `{namespace}` (`shared_retry_tiers_with(SharedTiers::new().delay_buckets())`, namespace = its group unless `SharedTiers::namespace` names one; it creates them), or drop `shared_delay_buckets` from the producer if the workers keep delay topics per route")]
    NoSharedTopic {
        /// The missing topic.
        topic: String,
        /// The namespace the producer was given.
        namespace: String,
    },
    /// The topic's retention could not be read.
    #[error("cannot read retention.ms of delay topic `{topic}` ({reason}); grant DescribeConfigs on it to this principal (kafka-acls --add --operation DescribeConfigs --topic {topic})")]
    RetentionUnknown {
        /// The topic.
        topic: String,
        /// Why.
        reason: String,
    },
    /// The topic would delete the job before its hop ends.
    #[error("delay topic `{topic}` keeps records for {retention_ms} ms, but a job waits there {bucket_ms} ms at a time and kjob requires {RETENTION_FACTOR}x that; this delay is refused. Raise it: kafka-configs --alter --entity-type topics --entity-name {topic} --add-config retention.ms={}", .bucket_ms * u64::from(RETENTION_FACTOR))]
    RetentionTooShort {
        /// The topic.
        topic: String,
        /// Its `retention.ms`.
        retention_ms: i64,
        /// The bucket length (ms).
        bucket_ms: u64,
    },
}

/// Checks a delay before anything is written.
pub fn check_delay(delay: Duration) -> Result<(), DelayError> {
    if delay > MAX_DELAY {
        return Err(DelayError::TooLong { requested: delay });
    }
    Ok(())
}

/// Checks `retention_ms` of bucket `bucket`'s topic `topic`.
pub fn check_retention(topic: &str, bucket: usize, retention_ms: i64) -> Result<(), DelayError> {
    let bucket_ms = BUCKETS[bucket.min(BUCKETS.len() - 1)].as_millis() as u64;
    let needed = bucket_ms * u64::from(RETENTION_FACTOR);
    // -1 is "keep forever".
    if retention_ms >= 0 && (retention_ms as u64) < needed {
        return Err(DelayError::RetentionTooShort {
            topic: topic.to_string(),
            retention_ms,
            bucket_ms,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1000;

    #[test]
    fn names() {
        assert_eq!(
            delay_topics("o"),
            vec![
                "o.delay.1s",
                "o.delay.3s",
                "o.delay.10s",
                "o.delay.1m",
                "o.delay.10m",
                "o.delay.1h",
                "o.delay.1d"
            ]
        );
    }

    #[test]
    fn hops_take_the_longest_bucket_that_fits_and_never_pass_the_due_time() {
        let run_at = 25 * S + 800;
        let first = first_hop(0, run_at).expect("25 s fit a bucket");
        assert_eq!(
            first,
            Hop {
                bucket: 2,
                release_ms: 10 * S
            }
        );
        // 25.55 s to plan: 10, 10, 3, 1, 1 (0.55 s left).
        assert_eq!(path(0, run_at), vec![2, 2, 1, 0, 0]);
        // Every planned release is at or before the run time.
        let mut at = first.release_ms;
        while let Some(h) = next_hop(at, run_at) {
            assert!(h.release_ms <= run_at);
            at = h.release_ms;
        }
        let left = run_at - at;
        assert!(
            left >= LEAD.as_millis() as i64 && left < S + LEAD.as_millis() as i64,
            "between LEAD and LEAD plus the shortest bucket is left: {left}"
        );
    }

    #[test]
    fn short_and_past_delays_enter_no_bucket() {
        assert_eq!(first_hop(5 * S, 5 * S + 1_200), None);
        assert_eq!(first_hop(5 * S, 0), None);
        assert_eq!(next_hop(5 * S, 5 * S + 1_249), None);
        assert!(path(5 * S, 5 * S + 1_249).is_empty());
        assert_eq!(
            first_hop(5 * S, 5 * S + 1_250),
            Some(Hop {
                bucket: 0,
                release_ms: 6 * S
            })
        );
    }

    proptest::proptest! {
        /// Records written to a bucket in time order are released in that
        /// order, whatever their run times and however late each writer is:
        /// the FIFO premise of a held partition.
        #[test]
        fn a_bucket_releases_in_write_order(
            writes in proptest::collection::vec((0i64..5_000, 0i64..200_000), 1..50)
        ) {
            let mut clock = 0i64;
            let mut last_release = [i64::MIN; BUCKETS.len()];
            for (gap, delay) in writes {
                clock += gap;
                if let Some(h) = next_hop(clock, clock + delay) {
                    proptest::prop_assert!(h.release_ms >= last_release[h.bucket]);
                    proptest::prop_assert!(h.release_ms + LEAD.as_millis() as i64 <= clock + delay);
                    last_release[h.bucket] = h.release_ms;
                }
            }
        }
    }

    #[test]
    fn thirty_days_fit_and_more_is_refused() {
        let run_at = MAX_DELAY.as_millis() as i64;
        let p = path(0, run_at);
        assert_eq!(p.iter().filter(|b| **b == 6).count(), 29);
        assert!(check_delay(MAX_DELAY).is_ok());
        assert!(check_delay(MAX_DELAY + Duration::from_secs(1)).is_err());
    }

    #[test]
    fn retention_is_checked_per_bucket() {
        assert!(check_retention("o.delay.1h", 5, 2 * 3_600_000).is_ok());
        assert!(check_retention("o.delay.1h", 5, -1).is_ok());
        let e = check_retention("o.delay.1h", 5, 3_600_000).unwrap_err();
        assert!(e.to_string().contains("retention.ms=7200000"), "{e}");
    }
}
