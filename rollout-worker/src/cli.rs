//! Command-line flags of a rollout worker (every one readable from a `COMAS_WORKER_*`
//! variable), shared by `comas-rollout-worker` and `comas worker`.
use crate::engine::EngineKind;
use crate::register::{self, Registration};
use crate::vllm::VllmSettings;
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
    /// A prompt asked again on the same weights, beside the first or while the first runs (the
    /// samples of a GRPO group), copies the first one's keys, values and first logits instead of
    /// being prefilled again; the tokens do not change.
    #[arg(long, env = "COMAS_WORKER_SHARE_PROMPTS", default_value_t = true, action = clap::ArgAction::Set)]
    share_prompts: bool,
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
    #[command(flatten)]
    vllm: VllmArgs,
}

#[derive(clap::Args, Debug, Clone)]
pub struct VllmArgs {
    /// What generates the turns of a job whose `[rollout] engine` does not say: comas's own
    /// engine, or vLLM servers this worker starts (or the one --vllm-url names).
    #[arg(long, env = "COMAS_WORKER_ENGINE", value_enum, default_value = "comas")]
    engine: EngineKind,
    /// A running vLLM server (http://host:port) to use instead of starting one; it must serve
    /// the job's one base model, with runtime LoRA updates on for LoRA agents.
    #[arg(long, env = "COMAS_WORKER_VLLM_URL")]
    vllm_url: Option<String>,
    /// The model name the --vllm-url server serves its base under.
    #[arg(long, env = "COMAS_WORKER_VLLM_SERVED_NAME", default_value = "base")]
    vllm_served_name: String,
    /// The Python that has vLLM (default: .venv-vllm/bin/python of the checkout this binary
    /// was built in or of the current folder, made by `bash scripts/setup-vllm.sh`).
    #[arg(long, env = "COMAS_WORKER_VLLM_PYTHON")]
    vllm_python: Option<std::path::PathBuf>,
    /// An argument added to each vLLM server's command line (repeat it for several).
    #[arg(
        long = "vllm-arg",
        env = "COMAS_WORKER_VLLM_ARGS",
        value_delimiter = ' ',
        allow_hyphen_values = true
    )]
    vllm_args: Vec<String>,
    /// KV-cache GiB of a vLLM server on the CPU.
    #[arg(long, env = "COMAS_WORKER_VLLM_KV_GIB", default_value_t = 2)]
    vllm_kv_gib: u32,
    /// Seconds a vLLM server may take to start.
    #[arg(long, env = "COMAS_WORKER_VLLM_STARTUP_SECS", default_value_t = 900)]
    vllm_startup_secs: u64,
}

/// `.venv-vllm/bin/python` in the checkout this binary was built in (target/<profile>/comas)
/// or in the current folder; else `python3`.
pub fn default_vllm_python() -> std::path::PathBuf {
    let rel = std::path::Path::new(".venv-vllm/bin/python");
    let exe = std::env::current_exe().ok();
    let built_in = exe.as_deref().and_then(|e| e.ancestors().nth(3)).map(|root| root.join(rel));
    built_in
        .into_iter()
        .chain(std::env::current_dir().ok().map(|d| d.join(rel)))
        .find(|p| p.exists())
        .unwrap_or_else(|| "python3".into())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    // On vLLM the device is the servers'; comas keeps only adapters, on the CPU.
    let on_vllm = a.vllm.engine == EngineKind::Vllm;
    let device =
        if on_vllm { tch::Device::Cpu } else { comas_model::dtype::parse_device(&a.device)? };
    // Any job may ask for vLLM: the servers' logs and the adapters handed to them go here.
    let vllm_dir = tempfile::Builder::new().prefix("comas-worker-vllm-").tempdir()?;
    let vllm = Some(&vllm_dir).map(|dir| VllmSettings {
        url: a.vllm.vllm_url.clone(),
        served_name: a.vllm.vllm_served_name.clone(),
        python: a.vllm.vllm_python.clone().unwrap_or_else(default_vllm_python),
        extra_args: a.vllm.vllm_args.iter().filter(|s| !s.is_empty()).cloned().collect(),
        cpu_kv_gib: a.vllm.vllm_kv_gib.max(1),
        cpu_threads: tch::get_num_threads().max(1) as usize,
        startup: Duration::from_secs(a.vllm.vllm_startup_secs),
        max_model_len: a.max_batch_tokens.max(1),
        device: a.device.trim().to_string(),
        work_dir: dir.path().to_path_buf(),
    });
    if let Some(v) = vllm.as_ref().filter(|v| on_vllm && v.url.is_none()) {
        crate::vllm::check_python(&v.python)?;
    }
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
                share_prompts: a.share_prompts,
                vllm,
                default_engine: a.vllm.engine,
                device_name: a.device.clone(),
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
