//! The optimizer steps of a training step: micro-batches through the model with the loss,
//! gradients accumulated, clipped and applied (or the step skipped when they are not finite).
use super::*;

impl Trainer {
    /// Drops the gradients of an optimizer step that went non-finite and counts it as skipped.
    pub(super) fn skip_step(
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
    pub(super) fn optimize(
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
