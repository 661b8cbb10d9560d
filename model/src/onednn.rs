//! Prepacked oneDNN linears for decode steps on CPU (`csrc/onednn_linear.cpp`).
//!
//! A decode step multiplies a few rows by every weight matrix. aten's bf16 linear handles such
//! thin products poorly; oneDNN's inner-product kernels on a weight reordered once into their
//! blocked layout are 1.4-2.9x faster at 64 rows or fewer (measured on SmolLM2's shapes). The
//! packed copy is kept beside the plain weight, which prefill and training keep using
//! ([`crate::decode_linear::DecodeLinear`] keeps it).
use crate::error::Result;
use crate::shim::{on_rows, wrap};
use std::ffi::c_char;
use tch::{Device, Kind, Tensor};
use torch_sys::C_tensor;

extern "C" {
    fn comas_onednn_pack(weight: *const C_tensor, error: *mut *mut c_char) -> *mut C_tensor;
    fn comas_onednn_linear(
        x: *const C_tensor,
        packed: *const C_tensor,
        bias: *const C_tensor,
        error: *mut *mut c_char,
    ) -> *mut C_tensor;
}

/// Whether weights of this dtype on this device are worth packing: bf16 on a CPU whose oneDNN
/// bf16 path runs (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; without them the reorder refuses).
pub fn applies(kind: Kind, device: Device) -> bool {
    kind == Kind::BFloat16 && device == Device::Cpu && cpu_runs_bf16()
}

/// Whether this CPU has the instructions oneDNN's bf16 inner product needs.
pub fn cpu_runs_bf16() -> bool {
    static RUNS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *RUNS.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let flags: Vec<&str> = info
            .lines()
            .find(|l| l.starts_with("flags"))
            .map(|l| l.split_whitespace().collect())
            .unwrap_or_default();
        let has = |f: &str| flags.contains(&f);
        has("avx_ne_convert") || (has("avx512bw") && has("avx512vl") && has("avx512dq"))
    })
}

/// `weight` [out, in] reordered for oneDNN's kernels.
pub fn pack(weight: &Tensor) -> Result<Tensor> {
    let mut error = std::ptr::null_mut();
    // SAFETY: `weight` is a live tensor for the whole call; the shim does not keep the handle.
    let ptr = unsafe { comas_onednn_pack(weight.as_ptr(), &mut error) };
    wrap(ptr, error, "oneDNN weight reorder")
}

/// `x` [.., in] times the packed weight (+ `bias`): [.., out].
pub fn linear(
    x: &Tensor,
    packed: &Tensor,
    bias: Option<&Tensor>,
    out_features: i64,
) -> Result<Tensor> {
    let bias_ptr = bias.map_or(std::ptr::null(), Tensor::as_ptr);
    // SAFETY: every handle is a live tensor for the whole call; the shim keeps none of them.
    on_rows(x, out_features, "oneDNN linear", |x2, error| unsafe {
        comas_onednn_linear(x2, packed.as_ptr(), bias_ptr, error)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_linear_matches_aten_and_a_row_does_not_depend_on_its_batch() {
        if !cpu_runs_bf16() {
            eprintln!(
                "skipped: this CPU has no oneDNN bf16 path (AVX-512 BW/VL/DQ or AVX-NE-CONVERT)"
            );
            return;
        }
        // Drawn under the generator's lock, so concurrent seeded tests keep their draws.
        let (w, b, x) = crate::seeded::with_torch_seed(0, || {
            let opts = (Kind::Float, Device::Cpu);
            (
                (Tensor::randn([96, 64], opts) * 0.1).to_kind(Kind::BFloat16),
                Tensor::randn([96], opts).to_kind(Kind::BFloat16),
                Tensor::randn([2, 5, 64], opts).to_kind(Kind::BFloat16),
            )
        });
        let packed = pack(&w).unwrap();
        let got = linear(&x, &packed, Some(&b), 96).unwrap();
        assert_eq!(got.size(), vec![2, 5, 96]);
        let want = x.linear(&w, Some(&b));
        let diff =
            f64::try_from((got.to_kind(Kind::Float) - want.to_kind(Kind::Float)).abs().max())
                .unwrap();
        // Both accumulate in f32 and round once to bf16: at most one bf16 step apart.
        assert!(diff <= 0.02, "max difference {diff}");
        let alone = linear(&x.narrow(0, 1, 1).narrow(1, 2, 1), &packed, Some(&b), 96).unwrap();
        assert!(alone.get(0).get(0).equal(&got.get(1).get(2)));
    }

    #[test]
    fn a_bad_input_is_an_error_not_a_crash() {
        if !cpu_runs_bf16() {
            eprintln!(
                "skipped: this CPU has no oneDNN bf16 path (AVX-512 BW/VL/DQ or AVX-NE-CONVERT)"
            );
            return;
        }
        let w = Tensor::zeros([8, 4], (Kind::BFloat16, Device::Cpu));
        let packed = pack(&w).unwrap();
        let err = linear(&Tensor::zeros([3, 5], (Kind::BFloat16, Device::Cpu)), &packed, None, 8)
            .unwrap_err();
        assert!(err.to_string().starts_with("weights: oneDNN linear: "), "{err}");
    }
}
