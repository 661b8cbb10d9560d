//! The model and LoRA adapters can be trained: gradients reach exactly the trainable tensors and
//! a few plain gradient steps lower the loss.
mod common;

use comas_model::{CausalLm, LoraAdapter, LoraBatch, LoraConfig};
use common::*;
use tch::{Device, Kind, Tensor};

/// Mean negative log-likelihood of `ids[1:]`.
fn nll(model: &CausalLm, ids: &Tensor, lora: Option<&LoraBatch>) -> Tensor {
    model.token_logprobs(ids, None, 1.0, lora).unwrap().mean(Kind::Float).neg()
}

fn sgd(params: &[Tensor], lr: f64) {
    tch::no_grad(|| {
        for p in params {
            let g = p.grad();
            let mut p = p.shallow_clone();
            let _ = p.f_sub_(&(g * lr)).unwrap();
            let _ = p.grad().zero_();
        }
    });
}

#[test]
fn lora_training_moves_only_the_adapter() {
    let model = CausalLm::load(&model_dir("qwen2-f32"), Kind::Float, Device::Cpu).unwrap();
    let cfg = LoraConfig {
        r: 4,
        lora_alpha: 8.0,
        target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()],
        use_rslora: false,
        lora_dropout: 0.0,
        base_model_name_or_path: None,
    };
    let adapter = LoraAdapter::init(model.config(), cfg, 1, Kind::Float, Device::Cpu).unwrap();
    let ids = ids_tensor(&Reference::load("qwen2-f32").prompt_ids(1));
    let lora = LoraBatch::uniform(&adapter);
    // B starts at zero, so a fresh adapter changes nothing.
    let base = tch::no_grad(|| model.forward(&ids, None, None).unwrap());
    let with = tch::no_grad(|| model.forward(&ids, None, Some(&lora)).unwrap());
    assert_eq!(max_abs_diff(&base, &with), 0.0);

    adapter.set_requires_grad(true);
    let params: Vec<Tensor> = adapter.named_tensors().into_iter().map(|(_, t)| t).collect();
    let first = nll(&model, &ids, Some(&lora));
    first.backward();
    for (name, t) in adapter.named_tensors() {
        let g = t.grad();
        assert!(g.defined(), "{name} has no gradient");
        let norm = g.norm().double_value(&[]);
        // dL/dA = 0 while B = 0; dL/dB is not.
        if name.contains("lora_B") {
            assert!(norm > 0.0, "{name}");
        } else {
            assert_eq!(norm, 0.0, "{name}");
        }
    }
    for (name, t) in model.named_parameters() {
        assert!(!t.grad().defined(), "frozen base weight {name} got a gradient");
    }
    sgd(&params, 0.5);
    let mut last = first.double_value(&[]);
    for _ in 0..5 {
        let loss = nll(&model, &ids, Some(&lora));
        loss.backward();
        sgd(&params, 0.5);
        last = loss.double_value(&[]);
    }
    assert!(last < first.double_value(&[]) - 0.05, "loss {} -> {last}", first.double_value(&[]));
}

#[test]
fn full_fine_tuning_reaches_every_weight_including_tied_embeddings() {
    let model = CausalLm::load(&model_dir("qwen3"), Kind::Float, Device::Cpu).unwrap();
    assert!(model.config().tie_word_embeddings);
    model.set_requires_grad(true);
    let ids = ids_tensor(&Reference::load("qwen3").prompt_ids(0));
    let params: Vec<(String, Tensor)> = model.named_parameters();
    let first = nll(&model, &ids, None);
    first.backward();
    for (name, t) in &params {
        assert!(t.grad().defined(), "{name} has no gradient");
    }
    let plist: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
    sgd(&plist, 1.0);
    let after = tch::no_grad(|| nll(&model, &ids, None)).double_value(&[]);
    assert!(after < first.double_value(&[]), "{} -> {after}", first.double_value(&[]));
}
