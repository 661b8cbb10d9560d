//! The model thread of `comas serve`: it owns the model, admits requests into the batch while
//! the token budget allows, steps the batch, streams or answers as sequences go, and drops the
//! requests whose clients have gone.
use super::stream::{self, Streamed};
use super::wire::{self, Answered, Api, Head, Token};
use super::{ApiError, Call, Metrics, ReplyTo, Request, Whole};
use axum::http::StatusCode;
use comas_model::{
    Batcher, CausalLm, ChatMessage, Completion, FinishReason, LoraAdapter, SamplingParams,
    Tokenizer,
};
use comas_service::openai::{self, Prompt, Sampling, Usage};
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc;
use tokio::sync::oneshot;

/// A text completion's budget when the request gives none (OpenAI's and vLLM's default).
const TEXT_MAX_TOKENS: u32 = 16;
/// Most choices (`n`) one request may ask for; each is a sequence of its own.
const MAX_CHOICES: u32 = 128;

pub(super) struct ModelLoop<'a> {
    pub model: &'a CausalLm,
    pub tokenizer: &'a Tokenizer,
    pub adapter: Option<&'a LoraAdapter>,
    pub name: &'a str,
    pub max_running: usize,
    pub max_batch_tokens: usize,
    pub metrics: Metrics,
}

/// What a request asks of the model, tokenized and checked.
struct Asked {
    api: Api,
    prompt: Vec<i64>,
    /// Choice 0's; choice i draws with seed + i.
    params: SamplingParams,
    n: usize,
    /// Whether the answer carries each token's log-probability.
    logprobs: bool,
}

/// Where a request's answer goes, on the model thread.
enum Answer<'t> {
    Whole(oneshot::Sender<Result<Whole, ApiError>>),
    Stream(Box<Streamed<'t>>),
}

impl Answer<'_> {
    /// Whether the client has gone (its connection closed, so the receiving end was dropped).
    fn is_closed(&self) -> bool {
        match self {
            Answer::Whole(tx) => tx.is_closed(),
            Answer::Stream(s) => s.is_closed(),
        }
    }

    fn fail(self, e: ApiError, metrics: &Metrics) {
        match self {
            Answer::Whole(tx) => {
                let _ = tx.send(Err(e));
            }
            Answer::Stream(s) => s.fail(e, metrics),
        }
    }
}

/// A request taken: where its answer goes and its choices as they finish.
struct Group<'t> {
    api: Api,
    head: Head,
    prompt: usize,
    logprobs: bool,
    reply: Answer<'t>,
    done: Vec<Option<Answered>>,
    left: usize,
}

/// One choice of a request, waiting for room in the batch.
struct Waiting {
    group: u64,
    index: usize,
    prompt: Vec<i64>,
    params: SamplingParams,
}

/// A choice in the batch.
struct Running {
    group: u64,
    index: usize,
}

impl<'a> ModelLoop<'a> {
    /// Checks common to both APIs: what a request's fields ask that this server does not do.
    fn refuse(
        s: &Sampling,
        other: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), ApiError> {
        if let Some(n) = s.n.filter(|n| !(1..=MAX_CHOICES).contains(n)) {
            return Err(ApiError::bad(format!(
                "n = {n}: a request asks for 1 to {MAX_CHOICES} choices"
            )));
        }
        if s.stream_options.is_some() && s.stream != Some(true) {
            return Err(ApiError::bad(
                "stream_options is only for streamed answers: send stream = true, or leave stream_options out",
            ));
        }
        if let Some(why) = openai::unsupported(other) {
            return Err(ApiError::bad(why));
        }
        if s.stop.as_ref().is_some_and(|s| s.strings().iter().any(String::is_empty)) {
            return Err(ApiError::bad(
                "a stop string is empty (it would end every answer at once); leave it out",
            ));
        }
        if s.max_new_tokens() == Some(0) {
            return Err(ApiError::bad("max_tokens must be at least 1"));
        }
        Ok(())
    }

    /// The prompt of a text completion: its text encoded as `transformers` would (with the
    /// tokenizer's special tokens), or its ids checked against the vocabulary.
    fn raw_prompt(&self, prompt: &Prompt) -> Result<Vec<i64>, ApiError> {
        let one = |n: usize| {
            if n == 1 {
                Ok(())
            } else {
                Err(ApiError::bad(format!("prompt is a list of {n}: send one prompt per request")))
            }
        };
        let ids = match prompt {
            Prompt::Text(t) => self.encode(t)?,
            Prompt::Texts(t) => {
                one(t.len())?;
                self.encode(&t[0])?
            }
            Prompt::Ids(ids) => ids.clone(),
            Prompt::IdLists(l) => {
                one(l.len())?;
                l[0].clone()
            }
        };
        if ids.is_empty() {
            return Err(ApiError::bad("prompt is empty: give at least one token to go on from"));
        }
        let vocab = self.model.config().vocab_size;
        if let Some(bad) = ids.iter().find(|&&i| !(0..vocab).contains(&i)) {
            return Err(ApiError::bad(format!(
                "prompt token id {bad} is outside the vocabulary (0 to {})",
                vocab - 1
            )));
        }
        Ok(ids)
    }

    fn encode(&self, text: &str) -> Result<Vec<i64>, ApiError> {
        self.tokenizer
            .encode(text, true)
            .map_err(|e| ApiError::bad(format!("the prompt cannot be tokenized: {e}")))
    }

    /// The prompt and sampling of a request, or why it cannot run here.
    fn admit(&self, r: &Request) -> Result<Asked, ApiError> {
        let (api, s, logprobs, prompt) = match r {
            Request::Chat(r) => {
                Self::refuse(&r.sampling, &r.other)?;
                if r.messages.is_empty() {
                    return Err(ApiError::bad("messages is empty"));
                }
                let messages: Vec<ChatMessage> = r
                    .messages
                    .iter()
                    .map(|m| ChatMessage::new(m.role.clone(), m.content.clone()))
                    .collect();
                let prompt = self
                    .tokenizer
                    .encode_chat(&messages, true)
                    .map_err(|e| ApiError::bad(format!("the messages cannot be rendered: {e}")))?;
                (Api::Chat, &r.sampling, r.logprobs == Some(true), prompt)
            }
            Request::Text(r) => {
                Self::refuse(&r.sampling, &r.other)?;
                if r.echo == Some(true) {
                    return Err(ApiError::bad("echo = true is not supported here; leave it out"));
                }
                if r.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
                    return Err(ApiError::bad(
                        "suffix is not supported here (no insertion); leave it out",
                    ));
                }
                if let Some(n) = r.logprobs.filter(|&n| n > 0) {
                    return Err(ApiError::bad(format!(
                        "logprobs = {n} asks for {n} alternatives with each token, which are not given here; send logprobs = 0 for each chosen token's log-probability"
                    )));
                }
                (Api::Text, &r.sampling, r.logprobs.is_some(), self.raw_prompt(&r.prompt)?)
            }
        };
        let temperature = s.temperature.unwrap_or(1.0);
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(ApiError::bad(format!(
                "temperature must be finite and at least 0, got {temperature}"
            )));
        }
        let top_p = s.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::bad(format!("top_p must be in (0, 1], got {top_p}")));
        }
        let context = self.model.config().max_position_embeddings.max(0) as usize;
        let room = context.saturating_sub(prompt.len());
        let max_new = match (s.max_new_tokens(), api) {
            (Some(n), _) => n as usize,
            (None, Api::Chat) => room,
            (None, Api::Text) => TEXT_MAX_TOKENS as usize,
        };
        let what = match api {
            Api::Chat => "messages",
            Api::Text => "prompt",
        };
        // No max_tokens and a prompt that fills the context leaves nothing to generate.
        if prompt.len() + max_new > context || max_new == 0 {
            return Err(ApiError::bad(format!(
                "this model's context is {context} tokens, and the request asks for {} ({} in the {what}, {max_new} to generate); shorten the {what} or lower max_tokens",
                prompt.len() + max_new,
                prompt.len()
            )));
        }
        if prompt.len() + max_new > self.max_batch_tokens {
            return Err(ApiError::bad(format!(
                "the request needs {} tokens of KV cache ({} in the {what}, {max_new} to generate), over this server's --max-batch-tokens {}",
                prompt.len() + max_new,
                prompt.len(),
                self.max_batch_tokens
            )));
        }
        let params = SamplingParams {
            temperature,
            top_k: s.top_k.unwrap_or(0) as usize,
            top_p,
            seed: s.seed.unwrap_or_else(rand::random),
            max_new_tokens: max_new,
            min_new_tokens: (s.min_tokens.unwrap_or(0) as usize).min(max_new),
            stop_token_ids: self.tokenizer.eos_token_ids().to_vec(),
            stop_strings: s.stop.as_ref().map(|s| s.strings()).unwrap_or_default(),
            guided_suffix: s.guided_suffix.clone(),
        };
        if logprobs {
            // Token bytes come from the guided-decoding tables, built on first use.
            self.tokenizer
                .guidance()
                .map_err(|e| ApiError::bad(format!("logprobs cannot be given: {e}")))?;
        }
        Ok(Asked { api, prompt, params, n: s.n.unwrap_or(1) as usize, logprobs })
    }

    /// Tokens with their bytes and log-probabilities under softmax(logits / temperature) over
    /// the whole vocabulary (temperature 1 when greedy).
    pub(super) fn tokens(&self, ids: &[i64], logprobs: &[f32]) -> Vec<Token> {
        let guidance = self.tokenizer.guidance().ok();
        ids.iter()
            .zip(logprobs)
            .map(|(&id, &logprob)| Token {
                bytes: guidance.map(|g| g.token_bytes(id)).unwrap_or_default(),
                logprob,
            })
            .collect()
    }

    /// A finished choice of `group`: the text without the stop token or string.
    fn answer(&self, group: &Group, c: &Completion) -> Answered {
        let (tok, prompt) = (self.tokenizer, group.prompt);
        let stop = c.finish_reason == FinishReason::Stop
            && c.stop_string.is_none()
            && c.token_ids.last().is_some_and(|t| tok.eos_token_ids().contains(t));
        let visible = if stop { &c.token_ids[..c.token_ids.len() - 1] } else { &c.token_ids[..] };
        let mut text = tok.decode(visible, true).unwrap_or_default();
        if let Some(s) = &c.stop_string {
            if let Some(i) = text.find(s.as_str()) {
                text.truncate(i);
            }
        }
        Answered {
            text,
            finish: match c.finish_reason {
                FinishReason::Stop => "stop",
                FinishReason::Length => "length",
            },
            tokens: group.logprobs.then(|| self.tokens(&c.token_ids, &c.logprobs)),
            usage: Usage {
                prompt_tokens: prompt as u64,
                completion_tokens: c.token_ids.len() as u64,
                total_tokens: (prompt + c.token_ids.len()) as u64,
            },
        }
    }

    /// A call checked and its choices queued, or refused. A streamed answer starts now (its
    /// first event tells the HTTP side that the request was taken).
    fn take(
        &self,
        call: Call,
        id: u64,
        waiting: &mut VecDeque<Waiting>,
        groups: &mut HashMap<u64, Group<'a>>,
    ) {
        let asked = self.admit(&call.request);
        let api = asked.as_ref().map_or(Api::Chat, |a| a.api);
        let head = Head::new(api, id, self.name);
        let reply = match call.reply {
            ReplyTo::Whole(tx) => Answer::Whole(tx),
            ReplyTo::Stream(tx) => {
                let how = stream::Asked {
                    api,
                    n: asked.as_ref().map_or(1, |a| a.n),
                    stops: asked
                        .as_ref()
                        .map(|a| a.params.stop_strings.clone())
                        .unwrap_or_default(),
                    logprobs: asked.as_ref().is_ok_and(|a| a.logprobs),
                    include_usage: call
                        .request
                        .sampling()
                        .stream_options
                        .as_ref()
                        .and_then(|o| o.include_usage)
                        .unwrap_or(false),
                };
                Answer::Stream(Box::new(Streamed::new(tx, head.clone(), self.tokenizer, how)))
            }
        };
        let asked = match asked {
            Ok(a) => a,
            Err(e) => return reply.fail(e, &self.metrics),
        };
        let mut reply = reply;
        if let Answer::Stream(s) = &mut reply {
            s.start();
        }
        for index in 0..asked.n {
            let mut params = asked.params.clone();
            params.seed = params.seed.wrapping_add(index as u64);
            waiting.push_back(Waiting { group: id, index, prompt: asked.prompt.clone(), params });
        }
        let group = Group {
            api,
            head,
            prompt: asked.prompt.len(),
            logprobs: asked.logprobs,
            reply,
            done: (0..asked.n).map(|_| None).collect(),
            left: asked.n,
        };
        groups.insert(id, group);
    }

    /// A request whose every choice has finished: its answer.
    fn complete(&self, g: Group) {
        let choices: Vec<Answered> = g.done.into_iter().flatten().collect();
        let usage = wire::usage_of(&choices);
        match g.reply {
            Answer::Whole(tx) => {
                let _ = tx.send(Ok(Whole { body: wire::whole(g.api, g.head, choices), usage }));
            }
            Answer::Stream(s) => s.finish(usage, &self.metrics),
        }
    }
}

/// The model thread: takes calls, keeps the batch full within its budget, streams and answers
/// as sequences go, and drops the requests whose clients have gone. Ends when every sender is
/// gone and the batch is empty.
pub(super) fn serve_model<'a>(m: &ModelLoop<'a>, calls: mpsc::Receiver<Call>) {
    let new_batcher = || {
        let mut b = Batcher::new(m.model, Some(m.tokenizer));
        b.set_cache_limit(Some(m.max_batch_tokens));
        b
    };
    let mut batcher = new_batcher();
    let mut groups: HashMap<u64, Group<'a>> = HashMap::new();
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let mut running: HashMap<u64, Running> = HashMap::new();
    let (mut next_group, mut next_sequence) = (0u64, 0u64);
    let mut open = true;
    loop {
        let mut take = |call: Call, waiting: &mut VecDeque<Waiting>, groups: &mut HashMap<_, _>| {
            m.take(call, next_group, waiting, groups);
            next_group += 1;
        };
        if batcher.is_empty() && waiting.is_empty() {
            if !open {
                return;
            }
            match calls.recv() {
                Ok(c) => take(c, &mut waiting, &mut groups),
                Err(_) => return,
            }
        }
        loop {
            match calls.try_recv() {
                Ok(c) => take(c, &mut waiting, &mut groups),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let gone = drop_abandoned(&mut batcher, &mut waiting, &mut running, &mut groups);
        if gone > 0 {
            // The gauges first: whoever sees the count sees the batch without them.
            m.metrics.running.set(batcher.len() as i64);
            m.metrics.waiting.set(waiting.len() as i64);
            m.metrics.requests.with_label_values(&["cancelled"]).inc_by(gone);
        }
        while let Some(w) = waiting.front() {
            let need = w.prompt.len() + w.params.max_new_tokens;
            if batcher.len() >= m.max_running
                || (!batcher.is_empty() && batcher.slots_if_added(need) > m.max_batch_tokens)
            {
                break;
            }
            let w = waiting.pop_front().expect("front exists");
            if !groups.contains_key(&w.group) {
                continue;
            }
            let id = next_sequence;
            next_sequence += 1;
            match batcher.add(id, w.prompt, w.params, m.adapter) {
                Ok(()) => {
                    running.insert(id, Running { group: w.group, index: w.index });
                }
                Err(e) => {
                    // Its other choices leave with it (`drop_abandoned`).
                    let g = groups.remove(&w.group).expect("checked above");
                    g.reply
                        .fail(ApiError::bad(format!("the request cannot start: {e}")), &m.metrics);
                }
            }
        }
        m.metrics.running.set(batcher.len() as i64);
        m.metrics.waiting.set(waiting.len() as i64);
        if batcher.is_empty() {
            continue;
        }
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| batcher.step()))
            .unwrap_or_else(|p| {
                Err(comas_model::ModelError::Input(format!(
                    "the decode step panicked: {}",
                    comas_service::panic_message(p.as_ref())
                )))
            });
        match step {
            Ok(done) => {
                for (id, c) in done {
                    let Some(run) = running.remove(&id) else { continue };
                    let Some(g) = groups.get_mut(&run.group) else { continue };
                    let answer = m.answer(g, &c);
                    if let Answer::Stream(s) = &g.reply {
                        s.finish_choice(run.index, &answer);
                    }
                    g.done[run.index] = Some(answer);
                    g.left -= 1;
                    if g.left == 0 {
                        let g = groups.remove(&run.group).expect("present above");
                        m.complete(g);
                    }
                }
                for (id, out) in batcher.outputs() {
                    let Some(run) = running.get(&id) else { continue };
                    if let Some(Group { reply: Answer::Stream(s), .. }) = groups.get_mut(&run.group)
                    {
                        s.progress(run.index, out, m);
                    }
                }
            }
            Err(e) => {
                // A failed step poisons its batch: every request in it fails (its choices
                // waiting for room leave with it), the server goes on.
                tracing::error!(error = %e, "decode step failed");
                for (_, run) in running.drain() {
                    if let Some(g) = groups.remove(&run.group) {
                        let e = ApiError {
                            status: StatusCode::INTERNAL_SERVER_ERROR,
                            message: format!("decode failed: {e}"),
                        };
                        g.reply.fail(e, &m.metrics);
                    }
                }
                waiting.retain(|w| groups.contains_key(&w.group));
                batcher = new_batcher();
            }
        }
        m.metrics.running.set(batcher.len() as i64);
    }
}

/// Takes out every request whose client has gone, and every choice whose request is gone
/// (gone, or failed with a choice that could not start): waiting ones leave the queue, running
/// ones the batch, which frees their cache room now. Returns how many requests had gone.
fn drop_abandoned(
    batcher: &mut Batcher,
    waiting: &mut VecDeque<Waiting>,
    running: &mut HashMap<u64, Running>,
    groups: &mut HashMap<u64, Group>,
) -> u64 {
    let before = groups.len();
    groups.retain(|_, g| !g.reply.is_closed());
    let gone = (before - groups.len()) as u64;
    waiting.retain(|w| groups.contains_key(&w.group));
    let orphans: Vec<u64> =
        running.iter().filter(|(_, r)| !groups.contains_key(&r.group)).map(|(&id, _)| id).collect();
    for id in orphans {
        running.remove(&id);
        if let Err(e) = batcher.abort(id) {
            tracing::warn!(error = %e, sequence = id, "could not take an abandoned request out of the batch");
        }
    }
    gone
}
