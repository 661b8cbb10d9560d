//! Grouped-query self-attention with rotary positions: SDPA, and for decode steps on the CPU the
//! grouped decode kernel or the blocked few-query products (see [`DecodeAttention`]); each gives a
//! row a result that does not depend on its batch.
use crate::config::Config;
use crate::decode_attention;
use crate::decode_linear::DecodeLinear;
use crate::error::Result;
use crate::kv_cache::{KvCache, ATTEND_BLOCK};
use crate::layers::{LayerCtx, Linear, RmsNorm};
use crate::lora::Proj;
use crate::rope;
use crate::weights::Checkpoint;
use tch::{Kind, Tensor};

pub(crate) struct Attention {
    pub(crate) q_proj: Linear,
    pub(crate) k_proj: Linear,
    pub(crate) v_proj: Linear,
    pub(crate) o_proj: Linear,
    /// q, k and v in one decode product (set by [`crate::CausalLm::pack_for_decode`]).
    pub(crate) qkv_decode: DecodeLinear,
    pub(crate) q_norm: Option<RmsNorm>,
    pub(crate) k_norm: Option<RmsNorm>,
    pub(crate) num_heads: i64,
    pub(crate) num_kv_heads: i64,
    pub(crate) head_dim: i64,
}

impl Attention {
    pub(crate) fn load(ckpt: &mut Checkpoint, p: &str, cfg: &Config) -> Result<Self> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (nq, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let norm = |ckpt: &mut Checkpoint, n: &str| -> Result<Option<RmsNorm>> {
            if cfg.qk_norm {
                Ok(Some(RmsNorm::load(ckpt, &format!("{p}.{n}.weight"), d, cfg.rms_norm_eps)?))
            } else {
                Ok(None)
            }
        };
        Ok(Self {
            q_proj: Linear::load(ckpt, &format!("{p}.q_proj"), h, nq * d, cfg.qkv_bias)?,
            k_proj: Linear::load(ckpt, &format!("{p}.k_proj"), h, nkv * d, cfg.qkv_bias)?,
            v_proj: Linear::load(ckpt, &format!("{p}.v_proj"), h, nkv * d, cfg.qkv_bias)?,
            o_proj: Linear::load(ckpt, &format!("{p}.o_proj"), nq * d, h, cfg.o_bias)?,
            qkv_decode: DecodeLinear::default(),
            q_norm: norm(ckpt, "q_norm")?,
            k_norm: norm(ckpt, "k_norm")?,
            num_heads: nq,
            num_kv_heads: nkv,
            head_dim: d,
        })
    }

    pub(crate) fn forward(
        &self,
        layer: usize,
        x: &Tensor,
        ctx: &LayerCtx,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        let (b, s) = (x.size()[0], x.size()[1]);
        let lora = |which: Proj, y: Tensor| match ctx.lora {
            Some(l) => l.apply(layer, which, x, y),
            None => y,
        };
        let parts = [self.q_proj.part(), self.k_proj.part(), self.v_proj.part()];
        let (yq, yk, yv) = match self.qkv_decode.forward_parts(x, &parts).as_deref() {
            Some([q, k, v]) => (q.shallow_clone(), k.shallow_clone(), v.shallow_clone()),
            _ => (self.q_proj.forward(x), self.k_proj.forward(x), self.v_proj.forward(x)),
        };
        let heads = |t: Tensor, n: i64, norm: &Option<RmsNorm>| {
            let t = t.view([b, s, n, self.head_dim]);
            let t = match norm {
                Some(nm) => nm.forward(&t),
                None => t,
            };
            t.transpose(1, 2)
        };
        let q = heads(lora(Proj::Q, yq), self.num_heads, &self.q_norm);
        let k = heads(lora(Proj::K, yk), self.num_kv_heads, &self.k_norm);
        let v = heads(lora(Proj::V, yv), self.num_kv_heads, &None);
        let q = rope::apply(&q, ctx.cos, ctx.sin);
        let k = rope::apply(&k, ctx.cos, ctx.sin);
        let (k, v) = match (cache, ctx.step) {
            (Some(c), Some(step)) => c.store(layer, step, &k, &v),
            _ => (k, v),
        };
        let scale = (self.head_dim as f64).powf(-0.5);
        let mode = decode_attention();
        let kernel = match (ctx.step.and_then(|st| st.visible.as_ref()), mode) {
            (Some(visible), DecodeAttention::Kernel) if decode_attention::applies(&q) => {
                // A step that fits `applies` passes the kernel's checks; should one not, SDPA
                // computes the same attention.
                decode_attention::attend(&q, &k, &v, visible, scale)
                    .inspect_err(
                        |e| tracing::error!(error = %e, "decode attention kernel; using SDPA"),
                    )
                    .ok()
            }
            _ => None,
        };
        let out = match (kernel, ctx.step.and_then(|st| st.dense.as_ref()), mode) {
            (Some(out), _, _) => out,
            (None, Some(blocked), DecodeAttention::Blocked) => {
                attend_few(&q, &k, &v, blocked, scale, self.num_kv_heads)
            }
            _ => {
                let gqa = self.num_heads != self.num_kv_heads;
                Tensor::scaled_dot_product_attention(
                    &q,
                    &k,
                    &v,
                    ctx.mask,
                    0.0,
                    ctx.mask.is_none(),
                    scale,
                    gqa,
                )
            }
        };
        let out = out.transpose(1, 2).reshape([b, s, self.num_heads * self.head_dim]);
        let y = self.o_proj.forward(&out);
        match ctx.lora {
            Some(l) => l.apply(layer, Proj::O, &out, y),
            None => y,
        }
    }
}

/// How a decode step on the CPU attends over the cache (`COMAS_DECODE_ATTENTION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeAttention {
    /// `kernel`, the default: [`decode_attention`] where it applies (f32 or bf16, one query per row,
    /// an AVX-512F CPU), else SDPA.
    Kernel,
    /// `sdpa` (or `exact`): libtorch's scaled dot-product attention with the step's mask.
    Sdpa,
    /// `blocked`: [`attend_few`], batched matrix products in fixed blocks of columns.
    Blocked,
}

/// The process's choice of [`DecodeAttention`], read once. Each gives a row the same result
/// whatever else shares its batch.
pub fn decode_attention() -> DecodeAttention {
    static CHOICE: std::sync::OnceLock<DecodeAttention> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| match std::env::var("COMAS_DECODE_ATTENTION").as_deref() {
        Ok("kernel") | Err(_) => DecodeAttention::Kernel,
        Ok("sdpa") | Ok("exact") => DecodeAttention::Sdpa,
        Ok("blocked") => DecodeAttention::Blocked,
        Ok(other) => {
            tracing::warn!(
                value = other,
                "COMAS_DECODE_ATTENTION is `kernel`, `sdpa` or `blocked`; using `kernel`"
            );
            DecodeAttention::Kernel
        }
    })
}

/// Attention of a few queries per row, q [B, H, S, D], over keys and values [B, KV, W, D], by
/// batched matrix products with the softmax in f32. `blocked` [B, 1, S, W] is true where a query
/// may not look. The result is [B, H, S, D], as SDPA's.
///
/// The result of a row must not depend on the cache width W or on the other rows, or a
/// sequence's tokens would depend on what it was batched with. So every reduction has a fixed
/// shape: the W columns are cut into blocks of [`ATTEND_BLOCK`]; scores, exponentials, sums and
/// value products are computed per block (products of fixed size, sums over a fixed length),
/// and the blocks are then added in order, one after another. Blocks past a row's tokens add
/// exact zeros. Query heads are grouped by the key/value head they share, so no key or value is
/// repeated.
pub(crate) fn attend_few(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    blocked: &Tensor,
    scale: f64,
    kv_heads: i64,
) -> Tensor {
    let (b, h, s, d) = q.size4().expect("q is [B, H, S, D]");
    let (g, w) = (h / kv_heads, k.size()[2]);
    let gs = g * s;
    // Row j of a group is query head j / S at position j % S.
    let blocked = if s == 1 {
        blocked.shallow_clone()
    } else {
        blocked.unsqueeze(2).expand([b, 1, g, s, w], false).reshape([b, 1, gs, w])
    };
    // A cache under a memory limit may hold a width that is not whole blocks: pad it.
    let pad = (ATTEND_BLOCK - w % ATTEND_BLOCK) % ATTEND_BLOCK;
    let (k, v, blocked) = if pad == 0 {
        (k.shallow_clone(), v.shallow_clone(), blocked)
    } else {
        (
            k.constant_pad_nd([0, 0, 0, pad]),
            v.constant_pad_nd([0, 0, 0, pad]),
            blocked.logical_not().constant_pad_nd([0, pad]).logical_not(),
        )
    };
    let n = (w + pad) / ATTEND_BLOCK;
    let k = k.reshape([b, kv_heads, n, ATTEND_BLOCK, d]);
    let v = v.reshape([b, kv_heads, n, ATTEND_BLOCK, d]);
    let blocked =
        blocked.reshape([b, 1, blocked.size()[2], n, ATTEND_BLOCK]).permute([0, 1, 3, 2, 4]);
    let q = q.reshape([b, kv_heads, 1, gs, d]);
    // [B, KV, n, GS, BLOCK]
    let scores = (q.matmul(&k.transpose(-1, -2)).to_kind(Kind::Float) * scale)
        .masked_fill(&blocked, f64::NEG_INFINITY);
    let top = scores.amax([2, 4].as_slice(), true);
    let weights = exp_by_position(&(scores - top));
    let sums = weights.sum_dim_intlist([-1].as_slice(), false, Kind::Float); // [B, KV, n, GS]
    let parts = weights.to_kind(v.kind()).matmul(&v); // [B, KV, n, GS, D]
    let (mut num, mut den) = (parts.select(2, 0).to_kind(Kind::Float), sums.select(2, 0));
    for i in 1..n {
        num += parts.select(2, i);
        den += sums.select(2, i);
    }
    (num / den.unsqueeze(-1)).to_kind(q.kind()).reshape([b, h, s, d])
}

/// `t.exp()` whose every element is computed the same way wherever it sits in the tensor.
/// libtorch's elementwise kernels take a vector path for most elements and a scalar one for the
/// tail of each thread's range, and the two may round an exponential differently; so the work
/// is cut into single-threaded slices of whole vectors (`t` holds whole attention blocks).
pub(crate) fn exp_by_position(t: &Tensor) -> Tensor {
    // Below libtorch's grain size (32768) an elementwise op runs on one thread.
    const SLICE: i64 = 16384;
    let out = t.contiguous();
    let flat = out.view([-1]);
    let len = flat.size()[0];
    let mut start = 0;
    while start < len {
        let _ = flat.narrow(0, start, SLICE.min(len - start)).exp_();
        start += SLICE;
    }
    out
}
