//! The `comas` command line.
mod bench_cmd;
mod client_cmd;
mod compare;
mod convert_cmd;
mod eval;
mod examples;
mod generate_cmd;
mod grade_cmd;
mod grow_cmd;
mod import_cmd;
mod local_cmd;
mod model_args;
mod out_path;
mod plot;
mod score_cmd;
mod serve_cmd;
mod tiny_cmd;
mod token_cmd;

comas_model::process_setup!();

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
    /// Run a job with every service on this machine (no job file: a built-in example).
    Local(local_cmd::Args),
    /// Submit a job file to a coordinator.
    Submit(client_cmd::SubmitArgs),
    /// Follow a job's progress until it ends.
    Watch(client_cmd::WatchArgs),
    /// List a coordinator's jobs.
    List(client_cmd::ListArgs),
    /// Cancel a job.
    Cancel(client_cmd::CancelArgs),
    /// Queue a failed or cancelled job again, from its last completed step.
    Resume(client_cmd::CancelArgs),
    /// Draw curves of every metric group (rewards, training, lengths, judging, accuracy, stage times) from a job's metrics log.
    Plot(plot::Args),
    /// Compare runs (an experiment's arms) in one Markdown table, from their metrics logs.
    Compare(compare::Args),
    /// Serve the coordinator (job API, scheduling, rewards, routing).
    Coordinator(comas_coordinator::cli::Args),
    /// Serve a rollout worker.
    Worker(comas_rollout_worker::cli::Args),
    /// Serve the learner of one agent, or run one offline training step.
    Learner(comas_learner::cli::Args),
    /// Generate a completion from a model folder.
    Generate(generate_cmd::Args),
    /// Serve a model folder behind OpenAI-compatible chat and text completion endpoints.
    Serve(serve_cmd::Args),
    /// Evaluate a model or a team on a benchmark under the inference setups of the paper.
    Eval(eval::Args),
    /// Convert a benchmark's published rows (GSM8K, MATH-500, MBPP, GPQA, MMLU, SciBench; JSON, JSONL or parquet) into benchmark records for `comas eval`.
    ConvertBench(convert_cmd::Args),
    /// Grade a file of responses (HumanEval in the sandbox, math, choice, numeric) without a model.
    Grade(grade_cmd::Args),
    /// Per-token log-probabilities of given completions (JSONL in, JSONL out).
    Score(score_cmd::Args),
    /// Convert a GGUF file (llama.cpp's format) into a Hugging Face model folder.
    ImportGguf(import_cmd::Args),
    /// Write a small random model in the Hugging Face layout (for demos, tests, benchmarks).
    TinyModel(tiny_cmd::Args),
    /// Make API tokens for a coordinator's --tokens file.
    Token(token_cmd::Args),
    /// Grow a trained NeuroMAS graph: a new job whose old nodes keep their adapters and optimizer state.
    Grow(grow_cmd::Args),
    /// Time decoding or a learner step on any device (JSON lines, the fields the PyTorch
    /// references print).
    Bench(bench_cmd::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    comas_service::init_logging(cli.log_format == "json");
    if let Some(n) = cli.threads {
        if n < 1 {
            eprintln!("error: --threads (COMAS_THREADS) must be at least 1, got {n}");
            return ExitCode::FAILURE;
        }
        tch::set_num_threads(n);
    }
    let result = match cli.command {
        Command::Local(a) => local_cmd::run(a),
        Command::Submit(a) => client_cmd::submit(a),
        Command::Watch(a) => client_cmd::watch_cmd(a),
        Command::List(a) => client_cmd::list(a),
        Command::Cancel(a) => client_cmd::cancel(a),
        Command::Resume(a) => client_cmd::resume(a),
        Command::Plot(a) => plot::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Coordinator(a) => comas_coordinator::cli::run(a),
        Command::Worker(a) => comas_rollout_worker::cli::run(a),
        Command::Learner(a) => comas_learner::cli::run(a),
        Command::Generate(a) => generate_cmd::run(a),
        Command::Serve(a) => serve_cmd::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Grade(a) => grade_cmd::run(a),
        Command::ConvertBench(a) => convert_cmd::run(a),
        Command::Score(a) => score_cmd::run(a),
        Command::TinyModel(a) => tiny_cmd::run(a),
        Command::ImportGguf(a) => import_cmd::run(a),
        Command::Token(a) => token_cmd::run(a),
        Command::Grow(a) => grow_cmd::run(a),
        Command::Bench(a) => bench_cmd::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
