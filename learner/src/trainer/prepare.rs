//! Before a step trains: each sample's old log-probs (and the reference's, for a KL term) in
//! one pass without gradients, the returns and their moments.
use super::*;

impl Trainer {
    /// Completion log-probs (f32, flat in sample order) and, optionally, the per-token entropy,
    /// under `model` (+ adapter). Only completion positions go through the vocabulary
    /// projection: prompts can be long and their logits are never needed.
    /// With `checkpoint`, the forward is checkpointed and what its backward needs comes back:
    /// call its `backward()` after the loss's.
    pub(super) fn completion_logprobs<'a>(
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
    pub(super) fn logprobs_no_grad(
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

    pub(super) fn sample_inputs<'a>(
        batch: &'a [Experience],
        p: &'a Prepared,
    ) -> Vec<SampleInput<'a>> {
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
}
