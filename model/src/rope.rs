//! Rotary position embeddings: inverse frequencies per scaling scheme and cos/sin tables for
//! arbitrary per-sequence positions. Computed in f32 like `transformers`, then cast.
use crate::config::{RopeConfig, RopeScaling};
use tch::{Device, Kind, Tensor};

pub struct Rope {
    /// [head_dim / 2], f32
    inv_freq: Tensor,
}

/// `1 / theta^(2i/d)` for i in 0..d/2, in f32.
fn default_inv_freq(theta: f64, dim: i64, device: Device) -> Tensor {
    let exponent = Tensor::arange_start_step(0, dim, 2, (Kind::Int64, device)).to_kind(Kind::Float)
        / dim as f64;
    Tensor::pow_scalar(theta, &exponent).reciprocal()
}

/// Llama 3 scaling: low frequencies (long wavelengths) are divided by `factor`, high ones kept,
/// and the band in between interpolated smoothly.
fn llama3_inv_freq(inv_freq: &Tensor, factor: f64, low: f64, high: f64, old_ctx: f64) -> Tensor {
    let low_freq_wavelen = old_ctx / low;
    let high_freq_wavelen = old_ctx / high;
    let wavelen = inv_freq.reciprocal() * (2.0 * std::f64::consts::PI);
    let scaled = inv_freq / factor;
    let inv_llama = scaled.where_self(&wavelen.gt(low_freq_wavelen), inv_freq);
    let smooth = (wavelen.reciprocal() * old_ctx - low) / (high - low);
    let smoothed = (smooth.ones_like() - &smooth) * &inv_llama / factor + &smooth * &inv_llama;
    let is_medium = wavelen
        .lt(high_freq_wavelen)
        .logical_not()
        .logical_and(&wavelen.gt(low_freq_wavelen).logical_not());
    smoothed.where_self(&is_medium, &inv_llama)
}

impl Rope {
    pub fn new(cfg: &RopeConfig, head_dim: i64, device: Device) -> Self {
        let base = default_inv_freq(cfg.rope_theta, head_dim, device);
        let inv_freq = match cfg.scaling {
            RopeScaling::Default => base,
            RopeScaling::Linear { factor } => base / factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => llama3_inv_freq(
                &base,
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            ),
        };
        Self { inv_freq }
    }

    pub fn inv_freq(&self) -> &Tensor {
        &self.inv_freq
    }

    /// cos and sin tables for `positions` [B, S] (i64), shaped [B, 1, S, head_dim] in `kind`,
    /// ready to broadcast over heads.
    pub fn cos_sin(&self, positions: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * self.inv_freq.view([1, 1, -1]);
        let emb = Tensor::cat(&[&freqs, &freqs], -1);
        (emb.cos().to_kind(kind).unsqueeze(1), emb.sin().to_kind(kind).unsqueeze(1))
    }
}

fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[&x2.neg(), &x1], -1)
}

/// Applies the rotation to `x` [B, H, S, D].
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    x * cos + rotate_half(x) * sin
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vec(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(t.to_kind(Kind::Float).flatten(0, -1)).unwrap()
    }

    #[test]
    fn default_frequencies() {
        let r = Rope::new(
            &RopeConfig { rope_theta: 10000.0, scaling: RopeScaling::Default },
            8,
            Device::Cpu,
        );
        let f = vec(r.inv_freq());
        let want = [1.0, 0.1, 0.01, 0.001];
        for (a, b) in f.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{f:?}");
        }
    }

    #[test]
    fn llama3_scaling_bands() {
        // theta 10000, dim 8 -> wavelengths 2pi*[1, 10, 100, 1000]; old ctx 64, low 1 -> 64, high 4 -> 16
        let cfg = RopeConfig {
            rope_theta: 10000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64.0,
            },
        };
        let f = vec(Rope::new(&cfg, 8, Device::Cpu).inv_freq());
        assert!((f[0] - 1.0).abs() < 1e-6, "high frequency kept");
        // medium band: wavelength 62.83 between 16 and 64
        let smooth = (64.0 / (2.0 * std::f64::consts::PI * 10.0) - 1.0) / 3.0;
        let want = (1.0 - smooth) * 0.1 / 8.0 + smooth * 0.1;
        assert!((f[1] as f64 - want).abs() < 1e-6, "{} vs {want}", f[1]);
        assert!((f[2] - 0.01 / 8.0).abs() < 1e-7, "low frequency divided");
        assert!((f[3] - 0.001 / 8.0).abs() < 1e-8);
    }

    #[test]
    fn rotation_at_position_zero_is_identity_and_offsets_match() {
        let r = Rope::new(
            &RopeConfig { rope_theta: 10000.0, scaling: RopeScaling::Default },
            4,
            Device::Cpu,
        );
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).view([1, 1, 1, 4]);
        let (c, s) = r.cos_sin(&Tensor::from_slice(&[0i64]).view([1, 1]), Kind::Float);
        assert_eq!(vec(&apply(&x, &c, &s)), vec![1.0, 2.0, 3.0, 4.0]);
        // position 1, first pair rotates by 1 rad: (x1, x3) -> (x1 cos1 - x3 sin1, x3 cos1 + x1 sin1)
        let (c, s) = r.cos_sin(&Tensor::from_slice(&[1i64]).view([1, 1]), Kind::Float);
        let y = vec(&apply(&x, &c, &s));
        let (c1, s1) = (1f32.cos(), 1f32.sin());
        assert!((y[0] - (1.0 * c1 - 3.0 * s1)).abs() < 1e-6);
        assert!((y[2] - (3.0 * c1 + 1.0 * s1)).abs() < 1e-6);
    }
}
