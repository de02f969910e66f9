//! The HTTP endpoint of a worker or an outbox relay: `/metrics`
//! (Prometheus text), `/healthz` (the process is alive) and `/readyz`
//! (for a worker: partitions assigned and consuming; not ready before the
//! first assignment and from the moment shutdown begins, so a load balancer
//! or orchestrator stops counting on it), plus any routes the application
//! adds, such as the operator dashboard. One implementation for both, so a
//! process that runs a worker and a relay serves one endpoint.
//!
//! Behind the `metrics-http` cargo feature (on by default), which brings in
//! axum and the Prometheus exporter. Without it, [`serve`] fails with an
//! error naming the feature, so a worker asked for an endpoint never runs
//! silently without one.

use std::sync::Arc;

/// Whether the process is ready for work, asked on every `/readyz`.
pub type Readiness = Arc<dyn Fn() -> bool + Send + Sync>;

/// Without `metrics-http`: always an error saying which feature to enable.
#[cfg(not(feature = "metrics-http"))]
pub async fn serve(
    _addr: std::net::SocketAddr,
    _exporter: super::metrics::MetricsExporter,
    _ready: Readiness,
    _extra: Option<std::convert::Infallible>,
    _stop: tokio_util::sync::CancellationToken,
) -> crate::error::Result<std::net::SocketAddr> {
    Err(crate::error::Error::FeatureDisabled {
        feature: "metrics-http",
        what: "a metrics endpoint (WorkerBuilder::metrics_endpoint)",
    })
}

#[cfg(feature = "metrics-http")]
pub use imp::serve;

#[cfg(feature = "metrics-http")]
mod imp {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use axum::extract::State;
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::get;
    use axum::Router;
    use tokio::net::TcpListener;
    use tokio_util::sync::CancellationToken;

    use super::super::metrics::MetricsExporter;
    use super::Readiness;
    use crate::error::{Error, Result};

    #[derive(Clone)]
    struct AppState {
        exporter: MetricsExporter,
        ready: Readiness,
    }

    async fn render_metrics(State(s): State<AppState>) -> impl IntoResponse {
        match s.exporter.render() {
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
        if (s.ready)() {
            (StatusCode::OK, "ready\n")
        } else {
            (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
        }
    }

    /// Binds `addr` now (so a port conflict fails the start) and serves
    /// `exporter` until `stop` is cancelled. Returns the bound address
    /// (useful with port 0). `extra` answers every other path
    /// ([`WorkerBuilder::http_routes`](crate::WorkerBuilder::http_routes)).
    pub async fn serve(
        addr: SocketAddr,
        exporter: MetricsExporter,
        ready: Readiness,
        extra: Option<Router>,
        stop: CancellationToken,
    ) -> Result<SocketAddr> {
        let endpoint = |e: std::io::Error| Error::Endpoint {
            addr,
            source: Arc::new(e),
        };
        let listener = TcpListener::bind(addr).await.map_err(endpoint)?;
        let bound = listener.local_addr().map_err(endpoint)?;
        let mut app = Router::new()
            .route("/metrics", get(render_metrics))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(AppState { exporter, ready });
        if let Some(extra) = extra {
            // A fallback, not a merge: a path both define stays the worker's
            // instead of panicking at start.
            app = app.fallback_service(extra);
        }
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
}
