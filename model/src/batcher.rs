//! Continuous batching: sequences join between decode steps (their prompts prefilled together
//! and merged into the running KV cache) and leave the moment they finish. `generate` is this
//! batcher with every request admitted at once.
use crate::error::{ModelError, Result};
use crate::generate::{Completion, FinishReason};
use crate::kv_cache::KvCache;
use crate::lora::{LoraAdapter, LoraBatch};
use crate::mask;
use crate::sampling::{self, SamplingParams};
use crate::tokenizer::Tokenizer;
use crate::transformer::CausalLm;
use rand_chacha::ChaCha8Rng;
use tch::Tensor;

struct Row<'a> {
    id: u64,
    params: SamplingParams,
    adapter: Option<&'a LoraAdapter>,
    rng: ChaCha8Rng,
    out: Completion,
}

struct Pending<'a> {
    id: u64,
    prompt: Vec<i64>,
    params: SamplingParams,
    adapter: Option<&'a LoraAdapter>,
}

pub struct Batcher<'a> {
    model: &'a CausalLm,
    tokenizer: Option<&'a Tokenizer>,
    rows: Vec<Row<'a>>,
    cache: Option<KvCache>,
    /// Next-token logits of every row, [rows, V].
    logits: Option<Tensor>,
    queue: Vec<Pending<'a>>,
    /// Finished before any decoding (max_new_tokens = 0).
    done_early: Vec<(u64, Completion)>,
}

fn empty_completion() -> Completion {
    Completion { token_ids: Vec::new(), logprobs: Vec::new(), sampling_logprobs: Vec::new(), finish_reason: FinishReason::Length, stop_string: None }
}

/// Token window decoded to look for stop strings: enough tokens to cover the longest stop
/// string (each token decodes to at least one byte) plus a few for split characters.
fn find_stop_string(tok: &Tokenizer, ids: &[i64], stops: &[String]) -> Result<Option<String>> {
    let window = stops.iter().map(String::len).max().unwrap_or(0) + 4;
    let text = tok.decode(&ids[ids.len().saturating_sub(window)..], false)?;
    Ok(stops.iter().find(|s| text.contains(s.as_str())).cloned())
}

impl<'a> Batcher<'a> {
    pub fn new(model: &'a CausalLm, tokenizer: Option<&'a Tokenizer>) -> Self {
        Self { model, tokenizer, rows: Vec::new(), cache: None, logits: None, queue: Vec::new(), done_early: Vec::new() }
    }

    /// Sequences decoding now plus those waiting to join.
    pub fn len(&self) -> usize {
        self.rows.len() + self.queue.len() + self.done_early.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn running(&self) -> usize {
        self.rows.len()
    }

    /// Slots × rows held by the KV cache, in bytes.
    pub fn cache_bytes(&self) -> i64 {
        self.cache.as_ref().map_or(0, KvCache::size_bytes)
    }

    /// Queues a sequence; it joins the batch at the next `step`. Input is checked here, so a
    /// bad request never disturbs the running batch.
    pub fn add(&mut self, id: u64, prompt_ids: Vec<i64>, params: SamplingParams, adapter: Option<&'a LoraAdapter>) -> Result<()> {
        params.validate()?;
        let vocab = self.model.config().vocab_size;
        if prompt_ids.is_empty() {
            return Err(ModelError::Input(format!("sequence {id}: empty prompt")));
        }
        if let Some(bad) = prompt_ids.iter().find(|&&t| t < 0 || t >= vocab) {
            return Err(ModelError::Input(format!("sequence {id}: token id {bad} outside the vocabulary (size {vocab})")));
        }
        if !params.stop_strings.is_empty() && self.tokenizer.is_none() {
            return Err(ModelError::Input(format!("sequence {id}: stop strings need a tokenizer")));
        }
        if params.max_new_tokens == 0 {
            self.done_early.push((id, empty_completion()));
        } else {
            self.queue.push(Pending { id, prompt: prompt_ids, params, adapter });
        }
        Ok(())
    }

    fn lora(&self, adapters: &[Option<&'a LoraAdapter>]) -> Option<LoraBatch<'a>> {
        adapters.iter().any(Option::is_some).then(|| LoraBatch::per_row(adapters, self.model.device()))
    }

    /// Prefills queued prompts as one left-padded batch and merges them into the running batch.
    fn admit(&mut self) -> Result<()> {
        if self.queue.is_empty() {
            return Ok(());
        }
        let queue = std::mem::take(&mut self.queue);
        let device = self.model.device();
        let prompts: Vec<Vec<i64>> = queue.iter().map(|p| p.prompt.clone()).collect();
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let room = queue.iter().map(|p| p.params.max_new_tokens).max().unwrap_or(0);
        let mut cache = KvCache::new(self.model.config(), queue.len() as i64, (longest + room) as i64, self.model.kind(), device);
        let (ids, valid) = mask::left_pad(&prompts, 0, device);
        let adapters: Vec<Option<&'a LoraAdapter>> = queue.iter().map(|p| p.adapter).collect();
        let lora = self.lora(&adapters);
        let logits = self.model.forward_cached(&ids, Some(&valid), &mut cache, lora.as_ref())?;
        self.cache = Some(match self.cache.take() {
            Some(mut running) => {
                running.append_rows(&cache);
                running
            }
            None => cache,
        });
        self.logits = Some(match self.logits.take() {
            Some(l) => Tensor::cat(&[l, logits], 0),
            None => logits,
        });
        for p in queue {
            let rng = p.params.rng();
            self.rows.push(Row { id: p.id, params: p.params, adapter: p.adapter, rng, out: empty_completion() });
        }
        Ok(())
    }

    /// Admits waiting sequences, samples one token for every row, drops finished rows and runs
    /// the decode forward for the rest. Returns the sequences that finished.
    pub fn step(&mut self) -> Result<Vec<(u64, Completion)>> {
        let _guard = tch::no_grad_guard();
        let mut finished = std::mem::take(&mut self.done_early);
        self.admit()?;
        let Some(logits) = self.logits.take() else { return Ok(finished) };
        let picked = {
            // Each row's own RNG advances in place; stop tokens stay suppressed until min_new_tokens.
            let mut params: Vec<&SamplingParams> = Vec::with_capacity(self.rows.len());
            let mut suppress: Vec<&[i64]> = Vec::with_capacity(self.rows.len());
            let mut rngs: Vec<&mut ChaCha8Rng> = Vec::with_capacity(self.rows.len());
            for r in self.rows.iter_mut() {
                let early = r.out.token_ids.len() < r.params.min_new_tokens;
                suppress.push(if early { r.params.stop_token_ids.as_slice() } else { &[] });
                params.push(&r.params);
                rngs.push(&mut r.rng);
            }
            sampling::sample(&logits, &params, &mut rngs, &suppress)
        };
        let mut keep = Vec::with_capacity(self.rows.len());
        for (b, (row, s)) in self.rows.iter_mut().zip(&picked).enumerate() {
            let c = &mut row.out;
            c.token_ids.push(s.token);
            c.logprobs.push(s.logprob);
            c.sampling_logprobs.push(s.sampling_logprob);
            let n = c.token_ids.len();
            let p = &row.params;
            let mut stop = false;
            if n >= p.min_new_tokens {
                if p.stop_token_ids.contains(&s.token) {
                    stop = true;
                } else if let (false, Some(tok)) = (p.stop_strings.is_empty(), self.tokenizer) {
                    if let Some(hit) = find_stop_string(tok, &c.token_ids, &p.stop_strings)? {
                        c.stop_string = Some(hit);
                        stop = true;
                    }
                }
            }
            if stop {
                c.finish_reason = FinishReason::Stop;
            } else if n >= p.max_new_tokens {
                c.finish_reason = FinishReason::Length;
            } else {
                keep.push(b);
            }
        }
        let next: Vec<i64> = keep.iter().map(|&b| picked[b].token).collect();
        if keep.len() != self.rows.len() {
            let rows = std::mem::take(&mut self.rows);
            let mut kept_rows = Vec::with_capacity(keep.len());
            let mut k = keep.iter().peekable();
            for (b, row) in rows.into_iter().enumerate() {
                if k.peek() == Some(&&b) {
                    k.next();
                    kept_rows.push(row);
                } else {
                    finished.push((row.id, row.out));
                }
            }
            self.rows = kept_rows;
            let keep_i64: Vec<i64> = keep.iter().map(|&b| b as i64).collect();
            if let Some(c) = self.cache.as_mut() {
                c.retain_rows(&keep_i64);
            }
        }
        if self.rows.is_empty() {
            self.cache = None;
            return Ok(finished);
        }
        let device = self.model.device();
        let input = Tensor::from_slice(&next).view([next.len() as i64, 1]).to_device(device);
        let adapters: Vec<Option<&'a LoraAdapter>> = self.rows.iter().map(|r| r.adapter).collect();
        let lora = self.lora(&adapters);
        let cache = self.cache.as_mut().expect("rows imply a cache");
        self.logits = Some(self.model.forward_cached(&input, None, cache, lora.as_ref())?);
        Ok(finished)
    }
}

/// Runs `batcher` until every admitted sequence has finished.
pub fn drain(batcher: &mut Batcher) -> Result<Vec<(u64, Completion)>> {
    let mut out = Vec::new();
    while !batcher.is_empty() {
        out.extend(batcher.step()?);
    }
    Ok(out)
}

