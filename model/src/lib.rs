//! Model core of comas: decoder-only transformers in tch (Qwen2/Qwen2.5, Qwen3, Llama 3.x),
//! loaded from Hugging Face folders, with an external KV cache, batched sampling, log-prob
//! scoring and per-request LoRA adapters.
mod attention;
pub mod batcher;
pub mod config;
pub mod decode_attention;
pub mod decode_linear;
pub mod dtype;
pub mod error;
pub mod foreach;
pub mod generate;
pub mod guide;
pub mod kv_cache;
mod layers;
pub mod lora;
pub mod mask;
pub mod memory;
pub mod onednn;
pub mod process;
pub mod rope;
pub mod rows_linear;
pub mod safetensors;
pub mod sampling;
pub mod seeded;
mod shim;
pub mod tiny;
pub mod tokenizer;
pub mod transformer;
pub mod weights;

pub use batcher::{Batcher, Completion, FinishReason};
pub use config::{Architecture, Config};
pub use error::{ModelError, Result};
pub use generate::{generate, GenerationRequest};
pub use kv_cache::KvCache;
pub use lora::{LoraAdapter, LoraBatch, LoraConfig};
pub use sampling::SamplingParams;
pub use tokenizer::{ChatMessage, Tokenizer};
pub use transformer::CausalLm;
