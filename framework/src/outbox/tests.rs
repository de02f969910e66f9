//! Unit tests of `outbox`.

use super::*;

#[test]
fn table_names_are_validated_and_derive_distinct_locks() {
    assert!(OutboxTable::new("kjob_outbox").is_ok());
    assert!(OutboxTable::new("billing.outbox").is_ok());
    for bad in ["", "a.b.c", "x; DROP TABLE y", "1abc", "a..b", "\"q\""] {
        assert!(OutboxTable::new(bad).is_err(), "{bad:?} accepted");
    }
    let a = OutboxTable::new("Billing.Outbox").unwrap_or_default();
    assert_eq!(a.name(), "billing.outbox");
    assert_eq!(a.channel(), "billing__outbox");
    let b = OutboxTable::default();
    assert_ne!(a.relay_class(), b.relay_class());
    assert_ne!(a.key_class(), a.relay_class());
    assert!(a.relay_class() >= 0 && a.key_class() >= 0);
}

#[test]
fn buckets_are_stable_and_in_range() {
    // Stored in rows: must never change between versions.
    assert_eq!(fnv64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv64(b"a"), 0xaf63_dc4c_8601_ec8c);
    let b = bucket_of("order-42");
    assert_eq!(b, bucket_of("order-42"));
    assert!((0..BUCKETS).contains(&b));
    let spread: std::collections::HashSet<i16> =
        (0..1000).map(|i| bucket_of(&format!("k{i}"))).collect();
    assert_eq!(
        spread.len(),
        BUCKETS as usize,
        "1000 keys cover all buckets"
    );
}

#[test]
fn migration_is_filled_in_and_idempotent() {
    let t = OutboxTable::new("app.jobs_outbox").unwrap_or_default();
    let sql = migration_sql(&t);
    assert!(sql.contains("CREATE TABLE IF NOT EXISTS app.jobs_outbox ("));
    assert!(sql.contains("CREATE INDEX IF NOT EXISTS jobs_outbox_unsent ON app.jobs_outbox"));
    for placeholder in [
        "{table}",
        "{name}",
        "{functions}",
        "{key_class}",
        "{channel}",
    ] {
        assert!(!sql.contains(placeholder), "{placeholder} is replaced");
    }
    assert!(sql.contains("CREATE OR REPLACE FUNCTION kjob_app_jobs_outbox.enqueue("));
    assert!(sql.contains(&format!(
        "pg_advisory_xact_lock({}, (h & 2147483647)::integer)",
        t.key_class()
    )));
    assert!(sql.contains("pg_notify('app__jobs_outbox', '')"));
}

#[test]
fn insert_locks_the_key_before_drawing_the_id() {
    let t = OutboxTable::default();
    let with = insert_sql(&t, true);
    assert!(with.contains("pg_advisory_xact_lock($1, $2)"));
    assert!(with.contains("pg_notify($3, '')"));
    assert!(with.contains("FROM lock, wake"));
    let without = insert_sql(&t, false);
    assert!(!without.contains("pg_notify"));
    assert!(without.contains("FROM lock\n"));
}
