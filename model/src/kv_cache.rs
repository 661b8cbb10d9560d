//! Key/value cache held outside the model, so many caches can share one set of weights.
//!
//! Layout: per layer, keys and values of shape [B, kv_heads, capacity, head_dim]. Row b is one
//! sequence; slots (columns) are filled left to right by every forward call, and `valid` records
//! which slots hold real tokens (prompts are left-padded, finished rows can be dropped). Each row
//! keeps its own next position, so rows of different lengths decode together.
use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::mask;
use tch::{Device, Kind, Tensor};

pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    /// [B, capacity] bool
    valid: Tensor,
    /// [B] i64: number of real tokens per row (the next position id)
    next_pos: Tensor,
    len: i64,
    capacity: i64,
    kv_heads: i64,
    head_dim: i64,
    kind: Kind,
    device: Device,
}

/// What one forward call over the cache needs: where the new slots start, their position ids
/// and the attention mask over all used slots.
pub struct CacheStep {
    pub start: i64,
    pub positions: Tensor,
    pub mask: Tensor,
}

const GROW_ALIGN: i64 = 64;

impl KvCache {
    pub fn new(cfg: &Config, batch: i64, capacity: i64, kind: Kind, device: Device) -> Self {
        let capacity = capacity.max(1);
        let shape = [batch, cfg.num_key_value_heads, capacity, cfg.head_dim];
        let n = cfg.num_hidden_layers as usize;
        Self {
            keys: (0..n).map(|_| Tensor::zeros(shape, (kind, device))).collect(),
            values: (0..n).map(|_| Tensor::zeros(shape, (kind, device))).collect(),
            valid: Tensor::zeros([batch, capacity], (Kind::Bool, device)),
            next_pos: Tensor::zeros([batch], (Kind::Int64, device)),
            len: 0,
            capacity,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            kind,
            device,
        }
    }

    /// Slots used so far (including padding slots).
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn batch_size(&self) -> i64 {
        self.valid.size()[0]
    }

    pub fn capacity(&self) -> i64 {
        self.capacity
    }

    /// Bytes held by the key/value tensors.
    pub fn size_bytes(&self) -> i64 {
        let per = self.batch_size() * self.kv_heads * self.capacity * self.head_dim * self.kind.elt_size_in_bytes() as i64;
        per * 2 * self.keys.len() as i64
    }

    fn grow(&mut self, needed: i64) {
        let new_cap = ((needed.max(self.capacity * 2) + GROW_ALIGN - 1) / GROW_ALIGN) * GROW_ALIGN;
        let b = self.batch_size();
        let widen = |t: &Tensor, shape: &[i64], kind: Kind, device: Device| {
            let out = Tensor::zeros(shape, (kind, device));
            out.narrow(-2, 0, self.len).copy_(&t.narrow(-2, 0, self.len));
            out
        };
        let shape = [b, self.kv_heads, new_cap, self.head_dim];
        for t in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *t = widen(t, &shape, self.kind, self.device);
        }
        let valid = Tensor::zeros([b, new_cap], (Kind::Bool, self.device));
        valid.narrow(1, 0, self.len).copy_(&self.valid.narrow(1, 0, self.len));
        self.valid = valid;
        self.capacity = new_cap;
    }

    /// Reserves slots for `new_valid` [B, S] (true = real token), growing the cache if needed,
    /// and returns the positions and mask for the forward call.
    pub fn begin(&mut self, new_valid: &Tensor) -> Result<CacheStep> {
        let size = new_valid.size();
        if size.len() != 2 || size[0] != self.batch_size() {
            return Err(ModelError::Input(format!(
                "cache holds {} rows but the step has shape {size:?}",
                self.batch_size()
            )));
        }
        let s = size[1];
        let start = self.len;
        if start + s > self.capacity {
            self.grow(start + s);
        }
        let new_valid = new_valid.to_kind(Kind::Bool).to_device(self.device);
        self.valid.narrow(1, start, s).copy_(&new_valid);
        let positions = mask::positions(&new_valid, &self.next_pos);
        self.next_pos = &self.next_pos + new_valid.to_kind(Kind::Int64).sum_dim_intlist(1, false, Kind::Int64);
        self.len = start + s;
        let mask = mask::attention_mask(&self.valid.narrow(1, 0, self.len), start, s);
        Ok(CacheStep { start, positions, mask })
    }

    /// Writes a layer's new keys/values [B, kv_heads, S, D] at `start` and returns views of all
    /// used slots.
    pub fn store(&mut self, layer: usize, start: i64, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let s = k.size()[2];
        self.keys[layer].narrow(2, start, s).copy_(k);
        self.values[layer].narrow(2, start, s).copy_(v);
        (self.keys[layer].narrow(2, 0, start + s), self.values[layer].narrow(2, 0, start + s))
    }

    /// Appends the rows of `other` (sequences that just finished prefill) below this cache's rows.
    /// Both sides are right-aligned on the newest slot, so every row's next token lands in the
    /// same column; the shorter side is padded on the left with invalid slots.
    pub fn append_rows(&mut self, other: &KvCache) {
        let len = self.len.max(other.len);
        let capacity = len + (self.capacity - self.len).max(other.capacity - other.len).max(1);
        let (ba, bb) = (self.batch_size(), other.batch_size());
        let shape = [ba + bb, self.kv_heads, capacity, self.head_dim];
        let place = |dst: &Tensor, src: &Tensor, row: i64, rows: i64, used: i64, dim: i64| {
            if used > 0 && rows > 0 {
                dst.narrow(0, row, rows).narrow(dim, len - used, used).copy_(&src.narrow(dim, 0, used));
            }
        };
        for (mine, theirs) in self.keys.iter_mut().zip(&other.keys).chain(self.values.iter_mut().zip(&other.values)) {
            let merged = Tensor::zeros(shape, (self.kind, self.device));
            place(&merged, mine, 0, ba, self.len, 2);
            place(&merged, theirs, ba, bb, other.len, 2);
            *mine = merged;
        }
        let valid = Tensor::zeros([ba + bb, capacity], (Kind::Bool, self.device));
        place(&valid, &self.valid, 0, ba, self.len, 1);
        place(&valid, &other.valid, ba, bb, other.len, 1);
        self.valid = valid;
        self.next_pos = Tensor::cat(&[&self.next_pos, &other.next_pos], 0);
        self.len = len;
        self.capacity = capacity;
    }

    /// Keeps only the given rows (in that order), e.g. to drop finished sequences.
    pub fn retain_rows(&mut self, rows: &[i64]) {
        let idx = Tensor::from_slice(rows).to_device(self.device);
        for t in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *t = t.index_select(0, &idx);
        }
        self.valid = self.valid.index_select(0, &idx);
        self.next_pos = self.next_pos.index_select(0, &idx);
        // Leading slots that no remaining row uses are dead weight for attention; drop them.
        if self.len > 0 && !rows.is_empty() {
            let used = self.valid.narrow(1, 0, self.len).any_dim(0, false);
            let first = Vec::<bool>::try_from(&used.to_device(Device::Cpu)).unwrap_or_default().iter().position(|&u| u);
            if let Some(first) = first.filter(|&f| f > 0) {
                let first = first as i64;
                let keep = self.len - first;
                for t in self.keys.iter_mut().chain(self.values.iter_mut()) {
                    let moved = t.narrow(2, first, keep).copy();
                    t.narrow(2, 0, keep).copy_(&moved);
                }
                let moved = self.valid.narrow(1, first, keep).copy();
                self.valid.narrow(1, 0, keep).copy_(&moved);
                let _ = self.valid.narrow(1, keep, self.capacity - keep).fill_(0);
                self.len = keep;
            }
        }
    }
}
