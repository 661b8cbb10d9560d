//! LoRA and bf16 training: only the adapter moves, the merged export equals base + adapter, and
//! bf16 weights train through f32 master copies.
use comas_learner::{experience::Experience, Finish, TrainConfig, Trainer};
use comas_model::tiny::{write_model, TinySpec};
use comas_model::{Architecture, CausalLm, LoraAdapter, LoraBatch};
use tch::{Device, Kind, Tensor};

fn batch() -> Vec<Experience> {
    (0..8)
        .map(|i| Experience {
            prompt_ids: vec![5 + i, 6, 7],
            completion_ids: vec![10 + i, 11, 12 + 2 * i],
            reward: Some((i % 2) as f64),
            token_rewards: None,
            finish_reason: Finish::Stop,
            group: String::new(),
            sampling_logprobs: None,
            episode_id: None,
            turn_id: None,
            policy_version: None,
            constrained: Vec::new(),
            temperature: None,
            norm_group: String::new(),
        })
        .collect()
}

#[test]
fn lora_training_moves_only_the_adapter_and_merges() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    write_model(&base, &TinySpec::tiny(Architecture::Qwen3)).unwrap();
    let cfg = TrainConfig::from_toml(
        "lr = 1e-2\nwarmup_ratio = 0.0\ntrain_batch_size = 8\nmicro_batch_size = 8\nkl_coef = 0.1\nkl_estimator = \"k3\"\nkl_in_loss = true\n[lora]\nr = 4\nalpha = 8.0\ntarget_modules = [\"q_proj\", \"v_proj\", \"up_proj\"]\n",
    )
    .unwrap();
    let mut t = Trainer::new(&base, cfg, None).unwrap();
    let before: Vec<Tensor> =
        t.model().named_parameters().into_iter().map(|(_, p)| p.detach().copy()).collect();
    for _ in 0..3 {
        t.train_step(&batch()).unwrap();
    }
    for ((n, p), b) in t.model().named_parameters().iter().zip(&before) {
        assert!(p.detach().equal(b), "base weight {n} moved");
    }
    let b_norm: f64 = t
        .adapter()
        .unwrap()
        .named_tensors()
        .iter()
        .filter(|(n, _)| n.contains("lora_B"))
        .map(|(_, x)| x.norm().double_value(&[]))
        .sum();
    assert!(b_norm > 0.0, "adapter B matrices must have moved from zero");
    // Adapter export in the PEFT layout, and a merged export that equals base + adapter.
    let adapter_dir = dir.path().join("adapter");
    let merged_dir = dir.path().join("merged");
    t.export(&adapter_dir, false).unwrap();
    t.export(&merged_dir, true).unwrap();
    let base_model = CausalLm::load(&base, Kind::Float, Device::Cpu).unwrap();
    let adapter =
        LoraAdapter::load(&adapter_dir, base_model.config(), Kind::Float, Device::Cpu).unwrap();
    let merged = CausalLm::load(&merged_dir, Kind::Float, Device::Cpu).unwrap();
    let ids = Tensor::from_slice(&[5i64, 6, 7, 10, 11, 12]).view([1, 6]);
    let a = tch::no_grad(|| {
        base_model.forward(&ids, None, Some(&LoraBatch::uniform(&adapter))).unwrap()
    });
    let m = tch::no_grad(|| merged.forward(&ids, None, None).unwrap());
    let d = (a - m).abs().max().double_value(&[]);
    assert!(d < 1e-5, "merged export differs from base + adapter by {d}");
}

#[test]
fn bf16_training_keeps_f32_master_weights() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), &TinySpec::tiny(Architecture::Qwen2)).unwrap();
    let cfg = TrainConfig {
        dtype: "bfloat16".into(),
        lr: 1e-3,
        warmup_ratio: 0.0,
        train_batch_size: 8,
        micro_batch_size: 4,
        ..Default::default()
    };
    let mut t = Trainer::new(dir.path(), cfg, None).unwrap();
    let w0 = t.model().named_parameters()[1].1.detach().copy();
    assert_eq!(w0.kind(), Kind::BFloat16);
    let report = t.train_step(&batch()).unwrap();
    assert!(report.loss.is_finite() && report.grad_norm > 0.0);
    let masters =
        t.optimizer().state_tensors().into_iter().filter(|(n, _)| n.starts_with("master.")).count();
    assert_eq!(
        masters,
        t.model().named_parameters().len(),
        "one f32 master copy per bf16 parameter"
    );
    let w1 = t.model().named_parameters()[1].1.detach();
    assert_eq!(w1.kind(), Kind::BFloat16);
    assert!(!w1.equal(&w0), "bf16 weights must be updated from the master copy");
}

/// Many adapters over one base in one process (spec neuromas.md §4): two LoRA trainers take
/// their base from one `Bases` without a copy, training one leaves the base and the other
/// adapter as they were, and its update is bit for bit that of a trainer with a base of its own.
#[test]
fn lora_trainers_of_one_process_share_the_base_and_train_apart() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    write_model(&base, &TinySpec::tiny(Architecture::Qwen2)).unwrap();
    let cfg = |seed: u64| {
        TrainConfig::from_toml(&format!(
            "lr = 1e-2\nwarmup_ratio = 0.0\ntrain_batch_size = 8\nmicro_batch_size = 4\nseed = {seed}\n[lora]\nr = 4\nalpha = 8.0\ntarget_modules = [\"q_proj\", \"v_proj\"]\n"
        ))
        .unwrap()
    };
    let mut bases = comas_learner::trainer::Bases::default();
    let mut a = Trainer::in_process(&mut bases, &base, cfg(1), None, None).unwrap();
    let b = Trainer::in_process(&mut bases, &base, cfg(2), None, None).unwrap();
    assert_eq!(bases.len(), 1);
    for ((n, x), (_, y)) in a.model().named_parameters().iter().zip(b.model().named_parameters()) {
        assert_eq!(x.data_ptr(), y.data_ptr(), "{n} is held twice");
    }
    let snapshot = |t: &Trainer| {
        t.adapter()
            .unwrap()
            .named_tensors()
            .into_iter()
            .map(|(n, x)| (n, x.detach().copy()))
            .collect::<Vec<_>>()
    };
    let base_before: Vec<Tensor> =
        a.model().named_parameters().into_iter().map(|(_, p)| p.detach().copy()).collect();
    let b_before = snapshot(&b);
    let mut alone = Trainer::new(&base, cfg(1), None).unwrap();
    for _ in 0..2 {
        a.train_step(&batch()).unwrap();
        alone.train_step(&batch()).unwrap();
    }
    for ((n, x), y) in a.model().named_parameters().iter().zip(&base_before) {
        assert!(x.equal(y), "base weight {n} moved");
    }
    for ((n, x), (_, y)) in snapshot(&b).iter().zip(&b_before) {
        assert!(x.equal(y), "the other adapter's {n} moved");
    }
    for ((n, x), (_, y)) in snapshot(&a).iter().zip(snapshot(&alone)) {
        assert!(x.equal(&y), "{n}: the shared-base update differs from the one with its own base");
    }
}

/// The step report's probes of §5's per-node logging: the first completion token's entropy
/// under the weights the step started from, and ‖scale·B·A‖ of the adapter after it, both
/// recomputed here the long way (a forward per prompt; the full B·A products).
#[test]
fn the_report_gives_the_first_token_entropy_and_the_adapter_norm() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    write_model(&base, &TinySpec::tiny(Architecture::Qwen2)).unwrap();
    let cfg = TrainConfig::from_toml(
        "lr = 1e-2\nwarmup_ratio = 0.0\ntrain_batch_size = 8\nmicro_batch_size = 3\n[lora]\nr = 4\nalpha = 8.0\ntarget_modules = [\"q_proj\", \"v_proj\"]\n",
    )
    .unwrap();
    let mut t = Trainer::new(&base, cfg, None).unwrap();
    // One step from an adapter whose B is not zero, so the adapter shows in the entropies.
    t.train_step(&batch()).unwrap();
    t.export(&dir.path().join("before"), false).unwrap();
    let r = t.train_step(&batch()).unwrap();
    let model = CausalLm::load(&base, Kind::Float, Device::Cpu).unwrap();
    let before =
        LoraAdapter::load(&dir.path().join("before"), model.config(), Kind::Float, Device::Cpu)
            .unwrap();
    let mut sum = 0.0;
    for e in batch() {
        let ids = Tensor::from_slice(&e.prompt_ids).view([1, -1]);
        let logits =
            tch::no_grad(|| model.forward(&ids, None, Some(&LoraBatch::uniform(&before))).unwrap());
        let lsm = logits.get(0).get(e.prompt_ids.len() as i64 - 1).log_softmax(-1, Kind::Float);
        sum += -(lsm.exp() * &lsm).sum(Kind::Float).double_value(&[]);
    }
    let want = sum / 8.0;
    assert!(
        (r.first_token_entropy - want).abs() < 1e-5,
        "first-token entropy {} against {want}",
        r.first_token_entropy
    );
    let a = t.adapter().unwrap();
    let sq: f64 = a
        .pairs()
        .map(|(_, (la, lb))| {
            (lb.matmul(la) * a.scale()).pow_tensor_scalar(2).sum(Kind::Float).double_value(&[])
        })
        .sum();
    let got = r.adapter_norm.unwrap();
    assert!(
        got > 0.0 && (got - sq.sqrt()).abs() < 1e-6 * sq.sqrt(),
        "adapter norm {got} against {}",
        sq.sqrt()
    );
}

/// Truncated importance sampling: each token's policy-gradient term is weighted by
/// min(exp(ℓ^old − ℓ^sampler), cap). Samples whose sampler log-probs are far below the learner's
/// have every weight at the cap: cap 1 trains exactly as without weights, and cap 0.5 halves
/// the gradient (an exact scaling in floating point).
#[test]
fn truncated_importance_weights_scale_each_tokens_gradient() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    write_model(&base, &TinySpec::tiny(Architecture::Qwen2)).unwrap();
    let cfg = |cap: f64| {
        TrainConfig::from_toml(&format!("lr = 1e-2\nwarmup_ratio = 0.0\ntrain_batch_size = 8\nmicro_batch_size = 4\nkl_coef = 0.0\ntis_cap = {cap}\n")).unwrap()
    };
    let far: Vec<Experience> = batch()
        .into_iter()
        .map(|e| Experience { sampling_logprobs: Some(vec![-100.0; e.completion_ids.len()]), ..e })
        .collect();
    let run = |cap: f64| {
        let mut t = Trainer::new(&base, cfg(cap), None).unwrap();
        let r = t.train_step(&far).unwrap();
        (
            r,
            t.model()
                .named_parameters()
                .into_iter()
                .map(|(_, p)| p.detach().copy())
                .collect::<Vec<_>>(),
        )
    };
    let (plain, plain_w) = run(0.0);
    let (one, one_w) = run(1.0);
    let (half, _) = run(0.5);
    assert_eq!(plain.tis_weight_mean, None);
    assert_eq!((one.tis_weight_mean, one.tis_truncated_frac), (Some(1.0), Some(1.0)));
    assert_eq!(one.grad_norm, plain.grad_norm);
    assert!(one_w.iter().zip(&plain_w).all(|(a, b)| a.equal(b)), "weights of 1 changed the update");
    assert_eq!((half.tis_weight_mean, half.tis_truncated_frac), (Some(0.5), Some(1.0)));
    assert!(
        (half.grad_norm - plain.grad_norm / 2.0).abs() <= 1e-6 * plain.grad_norm,
        "{} against {}",
        half.grad_norm,
        plain.grad_norm
    );
    // With ℓ^old taken from the sampler there is nothing to weigh.
    let e = TrainConfig::from_toml("tis_cap = 2.0\nold_logprobs = \"sampler\"\n")
        .and_then(|c| c.validate().map(|()| c))
        .unwrap_err();
    assert!(e.to_string().contains("old_logprobs = \"recompute\""), "{e}");
}

/// Log-probability of each token of `ids` given the ones before it.
fn logprobs(model: &CausalLm, adapter: Option<&LoraAdapter>, ids: &[i64]) -> Vec<f64> {
    let x = Tensor::from_slice(ids).view([1, ids.len() as i64]);
    let batch = adapter.map(LoraBatch::uniform);
    let logits = tch::no_grad(|| model.forward(&x, None, batch.as_ref()).unwrap());
    let n = ids.len() as i64;
    let next = Tensor::from_slice(&ids[1..]).view([n - 1, 1]);
    let lp = logits.get(0).narrow(0, 0, n - 1).log_softmax(-1, Kind::Float).gather(1, &next, false);
    Vec::<f64>::try_from(lp.view([n - 1]).to_kind(Kind::Double)).unwrap()
}

/// An adapter comas trained and exported loads in PyPI `peft` over the same base in
/// `transformers`, and gives the log-probabilities comas gives, for every architecture comas
/// reads (issue 46 §5: a client comas did not write). The reference environment is
/// `tests/fixtures/setup-ref.sh`'s (scripts/test.sh installs it).
#[test]
fn an_exported_adapter_loads_in_peft_with_the_log_probs_comas_gives() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv-ref/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `bash tests/fixtures/setup-ref.sh` (scripts/test.sh does)",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let ids = [5i64, 6, 7, 10, 11, 12, 300, 41, 7, 499];
    let mut args = vec![ids.map(|t| t.to_string()).join(",")];
    let mut ours = Vec::new();
    for arch in [Architecture::Qwen2, Architecture::Qwen3, Architecture::Llama] {
        let base = dir.path().join(format!("{arch:?}-base"));
        let adapter_dir = dir.path().join(format!("{arch:?}-adapter"));
        write_model(&base, &TinySpec::tiny(arch)).unwrap();
        // Every projection, rank-stabilised: the adapter's whole layout and its scaling.
        let cfg = TrainConfig::from_toml(
            "lr = 5e-2\nwarmup_ratio = 0.0\ntrain_batch_size = 8\nmicro_batch_size = 8\n[lora]\nr = 4\nalpha = 8.0\nuse_rslora = true\ntarget_modules = [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]\n",
        )
        .unwrap();
        let mut t = Trainer::new(&base, cfg, None).unwrap();
        for _ in 0..3 {
            t.train_step(&batch()).unwrap();
        }
        t.export(&adapter_dir, false).unwrap();
        // The trainer's own weights, so a fault of the export shows too.
        let (model, adapter) = (t.model(), t.adapter());
        ours.push((arch, logprobs(model, adapter, &ids), logprobs(model, None, &ids)));
        args.push(base.display().to_string());
        args.push(adapter_dir.display().to_string());
    }
    let out = std::process::Command::new(&python)
        .arg(root.join("tests/fixtures/peft_logprobs.py"))
        .args(&args)
        .output()
        .unwrap();
    assert!(out.status.success(), "peft_logprobs.py: {}", String::from_utf8_lossy(&out.stderr));
    let theirs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(theirs.len(), ours.len());
    for ((arch, with, without), t) in ours.iter().zip(&theirs) {
        let read = |key: &str| -> Vec<f64> {
            t[key].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
        };
        let gap = |a: &[f64], b: &[f64]| {
            assert_eq!(a.len(), b.len());
            a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
        };
        let (peft_with, peft_without) = (read("with"), read("without"));
        assert!(gap(without, &peft_without) < 2e-5, "{arch:?}: the bases differ");
        // The adapter must matter, or a peft that loaded none of it would pass.
        let moved = gap(with, without);
        assert!(moved > 1e-3, "{arch:?}: the adapter moves log-probs by only {moved}");
        let d = gap(with, &peft_with);
        assert!(d < 2e-5, "{arch:?}: peft's log-probs differ from comas's by {d} ({moved} moved)");
    }
}
