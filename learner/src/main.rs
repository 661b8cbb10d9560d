//! `comas-learner`: the learner process of one agent.
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use comas_learner::{engine, experience, server, TrainConfig, Trainer};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "comas-learner", version, about = "Per-agent REINFORCE++ learner")]
struct Cli {
    #[arg(long, global = true, env = "COMAS_THREADS")]
    threads: Option<i32>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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

#[derive(clap::Args)]
struct ServeArgs {
    /// The agent's base model folder (Hugging Face layout).
    #[arg(long, env = "COMAS_LEARNER_MODEL")]
    model: PathBuf,
    /// Training config (TOML).
    #[arg(long, env = "COMAS_LEARNER_CONFIG")]
    config: PathBuf,
    #[arg(long, env = "COMAS_LEARNER_AGENT_ID", default_value_t = 0)]
    agent_id: u32,
    #[arg(long, env = "COMAS_LEARNER_LISTEN", default_value = "127.0.0.1:50061")]
    listen: std::net::SocketAddr,
    /// HTTP address for /metrics and /healthz (off when not given).
    #[arg(long, env = "COMAS_LEARNER_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    #[arg(long, env = "COMAS_LEARNER_CHECKPOINT_DIR")]
    checkpoint_dir: Option<PathBuf>,
    #[arg(long, env = "COMAS_LEARNER_KEEP_CHECKPOINTS", default_value_t = 3)]
    keep_checkpoints: usize,
    /// Continue from the newest complete checkpoint under --checkpoint-dir, if there is one.
    #[arg(long, env = "COMAS_LEARNER_RESUME")]
    resume: bool,
    /// Frozen KL reference (default: --model).
    #[arg(long, env = "COMAS_LEARNER_REFERENCE_MODEL")]
    reference_model: Option<PathBuf>,
    /// LoRA adapter to continue training.
    #[arg(long, env = "COMAS_LEARNER_ADAPTER")]
    adapter: Option<PathBuf>,
}

fn serve(a: ServeArgs) -> Result<()> {
    let config = TrainConfig::from_file(&a.config)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("binding {}", a.listen))?;
        let settings = server::ServerSettings {
            agent_id: a.agent_id,
            listener,
            metrics_listen: a.metrics_listen,
            engine: engine::EngineSettings {
                model_dir: a.model,
                adapter_dir: a.adapter,
                reference_dir: a.reference_model,
                config,
                checkpoint_dir: a.checkpoint_dir,
                keep_checkpoints: a.keep_checkpoints,
                resume: a.resume,
            },
        };
        server::serve(settings, comas_service::shutdown_signal()).await?;
        Ok(())
    })
}

fn run(cli: Cli) -> Result<()> {
    if let Some(n) = cli.threads {
        tch::set_num_threads(n);
    }
    match cli.command {
        Command::Serve(a) => serve(a),
        Command::Step { model, batch, config, out, adapter, merge_lora, reference_model } => {
            let cfg = TrainConfig::from_file(&config)?;
            let batch = experience::read_jsonl(&batch)?;
            let mut trainer = Trainer::with_reference(&model, cfg, adapter.as_deref(), reference_model.as_deref())
                .with_context(|| format!("loading {}", model.display()))?;
            let report = trainer.train_step(&batch)?;
            trainer.export(&out, merge_lora)?;
            let text = serde_json::to_string_pretty(&report)?;
            comas_model::safetensors::write_atomic(&out.join("report.json"), |w| std::io::Write::write_all(w, text.as_bytes()))?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    comas_service::init_logging(false);
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
