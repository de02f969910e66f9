//! The worker's HTTP endpoint: `/metrics` (Prometheus text), `/healthz`
//! (the process is alive) and `/readyz` (partitions assigned and consuming;
//! not ready before the first assignment and from the moment shutdown
//! begins, so a load balancer or orchestrator stops counting on it).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;
use crate::error::{Error, Result};
use crate::worker::WorkerStats;

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    stats: Arc<WorkerStats>,
}

async fn render_metrics(State(s): State<AppState>) -> impl IntoResponse {
    match s.metrics.render() {
        Some(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            text,
        ),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain")],
            "metrics are disabled\n".to_string(),
        ),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    if s.stats.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// Binds `addr` now (so a port conflict fails the worker's start) and
/// serves until `stop` is cancelled. Returns the bound address (useful with
/// port 0).
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    stats: Arc<WorkerStats>,
    stop: CancellationToken,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("binding the metrics endpoint on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("metrics endpoint address: {e}")))?;
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, stats });
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "metrics endpoint stopped");
        }
    });
    Ok(bound)
}
