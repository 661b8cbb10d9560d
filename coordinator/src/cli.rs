//! Command-line flags of the coordinator (every one readable from a `COMAS_COORDINATOR_*`
//! variable), shared by `comas-coordinator` and `comas coordinator`.
use crate::server::{serve, ServerSettings};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[arg(long, env = "COMAS_COORDINATOR_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: comas_service::Listen,
    /// HTTP address for /metrics and /healthz (off when not given).
    #[arg(long, env = "COMAS_COORDINATOR_METRICS_LISTEN")]
    pub metrics_listen: Option<comas_service::Listen>,
    /// SQLite file with the job state.
    #[arg(long, env = "COMAS_COORDINATOR_DB", default_value = "comas-jobs.sqlite")]
    pub db: PathBuf,
    /// How often workers send heartbeats.
    #[arg(long, env = "COMAS_COORDINATOR_HEARTBEAT_MS", default_value_t = 2000)]
    pub heartbeat_ms: u64,
    /// A worker silent for this long is dropped and its episodes re-queued.
    #[arg(long, env = "COMAS_COORDINATOR_HEARTBEAT_TIMEOUT_SECS", default_value_t = 30)]
    pub heartbeat_timeout_secs: u64,
    /// A leased episode not back after this long is leased again.
    #[arg(long, env = "COMAS_COORDINATOR_EPISODE_TIMEOUT_SECS", default_value_t = 1800)]
    pub episode_timeout_secs: u64,
    /// Queued episodes with no ready worker for this long fail the job.
    #[arg(long, env = "COMAS_COORDINATOR_WORKER_WAIT_SECS", default_value_t = 600)]
    pub worker_wait_secs: u64,
    /// Weight broadcast: each worker passes a new version on to this many others, forwarding
    /// chunks as they arrive (1: a chain; 0: every worker pulls from the learners).
    #[arg(long, env = "COMAS_COORDINATOR_RELAY_FANOUT", default_value_t = crate::scheduler::DEFAULT_RELAY_FANOUT)]
    pub relay_fanout: usize,
    /// Folders that the model, data and output paths of a submitted job must lie in, separated
    /// by commas; a path outside them, or one going up through `..` or out through a symlink, is
    /// refused at submit. Empty: any path (a coordinator only trusted users reach).
    #[arg(long, env = "COMAS_COORDINATOR_ALLOWED_ROOTS", default_value = "")]
    pub allowed_roots: String,
    /// Token file: lines `SHA256 SCOPES [NAME]` (`comas token new` makes one). With it, every
    /// call needs `authorization: Bearer TOKEN` with a scope that allows it: `read` (status,
    /// lists, results), `submit` (and cancel, resume), `worker` (registration, heartbeats),
    /// `admin`. Edits take effect without a restart. Without it the API is open.
    #[arg(long, env = "COMAS_COORDINATOR_TOKENS")]
    pub tokens: Option<PathBuf>,
    /// `SubmitJob` calls one peer address may make per minute (a burst of as many, then evenly
    /// spread); more get RESOURCE_EXHAUSTED with the wait. 0: no limit.
    #[arg(long, env = "COMAS_COORDINATOR_SUBMIT_PER_MINUTE", default_value_t = 60)]
    pub submit_per_minute: u32,
    /// Plaintext port serving only the gRPC health service (for the kubelet's gRPC probe when
    /// this service speaks TLS); off when not given.
    #[arg(long, env = "COMAS_COORDINATOR_HEALTH_LISTEN")]
    pub health_listen: Option<comas_service::Listen>,
    #[command(flatten)]
    pub tls: comas_service::tls::TlsArgs,
}

pub async fn run_async(
    a: Args,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = a.listen.bind().await?;
    serve(
        ServerSettings {
            listener,
            metrics_listen: a.metrics_listen,
            db: a.db,
            heartbeat_interval: Duration::from_millis(a.heartbeat_ms.max(100)),
            heartbeat_timeout: Duration::from_secs(a.heartbeat_timeout_secs.max(1)),
            episode_timeout: Duration::from_secs(a.episode_timeout_secs.max(1)),
            worker_wait: Duration::from_secs(a.worker_wait_secs.max(1)),
            relay_fanout: a.relay_fanout,
            allowed_roots: comas_service::AllowedRoots::parse(&a.allowed_roots)
                .map_err(|e| anyhow::anyhow!("--allowed-roots: {e}"))?,
            tokens: a.tokens.as_deref().map(comas_service::auth::TokenFile::open).transpose()?,
            submit_per_minute: a.submit_per_minute,
            tls: a.tls.service()?,
            health_listen: a.health_listen,
        },
        shutdown,
    )
    .await
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run_async(a, comas_service::shutdown_signal()))
}
