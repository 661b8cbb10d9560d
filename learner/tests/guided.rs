//! Guided tails and the learner: a token drawn from a restricted set is scored by the learner
//! over the same set, exactly as the sampler drew it, and forced tokens carry no loss.
use comas_learner::{Experience, Finish, TrainConfig, Trainer};
use comas_model::guide::Constrained;
use comas_model::{generate, CausalLm, GenerationRequest, SamplingParams, Tokenizer};
use std::path::PathBuf;
use tch::{Device, Kind, Tensor};

const SUFFIX: &str = "<score>[123]</score>";

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/qwen2-f32")
}

/// Guided completions of the tiny model, as experiences carrying the sampler's log-probs.
fn guided_batch(temperature: f64) -> Vec<Experience> {
    let dir = model_dir();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let model = CausalLm::load(&dir, Kind::Float, Device::Cpu).unwrap();
    let reqs: Vec<GenerationRequest> = (0..6u64)
        .map(|i| GenerationRequest {
            prompt_ids: tok.encode(&format!("rate answer {i}:"), false).unwrap(),
            params: SamplingParams {
                temperature,
                seed: 40 + i,
                max_new_tokens: 24 + i as usize,
                stop_token_ids: tok.eos_token_ids().to_vec(),
                guided_suffix: Some(SUFFIX.into()),
                ..Default::default()
            },
            adapter: None,
        })
        .collect();
    let outs = generate(&model, &reqs, Some(&tok)).unwrap();
    reqs.iter()
        .zip(outs)
        .enumerate()
        .map(|(i, (r, c))| {
            let text = tok.decode(&c.token_ids, false).unwrap();
            assert!(
                text.contains("<score>") && text.ends_with("</score>"),
                "reply {i} has no guided tail: {text:?}"
            );
            assert!(
                c.constrained.iter().any(|k| k.allowed.len() > 1),
                "reply {i}: the digit must be a choice"
            );
            Experience {
                prompt_ids: r.prompt_ids.clone(),
                completion_ids: c.token_ids.clone(),
                reward: Some(i as f64 / 5.0),
                token_rewards: None,
                finish_reason: Finish::Stop,
                group: String::new(),
                sampling_logprobs: Some(c.logprobs.iter().map(|&x| f64::from(x)).collect()),
                episode_id: None,
                turn_id: None,
                policy_version: None,
                constrained: c.constrained,
                temperature: None,
                norm_group: String::new(),
            }
        })
        .collect()
}

/// log softmax(logits / T) over `allowed` at each constrained position, straight from a full
/// forward of the sequence: the reference the sampler and the learner must both equal.
fn reference_logprob(model: &CausalLm, e: &Experience, c: &Constrained, temperature: f64) -> f64 {
    let ids = [e.prompt_ids.as_slice(), &e.completion_ids].concat();
    let logits =
        model.forward(&Tensor::from_slice(&ids).view([1, -1]), None, None).unwrap().squeeze_dim(0);
    let row = logits.get((e.prompt_ids.len() + c.position - 1) as i64).to_kind(Kind::Double)
        / temperature;
    let row: Vec<f64> = Vec::try_from(&row).unwrap();
    let z = c.allowed.iter().map(|&t| row[t as usize]).fold(f64::NEG_INFINITY, f64::max);
    let lse = z + c.allowed.iter().map(|&t| (row[t as usize] - z).exp()).sum::<f64>().ln();
    row[e.completion_ids[c.position] as usize] - lse
}

#[test]
fn restricted_tokens_are_renormalised_over_their_set_by_sampler_and_learner() {
    let temperature = 0.8;
    let batch = guided_batch(temperature);
    let model = CausalLm::load(&model_dir(), Kind::Float, Device::Cpu).unwrap();
    let mut choices = 0;
    for e in &batch {
        for c in &e.constrained {
            let want = reference_logprob(&model, e, c, temperature);
            let got = e.sampling_logprobs.as_ref().unwrap()[c.position];
            assert!(
                (got - want).abs() < 1e-5,
                "sampler {got} vs reference {want} at {}",
                c.position
            );
            if c.allowed.len() == 1 {
                assert_eq!(got, 0.0, "a forced token has log-prob 0");
            } else {
                choices += 1;
                assert!(want < -1e-3, "a real choice has log-prob below 0: {want}");
            }
        }
    }
    assert_eq!(choices, batch.len(), "one digit choice per reply");

    // The learner's recomputed old log-probs equal the sampler's everywhere (free tokens over the
    // full vocabulary, tail tokens over their sets): the PPO ratio compares like with like.
    let cfg = TrainConfig {
        temperature,
        lr: 1e-3,
        warmup_ratio: 0.0,
        train_batch_size: 6,
        micro_batch_size: 4,
        ..Default::default()
    };
    let mut t = Trainer::new(&model_dir(), cfg.clone(), None).unwrap();
    let report = t.train_step(&batch).unwrap();
    let mismatch = report.sampler_mismatch.unwrap();
    assert!(mismatch < 1e-6, "sampler/learner mismatch {mismatch:e}");

    // Without the sets the learner would score tail tokens over the whole vocabulary: the same
    // check then fails, so it can.
    let unguided: Vec<Experience> =
        batch.iter().cloned().map(|e| Experience { constrained: Vec::new(), ..e }).collect();
    let mut t = Trainer::new(&model_dir(), cfg, None).unwrap();
    let report = t.train_step(&unguided).unwrap();
    assert!(report.sampler_mismatch.unwrap() > 1e-2, "{:?}", report.sampler_mismatch);
}

#[test]
fn forced_tokens_carry_no_loss() {
    let batch = guided_batch(1.0);
    // Keep only replies' forced tokens as completions: nothing is left to learn from, so the
    // step's loss is zero and the weights do not move.
    let forced_only: Vec<Experience> = batch
        .iter()
        .map(|e| {
            // The first run of forced tokens: the tail's opening tag.
            let start = e.constrained[0].position;
            let n = e
                .constrained
                .iter()
                .enumerate()
                .take_while(|(k, c)| c.position == start + k && c.allowed.len() == 1)
                .count();
            let tail = &e.constrained[..n];
            let prompt = [e.prompt_ids.as_slice(), &e.completion_ids[..start]].concat();
            Experience {
                prompt_ids: prompt,
                completion_ids: e.completion_ids[start..start + n].to_vec(),
                constrained: tail
                    .iter()
                    .map(|c| Constrained {
                        position: c.position - start,
                        allowed: c.allowed.clone(),
                    })
                    .collect(),
                temperature: None,
                sampling_logprobs: None,
                ..e.clone()
            }
        })
        .collect();
    assert!(
        forced_only
            .iter()
            .all(|e| !e.completion_ids.is_empty() && e.constrained.len() == e.completion_ids.len()),
        "each reply opens its tail with forced tokens"
    );
    let cfg = TrainConfig {
        lr: 1e-2,
        warmup_ratio: 0.0,
        weight_decay: 0.0,
        train_batch_size: 6,
        ..Default::default()
    };
    let mut t = Trainer::new(&model_dir(), cfg.clone(), None).unwrap();
    let before: Vec<Tensor> =
        t.model().named_parameters().into_iter().map(|(_, p)| p.detach().copy()).collect();
    let report = t.train_step(&forced_only).unwrap();
    assert_eq!((report.loss, report.grad_norm), (0.0, 0.0), "{report:?}");
    let moved = t
        .model()
        .named_parameters()
        .iter()
        .zip(&before)
        .map(|((_, p), b)| (p.detach() - b).abs().max().double_value(&[]))
        .fold(0.0, f64::max);
    assert_eq!(moved, 0.0);
    // The same tokens without their sets are ordinary tokens and do move the weights.
    let free: Vec<Experience> =
        forced_only.into_iter().map(|e| Experience { constrained: Vec::new(), ..e }).collect();
    let mut t = Trainer::new(&model_dir(), cfg, None).unwrap();
    assert!(t.train_step(&free).unwrap().grad_norm > 0.0);
}

/// `old_logprobs = "sampler"` skips the recompute pass; with the sampler's exact log-probs the
/// update is the one the recompute gives.
#[test]
fn sampler_logprobs_as_old_give_the_recomputed_update() {
    use comas_learner::config::OldLogprobs;
    let batch = guided_batch(1.0);
    let base = TrainConfig {
        lr: 1e-3,
        warmup_ratio: 0.0,
        train_batch_size: 3,
        micro_batch_size: 3,
        ..Default::default()
    };
    let run = |old_logprobs| {
        let mut t =
            Trainer::new(&model_dir(), TrainConfig { old_logprobs, ..base.clone() }, None).unwrap();
        let r = t.train_step(&batch).unwrap();
        let w: Vec<Tensor> =
            t.model().named_parameters().into_iter().map(|(_, p)| p.detach().copy()).collect();
        (r, w)
    };
    let (r_re, w_re) = run(OldLogprobs::Recompute);
    let (r_sa, w_sa) = run(OldLogprobs::Sampler);
    assert!(!r_re.old_logprobs_from_sampler && r_sa.old_logprobs_from_sampler);
    eprintln!(
        "sampler vs recomputed old log-probs: mean |diff| {:e}",
        r_re.sampler_mismatch.unwrap()
    );
    let diff = w_re
        .iter()
        .zip(&w_sa)
        .map(|(a, b)| (a - b).abs().max().double_value(&[]))
        .fold(0.0, f64::max);
    assert!(diff < 1e-6, "updates differ by {diff:e}");
    assert!(r_sa.peak_rss_bytes > 0);
}
