//! Figures of a training step that the loss does not need: truncated importance weights, the
//! first token's entropy, the size of the LoRA update and the process's peak memory.
use crate::experience::Experience;
use comas_model::LoraAdapter;
use tch::{Kind, Tensor};

/// Truncated importance weights min(exp(ℓ^old − ℓ^behaviour), cap), without gradient.
pub fn tis_weights(old: &Tensor, behaviour: &Tensor, cap: f64) -> Tensor {
    tch::no_grad(|| (old - behaviour).clamp(-20.0, 20.0).exp().clamp_max(cap))
}

/// Sum and count of the entropies at each sample's first completion token (`lsm`: the
/// log-softmax of every completion token, flat in sample order).
pub(crate) fn first_token_entropy(lsm: &Tensor, batch: &[&Experience]) -> (f64, usize) {
    let mut rows = Vec::new();
    let mut offset = 0i64;
    for e in batch {
        if !e.completion_ids.is_empty() {
            rows.push(offset);
        }
        offset += e.completion_ids.len() as i64;
    }
    if rows.is_empty() {
        return (0.0, 0);
    }
    let first = lsm.index_select(0, &Tensor::from_slice(&rows).to_device(lsm.device()));
    let h = (first.exp() * &first).sum(Kind::Float).neg().double_value(&[]);
    (h, rows.len())
}

/// ‖scale·ΔW‖_F over every adapted projection, ΔW = B·A, from r×r products:
/// ‖B·A‖² = tr(Aᵀ·Bᵀ·B·A) = Σ (BᵀB) ⊙ (A·Aᵀ).
pub(crate) fn adapter_norm(a: &LoraAdapter) -> f64 {
    tch::no_grad(|| {
        let mut sq = 0.0;
        for (_, pair) in a.pairs() {
            let (la, lb) = (pair.0.to_kind(Kind::Float), pair.1.to_kind(Kind::Float));
            sq += (lb.transpose(0, 1).matmul(&lb) * la.matmul(&la.transpose(0, 1)))
                .sum(Kind::Float)
                .double_value(&[]);
        }
        a.scale() * sq.max(0.0).sqrt()
    })
}

/// The process's peak resident set size (`ru_maxrss`), for the step report.
pub(crate) fn peak_rss_bytes() -> u64 {
    // /proc keeps it in kB as VmHWM; reading it needs no unsafe code.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmHWM:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
        })
        .map_or(0, |kb| kb * 1024)
}
