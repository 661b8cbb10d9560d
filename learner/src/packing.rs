//! How a step's experiences become micro-batches: grouped by length and cut to a sample and
//! token budget, then packed into padded tensors with the positions whose log-probs the loss
//! reads.
use crate::experience::Experience;
use comas_model::mask;
use tch::{Device, Tensor};

/// Sequence positions of a micro-batch's completion tokens, for gathering their log-probs.
pub(crate) struct Packed {
    pub ids: Tensor,
    pub valid: Tensor,
    /// Flat indices into [B * S] of the positions that predict each completion token.
    pub gather: Tensor,
    pub targets: Tensor,
    pub tokens: usize,
    /// Guided-tail tokens: their indices among the gathered positions, and the allowed ids of
    /// each as one [C, V] mask (true = allowed).
    pub constrained: Option<(Tensor, Tensor)>,
}

/// Per-token temperatures, when some experience was sampled at another than `default`.
pub(crate) fn token_temperatures(
    batch: &[&Experience],
    default: f64,
    device: Device,
) -> Option<Tensor> {
    if batch.iter().all(|e| e.temperature.is_none_or(|t| t == default)) {
        return None;
    }
    let per_token: Vec<f32> = batch
        .iter()
        .flat_map(|e| {
            std::iter::repeat_n(e.temperature.unwrap_or(default) as f32, e.completion_ids.len())
        })
        .collect();
    Some(Tensor::from_slice(&per_token).to_device(device))
}

pub(crate) fn pack(batch: &[&Experience], vocab: i64, device: Device) -> Packed {
    let seqs: Vec<Vec<i64>> =
        batch.iter().map(|e| [e.prompt_ids.as_slice(), &e.completion_ids].concat()).collect();
    // Each guided token's position among the gathered ones, and its (row, allowed id) pairs.
    let (mut rows, mut allowed) = (Vec::new(), Vec::new());
    let mut offset = 0i64;
    for e in batch {
        for c in &e.constrained {
            let row = rows.len() as i64;
            rows.push(offset + c.position as i64);
            allowed.extend(c.allowed.iter().map(|&t| (row, t)));
        }
        offset += e.completion_ids.len() as i64;
    }
    let constrained = (!rows.is_empty()).then(|| {
        let n = rows.len() as i64;
        (Tensor::from_slice(&rows).to_device(device), mask::from_pairs(n, vocab, allowed, device))
    });
    let (ids, valid) = mask::right_pad(&seqs, 0, device);
    let width = ids.size()[1];
    let mut gather = Vec::new();
    let mut targets = Vec::new();
    for (b, e) in batch.iter().enumerate() {
        let p = e.prompt_ids.len() as i64;
        for (t, &tok) in e.completion_ids.iter().enumerate() {
            gather.push(b as i64 * width + p + t as i64 - 1);
            targets.push(tok);
        }
    }
    Packed {
        ids,
        valid,
        gather: Tensor::from_slice(&gather).to_device(device),
        targets: Tensor::from_slice(&targets).to_device(device),
        tokens: seqs.iter().map(Vec::len).sum(),
        constrained,
    }
}

/// `order` sorted by sample length, longest first (ties keep their order). Token-mean and
/// sequence-mean losses do not depend on how an optimizer step's samples are grouped into
/// micro-batches, so grouping samples of similar length cuts the padding a micro-batch computes
/// on; a micro-batch mean does depend on it, and keeps the shuffled order.
pub fn by_length(order: &[usize], lens: &[usize]) -> Vec<usize> {
    let mut sorted = order.to_vec();
    sorted.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
    sorted
}

/// Splits `order` into micro-batches of at most `max_samples` samples and `max_tokens` padded
/// tokens (a sample longer than the budget gets a micro-batch of its own).
pub fn micro_batches(
    order: &[usize],
    lens: &[usize],
    max_samples: usize,
    max_tokens: usize,
) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut longest = 0;
    for &i in order {
        let l = lens[i];
        let widened = longest.max(l) * (cur.len() + 1);
        if !cur.is_empty() && (cur.len() >= max_samples || widened > max_tokens) {
            out.push(std::mem::take(&mut cur));
            longest = 0;
        }
        longest = longest.max(l);
        cur.push(i);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_batches_respect_count_and_token_budget() {
        let lens = [10, 10, 30, 5, 5, 5, 100];
        let order: Vec<usize> = (0..lens.len()).collect();
        assert_eq!(
            micro_batches(&order, &lens, 2, 1000),
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6]]
        );
        // budget 40 padded tokens: [10,10] = 20, adding 30 -> 90 > 40
        assert_eq!(
            micro_batches(&order, &lens, 8, 40),
            vec![vec![0, 1], vec![2], vec![3, 4, 5], vec![6]]
        );
    }

    #[test]
    fn length_grouping_puts_similar_lengths_together() {
        let lens = [10, 300, 12, 290, 11, 305];
        let order = [3, 0, 5, 1, 2, 4];
        assert_eq!(by_length(&order, &lens), vec![5, 1, 3, 2, 4, 0]);
        // Two micro-batches of 3: 3 × 305 + 3 × 12 padded tokens instead of 2 × 3 × 305.
        assert_eq!(
            micro_batches(&by_length(&order, &lens), &lens, 3, 100_000),
            vec![vec![5, 1, 3], vec![2, 4, 0]]
        );
        // Ties keep their order.
        assert_eq!(by_length(&[2, 0, 1], &[7, 7, 7]), vec![2, 0, 1]);
    }
}
