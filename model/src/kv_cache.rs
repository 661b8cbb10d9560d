//! Key/value cache held outside the model, so many caches can share one set of weights.
//!
//! Layout: per layer, keys and values of shape [row_capacity, kv_heads, col_capacity, head_dim].
//! Row r is one sequence and holds its tokens left-aligned in columns `0..len(r)`, so a token's
//! column is its position and rows of different lengths need no padding slots. Rows stay
//! compact (`0..rows`): a sequence that joins takes the next free row and one that leaves is
//! replaced by the last row (`swap_remove`), so neither copies any other row. Rows grow by
//! doubling; columns grow to what a joining sequence may come to hold (its prompt plus its most
//! new tokens, reserved when it joins, so never per step), within an optional limit, and shrink
//! again (`fit_columns`) when the sequences still held need far fewer: a decode step on the CPU
//! attends over every allocated column, so slack columns cost time on every step.
use crate::config::Config;
use crate::error::{ModelError, Result};
use tch::{Device, Kind, Tensor};

pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    /// Tokens held per row (the row's next position).
    lens: Vec<i64>,
    row_cap: i64,
    col_cap: i64,
    /// At most this many slots (rows × columns) are allocated, when set.
    limit: Option<i64>,
    kv_heads: i64,
    head_dim: i64,
    kind: Kind,
    device: Device,
}

/// Where one forward call writes its new tokens and what its queries may see. The call covers
/// rows `first_row..first_row + n`; row j gets `new_lens[j]` real tokens from the left of a
/// right-padded [n, S] input, written from column `lens[j]` on.
pub struct CacheStep {
    first_row: i64,
    /// (row, column) of every new token, both [n, S]; None when every row starts at the same
    /// column (then one block copy writes them).
    scatter: Option<(Tensor, Tensor)>,
    start: i64,
    width: i64,
    new_lens: Vec<i64>,
    pub positions: Tensor,
    /// [n, 1, S, width] (true = attend): causal over the row's own columns.
    pub mask: Tensor,
    /// Set for a step of few queries per row on the CPU (decoding): the step reads every
    /// allocated column, so its keys and values are one contiguous block, and `mask`'s
    /// complement (true = blocked) is kept for attention by plain matrix products.
    pub dense: Option<Tensor>,
    /// For a dense step of one query per row: the columns each row's query sees (int64 [n]), for
    /// the decode attention kernel, which reads no mask.
    pub visible: Option<Tensor>,
    /// Every row starts empty and its padding comes after its tokens: `mask` is plain causal
    /// attention for every real query, which SDPA runs without reading a mask.
    pub causal: bool,
}

/// Query tokens per row up to which a cached step on the CPU reads the whole cache as one block
/// (see [`CacheStep::dense`]): a view over rows only, no copy of the columns in use, attended by
/// the decode attention kernel (one query per row), SDPA, or blocked matrix products
/// (`COMAS_DECODE_ATTENTION`).
pub const DENSE_MAX_QUERIES: i64 = 8;

/// Cache columns per block of the decode attention (`attend_few` in transformer.rs): scores,
/// softmax sums and value products are reduced within blocks of this fixed width and then over
/// the blocks in a fixed order, so a row's result does not depend on how wide the cache is.
pub const ATTEND_BLOCK: i64 = 64;

/// Column capacity is allocated in whole attention blocks, so a decode step needs no padding.
const COL_ALIGN: i64 = ATTEND_BLOCK;

/// Columns beyond the widest need that `fit_columns` tolerates before it reallocates: a copy of
/// the cache is worth it only once the slack is large.
const COL_SLACK: i64 = 128;

fn align(n: i64, to: i64) -> i64 {
    (n + to - 1) / to * to
}

impl KvCache {
    /// An empty cache with room for `rows` sequences of `cols` tokens.
    pub fn new(cfg: &Config, rows: i64, cols: i64, kind: Kind, device: Device) -> Self {
        let n = cfg.num_hidden_layers as usize;
        let (rows, cols) = (rows.max(0), align(cols.max(0), COL_ALIGN));
        let shape = [rows, cfg.num_key_value_heads, cols, cfg.head_dim];
        Self {
            keys: (0..n).map(|_| Tensor::zeros(shape, (kind, device))).collect(),
            values: (0..n).map(|_| Tensor::zeros(shape, (kind, device))).collect(),
            lens: Vec::new(),
            row_cap: rows,
            col_cap: cols,
            limit: None,
            kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            kind,
            device,
        }
    }

    /// Caps the slots (rows × columns) that growth may allocate; a reservation that needs more
    /// still gets exactly what it needs.
    pub fn set_limit(&mut self, slots: Option<i64>) {
        self.limit = slots;
    }

    /// Sequences held.
    pub fn rows(&self) -> usize {
        self.lens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// Tokens held by each row.
    pub fn lens(&self) -> &[i64] {
        &self.lens
    }

    /// Allocated slots (rows × columns).
    pub fn capacity_slots(&self) -> i64 {
        self.row_cap * self.col_cap
    }

    /// Bytes held by the key/value tensors.
    pub fn size_bytes(&self) -> i64 {
        let per_slot = self.kv_heads * self.head_dim * self.kind.elt_size_in_bytes() as i64;
        self.capacity_slots() * per_slot * 2 * self.keys.len() as i64
    }

    /// Makes room for `rows` sequences and `cols` columns. Rows grow by doubling (amortised),
    /// columns to `cols` (aligned); with a limit, the slack is dropped first, so an allocation
    /// exceeds the limit only when the need itself does.
    ///
    /// An allocation that fails (memory is short) is an error naming the size; the cache is left
    /// as it was.
    pub fn reserve(&mut self, rows: i64, cols: i64) -> Result<()> {
        if rows <= self.row_cap && cols <= self.col_cap {
            return Ok(());
        }
        let used_rows = self.lens.len() as i64;
        let used_cols = self.lens.iter().copied().max().unwrap_or(0);
        let (need_rows, need_cols) = (rows.max(used_rows), cols.max(used_cols));
        let mut new_rows =
            if rows > self.row_cap { rows.max(self.row_cap * 2) } else { self.row_cap };
        let mut new_cols = if cols > self.col_cap { align(cols, COL_ALIGN) } else { self.col_cap };
        if let Some(limit) = self.limit {
            if new_rows * new_cols > limit {
                new_cols = align(need_cols, COL_ALIGN);
            }
            if new_rows * new_cols > limit {
                new_rows = need_rows.max(limit / new_cols.max(1)).min(new_rows);
            }
            if new_rows * new_cols > limit {
                new_cols = need_cols;
                new_rows = need_rows.max(limit / new_cols.max(1)).min(new_rows);
            }
        }
        self.reallocate(new_rows, new_cols, used_rows, used_cols)
    }

    /// Gives the cache `cols` columns (aligned) when it holds more than `COL_SLACK` beyond
    /// that, copying the rows held; `cols` must cover every row's length. Returns whether it
    /// reallocated.
    pub fn fit_columns(&mut self, cols: i64) -> Result<bool> {
        let used_cols = self.lens.iter().copied().max().unwrap_or(0);
        let want = align(cols.max(used_cols), COL_ALIGN);
        if self.col_cap <= want + COL_SLACK {
            return Ok(false);
        }
        let used_rows = self.lens.len() as i64;
        self.reallocate(self.row_cap, want, used_rows, used_cols)?;
        Ok(true)
    }

    /// New tensors of `new_rows` × `new_cols` holding the first `used_rows` rows' first
    /// `used_cols` columns. On failure the cache is left as it was.
    fn reallocate(
        &mut self,
        new_rows: i64,
        new_cols: i64,
        used_rows: i64,
        used_cols: i64,
    ) -> Result<()> {
        let shape = [new_rows, self.kv_heads, new_cols, self.head_dim];
        let failed = |e: tch::TchError| {
            let bytes = new_rows
                * new_cols
                * self.kv_heads
                * self.head_dim
                * self.kind.elt_size_in_bytes() as i64
                * 2
                * self.keys.len() as i64;
            ModelError::Input(format!(
                "the KV cache for {new_rows} sequences of {new_cols} tokens ({:.2} GiB) could not be allocated on {:?}: {e}; lower the worker's --max-batch-tokens or --max-running",
                bytes as f64 / (1u64 << 30) as f64,
                self.device
            ))
        };
        let mut grown = Vec::with_capacity(self.keys.len() * 2);
        for t in self.keys.iter().chain(self.values.iter()) {
            let g = Tensor::f_zeros(shape, (self.kind, self.device)).map_err(failed)?;
            if used_rows > 0 && used_cols > 0 {
                g.narrow(0, 0, used_rows)
                    .narrow(2, 0, used_cols)
                    .f_copy_(&t.narrow(0, 0, used_rows).narrow(2, 0, used_cols))
                    .map_err(failed)?;
            }
            grown.push(g);
        }
        let values = grown.split_off(self.keys.len());
        (self.keys, self.values) = (grown, values);
        self.row_cap = new_rows;
        self.col_cap = new_cols;
        Ok(())
    }

    /// Adds `n` empty rows at the end; returns the first one.
    pub fn push_rows(&mut self, n: usize) -> Result<i64> {
        let first = self.lens.len() as i64;
        self.reserve(first + n as i64, self.col_cap)?;
        self.lens.extend(std::iter::repeat_n(0, n));
        Ok(first)
    }

    /// Appends a copy of row `row` of `other` (a cache of the same model): its keys, values and
    /// length. Returns the new row.
    pub fn adopt_row(&mut self, other: &KvCache, row: usize) -> Result<i64> {
        let len = other
            .lens
            .get(row)
            .copied()
            .ok_or_else(|| ModelError::Input(format!("the other cache has no row {row}")))?;
        if other.keys.len() != self.keys.len()
            || other.kv_heads != self.kv_heads
            || other.head_dim != self.head_dim
        {
            return Err(ModelError::Input("the other cache belongs to another model".into()));
        }
        self.push_row_from(&other.layers(), row, len)
    }

    /// Appends a row holding the first `len` columns of row `row` (the prompt of a sequence
    /// asked again); returns the new row.
    pub fn push_prefix_of(&mut self, row: usize, len: i64) -> Result<i64> {
        let held = self.lens.get(row).copied().ok_or_else(|| {
            ModelError::Input(format!("cache holds {} rows; no row {row}", self.lens.len()))
        })?;
        if !(0..=held).contains(&len) {
            return Err(ModelError::Input(format!(
                "row {row} holds {held} tokens; cannot copy {len} of them"
            )));
        }
        self.push_row_from(&self.layers(), row, len)
    }

    /// Every layer's keys, then every layer's values (handles to the same storage).
    fn layers(&self) -> Vec<Tensor> {
        self.keys.iter().chain(&self.values).map(Tensor::shallow_clone).collect()
    }

    /// Appends a row holding the first `len` columns of row `row` of `src` (as `layers`
    /// orders them, shaped as this cache's); returns the new row.
    fn push_row_from(&mut self, src: &[Tensor], row: usize, len: i64) -> Result<i64> {
        let first = self.lens.len() as i64;
        self.reserve(first + 1, len)?;
        if len > 0 {
            for (mine, theirs) in self.keys.iter().chain(&self.values).zip(src) {
                mine.narrow(0, first, 1)
                    .narrow(2, 0, len)
                    .f_copy_(&theirs.narrow(0, row as i64, 1).narrow(2, 0, len))?;
            }
        }
        self.lens.push(len);
        Ok(first)
    }

    /// Drops every row from `rows` on (rows added by a call that failed).
    pub fn truncate_rows(&mut self, rows: usize) {
        self.lens.truncate(rows);
    }

    /// Drops row `row`, moving the last row into its place (as `Vec::swap_remove`): one row is
    /// copied, the rest stay where they are.
    pub fn swap_remove(&mut self, row: usize) {
        let last = self.lens.len() - 1;
        if row != last {
            let len = self.lens[last];
            if len > 0 {
                for t in self.keys.iter().chain(self.values.iter()) {
                    t.narrow(0, row as i64, 1)
                        .narrow(2, 0, len)
                        .copy_(&t.narrow(0, last as i64, 1).narrow(2, 0, len));
                }
            }
        }
        self.lens.swap_remove(row);
    }

    /// Prepares a forward call over rows `first_row..first_row + new_lens.len()` whose input is
    /// right-padded to `width` tokens: checks the rows, grows the columns if needed and builds
    /// positions and mask. Nothing is recorded as held until `commit`.
    pub fn begin(&mut self, first_row: i64, new_lens: &[i64], width: i64) -> Result<CacheStep> {
        let n = new_lens.len() as i64;
        if first_row < 0 || first_row + n > self.lens.len() as i64 {
            return Err(ModelError::Input(format!(
                "cache holds {} rows; the step covers rows {first_row}..{}",
                self.lens.len(),
                first_row + n
            )));
        }
        if let Some(bad) = new_lens.iter().find(|&&l| l < 1 || l > width) {
            return Err(ModelError::Input(format!(
                "a row of the step has {bad} new tokens; each needs 1..={width}"
            )));
        }
        let starts: Vec<i64> = self.lens[first_row as usize..(first_row + n) as usize].to_vec();
        let needed = starts.iter().map(|s| s + width).max().unwrap_or(0);
        self.reserve(self.lens.len() as i64, needed)?;
        let device = self.device;
        let dense = device == Device::Cpu && width <= DENSE_MAX_QUERIES;
        // A dense step reads all allocated columns: a view over rows only is contiguous.
        let end = if dense { self.col_cap } else { needed };
        let offsets = Tensor::arange(width, (Kind::Int64, device)).view([1, width]);
        let start_t = Tensor::from_slice(&starts).to_device(device).view([n, 1]);
        let query_cols = &start_t + &offsets; // [n, S]
        let keys = Tensor::arange(end, (Kind::Int64, device)).view([1, 1, end]);
        let mask = keys.le_tensor(&query_cols.unsqueeze(-1)).unsqueeze(1); // [n, 1, S, end]
        let same_start = starts.windows(2).all(|w| w[0] == w[1]);
        Ok(CacheStep {
            first_row,
            scatter: (!same_start).then(|| {
                (
                    Tensor::arange(n, (Kind::Int64, device)).view([n, 1]).expand([n, width], false),
                    query_cols.shallow_clone(),
                )
            }),
            start: starts.first().copied().unwrap_or(0),
            width: end,
            new_lens: new_lens.to_vec(),
            positions: query_cols,
            dense: dense.then(|| mask.logical_not()),
            visible: (dense && width == 1).then(|| start_t.view([n]) + 1),
            causal: !dense && starts.iter().all(|&c| c == 0),
            mask,
        })
    }

    /// Writes a layer's new keys/values [n, kv_heads, S, D] into the step's rows and returns
    /// views of the columns its queries may read, [n, kv_heads, width, D].
    pub fn store(
        &mut self,
        layer: usize,
        step: &CacheStep,
        k: &Tensor,
        v: &Tensor,
    ) -> (Tensor, Tensor) {
        let (n, s) = (k.size()[0], k.size()[2]);
        for (cache, new) in [(&mut self.keys[layer], k), (&mut self.values[layer], v)] {
            let mut rows = cache.narrow(0, step.first_row, n);
            match &step.scatter {
                None => {
                    rows.narrow(2, step.start, s).copy_(new);
                }
                Some((row_idx, cols)) => {
                    let _ = rows.index_put_(
                        &[Some(row_idx), None, Some(cols)],
                        &new.transpose(1, 2),
                        false,
                    );
                }
            }
        }
        let view = |t: &Tensor| t.narrow(0, step.first_row, n).narrow(2, 0, step.width);
        (view(&self.keys[layer]), view(&self.values[layer]))
    }

    /// Records the step's real tokens as held (padding columns past them are overwritten later).
    pub fn commit(&mut self, step: &CacheStep) {
        for (j, l) in step.new_lens.iter().enumerate() {
            self.lens[step.first_row as usize + j] += l;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Architecture;
    use crate::tiny::TinySpec;

    fn cfg() -> Config {
        Config::from_json_str(&TinySpec::tiny(Architecture::Qwen2).config_json().to_string())
            .unwrap()
    }

    fn bools(t: &Tensor) -> Vec<bool> {
        Vec::<bool>::try_from(t.flatten(0, -1)).unwrap()
    }

    #[test]
    fn prefill_mask_is_causal_within_each_row() {
        let mut c = KvCache::new(&cfg(), 0, 0, Kind::Float, Device::Cpu);
        c.push_rows(2).unwrap();
        let step = c.begin(0, &[3, 1], 3).unwrap();
        // A step of few queries on the CPU reads every allocated column (64: one aligned block).
        assert_eq!(step.mask.size(), vec![2, 1, 3, 64]);
        #[rustfmt::skip]
        let want = vec![
            true, false, false,  true, true, false,  true, true, true,
            true, false, false,  true, true, false,  true, true, true, // row 1's padding queries are ignored
        ];
        assert_eq!(bools(&step.mask.narrow(3, 0, 3)), want);
        assert!(
            bools(&step.mask.narrow(3, 3, 61)).iter().all(|&m| !m),
            "columns past the step are never seen"
        );
        assert_eq!(bools(step.dense.as_ref().unwrap()), bools(&step.mask.logical_not()));
        assert_eq!(
            Vec::<i64>::try_from(step.positions.flatten(0, -1)).unwrap(),
            vec![0, 1, 2, 0, 1, 2]
        );
        c.commit(&step);
        assert_eq!(c.lens(), &[3, 1]);
    }

    #[test]
    fn decode_step_offsets_each_row_by_its_length() {
        let mut c = KvCache::new(&cfg(), 0, 0, Kind::Float, Device::Cpu);
        c.push_rows(2).unwrap();
        let s = c.begin(0, &[3, 1], 3).unwrap();
        c.commit(&s);
        let step = c.begin(0, &[1, 1], 1).unwrap();
        assert_eq!(Vec::<i64>::try_from(step.positions.flatten(0, -1)).unwrap(), vec![3, 1]);
        assert_eq!(step.mask.size(), vec![2, 1, 1, 64]);
        assert_eq!(
            bools(&step.mask.narrow(3, 0, 4)),
            vec![true, true, true, true, true, true, false, false]
        );
        assert!(bools(&step.mask.narrow(3, 4, 60)).iter().all(|&m| !m));
        assert!(step.scatter.is_some(), "rows at different columns scatter");
    }

    #[test]
    fn a_step_of_many_queries_reads_only_the_columns_it_needs() {
        let mut c = KvCache::new(&cfg(), 0, 0, Kind::Float, Device::Cpu);
        c.push_rows(2).unwrap();
        let n = DENSE_MAX_QUERIES + 1;
        let step = c.begin(0, &[n, 2], n).unwrap();
        assert!(step.dense.is_none(), "a prefill of {n} tokens runs the flash kernel");
        assert_eq!(step.mask.size(), vec![2, 1, n, n]);
        assert!(c.col_cap >= n);
        assert!(step.causal, "fresh right-padded rows need no mask");
        c.commit(&step);
        let more = c.begin(0, &[n, n], n).unwrap();
        assert!(!more.causal, "rows that hold tokens already are read through the mask");
    }

    #[test]
    fn store_writes_each_row_at_its_own_column() {
        let cfg = cfg();
        let (kv, d) = (cfg.num_key_value_heads, cfg.head_dim);
        let mut c = KvCache::new(&cfg, 0, 0, Kind::Float, Device::Cpu);
        c.push_rows(2).unwrap();
        let s = c.begin(0, &[2, 1], 2).unwrap();
        let k = Tensor::ones([2, kv, 2, d], (Kind::Float, Device::Cpu));
        let _ = c.store(0, &s, &k, &k);
        c.commit(&s);
        let step = c.begin(0, &[1, 1], 1).unwrap();
        let k = Tensor::from_slice(&[5.0f32, 7.0])
            .view([2, 1, 1, 1])
            .expand([2, kv, 1, d], false)
            .contiguous();
        let (keys, _) = c.store(0, &step, &k, &k);
        assert_eq!(keys.size(), vec![2, kv, 64, d]);
        assert!(keys.is_contiguous(), "a decode step's keys are one block");
        let col = |r: i64, j: i64| keys.get(r).get(0).get(j).get(0).double_value(&[]);
        assert_eq!((col(0, 0), col(0, 1), col(0, 2)), (1.0, 1.0, 5.0));
        assert_eq!((col(1, 0), col(1, 1)), (1.0, 7.0));
    }

    #[test]
    fn swap_remove_moves_only_the_last_row() {
        let cfg = cfg();
        let (kv, d) = (cfg.num_key_value_heads, cfg.head_dim);
        let mut c = KvCache::new(&cfg, 0, 0, Kind::Float, Device::Cpu);
        c.push_rows(3).unwrap();
        let s = c.begin(0, &[1, 2, 3], 3).unwrap();
        let k = Tensor::from_slice(&[1.0f32, 2.0, 3.0])
            .view([3, 1, 1, 1])
            .expand([3, kv, 3, d], false)
            .contiguous();
        let _ = c.store(0, &s, &k, &k);
        c.commit(&s);
        c.swap_remove(0);
        assert_eq!(c.lens(), &[3, 2]);
        let step = c.begin(0, &[1, 1], 1).unwrap();
        let (keys, _) = c.store(
            0,
            &step,
            &k.narrow(0, 0, 2).narrow(2, 0, 1),
            &k.narrow(0, 0, 2).narrow(2, 0, 1),
        );
        assert_eq!(
            keys.get(0).get(0).get(2).get(0).double_value(&[]),
            3.0,
            "row 2 moved into row 0"
        );
        assert_eq!(keys.get(1).get(0).get(1).get(0).double_value(&[]), 2.0, "row 1 untouched");
    }

    #[test]
    fn a_rows_first_columns_are_copied_into_a_new_row() {
        let cfg = cfg();
        let (kv, d) = (cfg.num_key_value_heads, cfg.head_dim);
        let mut c = KvCache::new(&cfg, 0, 0, Kind::Float, Device::Cpu);
        c.push_rows(2).unwrap();
        let s = c.begin(0, &[3, 2], 3).unwrap();
        // Row r, column j holds 10 r + j.
        let k = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 10.0, 11.0, 12.0])
            .view([2, 1, 3, 1])
            .expand([2, kv, 3, d], false)
            .contiguous();
        for layer in 0..cfg.num_hidden_layers as usize {
            let _ = c.store(layer, &s, &k, &k);
        }
        c.commit(&s);
        assert_eq!(c.push_prefix_of(0, 2).unwrap(), 2);
        assert_eq!(c.push_prefix_of(1, 2).unwrap(), 3);
        assert_eq!(c.lens(), &[3, 2, 2, 2]);
        let last = cfg.num_hidden_layers as usize - 1;
        for t in [&c.keys[0], &c.values[last]] {
            let col = |r: i64| -> Vec<f32> {
                Vec::try_from(t.get(r).get(0).narrow(0, 0, 2).select(1, 0)).unwrap()
            };
            assert_eq!(col(2), vec![0.0, 1.0], "row 0's first two columns");
            assert_eq!(col(3), vec![10.0, 11.0], "row 1's two columns");
        }
        assert!(c.push_prefix_of(4, 1).unwrap_err().to_string().contains("no row 4"));
        assert!(c.push_prefix_of(1, 3).unwrap_err().to_string().contains("holds 2 tokens"));
        assert_eq!(c.lens(), &[3, 2, 2, 2], "a refused copy adds no row");
        c.truncate_rows(1);
        assert_eq!(c.lens(), &[3]);
    }

    #[test]
    fn growth_keeps_tokens_and_respects_the_limit() {
        let cfg = cfg();
        let (kv, d) = (cfg.num_key_value_heads, cfg.head_dim);
        let mut c = KvCache::new(&cfg, 1, 16, Kind::Float, Device::Cpu);
        c.set_limit(Some(3 * 32));
        c.push_rows(1).unwrap();
        let s = c.begin(0, &[4], 4).unwrap();
        let k = Tensor::full([1, kv, 4, d], 9.0, (Kind::Float, Device::Cpu));
        let _ = c.store(0, &s, &k, &k);
        c.commit(&s);
        c.reserve(3, 20).unwrap();
        assert!(c.capacity_slots() <= 3 * 32, "{} slots", c.capacity_slots());
        assert_eq!(c.keys[0].get(0).get(0).get(3).get(0).double_value(&[]), 9.0);
        assert!(c.begin(0, &[0], 1).is_err(), "a row needs at least one new token");
        assert!(c.begin(1, &[1], 1).is_err(), "row 1 does not exist");
    }

    #[test]
    fn columns_grow_to_the_need_and_shrink_once_the_slack_is_large() {
        let cfg = cfg();
        let (kv, d) = (cfg.num_key_value_heads, cfg.head_dim);
        let mut c = KvCache::new(&cfg, 0, 0, Kind::Float, Device::Cpu);
        c.push_rows(2).unwrap();
        c.reserve(2, 300).unwrap();
        assert_eq!(c.col_cap, 320, "no doubling: the need, aligned");
        c.reserve(2, 330).unwrap();
        assert_eq!(c.col_cap, 384);
        let s = c.begin(0, &[3, 2], 3).unwrap();
        let k = Tensor::from_slice(&[4.0f32, 6.0])
            .view([2, 1, 1, 1])
            .expand([2, kv, 3, d], false)
            .contiguous();
        let _ = c.store(0, &s, &k, &k);
        c.commit(&s);
        assert!(!c.fit_columns(200).unwrap(), "a slack of 128 columns is kept");
        assert_eq!(c.col_cap, 384);
        assert!(c.fit_columns(40).unwrap());
        assert_eq!(c.col_cap, 64);
        assert_eq!(c.lens(), &[3, 2]);
        let col =
            |c: &KvCache, r: i64, j: i64| c.keys[0].get(r).get(0).get(j).get(0).double_value(&[]);
        assert_eq!((col(&c, 0, 2), col(&c, 1, 1)), (4.0, 6.0), "the tokens held survive the move");
        c.reserve(2, 400).unwrap();
        assert!(c.fit_columns(1).unwrap());
        assert_eq!(c.col_cap, 64, "never below the longest row (3 tokens), aligned");
        assert_eq!(col(&c, 0, 2), 4.0);
    }

    #[test]
    fn a_cache_that_memory_cannot_hold_is_an_error_and_the_cache_stays() {
        let cfg = cfg();
        let mut c = KvCache::new(&cfg, 0, 0, Kind::Float, Device::Cpu);
        c.push_rows(1).unwrap();
        let before = (c.capacity_slots(), c.rows());
        // Terabytes: refused by the allocator, not by a check of ours.
        let err = c.reserve(1 << 20, 1 << 20).unwrap_err().to_string();
        assert!(
            err.contains("could not be allocated") && err.contains("--max-batch-tokens"),
            "{err}"
        );
        assert_eq!((c.capacity_slots(), c.rows()), before);
        assert!(c.begin(0, &[2], 2).is_ok(), "the cache still works");
    }
}
