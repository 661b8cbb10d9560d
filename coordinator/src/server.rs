//! Runs the coordinator: job store, scheduler, job driver, gRPC with health, metrics.
use crate::jobs::Jobs;
use crate::metrics::Metrics;
use crate::scheduler::{Scheduler, SchedulerSettings};
use crate::service::CoordinatorService;
use crate::store::Store;
use comas_proto::v1::coordinator_server::CoordinatorServer;
use comas_service::limits::{RateLimit, CALLS_PER_CONNECTION};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub struct ServerSettings {
    pub listener: tokio::net::TcpListener,
    pub metrics_listen: Option<comas_service::Listen>,
    pub db: PathBuf,
    pub heartbeat_interval: Duration,
    pub heartbeat_timeout: Duration,
    pub episode_timeout: Duration,
    pub worker_wait: Duration,
    pub relay_fanout: usize,
    /// Folders a job's paths must lie in (empty: anywhere).
    pub allowed_roots: comas_service::AllowedRoots,
    /// Bearer tokens of the API (`None`: open).
    pub tokens: Option<comas_service::auth::TokenFile>,
    /// `SubmitJob` calls a peer address may make per minute (0: no limit).
    pub submit_per_minute: u32,
    /// TLS of the server (`None`: plaintext); the clients' is process-wide
    /// (`comas_service::tls::install_client`).
    pub tls: Option<Arc<comas_service::tls::ServerTls>>,
    /// Plaintext health-only port (`None`: none).
    pub health_listen: Option<comas_service::Listen>,
}

/// Serves until `shutdown` fires. A running job stays `running` in the store and continues
/// from its last completed step when a coordinator starts on the same database.
pub async fn serve(
    s: ServerSettings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let store = Arc::new(Store::open(&s.db)?);
    let metrics = Metrics::new();
    let scheduler = Scheduler::spawn(
        SchedulerSettings {
            heartbeat_timeout: s.heartbeat_timeout,
            episode_timeout: s.episode_timeout,
            worker_wait: s.worker_wait,
            relay_fanout: s.relay_fanout,
        },
        Arc::clone(&metrics),
    );
    let jobs = Jobs::new(store, scheduler, Arc::clone(&metrics), s.allowed_roots);
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let driver = tokio::spawn(Arc::clone(&jobs).drive(stop_rx.clone()));
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    if let Some(addr) = s.metrics_listen {
        let stop = wait(stop_rx.clone());
        let m = Arc::clone(&metrics);
        tokio::spawn(async move {
            if let Err(e) =
                comas_service::serve_metrics(addr, Arc::new(move || m.render()), stop).await
            {
                tracing::error!(listen = %addr, error = %e, "metrics server failed");
            }
        });
    }
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<CoordinatorServer<CoordinatorService>>().await;
    let service = CoordinatorService {
        jobs,
        heartbeat_interval: s.heartbeat_interval,
        tokens: s.tokens.map(Arc::new),
        submits: RateLimit::per_minute(s.submit_per_minute),
    };
    let addr = s.listener.local_addr()?;
    tracing::info!(%addr, db = %s.db.display(), "coordinator listening");
    if let Some(listen) = s.health_listen {
        let router = tonic::transport::Server::builder().add_service(health_service.clone());
        comas_service::spawn_health_port(listen, router, wait(stop_rx.clone())).await?;
    }
    let router = tonic::transport::Server::builder()
        .concurrency_limit_per_connection(CALLS_PER_CONNECTION)
        .add_service(health_service)
        .add_service(
            CoordinatorServer::new(service)
                .max_decoding_message_size(comas_service::limits::API_MESSAGE_BYTES),
        );
    comas_service::tls::serve(router, s.listener, s.tls, wait(stop_rx)).await?;
    let _ = driver.await;
    Ok(())
}
