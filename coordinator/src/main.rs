//! `comas-coordinator`: serves the Coordinator gRPC API.
use clap::Parser;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "comas-coordinator",
    version,
    about = "Runs comas training jobs over rollout workers and learners"
)]
struct Cli {
    #[command(flatten)]
    args: comas_coordinator::cli::Args,
}

fn main() -> ExitCode {
    comas_service::init_logging(std::env::var("COMAS_LOG_FORMAT").is_ok_and(|v| v == "json"));
    match comas_coordinator::cli::run(Cli::parse().args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
