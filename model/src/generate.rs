//! Batched generation: every request admitted to a continuous batcher at once.
use crate::batcher::{drain, Batcher};
pub use crate::batcher::{Completion, FinishReason};
use crate::error::Result;
use crate::lora::LoraAdapter;
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;
use crate::transformer::CausalLm;

pub struct GenerationRequest<'a> {
    pub prompt_ids: Vec<i64>,
    pub params: SamplingParams,
    pub adapter: Option<&'a LoraAdapter>,
}

/// Generates completions for all requests in one batch and returns them in request order.
pub fn generate(
    model: &CausalLm,
    requests: &[GenerationRequest],
    tokenizer: Option<&Tokenizer>,
) -> Result<Vec<Completion>> {
    let mut batcher = Batcher::new(model, tokenizer);
    for (i, r) in requests.iter().enumerate() {
        batcher.add(i as u64, r.prompt_ids.clone(), r.params.clone(), r.adapter)?;
    }
    let mut out: Vec<Option<Completion>> = vec![None; requests.len()];
    for (id, c) in drain(&mut batcher)? {
        out[id as usize] = Some(c);
    }
    Ok(out.into_iter().map(|c| c.expect("every admitted sequence finishes")).collect())
}
