//! An f32 linear for the few rows of a decode step on CPU (`csrc/rows_linear.cpp`).
//!
//! MKL's products on a handful of rows read the weight at about half of this machine's read
//! bandwidth (12.5 against 26-29 GB/s on SmolLM2's shapes, AMD EPYC); batch-1 decode is bound by
//! that read. This kernel streams each weight row once per call, uses it for every input row, and
//! sums each output in an order that depends only on the input width, so a row's result does not
//! depend on the rows beside it, on the tiling or on the threads.
use crate::error::Result;
use crate::shim::{rows, wrap};
use std::ffi::c_char;
use tch::Tensor;
use torch_sys::C_tensor;

extern "C" {
    fn comas_rows_linear_available() -> bool;
    fn comas_rows_linear(
        x: *const C_tensor,
        weight: *const C_tensor,
        bias: *const C_tensor,
        isa: i32,
        error: *mut *mut c_char,
    ) -> *mut C_tensor;
}

/// Whether this CPU has the kernel (AVX-512F, or AVX2 with FMA).
pub fn available() -> bool {
    // SAFETY: reads CPU feature flags only.
    unsafe { comas_rows_linear_available() }
}

/// The instruction set a call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F where the CPU has it, else AVX2 (chosen once per process).
    Best = 0,
    Avx2 = 1,
    Avx512 = 2,
}

/// `x` [.., in] f32 times `weight` [out, in] f32 (+ `bias` [out]): [.., out].
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    linear_on(Isa::Best, x, weight, bias)
}

/// [`linear`] on a given instruction set (an error where the CPU lacks it): lets tests cover
/// the AVX2 kernel on an AVX-512 machine.
pub fn linear_on(isa: Isa, x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let mut shape = x.size();
    let x2 = x.reshape([rows(x), -1]);
    let mut error = std::ptr::null_mut();
    let bias_ptr = bias.map_or(std::ptr::null(), Tensor::as_ptr);
    // SAFETY: every handle is a live tensor for the whole call; the shim keeps none of them.
    let ptr = unsafe {
        comas_rows_linear(x2.as_ptr(), weight.as_ptr(), bias_ptr, isa as i32, &mut error)
    };
    let y = wrap(ptr, error, "few-row linear")?;
    *shape.last_mut().expect("x has a last dimension") = weight.size()[0];
    Ok(y.reshape(shape))
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
        // Widths that are and are not multiples of the 16- and 8-lane vectors; output counts with
        // every remainder of the 4-row weight tile; row counts with every remainder of the input
        // tiles (6 rows for AVX-512, 2 for AVX2).
        for isa in kernels() {
            for (out, inp) in [(96, 64), (97, 61), (5, 3), (5, 0), (258, 576), (7, 1536)] {
                let (w, b, x) = draw(out, inp, 13);
                for rows in [1, 2, 3, 4, 5, 6, 7, 13] {
                    let x = x.narrow(0, 0, rows);
                    let got = linear_on(isa, &x, &w, Some(&b)).unwrap();
                    assert_eq!(got.size(), vec![rows, out]);
                    let d = max_diff(&got, &x.linear(&w, Some(&b)));
                    assert!(d < 1e-5, "{isa:?} out {out} in {inp} rows {rows}: max difference {d}");
                    let d = max_diff(
                        &linear_on(isa, &x, &w, None).unwrap(),
                        &x.linear::<Tensor>(&w, None),
                    );
                    assert!(
                        d < 1e-5,
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
    fn a_bad_input_is_an_error_not_a_crash() {
        let w = Tensor::zeros([8, 4], (Kind::Float, Device::Cpu));
        let err = linear(&Tensor::zeros([3, 5], (Kind::Float, Device::Cpu)), &w, None).unwrap_err();
        assert!(err.to_string().contains("x has 5 features but the weight takes 4"), "{err}");
        let err =
            linear(&Tensor::zeros([3, 4], (Kind::BFloat16, Device::Cpu)), &w, None).unwrap_err();
        assert!(err.to_string().contains("float32"), "{err}");
        let err = linear(
            &Tensor::zeros([3, 4], (Kind::Float, Device::Cpu)),
            &w,
            Some(&Tensor::zeros([7], (Kind::Float, Device::Cpu))),
        )
        .unwrap_err();
        assert!(err.to_string().contains("bias must be float32 [8]"), "{err}");
    }
}
