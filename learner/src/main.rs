//! `comas-learner`: the learner process of one agent.
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use comas_learner::{experience, TrainConfig, Trainer};
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
    },
}

fn run(cli: Cli) -> Result<()> {
    if let Some(n) = cli.threads {
        tch::set_num_threads(n);
    }
    match cli.command {
        Command::Step { model, batch, config, out, adapter, merge_lora } => {
            let cfg = TrainConfig::from_file(&config)?;
            let batch = experience::read_jsonl(&batch)?;
            let mut trainer = Trainer::new(&model, cfg, adapter.as_deref()).with_context(|| format!("loading {}", model.display()))?;
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
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("COMAS_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
