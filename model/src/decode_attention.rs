//! Attention of one new token per row over its own row of the KV cache, f32 or bf16 on CPU
//! (`csrc/decode_attention.cpp`; bf16 is computed in f32 and rounded once at the end).
//!
//! SDPA on a decode step runs a small matrix product per row and query head and reads every
//! column the cache holds through a mask. This kernel does the query heads that share a
//! key/value head together, so each key and value is read once per group, and a row reads only
//! the columns it may see. A row's result depends on nothing but its own query, keys and values
//! and how many columns it sees: not on the other rows, the cache's capacity or the threads.
use crate::error::Result;
use crate::shim::wrap;
use std::ffi::c_char;
use tch::{Kind, Tensor};
use torch_sys::C_tensor;

extern "C" {
    fn comas_decode_attention_available() -> bool;
    fn comas_decode_attention_head_width(d: i64) -> bool;
    fn comas_decode_attention(
        q: *const C_tensor,
        k: *const C_tensor,
        v: *const C_tensor,
        visible: *const C_tensor,
        scale: f64,
        error: *mut *mut c_char,
    ) -> *mut C_tensor;
}

/// Whether this CPU has the kernel (AVX-512F).
pub fn available() -> bool {
    // SAFETY: reads CPU feature flags only.
    unsafe { comas_decode_attention_available() }
}

/// Whether a decode step's attention can run on the kernel: f32 or bf16 on an AVX-512F CPU, one query
/// per row and a head width it is compiled for (16, 32, 48, 64, 80, 96, 128 or 256 floats).
pub fn applies(q: &Tensor) -> bool {
    let size = q.size();
    matches!(q.kind(), Kind::Float | Kind::BFloat16)
        && q.device() == tch::Device::Cpu
        && size.len() == 4
        && size[2] == 1
        && available()
        // SAFETY: a pure function of its argument.
        && unsafe { comas_decode_attention_head_width(size[3]) }
}

/// `q` [B, H, 1, D] over `k`, `v` [B, KV, C, D], row b seeing its first `visible[b]` columns
/// (int64 [B], each 1..=C): [B, H, 1, D], as SDPA with the matching mask gives.
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, visible: &Tensor, scale: f64) -> Result<Tensor> {
    let mut error = std::ptr::null_mut();
    // SAFETY: every handle is a live tensor for the whole call; the shim keeps none of them.
    let ptr = unsafe {
        comas_decode_attention(
            q.as_ptr(),
            k.as_ptr(),
            v.as_ptr(),
            visible.as_ptr(),
            scale,
            &mut error,
        )
    };
    wrap(ptr, error, "decode attention")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    const CPU: (Kind, Device) = (Kind::Float, Device::Cpu);

    fn draw(b: i64, h: i64, kv: i64, cols: i64, d: i64) -> (Tensor, Tensor, Tensor) {
        crate::seeded::with_torch_seed(11, || {
            (
                Tensor::randn([b, h, 1, d], CPU),
                Tensor::randn([b, kv, cols, d], CPU),
                Tensor::randn([b, kv, cols, d], CPU),
            )
        })
    }

    /// SDPA with the mask a decode step builds (column j visible where j < visible[b]).
    fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, visible: &[i64], scale: f64) -> Tensor {
        let (b, cols) = (k.size()[0], k.size()[2]);
        let seen = Tensor::from_slice(visible).view([b, 1, 1, 1]);
        let mask =
            Tensor::arange(cols, (Kind::Int64, Device::Cpu)).view([1, 1, 1, cols]).lt_tensor(&seen);
        let gqa = q.size()[1] != k.size()[1];
        Tensor::scaled_dot_product_attention(q, k, v, Some(&mask), 0.0, false, scale, gqa)
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        f64::try_from((a - b).abs().max()).unwrap()
    }

    fn skip() -> bool {
        if !available() {
            eprintln!("no AVX-512F on this CPU: the decode attention kernel is not used here");
        }
        !available()
    }

    #[test]
    fn it_matches_sdpa_for_every_group_width_and_visible_count() {
        if skip() {
            return;
        }
        // Groups of 1 (MHA), 3 (SmolLM2), 7 and 20 query heads per key/value head; widths of
        // one to eight vectors (7 heads of 128 take three passes over the values, 3 at a time);
        // visible counts at and around the 16-column blocks, down to a single column.
        for (h, kv, d) in
            [(4, 4, 64), (9, 3, 64), (14, 2, 128), (20, 1, 16), (6, 3, 32), (10, 5, 80)]
        {
            let visible = [1, 15, 16, 17, 63, 64, 100, 200];
            let (q, k, v) = draw(visible.len() as i64, h, kv, 200, d);
            let seen = Tensor::from_slice(&visible);
            let scale = (d as f64).powf(-0.5);
            let got = attend(&q, &k, &v, &seen, scale).unwrap();
            assert_eq!(got.size(), vec![visible.len() as i64, h, 1, d]);
            let diff = max_diff(&got, &sdpa(&q, &k, &v, &visible, scale));
            assert!(diff < 2e-6, "h {h} kv {kv} d {d}: max difference {diff}");
        }
    }

    #[test]
    fn bf16_matches_sdpa_on_the_widened_values_within_a_rounding() {
        if skip() {
            return;
        }
        let bf = Kind::BFloat16;
        for (h, kv, d) in [(9, 3, 64), (14, 2, 128), (4, 4, 64)] {
            let visible = [1, 16, 17, 100, 200];
            let (q, k, v) = draw(visible.len() as i64, h, kv, 200, d);
            let (q, k, v) = (q.to_kind(bf), k.to_kind(bf), v.to_kind(bf));
            let seen = Tensor::from_slice(&visible);
            let scale = (d as f64).powf(-0.5);
            let got = attend(&q, &k, &v, &seen, scale).unwrap();
            assert_eq!(got.kind(), bf);
            // The f32 attention of the same bf16 values, rounded once: at most a bf16 step
            // (values here are below 4, so 2^-6).
            let f = |t: &Tensor| t.to_kind(Kind::Float);
            let want = sdpa(&f(&q), &f(&k), &f(&v), &visible, scale);
            let diff = max_diff(&f(&got), &want);
            assert!(diff <= 1.0 / 64.0, "h {h} kv {kv} d {d}: max difference {diff}");
            // A row alone gives the same bits as in the batch.
            let alone = attend(
                &q.narrow(0, 3, 1),
                &k.narrow(0, 3, 1),
                &v.narrow(0, 3, 1),
                &seen.narrow(0, 3, 1),
                scale,
            )
            .unwrap();
            assert!(alone.equal(&got.narrow(0, 3, 1)));
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_in_any_batch_and_any_cache_width() {
        if skip() {
            return;
        }
        let (q, k, v) = draw(64, 9, 3, 256, 64);
        let visible: Vec<i64> = (0..64).map(|r| 1 + (r * 37) % 256).collect();
        let all = attend(&q, &k, &v, &Tensor::from_slice(&visible), 0.125).unwrap();
        for (start, len) in [(0, 1), (37, 1), (5, 3), (10, 7), (63, 1), (1, 63)] {
            let rows = |t: &Tensor| t.narrow(0, start, len);
            let seen = Tensor::from_slice(&visible[start as usize..(start + len) as usize]);
            let part = attend(&rows(&q), &rows(&k), &rows(&v), &seen, 0.125).unwrap();
            assert!(
                part.equal(&rows(&all)),
                "rows {start}..{} differ from the 64-row call",
                start + len
            );
            // The same rows in a cache of fewer columns (all they see) give the same bits.
            let widest = *visible[start as usize..(start + len) as usize].iter().max().unwrap();
            let narrow = |t: &Tensor| rows(t).narrow(2, 0, widest);
            let tight = attend(&rows(&q), &narrow(&k), &narrow(&v), &seen, 0.125).unwrap();
            assert!(
                tight.equal(&part),
                "rows {start}..{}: a narrower cache changed the bits",
                start + len
            );
        }
        // Columns past a row's visible count play no part: a NaN in column 100 reaches only
        // the rows that see it.
        let poisoned = k.copy();
        let _ = poisoned.narrow(2, 100, 1).fill_(f64::NAN);
        let again = attend(&q, &poisoned, &v, &Tensor::from_slice(&visible), 0.125).unwrap();
        for (r, &n) in visible.iter().enumerate() {
            let same = again.get(r as i64).equal(&all.get(r as i64));
            assert_eq!(same, n <= 100, "row {r} sees {n} columns");
        }
        assert!(visible.iter().any(|&n| n > 100) && visible.iter().any(|&n| n <= 100));
    }

    #[test]
    fn a_bad_input_is_an_error_not_a_crash() {
        if skip() {
            return;
        }
        let (q, k, v) = draw(2, 9, 3, 8, 64);
        let err = |q: &Tensor, k: &Tensor, v: &Tensor, seen: &[i64]| {
            attend(q, k, v, &Tensor::from_slice(seen), 1.0).unwrap_err().to_string()
        };
        assert!(err(&q, &k, &v, &[0, 3]).contains("row 0 sees 0 columns; the cache holds 8"));
        assert!(err(&q, &k, &v, &[3, 9]).contains("row 1 sees 9 columns"));
        assert!(err(&q, &k, &v, &[3]).contains("visible must be int64 [2]"));
        let (q2, k2, v2) = draw(2, 8, 3, 8, 64);
        assert!(err(&q2, &k2, &v2, &[1, 1]).contains("8 query heads cannot share 3"));
        let (q3, k3, v3) = draw(2, 9, 3, 8, 24);
        assert!(!applies(&q3));
        assert!(err(&q3, &k3, &v3, &[1, 1]).contains("no decode attention kernel for heads of 24"));
        assert!(err(&q.to_kind(Kind::BFloat16), &k, &v, &[1, 1]).contains("all float32 or all"));
        assert!(err(&q, &k, &v.narrow(2, 0, 7), &[1, 1]).contains("differ"));
    }
}
