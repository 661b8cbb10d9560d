//! `config.json` of a Hugging Face decoder-only checkpoint, in both the classic key style
//! (`torch_dtype`, `rope_theta`, `rope_scaling`) and the transformers-5 style (`dtype`,
//! `rope_parameters`). Field names follow the checkpoint's keys.
use crate::dtype::parse_kind;
use crate::error::{read_json, ModelError, Result};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;
use tch::Kind;

/// `head_dim` of a Qwen3 config that gives none (transformers' `Qwen3Config` default).
const QWEN3_DEFAULT_HEAD_DIM: i64 = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Qwen2,
    Qwen3,
    Llama,
}

impl Architecture {
    fn from_model_type(model_type: &str) -> Result<Self> {
        match model_type {
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            "llama" => Ok(Self::Llama),
            other => Err(ModelError::Config(format!(
                "model_type `{other}` is not supported; supported: qwen2, qwen3, llama"
            ))),
        }
    }
}

/// Rotary embedding frequency scheme.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Default,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub rope_theta: f64,
    pub scaling: RopeScaling,
}

/// One or several token ids (`eos_token_id` may be either in HF configs).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum TokenIds {
    One(i64),
    Many(Vec<i64>),
}

impl TokenIds {
    pub fn to_vec(&self) -> Vec<i64> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
struct RawConfig {
    model_type: String,
    vocab_size: i64,
    hidden_size: i64,
    intermediate_size: i64,
    num_hidden_layers: i64,
    num_attention_heads: i64,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    rms_norm_eps: Option<f64>,
    max_position_embeddings: Option<i64>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    tie_word_embeddings: Option<bool>,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    bos_token_id: Option<TokenIds>,
    eos_token_id: Option<TokenIds>,
    pad_token_id: Option<TokenIds>,
    use_sliding_window: Option<bool>,
    partial_rotary_factor: Option<f64>,
}

/// The resolved configuration the model code runs on.
#[derive(Debug, Clone)]
pub struct Config {
    pub architecture: Architecture,
    pub model_type: String,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: i64,
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the attention output projection.
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// Per-head RMSNorm on queries and keys (Qwen3).
    pub qk_norm: bool,
    pub rope: RopeConfig,
    /// The dtype the checkpoint declares (weights may be cast on load).
    pub dtype: Kind,
    pub bos_token_id: Option<i64>,
    pub eos_token_ids: Vec<i64>,
    pub pad_token_id: Option<i64>,
}

impl Config {
    pub fn from_file(path: &Path) -> Result<Self> {
        let raw: RawConfig = read_json(path)?;
        Self::from_raw(raw).map_err(|e| match e {
            ModelError::Config(m) => ModelError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    pub fn from_json_str(text: &str) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(text)
            .map_err(|e| ModelError::Config(format!("invalid config.json: {e}")))?;
        Self::from_raw(raw)
    }

    fn from_raw(raw: RawConfig) -> Result<Self> {
        let architecture = Architecture::from_model_type(&raw.model_type)?;
        let positive = |name: &str, v: i64| {
            if v > 0 {
                Ok(v)
            } else {
                Err(ModelError::Config(format!("`{name}` must be positive, got {v}")))
            }
        };
        let hidden_size = positive("hidden_size", raw.hidden_size)?;
        let num_attention_heads = positive("num_attention_heads", raw.num_attention_heads)?;
        let num_key_value_heads = positive(
            "num_key_value_heads",
            raw.num_key_value_heads.unwrap_or(num_attention_heads),
        )?;
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(ModelError::Config(format!(
                "num_attention_heads ({num_attention_heads}) must be a multiple of num_key_value_heads ({num_key_value_heads})"
            )));
        }
        let head_dim = match raw.head_dim {
            Some(d) => positive("head_dim", d)?,
            // transformers' Qwen3Config has 128 as its default, not hidden_size / heads.
            None if architecture == Architecture::Qwen3 => QWEN3_DEFAULT_HEAD_DIM,
            None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            None => {
                return Err(ModelError::Config(format!(
                    "hidden_size ({hidden_size}) is not divisible by num_attention_heads ({num_attention_heads}) and no head_dim is given"
                )))
            }
        };
        if head_dim % 2 != 0 {
            return Err(ModelError::Config(format!(
                "head_dim must be even for rotary embeddings, got {head_dim}"
            )));
        }
        if let Some(act) = raw.hidden_act.as_deref() {
            if act != "silu" {
                return Err(ModelError::Config(format!(
                    "hidden_act `{act}` is not supported; only silu"
                )));
            }
        }
        if raw.use_sliding_window == Some(true) {
            return Err(ModelError::Config(
                "use_sliding_window=true is not supported; set it to false (full attention)".into(),
            ));
        }
        if let Some(f) = raw.partial_rotary_factor {
            if f != 1.0 {
                return Err(ModelError::Config(format!(
                    "partial_rotary_factor {f} is not supported; only 1.0"
                )));
            }
        }
        let dtype = match raw.dtype.as_deref().or(raw.torch_dtype.as_deref()) {
            Some(name) => parse_kind(name)?,
            None => Kind::Float,
        };
        let rope =
            parse_rope(raw.rope_theta, raw.rope_scaling.as_ref(), raw.rope_parameters.as_ref())?;
        let attention_bias = raw.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias, qk_norm) = match architecture {
            Architecture::Qwen2 => (true, false, false),
            Architecture::Qwen3 => (attention_bias, attention_bias, true),
            Architecture::Llama => (attention_bias, attention_bias, false),
        };
        let rms_norm_eps = raw.rms_norm_eps.unwrap_or(1e-6);
        if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
            return Err(ModelError::Config(format!(
                "`rms_norm_eps` must be positive and finite, got {rms_norm_eps} (it is usually 1e-6 or 1e-5)"
            )));
        }
        let vocab_size = positive("vocab_size", raw.vocab_size)?;
        // `pad_token_id` is not checked: some configs write -1 for none, and nothing reads it.
        for (key, ids) in [("bos_token_id", &raw.bos_token_id), ("eos_token_id", &raw.eos_token_id)]
        {
            if let Some(bad) =
                ids.iter().flat_map(TokenIds::to_vec).find(|&id| !(0..vocab_size).contains(&id))
            {
                return Err(ModelError::Config(format!(
                    "`{key}` {bad} is outside the vocabulary (0 to {}, vocab_size {vocab_size})",
                    vocab_size - 1
                )));
            }
        }
        let first = |ids: &Option<TokenIds>| ids.as_ref().and_then(|t| t.to_vec().first().copied());
        Ok(Config {
            architecture,
            model_type: raw.model_type,
            vocab_size,
            hidden_size,
            intermediate_size: positive("intermediate_size", raw.intermediate_size)?,
            num_hidden_layers: positive("num_hidden_layers", raw.num_hidden_layers)?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(32768),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias: architecture == Architecture::Llama && raw.mlp_bias.unwrap_or(false),
            qk_norm,
            rope,
            dtype,
            bos_token_id: first(&raw.bos_token_id),
            eos_token_ids: raw.eos_token_id.map(|t| t.to_vec()).unwrap_or_default(),
            pad_token_id: first(&raw.pad_token_id),
        })
    }

    /// Number of query heads that share one key/value head.
    pub fn num_kv_groups(&self) -> i64 {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Number of parameters (tied embeddings counted once).
    pub fn num_parameters(&self) -> i64 {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let mut attn = h * q + 2 * h * kv + q * h;
        if self.qkv_bias {
            attn += q + 2 * kv;
        }
        if self.o_bias {
            attn += h;
        }
        if self.qk_norm {
            attn += 2 * self.head_dim;
        }
        let mut mlp = 3 * h * i;
        if self.mlp_bias {
            mlp += 2 * i + h;
        }
        let layer = attn + mlp + 2 * h;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers * layer + h + head
    }
}

fn get_f64(obj: &Value, key: &str, what: &str) -> Result<f64> {
    obj.get(key)
        .and_then(Value::as_f64)
        .ok_or_else(|| ModelError::Config(format!("{what} needs a numeric `{key}`")))
}

/// Resolves rotary settings from either key style. `rope_parameters` (transformers 5) carries the
/// theta itself; `rope_scaling` (classic) sits next to a top-level `rope_theta`.
fn parse_rope(
    rope_theta: Option<f64>,
    rope_scaling: Option<&Value>,
    rope_parameters: Option<&Value>,
) -> Result<RopeConfig> {
    let mut params = rope_parameters.filter(|v| !v.is_null());
    // Models with several attention types nest one entry per type; these architectures use full attention.
    if let Some(full) = params.and_then(|p| p.get("full_attention")) {
        params = Some(full);
    }
    let theta = params
        .and_then(|p| p.get("rope_theta"))
        .and_then(Value::as_f64)
        .or(rope_theta)
        .unwrap_or(10_000.0);
    if !(theta > 0.0 && theta.is_finite()) {
        return Err(ModelError::Config(format!("rope_theta must be positive, got {theta}")));
    }
    let scaling_obj = match (params, rope_scaling.filter(|v| !v.is_null())) {
        (Some(p), _) => Some(p),
        (None, s) => s,
    };
    let scaling = match scaling_obj {
        None => RopeScaling::Default,
        Some(obj) => {
            let kind = obj
                .get("rope_type")
                .or_else(|| obj.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("default");
            match kind {
                "default" => RopeScaling::Default,
                "linear" => {
                    RopeScaling::Linear { factor: get_f64(obj, "factor", "linear rope scaling")? }
                }
                "llama3" => {
                    let what = "llama3 rope scaling";
                    let s = RopeScaling::Llama3 {
                        factor: get_f64(obj, "factor", what)?,
                        low_freq_factor: get_f64(obj, "low_freq_factor", what)?,
                        high_freq_factor: get_f64(obj, "high_freq_factor", what)?,
                        original_max_position_embeddings: get_f64(
                            obj,
                            "original_max_position_embeddings",
                            what,
                        )?,
                    };
                    if let RopeScaling::Llama3 { low_freq_factor, high_freq_factor, .. } = s {
                        if high_freq_factor <= low_freq_factor {
                            return Err(ModelError::Config(format!(
                                "llama3 rope scaling needs high_freq_factor > low_freq_factor, got {high_freq_factor} <= {low_freq_factor}"
                            )));
                        }
                    }
                    s
                }
                other => {
                    return Err(ModelError::Config(format!(
                        "rope type `{other}` is not supported; supported: default, linear, llama3"
                    )))
                }
            }
        }
    };
    Ok(RopeConfig { rope_theta: theta, scaling })
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN2: &str = r#"{"model_type":"qwen2","vocab_size":512,"hidden_size":64,"intermediate_size":128,
        "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"rms_norm_eps":1e-6,
        "rope_theta":10000.0,"torch_dtype":"bfloat16","tie_word_embeddings":true,"eos_token_id":[3,4]}"#;

    #[test]
    fn classic_keys() {
        let c = Config::from_json_str(QWEN2).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen2);
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.num_kv_groups(), 2);
        assert_eq!(c.dtype, Kind::BFloat16);
        assert!(c.qkv_bias && !c.o_bias && c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids, vec![3, 4]);
        assert_eq!(c.rope, RopeConfig { rope_theta: 10000.0, scaling: RopeScaling::Default });
    }

    #[test]
    fn transformers5_keys() {
        let c = Config::from_json_str(
            r#"{"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
            "num_attention_heads":2,"dtype":"float16","rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,
            "factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#,
        )
        .unwrap();
        assert_eq!(c.dtype, Kind::Half);
        assert_eq!(c.rope.rope_theta, 500000.0);
        assert!(matches!(c.rope.scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        assert_eq!(c.num_key_value_heads, 2);
    }

    #[test]
    fn qwen3_without_head_dim_takes_transformers_default() {
        let c = Config::from_json_str(
            r#"{"model_type":"qwen3","vocab_size":10,"hidden_size":64,"intermediate_size":16,"num_hidden_layers":1,
            "num_attention_heads":4,"num_key_value_heads":2}"#,
        )
        .unwrap();
        assert_eq!(c.head_dim, 128);
    }

    #[test]
    fn qwen3_explicit_head_dim() {
        let c = Config::from_json_str(
            r#"{"model_type":"qwen3","vocab_size":10,"hidden_size":64,"intermediate_size":16,"num_hidden_layers":1,
            "num_attention_heads":4,"num_key_value_heads":2,"head_dim":32}"#,
        )
        .unwrap();
        assert_eq!(c.head_dim, 32);
        assert!(c.qk_norm && !c.qkv_bias);
    }

    #[test]
    fn errors_name_the_problem() {
        let bad = QWEN2.replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":3");
        assert!(Config::from_json_str(&bad)
            .unwrap_err()
            .to_string()
            .contains("multiple of num_key_value_heads"));
        let bad = QWEN2.replace("qwen2", "gpt2");
        assert!(Config::from_json_str(&bad).unwrap_err().to_string().contains("gpt2"));
        let bad = QWEN2
            .replace("\"rope_theta\":10000.0", "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4}");
        assert!(Config::from_json_str(&bad).unwrap_err().to_string().contains("yarn"));
    }

    #[test]
    fn bad_rms_norm_eps_is_refused() {
        for eps in ["-1.0", "0", "0.0", "1e999"] {
            let bad = QWEN2.replace("\"rms_norm_eps\":1e-6", &format!("\"rms_norm_eps\":{eps}"));
            let e = Config::from_json_str(&bad).unwrap_err().to_string();
            // serde_json refuses 1e999 itself (out of range), naming no key: either is fine.
            assert!(e.contains("rms_norm_eps") || e.contains("out of range"), "{eps}: {e}");
        }
        let ok = QWEN2.replace("\"rms_norm_eps\":1e-6", "\"rms_norm_eps\":1e-5");
        assert_eq!(Config::from_json_str(&ok).unwrap().rms_norm_eps, 1e-5);
        // Absent: the default.
        let absent = QWEN2.replace("\"rms_norm_eps\":1e-6,", "");
        assert_eq!(Config::from_json_str(&absent).unwrap().rms_norm_eps, 1e-6);
    }

    #[test]
    fn special_token_ids_outside_the_vocabulary_are_refused() {
        for (ids, key, bad) in [
            ("\"eos_token_id\":99999", "eos_token_id", "99999"),
            ("\"eos_token_id\":[3,512]", "eos_token_id", "512"),
            ("\"eos_token_id\":[3,4],\"bos_token_id\":-1", "bos_token_id", "-1"),
        ] {
            let text = QWEN2.replace("\"eos_token_id\":[3,4]", ids);
            let e = Config::from_json_str(&text).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(bad) && e.contains("vocab_size 512"), "{e}");
        }
        let edge =
            QWEN2.replace("\"eos_token_id\":[3,4]", "\"eos_token_id\":511,\"bos_token_id\":0");
        let c = Config::from_json_str(&edge).unwrap();
        assert_eq!((c.eos_token_ids, c.bos_token_id), (vec![511], Some(0)));
        // A pad id of -1 (some configs' "none") still loads.
        let pad = QWEN2.replace("\"eos_token_id\":[3,4]", "\"pad_token_id\":-1");
        assert!(Config::from_json_str(&pad).is_ok());
    }

    #[test]
    fn parameter_count() {
        let c = Config::from_json_str(QWEN2).unwrap();
        // embed 512*64; per layer: q 64*64+64, k,v 2*(64*32+32), o 64*64, mlp 3*64*128, norms 2*64
        let layer = 64 * 64 + 64 + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64;
        assert_eq!(c.num_parameters(), 512 * 64 + 2 * layer + 64);
    }
}
