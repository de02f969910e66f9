//! Making handlers idempotent: a processed-marker per job.
//!
//! kjob delivers at least once: a worker killed after a handler's side
//! effect but before the commit re-runs the job. The cure is a marker keyed
//! by the job id ([`crate::JobContext::id`]) or a domain key (the order id),
//! written **in the same transaction as the handler's own write**: the
//! second delivery finds the marker and skips the effect, and a crash before
//! the commit leaves neither the marker nor the effect.
//!
//! * [`MemoryMarkers`]: for unit tests with `kjob::testing` (feature `testing`).
//! * `PgMarkers` (feature `postgres`): an `INSERT ... ON CONFLICT DO NOTHING`
//!   on a table with the key as primary key, inside the caller's transaction.
//!
//! ```text
//! let tx = client.transaction().await?;
//! if markers.mark(&tx, &ctx.id, "invoice.render").await? == Mark::Duplicate {
//!     return Ok(()); // the effect committed on an earlier delivery
//! }
//! tx.execute("INSERT INTO invoices (order_id) VALUES ($1)", &[&job.order_id]).await?;
//! tx.commit().await?; // marker and effect together, or neither
//! ```

use std::collections::HashSet;
use std::sync::Mutex;

/// Whether this delivery is the first to mark the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// First time: perform the effect.
    First,
    /// Marked before: the effect already happened; skip it.
    Duplicate,
}

/// In-memory markers for tests. Not durable: a process restart forgets.
#[derive(Debug, Default)]
pub struct MemoryMarkers {
    seen: Mutex<HashSet<String>>,
}

impl MemoryMarkers {
    /// Marks `key`, reporting whether it was new.
    pub fn mark(&self, key: &str) -> Mark {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.insert(key.to_string()) {
            Mark::First
        } else {
            Mark::Duplicate
        }
    }

    /// How many keys are marked.
    pub fn len(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether nothing is marked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(feature = "postgres")]
pub use pg::PgMarkers;

#[cfg(feature = "postgres")]
mod pg {
    use super::Mark;
    use tokio_postgres::{GenericClient, Transaction};

    /// Processed markers in a PostgreSQL table, written inside the handler's
    /// own transaction.
    #[derive(Clone, Debug)]
    pub struct PgMarkers {
        table: String,
    }

    impl PgMarkers {
        /// Markers in `table` (letters, digits, `_` and one optional `schema.` prefix).
        pub fn new(table: &str) -> Result<Self, crate::Error> {
            let valid = !table.is_empty()
                && table.split('.').count() <= 2
                && table.split('.').all(|p| {
                    !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
            if !valid {
                return Err(crate::Error::InvalidSetting {
                    name: "markers table".into(),
                    value: table.to_string(),
                    reason: "use a plain table name: letters, digits and `_`, with one optional `schema.` prefix".into(),
                });
            }
            Ok(Self {
                table: table.to_string(),
            })
        }

        /// Creates the table if it does not exist. Safe when replicas
        /// start together: the creation holds kjob's DDL lock (see
        /// [`crate::ddl`]), where a bare `CREATE TABLE IF NOT EXISTS` lets
        /// all but one of them fail.
        pub async fn create_table<C: GenericClient>(
            &self,
            client: &C,
        ) -> Result<(), tokio_postgres::Error> {
            crate::ddl::create_serialised(
                client,
                &format!(
                    "CREATE TABLE IF NOT EXISTS {} (
                        key text PRIMARY KEY,
                        job text NOT NULL,
                        processed_at timestamptz NOT NULL DEFAULT now()
                    )",
                    self.table
                ),
            )
            .await
        }

        /// Marks `key` inside `tx`. Commit `tx` together with the effect.
        pub async fn mark(
            &self,
            tx: &Transaction<'_>,
            key: &str,
            job: &str,
        ) -> Result<Mark, tokio_postgres::Error> {
            let inserted = tx
                .execute(
                    &format!(
                        "INSERT INTO {} (key, job) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
                        self.table
                    ),
                    &[&key, &job],
                )
                .await?;
            Ok(if inserted == 1 {
                Mark::First
            } else {
                Mark::Duplicate
            })
        }

        /// Whether `key` is marked (outside any transaction).
        pub async fn is_marked<C: GenericClient>(
            &self,
            client: &C,
            key: &str,
        ) -> Result<bool, tokio_postgres::Error> {
            let row = client
                .query_opt(
                    &format!("SELECT 1 FROM {} WHERE key = $1", self.table),
                    &[&key],
                )
                .await?;
            Ok(row.is_some())
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn table_names_are_validated() {
            assert!(PgMarkers::new("kjob_processed").is_ok());
            assert!(PgMarkers::new("billing.processed_jobs").is_ok());
            assert!(PgMarkers::new("x; DROP TABLE y").is_err());
            assert!(PgMarkers::new("a.b.c").is_err());
            assert!(PgMarkers::new("").is_err());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_markers_report_duplicates() {
        let m = MemoryMarkers::default();
        assert_eq!(m.mark("job-1"), Mark::First);
        assert_eq!(m.mark("job-1"), Mark::Duplicate);
        assert_eq!(m.mark("job-2"), Mark::First);
        assert_eq!(m.len(), 2);
    }
}
