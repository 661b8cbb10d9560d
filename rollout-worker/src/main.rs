//! `comas-rollout-worker`: serves the RolloutWorker gRPC API.
comas_model::process_setup!();

use clap::Parser;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "comas-rollout-worker",
    version,
    about = "Runs discussion episodes for comas jobs"
)]
struct Cli {
    #[arg(long, env = "COMAS_THREADS")]
    threads: Option<i32>,
    #[command(flatten)]
    args: comas_rollout_worker::cli::Args,
}

fn main() -> ExitCode {
    comas_service::init_logging(std::env::var("COMAS_LOG_FORMAT").is_ok_and(|v| v == "json"));
    let cli = Cli::parse();
    if let Some(n) = cli.threads {
        tch::set_num_threads(n);
    }
    match comas_rollout_worker::cli::run(cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
