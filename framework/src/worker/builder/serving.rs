//! What a worker serves beside its routes: the metrics endpoint, a shared
//! exporter, more HTTP routes (the dashboard) and an outbox relay.

use crate::telemetry::metrics::MetricsExporter;
use crate::worker::builder::WorkerBuilder;
use std::net::SocketAddr;

impl WorkerBuilder {
    /// Serves `/metrics` (Prometheus), `/healthz` and `/readyz` on `addr`
    /// while the worker runs (port 0 picks a free port; see
    /// [`WorkerStats::endpoint`](crate::WorkerStats::endpoint)). Without it, metrics are no-ops.
    pub fn metrics_endpoint(mut self, addr: SocketAddr) -> Self {
        self.endpoint = Some(addr);
        self
    }

    /// Records this worker's metrics into `exporter`, shared with other
    /// workers or an outbox relay of the process
    /// ([`Relay::metrics_exporter`](crate::outbox::Relay::metrics_exporter)),
    /// so one `/metrics` shows them all: the one with a
    /// [`metrics_endpoint`](Self::metrics_endpoint) serves it, or your own
    /// server does ([`MetricsExporter::render`]). The worker's gauges carry
    /// its `group`, so two workers' values stay apart.
    pub fn metrics_exporter(mut self, exporter: MetricsExporter) -> Self {
        self.exporter = Some(exporter);
        self
    }

    /// Serves `routes` on the [`metrics_endpoint`](Self::metrics_endpoint)
    /// too, for any path other than `/metrics`, `/healthz` and `/readyz`
    /// (which keep answering as before). Meant for the operator dashboard
    /// (`kjob_ops::ui::Dashboard::router_on`), so a worker can show its
    /// routes and dead letters without a separate `kjob ui` process; the
    /// routes guard themselves. `build()` refuses it without an endpoint.
    #[cfg(feature = "metrics-http")]
    pub fn http_routes(mut self, routes: axum::Router) -> Self {
        self.http_routes = Some(routes);
        self
    }

    /// Also runs an outbox relay ([`crate::outbox::Relay`]) in this process,
    /// started with the worker and stopped when it stops, so a service that
    /// enqueues through the outbox needs no separate relay deployment.
    #[cfg(feature = "postgres")]
    pub fn outbox_relay(mut self, relay: crate::outbox::Relay) -> Self {
        self.outbox_relay = Some(relay);
        self
    }
}
