//! Training throughput (tokens/s) of one learner step on a ~40M-parameter model (or any model
//! folder), side by side with the PyTorch reference (learner/benches/torch_step.py) doing the
//! same step: full fine-tuning, or LoRA on q/v with PEFT as the reference.
//!
//!   cargo bench -p comas-learner --bench train_step
//!
//! The reference runs with COMAS_REF_PYTHON (default `.venv-ref/bin/python`, made by
//! tests/fixtures/setup-ref.sh); without it only the comas figure is printed.
//! Knobs: COMAS_BENCH_THREADS (2), COMAS_BENCH_SAMPLES (16), COMAS_BENCH_PROMPT_LEN (128),
//! COMAS_BENCH_COMPLETION_LEN (128), COMAS_BENCH_REPEATS (2), COMAS_BENCH_MODEL (a model folder,
//! e.g. the SmolLM2 import), COMAS_BENCH_LORA (rank r; 0 = full fine-tuning), COMAS_BENCH_SAMPLER=1
//! (the samples carry sampler log-probs and comas uses them as ℓ^old instead of a recompute
//! forward, as it does on CPU when rollout and training dtypes match; the reference recomputes),
//! COMAS_BENCH_CHECKPOINT=1 (comas also with activation checkpointing, side by side),
//! COMAS_BENCH_DTYPE (float32; bfloat16 trains bf16 weights with f32 master copies, on both sides),
//! COMAS_BENCH_MICRO (samples per micro-batch, 4), COMAS_BENCH_PROMPT_MIN (prompts drawn uniformly between this and COMAS_BENCH_PROMPT_LEN tokens,
//! as CoMAS turns vary; comas then also runs with `group_by_length = false`, side by side).
// Measured as the services run: jemalloc, MKL dispatching on the instruction set.
comas_model::process_setup!();

use comas_learner::{experience::Experience, Finish, TrainConfig, Trainer};
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::time::Instant;

// The model crate's bench knobs and bench model, shared rather than written again.
#[path = "../../model/benches/common/mod.rs"]
mod common;
use common::env_or;

fn main() {
    let threads: i32 = env_or("COMAS_BENCH_THREADS", 2);
    let samples: usize = env_or("COMAS_BENCH_SAMPLES", 16);
    let prompt_len: usize = env_or("COMAS_BENCH_PROMPT_LEN", 128);
    let completion_len: usize = env_or("COMAS_BENCH_COMPLETION_LEN", 128);
    let prompt_min: usize = env_or("COMAS_BENCH_PROMPT_MIN", prompt_len).clamp(1, prompt_len);
    let repeats: usize = env_or("COMAS_BENCH_REPEATS", 2);
    let micro: usize = env_or("COMAS_BENCH_MICRO", 4);
    tch::set_num_threads(threads);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-learner");
    let lora_r: i64 = env_or("COMAS_BENCH_LORA", 0);
    let sampler = std::env::var("COMAS_BENCH_SAMPLER").is_ok_and(|v| v == "1");
    let dtype = std::env::var("COMAS_BENCH_DTYPE").unwrap_or_else(|_| "float32".into());
    let model = common::model_dir();
    std::fs::create_dir_all(&work).unwrap();
    let vocab =
        comas_model::Config::from_file(&model.join("config.json")).unwrap().vocab_size.min(32000);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let batch: Vec<Experience> = (0..samples)
        .map(|i| Experience {
            prompt_ids: (0..rng.gen_range(prompt_min..=prompt_len))
                .map(|_| rng.gen_range(0..vocab))
                .collect(),
            completion_ids: (0..completion_len).map(|_| rng.gen_range(0..vocab)).collect(),
            reward: Some((i % 3) as f64 / 2.0),
            token_rewards: None,
            finish_reason: Finish::Stop,
            group: format!("g{}", i / 4),
            // Any finite values do for timing: they only enter the loss.
            sampling_logprobs: sampler.then(|| vec![-2.0; completion_len]),
            episode_id: None,
            turn_id: None,
            policy_version: None,
            constrained: Vec::new(),
            temperature: None,
            norm_group: String::new(),
        })
        .collect();
    let batch_file = work.join("batch.jsonl");
    let lines: Vec<String> = batch.iter().map(|e| serde_json::to_string(e).unwrap()).collect();
    std::fs::write(&batch_file, lines.join("\n") + "\n").unwrap();
    // CoMAS settings: REINFORCE++, no KL; one optimizer step.
    let base = format!("estimator = \"reinforce\"\nlr = 1e-6\ntotal_steps = 100\ntrain_batch_size = {samples}\nmicro_batch_size = {micro}\n");
    // The reference reads only the shared keys; LoRA and ℓ^old are its command-line choices.
    let mut toml = format!("{base}dtype = \"{dtype}\"\n");
    if sampler {
        toml.push_str("old_logprobs = \"sampler\"\n");
    }
    if lora_r > 0 {
        toml.push_str(&format!(
            "[lora]\nr = {lora_r}\nalpha = {}.0\ntarget_modules = [\"q_proj\", \"v_proj\"]\n",
            2 * lora_r
        ));
    }
    let cfg_file = work.join("config.toml");
    std::fs::write(&cfg_file, &base).unwrap();
    let cfg = TrainConfig::from_toml(&toml).unwrap();
    let tokens: usize = batch.iter().map(Experience::len).sum();
    println!(
        "learner step benchmark: {} ({:.1}M parameters), {}, {dtype} CPU, {threads} threads, {samples} samples x ({} prompt + {completion_len} completion) tokens, old log-probs {}, best of {repeats}",
        model.display(),
        comas_model::Config::from_file(&model.join("config.json")).unwrap().num_parameters() as f64 / 1e6,
        if lora_r > 0 { format!("LoRA r={lora_r} on q/v") } else { "full fine-tuning".to_string() },
        if prompt_min < prompt_len { format!("{prompt_min}..={prompt_len}") } else { prompt_len.to_string() },
        if sampler { "from the sampler (comas), recomputed (reference)" } else { "recomputed" }
    );
    // Best of `repeats` timed steps (after one warm-up), each from the initial weights as the
    // reference does.
    let best_of = |cfg: &TrainConfig| {
        let mut best = f64::INFINITY;
        for r in 0..=repeats {
            let mut t = Trainer::new(&model, cfg.clone(), None).unwrap();
            let t0 = Instant::now();
            t.train_step(&batch).unwrap();
            if r > 0 {
                best = best.min(t0.elapsed().as_secs_f64());
            }
        }
        best
    };
    let best = best_of(&cfg);
    let ours = tokens as f64 / best;
    // COMAS_BENCH_CHECKPOINT=1 also times comas with activation checkpointing, side by side.
    let checkpointed = std::env::var("COMAS_BENCH_CHECKPOINT")
        .is_ok_and(|v| v == "1")
        .then(|| best_of(&TrainConfig { gradient_checkpointing: true, ..cfg.clone() }));
    // With varied lengths, the same step without grouping micro-batches by length.
    let ungrouped = (prompt_min < prompt_len)
        .then(|| best_of(&TrainConfig { group_by_length: false, ..cfg.clone() }));
    let python = std::env::var("COMAS_REF_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join(".venv-ref/bin/python"));
    let reference = python
        .is_file()
        .then(|| {
            let out = std::process::Command::new(&python)
                .arg(root.join("learner/benches/torch_step.py"))
                .args([
                    "--model",
                    model.to_str().unwrap(),
                    "--batch",
                    batch_file.to_str().unwrap(),
                    "--config",
                    cfg_file.to_str().unwrap(),
                ])
                .args([
                    "--threads",
                    &threads.to_string(),
                    "--repeats",
                    &repeats.to_string(),
                    "--lora-r",
                    &lora_r.to_string(),
                    "--dtype",
                    &dtype,
                ])
                .env("OMP_NUM_THREADS", threads.to_string())
                .output()
                .expect("run reference");
            if !out.status.success() {
                eprintln!("reference failed: {}", String::from_utf8_lossy(&out.stderr));
                return None;
            }
            let line =
                String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("").to_string();
            serde_json::from_str::<serde_json::Value>(&line)
                .ok()
                .and_then(|v| v["tokens_per_s"].as_f64())
        })
        .flatten();
    println!("{:>16} {:>12} {:>10}", "", "tokens/s", "s/step");
    println!("{:>16} {:>12.1} {:>10.2}", "comas", ours, best);
    if let Some(c) = checkpointed {
        println!("{:>16} {:>12.1} {:>10.2}", "comas checkpt", tokens as f64 / c, c);
        println!("checkpointing costs {:.2}x the plain step's time", c / best);
    }
    if let Some(u) = ungrouped {
        println!("{:>16} {:>12.1} {:>10.2}", "comas ungrouped", tokens as f64 / u, u);
        println!("grouping micro-batches by length: {:.2}x faster", u / best);
    }
    match reference {
        Some(hf) => {
            println!("{:>16} {:>12.1} {:>10.2}", "pytorch ref", hf, tokens as f64 / hf);
            println!("ratio comas / pytorch: {:.2}x", ours / hf);
        }
        None if python.is_file() => println!("(the PyTorch reference failed; its error is above)"),
        None => println!(
            "(PyTorch reference not run: {} not found; run tests/fixtures/setup-ref.sh)",
            python.display()
        ),
    }
}
