//! Prompt sharing in the batcher, on against off, on GRPO-shaped batches: QUESTIONS
//! distinct prompts of PROMPT_LEN tokens, each asked GROUP times with its own seed, all admitted
//! at once (as `generate` does), sampled at temperature 1. Each round times the prefill alone
//! (one new token) and the whole call (NEW_TOKENS) with sharing on and off, alternating which
//! goes first; every round checks that both give the same tokens and prints the largest
//! log-probability difference.
//!
//!   cargo bench -p comas-model --bench shared_prompts
//!
//! Knobs: COMAS_BENCH_MODEL (a model folder, e.g. the SmolLM2 import; default the random 40M
//! model the decode bench writes), COMAS_BENCH_THREADS (2), COMAS_BENCH_PROMPT_LEN (64),
//! COMAS_BENCH_QUESTIONS (4), COMAS_BENCH_GROUP (8), COMAS_BENCH_NEW_TOKENS (64),
//! COMAS_BENCH_ROUNDS (2).
comas_model::process_setup!();

mod common;
use common::env_or;

use comas_model::batcher::drain;
use comas_model::{Batcher, CausalLm, Completion, SamplingParams};
use rand::{Rng, SeedableRng};
use std::time::Instant;
use tch::{Device, Kind};

/// One call over every prompt, all admitted at once; returns the seconds and the completions
/// in request order.
fn run(model: &CausalLm, prompts: &[Vec<i64>], new: usize, share: bool) -> (f64, Vec<Completion>) {
    let t0 = Instant::now();
    let mut b = Batcher::new(model, None);
    b.set_prompt_sharing(share);
    for (i, p) in prompts.iter().enumerate() {
        let params = SamplingParams { max_new_tokens: new, seed: i as u64, ..Default::default() };
        b.add(i as u64, p.clone(), params, None).expect("add");
    }
    let mut out: Vec<Option<Completion>> = vec![None; prompts.len()];
    for (id, c) in drain(&mut b).expect("generate") {
        out[id as usize] = Some(c);
    }
    (t0.elapsed().as_secs_f64(), out.into_iter().map(|c| c.expect("finished")).collect())
}

fn main() {
    let threads: i32 = env_or("COMAS_BENCH_THREADS", 2);
    let prompt_len: usize = env_or("COMAS_BENCH_PROMPT_LEN", 64);
    let questions: usize = env_or("COMAS_BENCH_QUESTIONS", 4);
    let group: usize = env_or("COMAS_BENCH_GROUP", 8);
    let new_tokens: usize = env_or("COMAS_BENCH_NEW_TOKENS", 64);
    let rounds: usize = env_or("COMAS_BENCH_ROUNDS", 2);
    tch::set_num_threads(threads);
    let model_dir = common::model_dir();
    let model = CausalLm::load(&model_dir, Kind::Float, Device::Cpu).expect("load bench model");
    let _ = model.pack_for_decode();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let distinct: Vec<Vec<i64>> = (0..questions)
        .map(|_| (0..prompt_len).map(|_| rng.gen_range(0..400i64)).collect())
        .collect();
    let prompts: Vec<Vec<i64>> =
        distinct.iter().flat_map(|p| std::iter::repeat_n(p.clone(), group)).collect();
    println!(
        "shared-prompt benchmark: {} f32 CPU, {threads} threads, {questions} prompts of {prompt_len} tokens x {group} samples, {new_tokens} new tokens, sampled",
        model_dir.display()
    );
    run(&model, &prompts, 4, true); // warm-up
    println!(
        "round | first | prefill s on | prefill s off | on/off | call s on | call s off | on/off"
    );
    for r in 1..=rounds {
        let order = if r % 2 == 1 { [true, false] } else { [false, true] };
        let (mut pf, mut call) = ([0.0; 2], [0.0; 2]);
        let mut outs: Vec<Vec<Completion>> = Vec::new();
        for share in order {
            let k = usize::from(!share);
            pf[k] = run(&model, &prompts, 1, share).0;
            let (s, out) = run(&model, &prompts, new_tokens, share);
            call[k] = s;
            outs.push(out);
        }
        let mut worst = 0f32;
        for (i, (a, b)) in outs[0].iter().zip(&outs[1]).enumerate() {
            worst =
                a.logprobs.iter().zip(&b.logprobs).fold(worst, |w, (x, y)| w.max((x - y).abs()));
            assert_eq!(a.token_ids, b.token_ids, "request {i}: sharing changed the tokens");
        }
        println!(
            "{r} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.3} | {worst:.1e}",
            if order[0] { "on" } else { "off" },
            pf[0],
            pf[1],
            pf[0] / pf[1],
            call[0],
            call[1],
            call[0] / call[1]
        );
    }
}
