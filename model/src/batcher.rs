//! Continuous batching: sequences join between decode steps (their prompts prefilled together
//! straight into free rows of the KV cache) and leave the moment they finish (the last row takes
//! their place). Neither copies the other sequences' cache. `generate` is this batcher with
//! every request admitted at once.
//!
//! With a prefill chunk set, a prompt longer than the chunk is prefilled one chunk per step in
//! a cache of its own, so that a long prompt never stalls the decoding rows for more than a
//! chunk's forward; when its prompt is in, its keys and values move into a row of the batch.
use crate::error::{ModelError, Result};
use crate::guide::{tail_reserve, Guide};
use crate::kv_cache::KvCache;
use crate::lora::{LoraAdapter, LoraBatch};
use crate::mask;
use crate::sampling::{self, SamplingParams};
use crate::tokenizer::Tokenizer;
use crate::transformer::CausalLm;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::VecDeque;
use tch::Tensor;

mod rows;
use rows::{row_free, row_guided, row_unguided};

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
    /// Positions of a guided tail whose tokens were drawn from a restricted set.
    pub constrained: Vec<crate::guide::Constrained>,
}

/// Where a row stands with its guided tail (`SamplingParams::guided_suffix`).
enum Tail {
    Unguided,
    /// Writing freely; the guide starts when the row would stop.
    Free(String),
    /// In the guided tail; `next` is what the guide allows at the next position.
    Guided {
        guide: Guide,
        next: Vec<i64>,
    },
}

struct Row<'a> {
    id: u64,
    /// What it was asked, and the next-token logits its prefill gave ([V]): a prompt asked
    /// again while it runs starts from these instead of its own prefill.
    prompt: Vec<i64>,
    prompt_logits: Tensor,
    /// Prompt plus most new tokens: the columns this row may come to hold.
    need: usize,
    params: SamplingParams,
    adapter: Option<&'a LoraAdapter>,
    rng: ChaCha8Rng,
    out: Completion,
    tail: Tail,
    /// Tokens kept for a guided tail (see `guide::tail_reserve`).
    tail_reserve: usize,
}

/// What happened to a row after its token of this step.
enum RowState {
    Running,
    Finished(FinishReason),
}

impl Pending<'_> {
    /// Prompt plus most new tokens: the columns this sequence may come to hold.
    fn need(&self) -> usize {
        self.prompt.len() + self.params.max_new_tokens
    }
}

struct Pending<'a> {
    id: u64,
    prompt: Vec<i64>,
    params: SamplingParams,
    adapter: Option<&'a LoraAdapter>,
}

/// A long prompt part-way through its chunked prefill, in its own one-row cache.
struct Prefill<'a> {
    pending: Pending<'a>,
    cache: KvCache,
    /// Prompt tokens already in `cache`.
    done: usize,
}

pub struct Batcher<'a> {
    model: &'a CausalLm,
    tokenizer: Option<&'a Tokenizer>,
    /// In the cache's row order.
    rows: Vec<Row<'a>>,
    cache: KvCache,
    /// Next-token logits of every row, [rows, V].
    logits: Option<Tensor>,
    queue: Vec<Pending<'a>>,
    /// Finished before any decoding (max_new_tokens = 0).
    done_early: Vec<(u64, Completion)>,
    /// Prompts longer than this are prefilled a chunk per step (None: whole, when they join).
    prefill_chunk: Option<usize>,
    /// Long prompts waiting for their chunked prefill, and the one under way.
    long: VecDeque<Pending<'a>>,
    prefilling: Option<Prefill<'a>>,
    /// Prompt tokens whose keys and values were copied from another row, not computed.
    shared_prompt_tokens: u64,
    /// Whether a prompt asked again copies the first one's prefill.
    share_prompts: bool,
}

fn empty_completion() -> Completion {
    Completion {
        token_ids: Vec::new(),
        logprobs: Vec::new(),
        sampling_logprobs: Vec::new(),
        finish_reason: FinishReason::Length,
        stop_string: None,
        constrained: Vec::new(),
    }
}

impl<'a> Batcher<'a> {
    pub fn new(model: &'a CausalLm, tokenizer: Option<&'a Tokenizer>) -> Self {
        let cache = KvCache::new(model.config(), 0, 0, model.kind(), model.device());
        Self {
            model,
            tokenizer,
            rows: Vec::new(),
            cache,
            logits: None,
            queue: Vec::new(),
            done_early: Vec::new(),
            prefill_chunk: None,
            long: VecDeque::new(),
            prefilling: None,
            shared_prompt_tokens: 0,
            share_prompts: true,
        }
    }

    /// Whether a prompt asked again on the same weights, beside the first or while the first
    /// runs, copies the first one's prefill (default) or is prefilled again. The tokens
    /// generated do not change.
    pub fn set_prompt_sharing(&mut self, on: bool) {
        self.share_prompts = on;
    }

    /// Prefills prompts longer than `tokens` one chunk of that many tokens per step (None or 0:
    /// every prompt whole, when it joins). What is generated does not change.
    pub fn set_prefill_chunk(&mut self, tokens: Option<usize>) {
        self.prefill_chunk = tokens.filter(|&t| t > 0);
    }

    /// Sequences whose prompt is still waiting for, or in, its chunked prefill.
    fn long_pending(&self) -> impl Iterator<Item = &Pending<'a>> {
        self.long.iter().chain(self.prefilling.as_ref().map(|p| &p.pending))
    }

    /// Caps the KV cache's allocation at `slots` token slots (rows × columns); see
    /// `slots_if_added` for keeping admissions within it.
    pub fn set_cache_limit(&mut self, slots: Option<usize>) {
        self.cache.set_limit(slots.map(|s| s as i64));
    }

    /// Cache slots (rows × columns) the batch needs if one more sequence of `prompt_len +
    /// max_new_tokens = need` tokens joins: every row is as wide as the widest.
    pub fn slots_if_added(&self, need: usize) -> usize {
        (self.rows.len() + self.queue.len() + self.long_pending().count() + 1)
            * self.widest_need().max(need)
    }

    /// Prompt plus most new tokens of the widest sequence decoding or waiting.
    fn widest_need(&self) -> usize {
        self.rows
            .iter()
            .map(|r| r.need)
            .chain(self.queue.iter().map(Pending::need))
            .chain(self.long_pending().map(Pending::need))
            .max()
            .unwrap_or(0)
    }

    /// Sequences decoding now plus those waiting to join.
    pub fn len(&self) -> usize {
        self.rows.len() + self.queue.len() + self.done_early.len() + self.long_pending().count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn running(&self) -> usize {
        self.rows.len()
    }

    /// Bytes allocated by the KV cache.
    pub fn cache_bytes(&self) -> i64 {
        self.cache.size_bytes()
    }

    /// Token slots (rows × columns) the KV cache has allocated.
    pub fn cache_slots(&self) -> i64 {
        self.cache.capacity_slots()
    }

    /// Prompt tokens so far whose prefill was copied from the same prompt's instead of being
    /// computed (see [`Batcher::set_prompt_sharing`]).
    pub fn shared_prompt_tokens(&self) -> u64 {
        self.shared_prompt_tokens
    }

    /// Tokens the KV cache holds now.
    pub fn cached_tokens(&self) -> i64 {
        self.cache.lens().iter().sum()
    }

    /// Queues a sequence; it joins the batch at the next `step`. Input is checked here, so a
    /// bad request never disturbs the running batch.
    pub fn add(
        &mut self,
        id: u64,
        prompt_ids: Vec<i64>,
        params: SamplingParams,
        adapter: Option<&'a LoraAdapter>,
    ) -> Result<()> {
        params.validate()?;
        let vocab = self.model.config().vocab_size;
        if prompt_ids.is_empty() {
            return Err(ModelError::Input(format!("sequence {id}: empty prompt")));
        }
        if let Some(bad) = prompt_ids.iter().find(|&&t| t < 0 || t >= vocab) {
            return Err(ModelError::Input(format!(
                "sequence {id}: token id {bad} outside the vocabulary (size {vocab})"
            )));
        }
        let context = self.model.config().max_position_embeddings.max(0) as usize;
        if prompt_ids.len().saturating_add(params.max_new_tokens) > context {
            return Err(ModelError::Input(format!(
                "sequence {id}: its prompt of {} tokens and max_new_tokens {} exceed the model's context of {context} tokens (max_position_embeddings)",
                prompt_ids.len(),
                params.max_new_tokens
            )));
        }
        if !params.stop_strings.is_empty() && self.tokenizer.is_none() {
            return Err(ModelError::Input(format!("sequence {id}: stop strings need a tokenizer")));
        }
        if let Some(regex) = &params.guided_suffix {
            let tok = self.tokenizer.ok_or_else(|| {
                ModelError::Input(format!("sequence {id}: a guided suffix needs a tokenizer"))
            })?;
            // Compiles (and caches) the guide now, so a bad regex fails this request only.
            tok.guidance()?.start(regex)?;
        }
        if params.max_new_tokens == 0 {
            self.done_early.push((id, empty_completion()));
        } else {
            self.queue.push(Pending { id, prompt: prompt_ids, params, adapter });
        }
        Ok(())
    }

    /// The sequences decoding now, each with what it has generated so far (a streamed answer
    /// reads its new tokens here after each step).
    pub fn outputs(&self) -> impl Iterator<Item = (u64, &Completion)> + '_ {
        self.rows.iter().map(|r| (r.id, &r.out))
    }

    /// Stops sequence `id` wherever it is (waiting, prefilling or decoding): it takes no further
    /// step and its cache room is freed now. Returns how many tokens it had generated, or
    /// `None` if no such sequence is here (it finished, or was never added).
    pub fn abort(&mut self, id: u64) -> Result<Option<usize>> {
        if let Some(i) = self.queue.iter().position(|p| p.id == id) {
            self.queue.remove(i);
            return Ok(Some(0));
        }
        if let Some(i) = self.done_early.iter().position(|(d, _)| *d == id) {
            self.done_early.remove(i);
            return Ok(Some(0));
        }
        if let Some(i) = self.long.iter().position(|p| p.id == id) {
            self.long.remove(i);
            return Ok(Some(0));
        }
        if self.prefilling.as_ref().is_some_and(|p| p.pending.id == id) {
            self.prefilling = None;
            return Ok(Some(0));
        }
        let Some(b) = self.rows.iter().position(|r| r.id == id) else { return Ok(None) };
        // The row leaves the way a finished one does (swap_remove), and its next-token logits
        // with it, so every other row keeps its own.
        let last = self.rows.len() - 1;
        self.cache.swap_remove(b);
        let row = self.rows.swap_remove(b);
        self.logits = match self.logits.take() {
            Some(_) if last == 0 => None,
            Some(l) => {
                let mut order: Vec<i64> = (0..last as i64).collect();
                if b < last {
                    order[b] = last as i64;
                }
                let order = Tensor::from_slice(&order).to_device(l.device());
                Some(l.index_select(0, &order))
            }
            None => None,
        };
        if !self.rows.is_empty() {
            self.cache.fit_columns(self.widest_need() as i64)?;
        }
        Ok(Some(row.out.token_ids.len()))
    }

    fn lora(&self, adapters: &[Option<&'a LoraAdapter>]) -> Option<LoraBatch<'a>> {
        adapters
            .iter()
            .any(Option::is_some)
            .then(|| LoraBatch::per_row(adapters, self.model.device()))
    }

    /// Prefills queued prompts straight into new rows at the end of the cache, in right-padded
    /// batches of similar length (see [`prefill_groups`]). A prompt that a running sequence on
    /// the same weights was asked, or that came before it in this admission (the samples of a
    /// GRPO group), is not prefilled again: it copies that row's prompt columns and the logits
    /// its prefill gave, the bits a prefill of its own beside it would give.
    fn admit(&mut self) -> Result<()> {
        if self.queue.is_empty() {
            return Ok(());
        }
        let widest = self.widest_need();
        let queue = std::mem::take(&mut self.queue);
        self.cache.reserve((self.rows.len() + queue.len()) as i64, widest as i64)?;
        // In arrival order, which the chunked prefill keeps.
        let (mut firsts, mut copies): (Vec<Pending<'a>>, Vec<Pending<'a>>) =
            (Vec::new(), Vec::new());
        for p in queue {
            let asked = self.share_prompts
                && (self.rows.iter().any(|r| r.asked(&p))
                    || firsts.iter().any(|f| p.asks(f.adapter, &f.prompt)));
            if asked {
                copies.push(p)
            } else {
                firsts.push(p)
            }
        }
        // A long prompt is prefilled a chunk per step in a cache of its own.
        let (long, short): (Vec<_>, Vec<_>) = firsts
            .into_iter()
            .partition(|p| self.prefill_chunk.is_some_and(|c| p.prompt.len() > c));
        self.long.extend(long);
        self.prefill(short)?;
        // Every copy's prompt is now a row's, unless its first went to the chunked prefill:
        // then it goes there too, as it would without sharing.
        let first_copy = self.cache.rows();
        let (mut copied, mut logits) = (Vec::new(), Vec::new());
        for p in copies {
            let Some(row) = self.rows.iter().position(|r| r.asked(&p)) else {
                self.long.push_back(p);
                continue;
            };
            if let Err(e) = self.cache.push_prefix_of(row, p.prompt.len() as i64) {
                self.cache.truncate_rows(first_copy);
                return Err(e);
            }
            logits.push(self.rows[row].prompt_logits.shallow_clone());
            copied.push(p);
        }
        if copied.is_empty() {
            return Ok(());
        }
        let added = Tensor::stack(&logits, 0);
        self.logits = Some(match self.logits.take() {
            Some(l) => Tensor::cat(&[l, added], 0),
            None => added,
        });
        for (p, l) in copied.into_iter().zip(logits) {
            self.shared_prompt_tokens += p.prompt.len() as u64;
            self.push_row(p, l);
        }
        Ok(())
    }

    /// Prefills `seqs` into new rows at the end of the cache, in batches of similar length.
    fn prefill(&mut self, mut seqs: Vec<Pending<'a>>) -> Result<()> {
        seqs.sort_by_key(|p| p.prompt.len());
        let lens: Vec<usize> = seqs.iter().map(|p| p.prompt.len()).collect();
        let device = self.model.device();
        let mut seqs = seqs.into_iter();
        for size in prefill_groups(&lens) {
            let group: Vec<Pending<'a>> = seqs.by_ref().take(size).collect();
            let prompts: Vec<Vec<i64>> = group.iter().map(|p| p.prompt.clone()).collect();
            let lens: Vec<i64> = prompts.iter().map(|p| p.len() as i64).collect();
            let first = self.cache.push_rows(group.len())?;
            let (ids, _) = mask::right_pad(&prompts, 0, device);
            let adapters: Vec<Option<&'a LoraAdapter>> = group.iter().map(|p| p.adapter).collect();
            let lora = self.lora(&adapters);
            let logits =
                match self.model.forward_cached(&ids, &lens, first, &mut self.cache, lora.as_ref())
                {
                    Ok(l) => l,
                    Err(e) => {
                        self.cache.truncate_rows(first as usize);
                        return Err(e);
                    }
                };
            for (j, p) in group.into_iter().enumerate() {
                self.push_row(p, logits.get(j as i64));
            }
            self.logits = Some(match self.logits.take() {
                Some(l) => Tensor::cat(&[l, logits], 0),
                None => logits,
            });
        }
        Ok(())
    }

    /// A sequence whose prompt is in the cache (its row is the last) starts decoding.
    fn push_row(&mut self, p: Pending<'a>, prompt_logits: Tensor) {
        let rng = p.params.rng();
        let tail = p.params.guided_suffix.clone().map_or(Tail::Unguided, Tail::Free);
        let need = p.need();
        let tail_reserve = p.params.guided_suffix.as_deref().map_or(0, tail_reserve);
        self.rows.push(Row {
            id: p.id,
            prompt: p.prompt,
            prompt_logits,
            need,
            params: p.params,
            adapter: p.adapter,
            rng,
            out: empty_completion(),
            tail,
            tail_reserve,
        });
    }

    /// Runs the next chunk of the long prompt under way (starting the next one if none is); a
    /// prompt that is complete moves into the batch's cache and decodes from the next step.
    fn advance_prefill(&mut self) -> Result<()> {
        let Some(chunk) = self.prefill_chunk else { return Ok(()) };
        if self.prefilling.is_none() {
            let Some(pending) = self.long.pop_front() else { return Ok(()) };
            let mut cache =
                KvCache::new(self.model.config(), 0, 0, self.model.kind(), self.model.device());
            cache.push_rows(1)?;
            self.prefilling = Some(Prefill { pending, cache, done: 0 });
        }
        let Some(p) = self.prefilling.as_mut() else { return Ok(()) };
        let end = (p.done + chunk).min(p.pending.prompt.len());
        let ids = Tensor::from_slice(&p.pending.prompt[p.done..end])
            .view([1, (end - p.done) as i64])
            .to_device(self.model.device());
        let adapter = [p.pending.adapter];
        let lora = adapter[0].is_some().then(|| LoraBatch::per_row(&adapter, self.model.device()));
        let logits = self.model.forward_cached(
            &ids,
            &[(end - p.done) as i64],
            0,
            &mut p.cache,
            lora.as_ref(),
        )?;
        p.done = end;
        if end < p.pending.prompt.len() {
            return Ok(());
        }
        let Some(Prefill { pending, cache, .. }) = self.prefilling.take() else { return Ok(()) };
        self.cache
            .reserve((self.rows.len() + 1) as i64, self.widest_need().max(pending.need()) as i64)?;
        self.cache.adopt_row(&cache, 0)?;
        let prompt_logits = logits.get(0);
        self.logits = Some(match self.logits.take() {
            Some(l) => Tensor::cat(&[l, logits], 0),
            None => logits,
        });
        self.push_row(pending, prompt_logits);
        Ok(())
    }

    /// Admits waiting sequences, samples one token for every row, drops finished rows and runs
    /// the decode forward for the rest. Returns the sequences that finished.
    pub fn step(&mut self) -> Result<Vec<(u64, Completion)>> {
        let _guard = tch::no_grad_guard();
        let mut finished = std::mem::take(&mut self.done_early);
        self.admit()?;
        self.advance_prefill()?;
        let Some(logits) = self.logits.take() else { return Ok(finished) };
        let picked = {
            // Each row's own RNG advances in place; stop tokens stay suppressed until
            // min_new_tokens; a row in its guided tail may only produce what the guide allows.
            let mut params: Vec<&SamplingParams> = Vec::with_capacity(self.rows.len());
            let mut suppress: Vec<&[i64]> = Vec::with_capacity(self.rows.len());
            let mut allow: Vec<Option<&[i64]>> = Vec::with_capacity(self.rows.len());
            let mut rngs: Vec<&mut ChaCha8Rng> = Vec::with_capacity(self.rows.len());
            for r in self.rows.iter_mut() {
                let early = r.out.token_ids.len() < r.params.min_new_tokens;
                suppress.push(if early { r.params.stop_token_ids.as_slice() } else { &[] });
                allow.push(match &r.tail {
                    Tail::Guided { next, .. } => Some(next.as_slice()),
                    _ => None,
                });
                params.push(&r.params);
                rngs.push(&mut r.rng);
            }
            sampling::sample(&logits, &params, &mut rngs, &suppress, &allow)
        };
        let picked = match picked {
            Ok(p) => p,
            Err(e) => {
                // The whole step fails; the batch is left as it was, so a step called again
                // fails the same way instead of dropping its rows.
                let row = &self.rows[e.row()];
                let err = e.error(row.id, row.out.token_ids.len());
                self.logits = Some(logits);
                self.done_early = finished;
                return Err(err);
            }
        };
        let mut done = Vec::new();
        for (b, (row, s)) in self.rows.iter_mut().zip(&picked).enumerate() {
            let state = match &row.tail {
                Tail::Unguided => row_unguided(self.tokenizer, row, *s)?,
                Tail::Free(_) => row_free(self.tokenizer, row, *s, &logits, b)?,
                Tail::Guided { .. } => row_guided(row, *s)?,
            };
            if let RowState::Finished(reason) = state {
                row.out.finish_reason = reason;
                done.push(b);
            }
        }
        // Highest first, so the last row that fills each hole is one that keeps running.
        for &b in done.iter().rev() {
            self.cache.swap_remove(b);
            let row = self.rows.swap_remove(b);
            finished.push((row.id, row.out));
        }
        if self.rows.is_empty() {
            return Ok(finished);
        }
        if !done.is_empty() {
            // The widest sequence may have left: decoding reads every column, so drop the slack.
            self.cache.fit_columns(self.widest_need() as i64)?;
        }
        // A guided row may have replaced the sampled token: feed what each row kept.
        let next: Vec<i64> = self
            .rows
            .iter()
            .map(|r| *r.out.token_ids.last().expect("a running row has a token"))
            .collect();
        let device = self.model.device();
        let input = Tensor::from_slice(&next).view([next.len() as i64, 1]).to_device(device);
        let adapters: Vec<Option<&'a LoraAdapter>> = self.rows.iter().map(|r| r.adapter).collect();
        let lora = self.lora(&adapters);
        let ones = vec![1i64; next.len()];
        self.logits =
            Some(self.model.forward_cached(&input, &ones, 0, &mut self.cache, lora.as_ref())?);
        Ok(finished)
    }
}

/// Whether two sequences run on the same weights (the base, or the same adapter). Every row on
/// an adapter holds its current weights: the worker swaps an agent's weights only when none of
/// its turns is running.
fn same_weights(a: Option<&LoraAdapter>, b: Option<&LoraAdapter>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => std::ptr::eq(x, y),
        _ => false,
    }
}

impl Pending<'_> {
    /// Whether this asks exactly `prompt` on the weights of `adapter`.
    fn asks(&self, adapter: Option<&LoraAdapter>, prompt: &[i64]) -> bool {
        same_weights(self.adapter, adapter) && self.prompt == prompt
    }
}

impl Row<'_> {
    /// Whether `p` asks exactly what this row was asked, on the same weights.
    fn asked(&self, p: &Pending) -> bool {
        p.asks(self.adapter, &self.prompt)
    }
}

/// Padded tokens a prefill batch may compute per real token of its prompts.
const PREFILL_PADDING: f64 = 1.125;

/// Splits prompts of ascending lengths `lens` into consecutive prefill batches: a batch grows
/// while its right-padded size stays within [`PREFILL_PADDING`] of its real tokens. Batching
/// short prompts saves calls; a long prompt padded to a longer one would compute the padding.
fn prefill_groups(lens: &[usize]) -> Vec<usize> {
    let mut groups = Vec::new();
    let (mut size, mut real) = (0usize, 0usize);
    for &l in lens {
        let padded = (size + 1) * l;
        if size > 0 && padded as f64 > PREFILL_PADDING * (real + l) as f64 {
            groups.push(size);
            (size, real) = (0, 0);
        }
        size += 1;
        real += l;
    }
    if size > 0 {
        groups.push(size);
    }
    groups
}

/// Runs `batcher` until every admitted sequence has finished.
pub fn drain(batcher: &mut Batcher) -> Result<Vec<(u64, Completion)>> {
    let mut out = Vec::new();
    while !batcher.is_empty() {
        out.extend(batcher.step()?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_batches_keep_padding_within_the_budget() {
        // Equal lengths batch together; a longer prompt starts a new batch once padding the
        // batch to it would cost more than an eighth of its real tokens.
        assert_eq!(prefill_groups(&[10, 10, 10, 10]), vec![4]);
        assert_eq!(prefill_groups(&[10, 10, 11, 20, 21, 80]), vec![3, 2, 1]);
        assert_eq!(prefill_groups(&[5]), vec![1]);
        assert!(prefill_groups(&[]).is_empty());
        let lens = [3, 4, 4, 9, 30, 31, 33, 200];
        let groups = prefill_groups(&lens);
        assert_eq!(groups.iter().sum::<usize>(), lens.len());
        let mut at = 0;
        for g in groups {
            let batch = &lens[at..at + g];
            let (padded, real) =
                (batch.len() * batch[batch.len() - 1], batch.iter().sum::<usize>());
            assert!(padded as f64 <= PREFILL_PADDING * real as f64, "{batch:?}");
            at += g;
        }
    }
}
