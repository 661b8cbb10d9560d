//! The product a decode step's few rows take on CPU: the few-row kernel on packed weights in f32
//! and, with AVX512-BF16, in bf16 ([`crate::rows_linear`]); oneDNN's packed weights in bf16
//! elsewhere ([`crate::onednn`]); aten otherwise.
//! Prefill, scoring and training always take aten, and so does anything that needs a gradient.
use crate::decode_linear::DecodePath::{Aten, Packed, Rows};
use crate::error::{ModelError, Result};
use crate::onednn;
use crate::rows_linear;
use crate::shim::rows;
pub use crate::shim::MAX_ROWS;
use std::cell::{Cell, RefCell};
use tch::{Device, Kind, Tensor};

/// Which product decode steps use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DecodePath {
    /// aten's `linear` (MKL on CPU), as prefill.
    #[default]
    Aten,
    /// oneDNN's inner product on a packed copy of the weight (bf16 on CPU).
    Packed,
    /// The few-row kernel on a packed copy of the weight (f32 on an AVX2 or AVX-512 CPU, bf16
    /// on one with AVX512-BF16).
    Rows,
}

/// The path for weights of this dtype on this device: the few-row kernel where it runs (f32 on
/// an AVX2 or AVX-512 CPU, bf16 on one with AVX512-BF16), else oneDNN's packed weights in bf16,
/// else aten. `COMAS_DECODE_LINEAR`: `auto` (the default), `aten` (no packed copies: saves their
/// memory, or to compare) or `onednn` (oneDNN rather than the kernel in bf16, to compare).
pub fn choose(kind: Kind, device: Device) -> DecodePath {
    let onednn_first = match std::env::var("COMAS_DECODE_LINEAR").as_deref() {
        Ok("aten") => return Aten,
        Ok("auto") | Err(_) => false,
        Ok("onednn") => true,
        Ok(other) => {
            tracing::warn!(
                value = other,
                "COMAS_DECODE_LINEAR is `auto`, `aten` or `onednn`; using `auto`"
            );
            false
        }
    };
    let cpu = device == Device::Cpu;
    let kernel = match kind {
        Kind::Float => cpu && rows_linear::available(),
        Kind::BFloat16 => cpu && rows_linear::bf16_available(),
        _ => false,
    };
    let onednn = onednn::applies(kind, device);
    match (kernel, onednn) {
        (_, true) if onednn_first => Packed,
        (true, _) => Rows,
        (false, true) => Packed,
        (false, false) => Aten,
    }
}

type PackFn = fn(&Tensor) -> Result<Tensor>;
type ProductFn = fn(&Tensor, &Tensor, Option<&Tensor>, i64) -> Result<Tensor>;

impl DecodePath {
    /// How this path packs a weight and multiplies by the packed copy; `None` for aten.
    fn kernels(self) -> Option<(PackFn, ProductFn)> {
        match self {
            Aten => None,
            Packed => Some((onednn::pack, onednn::linear)),
            Rows => Some((rows_linear::pack, rows_linear::packed_linear)),
        }
    }
}

/// A weight [out, in] of a decode product and its bias [out], if it has one.
pub type Part<'a> = (&'a Tensor, Option<&'a Tensor>);

/// A decode product: one weight, or several that take the same input (q/k/v, gate/up), packed
/// one after another into one copy so that a step makes one call for all of them. Aten until
/// [`DecodeLinear::set_parts`] picks another path. The packed copy is made when the path is set
/// and again whenever a weight or bias has changed in place since (a full-weight update bumps its
/// version counter), so it is never stale. Only engines that decode set a path, never a learner.
#[derive(Default)]
pub struct DecodeLinear {
    path: Cell<DecodePath>,
    packed: RefCell<Option<PackedCopy>>,
}

/// The packed weights, their biases laid end to end, and the versions they were made from.
struct PackedCopy {
    weight: Tensor,
    bias: Option<Tensor>,
    versions: Vec<i64>,
}

/// Every part's weight and bias version, in order.
fn versions(parts: &[Part]) -> Vec<i64> {
    parts
        .iter()
        .flat_map(|(w, b)| {
            std::iter::once(w.internal_version()).chain(b.map(Tensor::internal_version))
        })
        .collect()
}

fn pack_parts(pack: PackFn, parts: &[Part]) -> Result<PackedCopy> {
    let weight = match parts {
        [(w, _)] => pack(w)?,
        _ => pack(&Tensor::cat(&parts.iter().map(|p| p.0).collect::<Vec<_>>(), 0))?,
    };
    let bias = match parts.iter().map(|p| p.1).collect::<Option<Vec<_>>>() {
        Some(b) if b.len() == 1 => Some(b[0].shallow_clone()),
        Some(b) => Some(Tensor::cat(&b, 0)),
        None if parts.iter().all(|p| p.1.is_none()) => None,
        None => {
            return Err(ModelError::Weights(
                "weights packed together must all have a bias or none".into(),
            ))
        }
    };
    Ok(PackedCopy { weight, bias, versions: versions(parts) })
}

impl DecodeLinear {
    /// Switches one weight to `path` ([`DecodeLinear::set_parts`]).
    pub fn set(&self, path: DecodePath, weight: &Tensor) {
        self.set_parts(path, &[(weight, None)]);
    }

    /// Switches to `path`, packing the parts now (so the first decode step does not pay for
    /// it); aten drops the copy. Parts that cannot be packed stay on aten (logged).
    pub fn set_parts(&self, path: DecodePath, parts: &[Part]) {
        self.path.set(Aten);
        self.packed.replace(None);
        let Some((pack, _)) = path.kernels() else { return };
        match pack_parts(pack, parts) {
            Ok(p) => {
                self.packed.replace(Some(p));
                self.path.set(path);
            }
            Err(e) => tracing::warn!(error = %e, ?path, "cannot pack a weight; it uses aten"),
        }
    }

    /// `x · weightᵀ (+ bias)` on the chosen path when it applies (at most [`MAX_ROWS`] rows,
    /// no gradient), else `None`: use aten. A failure is logged and sends this weight to aten
    /// from then on rather than failing the step.
    pub fn forward(&self, x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Option<Tensor> {
        self.forward_parts(x, &[(weight, bias)]).and_then(|mut ys| ys.pop())
    }

    /// Each part's `x · weightᵀ (+ bias)`, from one call, when the chosen path applies (as
    /// [`DecodeLinear::forward`]). The results are views of one [.., Σ out] tensor.
    pub fn forward_parts(&self, x: &Tensor, parts: &[Part]) -> Option<Vec<Tensor>> {
        let path = self.path.get();
        let (pack, product) = path.kernels()?;
        if rows(x) > MAX_ROWS || x.requires_grad() || parts.iter().any(|p| p.0.requires_grad()) {
            return None;
        }
        let outs: Vec<i64> = parts.iter().map(|p| p.0.size()[0]).collect();
        let mut slot = self.packed.borrow_mut();
        if slot.as_ref().is_none_or(|p| p.versions != versions(parts)) {
            *slot = pack_parts(pack, parts)
                .inspect_err(|e| tracing::warn!(error = %e, ?path, "cannot pack a weight"))
                .ok();
        }
        let result = match slot.as_ref() {
            Some(p) => product(x, &p.weight, p.bias.as_ref(), outs.iter().sum()),
            None => Err(ModelError::Weights("no packed copy".into())),
        };
        match result {
            Ok(y) if parts.len() == 1 => Some(vec![y]),
            Ok(y) => Some(y.split_with_sizes(&outs, -1)),
            Err(e) => {
                tracing::warn!(error = %e, ?path, "decode linear failed; these weights use aten from now on");
                self.path.set(Aten);
                *slot = None;
                None
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

    #[test]
    fn a_packed_copy_is_made_again_after_the_weight_changes_in_place() {
        let mut paths = vec![(Rows, Kind::Float)];
        if onednn::cpu_runs_bf16() {
            paths.push((Packed, Kind::BFloat16));
        }
        for (path, kind) in paths {
            let mut w = Tensor::ones([40, 4], (kind, Device::Cpu));
            let x = Tensor::ones([2, 4], (kind, Device::Cpu));
            let d = DecodeLinear::default();
            d.set(path, &w);
            let values = |y: Tensor| Vec::<f32>::try_from(y.to_kind(Kind::Float).flatten(0, -1));
            assert_eq!(values(d.forward(&x, &w, None).unwrap()).unwrap(), vec![4.0; 80]);
            tch::no_grad(|| {
                let _ = w.fill_(2.0);
            });
            assert_eq!(
                values(d.forward(&x, &w, None).unwrap()).unwrap(),
                vec![8.0; 80],
                "{path:?}: the packed copy follows the weight"
            );
            d.set(Aten, &w);
            assert!(d.forward(&x, &w, None).is_none(), "{path:?}: aten again");
        }
    }

    #[test]
    fn parts_packed_together_give_each_part_its_own_product() {
        let (q, k, v, bq, bk, bv, x) = crate::seeded::with_torch_seed(3, || {
            let o = (Kind::Float, Device::Cpu);
            (
                Tensor::randn([40, 24], o),
                Tensor::randn([8, 24], o),
                Tensor::randn([8, 24], o),
                Tensor::randn([40], o),
                Tensor::randn([8], o),
                Tensor::randn([8], o),
                Tensor::randn([3, 24], o),
            )
        });
        let parts = [(&q, Some(&bq)), (&k, Some(&bk)), (&v, Some(&bv))];
        let d = DecodeLinear::default();
        d.set_parts(Rows, &parts);
        let check = |d: &DecodeLinear| {
            let ys = d.forward_parts(&x, &parts).expect("the fused product runs");
            for (y, (w, b)) in ys.iter().zip(&parts) {
                let want = rows_linear::linear(&x, w, *b).unwrap();
                assert!(y.equal(&want), "a part's product differs from its own");
            }
        };
        check(&d);
        // A bias changed in place is packed again with its weight.
        tch::no_grad(|| {
            let _ = bk.shallow_clone().fill_(1.5);
        });
        check(&d);
        // Parts with and without a bias are not fused: aten takes them.
        let mixed = [(&q, Some(&bq)), (&k, None)];
        let m = DecodeLinear::default();
        m.set_parts(Rows, &mixed);
        assert!(m.forward_parts(&x, &mixed).is_none());
    }
}
