//! Learner behaviour on tiny models: learning a toy reward, exact resume, and bad input that
//! leaves the weights untouched.
use comas_learner::{checkpoint, Experience, Finish, TrainConfig, Trainer};
use comas_model::tiny::{write_model, TinySpec};
use comas_model::{generate, Architecture, GenerationRequest, SamplingParams};
use rand::{Rng, SeedableRng};
use std::path::Path;
use tch::Tensor;

fn tiny_model(dir: &Path, seed: i64) {
    let spec = TinySpec { seed, ..TinySpec::tiny(Architecture::Qwen2) };
    write_model(dir, &spec).unwrap();
}

fn params(t: &Trainer) -> Vec<(String, Tensor)> {
    tch::no_grad(|| {
        t.model().named_parameters().into_iter().map(|(n, p)| (n, p.detach().copy())).collect()
    })
}

fn max_param_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    a.iter()
        .zip(b)
        .map(|((n1, x), (n2, y))| {
            assert_eq!(n1, n2);
            (x - y).abs().max().double_value(&[])
        })
        .fold(0.0, f64::max)
}

fn random_batch(seed: u64, n: usize) -> Vec<Experience> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| Experience {
            prompt_ids: (0..rng.gen_range(2..8)).map(|_| rng.gen_range(0..420)).collect(),
            completion_ids: (0..rng.gen_range(1..7)).map(|_| rng.gen_range(0..420)).collect(),
            reward: Some([0.0, 0.5, 1.0][rng.gen_range(0..3)]),
            token_rewards: None,
            finish_reason: if i % 5 == 4 { Finish::Length } else { Finish::Stop },
            group: format!("g{}", i / 2),
            sampling_logprobs: None,
            episode_id: None,
            turn_id: Some(i as u64),
            policy_version: Some(0),
            constrained: Vec::new(),
            temperature: None,
            norm_group: String::new(),
        })
        .collect()
}

/// Toy task: reward 1 when the completion starts with one chosen token, else 0. The model has a
/// 16-token vocabulary so the chosen token is sampled from the start (p ≈ 1/16); REINFORCE++
/// must move the first-token distribution onto it.
#[test]
fn mean_reward_rises_on_a_toy_task() {
    let dir = tempfile::tempdir().unwrap();
    write_model(
        dir.path(),
        &TinySpec { seed: 3, vocab_size: 16, ..TinySpec::tiny(Architecture::Qwen2) },
    )
    .unwrap();
    let cfg = TrainConfig {
        lr: 1e-2,
        warmup_ratio: 0.0,
        total_steps: 30,
        train_batch_size: 32,
        micro_batch_size: 32,
        ..Default::default()
    };
    let mut trainer = Trainer::new(dir.path(), cfg, None).unwrap();
    let good = |t: i64| t == 3;
    let prompts: Vec<Vec<i64>> = vec![vec![5, 6, 7], vec![10, 11], vec![2, 3, 4, 5], vec![13]];
    let mut means = Vec::new();
    for step in 0..25u64 {
        let reqs: Vec<GenerationRequest> = (0..32)
            .map(|i| GenerationRequest {
                prompt_ids: prompts[i % 4].clone(),
                params: SamplingParams {
                    seed: step * 100 + i as u64,
                    max_new_tokens: 3,
                    ..Default::default()
                },
                adapter: None,
            })
            .collect();
        let outs = generate(trainer.model(), &reqs, None).unwrap();
        let batch: Vec<Experience> = reqs
            .iter()
            .zip(&outs)
            .map(|(r, c)| Experience {
                prompt_ids: r.prompt_ids.clone(),
                completion_ids: c.token_ids.clone(),
                reward: Some(if good(c.token_ids[0]) { 1.0 } else { 0.0 }),
                token_rewards: None,
                finish_reason: Finish::Stop,
                group: String::new(),
                sampling_logprobs: Some(c.logprobs.iter().map(|&x| x as f64).collect()),
                episode_id: None,
                turn_id: None,
                policy_version: Some(step),
                constrained: Vec::new(),
                temperature: None,
                norm_group: String::new(),
            })
            .collect();
        means.push(batch.iter().map(|e| e.scalar_reward()).sum::<f64>() / batch.len() as f64);
        let report = trainer.train_step(&batch).unwrap();
        // Weights the sampler used are the ones the learner starts from: no mismatch.
        assert!(report.sampler_mismatch.unwrap() < 1e-4, "{report:?}");
    }
    let first: f64 = means[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = means[20..].iter().sum::<f64>() / 5.0;
    eprintln!("mean reward per step: {means:?}");
    assert!(first < 0.2, "starts near 1/16: {first}");
    assert!(last > 0.7 && last > first + 0.4, "first {first}, last {last}");
}

fn resume_cfg() -> TrainConfig {
    TrainConfig {
        lr: 1e-3,
        weight_decay: 0.01,
        warmup_ratio: 0.25,
        total_steps: 8,
        train_batch_size: 6,
        micro_batch_size: 4,
        shuffle: true,
        ..Default::default()
    }
}

#[test]
fn resume_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), 5);
    let batches: Vec<Vec<Experience>> = (0..4).map(|s| random_batch(s, 12)).collect();
    // Straight: 4 global steps (2 optimizer steps each).
    let mut straight = Trainer::new(dir.path(), resume_cfg(), None).unwrap();
    for b in &batches {
        straight.train_step(b).unwrap();
    }
    // Interrupted: 2 steps, checkpoint, a fresh process state, 2 more.
    let ckpts = dir.path().join("ckpt");
    let mut first = Trainer::new(dir.path(), resume_cfg(), None).unwrap();
    for b in &batches[..2] {
        first.train_step(b).unwrap();
    }
    let saved = first.save_checkpoint(&ckpts, 2).unwrap();
    drop(first);
    assert_eq!(checkpoint::latest_checkpoint(&ckpts).unwrap().unwrap(), saved);
    let mut resumed = Trainer::resume(&saved, dir.path(), None).unwrap();
    assert_eq!((resumed.global_step, resumed.optimizer_steps), (2, 4));
    for b in &batches[2..] {
        resumed.train_step(b).unwrap();
    }
    let d = max_param_diff(&params(&straight), &params(&resumed));
    assert!(d < 1e-7, "resumed weights differ by {d}");
    assert!(
        max_param_diff(
            &params(&straight),
            &params(&Trainer::new(dir.path(), resume_cfg(), None).unwrap())
        ) > 1e-4
    );
}

#[test]
fn bad_batches_are_rejected_and_weights_stay() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), 6);
    let mut t = Trainer::new(dir.path(), resume_cfg(), None).unwrap();
    let before = params(&t);
    let cases: Vec<(Box<dyn Fn(&mut Vec<Experience>)>, &str)> = vec![
        (Box::new(|b| b[3].completion_ids.push(512)), "outside the model's vocabulary"),
        (Box::new(|b| b[1].completion_ids.clear()), "empty completion"),
        (Box::new(|b| b[2].reward = Some(f64::NAN)), "not finite"),
        (Box::new(|b| b[0].reward = None), "no `reward`"),
        (Box::new(|b| b[4].sampling_logprobs = Some(vec![0.0])), "sampling logprobs"),
    ];
    for (edit, needle) in cases {
        let mut b = random_batch(9, 12);
        edit(&mut b);
        let err = t.train_step(&b).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    }
    assert!(t.train_step(&[]).unwrap_err().to_string().contains("empty batch"));
    assert_eq!(max_param_diff(&before, &params(&t)), 0.0);
    assert_eq!((t.global_step, t.optimizer_steps), (0, 0));
}

#[test]
fn a_step_that_blows_up_is_skipped_without_a_full_model_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), 7);
    // An absurd learning rate: the first optimizer step succeeds and ruins the weights, the second
    // sees a non-finite loss or gradient and is skipped (its gradients dropped), as DeepSpeed and
    // Megatron do; no copy of the full model is kept to undo the first.
    let cfg = TrainConfig { lr: 1e30, max_grad_norm: 0.0, ..resume_cfg() };
    let mut t = Trainer::new(dir.path(), cfg, None).unwrap();
    let r = t.train_step(&random_batch(3, 12)).unwrap();
    assert_eq!((r.optimizer_steps, r.skipped_steps), (1, 1));
    assert_eq!((t.global_step, t.optimizer_steps, t.optimizer().steps), (1, 1, 1));
    // With the weights ruined nothing can be trained: an error, and no step is counted.
    let err = t.train_step(&random_batch(4, 12)).unwrap_err().to_string();
    assert!(err.contains("non-finite"), "{err}");
    assert_eq!((t.global_step, t.optimizer_steps, t.optimizer().steps), (1, 1, 1));
}

/// A corrupted reference model (NaN weights) makes the KL term, and so the loss of every
/// optimizer step, non-finite: all are skipped, the step is an error and nothing changed.
#[test]
fn an_update_whose_every_step_is_non_finite_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), 7);
    let bad_ref = dir.path().join("nan-reference");
    write_model(
        &bad_ref,
        &TinySpec { seed: 7, init_std: f64::NAN, ..TinySpec::tiny(Architecture::Qwen2) },
    )
    .unwrap();
    let cfg = TrainConfig { kl_coef: 0.1, kl_in_loss: true, ..resume_cfg() };
    let mut t = Trainer::with_reference(dir.path(), cfg, None, Some(&bad_ref)).unwrap();
    let before = params(&t);
    let err = t.train_step(&random_batch(5, 12)).unwrap_err().to_string();
    assert!(err.contains("non-finite") && err.contains("unchanged"), "{err}");
    assert_eq!(max_param_diff(&before, &params(&t)), 0.0);
    assert_eq!((t.global_step, t.optimizer_steps, t.optimizer().steps), (0, 0, 0));
}

#[test]
fn checkpoint_is_a_loadable_model_folder_and_rotates() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), 8);
    let mut t = Trainer::new(dir.path(), resume_cfg(), None).unwrap();
    let root = dir.path().join("ckpt");
    for s in 0..3 {
        t.train_step(&random_batch(s, 6)).unwrap();
        t.save_checkpoint(&root, 2).unwrap();
    }
    let all = checkpoint::list_checkpoints(&root).unwrap();
    assert_eq!(all.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![2, 3]);
    let m =
        comas_model::CausalLm::load(&all[1].1.join("model"), tch::Kind::Float, tch::Device::Cpu)
            .unwrap();
    let d = max_param_diff(
        &params(&t),
        &tch::no_grad(|| {
            m.named_parameters().into_iter().map(|(n, p)| (n, p.copy())).collect::<Vec<_>>()
        }),
    );
    assert_eq!(d, 0.0);
    assert!(comas_model::Tokenizer::from_dir(&all[1].1.join("model")).is_ok());
    // A half-written checkpoint (no marker) is never picked.
    std::fs::create_dir_all(root.join("step-9/model")).unwrap();
    assert_eq!(checkpoint::latest_checkpoint(&root).unwrap().unwrap(), all[1].1);
    assert!(Trainer::resume(&root.join("step-9"), dir.path(), None)
        .err()
        .unwrap()
        .to_string()
        .contains("incomplete"));
    // A save of step 3 that crashed after moving the old step 3 aside, before the new one took
    // its name: the one moved aside is still found, and resumes.
    std::fs::remove_dir_all(root.join("step-9")).unwrap();
    std::fs::rename(&all[1].1, root.join(".step-3.old-77")).unwrap();
    let found = checkpoint::latest_checkpoint(&root).unwrap().unwrap();
    assert_eq!(found, root.join(".step-3.old-77"));
    assert_eq!(Trainer::resume(&found, dir.path(), None).unwrap().global_step, 3);
    // Saving step 3 again replaces it and leaves nothing aside.
    t.save_checkpoint(&root, 2).unwrap();
    let names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names.contains(&"step-3".to_string()) && names.contains(&"step-2".to_string()),
        "{names:?}"
    );
}

/// Each experience is scored at the temperature it was sampled at: a batch sampled at 0.5
/// trains exactly as the same batch under a learner configured for 0.5, and not as at 1.0.
#[test]
fn experiences_are_scored_at_their_own_sampling_temperature() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), 6);
    let plain = random_batch(9, 12);
    let tagged: Vec<Experience> =
        plain.iter().cloned().map(|e| Experience { temperature: Some(0.5), ..e }).collect();
    let at = |t: f64, batch: &[Experience]| {
        let mut tr =
            Trainer::new(dir.path(), TrainConfig { temperature: t, ..resume_cfg() }, None).unwrap();
        let r = tr.train_step(batch).unwrap();
        (r.loss, params(&tr))
    };
    let (loss_cfg, p_cfg) = at(0.5, &plain);
    let (loss_tagged, p_tagged) = at(1.0, &tagged);
    let (loss_one, p_one) = at(1.0, &plain);
    assert!((loss_cfg - loss_tagged).abs() < 1e-6, "{loss_cfg} vs {loss_tagged}");
    assert!(max_param_diff(&p_cfg, &p_tagged) < 1e-6);
    assert!(max_param_diff(&p_one, &p_tagged) > 1e-5, "the tag changed nothing");
    let _ = loss_one;
}

/// Activation checkpointing recomputes each layer in the backward pass; the update must be the
/// one the plain backward gives, for full fine-tuning (tied embeddings, so the embedding's
/// gradient comes from both ends) and for a LoRA adapter.
#[test]
fn gradient_checkpointing_gives_the_same_update() {
    let dir = tempfile::tempdir().unwrap();
    write_model(
        dir.path(),
        &TinySpec { seed: 5, tie_word_embeddings: true, ..TinySpec::tiny(Architecture::Qwen2) },
    )
    .unwrap();
    let lora = comas_learner::config::LoraSettings {
        r: 4,
        alpha: 8.0,
        target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()],
        use_rslora: false,
    };
    for adapter in [None, Some(lora)] {
        let trained = |checkpointing: bool| {
            let cfg = TrainConfig {
                lr: 1e-2,
                gradient_checkpointing: checkpointing,
                lora: adapter.clone(),
                ..resume_cfg()
            };
            let mut t = Trainer::new(dir.path(), cfg, None).unwrap();
            let r = t.train_step(&random_batch(11, 12)).unwrap();
            let weights: Vec<(String, Tensor)> = match t.adapter() {
                Some(a) => {
                    a.named_tensors().into_iter().map(|(n, x)| (n, x.detach().copy())).collect()
                }
                None => params(&t),
            };
            (r, weights)
        };
        let ((plain, w_plain), (ckpt, w_ckpt)) = (trained(false), trained(true));
        let what = if adapter.is_some() { "LoRA" } else { "full" };
        assert_eq!(plain.optimizer_steps, 2, "{what}");
        assert!(
            (plain.loss - ckpt.loss).abs() < 1e-9,
            "{what}: loss {} vs {}",
            plain.loss,
            ckpt.loss
        );
        assert!(
            (plain.grad_norm - ckpt.grad_norm).abs() < 1e-6 * plain.grad_norm,
            "{what}: grad norm {} vs {}",
            plain.grad_norm,
            ckpt.grad_norm
        );
        let moved = max_param_diff(&w_plain, &params_like(&w_plain, dir.path(), adapter.is_some()));
        assert!(moved > 1e-4, "{what}: the step changed the weights ({moved})");
        // Recomputing sums in another order moves gradients by float rounding, which Adam's
        // normalisation magnifies on the smallest ones: a relative bound, far below what a
        // missing or doubled gradient would give (the size of the step itself).
        let diff = max_param_diff(&w_plain, &w_ckpt);
        eprintln!("{what}: the step moved weights by up to {moved:e}; checkpointing changed them by {diff:e}");
        assert!(
            diff < 1e-3 * moved,
            "{what}: weights differ by {diff} (the step moved them by {moved})"
        );
    }
}

/// The starting weights, to check that a step moved them: the base model's parameters, or a
/// fresh adapter (B = 0) for LoRA.
fn params_like(like: &[(String, Tensor)], dir: &Path, lora: bool) -> Vec<(String, Tensor)> {
    if lora {
        return like
            .iter()
            .map(|(n, x)| (n.clone(), if n.contains("lora_B") { x.zeros_like() } else { x.copy() }))
            .collect();
    }
    params(&Trainer::new(dir, resume_cfg(), None).unwrap())
}

/// A step tells what it could not learn from: samples masked out (cut at max_new_tokens with
/// `mask_truncated`) and samples whose group's rewards were all equal (GRPO advantage 0); a
/// step with nothing else says it had no gradient, and (first of its job, no Adam momentum
/// yet) its weights do not move.
#[test]
fn a_step_counts_masked_and_zero_advantage_samples_and_says_when_nothing_learns() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path(), 5);
    let cfg = TrainConfig {
        estimator: comas_learner::config::Estimator::GroupNorm,
        lr: 1e-2,
        train_batch_size: 6,
        micro_batch_size: 6,
        mask_truncated: true,
        ..Default::default()
    };
    let mut trainer = Trainer::new(dir.path(), cfg, None).unwrap();
    // Groups g0, g1, g2 of two samples each.
    let mut batch = random_batch(9, 6);
    let set = |batch: &mut Vec<Experience>, rewards: [f64; 6], truncated: &[usize]| {
        for (i, (e, r)) in batch.iter_mut().zip(rewards).enumerate() {
            e.reward = Some(r);
            e.finish_reason = if truncated.contains(&i) { Finish::Length } else { Finish::Stop };
        }
    };
    // Every group alike, or masked: nothing to learn, and nothing moves.
    set(&mut batch, [1.0, 1.0, 0.5, 0.5, 0.0, 1.0], &[4, 5]);
    let before = params(&trainer);
    let r = trainer.train_step(&batch).unwrap();
    assert_eq!((r.masked_samples, r.zero_advantage_samples, r.no_gradient), (2, 4, true));
    assert_eq!(max_param_diff(&before, &params(&trainer)), 0.0);
    // g0 mixed, g1 alike, g2 with one sample masked.
    set(&mut batch, [1.0, 0.0, 0.5, 0.5, 1.0, 0.0], &[5]);
    let r = trainer.train_step(&batch).unwrap();
    assert_eq!((r.masked_samples, r.no_gradient), (1, false));
    assert!(r.zero_advantage_samples >= 2, "{r:?}");
}
