//! `comas token`: makes API tokens for a coordinator's `--tokens` file. The token goes to the
//! user; the file keeps only its SHA-256, so a leaked file lets no one in.
use anyhow::{bail, Context, Result};
use comas_service::auth::{hash_token, new_token, Scope};
use std::io::Read;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// A new random token: prints the token (give it to its user as COMAS_TOKEN or
    /// COMAS_WORKER_TOKEN), then the line to add to the token file.
    New {
        /// What it may do: read, submit, worker, admin (comma-separated).
        #[arg(long, default_value = "read")]
        scopes: String,
        /// Shown in the coordinator's refusals and logs.
        #[arg(long, default_value = "unnamed")]
        name: String,
    },
    /// The token-file line of an existing token, read from stdin.
    Hash {
        #[arg(long, default_value = "read")]
        scopes: String,
        #[arg(long, default_value = "unnamed")]
        name: String,
    },
}

fn line(token: &str, scopes: &str, name: &str) -> Result<String> {
    for s in scopes.split(',') {
        if Scope::parse(s).is_none() {
            bail!("unknown scope `{s}`: use read, submit, worker or admin");
        }
    }
    if name.is_empty() || name.chars().any(char::is_whitespace) {
        bail!("--name must be one word");
    }
    Ok(format!("{} {scopes} {name}", hash_token(token)))
}

pub fn run(a: Args) -> Result<()> {
    match a.command {
        Command::New { scopes, name } => {
            let token = new_token();
            let entry = line(&token, &scopes, &name)?;
            println!("{token}");
            println!("{entry}");
            eprintln!("line 1 is the token: hand it over, it is not stored anywhere; line 2 goes into the coordinator's --tokens file");
        }
        Command::Hash { scopes, name } => {
            let mut token = String::new();
            std::io::stdin()
                .read_to_string(&mut token)
                .context("reading the token from stdin (a token is one line of text)")?;
            if token.trim().is_empty() {
                bail!("no token on stdin");
            }
            // Tokens are one word; two lines would be hashed as one token that matches neither.
            if token.trim().contains(char::is_whitespace) {
                bail!("stdin holds more than one word: give one token (hash each on its own)");
            }
            println!("{}", line(&token, &scopes, &name)?);
        }
    }
    Ok(())
}
