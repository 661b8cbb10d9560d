//! The training thread's state for one agent: its model (all weights or a LoRA adapter), an
//! optional frozen reference, the optimizer and the counters. `train_step` runs one global step
//! of rl.md §1 on the agent's experiences.
use crate::config::{LossAgg, OldLogprobs, TrainConfig};
use crate::error::{LearnerError, Result};
use crate::experience::{Experience, Finish};
use crate::loss::{kl_tensor, policy_loss};
use crate::optim::AdamW;
use crate::packing::{by_length, micro_batches, pack, token_temperatures};
use crate::progress::Progress;
use crate::rl::{
    compute_advantages, compute_advantages_pooled, learning_rate, shuffle_order, SampleInput,
};
use crate::step_probes::{adapter_norm, first_token_entropy, peak_rss_bytes, tis_weights};
use comas_model::dtype::{parse_device, parse_kind};
use comas_model::lora::LoraConfig;
use comas_model::transformer::Checkpointed;
use comas_model::{CausalLm, LoraAdapter, LoraBatch};
use comas_workflow::moments::Moments;
use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
mod optimize;
mod prepare;
use std::sync::Arc;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// What the learner reports of a step: the metrics log's typed record of it.
pub use comas_workflow::step_log::TrainReport as StepReport;

pub struct Trainer {
    cfg: TrainConfig,
    model: CausalLm,
    adapter: Option<LoraAdapter>,
    reference: Option<CausalLm>,
    optim: AdamW,
    pub(crate) source_dir: PathBuf,
    /// Optimizer updates taken over the whole job (drives the schedule).
    pub optimizer_steps: u64,
    pub global_step: u64,
    /// Set when a full-model update failed midway (see `LearnerError::PartlyUpdated`).
    poisoned: Option<String>,
    /// Reports of the last steps trained, by step id (newest last), saved with checkpoints so
    /// that a learner restarted from one still answers a retried step with its report.
    pub recent_reports: VecDeque<(String, StepReport)>,
    /// Read by the service while a step runs (see `progress`).
    pub progress: Arc<Progress>,
}

/// How many step reports a trainer keeps.
pub const KEPT_REPORTS: usize = 16;

/// A batch's ℓ^old and ℓ^ref, computed before any update (`Trainer::prepare`).
pub struct Prepared {
    samples: usize,
    old: Vec<Vec<f64>>,
    /// With `tis_cap`: the behaviour policy's log-probs (the sampler's; ℓ^old for a sample
    /// that came without them, so its weights are 1).
    behaviour: Option<Vec<Vec<f64>>>,
    reference: Option<Vec<Vec<f64>>>,
    use_sampler: bool,
    mismatch: Option<f64>,
    seconds: f64,
}

impl Prepared {
    pub fn samples(&self) -> usize {
        self.samples
    }
}

/// The frozen base models a process has loaded, shared by its LoRA trainers: a learner that
/// trains many adapters over one base holds the base once (spec neuromas.md §4). Full
/// fine-tuning changes its weights, so it always loads its own copy.
#[derive(Default)]
pub struct Bases(Vec<(PathBuf, Kind, tch::Device, CausalLm)>);

impl Bases {
    /// A handle on the base in `dir` (no copy of its weights when it is loaded already).
    pub fn get(&mut self, dir: &Path, kind: Kind, device: tch::Device) -> Result<CausalLm> {
        if let Some((_, _, _, m)) =
            self.0.iter().find(|(d, k, v, _)| d == dir && *k == kind && *v == device)
        {
            return Ok(m.share()?);
        }
        let m = CausalLm::load(dir, kind, device)?;
        let handle = m.share()?;
        self.0.push((dir.to_path_buf(), kind, device, m));
        Ok(handle)
    }

    /// Base models held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Trainer {
    /// Loads the agent's model from a Hugging Face folder (and the LoRA adapter folder, if any,
    /// to continue training it), plus a frozen reference (the same folder) when β > 0.
    pub fn new(model_dir: &Path, cfg: TrainConfig, adapter_dir: Option<&Path>) -> Result<Self> {
        Self::with_reference(model_dir, cfg, adapter_dir, None)
    }

    /// As `new`, with the reference model read from `reference_dir` (default: `model_dir`).
    /// A resumed learner passes the original base model here, not its checkpoint.
    pub fn with_reference(
        model_dir: &Path,
        cfg: TrainConfig,
        adapter_dir: Option<&Path>,
        reference_dir: Option<&Path>,
    ) -> Result<Self> {
        Self::in_process(&mut Bases::default(), model_dir, cfg, adapter_dir, reference_dir)
    }

    /// As `with_reference`; a LoRA trainer takes its frozen base from `bases`, loading it there
    /// only if no other trainer of the process has.
    pub fn in_process(
        bases: &mut Bases,
        model_dir: &Path,
        cfg: TrainConfig,
        adapter_dir: Option<&Path>,
        reference_dir: Option<&Path>,
    ) -> Result<Self> {
        cfg.validate()?;
        let kind = parse_kind(&cfg.dtype)?;
        let device = parse_device(&cfg.device)?;
        let model = if cfg.lora.is_some() || adapter_dir.is_some() {
            bases.get(model_dir, kind, device)?
        } else {
            CausalLm::load(model_dir, kind, device)?
        };
        let adapter = match (&cfg.lora, adapter_dir) {
            (None, None) => None,
            (_, Some(dir)) => Some(LoraAdapter::load(dir, model.config(), kind, device)?),
            (Some(l), None) => {
                let lc = LoraConfig {
                    base_model_name_or_path: Some(model_dir.display().to_string()),
                    ..LoraConfig::new(l.r, l.alpha, l.target_modules.clone(), l.use_rslora)
                };
                Some(LoraAdapter::init(model.config(), lc, cfg.seed as i64, kind, device)?)
            }
        };
        // With LoRA the frozen base is the reference, so no second copy is needed.
        let reference = if cfg.kl_coef > 0.0 && adapter.is_none() {
            let dir = reference_dir.unwrap_or(model_dir);
            let r = CausalLm::load(dir, kind, device)?;
            if r.config().vocab_size != model.config().vocab_size {
                return Err(LearnerError::Config(format!(
                    "reference model {} has vocab_size {} but the policy has {}",
                    dir.display(),
                    r.config().vocab_size,
                    model.config().vocab_size
                )));
            }
            Some(r)
        } else {
            None
        };
        let params = match &adapter {
            Some(a) => {
                a.set_requires_grad(true);
                a.named_tensors()
            }
            None => {
                model.set_requires_grad(true);
                model.named_parameters()
            }
        };
        let optim = AdamW::new(
            params,
            (cfg.adam_betas[0], cfg.adam_betas[1]),
            cfg.adam_eps,
            cfg.weight_decay,
        );
        Ok(Self {
            optimizer_steps: cfg.completed_steps,
            global_step: 0,
            poisoned: None,
            recent_reports: VecDeque::new(),
            progress: Progress::shared(),
            cfg,
            model,
            adapter,
            reference,
            optim,
            source_dir: model_dir.to_path_buf(),
        })
    }

    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    pub fn model(&self) -> &CausalLm {
        &self.model
    }

    pub fn adapter(&self) -> Option<&LoraAdapter> {
        self.adapter.as_ref()
    }

    pub fn optimizer(&self) -> &AdamW {
        &self.optim
    }

    pub fn optimizer_mut(&mut self) -> &mut AdamW {
        &mut self.optim
    }

    pub fn source_dir(&self) -> &Path {
        &self.source_dir
    }

    /// One global step on `batch`: experience making, advantages, then one or more optimizer
    /// steps. An optimizer step whose loss or gradient is not finite is skipped (reported in
    /// `skipped_steps`); when every one is, nothing changed and a `NonFinite` error is returned.
    /// Any other failure of a multi-step update restores an adapter from its snapshot (LoRA-sized,
    /// cheap); a full model has no snapshot and the trainer refuses further steps.
    pub fn train_step(&mut self, batch: &[Experience]) -> Result<StepReport> {
        let prepared = self.prepare(batch)?;
        self.train_prepared(batch, prepared, None)
    }

    /// `train_step` on a batch already prepared (by `prepare`, at the current weights), with its
    /// advantages whitened by `pooled` moments where they name a norm group.
    pub fn train_prepared(
        &mut self,
        batch: &[Experience],
        prepared: Prepared,
        pooled: Option<&BTreeMap<String, Moments>>,
    ) -> Result<StepReport> {
        let started = Instant::now();
        let _span =
            tracing::info_span!("train_step", step = self.global_step + 1, samples = batch.len())
                .entered();
        if let Some(why) = &self.poisoned {
            return Err(LearnerError::PartlyUpdated(why.clone()));
        }
        if prepared.samples != batch.len() || batch.is_empty() {
            return Err(LearnerError::Batch(format!(
                "{} samples prepared for a batch of {}",
                prepared.samples,
                batch.len()
            )));
        }
        let progress = Arc::clone(&self.progress);
        let _running =
            progress.begin(self.global_step + 1, (batch.len() * self.cfg.max_epochs) as u32);
        crate::fault::stall_at(self.global_step + 1);
        // 3–7. Advantages.
        let mut adv =
            compute_advantages_pooled(&Self::sample_inputs(batch, &prepared), &self.cfg, pooled);
        if crate::fault::flips_advantages() {
            adv.advantages.iter_mut().flatten().for_each(|a| *a = -*a);
        }
        let Prepared {
            old,
            behaviour,
            reference,
            use_sampler,
            mismatch,
            seconds: prepare_seconds,
            ..
        } = prepared;
        let device = self.model.device();

        // 8. Optimizer steps.
        let n = batch.len();
        let steps_here = n.div_ceil(self.cfg.train_batch_size) * self.cfg.max_epochs;
        // Only adapter state is small enough to copy every update.
        let snapshot = (steps_here > 1 && self.adapter.is_some()).then(|| self.optim.snapshot());
        let steps_before = self.optimizer_steps;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.optimize(
                batch,
                &old,
                behaviour.as_deref(),
                reference.as_deref(),
                &adv.advantages,
                &adv.loss_mask,
                device,
            )
        }))
        .unwrap_or_else(|p| Err(LearnerError::Panicked(comas_service::panic_message(p.as_ref()))));
        let mut report = match result {
            Ok(r) => r,
            Err(e) => {
                let applied = self.optimizer_steps - steps_before;
                match snapshot {
                    Some(s) => self.optim.restore(s)?,
                    None => self.optim.zero_grad()?,
                }
                if applied > 0 && self.adapter.is_none() {
                    let why = format!("optimizer step {} of {steps_here} failed: {e}", applied + 1);
                    self.poisoned = Some(why.clone());
                    return Err(LearnerError::PartlyUpdated(why));
                }
                self.optimizer_steps = steps_before;
                return Err(e);
            }
        };
        self.global_step += 1;
        report.global_step = self.global_step;
        report.samples = n;
        report.completion_tokens = batch.iter().map(|e| e.completion_ids.len()).sum();
        report.singleton_groups = adv.stats.singleton_groups;
        report.return_mean = adv.stats.return_mean;
        report.return_std = adv.stats.return_std;
        report.truncated = batch.iter().filter(|e| e.finish_reason == Finish::Length).count();
        report.masked_samples = adv.loss_mask.iter().filter(|m| !**m).count();
        report.zero_advantage_samples = adv
            .advantages
            .iter()
            .zip(&adv.loss_mask)
            .filter(|(a, m)| **m && a.iter().all(|&x| x == 0.0))
            .count();
        report.no_gradient = report.masked_samples + report.zero_advantage_samples == n;
        if report.no_gradient {
            tracing::warn!(
                samples = n,
                masked = report.masked_samples,
                "no sample of this step carries a policy gradient"
            );
        }
        let masked: Vec<f64> = adv
            .advantages
            .iter()
            .zip(&adv.loss_mask)
            .filter(|(_, m)| **m)
            .flat_map(|(a, _)| a.iter().copied())
            .collect();
        report.advantage_mean =
            if masked.is_empty() { 0.0 } else { masked.iter().sum::<f64>() / masked.len() as f64 };
        if self.cfg.kl_coef > 0.0 && !self.cfg.kl_in_loss {
            report.kl = adv.stats.kl_in_reward_mean;
        }
        report.sampler_mismatch = mismatch;
        report.old_logprobs_from_sampler = use_sampler;
        report.return_moments = adv.moments;
        report.peak_rss_bytes = peak_rss_bytes();
        report.seconds = prepare_seconds + started.elapsed().as_secs_f64();
        report.tokens_per_s = report.tokens as f64 / report.seconds.max(1e-9);
        tracing::info!(
            loss = report.loss,
            grad_norm = report.grad_norm,
            lr = report.lr,
            "step done"
        );
        Ok(report)
    }

    /// A global step with nothing to learn from (a method may leave an agent without samples in
    /// a step, e.g. when a coach scored none of its actions): the step counter advances so the
    /// agent's versions stay in step with the others', and the weights do not change.
    pub fn empty_step(&mut self) -> StepReport {
        self.global_step += 1;
        tracing::info!(step = self.global_step, "a step without samples: nothing trained");
        StepReport {
            global_step: self.global_step,
            peak_rss_bytes: peak_rss_bytes(),
            no_gradient: true,
            ..StepReport::default()
        }
    }
}

/// The values of 0-dim f32 tensors, in one copy to the host: each is the f64 that
/// `double_value` would give, for one wait on the device instead of one per tensor.
fn host_scalars(ts: &[Tensor]) -> Vec<f64> {
    if ts.is_empty() {
        return Vec::new();
    }
    let flat: Vec<Tensor> = ts.iter().map(|t| t.to_kind(Kind::Float).reshape([1])).collect();
    let host = Tensor::cat(&flat, 0).to_device(Device::Cpu);
    Vec::<f32>::try_from(&host).expect("f32 figures").into_iter().map(f64::from).collect()
}
