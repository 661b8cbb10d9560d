//! The product a decode step's few rows take on CPU: oneDNN's packed weights in bf16
//! ([`crate::onednn`]), the few-row kernel in f32 ([`crate::rows_linear`]), aten otherwise.
//! Prefill, scoring and training always take aten, and so does anything that needs a gradient.
use crate::decode_linear::DecodePath::{Aten, Packed, Rows};
use crate::onednn::{self, PackedWeight};
use crate::rows_linear;
use crate::shim::rows;
pub use crate::shim::MAX_ROWS;
use std::cell::Cell;
use tch::{Device, Kind, Tensor};

/// Which product decode steps use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DecodePath {
    /// aten's `linear` (MKL on CPU), as prefill.
    #[default]
    Aten,
    /// oneDNN's inner product on a packed copy of the weight (bf16 on CPU).
    Packed,
    /// The few-row f32 kernel on the weight itself (f32 on an AVX2 or AVX-512 CPU).
    Rows,
}

/// The path for weights of this dtype on this device. `COMAS_DECODE_LINEAR=aten` keeps aten (to
/// save the packed copies' memory, or to compare); `auto` (the default) picks the fast path.
pub fn choose(kind: Kind, device: Device) -> DecodePath {
    match std::env::var("COMAS_DECODE_LINEAR").as_deref() {
        Ok("aten") => return Aten,
        Ok("auto" | "onednn") | Err(_) => {}
        Ok(other) => {
            tracing::warn!(value = other, "COMAS_DECODE_LINEAR is `auto` or `aten`; using `auto`")
        }
    }
    if onednn::applies(kind, device) {
        Packed
    } else if kind == Kind::Float && device == Device::Cpu && rows_linear::available() {
        Rows
    } else {
        Aten
    }
}

/// One weight's decode product: aten until [`DecodeLinear::set`] picks another path.
#[derive(Default)]
pub struct DecodeLinear {
    path: Cell<DecodePath>,
    packed: PackedWeight,
}

impl DecodeLinear {
    /// Switches to `path` (packing `weight` now if it needs a packed copy, dropping it if not).
    pub fn set(&self, path: DecodePath, weight: &Tensor) {
        self.packed.set_enabled(path == Packed, weight);
        self.path.set(path);
    }

    /// `x · weightᵀ (+ bias)` on the chosen path when it applies (at most [`MAX_ROWS`] rows,
    /// no gradient), else `None`: use aten. A failure is logged and sends this weight to aten
    /// from then on rather than failing the step.
    pub fn forward(&self, x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Option<Tensor> {
        match self.path.get() {
            Aten => None,
            Packed => self.packed.forward(x, weight, bias),
            Rows => {
                if rows(x) > MAX_ROWS || x.requires_grad() || weight.requires_grad() {
                    return None;
                }
                match rows_linear::linear(x, weight, bias) {
                    Ok(y) => Some(y),
                    Err(e) => {
                        tracing::warn!(error = %e, "few-row linear failed; this weight uses aten from now on");
                        self.path.set(Aten);
                        None
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_takes_the_few_row_kernel_for_decode_rows_only() {
        let w = Tensor::ones([8, 4], (Kind::Float, Device::Cpu));
        let d = DecodeLinear::default();
        let x = Tensor::ones([2, 4], (Kind::Float, Device::Cpu));
        assert!(d.forward(&x, &w, None).is_none(), "aten by default");
        d.set(Rows, &w);
        assert_eq!(
            Vec::<f32>::try_from(d.forward(&x, &w, None).unwrap().flatten(0, -1)).unwrap(),
            vec![4.0; 16]
        );
        assert!(
            d.forward(&Tensor::ones([MAX_ROWS + 1, 4], (Kind::Float, Device::Cpu)), &w, None)
                .is_none(),
            "prefill rows go to aten"
        );
        assert!(d.forward(&x.set_requires_grad(true), &w, None).is_none(), "gradients go to aten");
        // A failure (here a bf16 input) falls back to aten for good.
        assert!(d
            .forward(&Tensor::ones([2, 4], (Kind::BFloat16, Device::Cpu)), &w, None)
            .is_none());
        assert!(d.forward(&Tensor::ones([2, 4], (Kind::Float, Device::Cpu)), &w, None).is_none());
    }
}
