//! Batched generation with a KV cache: left-padded prefill, then one token per row per step.
//! Rows that finish leave the batch at once.
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::lora::{LoraAdapter, LoraBatch};
use crate::mask;
use crate::sampling::{self, SamplingParams};
use crate::tokenizer::Tokenizer;
use crate::transformer::CausalLm;
use serde::Serialize;
use tch::Tensor;

pub struct GenerationRequest<'a> {
    pub prompt_ids: Vec<i64>,
    pub params: SamplingParams,
    pub adapter: Option<&'a LoraAdapter>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop token or stop string ended the completion.
    Stop,
    /// max_new_tokens was reached.
    Length,
}

#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    pub token_ids: Vec<i64>,
    pub logprobs: Vec<f32>,
    pub sampling_logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
    /// The stop string that ended the completion, if one did.
    pub stop_string: Option<String>,
}

/// Token window decoded to look for stop strings: enough tokens to cover the longest stop
/// string (each token decodes to at least one byte) plus a few for split characters.
fn stop_window(stops: &[String]) -> usize {
    stops.iter().map(String::len).max().unwrap_or(0) + 4
}

fn find_stop_string(tok: &Tokenizer, ids: &[i64], stops: &[String]) -> Result<Option<String>> {
    let start = ids.len().saturating_sub(stop_window(stops));
    let text = tok.decode(&ids[start..], false)?;
    Ok(stops.iter().find(|s| text.contains(s.as_str())).cloned())
}

/// Generates completions for all requests in one batch and returns them in request order.
pub fn generate(model: &CausalLm, requests: &[GenerationRequest], tokenizer: Option<&Tokenizer>) -> Result<Vec<Completion>> {
    let vocab = model.config().vocab_size;
    for (i, r) in requests.iter().enumerate() {
        r.params.validate()?;
        if r.prompt_ids.is_empty() {
            return Err(ModelError::Input(format!("request {i}: empty prompt")));
        }
        if let Some(bad) = r.prompt_ids.iter().find(|&&t| t < 0 || t >= vocab) {
            return Err(ModelError::Input(format!("request {i}: token id {bad} outside the vocabulary (size {vocab})")));
        }
        if !r.params.stop_strings.is_empty() && tokenizer.is_none() {
            return Err(ModelError::Input(format!("request {i}: stop strings need a tokenizer")));
        }
    }
    let _guard = tch::no_grad_guard();
    let mut out: Vec<Completion> = requests
        .iter()
        .map(|_| Completion {
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            sampling_logprobs: Vec::new(),
            finish_reason: FinishReason::Length,
            stop_string: None,
        })
        .collect();
    // rows[b] = request index of batch row b
    let mut rows: Vec<usize> = (0..requests.len()).filter(|&i| requests[i].params.max_new_tokens > 0).collect();
    if rows.is_empty() {
        return Ok(out);
    }
    let device = model.device();
    let prompts: Vec<Vec<i64>> = rows.iter().map(|&i| requests[i].prompt_ids.clone()).collect();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let most_new = rows.iter().map(|&i| requests[i].params.max_new_tokens).max().unwrap_or(0);
    let mut cache = KvCache::new(model.config(), rows.len() as i64, (longest + most_new) as i64, model.kind(), device);
    let mut rngs: Vec<_> = rows.iter().map(|&i| requests[i].params.rng()).collect();
    let lora_for = |rows: &[usize]| {
        let per_row: Vec<Option<&LoraAdapter>> = rows.iter().map(|&i| requests[i].adapter).collect();
        per_row.iter().any(Option::is_some).then(|| LoraBatch::per_row(&per_row, device))
    };
    let (ids, valid) = mask::left_pad(&prompts, 0, device);
    let mut lora = lora_for(&rows);
    let mut logits = model.forward_cached(&ids, Some(&valid), &mut cache, lora.as_ref())?;
    loop {
        let params: Vec<&SamplingParams> = rows.iter().map(|&i| &requests[i].params).collect();
        let suppress: Vec<&[i64]> = rows
            .iter()
            .map(|&i| {
                let p = &requests[i].params;
                if out[i].token_ids.len() < p.min_new_tokens { p.stop_token_ids.as_slice() } else { &[] }
            })
            .collect();
        let picked = sampling::sample(&logits, &params, &mut rngs, &suppress);
        let mut keep = Vec::with_capacity(rows.len());
        for (b, (&i, s)) in rows.iter().zip(&picked).enumerate() {
            let p = &requests[i].params;
            let c = &mut out[i];
            c.token_ids.push(s.token);
            c.logprobs.push(s.logprob);
            c.sampling_logprobs.push(s.sampling_logprob);
            let n = c.token_ids.len();
            let mut done = false;
            if n >= p.min_new_tokens {
                if p.stop_token_ids.contains(&s.token) {
                    done = true;
                } else if let (false, Some(tok)) = (p.stop_strings.is_empty(), tokenizer) {
                    if let Some(stop) = find_stop_string(tok, &c.token_ids, &p.stop_strings)? {
                        c.stop_string = Some(stop);
                        done = true;
                    }
                }
            }
            if done {
                c.finish_reason = FinishReason::Stop;
            } else if n >= p.max_new_tokens {
                c.finish_reason = FinishReason::Length;
            } else {
                keep.push(b);
            }
        }
        if keep.is_empty() {
            break;
        }
        let next: Vec<i64> = keep.iter().map(|&b| picked[b].token).collect();
        if keep.len() != rows.len() {
            let keep_i64: Vec<i64> = keep.iter().map(|&b| b as i64).collect();
            cache.retain_rows(&keep_i64);
            rows = keep.iter().map(|&b| rows[b]).collect();
            rngs = keep.iter().map(|&b| rngs[b].clone()).collect();
            lora = lora_for(&rows);
        }
        let input = Tensor::from_slice(&next).view([next.len() as i64, 1]).to_device(device);
        logits = model.forward_cached(&input, None, &mut cache, lora.as_ref())?;
    }
    Ok(out)
}
