//! Plumbing every comas service shares: a small HTTP server for Prometheus `/metrics` and a
//! `/healthz` liveness check next to the gRPC port, the SIGTERM / Ctrl-C future that starts a
//! graceful shutdown, and the logging set-up.
pub mod prom;

/// A gRPC address as a URI: `host:port` gets `http://`, anything with a scheme stays as it is.
pub fn grpc_uri(address: &str) -> String {
    if address.starts_with("http") {
        address.to_string()
    } else {
        format!("http://{address}")
    }
}

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

/// Serves `/metrics` (the text `render` returns at scrape time) and `/healthz` until `shutdown`
/// resolves.
pub async fn serve_metrics(
    addr: SocketAddr,
    render: Arc<dyn Fn() -> String + Send + Sync>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::{routing::get, Router};
    let app = Router::new()
        .route("/metrics", get(move || {
            let r = Arc::clone(&render);
            async move { r() }
        }))
        .route("/healthz", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

/// Resolves on SIGTERM (what Kubernetes sends) or Ctrl-C.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
    tracing::info!("shutdown signal received");
}

/// Logs to stderr, filtered by `COMAS_LOG` (default `warn`), as JSON lines or human-readable.
pub fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("COMAS_LOG").unwrap_or_else(|_| "warn".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
