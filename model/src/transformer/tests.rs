use super::*;
use crate::attention::attend_few;

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn a_shared_model_holds_no_copy_and_computes_the_same() {
    let dir = tempfile::tempdir().unwrap();
    crate::tiny::write_model(
        dir.path(),
        &crate::tiny::TinySpec {
            seed: 2,
            ..crate::tiny::TinySpec::tiny(crate::Architecture::Qwen2)
        },
    )
    .unwrap();
    let m = CausalLm::load(dir.path(), Kind::Float, Device::Cpu).unwrap();
    let shared = m.share().unwrap();
    let (a, b) = (m.named_parameters(), shared.named_parameters());
    assert_eq!(a.len(), b.len());
    for ((name, x), (other, y)) in a.iter().zip(&b) {
        assert_eq!((name, x.data_ptr()), (other, y.data_ptr()), "{name} was copied");
    }
    let ids = Tensor::from_slice(&[1i64, 5, 9, 3]).view([1, 4]);
    let h = |m: &CausalLm| m.lm_head(&m.forward_hidden(&ids, None, None).unwrap());
    assert!(h(&m).equal(&h(&shared)));
}

#[test]
fn few_query_attention_equals_sdpa_with_grouped_heads_and_a_mask() {
    let (b, kv, g, d, w) = (3, 2, 3, 8, 11);
    for s in [1, 3] {
        // Drawn under the generator's lock, so concurrent seeded tests keep their draws.
        let (q, k, v) = crate::seeded::with_torch_seed(3 + s, || {
            let opts = (Kind::Float, Device::Cpu);
            (
                Tensor::randn([b, kv * g, s, d], opts),
                Tensor::randn([b, kv, w, d], opts),
                Tensor::randn([b, kv, w, d], opts),
            )
        });
        // Row r holds 5 + 2r tokens before this step's queries; the rest is padding.
        let lens = Tensor::from_slice(&[5i64, 7, 2]).view([b, 1, 1, 1]);
        let cols = Tensor::arange(w, (Kind::Int64, Device::Cpu)).view([1, 1, 1, w]);
        let pos = Tensor::arange(s, (Kind::Int64, Device::Cpu)).view([1, 1, s, 1]);
        let mask = cols.le_tensor(&(lens + pos));
        let want =
            Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&mask), 0.0, false, 0.3, true);
        let got = attend_few(&q, &k, &v, &mask.logical_not(), 0.3, kv);
        assert_eq!(got.size(), want.size());
        assert!(max_diff(&got, &want) < 1e-5, "s = {s}: {}", max_diff(&got, &want));
    }
}

/// Keys, values and a blocking mask for rows holding `lens` tokens in a cache `w` wide,
/// each row's step of `s` queries right after its tokens.
fn decode_inputs(lens: &[i64], s: i64, w: i64, kind: Kind) -> (Tensor, Tensor, Tensor, Tensor) {
    let (b, kv, g, d) = (lens.len() as i64, 2, 3, 64);
    let opts = (Kind::Float, Device::Cpu);
    let (q, k, v) = crate::seeded::with_torch_seed(5 + s, || {
        (
            Tensor::randn([b, kv * g, s, d], opts).to_kind(kind),
            Tensor::randn([b, kv, w, d], opts).to_kind(kind),
            Tensor::randn([b, kv, w, d], opts).to_kind(kind),
        )
    });
    let lens = Tensor::from_slice(lens).view([b, 1, 1, 1]);
    let cols = Tensor::arange(w, (Kind::Int64, Device::Cpu)).view([1, 1, 1, w]);
    let pos = Tensor::arange(s, (Kind::Int64, Device::Cpu)).view([1, 1, s, 1]);
    (q, k, v, cols.gt_tensor(&(lens + pos)))
}

#[test]
fn few_query_attention_of_a_row_does_not_depend_on_its_batch_or_the_cache_width() {
    for kind in [Kind::Float, Kind::BFloat16] {
        for s in [1, 3] {
            // Row 0 holds 700 tokens; the others are shorter and longer, in a cache of 1344 columns.
            let (q, k, v, blocked) = decode_inputs(&[700, 3, 1300, 64, 1], s, 1344, kind);
            let batched = attend_few(&q, &k, &v, &blocked, 0.25, 2).get(0);
            for (w, others) in [(704, 0), (768, 1), (710, 2)] {
                // Row 0 with `others` of the batch's other rows after it, in a narrower cache
                // (710 columns is not whole blocks: padded).
                let rows = Tensor::from_slice(&[0i64, 3, 1][..=others]);
                let narrow = |t: &Tensor| {
                    t.index_select(0, &rows).narrow(t.dim() as i64 - 2, 0, w).contiguous()
                };
                let small = |t: &Tensor| t.index_select(0, &rows).narrow(3, 0, w).contiguous();
                let alone = attend_few(
                    &q.index_select(0, &rows),
                    &narrow(&k),
                    &narrow(&v),
                    &small(&blocked),
                    0.25,
                    2,
                )
                .get(0);
                assert!(
                    alone.equal(&batched),
                    "{kind:?}, s = {s}, width {w}, {others} other rows: {}",
                    max_diff(&alone.to_kind(Kind::Float), &batched.to_kind(Kind::Float))
                );
            }
            let want = Tensor::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                Some(&blocked.logical_not()),
                0.0,
                false,
                0.25,
                true,
            );
            let tol = if kind == Kind::Float { 1e-5 } else { 3e-2 };
            let got = attend_few(&q, &k, &v, &blocked, 0.25, 2);
            assert!(
                max_diff(&got.to_kind(Kind::Float), &want.to_kind(Kind::Float)) < tol,
                "{kind:?} s = {s}"
            );
        }
    }
}
