//! Update parity with the PyTorch reference of tests/fixtures/learner (ref_step.py, written from
//! rl.md): the same batch and config give the same updated weights after one global step.
use comas_learner::{experience, TrainConfig, Trainer};
use comas_model::safetensors::SafeTensorsFile;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The committed fixtures: COMAS_FIXTURES where a carried test binary runs in another tree
/// (scripts/gpu-check.sh), else this repository's.
fn fixtures() -> PathBuf {
    std::env::var_os("COMAS_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("tests/fixtures"))
}

fn run_case(name: &str) {
    let learner = fixtures().join("learner");
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(learner.join("cases.json")).unwrap())
            .unwrap();
    let case = &cases[name];
    let dir = learner.join(name);
    let mut cfg = TrainConfig::from_file(&dir.join("config.toml")).unwrap();
    // COMAS_TEST_DEVICE (`cuda`) trains on that device; the expected weights are the CPU's.
    if let Ok(device) = std::env::var("COMAS_TEST_DEVICE") {
        cfg.device = device;
    }
    let batch = experience::read_jsonl(&dir.join("batch.jsonl")).unwrap();
    // Case paths are relative to the repository root (`tests/fixtures/models/...`).
    let in_fixtures = |p: &str| fixtures().join(p.trim_start_matches("tests/fixtures/"));
    let model = in_fixtures(case["model"].as_str().unwrap());
    let reference = case["ref_model"].as_str().map(in_fixtures);
    let mut t = Trainer::with_reference(&model, cfg, None, reference.as_deref()).unwrap();
    let report = t.train_step(&batch).unwrap();
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected/report.json")).unwrap())
            .unwrap();
    let close = |what: &str, a: f64, b: f64, tol: f64| {
        assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{name} {what}: {a} vs {b}")
    };
    close("lr", report.lr, want["lr"].as_f64().unwrap(), 1e-9);
    close("grad_norm", report.grad_norm, want["grad_norm"].as_f64().unwrap(), 1e-4);
    close("loss", report.loss, want["loss"].as_f64().unwrap(), 1e-5);
    close("kl", report.kl, want["kl"].as_f64().unwrap(), 1e-5);
    assert_eq!(report.optimizer_steps, want["optimizer_steps"].as_u64().unwrap());
    assert_eq!(report.singleton_groups as u64, want["singleton_groups"].as_u64().unwrap());

    let expected = SafeTensorsFile::open(&dir.join("expected/model.safetensors")).unwrap();
    let params = t.model().named_parameters();
    assert_eq!(params.len(), expected.names().count(), "{name}: tensor count");
    let mut worst: f64 = 0.0;
    let mut moved: f64 = 0.0;
    let before = comas_model::CausalLm::load(&model, tch::Kind::Float, tch::Device::Cpu)
        .unwrap()
        .named_parameters();
    for ((n, p), (_, p0)) in params.iter().zip(&before) {
        let e = expected.tensor(n).unwrap();
        let p = p.detach().to_device(tch::Device::Cpu);
        worst = worst.max((&p - &e).abs().max().double_value(&[]));
        moved = moved.max((&p - p0).abs().max().double_value(&[]));
    }
    eprintln!("{name}: max |w_rust - w_torch| = {worst:e} (largest update {moved:e})");
    assert!(moved > 5e-4, "{name}: the step must move the weights visibly");
    assert!(worst <= 1e-5, "{name}: updated weights differ by {worst:e}");
}

#[test]
fn reinforce_with_kl_in_reward_matches_pytorch() {
    run_case("reinforce_kl_reward");
}

#[test]
fn group_norm_with_k3_kl_in_loss_matches_pytorch() {
    run_case("group_norm_k3_loss");
}

#[test]
fn tied_embeddings_two_optimizer_steps_match_pytorch() {
    run_case("reinforce_tied_two_steps");
}

/// The one-shot mode of the binary gives the same update as the library.
#[test]
fn one_shot_step_binary_matches_pytorch() {
    let fixtures = root().join("tests/fixtures/learner");
    let dir = fixtures.join("group_norm_k3_loss");
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_comas-learner"))
        .args(["step", "--model"])
        .arg(root().join("tests/fixtures/models/qwen2-f32"))
        .arg("--reference-model")
        .arg(root().join("tests/fixtures/models/qwen2-sharded"))
        .arg("--batch")
        .arg(dir.join("batch.jsonl"))
        .arg("--config")
        .arg(dir.join("config.toml"))
        .arg("--out")
        .arg(out.path())
        .env("COMAS_THREADS", "1")
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report["global_step"], 1);
    let got = SafeTensorsFile::open(&out.path().join("model.safetensors")).unwrap();
    let want = SafeTensorsFile::open(&dir.join("expected/model.safetensors")).unwrap();
    for n in want.names() {
        let d = (got.tensor(n).unwrap() - want.tensor(n).unwrap()).abs().max().double_value(&[]);
        assert!(d <= 1e-5, "{n}: {d:e}");
    }
    // The output folder is a complete model.
    comas_model::CausalLm::load(out.path(), tch::Kind::Float, tch::Device::Cpu).unwrap();
    comas_model::Tokenizer::from_dir(out.path()).unwrap();
}

#[test]
fn shuffled_two_epochs_match_pytorch() {
    run_case("reinforce_shuffled");
}

#[test]
fn microbatch_mean_over_uneven_micro_batches_matches_pytorch() {
    run_case("microbatch_mean_two_steps");
}

#[test]
fn seq_mean_with_k2_kl_in_loss_matches_pytorch() {
    run_case("seq_mean_kl_loss");
}
