//! What the model crate's benches share: their knobs and the model they run.
#![allow(dead_code)] // each bench uses its part

use comas_model::tiny::{write_model, TinySpec};
use std::path::PathBuf;

/// The value of environment variable `key`, or `default` when it is unset or does not parse.
pub fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Any model folder (COMAS_BENCH_MODEL, e.g. the SmolLM2 import), else the random 40M
/// Qwen2-shaped model, written once under the target folder.
pub fn model_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("COMAS_BENCH_MODEL") {
        return PathBuf::from(dir);
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-qwen2-40m");
    if !dir.join("model.safetensors").is_file() {
        write_model(&dir, &TinySpec::bench()).expect("write bench model");
    }
    dir
}
