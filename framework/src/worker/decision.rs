//! Where a record goes after an attempt ([`Decision`]: done, the next retry
//! tier, or the DLQ) and what became of the attempt in the end
//! ([`Outcome`]). One pure function, used by the worker and by the in-memory test
//! harness (`kjob::testing` (feature `testing`)), so a unit test of a handler exercises the
//! exact rules production runs.
//!
//! The room of step 8 in ARCHITECTURE.md, one file. **Enters:** an
//! attempt's result and its route's retry policy. **Leaves:** [`Decision`] and
//! [`Outcome`].

use std::time::Duration;

use crate::classify::ErrorClass;
use crate::dlq::{forward_headers, BACKTRACE};
use crate::headers::JobHeaders;
use crate::retry::RetryPolicy;
use crate::topics::dlq_topic;
use crate::worker::Attempt;

/// The decision for one attempt.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Decision {
    /// Handled: mark the offset done.
    Handled,
    /// Forward to a retry tier with these (rebuilt) headers, then mark done.
    Retry {
        /// Tier topic.
        topic: String,
        /// Headers of the forwarded record (attempt + 1, due time, failure).
        headers: JobHeaders,
        /// How long until it is due.
        wait: Duration,
        /// The failure's class.
        class: ErrorClass,
    },
    /// Forward to the DLQ with these headers, then mark done.
    DeadLetter {
        /// DLQ topic.
        topic: String,
        /// Headers of the dead letter.
        headers: JobHeaders,
        /// Final class (`retries_exhausted` for a retryable failure out of attempts).
        class: ErrorClass,
        /// Final message.
        message: String,
    },
    /// Not run (its partition was revoked while it waited): leave the
    /// offset unfinished for the next owner; forward nothing.
    Released,
}

/// How one attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The handler returned `Ok`.
    Handled,
    /// Forwarded to a retry tier.
    Retried,
    /// A delayed job not due yet, forwarded to its next delay topic.
    Delayed,
    /// Forwarded to the DLQ (or an envelope of it).
    DeadLettered,
    /// Not run: parked in a retry tier behind its key's job in the retry
    /// path (a strict-order route, [`crate::worker::before::strict`]).
    Held,
    /// Not run: a newer job of its key reached the worker within the
    /// route's debounce window ([`crate::worker::before::debounce`]).
    Superseded,
    /// Not run: a copy of a job its key's chain already finished (a
    /// re-delivery after a crash, or a parked copy coming back), on a
    /// strict-order route ([`crate::worker::before::strict`]).
    Duplicate,
    /// Not run: an operator cancelled it while it waited in a retry tier
    /// or delay topic ([`crate::control::JobCancel`]).
    Cancelled,
    /// Released unfinished: it waited (for a downstream, a slot, its run
    /// time) when its partition was revoked or the worker stopped, or the
    /// worker gave up a forward at the end of its grace period (or the
    /// record has no route). The offset stays unfinished and the record is
    /// re-delivered; its attempt count is unchanged.
    Released,
}

impl Outcome {
    /// Whether the offset may be marked done.
    pub(crate) fn is_final(&self) -> bool {
        !matches!(self, Outcome::Released)
    }
}

/// Decides what follows `outcome` for `source` (a record of `main` or one of
/// its tiers, which are named after `tiers_at`) on attempt `attempt`. `unit` is a random number in `[0, 1)` for
/// jitter and `now_ms` the clock; both are parameters so the decision is
/// deterministic under test.
#[allow(clippy::too_many_arguments)]
pub(super) fn next_step<M: rdkafka::message::Message>(
    outcome: &Attempt,
    source: &M,
    main: &str,
    tiers_at: &str,
    group: &str,
    policy: &RetryPolicy,
    attempt: u32,
    unit: f64,
    now_ms: i64,
) -> Decision {
    let (class, message, retry_after, backtrace) = match outcome {
        Attempt::Handled => return Decision::Handled,
        Attempt::Released => return Decision::Released,
        Attempt::Failed {
            class,
            message,
            retry_after,
            backtrace,
        } => (*class, message.as_str(), *retry_after, backtrace.as_deref()),
    };
    if class.is_retryable() {
        if let Some(plan) = policy.plan(attempt, retry_after, unit) {
            if let Some(topic) = policy.tier_topic(tiers_at, plan.tier) {
                let mut headers =
                    forward_headers(source, group, attempt + 1, class.as_str(), message, now_ms);
                set_backtrace(&mut headers, None);
                headers.due_at_ms = Some(now_ms + plan.release.as_millis() as i64);
                // Due later than its tier releases it: it hops on until then.
                headers.run_at_ms =
                    (plan.wait > plan.release).then(|| now_ms + plan.wait.as_millis() as i64);
                return Decision::Retry {
                    topic,
                    headers,
                    wait: plan.wait,
                    class,
                };
            }
        }
    }
    let (class, message) = if class.is_retryable() {
        (
            ErrorClass::RetriesExhausted,
            format!("gave up after {attempt} attempts; last failure {class}: {message}"),
        )
    } else {
        (class, message.to_string())
    };
    let mut headers = forward_headers(source, group, attempt, class.as_str(), &message, now_ms);
    set_backtrace(&mut headers, backtrace);
    Decision::DeadLetter {
        topic: dlq_topic(main),
        headers,
        class,
        message,
    }
}

/// Sets the `kjob-backtrace` header to this failure's backtrace, or removes
/// the one an earlier hop carried: it would describe another failure.
fn set_backtrace(headers: &mut crate::headers::JobHeaders, backtrace: Option<&str>) {
    headers.extra.retain(|(k, _)| k != BACKTRACE);
    if let Some(b) = backtrace {
        headers
            .extra
            .push((BACKTRACE.to_string(), b.as_bytes().to_vec()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{OwnedMessage, Timestamp};

    fn record() -> OwnedMessage {
        OwnedMessage::new(
            Some(vec![1]),
            None,
            "orders".into(),
            Timestamp::CreateTime(5),
            0,
            9,
            None,
        )
    }

    fn failed(class: ErrorClass) -> Attempt {
        Attempt::Failed {
            class,
            message: "boom".into(),
            retry_after: None,
            backtrace: None,
        }
    }

    #[test]
    fn only_a_released_attempt_leaves_its_offset_unfinished() {
        assert!(!Outcome::Released.is_final());
        assert!(Outcome::Handled.is_final() && Outcome::DeadLettered.is_final());
    }

    #[test]
    fn a_retry_after_past_its_tier_hops_on_until_then_and_one_within_it_does_not() {
        let p = RetryPolicy::tiers([Duration::from_secs(5)]).jitter(0.0);
        let retry = |retry_after| {
            let failed = Attempt::Failed {
                class: ErrorClass::RetryableServer,
                message: "busy".into(),
                retry_after,
                backtrace: None,
            };
            match next_step(
                &failed,
                &record(),
                "orders",
                "orders",
                "g",
                &p,
                1,
                0.0,
                1_000,
            ) {
                Decision::Retry { headers, .. } => headers,
                other => panic!("{other:?}"),
            }
        };
        let long = retry(Some(Duration::from_secs(60)));
        assert_eq!(long.due_at_ms, Some(6_000), "released by its tier");
        assert_eq!(long.run_at_ms, Some(61_000), "run no earlier than asked");
        assert_eq!(retry(None).run_at_ms, None, "due when its tier releases it");
    }

    #[test]
    fn a_retry_drops_an_earlier_backtrace_and_a_dead_letter_carries_its_own() {
        use rdkafka::message::{Header, OwnedHeaders};
        let headers = OwnedHeaders::new().insert(Header {
            key: BACKTRACE,
            value: Some("an earlier failure"),
        });
        let source = record().replace_headers(Some(headers));
        let backtraces = |h: &JobHeaders| -> Vec<Vec<u8>> {
            h.extra
                .iter()
                .filter(|(k, _)| k == BACKTRACE)
                .map(|(_, v)| v.clone())
                .collect()
        };
        let failed = Attempt::Failed {
            class: ErrorClass::RetryableServer,
            message: "boom".into(),
            retry_after: None,
            backtrace: Some("now".into()),
        };
        let p = RetryPolicy::tiers([Duration::from_secs(5)]).jitter(0.0);
        let step = |attempt| {
            next_step(
                &failed, &source, "orders", "orders", "g", &p, attempt, 0.0, 0,
            )
        };
        match step(1) {
            Decision::Retry { headers, .. } => assert!(backtraces(&headers).is_empty()),
            other => panic!("{other:?}"),
        }
        match step(9) {
            Decision::DeadLetter { headers, .. } => {
                assert_eq!(backtraces(&headers), [b"now".to_vec()])
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn retryable_goes_to_the_tier_of_its_attempt() {
        let p = RetryPolicy::tiers([Duration::from_secs(5), Duration::from_secs(30)]).jitter(0.0);
        let next = next_step(
            &failed(ErrorClass::RetryableServer),
            &record(),
            "orders",
            "orders",
            "g",
            &p,
            2,
            0.0,
            1000,
        );
        match next {
            Decision::Retry {
                topic,
                headers,
                wait,
                ..
            } => {
                assert_eq!(topic, "orders.retry.30s");
                assert_eq!(wait, Duration::from_secs(30));
                assert_eq!(headers.attempt, Some(3));
                assert_eq!(headers.due_at_ms, Some(31_000));
                assert_eq!(headers.first_failed_at_ms, Some(1000));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_shared_tier_is_named_after_its_namespace_and_the_dlq_after_the_route() {
        let p = RetryPolicy::tiers([Duration::from_secs(5)]).jitter(0.0);
        let retry = |attempt| {
            next_step(
                &failed(ErrorClass::RetryableServer),
                &record(),
                "orders",
                "billing",
                "g",
                &p,
                attempt,
                0.0,
                0,
            )
        };
        assert!(
            matches!(retry(1), Decision::Retry { ref topic, .. } if topic == "billing.retry.5s")
        );
        assert!(
            matches!(retry(3), Decision::DeadLetter { ref topic, .. } if topic == "orders.dlq"),
            "the DLQ stays the route's own"
        );
    }

    #[test]
    fn permanent_and_exhausted_go_to_the_dlq() {
        let p = RetryPolicy::tiers([Duration::from_secs(5)]);
        let next = next_step(
            &failed(ErrorClass::PermanentNotFound),
            &record(),
            "orders",
            "orders",
            "g",
            &p,
            1,
            0.0,
            0,
        );
        assert!(
            matches!(next, Decision::DeadLetter { class: ErrorClass::PermanentNotFound, ref topic, .. } if topic == "orders.dlq")
        );
        let next = next_step(
            &failed(ErrorClass::RetryableTimeout),
            &record(),
            "orders",
            "orders",
            "g",
            &p,
            2,
            0.0,
            0,
        );
        match next {
            Decision::DeadLetter {
                class,
                headers,
                message,
                ..
            } => {
                assert_eq!(class, ErrorClass::RetriesExhausted);
                assert_eq!(headers.attempt, Some(2));
                assert!(message.contains("retryable.timeout"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            next_step(
                &Attempt::Handled,
                &record(),
                "orders",
                "orders",
                "g",
                &p,
                1,
                0.0,
                0
            ),
            Decision::Handled
        );
    }
}
