//! What a GGUF architecture means in Hugging Face terms: `config.json` from the `{arch}.*`
//! keys, llama.cpp tensor names to HF names, and the rotary permutation llama.cpp's converter
//! applies to the Q and K projections of `llama` models.
use crate::error::{GgufError, Result};
use crate::reader::GgufFile;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
}

impl Arch {
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            other => Err(GgufError::Unsupported(format!(
                "general.architecture `{other}` is not supported; supported: llama, qwen2, qwen3"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }

    fn hf_class(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
        }
    }
}

/// Llama-3.1-style rope scaling, which GGUF stores only as a `rope_freqs.weight` tensor.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Llama3Rope {
    pub rope_type: &'static str,
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(untagged)]
pub enum RopeScaling {
    Linear { rope_type: &'static str, factor: f64 },
    Llama3(Llama3Rope),
}

/// The `config.json` the import writes; field names are the HF keys.
#[derive(Debug, Clone, Serialize)]
pub struct HfConfig {
    pub architectures: Vec<&'static str>,
    pub model_type: &'static str,
    pub vocab_size: u64,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    pub num_key_value_heads: u64,
    pub head_dim: u64,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: u64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub hidden_act: &'static str,
    pub tie_word_embeddings: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    pub torch_dtype: &'static str,
    pub bos_token_id: Option<u64>,
    pub eos_token_id: Option<u64>,
    pub pad_token_id: Option<u64>,
}

impl HfConfig {
    /// Reads the architecture's hyperparameters. `vocab_size` is the embedding's row count.
    pub fn from_gguf(
        g: &GgufFile,
        arch: Arch,
        vocab_size: u64,
        tied: bool,
        torch_dtype: &'static str,
    ) -> Result<Self> {
        let a = arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let hidden = g.require_u64(&key("embedding_length"))?;
        let heads = g.require_u64(&key("attention.head_count"))?;
        if heads == 0 || hidden % heads != 0 && g.get(&key("attention.key_length")).is_none() {
            return Err(GgufError::meta(
                &key("attention.head_count"),
                format!("{heads} heads do not divide the hidden size {hidden}"),
            ));
        }
        let kv_heads = g.get_u64(&key("attention.head_count_kv"))?.unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(GgufError::meta(
                &key("attention.head_count_kv"),
                format!("{kv_heads} kv heads do not divide {heads} heads"),
            ));
        }
        let head_dim = g.get_u64(&key("attention.key_length"))?.unwrap_or(hidden / heads);
        if let Some(v) = g.get_u64(&key("attention.value_length"))? {
            if v != head_dim {
                return Err(GgufError::Unsupported(format!(
                    "{a}.attention.value_length {v} differs from key_length {head_dim}"
                )));
            }
        }
        let rope_theta = g.get_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let rope_scaling = match g.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => None,
            Some("linear") => Some(RopeScaling::Linear {
                rope_type: "linear",
                factor: g
                    .get_f64(&key("rope.scaling.factor"))?
                    .ok_or_else(|| GgufError::meta(&key("rope.scaling.factor"), "is missing"))?,
            }),
            Some(other) => {
                return Err(GgufError::Unsupported(format!(
                    "{a}.rope.scaling.type `{other}` is not supported (none, linear)"
                )))
            }
        };
        let token = |k: &str| g.get_u64(&format!("tokenizer.ggml.{k}"));
        Ok(Self {
            architectures: vec![arch.hf_class()],
            model_type: arch.name(),
            vocab_size,
            hidden_size: hidden,
            intermediate_size: g.require_u64(&key("feed_forward_length"))?,
            num_hidden_layers: g.require_u64(&key("block_count"))?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps: g.get_f64(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
            max_position_embeddings: g.get_u64(&key("context_length"))?.unwrap_or(4096),
            rope_theta,
            rope_scaling,
            hidden_act: "silu",
            tie_word_embeddings: tied,
            attention_bias: (arch == Arch::Llama).then_some(false),
            torch_dtype,
            bos_token_id: token("bos_token_id")?,
            eos_token_id: token("eos_token_id")?,
            pad_token_id: token("padding_token_id")?,
        })
    }

    /// Recognises the frequency factors llama.cpp's converter bakes into `rope_freqs.weight`
    /// from Llama 3.1's scaling parameters, and restores those parameters.
    pub fn set_llama3_rope(
        &mut self,
        factors: &[f32],
        original_context: Option<u64>,
    ) -> Result<()> {
        let half = (self.head_dim / 2) as usize;
        if factors.len() != half {
            return Err(GgufError::Tensor {
                tensor: "rope_freqs.weight".into(),
                message: format!("has {} values, expected head_dim/2 = {half}", factors.len()),
            });
        }
        let factor = factors.iter().cloned().fold(1.0f32, f32::max) as f64;
        let rope = Llama3Rope {
            rope_type: "llama3",
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: original_context.unwrap_or(8192),
        };
        let expected = llama3_factors(&rope, self.rope_theta, self.head_dim);
        let worst =
            expected.iter().zip(factors).map(|(e, &f)| (e - f as f64).abs()).fold(0.0, f64::max);
        if worst > 1e-4 {
            return Err(GgufError::Unsupported(format!(
                "rope_freqs.weight does not match Llama 3.1 scaling (factor {factor}, low 1, high 4, original context {}): off by {worst:.2e}; other frequency schemes are not supported",
                rope.original_max_position_embeddings
            )));
        }
        self.rope_scaling = Some(RopeScaling::Llama3(rope));
        Ok(())
    }
}

/// The per-frequency divisors Llama 3.1 scaling applies (llama.cpp's `rope_freqs`).
fn llama3_factors(r: &Llama3Rope, theta: f64, head_dim: u64) -> Vec<f64> {
    let old = r.original_max_position_embeddings as f64;
    let (low_wavelen, high_wavelen) = (old / r.low_freq_factor, old / r.high_freq_factor);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                r.factor
            } else {
                let smooth =
                    (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
                1.0 / ((1.0 - smooth) / r.factor + smooth)
            }
        })
        .collect()
}

/// What an imported tensor becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapped {
    /// An HF tensor; `unpermute_heads` is set for Q/K rows that llama.cpp permuted.
    Tensor { hf_name: String, unpermute_heads: Option<u64> },
    /// Llama 3.1 rope factors: configuration, not weights.
    RopeFreqs,
}

/// Maps a llama.cpp tensor name to its HF name.
pub fn map_name(name: &str, arch: Arch, cfg: &HfConfig) -> Result<Mapped> {
    let unknown = || {
        GgufError::Tensor {
        tensor: name.to_string(),
        message: format!("is not a tensor of a `{}` model; the file may be of another architecture or a newer variant", arch.name()),
    }
    };
    let fixed = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        "rope_freqs.weight" if arch == Arch::Llama => return Ok(Mapped::RopeFreqs),
        _ => None,
    };
    if let Some(hf) = fixed {
        return Ok(Mapped::Tensor { hf_name: hf.into(), unpermute_heads: None });
    }
    let rest = name.strip_prefix("blk.").ok_or_else(unknown)?;
    let (layer, part) = rest.split_once('.').ok_or_else(unknown)?;
    let layer: u64 = layer.parse().map_err(|_| unknown())?;
    if layer >= cfg.num_hidden_layers {
        return Err(GgufError::Tensor {
            tensor: name.into(),
            message: format!("layer {layer} is beyond block_count {}", cfg.num_hidden_layers),
        });
    }
    let (module, suffix) = part.rsplit_once('.').ok_or_else(unknown)?;
    if suffix != "weight" && suffix != "bias" {
        return Err(unknown());
    }
    let hf_module = match (module, arch) {
        ("attn_norm", _) => "input_layernorm",
        ("ffn_norm", _) => "post_attention_layernorm",
        ("attn_q", _) => "self_attn.q_proj",
        ("attn_k", _) => "self_attn.k_proj",
        ("attn_v", _) => "self_attn.v_proj",
        ("attn_output", _) => "self_attn.o_proj",
        ("attn_q_norm", Arch::Qwen3) => "self_attn.q_norm",
        ("attn_k_norm", Arch::Qwen3) => "self_attn.k_norm",
        ("ffn_gate", _) => "mlp.gate_proj",
        ("ffn_up", _) => "mlp.up_proj",
        ("ffn_down", _) => "mlp.down_proj",
        _ => return Err(unknown()),
    };
    let unpermute_heads = match (arch, module) {
        (Arch::Llama, "attn_q") => Some(cfg.num_attention_heads),
        (Arch::Llama, "attn_k") => Some(cfg.num_key_value_heads),
        _ => None,
    };
    Ok(Mapped::Tensor {
        hf_name: format!("model.layers.{layer}.{hf_module}.{suffix}"),
        unpermute_heads,
    })
}

/// Undoes llama.cpp's `permute` of a Q or K projection: within each head the converter
/// interleaved the two rotary halves (rows `j` and `j + d/2` became `2j` and `2j + 1`).
/// `values` is row-major `[rows, cols]`.
pub fn unpermute_rows(
    values: &[f32],
    rows: usize,
    heads: usize,
) -> std::result::Result<Vec<f32>, String> {
    if heads == 0 || rows % (2 * heads) != 0 || values.len() % rows != 0 {
        return Err(format!("{rows} rows cannot be split into {heads} heads of two rotary halves"));
    }
    let cols = values.len() / rows;
    let head_rows = rows / heads;
    let half = head_rows / 2;
    let mut out = vec![0.0f32; values.len()];
    for h in 0..heads {
        for j in 0..half {
            for t in 0..2 {
                let src = h * head_rows + 2 * j + t;
                let dst = h * head_rows + t * half + j;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&values[src * cols..(src + 1) * cols]);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's forward permutation, written the way its converter does it.
    fn permute(values: &[f32], rows: usize, heads: usize) -> Vec<f32> {
        let cols = values.len() / rows;
        let half = rows / heads / 2;
        let mut out = vec![0.0; values.len()];
        for h in 0..heads {
            for t in 0..2 {
                for j in 0..half {
                    let src = h * 2 * half + t * half + j;
                    let dst = h * 2 * half + 2 * j + t;
                    out[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&values[src * cols..(src + 1) * cols]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_the_converters_permutation() {
        let (rows, cols, heads) = (24, 3, 3);
        let w: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        assert_eq!(unpermute_rows(&permute(&w, rows, heads), rows, heads).unwrap(), w);
        // Head 0 of 8 rows: stored rows 0,1,2,3 are original rows 0,4,1,5.
        let p = permute(&w, rows, heads);
        assert_eq!(
            &p[..4 * cols].chunks(cols).map(|r| r[0] as usize / cols).collect::<Vec<_>>(),
            &[0, 4, 1, 5]
        );
        assert!(unpermute_rows(&w, 10, 3).is_err());
    }

    fn llama_config(head_dim: u64, rope_theta: f64) -> HfConfig {
        HfConfig {
            architectures: vec!["LlamaForCausalLM"],
            model_type: "llama",
            vocab_size: 10,
            hidden_size: 4 * head_dim,
            intermediate_size: 8,
            num_hidden_layers: 1,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 131072,
            rope_theta,
            rope_scaling: None,
            hidden_act: "silu",
            tie_word_embeddings: true,
            attention_bias: Some(false),
            torch_dtype: "float32",
            bos_token_id: None,
            eos_token_id: None,
            pad_token_id: None,
        }
    }

    #[test]
    fn rope_freqs_of_llama31_become_its_scaling_parameters() {
        let mut cfg = llama_config(128, 500_000.0);
        let r = Llama3Rope {
            rope_type: "llama3",
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let stored: Vec<f32> =
            llama3_factors(&r, 500_000.0, 128).iter().map(|&f| f as f32).collect();
        cfg.set_llama3_rope(&stored, None).unwrap();
        assert_eq!(cfg.rope_scaling, Some(RopeScaling::Llama3(r)));
        let json = serde_json::to_value(&cfg).unwrap();
        assert_eq!(
            (json["rope_scaling"]["rope_type"].as_str(), json["rope_scaling"]["factor"].as_f64()),
            (Some("llama3"), Some(32.0))
        );
        // Factors of some other scheme are refused, not guessed.
        let mut other = stored.clone();
        other[40] *= 1.5;
        assert!(llama_config(128, 500_000.0)
            .set_llama3_rope(&other, None)
            .unwrap_err()
            .to_string()
            .contains("does not match"));
        assert!(llama_config(128, 500_000.0).set_llama3_rope(&stored[..10], None).is_err());
    }

    #[test]
    fn llama31_factors_match_the_published_shape() {
        let r = Llama3Rope {
            rope_type: "llama3",
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let f = llama3_factors(&r, 500_000.0, 128);
        assert_eq!((f.len(), f[0], f[63]), (64, 1.0, 8.0));
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "factors grow with wavelength");
    }
}
