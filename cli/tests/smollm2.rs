//! SmolLM2-135M-Instruct imported with `comas import-gguf` from the cached PyPI GGUF, then
//! decoded greedily by `comas generate`: the same prompt ids and the same 32 new ids as
//! transformers' greedy `generate` on its own GGUF load (tests/fixtures/smollm2/reference.json).
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn comas(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_comas"))
        .args(args)
        .env("COMAS_THREADS", "2")
        .output()
        .expect("comas runs")
}

#[test]
fn imported_smollm2_decodes_like_transformers() {
    let gguf = comas_gguf::cache::require_smollm2_gguf().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("smollm2");
    let (gguf, model_s) = (gguf.to_str().unwrap(), model.to_str().unwrap());
    let out = comas(&["import-gguf", gguf, "--out", model_s, "--dtype", "f32"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A second import into the same folder needs --force.
    let again = comas(&["import-gguf", gguf, "--out", model_s]);
    assert!(
        !again.status.success() && String::from_utf8_lossy(&again.stderr).contains("pass --force")
    );

    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/fixtures/smollm2/reference.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let cases = reference["generate"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let out = comas(&[
            "generate",
            "--model",
            model_s,
            "--chat",
            prompt,
            "--greedy",
            "--ignore-eos",
            "--max-new-tokens",
            "32",
            "--json",
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let got: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(got["prompt_ids"], case["prompt_ids"], "prompt ids of {prompt:?}");
        assert_eq!(got["generated_ids"], case["new_ids"], "greedy ids of {prompt:?}");
    }
}
