//! Imports of small GGUF files written the way llama.cpp's converter writes them
//! (`tests/fixtures/gen_gguf.py`), compared with the Hugging Face originals they came from:
//! every tensor, the configuration, and token ids on a varied corpus.
use comas_gguf::{import, ImportOptions, OutDtype};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf")
}

fn opts() -> ImportOptions {
    ImportOptions { dtype: OutDtype::F32, force: false }
}

fn f32s(t: &safetensors::tensor::TensorView<'_>) -> Vec<f32> {
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Imports fixture `name` and checks it against its original; returns the largest tensor difference.
fn check_fixture(name: &str) -> f32 {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("model");
    let report = import(&fixtures().join(format!("{name}.gguf")), &out, &opts()).unwrap();
    let hf = fixtures().join(format!("{name}.hf"));

    let want_bytes = std::fs::read(hf.join("model.safetensors")).unwrap();
    let want = safetensors::SafeTensors::deserialize(&want_bytes).unwrap();
    let got_bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let got = safetensors::SafeTensors::deserialize(&got_bytes).unwrap();
    let want_cfg = read_json(&hf.join("config.json"));
    let tied = want_cfg["tie_word_embeddings"].as_bool().unwrap_or(false);
    let mut want_names: Vec<String> =
        want.names().into_iter().cloned().filter(|n| !(tied && n == "lm_head.weight")).collect();
    let mut got_names: Vec<String> = got.names().into_iter().cloned().collect();
    want_names.sort();
    got_names.sort();
    assert_eq!(got_names, want_names, "{name}: tensor names");
    assert_eq!(report.tensors, got_names.len());
    let mut worst = 0.0f32;
    for n in &want_names {
        let (w, g) = (want.tensor(n).unwrap(), got.tensor(n).unwrap());
        assert_eq!(g.shape(), w.shape(), "{name}: {n}");
        let diff = f32s(&w).iter().zip(f32s(&g)).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        worst = worst.max(diff);
    }

    let cfg = read_json(&out.join("config.json"));
    for key in [
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "tie_word_embeddings",
    ] {
        assert_eq!(cfg[key], want_cfg[key], "{name}: config.json `{key}`");
    }
    // transformers 5 keeps rope_theta under rope_parameters.
    let theta =
        want_cfg["rope_theta"].as_f64().or(want_cfg["rope_parameters"]["rope_theta"].as_f64());
    for (key, want) in [("rope_theta", theta), ("rms_norm_eps", want_cfg["rms_norm_eps"].as_f64())]
    {
        let (a, b) = (cfg[key].as_f64().unwrap(), want.unwrap());
        assert!((a - b).abs() <= 1e-9 * b.abs(), "{name}: config.json `{key}` {a} != {b}");
    }
    let head_dim = want_cfg["head_dim"].as_u64().unwrap_or(
        want_cfg["hidden_size"].as_u64().unwrap()
            / want_cfg["num_attention_heads"].as_u64().unwrap(),
    );
    assert_eq!(cfg["head_dim"].as_u64(), Some(head_dim), "{name}: head_dim");

    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let cases = read_json(&fixtures().join(format!("{name}.tokens.json")));
    let corpus = cases["corpus"].as_array().unwrap();
    assert!(corpus.len() >= 10);
    for (text, ids) in corpus.iter().zip(cases["ids"].as_array().unwrap()) {
        let text = text.as_str().unwrap();
        let want: Vec<u32> =
            ids.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let got = tok.encode(text, false).unwrap();
        assert_eq!(got.get_ids(), &want[..], "{name}: token ids of {text:?}");
        // Byte-level BPE decodes back to the text (Qwen's to its NFC form, which encodes alike).
        let back = tok.decode(got.get_ids(), false).unwrap();
        if name.starts_with("qwen") {
            assert_eq!(
                tok.encode(back.as_str(), false).unwrap().get_ids(),
                &want[..],
                "{name}: decode of {text:?}"
            );
        } else {
            assert_eq!(back, text, "{name}: decode");
        }
    }
    let tc = read_json(&out.join("tokenizer_config.json"));
    assert!(
        tc["chat_template"].as_str().unwrap().contains("<|im_start|>"),
        "{name}: chat template carried over"
    );
    worst
}

#[test]
fn llama_with_tied_embeddings_and_permuted_qk_round_trips_exactly() {
    assert_eq!(check_fixture("llama"), 0.0);
}

#[test]
fn qwen2_with_biases_round_trips_exactly() {
    assert_eq!(check_fixture("qwen2"), 0.0);
}

#[test]
fn qwen3_with_qk_norm_and_explicit_head_dim_round_trips_exactly() {
    assert_eq!(check_fixture("qwen3"), 0.0);
}

#[test]
fn q8_0_matrices_and_the_smollm_pre_tokenizer() {
    // The reference holds the dequantised values, so a correct import is exact here too.
    assert!(check_fixture("smollm") <= 1e-6);
}

#[test]
fn bf16_output_is_the_rounded_f32() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let src = fixtures().join("qwen2.gguf");
    import(&src, &a, &opts()).unwrap();
    import(&src, &b, &ImportOptions { dtype: OutDtype::BF16, force: false }).unwrap();
    let (fa, fb) = (
        std::fs::read(a.join("model.safetensors")).unwrap(),
        std::fs::read(b.join("model.safetensors")).unwrap(),
    );
    let (ta, tb) = (
        safetensors::SafeTensors::deserialize(&fa).unwrap(),
        safetensors::SafeTensors::deserialize(&fb).unwrap(),
    );
    let (x, y) = (
        ta.tensor("model.embed_tokens.weight").unwrap(),
        tb.tensor("model.embed_tokens.weight").unwrap(),
    );
    assert_eq!(y.dtype(), safetensors::Dtype::BF16);
    let rounded: Vec<u8> =
        f32s(&x).iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
    assert_eq!(y.data(), &rounded[..]);
    assert_eq!(read_json(&b.join("config.json"))["torch_dtype"], "bfloat16");
}

#[test]
fn output_folder_rules() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixtures().join("llama.gguf");
    let out = dir.path().join("m");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "x").unwrap();
    let err = import(&src, &out, &opts()).unwrap_err().to_string();
    assert!(err.contains("is not empty; pass --force"), "{err}");
    assert!(out.join("keep.txt").exists(), "a refused import touches nothing");
    import(&src, &out, &ImportOptions { dtype: OutDtype::F32, force: true }).unwrap();
    assert!(
        !out.join("keep.txt").exists() && out.join("model.safetensors").exists(),
        "--force replaces the folder"
    );
    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    assert!(import(&src, &file, &opts()).unwrap_err().to_string().contains("not a folder"));
    // Nothing temporary is left beside the output.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with(".import-gguf")), "{names:?}");
}

#[test]
fn a_corrupt_tensor_table_leaves_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(fixtures().join("qwen2.gguf")).unwrap();
    bytes.truncate(bytes.len() - 100);
    let src = dir.path().join("cut.gguf");
    std::fs::write(&src, &bytes).unwrap();
    let out = dir.path().join("m");
    let err = import(&src, &out, &opts()).unwrap_err().to_string();
    assert!(err.contains("run past the end") && err.contains("truncated"), "{err}");
    assert!(!out.exists());
}
