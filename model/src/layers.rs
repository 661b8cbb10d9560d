//! The small layers every decoder block is made of (a linear map that may take the decode
//! fast path, RMSNorm), and what a layer's forward call is given besides its input.
use crate::decode_linear::{DecodeLinear, Part};
use crate::error::Result;
use crate::kv_cache::CacheStep;
use crate::lora::LoraBatch;
use crate::weights::Checkpoint;
use tch::{Kind, Tensor};

pub(crate) struct Linear {
    pub(crate) weight: Tensor,
    pub(crate) bias: Option<Tensor>,
    /// The decode steps' product (aten unless [`crate::CausalLm::pack_for_decode`]).
    pub(crate) decode: DecodeLinear,
}

impl Linear {
    pub(crate) fn load(
        ckpt: &mut Checkpoint,
        prefix: &str,
        in_dim: i64,
        out_dim: i64,
        bias: bool,
    ) -> Result<Self> {
        let weight = ckpt.take(&format!("{prefix}.weight"), &[out_dim, in_dim])?;
        let bias =
            if bias { Some(ckpt.take(&format!("{prefix}.bias"), &[out_dim])?) } else { None };
        Ok(Self { weight, bias, decode: DecodeLinear::default() })
    }

    /// The weight and bias, as a decode product takes them.
    pub(crate) fn part(&self) -> Part<'_> {
        (&self.weight, self.bias.as_ref())
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        self.decode
            .forward(x, &self.weight, self.bias.as_ref())
            .unwrap_or_else(|| x.linear(&self.weight, self.bias.as_ref()))
    }
}

pub(crate) struct RmsNorm {
    pub(crate) weight: Tensor,
    pub(crate) eps: f64,
}

impl RmsNorm {
    pub(crate) fn load(ckpt: &mut Checkpoint, name: &str, dim: i64, eps: f64) -> Result<Self> {
        Ok(Self { weight: ckpt.take(name, &[dim])?, eps })
    }

    /// Normalises in f32 and casts back before the weight, as `transformers` does.
    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        let kind = x.kind();
        let h = x.to_kind(Kind::Float);
        let var = h.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
        let h = h * (var + self.eps).rsqrt();
        &self.weight * h.to_kind(kind)
    }
}

/// Everything a layer needs for one forward call besides its input.
pub(crate) struct LayerCtx<'a> {
    pub(crate) cos: &'a Tensor,
    pub(crate) sin: &'a Tensor,
    /// The attention mask; `None` is plain causal attention (no padding before a real token),
    /// which lets SDPA skip reading a mask.
    pub(crate) mask: Option<&'a Tensor>,
    pub(crate) lora: Option<&'a LoraBatch<'a>>,
    /// Where this call's keys/values go in the cache, when there is one.
    pub(crate) step: Option<&'a CacheStep>,
}
