//! What became of each row of a batch, and which rows may be marked sent.
//! Pure logic, unit-tested; the relay's session loop applies it.

use std::collections::HashSet;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::DeliveryFuture;

/// What to record after a batch.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// Rows to mark sent: per key, those acknowledged before its first
    /// failure.
    pub done: Vec<i64>,
    /// Rows whose publish failed, or that could not be prepared yet (they
    /// and the rest of their key wait, with a backoff).
    pub failed: Vec<i64>,
    /// The first failure's message.
    pub first_error: Option<String>,
    /// Whether the producer may be fatal now and must be replaced.
    pub fresh_producer: bool,
}

/// Decides, from the batch (id order) and each row's fate, which rows may
/// be marked sent. A row acknowledged after an earlier row of its key failed
/// is *not* marked: it is published again after that one, so the first
/// occurrences in Kafka stay in commit order.
pub(super) fn plan<'a>(
    rows: impl IntoIterator<Item = (i64, &'a str)>,
    fates: Vec<RowFate>,
) -> Plan {
    let mut failed_keys: HashSet<&str> = HashSet::new();
    let mut out = Plan {
        done: Vec::new(),
        failed: Vec::new(),
        first_error: None,
        fresh_producer: false,
    };
    for ((id, key), fate) in rows.into_iter().zip(fates) {
        match fate {
            RowFate::Acked if !failed_keys.contains(key) => out.done.push(id),
            RowFate::Acked | RowFate::HeldBack => {}
            RowFate::Collateral => out.fresh_producer = true,
            RowFate::Failed(e) => {
                out.fresh_producer = true;
                failed_keys.insert(key);
                out.failed.push(id);
                out.first_error.get_or_insert(e);
            }
            RowFate::Deferred(e) => {
                // Nothing was produced: the producer is as healthy as before.
                failed_keys.insert(key);
                out.failed.push(id);
                out.first_error.get_or_insert(e);
            }
        }
    }
    out
}

/// A produced record awaiting its acknowledgement, one librdkafka refused
/// to queue, one not sent because an earlier row of its key was refused,
/// or one that could not be prepared (its contract could not be fetched).
pub(super) enum Pending {
    Sent(DeliveryFuture),
    Refused(String),
    HeldBack,
    Deferred(String),
}

/// What became of one row of a batch.
#[derive(Debug)]
pub(super) enum RowFate {
    /// The broker acknowledged it.
    Acked,
    /// Not published; the reason.
    Failed(String),
    /// Not sent: an earlier row of its key failed. It waits for that row.
    HeldBack,
    /// Failed because the producer died of another row's error (or of its
    /// own fatal state): sent again with the next batch, no backoff.
    Collateral,
    /// Not produced: what it needs first is not there yet (the schema
    /// registry did not answer, a delay topic is missing). Retried with a
    /// backoff like a failure; the producer is not replaced.
    Deferred(String),
}

/// Whether a delivery error is another row's doing: once one row's failure
/// made the producer fatal (gapless guarantee), every other queued or
/// in-flight record fails with these codes. Such rows are simply sent
/// again with the next batch, without a backoff, so a refused row cannot
/// hold other keys hostage.
pub(super) fn collateral(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Fatal
                | RDKafkaErrorCode::PurgeQueue
                | RDKafkaErrorCode::PurgeInflight
                | RDKafkaErrorCode::GaplessGuarantee
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_marked_only_up_to_its_first_failure() {
        let rows = [(1, "a"), (2, "b"), (3, "a"), (4, "a"), (5, "b"), (6, "c")];
        let fates = vec![
            RowFate::Acked,
            RowFate::Acked,
            RowFate::Failed("refused".to_string()),
            RowFate::Acked, // acked after a's failure: must not be marked
            RowFate::Acked,
            RowFate::Failed("later".to_string()),
        ];
        let p = plan(rows, fates);
        assert_eq!(p.done, vec![1, 2, 5]);
        assert_eq!(p.failed, vec![3, 6]);
        assert_eq!(p.first_error.as_deref(), Some("refused"));
        assert!(p.fresh_producer);
    }

    #[test]
    fn held_back_rows_are_neither_marked_nor_counted_as_failures() {
        let p = plan(
            [(1, "a"), (2, "a"), (3, "b")],
            vec![
                RowFate::Failed("too large".into()),
                RowFate::HeldBack,
                RowFate::Acked,
            ],
        );
        assert_eq!((p.done, p.failed), (vec![3], vec![1]));
    }

    #[test]
    fn a_deferred_row_holds_its_key_but_keeps_the_producer() {
        let p = plan(
            [(1, "a"), (2, "a"), (3, "b")],
            vec![
                RowFate::Deferred("registry unavailable".into()),
                RowFate::HeldBack,
                RowFate::Acked,
            ],
        );
        assert_eq!((p.done, p.failed), (vec![3], vec![1]));
        assert_eq!(p.first_error.as_deref(), Some("registry unavailable"));
        assert!(
            !p.fresh_producer,
            "nothing was produced for the deferred row"
        );
    }

    #[test]
    fn collateral_failures_are_resent_without_backoff_by_a_fresh_producer() {
        let p = plan(
            [(1, "a"), (2, "b")],
            vec![RowFate::Collateral, RowFate::Collateral],
        );
        assert!(p.done.is_empty() && p.failed.is_empty());
        assert!(p.fresh_producer, "a fatal producer is replaced");
        assert!(collateral(&KafkaError::MessageProduction(
            RDKafkaErrorCode::Fatal
        )));
        assert!(!collateral(&KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageSizeTooLarge
        )));
    }

    #[test]
    fn an_all_good_batch_marks_everything() {
        let p = plan([(7, "a"), (8, "a")], vec![RowFate::Acked, RowFate::Acked]);
        assert_eq!(
            p,
            Plan {
                done: vec![7, 8],
                failed: vec![],
                first_error: None,
                fresh_producer: false,
            }
        );
    }
}
