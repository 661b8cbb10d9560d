//! Loading errors: each names what is wrong and what to fix, and nothing panics.
mod common;

use comas_model::safetensors::{self, SafeTensorsFile};
use comas_model::{CausalLm, LoraAdapter, ModelError, Tokenizer};
use common::*;
use std::collections::BTreeMap;
use std::path::Path;
use tch::{Device, Kind};

fn copy_model(name: &str, to: &Path) {
    for entry in std::fs::read_dir(model_dir(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}

fn load_err(dir: &Path) -> String {
    match CausalLm::load(dir, Kind::Float, Device::Cpu) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// Rewrites model.safetensors with `edit` applied to the tensor list.
fn edit_weights(dir: &Path, edit: impl FnOnce(&mut Vec<(String, tch::Tensor)>)) {
    let path = dir.join("model.safetensors");
    let f = SafeTensorsFile::open(&path).unwrap();
    let mut tensors: Vec<(String, tch::Tensor)> =
        f.names().map(|n| (n.to_string(), f.tensor(n).unwrap())).collect();
    drop(f);
    edit(&mut tensors);
    safetensors::write(&path, &tensors, &BTreeMap::new()).unwrap();
}

#[test]
fn missing_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    copy_model("qwen2-f32", dir.path());
    edit_weights(dir.path(), |t| t.retain(|(n, _)| n != "model.layers.1.mlp.up_proj.weight"));
    let err = load_err(dir.path());
    assert!(
        err.contains("`model.layers.1.mlp.up_proj.weight` is missing") && err.contains("[128, 64]"),
        "{err}"
    );
}

#[test]
fn shape_mismatch_names_tensor_and_shapes() {
    let dir = tempfile::tempdir().unwrap();
    copy_model("qwen2-f32", dir.path());
    edit_weights(dir.path(), |t| {
        for (n, x) in t.iter_mut() {
            if n == "model.layers.0.self_attn.k_proj.weight" {
                *x = x.narrow(0, 0, 16).contiguous();
            }
        }
    });
    let err = load_err(dir.path());
    assert!(
        err.contains("model.layers.0.self_attn.k_proj.weight")
            && err.contains("[16, 64]")
            && err.contains("[32, 64]"),
        "{err}"
    );
}

#[test]
fn untied_model_without_lm_head_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    copy_model("qwen2-f32", dir.path());
    edit_weights(dir.path(), |t| t.retain(|(n, _)| n != "lm_head.weight"));
    assert!(load_err(dir.path()).contains("`lm_head.weight` is missing"));
}

#[test]
fn missing_shard_and_missing_weights_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    copy_model("qwen2-sharded", dir.path());
    std::fs::remove_file(dir.path().join("model-00002-of-00003.safetensors")).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("model-00002-of-00003.safetensors") && err.contains("missing"), "{err}");

    let empty = tempfile::tempdir().unwrap();
    std::fs::copy(model_dir("qwen2-f32").join("config.json"), empty.path().join("config.json"))
        .unwrap();
    assert!(load_err(empty.path()).contains("no model.safetensors"));
    assert!(load_err(Path::new("/nonexistent/model")).contains("config.json"));
}

#[test]
fn bad_config_and_corrupt_file_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    copy_model("qwen2-f32", dir.path());
    std::fs::write(dir.path().join("config.json"), "{\"model_type\": \"qwen2\"").unwrap();
    assert!(load_err(dir.path()).contains("invalid JSON"));

    copy_model("qwen2-f32", dir.path());
    let w = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("model.safetensors") && err.contains("a truncated file?"), "{err}");
}

#[test]
fn out_of_vocabulary_ids_are_rejected() {
    let model = CausalLm::load(&model_dir("qwen2-f32"), Kind::Float, Device::Cpu).unwrap();
    let err = model.forward(&ids_tensor(&[1, 2, 512]), None, None).err().unwrap();
    assert!(matches!(err, ModelError::Input(_)) && err.to_string().contains("512"), "{err}");
}

#[test]
fn tokenizer_mismatch_is_detected() {
    // The llama3 tokenizer (425 entries) fits a 512-row embedding; shrink the config to 400.
    let dir = tempfile::tempdir().unwrap();
    copy_model("llama3-gqa", dir.path());
    let cfg_path = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["vocab_size"] = 400.into();
    // Its special tokens (420, 421) would be refused first, as outside the vocabulary.
    for key in ["bos_token_id", "eos_token_id"] {
        cfg.as_object_mut().unwrap().remove(key);
    }
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let c = comas_model::Config::from_file(&cfg_path).unwrap();
    let err = tok.check_fits(&c).unwrap_err().to_string();
    assert!(err.contains("425") && err.contains("400"), "{err}");
}

#[test]
fn config_values_that_break_the_model_are_refused_at_load() {
    for (key, value, want) in [
        ("rms_norm_eps", serde_json::json!(-1.0), "`rms_norm_eps` must be positive"),
        ("rms_norm_eps", serde_json::json!(0), "`rms_norm_eps` must be positive"),
        ("eos_token_id", serde_json::json!(99999), "`eos_token_id` 99999 is outside"),
        ("bos_token_id", serde_json::json!(-1), "`bos_token_id` -1 is outside"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        copy_model("qwen2-f32", dir.path());
        let cfg_path = dir.path().join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        cfg[key] = value;
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let err = load_err(dir.path());
        assert!(err.contains("config.json") && err.contains(want), "{key}: {err}");
    }
}

#[test]
fn a_stop_token_outside_the_vocabulary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    copy_model("qwen2-f32", dir.path());
    let gen = serde_json::json!({"eos_token_id": [422, 99999]});
    std::fs::write(dir.path().join("generation_config.json"), gen.to_string()).unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let c = comas_model::Config::from_file(&dir.path().join("config.json")).unwrap();
    let err = tok.check_fits(&c).unwrap_err().to_string();
    assert!(err.contains("99999") && err.contains("generation_config.json"), "{err}");
}

#[test]
fn lora_adapter_for_another_shape_is_rejected() {
    let qwen3 = comas_model::Config::from_file(&model_dir("qwen3").join("config.json")).unwrap();
    let err = LoraAdapter::load(&model_dir("qwen2-f32-lora"), &qwen3, Kind::Float, Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("q_proj.lora_B.weight") || err.contains("q_proj.lora_A.weight"), "{err}");
}

/// The submit-time memory estimate counts parameters from config.json alone; on every fixture
/// it agrees with the loaded model's tensors, element for element.
#[test]
fn the_memory_estimate_counts_exactly_the_parameters_that_load() {
    for name in ["llama3-gqa", "qwen2-f32", "qwen2-tied-bf16", "qwen3", "qwen2-sharded"] {
        let dir = model_dir(name);
        let dims = comas_workflow::memory::ModelDims::from_config_json(
            &std::fs::read_to_string(dir.join("config.json")).unwrap(),
        )
        .unwrap();
        let m = CausalLm::load(&dir, tch::Kind::Float, tch::Device::Cpu).unwrap();
        let loaded: i64 = m.named_parameters().iter().map(|(_, t)| t.numel() as i64).sum();
        assert_eq!(dims.parameters() as i64, loaded, "{name}");
        assert_eq!(m.config().num_parameters(), loaded, "{name}");
    }
}
