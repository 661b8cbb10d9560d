//! Per-token policy loss (PPO clip, dual clip) and the KL-in-loss term, on tensors so gradients
//! flow to ℓ^θ (rl.md §6). Works in any float dtype; the worked-example tests use f64.
use crate::config::{KlEstimator, TrainConfig};
use tch::Tensor;

pub struct TokenLoss {
    /// ℓ_pg per token (with gradient).
    pub pg: Tensor,
    /// 1.0 where the clipped surrogate was the smaller one (s2 < s1).
    pub clipped: Tensor,
}

/// ℓ_pg for each token given ℓ^θ, ℓ^old and Â (all the same shape).
pub fn policy_loss(logp: &Tensor, old: &Tensor, adv: &Tensor, cfg: &TrainConfig) -> TokenLoss {
    let ratio = (logp - old).clamp(-20.0, 20.0).exp();
    let s1 = &ratio * adv;
    let s2 = ratio.clamp(1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high) * adv;
    let surrogate = s1.minimum(&s2);
    let clipped = s2.lt_tensor(&s1).to_kind(logp.kind());
    let pg = if cfg.dual_clip > 0.0 {
        let dual = surrogate.maximum(&(adv * cfg.dual_clip));
        dual.neg().where_self(&adv.lt(0.0), &surrogate.neg())
    } else {
        surrogate.neg()
    };
    TokenLoss { pg, clipped }
}

/// KL estimate per token on tensors, clamped to [-10, 10] (gradient flows through `logp`).
pub fn kl_tensor(estimator: KlEstimator, logp: &Tensor, reference: &Tensor) -> Tensor {
    let d = logp - reference;
    let k = match estimator {
        KlEstimator::K1 => d,
        KlEstimator::K2 => d.square() / 2.0,
        KlEstimator::K3 => d.neg().exp() - 1.0 + &d,
    };
    k.clamp(-10.0, 10.0)
}

#[cfg(test)]
mod tests {
    //! rl.md §10: the worked example, to 1e-6 in f64.
    use super::*;
    use crate::config::{Estimator, TrainConfig};
    use crate::rl::{compute_advantages, SampleInput};
    use tch::Kind;

    const R: [f64; 3] = [1.0, 0.0, 0.5];
    fn old() -> Vec<Vec<f64>> {
        vec![vec![-0.5, -1.0, -0.2], vec![-1.2, -0.3], vec![-0.7, -0.7, -0.1, -2.0]]
    }
    fn reference() -> Vec<Vec<f64>> {
        vec![vec![-0.6, -0.9, -0.2], vec![-1.0, -0.5], vec![-0.7, -0.8, -0.3, -1.5]]
    }
    fn theta() -> Vec<Vec<f64>> {
        vec![vec![-0.2, -1.0, -0.5], vec![-1.5, -0.1], vec![-0.9, -0.7, -0.1, -0.6]]
    }

    fn flat(v: &[Vec<f64>]) -> Tensor {
        Tensor::from_slice(&v.concat()).to_kind(Kind::Double)
    }

    /// Runs the example end to end and returns (L_PG over the masked tokens, clip_frac, Â).
    fn run(
        cfg: &TrainConfig,
        truncated: [bool; 3],
        micro: Option<&[&[usize]]>,
    ) -> (f64, f64, Vec<Vec<f64>>) {
        let (o, rf) = (old(), reference());
        let samples: Vec<SampleInput> = (0..3)
            .map(|i| SampleInput {
                reward: R[i],
                token_rewards: None,
                group: "g",
                norm_group: "",
                truncated: truncated[i],
                old_logprobs: &o[i],
                ref_logprobs: Some(&rf[i]),
            })
            .collect();
        let adv = compute_advantages(&samples, cfg);
        let th = theta();
        let tok = policy_loss(&flat(&th), &flat(&o), &flat(&adv.advantages), cfg);
        let mask: Vec<f64> = (0..3)
            .flat_map(|i| vec![if adv.loss_mask[i] { 1.0 } else { 0.0 }; th[i].len()])
            .collect();
        let mask = Tensor::from_slice(&mask);
        let loss = match micro {
            None => {
                ((&tok.pg * &mask).sum(Kind::Double) / mask.sum(Kind::Double)).double_value(&[])
            }
            Some(groups) => {
                // microbatch_mean parity: each micro-batch's masked token mean, averaged
                let offsets: Vec<usize> = th
                    .iter()
                    .scan(0, |a, s| {
                        let o = *a;
                        *a += s.len();
                        Some(o)
                    })
                    .collect();
                let mut total = 0.0;
                for g in groups {
                    let (mut num, mut den) = (0.0, 0.0);
                    for &i in *g {
                        for t in 0..th[i].len() {
                            let m = mask.double_value(&[(offsets[i] + t) as i64]);
                            num += tok.pg.double_value(&[(offsets[i] + t) as i64]) * m;
                            den += m;
                        }
                    }
                    total += if den > 0.0 { num / den } else { 0.0 };
                }
                total / groups.len() as f64
            }
        };
        let clip =
            ((&tok.clipped * &mask).sum(Kind::Double) / mask.sum(Kind::Double)).double_value(&[]);
        (loss, clip, adv.advantages)
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }

    #[test]
    fn case_a_reinforce() {
        let cfg = TrainConfig { estimator: Estimator::Reinforce, ..Default::default() };
        let (l, clip, adv) = run(&cfg, [false; 3], None);
        close(adv[0][0], 1.206045);
        close(adv[1][1], -1.507557);
        close(adv[2][3], -0.150756);
        close(l, 0.059656);
        close(clip, 2.0 / 9.0);
        let dual = TrainConfig { dual_clip: 3.0, ..cfg.clone() };
        close(run(&dual, [false; 3], None).0, 0.041981);
        close(run(&cfg, [false; 3], Some(&[&[0, 1], &[2]])).0, 0.079597);
        let baseline = TrainConfig { estimator: Estimator::ReinforceBaseline, ..cfg };
        let (lb, _, advb) = run(&baseline, [false; 3], None);
        close(lb, 0.059656);
        close(advb[0][1], 1.206045);
    }

    #[test]
    fn case_b_kl_in_reward() {
        let cfg =
            TrainConfig { kl_coef: 0.01, kl_estimator: KlEstimator::K1, ..Default::default() };
        let (l, _, adv) = run(&cfg, [false; 3], None);
        let want = [
            vec![1.201839, 1.204550, 1.201839],
            vec![-1.509755, -1.515178],
            vec![-0.148535, -0.148535, -0.145823, -0.140400],
        ];
        for (a, w) in adv.iter().zip(&want) {
            for (x, y) in a.iter().zip(w) {
                close(*x, *y);
            }
        }
        close(l, 0.056296);
    }

    #[test]
    fn case_c_group_norm() {
        let cfg = TrainConfig { estimator: Estimator::GroupNorm, ..Default::default() };
        let (l, _, adv) = run(&cfg, [false; 3], None);
        close(adv[0][0], 1.0);
        close(adv[1][0], -1.0);
        close(adv[2][0], 0.0);
        close(l, -0.102157);
    }

    #[test]
    fn case_d_truncation() {
        let parity = TrainConfig { truncated_in_norm_stats: true, ..Default::default() };
        close(run(&parity, [false, false, true], None).0, -0.099876);
        let default = TrainConfig::default();
        let (l, _, adv) = run(&default, [false, false, true], None);
        close(adv[0][0], 0.816497);
        close(adv[1][0], -1.224745);
        close(l, 0.014907);
    }

    #[test]
    fn kl_in_loss_k3_has_gradient() {
        let logp = Tensor::from_slice(&[-0.2f64, -1.0]).set_requires_grad(true);
        let rf = Tensor::from_slice(&[-0.6f64, -0.9]);
        let k = kl_tensor(KlEstimator::K3, &logp, &rf);
        close(k.double_value(&[0]), (-0.4f64).exp() - 1.0 + 0.4);
        k.sum(Kind::Double).backward();
        // d/dx [exp(-(x - r)) - 1 + (x - r)] = 1 - exp(-(x - r))
        close(logp.grad().double_value(&[0]), 1.0 - (-0.4f64).exp());
    }
}
