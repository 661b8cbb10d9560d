//! The RL math of rl.md as pure functions over plain numbers (f64): KL estimators, scalar
//! estimators over explicit groups, token rewards, returns and whitening. The loss itself, which
//! needs gradients, is in `loss.rs`.
use crate::config::{Estimator, KlEstimator, TrainConfig};
use comas_workflow::moments::Moments;
use std::collections::{BTreeMap, HashMap};

/// KL estimate of one token from log-probs under the policy (`a`) and the reference, clamped to
/// [-10, 10] (rl.md §2).
pub fn kl(estimator: KlEstimator, a: f64, reference: f64) -> f64 {
    let d = a - reference;
    let k = match estimator {
        KlEstimator::K1 => d,
        KlEstimator::K2 => d * d / 2.0,
        KlEstimator::K3 => (-d).exp() - 1.0 + d,
    };
    k.clamp(-10.0, 10.0)
}

/// What the advantage computation needs of one sample.
#[derive(Debug, Clone)]
pub struct SampleInput<'a> {
    pub reward: f64,
    /// Per-token rewards (process rewards) added on top of the scalar reward, if any.
    pub token_rewards: Option<&'a [f64]>,
    pub group: &'a str,
    /// Whitening partition: advantages are whitened with the samples of the same norm group
    /// (empty for all: the whole batch, rl.md's default).
    pub norm_group: &'a str,
    /// Ended without a stop token.
    pub truncated: bool,
    /// ℓ^old per response token.
    pub old_logprobs: &'a [f64],
    /// ℓ^ref per response token (only when β > 0).
    pub ref_logprobs: Option<&'a [f64]>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdvantageStats {
    pub singleton_groups: usize,
    /// Mean and std of the returns over the statistics mask (whitening estimators only).
    pub return_mean: f64,
    pub return_std: f64,
    /// Masked mean of the KL estimate in the reward (0 when KL is not in the reward).
    pub kl_in_reward_mean: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Advantages {
    /// Per sample, per response token.
    pub advantages: Vec<Vec<f64>>,
    pub returns: Vec<Vec<f64>>,
    /// Loss mask per sample: 0 for truncated samples when masking is on.
    pub loss_mask: Vec<bool>,
    pub stats: AdvantageStats,
    /// Moments of this batch's returns per norm group, over the statistics mask: what the
    /// coordinator pools to whiten over several learners' samples.
    pub moments: BTreeMap<String, Moments>,
}

/// Scalar stage (rl.md §4): transformed reward per sample; singleton groups give 0.
fn scalar_stage(estimator: Estimator, samples: &[SampleInput]) -> (Vec<f64>, usize) {
    if !estimator.uses_groups() {
        return (samples.iter().map(|s| s.reward).collect(), 0);
    }
    let mut groups: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, s) in samples.iter().enumerate() {
        groups.entry(s.group).or_default().push(i);
    }
    let mut out = vec![0.0; samples.len()];
    let mut singletons = 0;
    for idx in groups.values() {
        let n = idx.len();
        if n == 1 {
            singletons += 1;
            continue;
        }
        let rs: Vec<f64> = idx.iter().map(|&i| samples[i].reward).collect();
        let sum: f64 = rs.iter().sum();
        let mean = sum / n as f64;
        let std = (rs.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n as f64 - 1.0)).sqrt();
        for (&i, &r) in idx.iter().zip(&rs) {
            out[i] = match estimator {
                Estimator::ReinforceBaseline | Estimator::DrGrpo => r - mean,
                Estimator::Rloo => r - (sum - r) / (n as f64 - 1.0),
                Estimator::GroupNorm => (r - mean) / (std + 1e-9),
                Estimator::Reinforce => unreachable!("no groups"),
            };
        }
    }
    (out, singletons)
}

/// Advantages for one agent's step buffer (rl.md §1 steps 4–7).
pub fn compute_advantages(samples: &[SampleInput], cfg: &TrainConfig) -> Advantages {
    compute_advantages_pooled(samples, cfg, None)
}

/// Advantages whitened with `pooled` moments where they name a norm group (moments pooled over
/// several learners' samples: MAPPA's `global` scope), with this batch's own elsewhere.
pub fn compute_advantages_pooled(
    samples: &[SampleInput],
    cfg: &TrainConfig,
    pooled: Option<&BTreeMap<String, Moments>>,
) -> Advantages {
    let (scalars, singleton_groups) = scalar_stage(cfg.estimator, samples);
    let gamma = cfg.effective_gamma();
    let kl_in_reward = cfg.kl_coef > 0.0 && !cfg.kl_in_loss;
    let mut returns = Vec::with_capacity(samples.len());
    let mut loss_mask = Vec::with_capacity(samples.len());
    let (mut kl_sum, mut kl_n) = (0.0, 0usize);
    for (s, &scalar) in samples.iter().zip(&scalars) {
        let t = s.old_logprobs.len();
        let masked_out = cfg.mask_truncated && s.truncated;
        loss_mask.push(!masked_out);
        let mut r = vec![0.0; t];
        if let Some(tr) = s.token_rewards {
            for (x, y) in r.iter_mut().zip(tr) {
                *x += y.clamp(-cfg.reward_clip, cfg.reward_clip);
            }
        }
        if kl_in_reward {
            let refs = s.ref_logprobs.expect("reference log-probs when kl_coef > 0");
            for (k, x) in r.iter_mut().enumerate() {
                let est = kl(cfg.kl_estimator, s.old_logprobs[k], refs[k]);
                *x -= cfg.kl_coef * est;
                if !masked_out {
                    kl_sum += est;
                    kl_n += 1;
                }
            }
        }
        if t > 0 {
            r[t - 1] += scalar.clamp(-cfg.reward_clip, cfg.reward_clip);
        }
        let mut g = vec![0.0; t];
        let mut acc = 0.0;
        for k in (0..t).rev() {
            acc = r[k] + gamma * acc;
            g[k] = acc;
        }
        returns.push(g);
    }
    let mut stats = AdvantageStats {
        singleton_groups,
        kl_in_reward_mean: if kl_n > 0 { kl_sum / kl_n as f64 } else { 0.0 },
        ..Default::default()
    };
    let in_stats = |i: usize| loss_mask[i] || cfg.truncated_in_norm_stats;
    // Moments of the tokens of the samples `members` picks (in the stats mask).
    let moments = |members: &dyn Fn(usize) -> bool| {
        let picked = || {
            returns.iter().enumerate().filter(|(i, _)| in_stats(*i) && members(*i)).map(|(_, g)| g)
        };
        // Summed per sample, then over samples: the order the PyTorch reference sums in.
        let (sum, n) =
            picked().fold((0.0, 0u64), |(s, n), g| (s + g.iter().sum::<f64>(), n + g.len() as u64));
        let mean = if n > 0 { sum / n as f64 } else { 0.0 };
        Moments {
            count: n,
            mean,
            m2: picked().flat_map(|g| g.iter()).map(|x| (x - mean).powi(2)).sum::<f64>(),
        }
    };
    if cfg.estimator.whitens() {
        let whole = moments(&|_| true);
        stats.return_mean = whole.mean;
        stats.return_std = whole.variance().sqrt();
    }
    let mut local: BTreeMap<String, Moments> = BTreeMap::new();
    for s in samples {
        if !local.contains_key(s.norm_group) {
            let key = s.norm_group;
            local.insert(key.to_string(), moments(&|i| samples[i].norm_group == key));
        }
    }
    let advantages = if cfg.estimator.whitens() {
        let of_group = |g: &str| {
            pooled.and_then(|p| p.get(g)).or_else(|| local.get(g)).copied().unwrap_or_default()
        };
        samples
            .iter()
            .zip(&returns)
            .map(|(s, g)| {
                let m = of_group(s.norm_group);
                let scale = if cfg.no_std_norm { 1.0 } else { 1.0 / m.variance().max(1e-8).sqrt() };
                g.iter().map(|x| (x - m.mean) * scale).collect()
            })
            .collect()
    } else {
        returns.clone()
    };
    Advantages { advantages, returns, loss_mask, stats, moments: local }
}

/// Learning rate for the 1-based optimizer update `k` (rl.md §9).
pub fn learning_rate(cfg: &TrainConfig, k: u64) -> f64 {
    let s = cfg.total_steps as f64;
    let w = (cfg.warmup_ratio * s).ceil();
    let (max, min) = (cfg.lr, cfg.lr * cfg.min_lr_ratio);
    let cosine = |p: f64| min + (max - min) * 0.5 * (1.0 + (std::f64::consts::PI * p).cos());
    match cfg.lr_schedule {
        crate::config::LrSchedule::Cosine => {
            let k = k as f64;
            if k <= w {
                max * k / w
            } else {
                cosine(((k - w) / (s - w).max(1.0)).min(1.0))
            }
        }
        crate::config::LrSchedule::CosineHfParity => {
            let step = (k as f64) - 1.0;
            if step < w {
                max * step / w.max(1.0)
            } else {
                cosine((step - w) / (s - w).max(1.0))
            }
        }
    }
}

/// The order in which one epoch of a global step visits its `n` samples (rl.md §8): a
/// Fisher–Yates shuffle driven by SplitMix64, seeded by the config seed, the optimizer steps
/// taken before this global step, and the epoch. Written out so the PyTorch reference
/// (`tests/fixtures/learner/ref_step.py`) computes the same permutation.
pub fn shuffle_order(n: usize, seed: u64, steps_before: u64, epoch: u64) -> Vec<usize> {
    let mut state = seed
        ^ (steps_before + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    #[test]
    fn shuffle_order_is_the_references_permutation() {
        // Printed by ref_step.py for the `reinforce_shuffled` fixture (seed 7, 3 steps before).
        assert_eq!(super::shuffle_order(8, 7, 3, 0), [3, 2, 4, 0, 7, 1, 5, 6]);
        assert_eq!(super::shuffle_order(8, 7, 3, 1), [3, 5, 0, 1, 6, 7, 4, 2]);
        assert_eq!(super::shuffle_order(1, 7, 3, 0), [0]);
        assert!(super::shuffle_order(0, 7, 3, 0).is_empty());
    }

    use super::*;
    use crate::config::LrSchedule;

    /// MAPPA (spec mappa.md §5) on this code: two actions of one agent scored 7 and 4 by the
    /// coach (R = 0.1 · score), k1 KL in the reward with β = 0.01, reward-to-go within each
    /// action (γ = 1), then whitening over the agent's tokens. Worked by hand:
    /// A: k1 = old − ref = [0.2, −0.1] → r = [−0.002, 0.001 + 0.7] → G = [0.699, 0.701];
    /// B: k1 = [0, 0.3] → r = [0, −0.003 + 0.4] → G = [0.397, 0.397];
    /// mean 0.5485, std 0.151502 → A = [0.99339, 1.00659], B = [−0.99999, −0.99999].
    #[test]
    fn a_mappa_step_worked_by_hand() {
        use super::*;
        let cfg = TrainConfig {
            estimator: crate::config::Estimator::Reinforce,
            kl_coef: 0.01,
            ..Default::default()
        };
        const OLD_A: [f64; 2] = [-0.5, -1.0];
        const REF_A: [f64; 2] = [-0.7, -0.9];
        const OLD_B: [f64; 2] = [-0.2, -0.3];
        const REF_B: [f64; 2] = [-0.2, -0.6];
        let sample = |reward: f64, old: &'static [f64], reference: &'static [f64]| SampleInput {
            reward,
            token_rewards: None,
            group: "unique",
            norm_group: "",
            truncated: false,
            old_logprobs: old,
            ref_logprobs: Some(reference),
        };
        let out = compute_advantages(
            &[sample(0.1 * 7.0, &OLD_A, &REF_A), sample(0.1 * 4.0, &OLD_B, &REF_B)],
            &cfg,
        );
        let round = |v: &[f64]| v.iter().map(|x| (x * 1e5).round() / 1e5).collect::<Vec<_>>();
        assert_eq!(round(&out.returns[0]), [0.699, 0.701]);
        assert_eq!(round(&out.returns[1]), [0.397, 0.397]);
        assert_eq!(
            (round(&[out.stats.return_mean])[0], round(&[out.stats.return_std])[0]),
            (0.5485, 0.1515)
        );
        assert_eq!(round(&out.advantages[0]), [0.99339, 1.00659]);
        assert_eq!(round(&out.advantages[1]), [-0.99999, -0.99999]);
        assert_eq!(round(&[out.stats.kl_in_reward_mean])[0], 0.1);
        // `per_agent_role`: the same agent also played a second role, whose action C scored 2
        // (old = ref, so G = [0.2, 0.2]). Pooled, C shifts A and B; by role, A and B whiten
        // exactly as above and C, alone in its role, gets 0 (its std floors at 1e-4).
        const FLAT: [f64; 2] = [-0.4, -0.4];
        let c = SampleInput { norm_group: "verifier", ..sample(0.1 * 2.0, &FLAT, &FLAT) };
        let (a, b) = (
            SampleInput { norm_group: "solver", ..sample(0.7, &OLD_A, &REF_A) },
            SampleInput { norm_group: "solver", ..sample(0.4, &OLD_B, &REF_B) },
        );
        let split = compute_advantages(&[a.clone(), b.clone(), c.clone()], &cfg);
        assert_eq!(round(&split.advantages[0]), [0.99339, 1.00659]);
        assert_eq!(round(&split.advantages[1]), [-0.99999, -0.99999]);
        assert_eq!(round(&split.advantages[2]), [0.0, 0.0]);
        let pooled = compute_advantages(
            &[
                SampleInput { norm_group: "", ..a.clone() },
                SampleInput { norm_group: "", ..b.clone() },
                SampleInput { norm_group: "", ..c.clone() },
            ],
            &cfg,
        );
        assert!(pooled.advantages[2][0] < -1.0, "{:?}", pooled.advantages);
        // The logged statistics stay the whole batch's.
        assert_eq!(split.stats.return_mean, pooled.stats.return_mean);
        // `global`: A and B on one learner, C on another. Each learner reports its moments, the
        // coordinator pools them (mean 0.432333, std 0.205648 over the six tokens) and both
        // whiten with the pool: exactly the one-batch result.
        let (ab, c_alone) = (
            [SampleInput { norm_group: "", ..a }, SampleInput { norm_group: "", ..b }],
            [SampleInput { norm_group: "", ..c }],
        );
        let (first, second) = (compute_advantages(&ab, &cfg), compute_advantages(&c_alone, &cfg));
        assert_eq!(
            (first.moments.len(), first.moments[""].count, second.moments[""].count),
            (1, 4, 2)
        );
        let pool: BTreeMap<String, Moments> =
            [(String::new(), Moments::pool([first.moments[""], second.moments[""]]))].into();
        let (first, second) = (
            compute_advantages_pooled(&ab, &cfg, Some(&pool)),
            compute_advantages_pooled(&c_alone, &cfg, Some(&pool)),
        );
        assert_eq!(round(&first.advantages[0]), [1.29671, 1.30644]);
        assert_eq!(round(&first.advantages[1]), [-0.17181, -0.17181]);
        assert_eq!(round(&second.advantages[0]), [-1.12976, -1.12976]);
        for (x, y) in first
            .advantages
            .iter()
            .chain(&second.advantages)
            .flatten()
            .zip(pooled.advantages.iter().flatten())
        {
            assert!((x - y).abs() < 1e-12, "{x} {y}");
        }
    }

    #[test]
    fn kl_estimators_match_rl_md() {
        // (old, ref) pairs of the worked example, S3
        let old = [-0.7, -0.7, -0.1, -2.0];
        let rf = [-0.7, -0.8, -0.3, -1.5];
        let k1: Vec<f64> = old.iter().zip(&rf).map(|(a, b)| kl(KlEstimator::K1, *a, *b)).collect();
        let k3: Vec<f64> = old.iter().zip(&rf).map(|(a, b)| kl(KlEstimator::K3, *a, *b)).collect();
        let k2 = kl(KlEstimator::K2, -2.0, -1.5);
        for (a, b) in k1.iter().zip([0.0, 0.1, 0.2, -0.5]) {
            assert!((a - b).abs() < 1e-12);
        }
        for (a, b) in k3.iter().zip([0.0, 0.004837, 0.018731, 0.148721]) {
            assert!((a - b).abs() < 1e-6, "{a} {b}");
        }
        assert!((k2 - 0.125).abs() < 1e-12);
        assert_eq!(kl(KlEstimator::K1, 30.0, 0.0), 10.0);
    }

    #[test]
    fn learning_rate_table() {
        let cfg = TrainConfig {
            total_steps: 104,
            warmup_ratio: 4.0 / 104.0,
            lr: 1e-6,
            ..Default::default()
        };
        assert_eq!((cfg.warmup_ratio * 104.0).ceil(), 4.0);
        let want = [
            (1, 2.5e-7),
            (2, 5.0e-7),
            (4, 1.0e-6),
            (5, 9.99778e-7),
            (54, 5.5e-7),
            (104, 1.0e-7),
            (150, 1.0e-7),
        ];
        for (k, v) in want {
            assert!(
                (learning_rate(&cfg, k) - v).abs() < 1e-12,
                "k={k}: {}",
                learning_rate(&cfg, k)
            );
        }
        let hf = TrainConfig { lr_schedule: LrSchedule::CosineHfParity, ..cfg };
        let want = [
            (1, 0.0),
            (2, 2.5e-7),
            (4, 7.5e-7),
            (5, 1.0e-6),
            (54, 5.641348e-7),
            (104, 1.002220e-7),
            (150, 4.796045e-7),
        ];
        for (k, v) in want {
            assert!((learning_rate(&hf, k) - v).abs() < 1e-12, "k={k}: {}", learning_rate(&hf, k));
        }
    }
}
