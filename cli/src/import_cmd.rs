use anyhow::{anyhow, Result};
use comas_gguf::{ImportOptions, OutDtype};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file (llama, qwen2 or qwen3 architecture; a gpt2 BPE vocabulary).
    file: PathBuf,
    /// The Hugging Face model folder to write.
    #[arg(long)]
    out: PathBuf,
    /// Dtype of the written weights: f32, bf16 or f16 (quantised tensors are dequantised first).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Replace a non-empty output folder.
    #[arg(long)]
    force: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let dtype = OutDtype::parse(&a.dtype)
        .ok_or_else(|| anyhow!("--dtype `{}` is not one of f32, bf16, f16", a.dtype))?;
    let started = Instant::now();
    let report = comas_gguf::import(&a.file, &a.out, &ImportOptions { dtype, force: a.force })?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let types: Vec<String> =
            report.source_types.iter().map(|(t, n)| format!("{n} {t}")).collect();
        eprintln!(
            "imported {} ({}, {:.1}M parameters, {} tensors: {}; {} tokens, {} merges{}) into {} as {} in {:.1} s",
            a.file.display(),
            report.architecture,
            report.parameters as f64 / 1e6,
            report.tensors,
            types.join(", "),
            report.vocab_tokens,
            report.merges,
            if report.tie_word_embeddings { ", tied embeddings" } else { "" },
            report.out.display(),
            report.dtype,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
