//! Continuous batching: sequences that join a running batch between steps produce exactly what
//! they produce alone (same greedy tokens, same seeded samples, log-probs within 1e-5).
mod common;

use comas_model::batcher::drain;
use comas_model::decode_linear::DecodePath;
use comas_model::{
    generate, Batcher, CausalLm, Completion, GenerationRequest, LoraAdapter, SamplingParams,
};
use common::*;
use tch::{Device, Kind};

fn alone(model: &CausalLm, req: &GenerationRequest) -> Completion {
    generate(model, std::slice::from_ref(req), None).unwrap().remove(0)
}

fn same(a: &Completion, b: &Completion, what: &str) {
    assert_eq!(a.token_ids, b.token_ids, "{what}");
    assert_eq!(a.finish_reason, b.finish_reason, "{what}");
    for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
        assert!((x - y).abs() < 1e-5, "{what}: {x} vs {y}");
    }
}

#[test]
fn late_joiners_match_running_alone() {
    let r = Reference::load("llama3-gqa");
    let model = CausalLm::load(&model_dir("llama3-gqa"), Kind::Float, Device::Cpu).unwrap();
    // As a worker runs it: decode steps take the few-row kernel.
    assert_eq!(model.pack_for_decode(), DecodePath::Rows);
    let reqs: Vec<GenerationRequest> = (0..9)
        .map(|i| {
            let mut prompt = r.prompt_ids(i % 3);
            prompt.truncate(prompt.len() - i / 3); // different lengths
            let params = SamplingParams {
                temperature: if i % 2 == 0 { 0.0 } else { 0.9 },
                top_k: if i % 4 == 1 { 20 } else { 0 },
                seed: 100 + i as u64,
                max_new_tokens: 5 + 3 * i,
                stop_token_ids: vec![424],
                ..Default::default()
            };
            GenerationRequest { prompt_ids: prompt, params, adapter: None }
        })
        .collect();
    let mut b = Batcher::new(&model, None);
    let mut got: Vec<Option<Completion>> = vec![None; reqs.len()];
    let mut next = 0;
    let mut steps = 0;
    // Admit 2 sequences every 3 steps while others are mid-decode.
    while next < reqs.len() || !b.is_empty() {
        if steps % 3 == 0 && next < reqs.len() {
            for _ in 0..2.min(reqs.len() - next) {
                let q = &reqs[next];
                b.add(next as u64, q.prompt_ids.clone(), q.params.clone(), None).unwrap();
                next += 1;
            }
        }
        for (id, c) in b.step().unwrap() {
            assert!(got[id as usize].is_none(), "sequence {id} finished twice");
            got[id as usize] = Some(c);
        }
        steps += 1;
        assert!(steps < 500, "batcher does not finish");
    }
    for (i, q) in reqs.iter().enumerate() {
        same(got[i].as_ref().expect("finished"), &alone(&model, q), &format!("request {i}"));
    }
}

/// Admitting only what `slots_if_added` says fits (as the worker does with its token budget)
/// keeps the cache's allocation within the limit while sequences of different lengths come and
/// go, and changes no result.
#[test]
fn a_cache_limit_bounds_the_allocation_and_changes_nothing() {
    let r = Reference::load("llama3-gqa");
    let model = CausalLm::load(&model_dir("llama3-gqa"), Kind::Float, Device::Cpu).unwrap();
    let reqs: Vec<GenerationRequest> = (0..8)
        .map(|i| {
            let mut prompt = r.prompt_ids(i % 3);
            prompt.truncate(prompt.len() - i % 4);
            GenerationRequest {
                prompt_ids: prompt,
                params: SamplingParams {
                    seed: i as u64,
                    max_new_tokens: 4 + 5 * (i % 3),
                    ..Default::default()
                },
                adapter: None,
            }
        })
        .collect();
    let widest = reqs.iter().map(|q| q.prompt_ids.len() + q.params.max_new_tokens).max().unwrap();
    let limit = 3 * widest; // about three sequences at a time
    let mut b = Batcher::new(&model, None);
    b.set_cache_limit(Some(limit));
    let (mut got, mut next, mut most_running) = (vec![None; reqs.len()], 0, 0);
    while next < reqs.len() || !b.is_empty() {
        while next < reqs.len() {
            let q = &reqs[next];
            if !b.is_empty()
                && b.slots_if_added(q.prompt_ids.len() + q.params.max_new_tokens) > limit
            {
                break;
            }
            b.add(next as u64, q.prompt_ids.clone(), q.params.clone(), None).unwrap();
            next += 1;
        }
        for (id, c) in b.step().unwrap() {
            got[id as usize] = Some(c);
        }
        most_running = most_running.max(b.running());
        assert!(
            b.cache_slots() <= limit as i64,
            "{} slots allocated, limit {limit}",
            b.cache_slots()
        );
        assert!(b.cached_tokens() <= b.cache_slots());
    }
    assert!(most_running >= 2, "the limit left room for {most_running} sequence(s) at a time");
    for (i, q) in reqs.iter().enumerate() {
        same(got[i].as_ref().expect("finished"), &alone(&model, q), &format!("request {i}"));
    }
}

#[test]
fn adapters_per_row_in_a_continuous_batch() {
    let model = CausalLm::load(&model_dir("qwen2-f32"), Kind::Float, Device::Cpu).unwrap();
    let adapter =
        LoraAdapter::load(&model_dir("qwen2-f32-lora"), model.config(), Kind::Float, Device::Cpu)
            .unwrap();
    let r = Reference::load("qwen2-f32");
    let reqs: Vec<GenerationRequest> = (0..4)
        .map(|i| GenerationRequest {
            prompt_ids: r.prompt_ids(i % 3),
            params: SamplingParams::greedy(12),
            adapter: (i % 2 == 1).then_some(&adapter),
        })
        .collect();
    let mut b = Batcher::new(&model, None);
    b.add(0, reqs[0].prompt_ids.clone(), reqs[0].params.clone(), reqs[0].adapter).unwrap();
    b.add(1, reqs[1].prompt_ids.clone(), reqs[1].params.clone(), reqs[1].adapter).unwrap();
    let mut got = b.step().unwrap();
    got.extend(b.step().unwrap());
    b.add(2, reqs[2].prompt_ids.clone(), reqs[2].params.clone(), reqs[2].adapter).unwrap();
    b.add(3, reqs[3].prompt_ids.clone(), reqs[3].params.clone(), reqs[3].adapter).unwrap();
    got.extend(drain(&mut b).unwrap());
    assert_eq!(got.len(), 4);
    for (id, c) in &got {
        same(c, &alone(&model, &reqs[*id as usize]), &format!("request {id}"));
    }
}

/// A prompt asked again on the same weights, beside the first (the samples of a GRPO group) or
/// while the first still runs, copies the first one's prefill instead of computing it, and every
/// sequence produces what it produces alone and with sharing off (same tokens, log-probs within
/// 1e-5: a row's later decode steps may round differently in another row of the batch). A
/// prompt under another adapter, or one that only starts the same, is prefilled.
#[test]
fn a_prompt_asked_again_is_prefilled_once_and_changes_nothing() {
    let model = CausalLm::load(&model_dir("qwen2-f32"), Kind::Float, Device::Cpu).unwrap();
    let adapter =
        LoraAdapter::load(&model_dir("qwen2-f32-lora"), model.config(), Kind::Float, Device::Cpu)
            .unwrap();
    let vocab = model.config().vocab_size;
    let system: Vec<i64> = (0..24).map(|t| (t * 37 + 11) % vocab).collect();
    let q1 = [system.as_slice(), &[5, 6, 7]].concat();
    let q2 = [system.as_slice(), &[8, 9]].concat();
    let sampled = |seed| SamplingParams { temperature: 0.9, seed, ..SamplingParams::greedy(10) };
    let req = |prompt: &Vec<i64>, params, adapter| GenerationRequest {
        prompt_ids: prompt.clone(),
        params,
        adapter,
    };
    let reqs = vec![
        req(&q1, sampled(0), None),
        req(&q1, sampled(1), None),
        req(&q1, sampled(2), None),
        req(&q1, sampled(3), None),
        req(&q2, SamplingParams::greedy(8), None),
        req(&q1, SamplingParams::greedy(10), Some(&adapter)),
        // Join two steps later, while the first ones decode.
        req(&q1, sampled(7), None),
        req(&q1, sampled(8), None),
        req(&q1, SamplingParams::greedy(4), Some(&adapter)),
    ];
    let run = |share: bool| {
        let mut b = Batcher::new(&model, None);
        b.set_prompt_sharing(share);
        for (i, q) in reqs.iter().enumerate().take(6) {
            b.add(i as u64, q.prompt_ids.clone(), q.params.clone(), q.adapter).unwrap();
        }
        let mut got = b.step().unwrap();
        let first = b.shared_prompt_tokens();
        got.extend(b.step().unwrap());
        for (i, q) in reqs.iter().enumerate().skip(6) {
            b.add(i as u64, q.prompt_ids.clone(), q.params.clone(), q.adapter).unwrap();
        }
        got.extend(drain(&mut b).unwrap());
        got.sort_by_key(|(id, _)| *id);
        (first, b.shared_prompt_tokens(), got)
    };
    let (first, total, on) = run(true);
    // Three q1s on the base copied the first one's 27 tokens; q2 (24 tokens in common) and the
    // adapter's q1 were prefilled. The three late q1s copied a running q1 on their weights.
    assert_eq!((first, total), (3 * 27, 6 * 27));
    let (_, none, off) = run(false);
    assert_eq!(none, 0);
    assert_eq!(on.len(), reqs.len());
    for ((id, a), (_, b)) in on.iter().zip(&off) {
        same(a, b, &format!("request {id}, sharing off"));
        same(a, &alone(&model, &reqs[*id as usize]), &format!("request {id}"));
    }
}

#[test]
fn bad_sequences_are_refused_without_disturbing_the_batch() {
    let model = CausalLm::load(&model_dir("qwen2-f32"), Kind::Float, Device::Cpu).unwrap();
    let mut b = Batcher::new(&model, None);
    b.add(1, vec![1, 2, 3], SamplingParams::greedy(4), None).unwrap();
    assert!(b.add(2, vec![], SamplingParams::greedy(4), None).is_err());
    assert!(b
        .add(3, vec![1, 9999], SamplingParams::greedy(4), None)
        .unwrap_err()
        .to_string()
        .contains("9999"));
    assert!(b
        .add(
            4,
            vec![1],
            SamplingParams { stop_strings: vec!["x".into()], ..SamplingParams::greedy(2) },
            None
        )
        .is_err());
    b.add(5, vec![4], SamplingParams::greedy(0), None).unwrap();
    let done = drain(&mut b).unwrap();
    let ids: Vec<u64> = done.iter().map(|(i, _)| *i).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&1) && ids.contains(&5));
    assert!(done.iter().find(|(i, _)| *i == 5).unwrap().1.token_ids.is_empty());
    assert_eq!(done.iter().find(|(i, _)| *i == 1).unwrap().1.token_ids.len(), 4);
}

/// Chunked prefill: a prompt longer than the chunk is prefilled 3 tokens per step while the
/// others decode, and every sequence, long or short, produces what it produces alone (same
/// tokens, same seeded samples, log-probs within 1e-5). A row that was decoding gets a token
/// every step while the long prompt goes in.
#[test]
fn long_prompts_prefill_in_chunks_beside_decoding_rows_and_change_nothing() {
    let r = Reference::load("llama3-gqa");
    let model = CausalLm::load(&model_dir("llama3-gqa"), Kind::Float, Device::Cpu).unwrap();
    let long: Vec<i64> = (0..3).flat_map(|i| r.prompt_ids(i)).collect();
    let short = r.prompt_ids(0)[..2].to_vec();
    let reqs: Vec<GenerationRequest> = [
        (short.clone(), 0.0, 40),
        (long.clone(), 0.9, 6),
        (long[..7].to_vec(), 0.0, 5),
        (short, 0.8, 40),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (prompt_ids, temperature, max_new_tokens))| GenerationRequest {
        prompt_ids,
        params: SamplingParams {
            temperature,
            seed: 40 + i as u64,
            max_new_tokens,
            ..Default::default()
        },
        adapter: None,
    })
    .collect();
    assert!(long.len() > 3 * 4, "the long prompt takes several chunks");
    let mut b = Batcher::new(&model, None);
    b.set_prefill_chunk(Some(3));
    let q = &reqs[0];
    b.add(0, q.prompt_ids.clone(), q.params.clone(), None).unwrap();
    let mut got: Vec<Option<Completion>> = vec![None; reqs.len()];
    b.step().unwrap();
    assert_eq!(b.running(), 1);
    for (i, q) in reqs.iter().enumerate().skip(1) {
        b.add(i as u64, q.prompt_ids.clone(), q.params.clone(), None).unwrap();
    }
    // The short prompt joins at once; the two long ones wait their turn, one chunk a step.
    let mut steps = 0;
    while !b.is_empty() {
        for (id, c) in b.step().unwrap() {
            got[id as usize] = Some(c);
        }
        steps += 1;
        if steps < long.len() / 3 {
            assert_eq!(
                b.running(),
                2,
                "step {steps}: only the short rows decode while the long prompt is prefilled"
            );
        }
        assert!(steps < 200);
    }
    for (i, q) in reqs.iter().enumerate() {
        same(got[i].as_ref().expect("finished"), &alone(&model, q), &format!("request {i}"));
    }
    // Off, or a chunk longer than every prompt, is the same as before.
    let mut whole = Batcher::new(&model, None);
    whole.set_prefill_chunk(Some(10_000));
    whole.add(1, reqs[1].prompt_ids.clone(), reqs[1].params.clone(), None).unwrap();
    same(
        &drain(&mut whole).unwrap().remove(0).1,
        got[1].as_ref().unwrap(),
        "a chunk longer than the prompt",
    );
}

/// An aborted sequence leaves at once wherever it is (decoding, in its chunked prefill, queued)
/// and never finishes; every other sequence produces exactly what it produces alone, so the
/// rows that moved into the aborted rows' places kept their own cache and logits.
#[test]
fn aborted_sequences_leave_at_once_and_the_others_are_unchanged() {
    let r = Reference::load("llama3-gqa");
    let model = CausalLm::load(&model_dir("llama3-gqa"), Kind::Float, Device::Cpu).unwrap();
    let long: Vec<i64> = (0..3).flat_map(|i| r.prompt_ids(i)).collect();
    let reqs: Vec<GenerationRequest> = (0..6)
        .map(|i| {
            // Short prompts join whole (no longer than the chunk); the long one is prefilled in chunks.
            let prompt_ids = if i == 4 { long.clone() } else { r.prompt_ids(i % 3)[..3].to_vec() };
            let params = SamplingParams {
                temperature: if i % 2 == 0 { 0.0 } else { 0.9 },
                seed: 70 + i as u64,
                max_new_tokens: 30,
                ..Default::default()
            };
            GenerationRequest { prompt_ids, params, adapter: None }
        })
        .collect();
    let mut b = Batcher::new(&model, None);
    b.set_prefill_chunk(Some(3));
    for (i, q) in reqs.iter().enumerate().take(5) {
        b.add(i as u64, q.prompt_ids.clone(), q.params.clone(), None).unwrap();
    }
    let mut got: Vec<Option<Completion>> = vec![None; reqs.len()];
    assert!(long.len() > 3 * 4, "the long prompt is still in its prefill after four steps");
    for _ in 0..4 {
        assert!(b.step().unwrap().is_empty());
    }
    assert_eq!(b.running(), 4, "four rows decode, the long prompt is still being prefilled");
    // Row 0 (the last row, 3, moves into its place), then row 2 (by then the last row).
    assert_eq!(b.abort(0).unwrap(), Some(4));
    assert_eq!(b.abort(2).unwrap(), Some(4));
    assert_eq!(b.running(), 2);
    assert_eq!(b.abort(4).unwrap(), Some(0), "the long prompt in its chunked prefill");
    b.add(5, reqs[5].prompt_ids.clone(), reqs[5].params.clone(), None).unwrap();
    assert_eq!(b.abort(5).unwrap(), Some(0), "a queued sequence");
    assert_eq!(b.abort(0).unwrap(), None, "already gone");
    assert_eq!(b.abort(99).unwrap(), None, "never added");
    let mut steps = 0;
    while !b.is_empty() {
        for (id, c) in b.step().unwrap() {
            assert!(got[id as usize].is_none(), "sequence {id} finished twice");
            got[id as usize] = Some(c);
        }
        steps += 1;
        assert!(steps < 100);
    }
    for i in [0, 2, 4, 5] {
        assert!(got[i].is_none(), "aborted sequence {i} finished");
    }
    for i in [1, 3] {
        same(got[i].as_ref().expect("finished"), &alone(&model, &reqs[i]), &format!("request {i}"));
    }
}

/// Every final-norm weight NaN, as after a training step that diverged: every logit is NaN.
fn nan_model() -> CausalLm {
    let model = CausalLm::load(&model_dir("qwen2-f32"), Kind::Float, Device::Cpu).unwrap();
    tch::no_grad(|| {
        for (name, mut t) in model.named_parameters() {
            if name == "model.norm.weight" {
                let _ = t.fill_(f64::NAN);
            }
        }
    });
    model
}

#[test]
fn a_model_with_nan_logits_fails_generation_with_a_clear_error() {
    let model = nan_model();
    let r = Reference::load("qwen2-f32");
    // Greedy, sampled, and sampled with a nucleus (the CPU's selection of the cut).
    for params in [
        SamplingParams::greedy(4),
        SamplingParams { seed: 1, max_new_tokens: 4, ..Default::default() },
        SamplingParams { seed: 2, top_p: 0.9, top_k: 5, max_new_tokens: 4, ..Default::default() },
    ] {
        let req = GenerationRequest { prompt_ids: r.prompt_ids(0), params, adapter: None };
        let err = generate(&model, std::slice::from_ref(&req), None).unwrap_err();
        assert!(
            matches!(err, comas_model::ModelError::NonFiniteLogits { sequence: 0, token: 1 }),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.contains("not finite") && text.contains("config.json"), "{text}");
    }
    // In a batch, the step fails (the caller fails its sequences) and stays failed: a step
    // called again does not drop the rows or hand out tokens.
    let mut b = Batcher::new(&model, None);
    for id in 0..3u64 {
        let params = SamplingParams { seed: id, max_new_tokens: 4, ..Default::default() };
        b.add(id, r.prompt_ids(id as usize % 2), params, None).unwrap();
    }
    let err = b.step().unwrap_err();
    assert!(matches!(err, comas_model::ModelError::NonFiniteLogits { token: 1, .. }), "{err}");
    assert_eq!(b.len(), 3);
    assert!(b.step().is_err());
}
