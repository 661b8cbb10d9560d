//! GGUF files for comas: a memory-mapped reader, dequantisation of the common ggml types, and
//! the import of `llama`, `qwen2` and `qwen3` models into a Hugging Face folder that
//! `comas-model` loads. No libtorch here: everything is plain Rust.
pub mod arch;
pub mod cache;
pub mod error;
pub mod import;
pub mod quant;
pub mod reader;
pub mod vocab;

pub use error::{GgufError, Result};
pub use import::{import, ImportOptions, ImportReport, OutDtype};
pub use quant::GgmlType;
pub use reader::{GgufFile, TensorInfo, Value};
