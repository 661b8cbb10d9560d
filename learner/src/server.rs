//! Runs the learner service: training thread, gRPC (with health), metrics, graceful shutdown.
use crate::engine::{self, AgentSetup, EngineSettings};
use crate::error::{LearnerError, Result};
use crate::metrics::Metrics;
use crate::progress::Progress;
use crate::service::{AgentSide, LearnerService};
use comas_proto::v1::learner_server::LearnerServer;
use comas_service::limits::PEER_MESSAGE_BYTES;
use std::sync::Arc;
use tokio::sync::{oneshot, watch};

pub struct ServerSettings {
    /// The agents this process trains (one, or several adapters over one base), each with its
    /// engine settings.
    pub agents: Vec<(u32, EngineSettings)>,
    pub listener: tokio::net::TcpListener,
    pub metrics_listen: Option<comas_service::Listen>,
    /// Folders an export the coordinator asks for may be written to (empty: anywhere).
    pub allowed_roots: comas_service::AllowedRoots,
    /// TLS of the server (`None`: plaintext).
    pub tls: Option<std::sync::Arc<comas_service::tls::ServerTls>>,
    /// Plaintext health-only port (`None`: none).
    pub health_listen: Option<comas_service::Listen>,
}

/// Serves until `shutdown` fires. Health reports SERVING only after the model has loaded.
pub async fn serve(
    s: ServerSettings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    if s.agents.is_empty() {
        return Err(LearnerError::Config("a learner needs at least one agent to train".into()));
    }
    let metrics = Metrics::new();
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_not_serving::<LearnerServer<LearnerService>>().await;
    let (ready_tx, ready_rx) = oneshot::channel();
    let load_failure = engine::LoadFailure::default();
    let ids: Vec<u32> = s.agents.iter().map(|(a, _)| *a).collect();
    let mut sides = std::collections::BTreeMap::new();
    let mut setups = Vec::new();
    for (agent, settings) in s.agents {
        let side = AgentSide {
            versions: Default::default(),
            metrics: metrics.agent(agent),
            progress: Progress::shared(),
        };
        setups.push(AgentSetup {
            agent,
            settings,
            versions: Arc::clone(&side.versions),
            progress: Arc::clone(&side.progress),
        });
        if sides.insert(agent, side).is_some() {
            return Err(LearnerError::Config(format!("agent {agent} is listed twice")));
        }
    }
    let engine = engine::spawn(setups, ready_tx, Arc::clone(&load_failure));
    let service = LearnerService { agents: sides, engine, load_failure, roots: s.allowed_roots };

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    if let Some(addr) = s.metrics_listen {
        let m = Arc::clone(&metrics);
        let stop = wait(stop_rx.clone());
        tokio::spawn(async move {
            if let Err(e) =
                comas_service::serve_metrics(addr, Arc::new(move || m.render()), stop).await
            {
                tracing::error!(listen = %addr, error = %e, "metrics server failed");
            }
        });
    }
    let hr = health_reporter.clone();
    tokio::spawn(async move {
        match ready_rx.await {
            Ok(Ok(())) => {
                hr.set_serving::<LearnerServer<LearnerService>>().await;
                tracing::info!("model loaded; learner is ready");
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "model failed to load; the learner stays NOT_SERVING")
            }
            Err(_) => tracing::error!("training thread exited during start-up"),
        }
    });
    let addr = s.listener.local_addr().map_err(|e| LearnerError::io("listener", e))?;
    tracing::info!(%addr, agents = ?ids, "learner listening");
    if let Some(listen) = s.health_listen {
        let router = tonic::transport::Server::builder().add_service(health_service.clone());
        comas_service::spawn_health_port(listen, router, wait(stop_rx.clone()))
            .await
            .map_err(|e| LearnerError::io("health port", e))?;
    }
    let router = tonic::transport::Server::builder()
        .concurrency_limit_per_connection(comas_service::limits::CALLS_PER_CONNECTION)
        .initial_stream_window_size(comas_service::HTTP2_STREAM_WINDOW)
        .initial_connection_window_size(comas_service::HTTP2_CONNECTION_WINDOW)
        .max_frame_size(comas_service::HTTP2_MAX_FRAME)
        .add_service(health_service)
        .add_service(
            LearnerServer::new(service)
                .max_decoding_message_size(PEER_MESSAGE_BYTES)
                .max_encoding_message_size(PEER_MESSAGE_BYTES),
        );
    comas_service::tls::serve(router, s.listener, s.tls, wait(stop_rx))
        .await
        .map_err(|e| LearnerError::Config(format!("gRPC server on {addr}: {e}")))
}
