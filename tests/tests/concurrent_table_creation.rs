//! Replicas that start together create their tables together, against the
//! real PostgreSQL: every one of them must succeed.
//!
//! `CREATE TABLE IF NOT EXISTS` is not safe under concurrency: two sessions
//! both find no table and both insert its row type, and the loser fails with
//! `duplicate key value violates unique constraint
//! "pg_type_typname_nsp_index"` (three replicas on a fresh database: two
//! exited). kjob now holds one transaction-scoped advisory lock around
//! every creation (`kjob::ddl`), so creations run one after another.
//!
//! Each round uses table names nobody created yet, in a schema of this
//! test's own that it drops at the end, so the shared database is left as
//! it was.

use std::sync::Arc;

use kjob::idempotency::PgMarkers;
use kjob::outbox::OutboxTable;
use kjob_example_handler_crate::pg::PgStore;
use kjob_integration_tests::*;
use tokio::sync::Barrier;
use tokio_postgres::{Client, NoTls};

/// Sessions racing per round.
const SESSIONS: usize = 8;
/// Fresh names per test.
const ROUNDS: usize = 8;

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connecting to PostgreSQL");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A schema of this test's own; [`Scratch::drop_all`] removes it.
struct Scratch {
    url: String,
    admin: Client,
    schemas: Vec<String>,
}

impl Scratch {
    async fn new() -> Self {
        init_logging();
        let url = ensure_postgres();
        let admin = connect(&url).await;
        Self {
            url,
            admin,
            schemas: Vec::new(),
        }
    }

    async fn schema(&mut self) -> String {
        let name = unique("kjob_ddl").replace('.', "_");
        self.admin
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .await
            .expect("creating the test schema");
        self.schemas.push(name.clone());
        name
    }

    /// The database URL with `schema` as the only search path, so code
    /// that names its tables unqualified creates them there.
    fn url_in(&self, schema: &str) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}options=-c%20search_path%3D{schema}", self.url)
    }

    async fn drop_all(self) {
        for s in &self.schemas {
            self.admin
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {s} CASCADE"))
                .await
                .expect("dropping the test schema");
        }
    }
}

/// Runs `SESSIONS` copies of `create` at once (each on its own connection,
/// released together) and returns the errors.
async fn race<F, Fut>(urls: Vec<String>, create: F) -> Vec<String>
where
    F: Fn(usize, Client) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let start = Arc::new(Barrier::new(urls.len()));
    let tasks: Vec<_> = urls
        .into_iter()
        .enumerate()
        .map(|(i, url)| {
            let (start, create) = (start.clone(), create.clone());
            tokio::spawn(async move {
                let client = connect(&url).await;
                start.wait().await;
                create(i, client).await
            })
        })
        .collect();
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .filter_map(|t| match t {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(e) => Some(format!("task: {e}")),
        })
        .collect()
}

/// The server's message: tokio-postgres' own `Display` says only "db error".
fn db_error(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_string())
}

fn report(what: &str, failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} of {} concurrent {what} failed:\n{}",
        failures.len(),
        SESSIONS * ROUNDS,
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_marker_tables_are_all_created() {
    let mut scratch = Scratch::new().await;
    let schema = scratch.schema().await;
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let table = format!("{schema}.markers_{round}");
        let urls = vec![scratch.url.clone(); SESSIONS];
        failures.extend(
            race(urls, move |_, client| {
                let table = table.clone();
                async move {
                    let markers = PgMarkers::new(&table).map_err(|e| e.to_string())?;
                    markers
                        .create_table(&client)
                        .await
                        .map_err(|e| format!("{table}: {}", db_error(&e)))?;
                    // Usable right away by every replica.
                    markers
                        .is_marked(&client, "k")
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("{table}: {e}"))
                }
            })
            .await,
        );
    }
    scratch.drop_all().await;
    report("PgMarkers::create_table calls", &failures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_of_the_example_worker_all_create_their_store() {
    let mut scratch = Scratch::new().await;
    let mut failures = Vec::new();
    for _ in 0..ROUNDS {
        // The example names its tables unqualified: a fresh schema per
        // round is a fresh database for it.
        let schema = scratch.schema().await;
        let urls = vec![scratch.url_in(&schema); SESSIONS];
        failures.extend(
            race(urls.clone(), move |i, _| {
                let url = urls[i].clone();
                async move {
                    PgStore::connect(&url)
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("{e:#}"))
                }
            })
            .await,
        );
    }
    scratch.drop_all().await;
    report("PgStore::connect calls", &failures);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_outbox_migrations_are_all_applied() {
    let mut scratch = Scratch::new().await;
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let schema = scratch.schema().await;
        // Half the deploys name the table with its schema, half rely on
        // the search path: one table, spelled two ways.
        let urls: Vec<String> = (0..SESSIONS)
            .map(|i| {
                if i % 2 == 0 {
                    scratch.url.clone()
                } else {
                    scratch.url_in(&schema)
                }
            })
            .collect();
        // A table name of this run alone: the unqualified spelling's
        // functions schema (`kjob_<table>`) is outside the test schema and
        // would otherwise be bound to an earlier run's table.
        let table = format!("ob_{}_{round}", schema.trim_start_matches("kjob_ddl_"));
        let names = [format!("{schema}.{table}"), table.clone()];
        scratch.schemas.push(format!("kjob_{table}"));
        scratch.schemas.push(format!("kjob_{schema}_{table}"));
        failures.extend(
            race(urls, move |i, client| {
                let name = names[i % 2].clone();
                async move {
                    let table = OutboxTable::new(&name).map_err(|e| e.to_string())?;
                    kjob::outbox::migrate(&client, &table)
                        .await
                        .map_err(|e| format!("{name}: {e}"))
                }
            })
            .await,
        );
    }
    scratch.drop_all().await;
    report("outbox migrations", &failures);
}
