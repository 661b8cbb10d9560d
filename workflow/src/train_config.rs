//! Per-agent training configuration (a TOML table). Unknown keys are errors, so a misspelt knob
//! can never be silently ignored. It lives here, free of tch, so the coordinator can check a
//! job's settings at submit time with the same code the learner runs.
use serde::{Deserialize, Serialize};

/// A training setting that is wrong; the message names the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct TrainConfigError(pub String);

type Result<T> = std::result::Result<T, TrainConfigError>;

/// The one name of a weight dtype (the names `comas_model::dtype::parse_kind` reads).
pub fn canonical_dtype(name: &str) -> Option<&'static str> {
    match name.trim().trim_start_matches("torch.") {
        "float32" | "f32" | "float" | "fp32" => Some("float32"),
        "bfloat16" | "bf16" => Some("bfloat16"),
        "float16" | "f16" | "half" | "fp16" => Some("float16"),
        _ => None,
    }
}

/// The projections of a decoder layer a LoRA adapter may target (PEFT's module names), in the
/// order of the model crate's `Proj`.
pub const LORA_TARGET_MODULES: [&str; 7] =
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// A device a job may name for training or inference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceName {
    Cpu,
    /// CUDA device N (`cuda` is `cuda:0`).
    Cuda(usize),
}

/// Reads `cpu`, `cuda` or `cuda:N`; `None` for anything else. Whether the device exists is for
/// the machine that uses it to say.
pub fn device_name(name: &str) -> Option<DeviceName> {
    match name.trim() {
        "cpu" => Some(DeviceName::Cpu),
        "cuda" => Some(DeviceName::Cuda(0)),
        n => n.strip_prefix("cuda:").and_then(|i| i.parse().ok()).map(DeviceName::Cuda),
    }
}

/// The weight dtypes training accepts.
pub fn check_dtype(name: &str) -> Result<()> {
    match canonical_dtype(name) {
        Some(_) => Ok(()),
        None => Err(TrainConfigError(format!(
            "unsupported dtype `{}`; use one of float32, bfloat16, float16",
            name.trim()
        ))),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    /// REINFORCE++: returns whitened over the whole step buffer.
    Reinforce,
    /// The group's mean reward subtracted, then whitened (γ forced to 1).
    ReinforceBaseline,
    /// Leave-one-out: the mean of the group's other rewards subtracted (γ forced to 1).
    Rloo,
    /// GRPO: (R − the group's mean) / its standard deviation (γ forced to 1).
    GroupNorm,
    /// Dr. GRPO: the group's mean subtracted, no division (γ forced to 1).
    DrGrpo,
}

impl Estimator {
    pub fn whitens(self) -> bool {
        matches!(self, Estimator::Reinforce | Estimator::ReinforceBaseline)
    }

    pub fn uses_groups(self) -> bool {
        !matches!(self, Estimator::Reinforce)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// d = ℓ − ℓ^ref (may be negative; for KL in the reward).
    K1,
    /// d² / 2.
    K2,
    /// exp(−d) − 1 + d.
    K3,
}

/// Where ℓ^old, the log-probs of the policy that sampled, comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OldLogprobs {
    /// A forward pass of the learner before the first update (rl.md §2).
    Recompute,
    /// The sampler's own log-probs, when every experience carries them: exact when the sampler
    /// ran the same weights in f32 on the same device (comas's CPU workers do), close in bf16,
    /// and one forward pass cheaper. Experiences without them are recomputed.
    Sampler,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LossAgg {
    /// One token mean over every micro-batch of the optimizer step.
    TokenMean,
    /// Each micro-batch's own token mean, averaged over micro-batches (OpenRLHF < 0.10).
    MicrobatchMean,
    /// Mean over tokens within each sequence, then over sequences of the optimizer step.
    SeqMean,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LrSchedule {
    /// Warm-up then cosine to min lr, progress clamped at 1 (rl.md §9 default).
    Cosine,
    /// The Hugging Face scheduler's indexing: first update at lr 0, cosine unclamped.
    CosineHfParity,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoraSettings {
    /// Rank of the adapter.
    pub r: i64,
    /// Scale: the update is (alpha / r) · B A.
    pub alpha: f64,
    /// The linear layers that get an adapter (`q_proj`, `v_proj`, ...).
    pub target_modules: Vec<String>,
    /// Scale by alpha / √r instead (rsLoRA).
    #[serde(default)]
    pub use_rslora: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// How a sample's reward becomes its advantage (rl.md §4).
    pub estimator: Estimator,
    /// Discount of the returns over token positions.
    pub gamma: f64,
    /// β; 0 means no reference model is loaded at all.
    pub kl_coef: f64,
    /// The per-token KL estimate against the reference model.
    pub kl_estimator: KlEstimator,
    /// The KL term in the loss (k2 or k3 recommended) instead of in the token rewards.
    pub kl_in_loss: bool,
    /// PPO clip range below 1 of the probability ratio.
    pub clip_eps_low: f64,
    /// PPO clip range above 1 of the probability ratio.
    pub clip_eps_high: f64,
    /// Dual-clip constant c > 1; 0 disables.
    pub dual_clip: f64,
    /// Leave completions cut at `max_new_tokens` (no end of sequence) out of the loss.
    pub mask_truncated: bool,
    /// Count masked truncated completions in the whitening statistics all the same.
    pub truncated_in_norm_stats: bool,
    /// Whiten by subtracting the mean only, without dividing by the standard deviation.
    pub no_std_norm: bool,
    /// Rewards are clipped to [−reward_clip, reward_clip] before the returns.
    pub reward_clip: f64,
    /// How token losses are averaged into the step's loss.
    pub loss_agg: LossAgg,
    /// Rollout temperature: log-probs use logits / temperature.
    pub temperature: f64,
    /// Peak learning rate of AdamW.
    pub lr: f64,
    /// AdamW's β1 and β2.
    pub adam_betas: [f64; 2],
    /// AdamW's ε.
    pub adam_eps: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Gradients are clipped to this global norm before each update.
    pub max_grad_norm: f64,
    /// The learning rate over the optimizer steps.
    pub lr_schedule: LrSchedule,
    /// Share of `total_steps` spent warming up from 0 to `lr`.
    pub warmup_ratio: f64,
    /// The cosine ends at min_lr_ratio × lr (1.0: a constant rate after warm-up).
    pub min_lr_ratio: f64,
    /// S: optimizer steps the whole job will take (the schedule horizon).
    pub total_steps: u64,
    /// Optimizer steps already taken before this run (one-shot mode; a resumed learner takes it
    /// from the checkpoint).
    pub completed_steps: u64,
    /// Samples per optimizer step.
    pub train_batch_size: usize,
    /// At most this many samples per micro-batch.
    pub micro_batch_size: usize,
    /// At most this many (padded) tokens per micro-batch; a longer sample gets a micro-batch alone.
    pub micro_batch_tokens: usize,
    /// Passes over a step's samples.
    pub max_epochs: usize,
    /// Shuffle samples before splitting into optimizer steps, every epoch (rl.md §8; seeded by
    /// seed, optimizer steps taken before the global step, and epoch). On by default.
    pub shuffle: bool,
    /// Seed of the sample shuffle.
    pub seed: u64,
    /// Weights dtype for training: float32 or bfloat16 (moments are always f32).
    pub dtype: String,
    /// Where the learner trains: cpu, cuda or cuda:N.
    pub device: String,
    /// Train a LoRA adapter instead of all weights.
    pub lora: Option<LoraSettings>,
    pub old_logprobs: OldLogprobs,
    /// Truncated importance sampling (0: off). With ℓ^old recomputed by the learner, each
    /// token's policy-gradient term is weighted by min(exp(ℓ^old − ℓ^sampler), tis_cap): the
    /// sampler's log-probs are the behaviour policy, and the weight corrects for a sampler
    /// that differs from the learner (another dtype or kernel, or an older policy version).
    pub tis_cap: f64,
    /// Compute the full-vocabulary entropy of every trained token for the report (costs a pass
    /// over [tokens, vocab]; off by default).
    pub log_entropy: bool,
    /// Activation checkpointing: keep only each layer's input during the training forward and
    /// recompute the layer in the backward pass. Activation memory drops from all layers' to one
    /// layer's, for about one more forward per micro-batch; for long sequences. Off by default.
    pub gradient_checkpointing: bool,
    /// Inside an optimizer step, cut micro-batches from samples sorted by length, so each pads
    /// to similar lengths. The update is the same (token- and sequence-mean losses do not
    /// depend on the grouping); `microbatch_mean` always keeps the shuffled order. On by default.
    pub group_by_length: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            estimator: Estimator::Reinforce,
            gamma: 1.0,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K1,
            kl_in_loss: false,
            clip_eps_low: 0.2,
            clip_eps_high: 0.2,
            dual_clip: 0.0,
            mask_truncated: true,
            truncated_in_norm_stats: false,
            no_std_norm: false,
            reward_clip: 10.0,
            loss_agg: LossAgg::TokenMean,
            temperature: 1.0,
            lr: 1e-6,
            adam_betas: [0.9, 0.95],
            adam_eps: 1e-8,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            lr_schedule: LrSchedule::Cosine,
            warmup_ratio: 0.03,
            min_lr_ratio: 0.1,
            total_steps: 1,
            completed_steps: 0,
            train_batch_size: 64,
            micro_batch_size: 2,
            micro_batch_tokens: 16384,
            max_epochs: 1,
            shuffle: true,
            seed: 42,
            dtype: "float32".into(),
            device: "cpu".into(),
            lora: None,
            old_logprobs: OldLogprobs::Recompute,
            tis_cap: 0.0,
            log_entropy: false,
            gradient_checkpointing: false,
            group_by_length: true,
        }
    }
}

/// A method's defaults for its agents' training settings: each one set applies where the
/// agent's own table leaves the key out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainDefaults {
    pub temperature: Option<f64>,
    pub estimator: Option<Estimator>,
    pub kl_coef: Option<f64>,
    pub kl_in_loss: Option<bool>,
    pub kl_estimator: Option<KlEstimator>,
}

impl TrainDefaults {
    /// Sets each default whose key `given` does not name.
    pub fn apply(&self, cfg: &mut TrainConfig, given: impl Fn(&str) -> bool) {
        fn set<T: Copy>(slot: &mut T, default: Option<T>, given: bool) {
            if let (Some(v), false) = (default, given) {
                *slot = v;
            }
        }
        set(&mut cfg.temperature, self.temperature, given("temperature"));
        set(&mut cfg.estimator, self.estimator, given("estimator"));
        set(&mut cfg.kl_coef, self.kl_coef, given("kl_coef"));
        set(&mut cfg.kl_in_loss, self.kl_in_loss, given("kl_in_loss"));
        set(&mut cfg.kl_estimator, self.kl_estimator, given("kl_estimator"));
    }
}

impl TrainConfig {
    /// The settings of a parsed table, not yet validated (a job lays its method's defaults
    /// over them first). A wrong value names its key (`` `lora.alpha`: invalid type ... ``).
    pub fn from_table(table: toml::Table) -> Result<Self> {
        toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| {
            match crate::method::error_key(&e) {
                (Some(key), message) => TrainConfigError(format!("`{key}`: {message}")),
                (None, message) => TrainConfigError(message),
            }
        })
    }

    pub fn from_toml(text: &str) -> Result<Self> {
        let cfg: TrainConfig = toml::from_str(text).map_err(|e| TrainConfigError(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TrainConfigError(format!("{}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| TrainConfigError(format!("{}: {e}", path.display())))
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(TrainConfigError(m));
        let finite_nonneg = |name: &str, v: f64| -> Result<()> {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(TrainConfigError(format!("`{name}` must be finite and >= 0, got {v}")))
            }
        };
        finite_nonneg("kl_coef", self.kl_coef)?;
        finite_nonneg("weight_decay", self.weight_decay)?;
        finite_nonneg("max_grad_norm", self.max_grad_norm)?;
        if !(0.0..=1.0).contains(&self.warmup_ratio) {
            return bad(format!(
                "`warmup_ratio` is a share of total_steps and must be in [0, 1], got {}",
                self.warmup_ratio
            ));
        }
        if !(self.gamma > 0.0 && self.gamma <= 1.0) {
            return bad(format!("`gamma` must be in (0, 1], got {}", self.gamma));
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return bad(format!("`lr` must be positive, got {}", self.lr));
        }
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return bad(format!("`temperature` must be positive, got {}", self.temperature));
        }
        if !(0.0..1.0).contains(&self.clip_eps_low)
            || !(self.clip_eps_high >= 0.0 && self.clip_eps_high.is_finite())
        {
            return bad(format!(
                "clip range must satisfy 0 <= clip_eps_low < 1 and clip_eps_high >= 0, got {} / {}",
                self.clip_eps_low, self.clip_eps_high
            ));
        }
        // Written so that NaN fails: every comparison with NaN is false.
        if !(self.dual_clip == 0.0 || (self.dual_clip > 1.0 && self.dual_clip.is_finite())) {
            return bad(format!("`dual_clip` must be 0 (off) or > 1, got {}", self.dual_clip));
        }
        if !(self.reward_clip > 0.0) {
            return bad(format!("`reward_clip` must be positive, got {}", self.reward_clip));
        }
        if !(self.adam_eps > 0.0 && self.adam_eps.is_finite()) {
            return bad(format!("`adam_eps` must be finite and > 0, got {}", self.adam_eps));
        }
        for (i, b) in self.adam_betas.iter().enumerate() {
            if !(0.0..1.0).contains(b) {
                return bad(format!("`adam_betas[{i}]` must be in [0, 1), got {b}"));
            }
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return bad(format!("`min_lr_ratio` must be in [0, 1], got {}", self.min_lr_ratio));
        }
        if self.total_steps == 0 {
            return bad("`total_steps` must be at least 1".into());
        }
        if self.train_batch_size == 0
            || self.micro_batch_size == 0
            || self.micro_batch_tokens == 0
            || self.max_epochs == 0
        {
            return bad("`train_batch_size`, `micro_batch_size`, `micro_batch_tokens` and `max_epochs` must be at least 1".into());
        }
        if self.kl_in_loss && self.kl_estimator == KlEstimator::K1 && self.kl_coef > 0.0 {
            // k1 in the loss has zero expected gradient; allowed (parity), but rarely what is meant.
        }
        finite_nonneg("tis_cap", self.tis_cap)?;
        if self.tis_cap > 0.0 && self.old_logprobs == OldLogprobs::Sampler {
            return bad("`tis_cap` weighs ℓ^old recomputed by the learner against the sampler's log-probs; with old_logprobs = \"sampler\" they are the same. Set old_logprobs = \"recompute\"".into());
        }
        check_dtype(&self.dtype).map_err(|e| TrainConfigError(format!("`dtype`: {e}")))?;
        if device_name(&self.device).is_none() {
            return bad(format!(
                "`device`: unknown device `{}`; use cpu, cuda or cuda:N",
                self.device.trim()
            ));
        }
        if let Some(l) = &self.lora {
            if l.r <= 0 || l.target_modules.is_empty() {
                return bad("`lora.r` must be positive and `lora.target_modules` non-empty".into());
            }
            if let Some(m) =
                l.target_modules.iter().find(|m| !LORA_TARGET_MODULES.contains(&m.as_str()))
            {
                return bad(format!(
                    "`lora.target_modules`: `{m}` is not a projection comas adapts; use any of {}",
                    LORA_TARGET_MODULES.join(" ")
                ));
            }
            if !(l.alpha > 0.0 && l.alpha.is_finite()) {
                return bad(format!("`lora.alpha` must be finite and > 0, got {}", l.alpha));
            }
        }
        Ok(())
    }

    /// γ actually used: group estimators force 1 (rl.md §4).
    pub fn effective_gamma(&self) -> f64 {
        if self.estimator == Estimator::Reinforce {
            self.gamma
        } else {
            1.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c = TrainConfig::from_toml("estimator = \"group_norm\"\nkl_coef = 0.01\nkl_estimator = \"k3\"\nkl_in_loss = true\n").unwrap();
        assert_eq!(c.estimator, Estimator::GroupNorm);
        assert_eq!(c.kl_estimator, KlEstimator::K3);
        assert_eq!(c.adam_betas, [0.9, 0.95]);
        assert_eq!(c.effective_gamma(), 1.0);
    }

    #[test]
    fn method_defaults_apply_only_where_the_agent_gives_no_key() {
        let table: toml::Table = toml::from_str("kl_coef = 0.5\n").unwrap();
        let mut c = TrainConfig::from_table(table.clone()).unwrap();
        let d = TrainDefaults {
            kl_coef: Some(0.01),
            kl_in_loss: Some(true),
            estimator: Some(Estimator::GroupNorm),
            ..TrainDefaults::default()
        };
        d.apply(&mut c, |k| table.contains_key(k));
        assert_eq!(
            (c.kl_coef, c.kl_in_loss, c.estimator, c.temperature),
            (0.5, true, Estimator::GroupNorm, 1.0)
        );
        assert!(TrainConfig::from_table(toml::from_str("use_ttrl = 1\n").unwrap())
            .unwrap_err()
            .0
            .contains("use_ttrl"));
    }

    #[test]
    fn a_lora_target_that_is_no_projection_is_refused() {
        let lora = |m: &str| {
            format!("[lora]\nr = 8\nalpha = 16.0\ntarget_modules = [\"q_proj\", \"{m}\"]")
        };
        TrainConfig::from_toml(&lora("down_proj")).unwrap();
        let e = TrainConfig::from_toml(&lora("nonexistent_proj")).unwrap_err().to_string();
        assert!(
            e.starts_with("`lora.target_modules`: `nonexistent_proj` is not a projection"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_device_is_refused_and_cuda_devices_are_read() {
        let e = TrainConfig::from_toml("device = \"tpu\"").unwrap_err();
        assert_eq!(e.to_string(), "`device`: unknown device `tpu`; use cpu, cuda or cuda:N");
        assert!(TrainConfig::from_toml("device = \"cuda:x\"").is_err());
        assert!(TrainConfig::from_toml("device = \"cuda:1\"").is_ok());
        assert_eq!(device_name(" cuda "), Some(DeviceName::Cuda(0)));
        assert_eq!(device_name("cuda:3"), Some(DeviceName::Cuda(3)));
        assert_eq!(device_name("cpu"), Some(DeviceName::Cpu));
        assert_eq!(device_name("gpu"), None);
    }

    /// NaN fails every comparison, so each float check is written to fail for it too.
    #[test]
    fn nan_infinite_and_out_of_range_floats_are_refused() {
        let cases = [
            ("adam_eps = nan", "`adam_eps` must be finite and > 0, got NaN"),
            ("adam_eps = 0.0", "`adam_eps` must be finite and > 0, got 0"),
            ("adam_eps = -1e-8", "`adam_eps` must be finite and > 0, got -0.00000001"),
            ("adam_eps = inf", "`adam_eps` must be finite and > 0, got inf"),
            ("dual_clip = nan", "`dual_clip` must be 0 (off) or > 1, got NaN"),
            ("dual_clip = inf", "`dual_clip` must be 0 (off) or > 1, got inf"),
            (
                "warmup_ratio = 5.0",
                "`warmup_ratio` is a share of total_steps and must be in [0, 1], got 5",
            ),
            (
                "warmup_ratio = -0.1",
                "`warmup_ratio` is a share of total_steps and must be in [0, 1], got -0.1",
            ),
            (
                "warmup_ratio = nan",
                "`warmup_ratio` is a share of total_steps and must be in [0, 1], got NaN",
            ),
            (
                "[lora]\nr = 8\nalpha = nan\ntarget_modules = [\"q_proj\"]",
                "`lora.alpha` must be finite and > 0, got NaN",
            ),
            (
                "[lora]\nr = 8\nalpha = inf\ntarget_modules = [\"q_proj\"]",
                "`lora.alpha` must be finite and > 0, got inf",
            ),
            (
                "[lora]\nr = 8\nalpha = -16.0\ntarget_modules = [\"q_proj\"]",
                "`lora.alpha` must be finite and > 0, got -16",
            ),
            (
                "[lora]\nr = 8\nalpha = 0.0\ntarget_modules = [\"q_proj\"]",
                "`lora.alpha` must be finite and > 0, got 0",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(TrainConfig::from_toml(text).unwrap_err().0, want, "{text}");
        }
        for text in
            ["warmup_ratio = 1.0", "warmup_ratio = 0.0", "dual_clip = 3.0", "adam_eps = 1e-6"]
        {
            TrainConfig::from_toml(text).unwrap();
        }
        let lora = "[lora]\nr = 8\nalpha = 16.0\ntarget_modules = [\"q_proj\"]";
        assert_eq!(TrainConfig::from_toml(lora).unwrap().lora.unwrap().alpha, 16.0);
    }

    /// A table's wrong value names its key; `toml` writes the key path only in its `Display`,
    /// so this pins the form `method::error_key` reads.
    #[test]
    fn a_wrong_value_of_a_table_names_its_key() {
        let table: toml::Table = toml::from_str("lr = \"fast\"").unwrap();
        assert_eq!(
            TrainConfig::from_table(table).unwrap_err().0,
            "`lr`: invalid type: string \"fast\", expected f64"
        );
        let table: toml::Table = toml::from_str("[lora]\nr = -1.5").unwrap();
        let e = TrainConfig::from_table(table).unwrap_err().0;
        assert!(e.starts_with("`lora.r`: invalid type: floating point `-1.5`"), "{e}");
    }

    #[test]
    fn unknown_and_invalid_keys_are_named() {
        let e = TrainConfig::from_toml("use_ttrl = true\n").unwrap_err().to_string();
        assert!(e.contains("use_ttrl"), "{e}");
        let e = TrainConfig::from_toml("estimator = \"ppo\"\n").unwrap_err().to_string();
        assert!(e.contains("ppo"), "{e}");
        let e = TrainConfig::from_toml("dual_clip = 0.5\n").unwrap_err().to_string();
        assert!(e.contains("dual_clip"), "{e}");
        let e = TrainConfig::from_toml("lr = -1.0\n").unwrap_err().to_string();
        assert!(e.contains("lr"), "{e}");
    }
}
