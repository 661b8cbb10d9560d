//! Command-line flags of the learner (every serve flag readable from a `COMAS_LEARNER_*`
//! variable), shared by `comas-learner` and `comas learner`.
use crate::{engine, experience, server, TrainConfig, Trainer};
use anyhow::{bail, Context, Result};
use clap::Subcommand;
use comas_workflow::job::JobSpec;
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Serve the Learner gRPC API for one agent.
    Serve(ServeArgs),
    /// Run one training step on a batch file, without the network, and write the updated model
    /// folder and the step report (for debugging and reproduction).
    Step {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        batch: PathBuf,
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// LoRA adapter folder to continue training (with `[lora]` in the config).
        #[arg(long)]
        adapter: Option<PathBuf>,
        /// Fold a LoRA adapter into the base weights in the output.
        #[arg(long)]
        merge_lora: bool,
        /// Frozen KL reference model (default: --model).
        #[arg(long)]
        reference_model: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Job file: the agent's model, adapter and training settings come from its
    /// `[[agents]]` entry number --agent-id (instead of --model / --config).
    #[arg(long, env = "COMAS_LEARNER_JOB", conflicts_with_all = ["model", "config"])]
    job: Option<PathBuf>,
    /// The agent's base model folder (Hugging Face layout).
    #[arg(long, env = "COMAS_LEARNER_MODEL")]
    model: Option<PathBuf>,
    /// Training config (TOML).
    #[arg(long, env = "COMAS_LEARNER_CONFIG")]
    config: Option<PathBuf>,
    /// The agent this learner trains, or several separated by commas (with --job): LoRA
    /// agents over one base then share it in this process, and agent k's checkpoints go to
    /// `--checkpoint-dir`/agent-k.
    #[arg(long, env = "COMAS_LEARNER_AGENT_ID", value_delimiter = ',', default_value = "0")]
    agent_id: Vec<u32>,
    #[arg(long, env = "COMAS_LEARNER_LISTEN", default_value = "127.0.0.1:50061")]
    listen: comas_service::Listen,
    /// HTTP address for /metrics and /healthz (off when not given).
    #[arg(long, env = "COMAS_LEARNER_METRICS_LISTEN")]
    metrics_listen: Option<comas_service::Listen>,
    #[arg(long, env = "COMAS_LEARNER_CHECKPOINT_DIR")]
    checkpoint_dir: Option<PathBuf>,
    #[arg(long, env = "COMAS_LEARNER_KEEP_CHECKPOINTS", default_value_t = 3)]
    keep_checkpoints: usize,
    /// Continue from the newest complete checkpoint under --checkpoint-dir, if there is one.
    #[arg(long, env = "COMAS_LEARNER_RESUME")]
    resume: bool,
    /// Folders that an export the coordinator asks for must lie in, separated by commas (a
    /// path outside, or going up through `..` or out through a symlink, is refused). Empty:
    /// anywhere.
    #[arg(long, env = "COMAS_LEARNER_ALLOWED_ROOTS", default_value = "")]
    allowed_roots: String,
    /// Frozen KL reference (default: --model).
    #[arg(long, env = "COMAS_LEARNER_REFERENCE_MODEL")]
    reference_model: Option<PathBuf>,
    /// LoRA adapter to continue training.
    #[arg(long, env = "COMAS_LEARNER_ADAPTER")]
    adapter: Option<PathBuf>,
    /// Memory this learner may use, in bytes, when that is less than its device has (a shared
    /// GPU, a container limit); jobs whose estimate exceeds it are warned of at submit.
    #[arg(long, env = "COMAS_LEARNER_MEMORY_BYTES")]
    memory_bytes: Option<u64>,
    /// Plaintext port serving only the gRPC health service (for the kubelet's gRPC probe when
    /// this service speaks TLS); off when not given.
    #[arg(long, env = "COMAS_LEARNER_HEALTH_LISTEN")]
    health_listen: Option<comas_service::Listen>,
    #[command(flatten)]
    tls: comas_service::tls::TlsArgs,
}

/// A job's text, with paths relative to `base` resolved and the checks a submit makes passed
/// (its data set counted, unless the method generates its tasks); errors name `label`.
pub fn checked_job(
    text: &str,
    base: &std::path::Path,
    label: &str,
) -> Result<comas_workflow::job::Job> {
    let mut spec = JobSpec::from_toml(text).with_context(|| label.to_string())?;
    spec.resolve_paths(base);
    // A method that generates its tasks (CoSIR) has no data set to count.
    let n = if spec.data.train.as_os_str().is_empty() {
        0
    } else {
        comas_workflow::dataset::load_records(&spec.data.train, &spec.data.columns())
            .with_context(|| format!("data.train {}", spec.data.train.display()))?
            .len()
    };
    spec.check(n).with_context(|| label.to_string())
}

/// The agent's model, adapter and resolved settings from a job file, exactly as the
/// coordinator resolves them (so the coordinator's check of the learner's settings passes).
fn from_job(path: &std::path::Path, agent: u32) -> Result<FromJob> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading job file {}", path.display()))?;
    let job = checked_job(
        &text,
        path.parent().unwrap_or(std::path::Path::new(".")),
        &path.display().to_string(),
    )?;
    let Some(a) = job.spec.agents.get(agent as usize) else {
        bail!("--agent-id {agent}: the job lists only {} agents", job.spec.agents.len());
    };
    Ok(FromJob {
        model: a.model.clone(),
        adapter: a.adapter.clone(),
        init_from: a.init_from.clone(),
        config: job.train[agent as usize].clone(),
        name: job.spec.name.clone(),
    })
}

/// One agent's part of a job file.
struct FromJob {
    model: PathBuf,
    adapter: Option<PathBuf>,
    init_from: Option<PathBuf>,
    config: TrainConfig,
    name: String,
}

fn serve(a: ServeArgs) -> Result<()> {
    let mut agents = Vec::new();
    let many = a.agent_id.len() > 1;
    for &k in &a.agent_id {
        let (model, adapter, init_from, config, checkpoint_dir) =
            match (&a.job, &a.model, &a.config) {
                (Some(job), _, _) => {
                    let j = from_job(job, k)?;
                    // One folder per agent when there are several, and one per job, so a new job
                    // never resumes from another job's checkpoint.
                    let dir = a.checkpoint_dir.as_ref().map(|d| {
                        if many {
                            d.join(format!("agent-{k}"))
                        } else {
                            d.clone()
                        }
                    });
                    (
                        j.model,
                        j.adapter.or(a.adapter.clone()),
                        j.init_from,
                        j.config,
                        dir.map(|d| d.join(crate::checkpoint::job_folder(&j.name))),
                    )
                }
                (None, Some(_), Some(_)) if many => {
                    bail!("one --model and --config train one agent; give --job to train several")
                }
                (None, Some(model), Some(config)) => (
                    model.clone(),
                    a.adapter.clone(),
                    None,
                    TrainConfig::from_file(config)?,
                    a.checkpoint_dir.clone(),
                ),
                _ => bail!("give --job (with --agent-id), or both --model and --config"),
            };
        agents.push((
            k,
            engine::EngineSettings {
                model_dir: model,
                adapter_dir: adapter,
                reference_dir: a.reference_model.clone(),
                config,
                checkpoint_dir,
                keep_checkpoints: a.keep_checkpoints,
                resume: a.resume,
                init_from,
                memory_bytes: a.memory_bytes,
            },
        ));
    }
    let allowed_roots = comas_service::AllowedRoots::parse(&a.allowed_roots)
        .map_err(|e| anyhow::anyhow!("--allowed-roots: {e}"))?;
    let tls = a.tls.service()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let listener = a.listen.bind().await?;
        let settings = server::ServerSettings {
            agents,
            listener,
            metrics_listen: a.metrics_listen,
            allowed_roots,
            tls,
            health_listen: a.health_listen,
        };
        server::serve(settings, comas_service::shutdown_signal()).await?;
        Ok(())
    })
}

pub fn run(args: Args) -> Result<()> {
    match args.command {
        Command::Serve(a) => serve(a),
        Command::Step { model, batch, config, out, adapter, merge_lora, reference_model } => {
            let cfg = TrainConfig::from_file(&config)?;
            let batch = experience::read_jsonl(&batch)?;
            let mut trainer = Trainer::with_reference(
                &model,
                cfg,
                adapter.as_deref(),
                reference_model.as_deref(),
            )
            .with_context(|| format!("loading {}", model.display()))?;
            let report = trainer.train_step(&batch)?;
            trainer.export(&out, merge_lora)?;
            let text = serde_json::to_string_pretty(&report)?;
            comas_model::safetensors::write_atomic(&out.join("report.json"), |w| {
                std::io::Write::write_all(w, text.as_bytes())
            })?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
    }
}
