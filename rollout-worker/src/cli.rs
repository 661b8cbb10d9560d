//! Command-line flags of a rollout worker (every one readable from a `COMAS_WORKER_*`
//! variable), shared by `comas-rollout-worker` and `comas worker`.
use crate::register::{self, Registration};
use crate::{engine::EngineSettings, server};
use std::time::Duration;
use tokio::sync::watch;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[arg(long, env = "COMAS_WORKER_LISTEN", default_value = "127.0.0.1:50071")]
    listen: comas_service::Listen,
    #[arg(long, env = "COMAS_WORKER_METRICS_LISTEN")]
    metrics_listen: Option<comas_service::Listen>,
    #[arg(long, env = "COMAS_WORKER_DEVICE", default_value = "cpu")]
    device: String,
    /// Most sequences decoding at once per base model.
    #[arg(long, env = "COMAS_WORKER_MAX_RUNNING", default_value_t = 256)]
    max_running: usize,
    /// KV-cache token slots per base model (sequences × the widest prompt + max new tokens);
    /// bounds KV-cache memory.
    #[arg(long, env = "COMAS_WORKER_MAX_BATCH_TOKENS", default_value_t = 1 << 20)]
    max_batch_tokens: usize,
    /// Prompts longer than this many tokens are prefilled in chunks of it, one per step, so a
    /// long prompt does not stall the sequences decoding beside it (0: whole prompts).
    #[arg(long, env = "COMAS_WORKER_PREFILL_CHUNK_TOKENS", default_value_t = 512)]
    prefill_chunk_tokens: usize,
    /// Seconds a SIGTERM waits for running episodes.
    #[arg(long, env = "COMAS_WORKER_DRAIN_SECS", default_value_t = 120)]
    drain_secs: u64,
    /// Seconds a weight pull may take.
    #[arg(long, env = "COMAS_WORKER_WEIGHT_TIMEOUT_SECS", default_value_t = 600)]
    weight_timeout_secs: u64,
    /// Keep the chunks of the newest weight version pulled for each agent and serve them to
    /// the next workers of the coordinator's relay chain (costs one copy of those weights in
    /// memory; with `false` the coordinator's relay pulls fall back to the learner).
    #[arg(long, env = "COMAS_WORKER_RELAY", default_value_t = true, action = clap::ArgAction::Set)]
    relay: bool,
    /// Coordinator to register with (e.g. http://coordinator:50051); none = wait to be dialled.
    #[arg(long, env = "COMAS_WORKER_COORDINATOR")]
    coordinator: Option<String>,
    /// Address the coordinator dials back (default: the listen address).
    #[arg(long, env = "COMAS_WORKER_ADVERTISE")]
    advertise: Option<String>,
    /// Episodes this worker takes at once.
    #[arg(long, env = "COMAS_WORKER_MAX_EPISODES", default_value_t = 64)]
    max_episodes: u32,
    /// Identity in the coordinator's registry (default: random per process).
    #[arg(long, env = "COMAS_WORKER_ID")]
    worker_id: Option<String>,
    /// Token (scope `worker`) for a coordinator that checks tokens; read from the environment
    /// only, so it never shows in a process list.
    #[arg(skip = std::env::var("COMAS_WORKER_TOKEN").ok())]
    token: Option<String>,
    /// Plaintext port serving only the gRPC health service (for the kubelet's gRPC probe when
    /// this service speaks TLS); off when not given.
    #[arg(long, env = "COMAS_WORKER_HEALTH_LISTEN")]
    health_listen: Option<comas_service::Listen>,
    #[command(flatten)]
    tls: comas_service::tls::TlsArgs,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let device = comas_model::dtype::parse_device(&a.device)?;
    let tls = a.tls.service()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let listener = a.listen.bind().await?;
        let bound = listener.local_addr()?;
        // SIGTERM starts the drain; the registration loop tells the coordinator at once.
        let (drain_tx, drain_rx) = watch::channel(false);
        let (stop_tx, stop_rx) = watch::channel(false);
        if let Some(coordinator) = a.coordinator.clone() {
            let reg = Registration {
                coordinator,
                worker_id: a
                    .worker_id
                    .clone()
                    .unwrap_or_else(|| format!("worker-{}-{}", std::process::id(), bound.port())),
                advertise: a.advertise.clone().unwrap_or_else(|| bound.to_string()),
                max_episodes: a.max_episodes.max(1),
                bearer: comas_service::auth::Bearer::new(a.token.as_deref())
                    .map_err(|e| anyhow::anyhow!("COMAS_WORKER_TOKEN: {e}"))?,
            };
            tokio::spawn(register::run(reg, drain_rx, stop_rx));
        }
        let shutdown = async move {
            comas_service::shutdown_signal().await;
            let _ = drain_tx.send(true);
        };
        let settings = server::ServerSettings {
            listener,
            metrics_listen: a.metrics_listen,
            engine: EngineSettings {
                device,
                max_running: a.max_running.max(1),
                max_batch_tokens: a.max_batch_tokens.max(1),
                prefill_chunk: a.prefill_chunk_tokens,
            },
            drain_timeout: Duration::from_secs(a.drain_secs),
            weight_timeout: Duration::from_secs(a.weight_timeout_secs),
            relay: a.relay,
            tls,
            health_listen: a.health_listen,
        };
        let r = server::serve(settings, shutdown).await;
        let _ = stop_tx.send(true);
        r
    })
}
