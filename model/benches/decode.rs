//! Decode throughput (tokens/s) at batch 1, 8 and 32 on a ~40M-parameter Qwen2-shaped model (or
//! any model folder), side by side with `transformers`' `generate` on the same checkpoint,
//! greedy, same threads. It also measures this machine's copy bandwidth and prints the batch-1
//! bound it implies (every weight byte is read once per token) and the fraction reached.
//!
//!   cargo bench -p comas-model --bench decode
//!
//! The reference runs with the Python at COMAS_REF_PYTHON (default `.venv-ref/bin/python`, made
//! by tests/fixtures/setup-ref.sh). Without it only the comas figures are printed.
//! Knobs: COMAS_BENCH_THREADS (2), COMAS_BENCH_NEW_TOKENS (64), COMAS_BENCH_PROMPT_LEN (32),
//! COMAS_BENCH_REPEATS (3), COMAS_BENCH_DTYPE (float32 or bfloat16, on both sides),
//! COMAS_BENCH_BATCHES (1,8,32).
// Measured as the services run: jemalloc, MKL dispatching on the instruction set.
comas_model::process_setup!();

mod common;
use common::env_or;

use comas_model::{generate, CausalLm, GenerationRequest, SamplingParams};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tch::{Device, Kind};

fn main() {
    let threads: i32 = env_or("COMAS_BENCH_THREADS", 2);
    let new_tokens: usize = env_or("COMAS_BENCH_NEW_TOKENS", 64);
    let prompt_len: usize = env_or("COMAS_BENCH_PROMPT_LEN", 32);
    let repeats: usize = env_or("COMAS_BENCH_REPEATS", 3);
    let batches: Vec<usize> = std::env::var("COMAS_BENCH_BATCHES")
        .unwrap_or_else(|_| "1,8,32".into())
        .split(',')
        .map(|b| {
            b.trim()
                .parse()
                .expect("COMAS_BENCH_BATCHES: batch sizes separated by commas, each 1..=32")
        })
        .collect();
    assert!(
        batches.iter().all(|b| (1..=32).contains(b)),
        "COMAS_BENCH_BATCHES: each batch size must be 1..=32"
    );
    tch::set_num_threads(threads);

    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let model_dir = common::model_dir();
    // COMAS_BENCH_SAMPLE=1 samples at temperature 1 (the rollout path) instead of greedy.
    let sample = std::env::var("COMAS_BENCH_SAMPLE").is_ok_and(|v| v == "1");
    let params_for = |n: usize, seed: u64| {
        if sample {
            SamplingParams { max_new_tokens: n, seed, ..Default::default() }
        } else {
            SamplingParams::greedy(n)
        }
    };
    let dtype = std::env::var("COMAS_BENCH_DTYPE").unwrap_or_else(|_| "float32".into());
    let kind = comas_model::dtype::parse_kind(&dtype).expect("COMAS_BENCH_DTYPE");
    let model = CausalLm::load(&model_dir, kind, Device::Cpu).expect("load bench model");
    // Off with COMAS_DECODE_LINEAR=aten, for comparing the two.
    println!("decode linears: {:?}", model.pack_for_decode());
    let params = model.config().num_parameters();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let prompts: Vec<Vec<i64>> =
        (0..32).map(|_| (0..prompt_len).map(|_| rng.gen_range(0..400i64)).collect()).collect();
    let prompts_file =
        std::env::temp_dir().join(format!("comas-bench-prompts-{}.json", std::process::id()));
    std::fs::write(&prompts_file, serde_json::to_string(&prompts).unwrap()).unwrap();

    println!(
        "decode benchmark: {} ({:.1}M parameters), {dtype} CPU, {threads} threads, prompt {prompt_len}, {new_tokens} new tokens, {}, best of {repeats}",
        model_dir.display(),
        params as f64 / 1e6,
        if sample { "sampled at temperature 1" } else { "greedy" }
    );
    let (copy_bw, read_bw) = memory_bandwidth();
    let weight_bytes = weight_bytes_per_token(&model);
    let bound = read_bw / weight_bytes;
    let mut ours = HashMap::new();
    for &b in &batches {
        let reqs: Vec<GenerationRequest> = prompts[..b]
            .iter()
            .enumerate()
            .map(|(i, p)| GenerationRequest {
                prompt_ids: p.clone(),
                params: params_for(new_tokens, i as u64),
                adapter: None,
            })
            .collect();
        let warm: Vec<GenerationRequest> = prompts[..b]
            .iter()
            .map(|p| GenerationRequest {
                prompt_ids: p.clone(),
                params: params_for(4, 0),
                adapter: None,
            })
            .collect();
        generate(&model, &warm, None).unwrap();
        let best_of = |reqs: &[GenerationRequest], n: usize| {
            let mut best = f64::INFINITY;
            for _ in 0..repeats {
                let t0 = Instant::now();
                let out = generate(&model, reqs, None).unwrap();
                best = best.min(t0.elapsed().as_secs_f64());
                assert!(out.iter().all(|c| c.token_ids.len() == n));
            }
            best
        };
        let seconds = best_of(&reqs, new_tokens);
        // One new token is the prefill alone (its logits give the first token).
        let first: Vec<GenerationRequest> = reqs
            .iter()
            .map(|r| GenerationRequest {
                params: params_for(1, 0),
                prompt_ids: r.prompt_ids.clone(),
                adapter: None,
            })
            .collect();
        ours.insert(b, Timing { batch: b, seconds, prefill_seconds: best_of(&first, 1) });
    }

    let python = std::env::var("COMAS_REF_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join(".venv-ref/bin/python"));
    let reference = run_reference(
        &python,
        &root,
        &model_dir,
        &prompts_file,
        &batches,
        new_tokens,
        threads,
        repeats,
        &dtype,
    );
    // Whole generate calls (prefill included), then the decode steps alone: the difference
    // between the full call and a call for one token, per generated token after the first.
    println!(
        "{:>6} {:>14} {:>18} {:>8} | {:>16} {:>16} {:>8} | {:>10} {:>10}",
        "batch",
        "comas tok/s",
        "transformers tok/s",
        "ratio",
        "comas decode t/s",
        "trf decode t/s",
        "ratio",
        "comas pf s",
        "trf pf s"
    );
    let na = "n/a".to_string();
    for &b in &batches {
        let o = &ours[&b];
        let (ot, od) = (o.tokens_per_s(new_tokens), o.decode_tokens_per_s(new_tokens));
        let hf = reference.as_ref().and_then(|r| r.get(&b));
        let show = |f: &dyn Fn(&Timing) -> f64, width: usize| {
            hf.map_or(na.clone(), |h| format!("{:>width$.1}", f(h)))
        };
        let ratio =
            |f: &dyn Fn(&Timing) -> f64| hf.map_or(na.clone(), |h| format!("{:.2}x", f(o) / f(h)));
        println!(
            "{b:>6} {ot:>14.1} {:>18} {:>8} | {od:>16.1} {:>16} {:>8} | {:>10.2} {:>10}",
            show(&|t| t.tokens_per_s(new_tokens), 18),
            ratio(&|t| t.tokens_per_s(new_tokens)),
            show(&|t| t.decode_tokens_per_s(new_tokens), 16),
            ratio(&|t| t.decode_tokens_per_s(new_tokens)),
            o.prefill_seconds,
            hf.map_or(na.clone(), |h| format!("{:.2}", h.prefill_seconds)),
        );
    }
    // The bound is a decode step's: the prefill reads the weights once for the whole prompt.
    let reached = ours.get(&1).map_or("batch 1 not run".to_string(), |o| {
        format!(
            "reached {:.0}% by the whole call, {:.0}% by the decode steps",
            100.0 * o.tokens_per_s(new_tokens) / bound,
            100.0 * o.decode_tokens_per_s(new_tokens) / bound
        )
    });
    println!(
        "memory bandwidth ({threads} threads): copy {:.1} GB/s (read + written), read {:.1} GB/s; {:.0} MB of weights read per token: batch-1 bound {bound:.1} tok/s, {reached}",
        copy_bw / 1e9,
        read_bw / 1e9,
        weight_bytes / 1e6,
    );
    if reference.is_none() {
        println!(
            "(transformers reference not run: {} not found; run tests/fixtures/setup-ref.sh)",
            python.display()
        );
    }
}

/// One batch size's best times, for comas or the reference: a whole generate call and a call
/// that makes only the first token (the prefill).
#[derive(serde::Deserialize)]
struct Timing {
    batch: usize,
    seconds: f64,
    prefill_seconds: f64,
}

impl Timing {
    fn tokens_per_s(&self, new_tokens: usize) -> f64 {
        (self.batch * new_tokens) as f64 / self.seconds
    }

    fn decode_tokens_per_s(&self, new_tokens: usize) -> f64 {
        (self.batch * (new_tokens - 1)) as f64 / (self.seconds - self.prefill_seconds)
    }
}

/// Bytes per second of a large tensor copy (read plus written, as STREAM counts it) and of a
/// large read (a sum), best of 5 each. Decoding reads weights, so the read figure sets the bound.
fn memory_bandwidth() -> (f64, f64) {
    let n: i64 = 64 << 20; // 256 MB of f32 per side: far beyond any cache
    let src = tch::Tensor::ones([n], (Kind::Float, Device::Cpu));
    let mut dst = tch::Tensor::zeros([n], (Kind::Float, Device::Cpu));
    let best = |f: &mut dyn FnMut()| {
        (0..5)
            .map(|_| {
                let t0 = Instant::now();
                f();
                t0.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let copy = best(&mut || {
        dst.copy_(&src);
    });
    let read = best(&mut || {
        let _ = src.sum(Kind::Float).double_value(&[]);
    });
    let bytes = (n * 4) as f64;
    (2.0 * bytes / copy, bytes / read)
}

/// Weight bytes a batch-1 decode step reads: every parameter, except that an untied input
/// embedding contributes only the one row it looks up.
fn weight_bytes_per_token(model: &CausalLm) -> f64 {
    let elt = model.kind().elt_size_in_bytes() as f64;
    let cfg = model.config();
    let mut params = cfg.num_parameters() as f64;
    if !cfg.tie_word_embeddings {
        params -= ((cfg.vocab_size - 1) * cfg.hidden_size) as f64;
    }
    params * elt
}

#[allow(clippy::too_many_arguments)]
fn run_reference(
    python: &Path,
    root: &Path,
    model: &Path,
    prompts: &Path,
    batches: &[usize],
    new_tokens: usize,
    threads: i32,
    repeats: usize,
    dtype: &str,
) -> Option<HashMap<usize, Timing>> {
    if !python.is_file() {
        return None;
    }
    let script = root.join("model/benches/hf_decode.py");
    let batches = batches.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
    let out = std::process::Command::new(python)
        .arg(script)
        .args(["--model", model.to_str()?, "--prompts", prompts.to_str()?, "--batches", &batches])
        .args([
            "--new-tokens",
            &new_tokens.to_string(),
            "--threads",
            &threads.to_string(),
            "--repeats",
            &repeats.to_string(),
            "--dtype",
            dtype,
        ])
        .env("OMP_NUM_THREADS", threads.to_string())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("reference failed: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    let mut res = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Ok(t) = serde_json::from_str::<Timing>(line) {
            res.insert(t.batch, t);
        }
    }
    Some(res)
}
