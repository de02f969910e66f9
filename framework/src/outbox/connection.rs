//! A relay session's connections: the PostgreSQL connection config, the
//! task that drives a connection and wakes the relay on NOTIFY, and the
//! gauges' own session.

use super::metrics::OutboxMetrics;
use super::{OutboxError, OutboxTable};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Connection, NoTls};
use tokio_util::sync::CancellationToken;

/// How often the lag gauges are refreshed.
const GAUGES_EVERY: Duration = Duration::from_secs(1);

/// The connection settings, with `application_name` set (unless the URL
/// sets one) to `kjob-relay <table>`, so relays are recognisable in
/// `pg_stat_activity`.
pub(super) fn pg_config(
    url: &str,
    table: &OutboxTable,
) -> Result<tokio_postgres::Config, OutboxError> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
        // The error, not the URL: it may carry a password.
        OutboxError::Config(format!("the database URL does not parse: {e}"))
    })?;
    if config.get_application_name().is_none() {
        let mut name = format!("kjob-relay {}", table.name());
        name.truncate(63);
        config.application_name(&name);
    }
    Ok(config)
}

/// Drives the connection and turns notifications into wake-ups.
pub(super) async fn drive<S, T>(mut connection: Connection<S, T>, wake: Arc<Notify>)
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = messages.next().await {
        match message {
            Ok(AsyncMessage::Notification(_)) => wake.notify_one(),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %super::describe(&e), "outbox relay: database connection closed");
                break;
            }
        }
    }
    // Wake the loop so its next query reports the broken connection.
    wake.notify_one();
}

/// Refreshes lag and unsent on its own connection, so they keep moving
/// while the publishing loop waits for a broker that is away.
pub(super) async fn refresh_gauges(
    url: String,
    table: OutboxTable,
    metrics: OutboxMetrics,
    cancel: CancellationToken,
) {
    let sql = format!(
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM {t} WHERE sent_at IS NULL LIMIT 100000) u),
                coalesce((SELECT extract(epoch FROM clock_timestamp() - created_at)::float8
                          FROM {t} WHERE sent_at IS NULL ORDER BY id LIMIT 1), 0)",
        t = table.name()
    );
    let Ok(url) = pg_config(&url, &table) else {
        return; // the publishing session reports the bad URL
    };
    while !cancel.is_cancelled() {
        tokio::select! {
            r = gauge_session(&url, &sql, &metrics) => {
                if let Err(e) = r {
                    tracing::debug!(error = %super::describe(&e), "outbox gauges: database error; retrying");
                }
            }
            () = cancel.cancelled() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = cancel.cancelled() => return,
        }
    }
}

pub(super) async fn gauge_session(
    url: &tokio_postgres::Config,
    sql: &str,
    metrics: &OutboxMetrics,
) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = url.connect(NoTls).await?;
    let _driver = AbortOnDrop(tokio::spawn(async move {
        let _ = connection.await;
    }));
    let stmt = client.prepare(sql).await?;
    loop {
        let row = client.query_one(&stmt, &[]).await?;
        let unsent: i64 = row.try_get(0)?;
        let lag: f64 = row.try_get(1)?;
        metrics.update(|s| {
            s.unsent = unsent;
            s.lag_seconds = lag;
        });
        tokio::time::sleep(GAUGES_EVERY).await;
    }
}

/// Aborts a spawned task when dropped (a session's connection driver dies
/// with the session, which releases its advisory locks).
pub(super) struct AbortOnDrop<T>(pub(super) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
