//! Which earlier (solution, evaluation) pairs the solvers of a round get to see (spec 3.4).
use super::config::DiscussionSource;
use rand::seq::index;
use rand_chacha::ChaCha8Rng;

/// A finished pair of an earlier round, by turn index. `evaluation` is `None` in the
/// no-evaluation ablation, where solutions are quoted alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairRef {
    pub round: u32,
    pub solution: u32,
    pub evaluation: Option<u32>,
}

/// Picks the pairs shown in round `round`. `history` holds all pairs of earlier rounds in
/// chronological order (round, then slot, then judge index). `rng` is only drawn from when
/// sampling, and only for this (instance, round).
pub fn select_pairs(source: DiscussionSource, kappa: usize, round: u32, history: &[PairRef], rng: &mut ChaCha8Rng) -> Vec<PairRef> {
    if round == 0 {
        return Vec::new();
    }
    match source {
        DiscussionSource::PrevRoundSample => {
            let prev: Vec<PairRef> = history.iter().copied().filter(|p| p.round + 1 == round).collect();
            let k = kappa.min(prev.len());
            // index::sample returns distinct indices in random order: sampled order is the shown order.
            index::sample(rng, prev.len(), k).into_iter().map(|i| prev[i]).collect()
        }
        DiscussionSource::LastKPairsChronological => {
            let earlier: Vec<PairRef> = history.iter().copied().filter(|p| p.round < round).collect();
            earlier[earlier.len().saturating_sub(kappa)..].to_vec()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use std::collections::HashSet;

    fn history(rounds: u32, per_round: u32) -> Vec<PairRef> {
        let mut h = Vec::new();
        let mut t = 0;
        for r in 0..rounds {
            for _ in 0..per_round {
                h.push(PairRef { round: r, solution: t, evaluation: Some(t + 100) });
                t += 1;
            }
        }
        h
    }

    #[test]
    fn round_zero_sees_nothing() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        assert!(select_pairs(DiscussionSource::PrevRoundSample, 2, 0, &[], &mut rng).is_empty());
        assert!(select_pairs(DiscussionSource::LastKPairsChronological, 2, 0, &[], &mut rng).is_empty());
    }

    #[test]
    fn samples_without_replacement_from_previous_round_only() {
        let h = history(3, 4); // rounds 0, 1, 2 with solutions 0..4, 4..8, 8..12
        let mut orders = HashSet::new();
        for seed in 0..200 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let picked = select_pairs(DiscussionSource::PrevRoundSample, 2, 2, &h, &mut rng);
            assert_eq!(picked.len(), 2);
            assert!(picked.iter().all(|p| p.round == 1 && (4..8).contains(&p.solution)));
            assert_ne!(picked[0], picked[1]);
            orders.insert((picked[0].solution, picked[1].solution));
        }
        // All 12 ordered pairs of 4 items turn up: uniform choice, random order.
        assert_eq!(orders.len(), 12);
    }

    #[test]
    fn kappa_larger_than_round_takes_every_pair_once() {
        let h = history(2, 3);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut picked: Vec<u32> = select_pairs(DiscussionSource::PrevRoundSample, 10, 1, &h, &mut rng).iter().map(|p| p.solution).collect();
        picked.sort();
        assert_eq!(picked, vec![0, 1, 2]);
        assert!(select_pairs(DiscussionSource::PrevRoundSample, 0, 1, &h, &mut rng).is_empty());
    }

    #[test]
    fn last_k_chronological_can_reach_older_rounds() {
        let h = history(3, 2); // solutions 0,1 | 2,3 | 4,5
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let ids = |v: Vec<PairRef>| v.iter().map(|p| p.solution).collect::<Vec<_>>();
        assert_eq!(ids(select_pairs(DiscussionSource::LastKPairsChronological, 3, 2, &h, &mut rng)), vec![1, 2, 3]);
        assert_eq!(ids(select_pairs(DiscussionSource::LastKPairsChronological, 2, 1, &h, &mut rng)), vec![0, 1]);
        assert_eq!(ids(select_pairs(DiscussionSource::LastKPairsChronological, 9, 3, &h, &mut rng)), vec![0, 1, 2, 3, 4, 5]);
    }
}
