//! PostgreSQL dependencies: orders and invoices tables, with the processed
//! marker written in the same transaction as the invoice.

use std::sync::Arc;

use anyhow::Context as _;
use futures::future::BoxFuture;
use kjob::idempotency::{Mark, PgMarkers};
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls};

use crate::deps::{InvoiceStore, Order};

/// The store on one connection (a pool in a real service).
pub struct PgStore {
    client: Mutex<Client>,
    markers: PgMarkers,
}

impl PgStore {
    /// Connects and creates the tables if needed (safe when several
    /// replicas start at once).
    pub async fn connect(url: &str) -> anyhow::Result<Arc<Self>> {
        let (client, connection) = tokio_postgres::connect(url, NoTls)
            .await
            .with_context(|| format!("connecting to {url}"))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::error!(error = %e, "postgres connection ended");
            }
        });
        let markers = PgMarkers::new("invoice_jobs_processed")?;
        markers.create_table(&client).await?;
        // Under kjob's DDL lock, like the markers table: replicas that start
        // together would otherwise race on `CREATE TABLE IF NOT EXISTS` and
        // all but one fail (see `kjob::ddl`).
        kjob::ddl::create_serialised(
            &client,
            "CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, total_cents bigint NOT NULL);
             CREATE TABLE IF NOT EXISTS invoices (id bigserial PRIMARY KEY, order_id text NOT NULL, total_cents bigint NOT NULL);
             CREATE TABLE IF NOT EXISTS invoice_deliveries (id bigserial PRIMARY KEY, job_id text NOT NULL, at timestamptz NOT NULL DEFAULT now());",
        )
        .await
        .context("creating the example's tables")?;
        Ok(Arc::new(Self {
            client: Mutex::new(client),
            markers,
        }))
    }

    /// Inserts an order (tests and demos).
    pub async fn add_order(&self, order: &Order) -> anyhow::Result<()> {
        self.client
            .lock()
            .await
            .execute(
                "INSERT INTO orders (id, total_cents) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
                &[&order.id, &order.total_cents],
            )
            .await?;
        Ok(())
    }
}

impl InvoiceStore for PgStore {
    fn order(&self, id: &str) -> BoxFuture<'_, anyhow::Result<Option<Order>>> {
        let id = id.to_string();
        Box::pin(async move {
            let client = self.client.lock().await;
            let row = client
                .query_opt("SELECT id, total_cents FROM orders WHERE id = $1", &[&id])
                .await?;
            Ok(row.map(|r| Order {
                id: r.get(0),
                total_cents: r.get(1),
            }))
        })
    }

    fn save_invoice_once(
        &self,
        job_id: &str,
        order: &Order,
    ) -> BoxFuture<'_, anyhow::Result<Mark>> {
        let (job_id, order) = (job_id.to_string(), order.clone());
        Box::pin(async move {
            let mut client = self.client.lock().await;
            // Outside the transaction on purpose: counts every delivery, so
            // tests can see a duplicate delivery really happened.
            client
                .execute(
                    "INSERT INTO invoice_deliveries (job_id) VALUES ($1)",
                    &[&job_id],
                )
                .await?;
            let tx = client.transaction().await?;
            let mark = self.markers.mark(&tx, &job_id, "invoices.render").await?;
            if mark == Mark::First {
                tx.execute(
                    "INSERT INTO invoices (order_id, total_cents) VALUES ($1, $2)",
                    &[&order.id, &order.total_cents],
                )
                .await?;
            }
            tx.commit().await?;
            Ok(mark)
        })
    }
}
