//! Memory that a job's learners and workers will need, estimated at submit from each model's
//! `config.json` and the agent's training settings, so that a job that cannot fit is flagged
//! before it starts instead of failing with an out-of-memory error an hour in.
//!
//! The figures count what the learner and the worker keep for the whole run: weights, the KL
//! reference, gradients, AdamW's two f32 moments and its f32 master copy of weights held in
//! 16 bits, the adapter snapshot a multi-update LoRA step takes, and the KV cache per token.
//! Activations depend on the micro-batch and are not included; biases and norms are (they are
//! well under 1 % of a model).
use crate::train_config::TrainConfig;
use serde::Deserialize;

/// The shape fields of a Hugging Face `config.json` that memory depends on.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ModelDims {
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    #[serde(default)]
    pub num_key_value_heads: Option<u64>,
    #[serde(default)]
    pub head_dim: Option<u64>,
    pub vocab_size: u64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub model_type: String,
}

impl ModelDims {
    pub fn from_config_json(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    fn kv_heads(&self) -> u64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    fn head_dim(&self) -> u64 {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// (in, out) features of a decoder layer's projection.
    fn projection(&self, name: &str) -> Option<(u64, u64)> {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let (q, kv) =
            (self.num_attention_heads * self.head_dim(), self.kv_heads() * self.head_dim());
        Some(match name {
            "q_proj" => (h, q),
            "k_proj" | "v_proj" => (h, kv),
            "o_proj" => (q, h),
            "gate_proj" | "up_proj" => (h, i),
            "down_proj" => (i, h),
            _ => return None,
        })
    }

    /// Parameters of the whole model.
    pub fn parameters(&self) -> u64 {
        let (h, v) = (self.hidden_size, self.vocab_size);
        let projections = self.projection_parameters();
        let biases = if self.model_type == "qwen2" {
            (self.num_attention_heads + 2 * self.kv_heads()) * self.head_dim()
        } else {
            0
        };
        let qk_norm = if self.model_type == "qwen3" { 2 * self.head_dim() } else { 0 };
        let layer = projections + biases + qk_norm + 2 * h;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers * layer + h + head
    }

    /// Parameters of every matrix that decode steps multiply by: the layers' projections and the
    /// output head. An f32 or bf16 CPU worker keeps a second, packed copy of these.
    pub fn decode_linear_parameters(&self) -> u64 {
        self.num_hidden_layers * self.projection_parameters() + self.vocab_size * self.hidden_size
    }

    /// Weights of one decoder layer's seven projections.
    fn projection_parameters(&self) -> u64 {
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
            .iter()
            .filter_map(|p| self.projection(p))
            .map(|(a, b)| a * b)
            .sum()
    }

    /// Parameters of a rank-`r` LoRA adapter on `targets`.
    pub fn lora_parameters(&self, r: u64, targets: &[String]) -> u64 {
        let per_layer: u64 =
            targets.iter().filter_map(|t| self.projection(t)).map(|(a, b)| r * (a + b)).sum();
        self.num_hidden_layers * per_layer
    }

    /// Key and value bytes one cached token takes.
    pub fn kv_bytes_per_token(&self, dtype_bytes: u64) -> u64 {
        2 * self.num_hidden_layers * self.kv_heads() * self.head_dim() * dtype_bytes
    }
}

/// Bytes per element of a weights dtype name (`float32`, `bfloat16`, …).
pub fn dtype_bytes(name: &str) -> u64 {
    match name {
        "bfloat16" | "bf16" | "float16" | "fp16" | "half" => 2,
        _ => 4,
    }
}

/// What one learner holds, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LearnerMemory {
    pub weights: u64,
    pub reference: u64,
    pub gradients: u64,
    pub optimizer: u64,
    pub snapshot: u64,
}

impl LearnerMemory {
    pub fn total(&self) -> u64 {
        self.weights + self.reference + self.gradients + self.optimizer + self.snapshot
    }
}

/// The learner of a model with `dims` trained with `train`, as the learner builds it: LoRA
/// trains only the adapter and uses the frozen base as its KL reference; full fine-tuning with
/// a KL term loads a second, frozen copy.
pub fn learner_memory(dims: &ModelDims, train: &TrainConfig) -> LearnerMemory {
    let b = dtype_bytes(&train.dtype);
    let base = dims.parameters();
    let (trainable, adapter) = match &train.lora {
        Some(l) => {
            let n = dims.lora_parameters(l.r.max(0) as u64, &l.target_modules);
            (n, n)
        }
        None => (base, 0),
    };
    // Two f32 moments, and an f32 master copy when the weights are 16-bit.
    let per_trainable = 8 + if b < 4 { 4 } else { 0 };
    let reference = if train.kl_coef > 0.0 && train.lora.is_none() { base * b } else { 0 };
    // A LoRA step with more than one update copies the adapter's state to undo a failure.
    let snapshot = if train.lora.is_some() { adapter * (b + per_trainable) } else { 0 };
    LearnerMemory {
        weights: (base + adapter) * b,
        reference,
        gradients: trainable * b,
        optimizer: trainable * per_trainable,
        snapshot,
    }
}

/// Bytes as people read them: `1.50 GiB`, `12.0 MiB`, `512 B`.
pub fn human_bytes(b: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    match b as f64 {
        x if x >= GIB => format!("{:.2} GiB", x / GIB),
        x if x >= MIB => format!("{:.1} MiB", x / MIB),
        x if x >= 1024.0 => format!("{:.1} KiB", x / 1024.0),
        _ => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train_config::LoraSettings;

    /// Qwen2.5-7B's shape: 7.62 billion parameters, as its model card says.
    fn qwen2_7b() -> ModelDims {
        ModelDims {
            hidden_size: 3584,
            intermediate_size: 18944,
            num_hidden_layers: 28,
            num_attention_heads: 28,
            num_key_value_heads: Some(4),
            head_dim: None,
            vocab_size: 152064,
            tie_word_embeddings: false,
            model_type: "qwen2".into(),
        }
    }

    #[test]
    fn parameters_match_a_published_count() {
        assert_eq!(qwen2_7b().parameters(), 7_615_616_512);
    }

    #[test]
    fn full_fine_tuning_in_bf16_needs_about_sixteen_bytes_per_parameter() {
        let d = qwen2_7b();
        let n = d.parameters();
        let t = TrainConfig { dtype: "bfloat16".into(), kl_coef: 0.0, ..TrainConfig::default() };
        let m = learner_memory(&d, &t);
        assert_eq!(
            m,
            LearnerMemory {
                weights: 2 * n,
                reference: 0,
                gradients: 2 * n,
                optimizer: 12 * n,
                snapshot: 0
            }
        );
        assert_eq!(m.total(), 16 * n);
        // A KL term adds a frozen bf16 copy.
        assert_eq!(
            learner_memory(&d, &TrainConfig { kl_coef: 0.01, ..t.clone() }).reference,
            2 * n
        );
    }

    #[test]
    fn lora_trains_the_adapter_only() {
        let d = qwen2_7b();
        let targets: Vec<String> = ["q_proj", "v_proj"].map(String::from).to_vec();
        // Per layer: r·(3584 + 3584) for q, r·(3584 + 512) for v.
        assert_eq!(d.lora_parameters(8, &targets), 28 * 8 * (3584 + 3584 + 3584 + 512));
        let lora = LoraSettings { r: 8, alpha: 16.0, target_modules: targets, use_rslora: false };
        let t = TrainConfig {
            dtype: "float32".into(),
            kl_coef: 0.05,
            lora: Some(lora),
            ..TrainConfig::default()
        };
        let m = learner_memory(&d, &t);
        let a = d.lora_parameters(8, &t.lora.as_ref().unwrap().target_modules);
        assert_eq!(
            m,
            LearnerMemory {
                weights: (d.parameters() + a) * 4,
                reference: 0,
                gradients: a * 4,
                optimizer: a * 8,
                snapshot: a * 12
            }
        );
    }

    #[test]
    fn decode_linears_are_the_projections_and_the_head() {
        let d = qwen2_7b();
        // 28 × (3584·3584·2 + 3584·512·2 + 3584·18944·3) + 152064·3584.
        let want = 28 * (3584 * 3584 * 2 + 3584 * 512 * 2 + 3584 * 18944 * 3) + 152_064 * 3584;
        assert_eq!(d.decode_linear_parameters(), want);
        assert!(want < d.parameters());
    }

    #[test]
    fn kv_cache_bytes_per_token() {
        // 28 layers × (keys + values) × 4 heads × 128 dims × 2 bytes.
        assert_eq!(qwen2_7b().kv_bytes_per_token(2), 28 * 2 * 4 * 128 * 2);
        assert_eq!(human_bytes(3 << 29), "1.50 GiB");
        assert_eq!(human_bytes(12 << 20), "12.0 MiB");
        assert_eq!(human_bytes(512), "512 B");
    }
}
