//! The HTTP endpoint (`[metrics] listen`): `GET /metrics` (Prometheus
//! text, OpenMetrics), `GET /healthz` (200 while the process runs) and
//! `GET /readyz` (200 while the router consumes ingress and expired, else
//! 503 with the reason on one line).

use super::health::Health;
use super::stats::Stats;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The OpenMetrics content type Prometheus negotiates for this format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
struct Served {
    stats: Arc<Stats>,
    health: Arc<Health>,
}

/// Why the endpoint cannot serve.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {addr} ([metrics] listen): {message}")]
pub struct EndpointError {
    pub addr: SocketAddr,
    pub message: String,
}

/// Binds `addr` (so a taken port is an error at start) and returns the
/// bound address and the server, which runs until `stop`.
pub async fn bind(
    addr: SocketAddr,
    stats: Arc<Stats>,
    health: Arc<Health>,
    stop: CancellationToken,
) -> Result<(SocketAddr, impl Future<Output = ()>), EndpointError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| EndpointError {
            addr,
            message: e.to_string(),
        })?;
    let bound = listener.local_addr().map_err(|e| EndpointError {
        addr,
        message: e.to_string(),
    })?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Served { stats, health });
    info!(listen = %bound, "serving /metrics, /healthz and /readyz");
    let serve = async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            warn!(error = %e, "the metrics endpoint stopped");
        }
    };
    Ok((bound, serve))
}

async fn metrics(State(s): State<Served>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], s.stats.encode())
}

async fn healthz() -> impl IntoResponse {
    (StatusCode::OK, "ok\n")
}

async fn readyz(State(s): State<Served>) -> impl IntoResponse {
    match s.health.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}
