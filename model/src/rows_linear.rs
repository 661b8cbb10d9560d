//! An f32 or bf16 linear for the few rows of a decode step on CPU (`csrc/rows_linear.cpp`), on a
//! copy of the weight packed once into blocks of 32 outputs ([`pack`]). bf16 needs AVX512-BF16
//! (`vdpbf16ps`: two products per lane and instruction, accumulated in f32).
//!
//! MKL's products on a handful of rows read the weight at about half of this machine's read
//! bandwidth (12.5 against 26-29 GB/s on SmolLM2's shapes, AMD EPYC); batch-1 decode is bound by
//! that read. In the packed layout one input value multiplies a vector of 32 outputs, so the
//! kernel reads the weight once per call, keeps up to 12 rows' outputs in registers, needs no
//! horizontal sums, and sums each output in the order k = 0, 1, .. in - 1 whatever the rows,
//! tiling, threads or instruction set: a row's result does not depend on the rows beside it.
use crate::error::Result;
use crate::shim::{on_rows, wrap};
use std::ffi::c_char;
use tch::Tensor;
use torch_sys::C_tensor;

extern "C" {
    fn comas_rows_linear_available() -> bool;
    fn comas_rows_linear_bf16_available() -> bool;
    fn comas_rows_pack(weight: *const C_tensor, error: *mut *mut c_char) -> *mut C_tensor;
    fn comas_rows_packed_linear(
        x: *const C_tensor,
        packed: *const C_tensor,
        bias: *const C_tensor,
        out: i64,
        isa: i32,
        error: *mut *mut c_char,
    ) -> *mut C_tensor;
}

/// Whether this CPU has the kernel (AVX-512F, or AVX2 with FMA).
pub fn available() -> bool {
    // SAFETY: reads CPU feature flags only.
    unsafe { comas_rows_linear_available() }
}

/// Whether this CPU has the bf16 kernel (AVX512-BF16 with AVX-512 BW and VL).
pub fn bf16_available() -> bool {
    // SAFETY: reads CPU feature flags only.
    unsafe { comas_rows_linear_bf16_available() }
}

/// The instruction set a call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F where the CPU has it, else AVX2 (chosen once per process).
    Best = 0,
    Avx2 = 1,
    Avx512 = 2,
}

/// `x` [.., in] f32 times `weight` [out, in] f32 (+ `bias` [out]): [.., out], packing the
/// weight for this one call (decode keeps the packed copy: [`pack`], [`packed_linear`]).
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    linear_on(Isa::Best, x, weight, bias)
}

/// [`linear`] on a given instruction set (an error where the CPU lacks it): lets tests cover
/// the AVX2 kernel on an AVX-512 machine.
pub fn linear_on(isa: Isa, x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    packed_linear_on(isa, x, &pack(weight)?, bias, weight.size()[0])
}

/// `weight` [out, in] reordered for [`packed_linear`], zero-padded: f32 as [blocks, in, 32],
/// bf16 (where [`bf16_available`]) as [blocks, (in + 1) / 2, 32, 2].
pub fn pack(weight: &Tensor) -> Result<Tensor> {
    let mut error = std::ptr::null_mut();
    // SAFETY: `weight` is a live tensor for the whole call; the shim does not keep the handle.
    let ptr = unsafe { comas_rows_pack(weight.as_ptr(), &mut error) };
    wrap(ptr, error, "few-row weight packing")
}

/// `x` [.., in] times a weight of `out` outputs packed by [`pack`] (+ `bias` [out]), all of one
/// dtype, f32 or bf16.
pub fn packed_linear(
    x: &Tensor,
    packed: &Tensor,
    bias: Option<&Tensor>,
    out: i64,
) -> Result<Tensor> {
    packed_linear_on(Isa::Best, x, packed, bias, out)
}

/// [`packed_linear`] on a given instruction set (an error where the CPU lacks it).
pub fn packed_linear_on(
    isa: Isa,
    x: &Tensor,
    packed: &Tensor,
    bias: Option<&Tensor>,
    out: i64,
) -> Result<Tensor> {
    let bias_ptr = bias.map_or(std::ptr::null(), Tensor::as_ptr);
    // SAFETY: every handle is a live tensor for the whole call; the shim keeps none of them.
    on_rows(x, out, "packed few-row linear", |x2, error| unsafe {
        comas_rows_packed_linear(x2, packed.as_ptr(), bias_ptr, out, isa as i32, error)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn draw(out: i64, inp: i64, rows: i64) -> (Tensor, Tensor, Tensor) {
        // Drawn under the generator's lock, so concurrent seeded tests keep their draws.
        crate::seeded::with_torch_seed(7, || {
            let opts = (Kind::Float, Device::Cpu);
            (
                Tensor::randn([out, inp], opts) * 0.1,
                Tensor::randn([out], opts),
                Tensor::randn([rows, inp], opts),
            )
        })
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        f64::try_from((a - b).abs().max()).unwrap()
    }

    /// Both kernels where the CPU has AVX-512F; the AVX2 one alone elsewhere.
    fn kernels() -> Vec<Isa> {
        assert!(available(), "the CI machines are x86-64 with AVX2");
        let mut isas = vec![Isa::Avx2];
        if std::arch::is_x86_feature_detected!("avx512f") {
            isas.push(Isa::Avx512);
        }
        isas
    }

    #[test]
    fn it_matches_aten_on_every_tail_of_rows_outputs_and_inputs() {
        // Output counts with every kind of remainder of the 32-output block (none, under 16,
        // exactly 16, over 16); row counts with every remainder of the row tiles (12 rows for
        // AVX-512, 3 for AVX2); an empty input width.
        for isa in kernels() {
            for (out, inp) in
                [(96, 64), (97, 61), (5, 3), (5, 0), (258, 576), (7, 1536), (48, 10), (63, 33)]
            {
                let (w, b, x) = draw(out, inp, 25);
                // One output sums up to 1536 terms in order (MKL sums in blocks): about 1e-5
                // apart on outputs of size 4; a wrong term would be off by about 0.1.
                let tol = 5e-5;
                for rows in [1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 25] {
                    let x = x.narrow(0, 0, rows);
                    let got = linear_on(isa, &x, &w, Some(&b)).unwrap();
                    assert_eq!(got.size(), vec![rows, out]);
                    let d = max_diff(&got, &x.linear(&w, Some(&b)));
                    assert!(d < tol, "{isa:?} out {out} in {inp} rows {rows}: max difference {d}");
                    let d = max_diff(
                        &linear_on(isa, &x, &w, None).unwrap(),
                        &x.linear::<Tensor>(&w, None),
                    );
                    assert!(
                        d < tol,
                        "{isa:?} without bias, out {out} in {inp} rows {rows}: max difference {d}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_and_in_any_batch() {
        let (w, b, x) = draw(300, 577, 64);
        for isa in kernels() {
            let x = x.reshape([4, 16, 577]);
            let all = linear_on(isa, &x, &w, Some(&b)).unwrap();
            assert_eq!(all.size(), vec![4, 16, 300]);
            let flat = all.reshape([64, 300]);
            let x = x.reshape([64, 577]);
            for (start, len) in [(0, 1), (37, 1), (5, 3), (10, 7), (63, 1), (1, 63)] {
                let part = linear_on(isa, &x.narrow(0, start, len), &w, Some(&b)).unwrap();
                assert!(
                    part.equal(&flat.narrow(0, start, len)),
                    "{isa:?}: rows {start}..{} differ from the 64-row call",
                    start + len
                );
            }
        }
    }

    #[test]
    fn bf16_matches_aten_within_a_rounding_and_a_row_does_not_depend_on_its_batch() {
        if !bf16_available() {
            eprintln!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        // Odd and even input widths (an odd last input is paired with a zero), every kind of
        // remainder of the 32-output block, row counts across the 12-row tile.
        for (out, inp) in [(96, 64), (97, 61), (5, 3), (48, 1), (258, 576), (7, 1536)] {
            let (w, b, x) = draw(out, inp, 25);
            let (w, b, x) =
                (w.to_kind(Kind::BFloat16), b.to_kind(Kind::BFloat16), x.to_kind(Kind::BFloat16));
            let p = pack(&w).unwrap();
            let all = packed_linear(&x, &p, Some(&b), out).unwrap();
            let want = x.linear(&w, Some(&b)).to_kind(Kind::Float);
            // Both sum in f32 (in other orders) and round once to bf16: a bf16 step apart at most.
            let scale = f64::try_from(want.abs().max()).unwrap().max(1.0);
            let d = max_diff(&all.to_kind(Kind::Float), &want);
            assert!(d <= scale / 64.0, "out {out} in {inp}: max difference {d} at scale {scale}");
            for (start, len) in [(0, 1), (5, 3), (11, 2), (1, 24), (24, 1)] {
                let part = packed_linear(&x.narrow(0, start, len), &p, Some(&b), out).unwrap();
                assert!(
                    part.equal(&all.narrow(0, start, len)),
                    "rows {start}+{len} of {out}x{inp}"
                );
            }
            let d = max_diff(
                &packed_linear(&x, &p, None, out).unwrap().to_kind(Kind::Float),
                &x.linear::<Tensor>(&w, None).to_kind(Kind::Float),
            );
            assert!(d <= scale / 64.0, "without bias, out {out} in {inp}: max difference {d}");
        }
    }

    #[test]
    fn both_instruction_sets_give_the_same_bits() {
        // Each lane does the same fused multiply-adds in the same order on either.
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: this CPU has no AVX-512F");
            return;
        }
        let (w, b, x) = draw(300, 577, 17);
        let p = pack(&w).unwrap();
        let avx2 = packed_linear_on(Isa::Avx2, &x, &p, Some(&b), 300).unwrap();
        let avx512 = packed_linear_on(Isa::Avx512, &x, &p, Some(&b), 300).unwrap();
        assert!(avx2.equal(&avx512));
    }

    #[test]
    fn a_bad_input_is_an_error_not_a_crash() {
        let w = Tensor::zeros([8, 4], (Kind::Float, Device::Cpu));
        let err = linear(&Tensor::zeros([3, 5], (Kind::Float, Device::Cpu)), &w, None).unwrap_err();
        assert!(
            err.to_string().contains("x has 5 features but the packed weight takes 4"),
            "{err}"
        );
        let x = Tensor::zeros([3, 4], (Kind::BFloat16, Device::Cpu));
        let err = packed_linear(&x, &pack(&w).unwrap(), None, 8).unwrap_err();
        assert!(err.to_string().contains("in x's dtype"), "{err}");
        let err = linear(
            &Tensor::zeros([3, 4], (Kind::Float, Device::Cpu)),
            &w,
            Some(&Tensor::zeros([7], (Kind::Float, Device::Cpu))),
        )
        .unwrap_err();
        assert!(err.to_string().contains("bias must be Float [8]"), "{err}");
        let x = Tensor::zeros([3, 4], (Kind::Float, Device::Cpu));
        let err = packed_linear(&x, &pack(&w).unwrap(), None, 40).unwrap_err();
        assert!(err.to_string().contains("does not have 40 outputs"), "{err}");
        let err = packed_linear(&x, &w, None, 8).unwrap_err();
        assert!(err.to_string().contains("must come from comas_rows_pack"), "{err}");
    }
}
