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

    /// Completion log-probs (f32, flat in sample order) and, optionally, the per-token entropy,
    /// under `model` (+ adapter). Only completion positions go through the vocabulary
    /// projection: prompts can be long and their logits are never needed.
    /// With `checkpoint`, the forward is checkpointed and what its backward needs comes back:
    /// call its `backward()` after the loss's.
    fn completion_logprobs<'a>(
        &'a self,
        model: &'a CausalLm,
        with_adapter: bool,
        batch: &[&Experience],
        want_entropy: bool,
        want_first: bool,
        checkpoint: bool,
    ) -> Result<(Tensor, Option<Tensor>, Option<(f64, usize)>, usize, Option<Checkpointed<'a>>)>
    {
        let p = pack(batch, model.config().vocab_size, model.device());
        let lora = match (&self.adapter, with_adapter) {
            (Some(a), true) => Some(LoraBatch::uniform(a)),
            _ => None,
        };
        let (hidden, ckpt) = if checkpoint {
            let (h, c) = model.forward_hidden_checkpointed(&p.ids, Some(&p.valid), lora)?;
            (h, Some(c))
        } else {
            (model.forward_hidden(&p.ids, Some(&p.valid), lora.as_ref())?, None)
        };
        let h = hidden.reshape([-1, hidden.size()[2]]).index_select(0, &p.gather);
        // Each token at the temperature its turn was sampled at (roles may differ).
        let logits = match token_temperatures(batch, self.cfg.temperature, model.device()) {
            None => model.lm_head(&h).to_kind(Kind::Float) / self.cfg.temperature,
            Some(t) => model.lm_head(&h).to_kind(Kind::Float) / t.unsqueeze(-1),
        };
        let lsm = logits.log_softmax(-1, Kind::Float);
        let mut lp = lsm.gather(-1, &p.targets.unsqueeze(-1), false).squeeze_dim(-1);
        if let Some((rows, allowed)) = &p.constrained {
            // A token drawn from a restricted set: its log-prob renormalised over that set, as
            // the sampler computed it (a forced token gets exactly 0 and no gradient).
            let sub = logits
                .index_select(0, rows)
                .masked_fill(&allowed.logical_not(), f64::NEG_INFINITY)
                .log_softmax(-1, Kind::Float);
            let picked = sub
                .gather(-1, &p.targets.index_select(0, rows).unsqueeze(-1), false)
                .squeeze_dim(-1);
            lp = lp.index_copy(0, rows, &picked);
        }
        let entropy = want_entropy.then(|| {
            tch::no_grad(|| (lsm.exp() * &lsm).sum_dim_intlist(-1, false, Kind::Float).neg())
        });
        let first = want_first.then(|| tch::no_grad(|| first_token_entropy(&lsm, batch)));
        Ok((lp, entropy, first, p.tokens, ckpt))
    }

    /// ℓ under `model` for every sample, without gradient, in micro-batches.
    fn logprobs_no_grad(
        &self,
        model: &CausalLm,
        with_adapter: bool,
        batch: &[Experience],
    ) -> Result<Vec<Vec<f64>>> {
        let _g = tch::no_grad_guard();
        let lens: Vec<usize> = batch.iter().map(Experience::len).collect();
        // Each sample's log-probs are its own, whatever it is batched with.
        let order = by_length(&(0..batch.len()).collect::<Vec<_>>(), &lens);
        let mut out = vec![Vec::new(); batch.len()];
        for mb in
            micro_batches(&order, &lens, self.cfg.micro_batch_size, self.cfg.micro_batch_tokens)
        {
            let refs: Vec<&Experience> = mb.iter().map(|&i| &batch[i]).collect();
            let (lp, _, _, _, _) =
                self.completion_logprobs(model, with_adapter, &refs, false, false, false)?;
            let flat = Vec::<f32>::try_from(&lp.to_device(Device::Cpu))?;
            let mut off = 0;
            for &i in &mb {
                let n = batch[i].completion_ids.len();
                out[i] = flat[off..off + n].iter().map(|&x| x as f64).collect();
                off += n;
            }
            self.progress.beat();
        }
        Ok(out)
    }

    /// ℓ^old (and ℓ^ref) of `batch` under the current weights, before any update: the part of
    /// a step that the return moments need, done once per step.
    pub fn prepare(&self, batch: &[Experience]) -> Result<Prepared> {
        let started = Instant::now();
        if let Some(why) = &self.poisoned {
            return Err(LearnerError::PartlyUpdated(why.clone()));
        }
        if batch.is_empty() {
            return Err(LearnerError::Batch("empty batch".into()));
        }
        let vocab = self.model.config().vocab_size;
        for (i, e) in batch.iter().enumerate() {
            e.validate(&format!("sample {i}"), vocab)?;
            if e.token_rewards.is_some() && self.cfg.estimator.uses_groups() {
                return Err(LearnerError::Batch(format!(
                    "sample {i}: token rewards need the `reinforce` estimator"
                )));
            }
        }
        let use_sampler = self.cfg.old_logprobs == OldLogprobs::Sampler
            && batch.iter().all(|e| e.sampling_logprobs.is_some());
        let old: Vec<Vec<f64>> = if use_sampler {
            batch.iter().map(|e| e.sampling_logprobs.clone().expect("checked above")).collect()
        } else {
            self.logprobs_no_grad(&self.model, true, batch)?
        };
        let reference = if self.cfg.kl_coef > 0.0 {
            Some(match &self.reference {
                Some(r) => self.logprobs_no_grad(r, false, batch)?,
                None => self.logprobs_no_grad(&self.model, false, batch)?,
            })
        } else {
            None
        };
        if old.iter().flatten().any(|x| !x.is_finite()) {
            return Err(LearnerError::NonFinite {
                what: "log-probabilities under the current weights".into(),
            });
        }
        let (mut mis_sum, mut mis_n) = (0.0, 0usize);
        for (e, o) in batch.iter().zip(&old).filter(|_| !use_sampler) {
            if let Some(s) = &e.sampling_logprobs {
                for (a, b) in o.iter().zip(s) {
                    mis_sum += (a - b).abs();
                    mis_n += 1;
                }
            }
        }
        let behaviour = (self.cfg.tis_cap > 0.0 && !use_sampler).then(|| {
            batch
                .iter()
                .zip(&old)
                .map(|(e, o)| e.sampling_logprobs.clone().unwrap_or_else(|| o.clone()))
                .collect()
        });
        Ok(Prepared {
            samples: batch.len(),
            old,
            behaviour,
            reference,
            use_sampler,
            mismatch: (mis_n > 0).then(|| mis_sum / mis_n as f64),
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    fn sample_inputs<'a>(batch: &'a [Experience], p: &'a Prepared) -> Vec<SampleInput<'a>> {
        batch
            .iter()
            .enumerate()
            .map(|(i, e)| SampleInput {
                reward: e.scalar_reward(),
                token_rewards: e.token_rewards.as_deref(),
                group: &e.group,
                norm_group: &e.norm_group,
                truncated: e.finish_reason == Finish::Length,
                old_logprobs: &p.old[i],
                ref_logprobs: p.reference.as_ref().map(|r| r[i].as_slice()),
            })
            .collect()
    }

    /// The moments of `batch`'s returns per norm group, for pooling with other learners'.
    pub fn return_moments(
        &self,
        batch: &[Experience],
        prepared: &Prepared,
    ) -> BTreeMap<String, Moments> {
        compute_advantages(&Self::sample_inputs(batch, prepared), &self.cfg).moments
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

    /// Drops the gradients of an optimizer step that went non-finite and counts it as skipped.
    fn skip_step(
        &mut self,
        report: &mut StepReport,
        first: &mut Option<String>,
        what: String,
    ) -> Result<()> {
        tracing::warn!(what = %what, "non-finite optimizer step skipped");
        self.optim.zero_grad()?;
        report.skipped_steps += 1;
        first.get_or_insert(what);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn optimize(
        &mut self,
        batch: &[Experience],
        old: &[Vec<f64>],
        behaviour: Option<&[Vec<f64>]>,
        reference: Option<&[Vec<f64>]>,
        adv: &[Vec<f64>],
        loss_mask: &[bool],
        device: Device,
    ) -> Result<StepReport> {
        let cfg = self.cfg.clone();
        let n = batch.len();
        let lens: Vec<usize> = batch.iter().map(Experience::len).collect();
        let mut report = StepReport::default();
        let (mut clip_sum, mut akl_sum, mut ent_sum, mut tok_sum) = (0.0, 0.0, 0.0, 0.0);
        let (mut first_sum, mut first_count) = (0.0, 0usize);
        let (mut tis_sum, mut tis_cut) = (0.0, 0.0);
        let mut norms = Vec::new();
        let to_t = |v: Vec<f64>| Tensor::from_slice(&v).to_kind(Kind::Float).to_device(device);
        // The shuffle is seeded by the optimizer steps already taken, which a resumed learner
        // restores from its checkpoint.
        let steps_before = self.optimizer_steps;
        let weights: Vec<Vec<f64>> =
            batch.iter().zip(loss_mask).map(|(e, &m)| e.token_weights(m)).collect();
        let in_loss = |i: usize| weights[i].iter().any(|&w| w > 0.0);
        let mut first_skip: Option<String> = None;
        for epoch in 0..cfg.max_epochs {
            let order: Vec<usize> = if cfg.shuffle {
                shuffle_order(n, cfg.seed, steps_before, epoch as u64)
            } else {
                (0..n).collect()
            };
            'steps: for chunk in order.chunks(cfg.train_batch_size) {
                // Denominators for the whole optimizer step, fixed before any micro-batch (§7).
                let step_tokens: f64 = chunk.iter().map(|&i| weights[i].iter().sum::<f64>()).sum();
                let step_seqs = chunk.iter().filter(|&&i| in_loss(i)).count();
                let grouped = match cfg.loss_agg {
                    LossAgg::TokenMean | LossAgg::SeqMean if cfg.group_by_length => {
                        by_length(chunk, &lens)
                    }
                    _ => chunk.to_vec(),
                };
                let mbs =
                    micro_batches(&grouped, &lens, cfg.micro_batch_size, cfg.micro_batch_tokens);
                let (mut pg_total, mut kl_total) = (0.0, 0.0);
                for mb in &mbs {
                    let refs: Vec<&Experience> = mb.iter().map(|&i| &batch[i]).collect();
                    let (logp, entropy, first, tokens, ckpt) = self.completion_logprobs(
                        &self.model,
                        true,
                        &refs,
                        cfg.log_entropy,
                        true,
                        cfg.gradient_checkpointing,
                    )?;
                    if let Some((sum, n)) = first {
                        first_sum += sum;
                        first_count += n;
                    }
                    report.tokens += tokens;
                    self.progress.advance(mb.len() as u32, tokens as u64);
                    let cat = |f: &dyn Fn(usize) -> Vec<f64>| {
                        to_t(mb.iter().flat_map(|&i| f(i)).collect())
                    };
                    let old_t = cat(&|i| old[i].clone());
                    let adv_t = cat(&|i| adv[i].clone());
                    let mask_t = cat(&|i| weights[i].clone());
                    let seq_idx = Tensor::from_slice(
                        &mb.iter()
                            .enumerate()
                            .flat_map(|(k, &i)| vec![k as i64; adv[i].len()])
                            .collect::<Vec<_>>(),
                    )
                    .to_device(device);
                    let mb_tokens = mask_t.sum(Kind::Float).double_value(&[]);
                    // Reduce a per-token quantity to this micro-batch's share of the step loss.
                    let aggregate = |per_tok: &Tensor| -> Tensor {
                        let masked = per_tok * &mask_t;
                        match cfg.loss_agg {
                            LossAgg::TokenMean if step_tokens > 0.0 => {
                                masked.sum(Kind::Float) / step_tokens
                            }
                            LossAgg::MicrobatchMean if mb_tokens > 0.0 => {
                                masked.sum(Kind::Float) / mb_tokens / mbs.len() as f64
                            }
                            LossAgg::SeqMean if step_seqs > 0 => {
                                let zeros = Tensor::zeros([mb.len() as i64], (Kind::Float, device));
                                let sums = zeros.index_add(0, &seq_idx, &masked);
                                let counts = zeros.index_add(0, &seq_idx, &mask_t).clamp_min(1.0);
                                (sums / counts).sum(Kind::Float) / step_seqs as f64
                            }
                            _ => masked.sum(Kind::Float) * 0.0,
                        }
                    };
                    let tl = policy_loss(&logp, &old_t, &adv_t, &cfg);
                    // Truncated importance sampling: the weighted loss, and the weights' masked
                    // sum and the masked count of those at the cap (for the report).
                    let (pg, tis_figures) = match behaviour {
                        Some(b) => {
                            let w = tis_weights(&old_t, &cat(&|i| b[i].clone()), cfg.tis_cap);
                            let figures = tch::no_grad(|| {
                                vec![
                                    (&w * &mask_t).sum(Kind::Float),
                                    (w.ge(cfg.tis_cap).to_kind(Kind::Float) * &mask_t)
                                        .sum(Kind::Float),
                                ]
                            });
                            (aggregate(&(&tl.pg * w)), figures)
                        }
                        None => (aggregate(&tl.pg), Vec::new()),
                    };
                    let mut loss = pg.shallow_clone();
                    let mut kl_l = None;
                    if let (true, Some(r)) = (cfg.kl_in_loss && cfg.kl_coef > 0.0, reference) {
                        let ref_t = cat(&|i| r[i].clone());
                        let kl = aggregate(&kl_tensor(cfg.kl_estimator, &logp, &ref_t));
                        loss = loss + &kl * cfg.kl_coef;
                        kl_l = Some(kl);
                    }
                    let lv = loss.double_value(&[]);
                    if !lv.is_finite() {
                        // The importance weights of a skipped micro-batch still count.
                        if let [sum, cut] = host_scalars(&tis_figures)[..] {
                            (tis_sum, tis_cut) = (tis_sum + sum, tis_cut + cut);
                        }
                        drop(ckpt);
                        self.skip_step(&mut report, &mut first_skip, format!("loss ({lv})"))?;
                        continue 'steps;
                    }
                    loss.backward();
                    if let Some(c) = ckpt {
                        c.backward();
                    }
                    // Every figure of the micro-batch in one copy to the host (one wait for
                    // the device instead of one per figure), added up there in the same order.
                    let figures = tch::no_grad(|| {
                        let mut f = vec![
                            pg.detach(),
                            (&tl.clipped * &mask_t).sum(Kind::Float),
                            ((&old_t - &logp) * &mask_t).sum(Kind::Float),
                        ];
                        f.extend(kl_l.as_ref().map(Tensor::detach));
                        f.extend(entropy.as_ref().map(|e| (e * &mask_t).sum(Kind::Float)));
                        f.extend(tis_figures);
                        f
                    });
                    let mut host = host_scalars(&figures).into_iter();
                    let mut next = || host.next().expect("one host value per figure");
                    pg_total += next();
                    clip_sum += next();
                    akl_sum += next();
                    if kl_l.is_some() {
                        kl_total += next();
                    }
                    if entropy.is_some() {
                        ent_sum += next();
                    }
                    if behaviour.is_some() {
                        tis_sum += next();
                        tis_cut += next();
                    }
                    tok_sum += mb_tokens;
                }
                let norm = self.optim.grad_norm();
                if !norm.is_finite() {
                    self.skip_step(
                        &mut report,
                        &mut first_skip,
                        format!("gradient norm ({norm})"),
                    )?;
                    continue 'steps;
                }
                norms.push(norm);
                self.optim.clip_grad(norm, cfg.max_grad_norm)?;
                let lr = learning_rate(&cfg, self.optimizer_steps + 1);
                self.optim.step(lr)?;
                self.optim.zero_grad()?;
                self.optimizer_steps += 1;
                report.optimizer_steps += 1;
                report.lr = lr;
                report.pg_loss += pg_total;
                report.kl_loss += kl_total;
            }
        }
        if report.optimizer_steps == 0 {
            if let Some(what) = first_skip {
                return Err(LearnerError::NonFinite { what });
            }
        }
        let k = report.optimizer_steps.max(1) as f64;
        report.pg_loss /= k;
        report.kl_loss /= k;
        report.loss = report.pg_loss + cfg.kl_coef * report.kl_loss;
        let denom = tok_sum.max(1.0);
        report.clip_frac = clip_sum / denom;
        report.approx_kl = akl_sum / denom;
        report.entropy = ent_sum / denom;
        report.first_token_entropy = first_sum / first_count.max(1) as f64;
        if behaviour.is_some() {
            report.tis_weight_mean = Some(tis_sum / denom);
            report.tis_truncated_frac = Some(tis_cut / denom);
        }
        report.adapter_norm = self.adapter.as_ref().map(adapter_norm);
        if cfg.kl_in_loss {
            // As aggregated into the loss (mean over optimizer steps), like kl_loss.
            report.kl = report.kl_loss;
        }
        report.grad_norm = norms.iter().sum::<f64>() / norms.len().max(1) as f64;
        report.grad_norm_max = norms.iter().copied().fold(0.0, f64::max);
        Ok(report)
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
