//! The SQL enqueue: `kjob.enqueue(...)`, for applications that are not
//! written in Rust.
//!
//! [`Outbox::enqueue`](super::Outbox::enqueue) needs the job's Rust type
//! (its Avro schema) and computes the key's lock in Rust. A Symfony, Django,
//! Express or Spring application has neither, but it has a PostgreSQL
//! driver and a transaction. [`migrate`](super::migrate) therefore also
//! installs two functions next to the table:
//!
//! ```sql
//! BEGIN;
//! INSERT INTO orders (id, email) VALUES ('4711', 'a@example.com');
//! SELECT kjob.enqueue(topic => 'orders.confirmation', key => '4711',
//!                     job => '{"order_id": "4711", "locale": "de"}'::jsonb,
//!                     tenant => 'shop-7');                 -- returns the kjob-id
//! SELECT kjob.enqueue_many('orders.confirmation',
//!     '[{"key": "4712", "job": {"order_id": "4712", "locale": "fr"}},
//!       {"key": "4713", "job": {"order_id": "4713", "locale": "en"},
//!        "run_at": "2030-01-31T10:00:00Z"}]'::jsonb);    -- returns the ids, in order
//! COMMIT;
//! ```
//!
//! `kjob.enqueue(topic, key, job, run_at => NULL, tenant => NULL,
//! version => NULL, headers => NULL) returns text`:
//! * **the same guarantees as the Rust path.** The row is written in the
//!   caller's transaction (published if and only if it commits); the key's
//!   advisory lock (`pg_advisory_xact_lock(key_class, fnv1a64(key))`, the very
//!   lock `Outbox::enqueue` takes, computed by an SQL port of kjob's FNV-1a)
//!   is held before the row id is drawn, so per key relay order is commit
//!   order, also between Rust and SQL writers of one key; `kjob-id` (a
//!   UUIDv7 made in SQL) is assigned at insert, so a republished row is a
//!   recognised duplicate.
//! * **JSON, encoded by the relay.** The row holds the job as `jsonb`
//!   (`payload_json`); the relay encodes it to Confluent-framed Avro
//!   against the schema registered under `<topic>-value`, the latest
//!   version unless `version` pins one (see [`crate::codec::JsonContracts`]). A row
//!   that does not fit (a missing field, a wrong type, no schema registered)
//!   is dead-lettered to `<topic>.dlq` with class `outbox.encode`, the JSON
//!   as its payload and the field named in `kjob-error`; it never holds its
//!   key back. `kjob dlq retry` encodes it again (against the latest version)
//!   once the contract is fixed.
//! * **Delayed jobs**: a `run_at` in the future goes to the route's delay
//!   topics ([`crate::delay`]), as
//!   [`Producer::enqueue_at`](crate::Producer::enqueue_at) does; one in the
//!   past, or NULL, runs now.
//! * **Checked at insert** (the call fails, so the transaction does, with a
//!   message that says what to pass): an empty or invalid topic, one of
//!   kjob's own topics (`.dlq`, `.retry.*`, `.delay.*`), an empty key, a job
//!   that is not a JSON object, a `run_at` more than 30 days ahead, a
//!   version below 1, headers that are not an object of strings or that set
//!   `kjob-*` headers kjob sets itself. SQLSTATE `22023`
//!   (`invalid_parameter_value`). What needs the registry (is the topic a
//!   route, does the job fit) is not checked at insert: the relay finds
//!   out, as above.
//!
//! `kjob.enqueue_many(topic, jobs jsonb) returns text[]` takes an array of
//! `{"key", "job", "run_at", "tenant", "version", "headers"}` objects (only
//! `key` and `job` required), checks them all first (the error names the
//! index, `jobs[3] ...`), then takes every key's lock in one global order
//! (by lock id, so two batches never deadlock each other), then inserts in
//! array order.
//!
//! **Locks and deadlocks**, as with `Outbox::enqueue`: the key's lock is
//! held until the transaction ends, so enqueue last, right before `COMMIT`;
//! a transaction that enqueues several keys one call at a time should do so
//! in a stable order (or use `enqueue_many`), or retry on SQLSTATE `40P01`.
//!
//! **Privileges.** The functions run with the caller's rights
//! (`SECURITY INVOKER`): the application's role needs
//! `USAGE ON SCHEMA kjob`, `INSERT ON kjob_outbox` and
//! `USAGE ON SEQUENCE kjob_outbox_id_seq`, as the Rust path does.
//!
//! **Which schema.** The functions of [`super::DEFAULT_TABLE`] live in
//! schema `kjob`; another table's in `kjob_<table>` (`app.jobs` gives
//! `kjob_app_jobs`), or wherever
//! [`OutboxTable::with_functions_schema`](super::OutboxTable::with_functions_schema)
//! (`kjob outbox migrate --sql-schema`) puts them. A schema serves one
//! table: the migration refuses to install a second table's functions into
//! it. The functions name the table schema-qualified, as the migration
//! resolved it, so the caller's `search_path` does not matter.
//!
//! **Upgrading.** The migration adds the JSON columns to a table made by an
//! older kjob (once; a later run takes no `ACCESS EXCLUSIVE` lock). Upgrade
//! every relay before the first `kjob.enqueue`: an older relay cannot read
//! a row without an Avro payload.

use super::{fnv64, OutboxError, OutboxTable, DEFAULT_TABLE};

const SQL_API: &str = include_str!("sql_api.sql");

/// The functions schema of a table when none is given: `kjob` for the
/// default table, `kjob_<table>` for others (dots become `_`; a name longer
/// than PostgreSQL's 63 characters is shortened and given a hash suffix).
pub(crate) fn default_schema(table: &str) -> String {
    if table == DEFAULT_TABLE {
        return "kjob".to_string();
    }
    let name = format!("kjob_{}", table.replace('.', "_"));
    if name.len() <= 63 {
        return name;
    }
    format!("{}_{:08x}", &name[..50], fnv64(table.as_bytes()) as u32)
}

/// A functions schema name: a plain identifier (letters, digits, `_`, not
/// starting with a digit, folded to lower case, at most 63 characters).
pub(crate) fn validate_schema(name: &str) -> Result<String, OutboxError> {
    let name = name.to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && !name.starts_with("pg_");
    if ok {
        Ok(name)
    } else {
        Err(OutboxError::Config(format!(
            "`{name}` is not a schema name kjob can install its SQL enqueue into (letters, digits, `_`, at most 63 characters, not starting with a digit or `pg_`)"
        )))
    }
}

/// The SQL that installs `table`'s enqueue functions (see the [module
/// docs](self)). Part of [`super::migration_sql`]; run after the table
/// exists.
pub fn sql(table: &OutboxTable) -> String {
    SQL_API
        .replace("{functions}", table.functions_schema())
        .replace("{key_class}", &table.key_class().to_string())
        .replace("{channel}", table.channel())
        .replace("{table}", table.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_table_gets_its_own_functions_schema() {
        assert_eq!(default_schema("kjob_outbox"), "kjob");
        assert_eq!(default_schema("app.jobs"), "kjob_app_jobs");
        let long = format!("s{}.t{}", "a".repeat(40), "b".repeat(40));
        let d = default_schema(&long);
        assert!(d.len() <= 63 && d.starts_with("kjob_s"), "{d}");
        assert_ne!(d, default_schema(&format!("{long}x")));
        assert!(validate_schema("Billing_Jobs").is_ok());
        for bad in ["", "a b", "1x", "pg_x", "x;drop", &"y".repeat(64)] {
            assert!(validate_schema(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_functions_lock_the_key_the_rust_path_locks() {
        let t = OutboxTable::default();
        let sql = sql(&t);
        assert!(sql.contains("CREATE OR REPLACE FUNCTION kjob.enqueue("));
        assert!(sql.contains("CREATE OR REPLACE FUNCTION kjob.enqueue_many("));
        let lock = format!("PERFORM pg_advisory_xact_lock({}, ", t.key_class());
        assert_eq!(sql.matches(&lock).count(), 2, "enqueue and enqueue_many");
        assert!(sql.contains("pg_notify('kjob_outbox', '')"));
    }
}
