//! Attention masks and position ids for batches laid out in cache slots.
//!
//! Every sequence of a batch occupies one row of the KV cache; tokens are written to slots
//! (columns) left to right, and a slot may be padding. A query in slot `q` may attend to a key in
//! slot `k` when `k <= q` and slot `k` holds a real token. A query always sees its own slot, so
//! padding rows never have an empty softmax (their outputs are ignored).
use tch::{Device, Kind, Tensor};

/// Boolean mask [B, 1, S, past + S] (true = attend) for `S` new tokens written at slots
/// `past..past + S`, given which slots hold real tokens (`key_valid` [B, past + S]).
pub fn attention_mask(key_valid: &Tensor, past: i64, new: i64) -> Tensor {
    let total = past + new;
    let device = key_valid.device();
    let keys = Tensor::arange(total, (Kind::Int64, device)).view([1, total]);
    let queries = Tensor::arange_start(past, total, (Kind::Int64, device)).view([new, 1]);
    let causal = keys.le_tensor(&queries); // [S, T]
    let own = keys.eq_tensor(&queries);
    let allowed = causal.unsqueeze(0).logical_and(&key_valid.to_kind(Kind::Bool).unsqueeze(1)); // [B, S, T]
    allowed.logical_or(&own.unsqueeze(0)).unsqueeze(1)
}

/// Whether every row of `valid` [B, S] is real tokens then padding (no padding before a real
/// token), so plain causal attention masks it exactly for every real query.
pub fn is_right_padded(valid: &Tensor) -> bool {
    let s = valid.size()[1];
    if s < 2 {
        return true;
    }
    let valid = valid.to_kind(Kind::Bool);
    let gap_then_token =
        valid.narrow(1, 1, s - 1).logical_and(&valid.narrow(1, 0, s - 1).logical_not());
    gap_then_token.any().int64_value(&[]) == 0
}

/// Position ids [B, S] for new tokens: each row continues from `start` [B] (the number of real
/// tokens it already has) and counts only valid tokens. Padding gets the last real position
/// (clamped at 0), which is harmless because padding is masked as a key.
pub fn positions(valid: &Tensor, start: &Tensor) -> Tensor {
    let counted = valid.to_kind(Kind::Int64).cumsum(1, Kind::Int64);
    (counted - 1 + start.view([-1, 1])).clamp_min(0)
}

/// Right-pads token sequences (the layout learners and scoring use).
pub fn right_pad(seqs: &[Vec<i64>], pad_id: i64, device: Device) -> (Tensor, Tensor) {
    let width = seqs.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(seqs.len() * width);
    let mut valid = Vec::with_capacity(seqs.len() * width);
    for s in seqs {
        let pad = width - s.len();
        ids.extend(s.iter().copied().chain(std::iter::repeat_n(pad_id, pad)));
        valid.extend(std::iter::repeat_n(true, s.len()).chain(std::iter::repeat_n(false, pad)));
    }
    let shape = [seqs.len() as i64, width as i64];
    (
        Tensor::from_slice(&ids).view(shape).to_device(device),
        Tensor::from_slice(&valid).view(shape).to_device(device),
    )
}

/// A [rows, width] boolean mask on `device`, true at each listed (row, column) pair; pairs
/// outside the shape are left out. Only the pairs are copied to the device, never a
/// rows × width buffer made on the host (a batch × vocabulary mask is megabytes a step).
pub fn from_pairs(
    rows: i64,
    width: i64,
    pairs: impl IntoIterator<Item = (i64, i64)>,
    device: Device,
) -> Tensor {
    let (mut at, mut cols): (Vec<i64>, Vec<i64>) = pairs
        .into_iter()
        .filter(|&(r, c)| (0..rows).contains(&r) && (0..width).contains(&c))
        .unzip();
    let mut m = Tensor::zeros([rows, width], (Kind::Bool, device));
    if at.is_empty() {
        return m;
    }
    let n = at.len() as i64;
    at.append(&mut cols);
    let at = Tensor::from_slice(&at).view([2, n]).to_device(device);
    let _ = m.index_put_(
        &[Some(at.get(0)), Some(at.get(1))],
        &Tensor::from(true).to_device(device),
        false,
    );
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_from_pairs_marks_exactly_the_pairs_in_its_shape() {
        let pairs = [(0, 1), (2, 4), (2, 0), (1, 9), (-1, 0), (3, 0), (0, 1)];
        let m = from_pairs(3, 5, pairs, Device::Cpu);
        assert_eq!(m.size(), [3, 5]);
        let got = Vec::<bool>::try_from(&m.view([-1])).unwrap();
        let mut want = vec![false; 15];
        for (r, c) in [(0, 1), (2, 4), (2, 0)] {
            want[r * 5 + c] = true;
        }
        assert_eq!(got, want);
        let none = from_pairs(2, 3, [(5, 5)], Device::Cpu);
        assert_eq!(Vec::<bool>::try_from(&none.view([-1])).unwrap(), vec![false; 6]);
    }

    fn bools(t: &Tensor) -> Vec<bool> {
        Vec::<bool>::try_from(t.flatten(0, -1)).unwrap()
    }

    /// Validity of [5, 6, 7] and [8] left-padded to width 3.
    fn left_padded_valid() -> Tensor {
        Tensor::from_slice(&[true, true, true, false, false, true]).view([2, 3])
    }

    #[test]
    fn right_padding_is_told_from_padding_before_a_token() {
        let rows = |v: &[bool], w: i64| Tensor::from_slice(v).view([-1, w]);
        assert!(is_right_padded(&rows(&[true, true, true, true, false, false], 3)));
        assert!(is_right_padded(&rows(&[true, true], 2)));
        assert!(is_right_padded(&rows(&[true, false], 1)));
        assert!(!is_right_padded(&left_padded_valid()));
        assert!(!is_right_padded(&rows(&[true, false, true], 3)));
    }

    #[test]
    fn prefill_mask_is_causal_and_hides_left_padding() {
        let valid = left_padded_valid();
        let m = attention_mask(&valid, 0, 3);
        assert_eq!(m.size(), vec![2, 1, 3, 3]);
        #[rustfmt::skip]
        let want = vec![
            true, false, false,  true, true, false,  true, true, true,   // row 0: plain causal
            true, false, false,  false, true, false,  false, false, true, // row 1: pads see only themselves
        ];
        assert_eq!(bools(&m), want);
    }

    #[test]
    fn decode_mask_offsets_by_past() {
        // two cached slots (row 1's first is padding), one new token in slot 2
        let valid = Tensor::from_slice(&[true, true, true, false, true, true]).view([2, 3]);
        let m = attention_mask(&valid, 2, 1);
        assert_eq!(m.size(), vec![2, 1, 1, 3]);
        assert_eq!(bools(&m), vec![true, true, true, false, true, true]);
    }

    #[test]
    fn positions_skip_padding_and_continue_from_start() {
        let valid = left_padded_valid();
        let p = positions(&valid, &Tensor::from_slice(&[0i64, 0]));
        assert_eq!(Vec::<i64>::try_from(p.flatten(0, -1)).unwrap(), vec![0, 1, 2, 0, 0, 0]);
        let one = Tensor::ones([2, 1], (Kind::Bool, Device::Cpu));
        let p = positions(&one, &Tensor::from_slice(&[3i64, 1]));
        assert_eq!(Vec::<i64>::try_from(p.flatten(0, -1)).unwrap(), vec![3, 1]);
    }

    #[test]
    fn right_padding_layout() {
        let (ids, valid) = right_pad(&[vec![1, 2], vec![3]], 9, Device::Cpu);
        assert_eq!(Vec::<i64>::try_from(ids.flatten(0, -1)).unwrap(), vec![1, 2, 3, 9]);
        assert_eq!(bools(&valid), vec![true, true, true, false]);
    }
}
