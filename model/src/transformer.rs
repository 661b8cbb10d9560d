//! The decoder-only transformer shared by Qwen2/Qwen2.5, Qwen3 and Llama 3.x. Field names follow
//! the checkpoint's tensor names; the KV cache lives outside the model.
use crate::attention::Attention;
use crate::config::Config;
use crate::decode_linear::{self, DecodeLinear, DecodePath};
use crate::error::{ModelError, Result};
use crate::kv_cache::{CacheStep, KvCache};
use crate::layers::{LayerCtx, Linear, RmsNorm};
use crate::lora::{LoraBatch, Proj};
use crate::mask;
use crate::rope::Rope;
use crate::weights::Checkpoint;
use std::path::Path;
use tch::{Device, Kind, Tensor};

struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    /// gate and up in one decode product (set by [`CausalLm::pack_for_decode`]).
    gate_up_decode: DecodeLinear,
}

impl Mlp {
    fn load(ckpt: &mut Checkpoint, p: &str, cfg: &Config) -> Result<Self> {
        let (h, i, bias) = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        Ok(Self {
            gate_proj: Linear::load(ckpt, &format!("{p}.gate_proj"), h, i, bias)?,
            up_proj: Linear::load(ckpt, &format!("{p}.up_proj"), h, i, bias)?,
            down_proj: Linear::load(ckpt, &format!("{p}.down_proj"), i, h, bias)?,
            gate_up_decode: DecodeLinear::default(),
        })
    }

    fn forward(&self, layer: usize, x: &Tensor, lora: Option<&LoraBatch>) -> Tensor {
        let with_lora = |which: Proj, input: &Tensor, y: Tensor| match lora {
            Some(l) => l.apply(layer, which, input, y),
            None => y,
        };
        let parts = [self.gate_proj.part(), self.up_proj.part()];
        let (gate, up) = match self.gate_up_decode.forward_parts(x, &parts).as_deref() {
            Some([g, u]) => (g.shallow_clone(), u.shallow_clone()),
            _ => (self.gate_proj.forward(x), self.up_proj.forward(x)),
        };
        let act = with_lora(Proj::Gate, x, gate).silu() * with_lora(Proj::Up, x, up);
        with_lora(Proj::Down, &act, self.down_proj.forward(&act))
    }
}

struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    fn forward(
        &self,
        layer: usize,
        x: &Tensor,
        ctx: &LayerCtx,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        let h = x + self.self_attn.forward(layer, &self.input_layernorm.forward(x), ctx, cache);
        let m = self.mlp.forward(layer, &self.post_attention_layernorm.forward(&h), ctx.lora);
        h + m
    }
}

/// What a checkpointed forward keeps for its backward pass (see
/// [`CausalLm::forward_hidden_checkpointed`]).
pub struct Checkpointed<'a> {
    model: &'a CausalLm,
    ids: Tensor,
    cos: Tensor,
    sin: Tensor,
    mask: Option<Tensor>,
    lora: Option<LoraBatch<'a>>,
    /// Each layer's input, computed without autograd.
    inputs: Vec<Tensor>,
    /// The last layer's output, the leaf the loss's gradient arrives at.
    last: Tensor,
}

impl Checkpointed<'_> {
    /// Call after the loss's `backward()`: recomputes each layer, last first, with autograd,
    /// and back-propagates the gradient arriving at its output, accumulating the parameters'
    /// gradients as one backward over the whole model would (up to float rounding: sums may
    /// run in another order).
    pub fn backward(self) {
        let mut grad = self.last.grad();
        if !grad.defined() {
            return;
        }
        let ctx = LayerCtx {
            cos: &self.cos,
            sin: &self.sin,
            mask: self.mask.as_ref(),
            lora: self.lora.as_ref(),
            step: None,
        };
        for (i, layer) in self.model.layers.iter().enumerate().rev() {
            let x = self.inputs[i].detach().set_requires_grad(true);
            let out = layer.forward(i, &x, &ctx, None);
            // A surrogate whose gradient with respect to `out` is `grad`.
            (out * &grad).sum(Kind::Float).backward();
            grad = x.grad();
        }
        if self.model.embed_tokens.requires_grad() {
            let emb = Tensor::embedding(&self.model.embed_tokens, &self.ids, -1, false, false);
            (emb * &grad).sum(Kind::Float).backward();
        }
    }
}

/// A causal language model with its weights on one device in one dtype.
pub struct CausalLm {
    config: Config,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// Shares storage with `embed_tokens` when embeddings are tied.
    lm_head: Tensor,
    lm_head_decode: DecodeLinear,
    rope: Rope,
    kind: Kind,
    device: Device,
}

impl CausalLm {
    /// Loads `config.json` and the safetensors weights of a Hugging Face model folder.
    pub fn load(dir: &Path, kind: Kind, device: Device) -> Result<Self> {
        let config = Config::from_file(&dir.join("config.json"))?;
        let mut ckpt = Checkpoint::open(dir, kind, device)?;
        let model = Self::from_checkpoint(config, &mut ckpt, kind, device)?;
        let unused = ckpt.unused();
        if !unused.is_empty() {
            tracing::warn!(
                count = unused.len(),
                first = unused[0],
                "checkpoint tensors not used by the model"
            );
        }
        Ok(model)
    }

    fn from_checkpoint(
        config: Config,
        ckpt: &mut Checkpoint,
        kind: Kind,
        device: Device,
    ) -> Result<Self> {
        let (v, h) = (config.vocab_size, config.hidden_size);
        let embed_tokens = ckpt.take("model.embed_tokens.weight", &[v, h])?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers as usize);
        for i in 0..config.num_hidden_layers {
            let p = format!("model.layers.{i}");
            layers.push(DecoderLayer {
                self_attn: Attention::load(ckpt, &format!("{p}.self_attn"), &config)?,
                mlp: Mlp::load(ckpt, &format!("{p}.mlp"), &config)?,
                input_layernorm: RmsNorm::load(
                    ckpt,
                    &format!("{p}.input_layernorm.weight"),
                    h,
                    config.rms_norm_eps,
                )?,
                post_attention_layernorm: RmsNorm::load(
                    ckpt,
                    &format!("{p}.post_attention_layernorm.weight"),
                    h,
                    config.rms_norm_eps,
                )?,
            });
        }
        let norm = RmsNorm::load(ckpt, "model.norm.weight", h, config.rms_norm_eps)?;
        let lm_head = if config.tie_word_embeddings {
            embed_tokens.shallow_clone()
        } else {
            ckpt.take("lm_head.weight", &[v, h])?
        };
        let rope = Rope::new(&config.rope, config.head_dim, device);
        Ok(Self {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            lm_head_decode: DecodeLinear::default(),
            rope,
            kind,
            device,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// A second handle on the same weights (no copy): for LoRA trainers of one process that
    /// train adapters over one frozen base. Anything that changes the weights in place changes
    /// them for both, so only frozen bases may be shared.
    pub fn share(&self) -> Result<Self> {
        let mut held = Checkpoint::held(self.named_parameters(), self.kind, self.device);
        Self::from_checkpoint(self.config.clone(), &mut held, self.kind, self.device)
    }

    /// Parameters by checkpoint name (shallow clones sharing storage). With tied embeddings
    /// `lm_head.weight` is not listed, as in the checkpoint.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out =
            vec![("model.embed_tokens.weight".to_string(), self.embed_tokens.shallow_clone())];
        for (i, l) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let a = &l.self_attn;
            for (name, lin) in [
                ("q_proj", &a.q_proj),
                ("k_proj", &a.k_proj),
                ("v_proj", &a.v_proj),
                ("o_proj", &a.o_proj),
            ] {
                out.push((format!("{p}.self_attn.{name}.weight"), lin.weight.shallow_clone()));
                if let Some(b) = &lin.bias {
                    out.push((format!("{p}.self_attn.{name}.bias"), b.shallow_clone()));
                }
            }
            for (name, n) in [("q_norm", &a.q_norm), ("k_norm", &a.k_norm)] {
                if let Some(n) = n {
                    out.push((format!("{p}.self_attn.{name}.weight"), n.weight.shallow_clone()));
                }
            }
            let m = &l.mlp;
            for (name, lin) in
                [("gate_proj", &m.gate_proj), ("up_proj", &m.up_proj), ("down_proj", &m.down_proj)]
            {
                out.push((format!("{p}.mlp.{name}.weight"), lin.weight.shallow_clone()));
                if let Some(b) = &lin.bias {
                    out.push((format!("{p}.mlp.{name}.bias"), b.shallow_clone()));
                }
            }
            out.push((
                format!("{p}.input_layernorm.weight"),
                l.input_layernorm.weight.shallow_clone(),
            ));
            out.push((
                format!("{p}.post_attention_layernorm.weight"),
                l.post_attention_layernorm.weight.shallow_clone(),
            ));
        }
        out.push(("model.norm.weight".to_string(), self.norm.weight.shallow_clone()));
        if !self.config.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), self.lm_head.shallow_clone()));
        }
        out
    }

    /// Makes every weight trainable (full fine-tuning) or frozen. Tied embeddings are one tensor,
    /// so both of its uses accumulate into one gradient.
    pub fn set_requires_grad(&self, on: bool) {
        for (_, t) in self.named_parameters() {
            let _ = t.set_requires_grad(on);
        }
    }

    fn check_ids(&self, input_ids: &Tensor) -> Result<()> {
        if input_ids.dim() != 2 {
            return Err(ModelError::Input(format!(
                "input ids must be [batch, seq], got {:?}",
                input_ids.size()
            )));
        }
        if input_ids.numel() > 0 {
            let (lo, hi) = (input_ids.min().int64_value(&[]), input_ids.max().int64_value(&[]));
            if lo < 0 || hi >= self.config.vocab_size {
                return Err(ModelError::Input(format!(
                    "token id out of range [{lo}, {hi}]; the model's vocabulary has {} entries",
                    self.config.vocab_size
                )));
            }
        }
        Ok(())
    }

    fn run_layers(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: Option<&Tensor>,
        mut cache: Option<&mut KvCache>,
        step: Option<&CacheStep>,
        lora: Option<&LoraBatch>,
    ) -> Tensor {
        let _span =
            tracing::trace_span!("forward", batch = input_ids.size()[0], seq = input_ids.size()[1])
                .entered();
        let mut x = Tensor::embedding(&self.embed_tokens, input_ids, -1, false, false);
        let (cos, sin) = self.rope.cos_sin(positions, self.kind);
        let lora = lora.filter(|l| !l.is_empty());
        let ctx = LayerCtx { cos: &cos, sin: &sin, mask, lora, step };
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(i, &x, &ctx, cache.as_deref_mut());
        }
        self.norm.forward(&x)
    }

    /// Projects final hidden states to vocabulary logits.
    pub fn lm_head(&self, hidden: &Tensor) -> Tensor {
        self.lm_head_decode
            .forward(hidden, &self.lm_head, None)
            .unwrap_or_else(|| hidden.linear::<Tensor>(&self.lm_head, None))
    }

    /// Lets decode steps (at most [`decode_linear::MAX_ROWS`] rows) take the fast product for
    /// this dtype on this device ([`decode_linear::choose`]): the few-row kernel in f32 and, on
    /// CPUs with AVX512-BF16, in bf16; oneDNN's packed linears in bf16 elsewhere. Each takes a
    /// packed copy of every linear weight (the memory of the weights again), so only models that
    /// generate do this. Returns the path taken.
    pub fn pack_for_decode(&self) -> DecodePath {
        self.pack_for_decode_on(decode_linear::choose(self.kind, self.device))
    }

    /// [`CausalLm::pack_for_decode`] on a given path (tests and benches compare them); a path
    /// that does not run here leaves the products on aten (logged).
    pub fn pack_for_decode_on(&self, path: DecodePath) -> DecodePath {
        for l in &self.layers {
            let (a, m) = (&l.self_attn, &l.mlp);
            // Products that share an input are packed together (one call each per step); their
            // own copies stay on aten, which a failed fused product falls back to.
            a.qkv_decode.set_parts(path, &[a.q_proj.part(), a.k_proj.part(), a.v_proj.part()]);
            m.gate_up_decode.set_parts(path, &[m.gate_proj.part(), m.up_proj.part()]);
            for lin in [&a.o_proj, &m.down_proj] {
                lin.decode.set_parts(path, &[lin.part()]);
            }
        }
        self.lm_head_decode.set(path, &self.lm_head);
        path
    }

    /// Full-sequence forward: logits [B, S, V] for every position. `attention_mask` [B, S]
    /// (1 = token, 0 = padding) may pad on either side; positions count real tokens only.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        lora: Option<&LoraBatch>,
    ) -> Result<Tensor> {
        Ok(self.lm_head(&self.forward_hidden(input_ids, attention_mask, lora)?))
    }

    /// As `forward` but stops before the vocabulary projection: final hidden states [B, S, H].
    pub fn forward_hidden(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        lora: Option<&LoraBatch>,
    ) -> Result<Tensor> {
        let (input_ids, positions, attn) = self.full_sequence(input_ids, attention_mask)?;
        Ok(self.run_layers(&input_ids, &positions, attn.as_ref(), None, None, lora))
    }

    /// `forward_hidden` for training with activation checkpointing: the layers run without
    /// autograd, keeping only each layer's input, and the returned hidden states hang off a
    /// leaf after the last layer. After `backward()` of a loss built on them,
    /// [`Checkpointed::backward`] recomputes one layer at a time and carries the gradient down,
    /// so activation memory is one layer's instead of all layers', for one extra forward.
    pub fn forward_hidden_checkpointed<'a>(
        &'a self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        lora: Option<LoraBatch<'a>>,
    ) -> Result<(Tensor, Checkpointed<'a>)> {
        let (ids, positions, mask) = self.full_sequence(input_ids, attention_mask)?;
        let (cos, sin) = self.rope.cos_sin(&positions, self.kind);
        let lora = lora.filter(|l| !l.is_empty());
        let mut inputs = Vec::with_capacity(self.layers.len());
        let last = tch::no_grad(|| {
            let ctx = LayerCtx {
                cos: &cos,
                sin: &sin,
                mask: mask.as_ref(),
                lora: lora.as_ref(),
                step: None,
            };
            let mut x = Tensor::embedding(&self.embed_tokens, &ids, -1, false, false);
            for (i, layer) in self.layers.iter().enumerate() {
                inputs.push(x.shallow_clone());
                x = layer.forward(i, &x, &ctx, None);
            }
            x
        })
        .set_requires_grad(true);
        let hidden = self.norm.forward(&last);
        Ok((hidden, Checkpointed { model: self, ids, cos, sin, mask, lora, inputs, last }))
    }

    /// Ids on the model's device, positions and the attention mask of a full-sequence forward:
    /// `None` (plain causal) when no row has padding before a real token, as in the
    /// right-padded batches of training and scoring. A padding query then also sees earlier
    /// padding, which changes only outputs nobody reads.
    fn full_sequence(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        self.check_ids(input_ids)?;
        let input_ids = input_ids.to_device(self.device);
        let (b, s) = (input_ids.size()[0], input_ids.size()[1]);
        let valid = match attention_mask {
            Some(m) => {
                if m.size() != [b, s] {
                    return Err(ModelError::Input(format!(
                        "attention mask {:?} does not match ids {:?}",
                        m.size(),
                        [b, s]
                    )));
                }
                m.to_device(self.device).to_kind(Kind::Bool)
            }
            None => Tensor::ones([b, s], (Kind::Bool, self.device)),
        };
        let positions = mask::positions(&valid, &Tensor::zeros([b], (Kind::Int64, self.device)));
        let attn = (!mask::is_right_padded(&valid)).then(|| mask::attention_mask(&valid, 0, s));
        Ok((input_ids, positions, attn))
    }

    /// Forward over new tokens appended to rows `first_row..first_row + n` of `cache`. The
    /// input [n, S] is right-padded: row j has `new_lens[j]` real tokens. Returns the logits after
    /// each row's last real token, [n, V]: what decoding needs.
    pub fn forward_cached(
        &self,
        input_ids: &Tensor,
        new_lens: &[i64],
        first_row: i64,
        cache: &mut KvCache,
        lora: Option<&LoraBatch>,
    ) -> Result<Tensor> {
        self.check_ids(input_ids)?;
        let (n, s) = (input_ids.size()[0], input_ids.size()[1]);
        if n != new_lens.len() as i64 {
            return Err(ModelError::Input(format!(
                "{n} input rows but {} row lengths",
                new_lens.len()
            )));
        }
        let input_ids = input_ids.to_device(self.device);
        let step = cache.begin(first_row, new_lens, s)?;
        let mask = (!step.causal).then_some(&step.mask);
        let hidden =
            self.run_layers(&input_ids, &step.positions, mask, Some(cache), Some(&step), lora);
        cache.commit(&step);
        let last = if s == 1 {
            hidden.squeeze_dim(1)
        } else {
            let idx: Vec<i64> =
                new_lens.iter().enumerate().map(|(j, l)| j as i64 * s + l - 1).collect();
            hidden
                .view([n * s, -1])
                .index_select(0, &Tensor::from_slice(&idx).to_device(self.device))
        };
        Ok(self.lm_head(&last))
    }

    /// Log-probabilities (f32) of `input_ids[:, 1:]` under the model: [B, S-1]. Logits are divided
    /// by `temperature` first, as a sampler at that temperature would. Padding positions hold 0.
    pub fn token_logprobs(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        temperature: f64,
        lora: Option<&LoraBatch>,
    ) -> Result<Tensor> {
        if !(temperature > 0.0 && temperature.is_finite()) {
            return Err(ModelError::Input(format!(
                "temperature must be positive and finite, got {temperature}"
            )));
        }
        let s = input_ids.size().get(1).copied().unwrap_or(0);
        if s < 2 {
            return Err(ModelError::Input("need at least two tokens to score".into()));
        }
        let hidden = self.forward_hidden(input_ids, attention_mask, lora)?;
        let logits = self.lm_head(&hidden.narrow(1, 0, s - 1)).to_kind(Kind::Float) / temperature;
        let targets = input_ids.to_device(self.device).narrow(1, 1, s - 1);
        let lp = logits
            .log_softmax(-1, Kind::Float)
            .gather(-1, &targets.unsqueeze(-1), false)
            .squeeze_dim(-1);
        Ok(match attention_mask {
            Some(m) => lp * m.to_device(self.device).narrow(1, 1, s - 1).to_kind(Kind::Float),
            None => lp,
        })
    }
}

#[cfg(test)]
mod tests;
