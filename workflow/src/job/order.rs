//! Which questions of the data set each step plays.
use crate::seed::derive_seed;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const DATA_ORDER_TAG: u64 = 101;

/// Data set indices of step `step` of `per_step` questions each, over `n` questions: epoch
/// e = step / (n / per_step) uses its own permutation when shuffling (seeded by the job seed
/// and the epoch), and the last partial batch of an epoch is dropped.
pub fn step_questions(
    n: usize,
    per_step: usize,
    seed: u64,
    shuffle: bool,
    step: u64,
) -> Vec<usize> {
    let per_epoch = (n / per_step).max(1) as u64;
    let (epoch, index) = (step / per_epoch, (step % per_epoch) as usize);
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(derive_seed(&[seed, DATA_ORDER_TAG, epoch])));
    }
    order[index * per_step..(index + 1) * per_step].to_vec()
}
