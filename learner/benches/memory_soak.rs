//! The learner's host memory over many steps in one process: does it hold still once warm?
//! Each step trains on a fresh batch whose lengths vary as a rollout's do (prompts drawn between
//! two lengths, completions between 1 token and the cap, a quarter of them cut at the cap), and
//! the resident set after the step is printed beside the process's peak. With `MALLOC_CONF` at
//! `dirty_decay_ms:0,muzzy_decay_ms:0` jemalloc hands freed pages back at once, so the resident
//! set is what is live: a leak shows as a climb that does not level off.
//!
//!   MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 COMAS_BENCH_MODEL=<model folder> \
//!     cargo bench -p comas-learner --bench memory_soak
//!
//! Knobs: COMAS_BENCH_STEPS (40), COMAS_BENCH_THREADS (2), COMAS_BENCH_SAMPLES (32, in groups
//! of 8), COMAS_BENCH_PROMPT_MIN/LEN (40/120), COMAS_BENCH_COMPLETION_LEN (192), COMAS_BENCH_MICRO
//! (8), COMAS_BENCH_LORA (16, on q/k/v/o; 0 = full fine-tuning), COMAS_BENCH_DTYPE (float32),
//! COMAS_BENCH_MODEL (default: the ~40M-parameter bench model).
// As the services run: jemalloc, MKL dispatching on the instruction set.
comas_model::process_setup!();

use comas_learner::{experience::Experience, Finish, TrainConfig, Trainer};
use rand::{Rng, SeedableRng};
use std::time::Instant;

// The model crate's bench knobs and bench model, shared rather than written again.
#[path = "../../model/benches/common/mod.rs"]
mod common;
use common::env_or;

/// The resident set now, from /proc/self/statm (its second field, in pages).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

fn main() {
    let steps: usize = env_or("COMAS_BENCH_STEPS", 40);
    let threads: i32 = env_or("COMAS_BENCH_THREADS", 2);
    let samples: usize = env_or("COMAS_BENCH_SAMPLES", 32);
    let prompt_len: usize = env_or("COMAS_BENCH_PROMPT_LEN", 120);
    let prompt_min: usize = env_or("COMAS_BENCH_PROMPT_MIN", 40).clamp(1, prompt_len);
    let completion_len: usize = env_or("COMAS_BENCH_COMPLETION_LEN", 192).max(1);
    let micro: usize = env_or("COMAS_BENCH_MICRO", 8);
    let lora_r: i64 = env_or("COMAS_BENCH_LORA", 16);
    let dtype = std::env::var("COMAS_BENCH_DTYPE").unwrap_or_else(|_| "float32".into());
    tch::set_num_threads(threads);
    let model = common::model_dir();
    let vocab =
        comas_model::Config::from_file(&model.join("config.json")).unwrap().vocab_size.min(32000);
    // The learning study's learner: GRPO's group-normalised advantages, ℓ^old from the sampler.
    let mut toml = format!(
        "estimator = \"group_norm\"\nlr = 5e-4\ntotal_steps = {steps}\ntrain_batch_size = \
         {samples}\nmicro_batch_size = {micro}\ndtype = \"{dtype}\"\nold_logprobs = \"sampler\"\n"
    );
    if lora_r > 0 {
        toml.push_str(&format!(
            "[lora]\nr = {lora_r}\nalpha = {}.0\ntarget_modules = [\"q_proj\", \"k_proj\", \
             \"v_proj\", \"o_proj\"]\n",
            2 * lora_r
        ));
    }
    let cfg = TrainConfig::from_toml(&toml).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let batch = |rng: &mut rand_chacha::ChaCha8Rng| -> Vec<Experience> {
        (0..samples)
            .map(|i| {
                let cut = rng.gen_bool(0.25);
                let len = if cut { completion_len } else { rng.gen_range(1..=completion_len) };
                Experience {
                    prompt_ids: (0..rng.gen_range(prompt_min..=prompt_len))
                        .map(|_| rng.gen_range(0..vocab))
                        .collect(),
                    completion_ids: (0..len).map(|_| rng.gen_range(0..vocab)).collect(),
                    reward: Some(f64::from(u8::from(rng.gen_bool(0.3)))),
                    token_rewards: None,
                    finish_reason: if cut { Finish::Length } else { Finish::Stop },
                    group: format!("g{}", i / 8),
                    sampling_logprobs: Some((0..len).map(|_| -rng.gen_range(0.1..4.0)).collect()),
                    episode_id: None,
                    turn_id: None,
                    policy_version: None,
                    constrained: Vec::new(),
                    temperature: Some(0.7),
                    norm_group: String::new(),
                }
            })
            .collect()
    };
    println!(
        "learner memory soak: {}, {}, {dtype}, {threads} threads, {steps} steps of {samples} \
         samples (prompts {prompt_min}..={prompt_len}, completions 1..={completion_len}), \
         MALLOC_CONF={}",
        model.display(),
        if lora_r > 0 { format!("LoRA r={lora_r} on q/k/v/o") } else { "full".to_string() },
        std::env::var("MALLOC_CONF").unwrap_or_default()
    );
    let mut trainer = Trainer::new(&model, cfg, None).unwrap();
    println!("loaded: rss {:.0} MiB", rss_bytes() as f64 / 1048576.0);
    println!(
        "{:>5} {:>7} {:>7} {:>9} {:>9} {:>7}",
        "step", "tokens", "max len", "rss MiB", "peak MiB", "s"
    );
    for step in 0..steps {
        let b = batch(&mut rng);
        let tokens: usize = b.iter().map(Experience::len).sum();
        let longest = b.iter().map(Experience::len).max().unwrap_or(0);
        let t0 = Instant::now();
        let report = trainer.train_step(&b).unwrap();
        println!(
            "{step:>5} {tokens:>7} {longest:>7} {:>9.0} {:>9.0} {:>7.2}",
            rss_bytes() as f64 / 1048576.0,
            report.peak_rss_bytes as f64 / 1048576.0,
            t0.elapsed().as_secs_f64()
        );
    }
}
