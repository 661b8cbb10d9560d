//! The `comas` command line.
mod generate_cmd;
mod model_args;
mod score_cmd;
mod tiny_cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "comas", version, about = "Train teams of LLM agents with interaction rewards")]
struct Cli {
    /// Intra-op threads for libtorch on the CPU (default: libtorch's choice).
    #[arg(long, global = true, env = "COMAS_THREADS")]
    threads: Option<i32>,
    /// Log format on stderr.
    #[arg(long, global = true, env = "COMAS_LOG_FORMAT", default_value = "pretty", value_parser = ["pretty", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a completion from a model folder.
    Generate(generate_cmd::Args),
    /// Per-token log-probabilities of given completions (JSONL in, JSONL out).
    Score(score_cmd::Args),
    /// Write a small random model in the Hugging Face layout (for demos, tests, benchmarks).
    TinyModel(tiny_cmd::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    comas_service::init_logging(cli.log_format == "json");
    if let Some(n) = cli.threads {
        tch::set_num_threads(n);
    }
    let result = match cli.command {
        Command::Generate(a) => generate_cmd::run(a),
        Command::Score(a) => score_cmd::run(a),
        Command::TinyModel(a) => tiny_cmd::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
