//! `comas-rollout-worker`: serves the RolloutWorker gRPC API.
use anyhow::Context;
use clap::Parser;
use comas_rollout_worker::{engine::EngineSettings, server};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "comas-rollout-worker", version, about = "Runs discussion episodes for comas jobs")]
struct Args {
    #[arg(long, env = "COMAS_WORKER_LISTEN", default_value = "127.0.0.1:50071")]
    listen: std::net::SocketAddr,
    #[arg(long, env = "COMAS_WORKER_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    #[arg(long, env = "COMAS_WORKER_DEVICE", default_value = "cpu")]
    device: String,
    /// Most sequences decoding at once per base model.
    #[arg(long, env = "COMAS_WORKER_MAX_RUNNING", default_value_t = 256)]
    max_running: usize,
    /// Most tokens (prompt + max new) admitted at once per base model; bounds KV-cache memory.
    #[arg(long, env = "COMAS_WORKER_MAX_BATCH_TOKENS", default_value_t = 1 << 20)]
    max_batch_tokens: usize,
    /// Seconds a SIGTERM waits for running episodes.
    #[arg(long, env = "COMAS_WORKER_DRAIN_SECS", default_value_t = 120)]
    drain_secs: u64,
    /// Seconds a weight pull may take.
    #[arg(long, env = "COMAS_WORKER_WEIGHT_TIMEOUT_SECS", default_value_t = 600)]
    weight_timeout_secs: u64,
    #[arg(long, env = "COMAS_THREADS")]
    threads: Option<i32>,
}

fn run(a: Args) -> anyhow::Result<()> {
    if let Some(n) = a.threads {
        tch::set_num_threads(n);
    }
    let device = comas_model::dtype::parse_device(&a.device)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("binding {}", a.listen))?;
        let settings = server::ServerSettings {
            listener,
            metrics_listen: a.metrics_listen,
            engine: EngineSettings { device, max_running: a.max_running.max(1), max_batch_tokens: a.max_batch_tokens.max(1) },
            drain_timeout: Duration::from_secs(a.drain_secs),
            weight_timeout: Duration::from_secs(a.weight_timeout_secs),
        };
        server::serve(settings, comas_service::shutdown_signal()).await
    })
}

fn main() -> ExitCode {
    comas_service::init_logging(false);
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
