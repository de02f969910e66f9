//! Creating tables when replicas start together.
//!
//! `CREATE TABLE IF NOT EXISTS` is not safe under concurrency in
//! PostgreSQL: two sessions can both find no table and both go on to create
//! it, and the loser fails with `duplicate key value violates unique
//! constraint "pg_type_typname_nsp_index"` (the table's row type) or
//! `"pg_class_relname_nsp_index"`. Three worker replicas started at the same
//! moment on a fresh database hit exactly that: two of them exited.
//!
//! [`create_serialised`] runs the statements inside one transaction that
//! first takes the advisory lock [`DDL_LOCK_KEY`], so creations wait for
//! each other and the second one finds the table the first committed. kjob
//! creates every table of its own this way ([`PgMarkers::create_table`],
//! [`outbox::migrate`]); an application creating its tables at start-up can
//! call it too.
//!
//! [`PgMarkers::create_table`]: crate::idempotency::PgMarkers::create_table
//! [`outbox::migrate`]: crate::outbox::migrate

use tokio_postgres::GenericClient;

/// The advisory-lock key every kjob table creation holds
/// (`pg_advisory_xact_lock(bigint)`), for the length of its transaction.
///
/// Fixed, so every process and every kjob version agrees on it; it spells
/// `kjobddl` in ASCII (`0x6b6a6f62_64646c00`). While a creation waits or
/// runs it shows in `pg_locks` as `locktype = 'advisory'`,
/// `classid = 1802137442`, `objid = 1684302848`, `objsubid = 1`. The
/// one-`bigint` form cannot collide with the two-`int4` keys of the outbox
/// (those have `objsubid = 2`). An application that takes this key for its
/// own purposes delays kjob's start-up, nothing worse.
pub const DDL_LOCK_KEY: i64 = 0x6b6a_6f62_6464_6c00;

/// Runs `ddl` (one or more statements separated by `;`, typically
/// `CREATE ... IF NOT EXISTS`) while holding [`DDL_LOCK_KEY`], so that
/// sessions doing the same at the same moment run one after another.
///
/// The lock is transaction-scoped: on a plain connection the statements
/// run as one transaction of their own (the lock is released when it
/// commits or fails, and nothing is left open), and inside the caller's
/// transaction they run in it and the lock is held until it ends. `ddl`
/// must not contain `BEGIN`, `COMMIT` or `ROLLBACK`: ending the transaction
/// early would release the lock before the creation is visible to others.
pub async fn create_serialised<C: GenericClient>(
    client: &C,
    ddl: &str,
) -> Result<(), tokio_postgres::Error> {
    // One simple-protocol query: PostgreSQL runs its statements as a single
    // implicit transaction, so the lock and the DDL commit together.
    client.batch_execute(&serialised_sql(ddl)).await
}

/// The text [`create_serialised`] sends.
fn serialised_sql(ddl: &str) -> String {
    format!("SELECT pg_advisory_xact_lock({DDL_LOCK_KEY});\n{ddl}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_comes_first_and_the_key_is_the_documented_one() {
        let sql = serialised_sql("CREATE TABLE IF NOT EXISTS t (k text)");
        assert!(
            sql.starts_with("SELECT pg_advisory_xact_lock(7740121377971399680);\n"),
            "{sql}"
        );
        assert!(sql.ends_with("CREATE TABLE IF NOT EXISTS t (k text)"));
        // The pg_locks columns the docs name.
        assert_eq!(DDL_LOCK_KEY >> 32, 1_802_137_442);
        assert_eq!(DDL_LOCK_KEY & 0xffff_ffff, 1_684_302_848);
        assert_eq!(&DDL_LOCK_KEY.to_be_bytes(), b"kjobddl\0");
    }
}
