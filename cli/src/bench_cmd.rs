//! `comas bench`: timings of the two hot loops on any device, as JSON lines, so that one carried
//! binary measures a GPU machine (scripts/gpu-check.sh) against the PyTorch references beside it
//! (model/benches/hf_decode.py, learner/benches/torch_step.py print the same fields).
use crate::model_args::ModelArgs;
use anyhow::{bail, Context, Result};
use comas_learner::{experience, TrainConfig, Trainer};
use comas_model::{generate, CausalLm, GenerationRequest, SamplingParams};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Greedy decode throughput at several batch sizes, no stopping (one JSON line per batch).
    Decode(DecodeArgs),
    /// One learner step on a batch file, timed from the initial weights each time (one JSON
    /// line); the weights after the first timed step are written to --out.
    TrainStep(TrainStepArgs),
}

#[derive(clap::Args)]
struct DecodeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// JSON file: a list of prompts, each a list of token ids, at least as many as the largest
    /// batch (the reference reads the same file).
    #[arg(long)]
    prompts: PathBuf,
    /// Batch sizes, separated by commas.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    batches: Vec<usize>,
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    /// Timed calls per batch size after one warm-up call; the best is reported.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
}

#[derive(clap::Args)]
struct TrainStepArgs {
    #[arg(long)]
    model: PathBuf,
    /// Experiences (JSONL), as `comas learner step` reads them.
    #[arg(long)]
    batch: PathBuf,
    /// Training config (TOML); its `device` and `dtype` say where and how to train.
    #[arg(long)]
    config: PathBuf,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Where the weights after the first timed step go (the model folder as `comas learner
    /// step` writes it).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One batch size's best times: a whole generate call and a call that makes one token (the
/// prefill alone), the fields hf_decode.py prints.
#[derive(Serialize)]
struct DecodeTiming {
    batch: usize,
    new_tokens: usize,
    seconds: f64,
    tokens_per_s: f64,
    prefill_seconds: f64,
}

#[derive(Serialize)]
struct StepTiming {
    tokens: usize,
    seconds: f64,
    tokens_per_s: f64,
}

pub fn run(a: Args) -> Result<()> {
    match a.what {
        What::Decode(a) => decode(a),
        What::TrainStep(a) => train_step(a),
    }
}

fn decode(a: DecodeArgs) -> Result<()> {
    let (config, kind, device) = a.model.resolve()?;
    let prompts: Vec<Vec<i64>> = serde_json::from_slice(
        &std::fs::read(&a.prompts).with_context(|| format!("reading {}", a.prompts.display()))?,
    )
    .with_context(|| format!("{}: not a JSON list of token-id lists", a.prompts.display()))?;
    let largest = a.batches.iter().copied().max().unwrap_or(0);
    if largest == 0 || a.batches.contains(&0) {
        bail!("--batches: give batch sizes of at least 1");
    }
    if prompts.len() < largest {
        bail!(
            "{} holds {} prompts; --batches asks for {largest}",
            a.prompts.display(),
            prompts.len()
        );
    }
    if let Some(id) = prompts.iter().flatten().find(|&&t| t < 0 || t >= config.vocab_size) {
        bail!("prompt token {id} is outside the model's vocabulary (0..{})", config.vocab_size);
    }
    if a.new_tokens < 2 || a.repeats == 0 {
        bail!("--new-tokens must be at least 2 and --repeats at least 1");
    }
    let dir = &a.model.model;
    let model =
        CausalLm::load(dir, kind, device).with_context(|| format!("loading {}", dir.display()))?;
    model.pack_for_decode();
    for &b in &a.batches {
        let requests = |n: usize| -> Vec<GenerationRequest> {
            let params = SamplingParams::greedy(n);
            prompts[..b]
                .iter()
                .map(|p| GenerationRequest {
                    prompt_ids: p.clone(),
                    params: params.clone(),
                    adapter: None,
                })
                .collect()
        };
        let best_of = |n: usize| -> Result<f64> {
            let reqs = requests(n);
            generate(&model, &requests(4.min(n)), None)?;
            let mut best = f64::INFINITY;
            for _ in 0..a.repeats {
                let t0 = Instant::now();
                let out = generate(&model, &reqs, None)?;
                best = best.min(t0.elapsed().as_secs_f64());
                if let Some(c) = out.iter().find(|c| c.token_ids.len() != n) {
                    bail!("a greedy call stopped after {} of {n} tokens", c.token_ids.len());
                }
            }
            Ok(best)
        };
        let seconds = best_of(a.new_tokens)?;
        let prefill_seconds = best_of(1)?;
        let t = DecodeTiming {
            batch: b,
            new_tokens: b * a.new_tokens,
            seconds,
            tokens_per_s: (b * a.new_tokens) as f64 / seconds,
            prefill_seconds,
        };
        println!("{}", serde_json::to_string(&t)?);
    }
    Ok(())
}

fn train_step(a: TrainStepArgs) -> Result<()> {
    let cfg = TrainConfig::from_file(&a.config)?;
    let batch = experience::read_jsonl(&a.batch)?;
    if batch.is_empty() {
        bail!("{} holds no experiences", a.batch.display());
    }
    let tokens: usize = batch.iter().map(experience::Experience::len).sum();
    let load = || {
        Trainer::new(&a.model, cfg.clone(), None)
            .with_context(|| format!("loading {}", a.model.display()))
    };
    // One untimed warm-up step, then each timed step from the initial weights, as the
    // reference does.
    load()?.train_step(&batch)?;
    let mut best = f64::INFINITY;
    for r in 0..a.repeats.max(1) {
        let mut trainer = load()?;
        let t0 = Instant::now();
        trainer.train_step(&batch)?;
        best = best.min(t0.elapsed().as_secs_f64());
        if let (0, Some(out)) = (r, &a.out) {
            trainer.export(out, false)?;
        }
    }
    let t = StepTiming { tokens, seconds: best, tokens_per_s: tokens as f64 / best };
    println!("{}", serde_json::to_string(&t)?);
    Ok(())
}
