//! One AdamW update over many parameters in one call (`csrc/foreach_adamw.cpp`): ATen's
//! foreach operations, a few multi-tensor kernels on a GPU where a per-parameter loop launches
//! about ten per parameter. The arithmetic is the learner's (rl.md §8), operation for
//! operation, so CPU results are bit for bit those of the loop.
use crate::error::{ModelError, Result};
use std::ffi::c_char;
use tch::Tensor;
use torch_sys::C_tensor;

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn comas_foreach_adamw(
        weights: *const *const C_tensor,
        grads: *const *const C_tensor,
        m: *const *const C_tensor,
        v: *const *const C_tensor,
        n: i64,
        lr: f64,
        beta1: f64,
        beta2: f64,
        bc1: f64,
        bc2: f64,
        eps: f64,
        decay: f64,
        error: *mut *mut c_char,
    ) -> bool;
}

/// The scalars of one update: `bc1`, `bc2` are the bias corrections 1 − βᵏ, `decay` the factor
/// weights are multiplied by first (1 − lr·weight_decay; 1 skips it).
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep {
    pub lr: f64,
    pub betas: (f64, f64),
    pub bias_corrections: (f64, f64),
    pub eps: f64,
    pub decay: f64,
}

/// Updates `weights`, `m` and `v` (f32, in place) from `grads`: one list entry per parameter,
/// the four lists of one length and of matching shapes.
pub fn adamw(
    weights: &[Tensor],
    grads: &[Tensor],
    m: &[Tensor],
    v: &[Tensor],
    s: AdamWStep,
) -> Result<()> {
    let n = weights.len();
    if grads.len() != n || m.len() != n || v.len() != n {
        return Err(ModelError::Weights(format!(
            "foreach AdamW: {n} weights but {} gradients, {} first and {} second moments",
            grads.len(),
            m.len(),
            v.len()
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let ptrs = |ts: &[Tensor]| ts.iter().map(Tensor::as_ptr).collect::<Vec<_>>();
    let (w, g, m, v) = (ptrs(weights), ptrs(grads), ptrs(m), ptrs(v));
    let mut error = std::ptr::null_mut();
    // SAFETY: every handle is a live tensor for the whole call; the shim keeps none of them.
    let ok = unsafe {
        comas_foreach_adamw(
            w.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            n as i64,
            s.lr,
            s.betas.0,
            s.betas.1,
            s.bias_corrections.0,
            s.bias_corrections.1,
            s.eps,
            s.decay,
            &mut error,
        )
    };
    if ok {
        return Ok(());
    }
    Err(ModelError::Weights(format!("foreach AdamW: {}", crate::shim::take_error(error))))
}
