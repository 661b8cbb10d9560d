//! Builds small random models in the Hugging Face layout, for the demo, tests and benchmarks.
//! They use the byte-level BPE tokenizer committed under tests/fixtures (ChatML special tokens).
use crate::config::{Architecture, Config};
use crate::dtype::kind_name;
use crate::error::{ModelError, Result};
use crate::lora::Proj;
use crate::safetensors::{self, write_atomic};
use crate::seeded::with_torch_seed;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use tch::{Device, Kind, Tensor};

const TOKENIZER_JSON: &str = include_str!("../../tests/fixtures/tokenizers/chatml/tokenizer.json");
const TOKENIZER_CONFIG: &str =
    include_str!("../../tests/fixtures/tokenizers/chatml/tokenizer_config.json");
/// `<|endoftext|>` and `<|im_end|>` in the committed tokenizer.
pub const ENDOFTEXT_ID: i64 = 420;
pub const IM_END_ID: i64 = 422;

#[derive(Debug, Clone)]
pub struct TinySpec {
    pub architecture: Architecture,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: Option<i64>,
    pub tie_word_embeddings: bool,
    pub dtype: Kind,
    pub seed: i64,
    /// Standard deviation of the random weights.
    pub init_std: f64,
}

impl TinySpec {
    /// About 0.2M parameters: fast enough for unit tests on any machine.
    pub fn tiny(architecture: Architecture) -> Self {
        Self {
            architecture,
            vocab_size: 512,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: None,
            tie_word_embeddings: false,
            dtype: Kind::Float,
            seed: 0,
            init_std: 0.02,
        }
    }

    /// About 40M parameters (Qwen2-shaped, 32k vocabulary, tied embeddings): the benchmark model.
    pub fn bench() -> Self {
        Self {
            architecture: Architecture::Qwen2,
            vocab_size: 32000,
            hidden_size: 512,
            intermediate_size: 1408,
            num_hidden_layers: 8,
            num_attention_heads: 8,
            num_key_value_heads: 4,
            head_dim: None,
            tie_word_embeddings: true,
            dtype: Kind::Float,
            seed: 0,
            init_std: 0.02,
        }
    }

    pub fn config_json(&self) -> serde_json::Value {
        let (model_type, arch_name) = match self.architecture {
            Architecture::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
            Architecture::Qwen3 => ("qwen3", "Qwen3ForCausalLM"),
            Architecture::Llama => ("llama", "LlamaForCausalLM"),
        };
        let mut c = serde_json::json!({
            "architectures": [arch_name],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "hidden_act": "silu",
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": kind_name(self.dtype),
            "bos_token_id": ENDOFTEXT_ID,
            "eos_token_id": IM_END_ID,
            "use_cache": true,
        });
        // A vocabulary too small for the tokenizer's special tokens has none of them.
        for (key, id) in [("bos_token_id", ENDOFTEXT_ID), ("eos_token_id", IM_END_ID)] {
            if id >= self.vocab_size {
                c.as_object_mut().expect("an object").remove(key);
            }
        }
        // Always written: readers differ on its default (transformers' Qwen3 takes 128).
        c["head_dim"] = self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads).into();
        if self.architecture == Architecture::Qwen2 {
            c["use_sliding_window"] = false.into();
        }
        c
    }
}

/// Names and shapes of every tensor a checkpoint for `cfg` holds, in a stable order.
pub fn parameter_shapes(cfg: &Config) -> Vec<(String, Vec<i64>)> {
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        for proj in Proj::ALL {
            let (fan_in, fan_out) = proj.dims(cfg);
            let path = format!("{p}.{}", proj.module_path());
            out.push((format!("{path}.weight"), vec![fan_out, fan_in]));
            let bias = match proj {
                Proj::Q | Proj::K | Proj::V => cfg.qkv_bias,
                Proj::O => cfg.o_bias,
                _ => cfg.mlp_bias,
            };
            if bias {
                out.push((format!("{path}.bias"), vec![fan_out]));
            }
        }
        if cfg.qk_norm {
            out.push((format!("{p}.self_attn.q_norm.weight"), vec![cfg.head_dim]));
            out.push((format!("{p}.self_attn.k_norm.weight"), vec![cfg.head_dim]));
        }
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    out
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    write_atomic(path, |w| w.write_all(text.as_bytes()))
}

/// Writes a complete model folder (config, weights, tokenizer, generation config) to `dir`.
pub fn write_model(dir: &Path, spec: &TinySpec) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let config_json = spec.config_json();
    let cfg = Config::from_json_str(&config_json.to_string())?;
    let tensors: Vec<(String, Tensor)> = with_torch_seed(spec.seed, || {
        parameter_shapes(&cfg)
            .into_iter()
            .map(|(name, shape)| {
                let t = if name.ends_with("norm.weight") {
                    // Norm weights near one, but not exactly, so a missing norm shows up in parity tests.
                    Tensor::randn(&shape, (Kind::Float, Device::Cpu)) * 0.1 + 1.0
                } else {
                    Tensor::randn(&shape, (Kind::Float, Device::Cpu)) * spec.init_std
                };
                (name, t.to_kind(spec.dtype))
            })
            .collect()
    });
    safetensors::write(&dir.join("model.safetensors"), &tensors, &BTreeMap::new())?;
    write_text(
        &dir.join("config.json"),
        &serde_json::to_string_pretty(&config_json).expect("json"),
    )?;
    let gen = serde_json::json!({"bos_token_id": ENDOFTEXT_ID, "eos_token_id": [IM_END_ID, ENDOFTEXT_ID], "pad_token_id": ENDOFTEXT_ID});
    write_text(
        &dir.join("generation_config.json"),
        &serde_json::to_string_pretty(&gen).expect("json"),
    )?;
    write_text(&dir.join("tokenizer.json"), TOKENIZER_JSON)?;
    write_text(&dir.join("tokenizer_config.json"), TOKENIZER_CONFIG)?;
    Ok(())
}
