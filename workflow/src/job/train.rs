//! Each agent's training settings: its own `[agents.train]` table over the method's defaults
//! (a typed overlay: a key the agent gives wins), with the LR horizon, the seed and where the
//! old log-probs come from derived from the job.
use super::{invalid, Job, JobError};
use crate::seed::derive_seed;
use crate::train_config::{canonical_dtype, OldLogprobs, TrainConfig};

impl Job {
    /// Resolves agent `k`'s training settings: the LR horizon defaults to the optimizer steps
    /// the job will really take (spec 6.2), and the log-prob temperature to the rollout one.
    pub(super) fn agent_train(&self, k: usize) -> Result<TrainConfig, JobError> {
        let field = format!("agents[{k}].train");
        let raw = &self.spec.agents[k].train;
        let given = |key: &str| raw.contains_key(key);
        let mut cfg: TrainConfig =
            crate::method::read_settings(toml::Value::Table(raw.clone()), &field)?;
        self.method.train_defaults().apply(&mut cfg, given);
        if !given("seed") {
            cfg.seed = derive_seed(&[self.spec.seed, k as u64]) & i64::MAX as u64;
        }
        cfg.validate().map_err(|e| invalid(&field, e.0))?;
        let samples = self.samples(k);
        if cfg.train_batch_size as u64 > samples.least {
            return Err(invalid(
                format!("{field}.train_batch_size"),
                format!(
                    "is {} but agent {k} speaks only {} turns per step ({}); lower it or raise schedule.questions_per_step",
                    cfg.train_batch_size, samples.least, samples.why
                ),
            ));
        }
        if cfg.micro_batch_size > cfg.train_batch_size {
            return Err(invalid(
                format!("{field}.micro_batch_size"),
                format!(
                    "is {} but train_batch_size is {}",
                    cfg.micro_batch_size, cfg.train_batch_size
                ),
            ));
        }
        if self.spec.agents[k].adapter.is_some() && cfg.lora.is_none() {
            return Err(invalid(
                format!("agents[{k}].adapter"),
                "an adapter needs a [agents.train.lora] table with its settings",
            ));
        }
        if !given("total_steps") {
            // The horizon counts every turn an agent may speak, so that one that sometimes
            // speaks more does not reach the end of its schedule early.
            let per_step =
                samples.most.div_ceil(cfg.train_batch_size as u64) * cfg.max_epochs as u64;
            cfg.total_steps = (per_step * self.total_steps).max(1);
        }
        // The sampler ran the same weights: when it also used the learner's dtype on the CPU,
        // its log-probs stand for ℓ^old and the recompute pass can go (exact in f32; in bf16
        // other matrix shapes round differently, measured approx_kl ~0.003 on SmolLM2).
        // (Truncated importance sampling needs the recomputed ℓ^old to weigh.) Not on vLLM:
        // its log-probs leave the stop tokens out while min_new_tokens holds them back.
        if !given("old_logprobs")
            && cfg.tis_cap == 0.0
            && cfg.device == "cpu"
            && self.spec.rollout.engine != Some(crate::job::RolloutEngine::Vllm)
            && canonical_dtype(&self.spec.rollout.dtype) == canonical_dtype(&cfg.dtype)
        {
            cfg.old_logprobs = OldLogprobs::Sampler;
        }
        Ok(cfg)
    }
}
