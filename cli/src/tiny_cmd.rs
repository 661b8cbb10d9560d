use anyhow::{bail, Result};
use comas_model::dtype::parse_kind;
use comas_model::tiny::{write_model, TinySpec};
use comas_model::Architecture;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Folder to write (created if missing; existing model files are replaced).
    #[arg(long)]
    out: PathBuf,
    /// qwen2, qwen3 or llama.
    #[arg(long, default_value = "qwen2")]
    arch: String,
    /// `tiny` (~0.2M parameters) or `bench` (~40M, 32k vocabulary).
    #[arg(long, default_value = "tiny")]
    preset: String,
    #[arg(long, default_value_t = 0)]
    seed: i64,
    #[arg(long, default_value = "float32")]
    dtype: String,
}

pub fn run(a: Args) -> Result<()> {
    let arch = match a.arch.as_str() {
        "qwen2" => Architecture::Qwen2,
        "qwen3" => Architecture::Qwen3,
        "llama" => Architecture::Llama,
        other => bail!("unknown --arch `{other}`; use qwen2, qwen3 or llama"),
    };
    let mut spec = match a.preset.as_str() {
        "tiny" => TinySpec::tiny(arch),
        "bench" => TinySpec { architecture: arch, ..TinySpec::bench() },
        other => bail!("unknown --preset `{other}`; use tiny or bench"),
    };
    spec.seed = a.seed;
    spec.dtype = parse_kind(&a.dtype)?;
    write_model(&a.out, &spec)?;
    let cfg = comas_model::Config::from_file(&a.out.join("config.json"))?;
    eprintln!(
        "wrote {} ({:.1}M parameters, {})",
        a.out.display(),
        cfg.num_parameters() as f64 / 1e6,
        a.arch
    );
    Ok(())
}
