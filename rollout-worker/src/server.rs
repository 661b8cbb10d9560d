//! Runs a worker: engine thread, gRPC with health, metrics, and a draining shutdown.
use crate::engine::{self, Command, EngineSettings, Stats};
use crate::metrics::Metrics;
use crate::relay::Relay;
use crate::service::WorkerService;
use comas_proto::v1::rollout_worker_server::RolloutWorkerServer;
use comas_service::limits::PEER_MESSAGE_BYTES;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};

pub struct ServerSettings {
    pub listener: tokio::net::TcpListener,
    pub metrics_listen: Option<comas_service::Listen>,
    pub engine: EngineSettings,
    /// How long a SIGTERM waits for running episodes before exiting anyway.
    pub drain_timeout: Duration,
    pub weight_timeout: Duration,
    /// Serve pulled weights to other workers (RelayWeights).
    pub relay: bool,
    /// TLS of the server (`None`: plaintext).
    pub tls: Option<Arc<comas_service::tls::ServerTls>>,
    /// Plaintext health-only port (`None`: none).
    pub health_listen: Option<comas_service::Listen>,
}

/// How long a RelayWeights call waits for this worker to start receiving the version: every
/// worker of a relay chain is told at once, so the next one may ask before this one has begun.
const RELAY_WAIT: Duration = Duration::from_secs(30);

/// Serves until `shutdown` fires, then stops taking episodes, lets the running ones finish
/// (up to `drain_timeout`) and returns.
pub async fn serve(
    s: ServerSettings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let stats = Arc::new(Stats::default());
    let (engine, engine_thread) = engine::spawn(s.engine, Arc::clone(&stats));
    let metrics = Metrics::new(stats);
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_not_serving::<RolloutWorkerServer<WorkerService>>().await;
    let (loaded_tx, mut loaded_rx) = watch::channel(false);
    let hr = health_reporter.clone();
    tokio::spawn(async move {
        if loaded_rx.wait_for(|v| *v).await.is_ok() {
            hr.set_serving::<RolloutWorkerServer<WorkerService>>().await;
            tracing::info!("policies loaded; worker is ready");
        }
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let (engine_failed_tx, engine_failed) = watch::channel(None::<String>);
    let service = WorkerService {
        engine_failed: engine_failed.clone(),
        engine: engine.clone(),
        metrics: Arc::clone(&metrics),
        next_stream: AtomicU64::new(0),
        loaded: loaded_tx,
        weight_timeout: s.weight_timeout,
        relay: Relay::new(s.relay, RELAY_WAIT),
        pulls: Default::default(),
        stopping: stop_rx.clone(),
    };
    let drain_timeout = s.drain_timeout;
    let hr = health_reporter.clone();
    // A worker whose engine thread has died can run nothing: it stops serving and exits with
    // the reason, so its streams break and the coordinator re-queues its episodes.
    let (died_tx, mut died_rx) = oneshot::channel::<String>();
    tokio::spawn(async move {
        while !engine_thread.is_finished() {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        let why = match engine_thread.join() {
            Err(panic) => comas_service::panic_message(panic.as_ref()),
            Ok(()) => "it stopped".to_string(),
        };
        let _ = died_tx.send(why);
    });
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown => {}
            why = &mut died_rx => {
                if let Ok(why) = why {
                    tracing::error!(error = %why, "the engine thread died; the worker stops");
                    let _ = engine_failed_tx.send(Some(why));
                }
                hr.set_not_serving::<RolloutWorkerServer<WorkerService>>().await;
                let _ = stop_tx.send(true);
                return;
            }
        }
        // Drain: refuse new episodes, let running ones finish, then stop serving.
        hr.set_not_serving::<RolloutWorkerServer<WorkerService>>().await;
        let (tx, rx) = oneshot::channel();
        if engine.send(Command::Drain { reply: tx }).is_ok() {
            if tokio::time::timeout(drain_timeout, rx).await.is_err() {
                tracing::warn!(
                    ?drain_timeout,
                    "episodes still running at the drain deadline; the coordinator re-queues them"
                );
            }
        }
        let _ = stop_tx.send(true);
    });
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    if let Some(addr) = s.metrics_listen {
        let stop = wait(stop_rx.clone());
        tokio::spawn(async move {
            if let Err(e) =
                comas_service::serve_metrics(addr, Arc::new(move || metrics.render()), stop).await
            {
                tracing::error!(listen = %addr, error = %e, "metrics server failed");
            }
        });
    }
    let addr = s.listener.local_addr()?;
    tracing::info!(%addr, "rollout worker listening");
    if let Some(listen) = s.health_listen {
        let router = tonic::transport::Server::builder().add_service(health_service.clone());
        comas_service::spawn_health_port(listen, router, wait(stop_rx.clone())).await?;
    }
    let router = tonic::transport::Server::builder()
        .concurrency_limit_per_connection(comas_service::limits::CALLS_PER_CONNECTION)
        .initial_stream_window_size(comas_service::HTTP2_STREAM_WINDOW)
        .initial_connection_window_size(comas_service::HTTP2_CONNECTION_WINDOW)
        .max_frame_size(comas_service::HTTP2_MAX_FRAME)
        .add_service(health_service)
        .add_service(
            RolloutWorkerServer::new(service)
                .max_decoding_message_size(PEER_MESSAGE_BYTES)
                .max_encoding_message_size(PEER_MESSAGE_BYTES),
        );
    comas_service::tls::serve(router, s.listener, s.tls, wait(stop_rx)).await?;
    if let Some(why) = engine_failed.borrow().clone() {
        anyhow::bail!("the engine thread died ({why}); restart the worker");
    }
    Ok(())
}
