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
    params: SamplingParams,
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

/// A request waiting for room in the batch.
struct Admitted<'t> {
    id: u64,
    asked: Asked,
    reply: Answer<'t>,
}

/// A request in the batch.
struct Running<'t> {
    api: Api,
    prompt: usize,
    logprobs: bool,
    reply: Answer<'t>,
}

impl<'a> ModelLoop<'a> {
    /// Checks common to both APIs: what a request's fields ask that this server does not do.
    fn refuse(
        s: &Sampling,
        other: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), ApiError> {
        if s.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad("n must be 1: one choice per request"));
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
        Ok(Asked { api, prompt, params, logprobs })
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

    /// A finished sequence: the text without the stop token or string.
    fn answer(&self, id: u64, run: &Running, c: &Completion) -> Answered {
        let (tok, prompt) = (self.tokenizer, run.prompt);
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
            head: Head::new(run.api, id, self.name),
            text,
            finish: match c.finish_reason {
                FinishReason::Stop => "stop",
                FinishReason::Length => "length",
            },
            tokens: run.logprobs.then(|| self.tokens(&c.token_ids, &c.logprobs)),
            usage: Usage {
                prompt_tokens: prompt as u64,
                completion_tokens: c.token_ids.len() as u64,
                total_tokens: (prompt + c.token_ids.len()) as u64,
            },
        }
    }

    /// A call checked and queued, or refused. A streamed answer starts now (its first event
    /// tells the HTTP side that the request was taken).
    fn take(&self, call: Call, id: u64, waiting: &mut VecDeque<Admitted<'a>>) {
        let asked = self.admit(&call.request);
        let reply = match call.reply {
            ReplyTo::Whole(tx) => Answer::Whole(tx),
            ReplyTo::Stream(tx) => {
                let sampling = match &call.request {
                    Request::Chat(r) => &r.sampling,
                    Request::Text(r) => &r.sampling,
                };
                let how = stream::Asked {
                    api: asked.as_ref().map_or(Api::Chat, |a| a.api),
                    stops: asked
                        .as_ref()
                        .map(|a| a.params.stop_strings.clone())
                        .unwrap_or_default(),
                    logprobs: asked.as_ref().is_ok_and(|a| a.logprobs),
                    include_usage: sampling
                        .stream_options
                        .as_ref()
                        .and_then(|o| o.include_usage)
                        .unwrap_or(false),
                };
                let head = Head::new(how.api, id, self.name);
                Answer::Stream(Box::new(Streamed::new(tx, head, self.tokenizer, how)))
            }
        };
        match asked {
            Ok(asked) => {
                let mut reply = reply;
                if let Answer::Stream(s) = &mut reply {
                    s.start();
                }
                waiting.push_back(Admitted { id, asked, reply });
            }
            Err(e) => reply.fail(e, &self.metrics),
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
    let mut waiting: VecDeque<Admitted<'a>> = VecDeque::new();
    let mut running: HashMap<u64, Running<'a>> = HashMap::new();
    let mut next_id = 0u64;
    let mut open = true;
    loop {
        let mut take = |call: Call, waiting: &mut VecDeque<Admitted<'a>>| {
            m.take(call, next_id, waiting);
            next_id += 1;
        };
        if batcher.is_empty() && waiting.is_empty() {
            if !open {
                return;
            }
            match calls.recv() {
                Ok(c) => take(c, &mut waiting),
                Err(_) => return,
            }
        }
        loop {
            match calls.try_recv() {
                Ok(c) => take(c, &mut waiting),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let gone = drop_abandoned(&mut batcher, &mut waiting, &mut running);
        if gone > 0 {
            m.metrics.requests.with_label_values(&["cancelled"]).inc_by(gone);
        }
        while let Some(w) = waiting.front() {
            let need = w.asked.prompt.len() + w.asked.params.max_new_tokens;
            if batcher.len() >= m.max_running
                || (!batcher.is_empty() && batcher.slots_if_added(need) > m.max_batch_tokens)
            {
                break;
            }
            let Admitted { id, asked, reply } = waiting.pop_front().expect("front exists");
            let (api, prompt, logprobs) = (asked.api, asked.prompt.len(), asked.logprobs);
            match batcher.add(id, asked.prompt, asked.params, m.adapter) {
                Ok(()) => {
                    running.insert(id, Running { api, prompt, logprobs, reply });
                }
                Err(e) => {
                    reply.fail(ApiError::bad(format!("the request cannot start: {e}")), &m.metrics)
                }
            }
        }
        m.metrics.running.set(running.len() as i64);
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
                    let answer = m.answer(id, &run, &c);
                    match run.reply {
                        Answer::Whole(tx) => {
                            let usage = answer.usage.clone();
                            let _ =
                                tx.send(Ok(Whole { body: wire::whole(run.api, answer), usage }));
                        }
                        Answer::Stream(s) => s.finish(answer, &m.metrics),
                    }
                }
                for (id, out) in batcher.outputs() {
                    if let Some(Running { reply: Answer::Stream(s), .. }) = running.get_mut(&id) {
                        s.progress(out, m);
                    }
                }
            }
            Err(e) => {
                // A failed step poisons its batch: every sequence in it fails, the server goes on.
                tracing::error!(error = %e, "decode step failed");
                for (_, run) in running.drain() {
                    let e = ApiError {
                        status: StatusCode::INTERNAL_SERVER_ERROR,
                        message: format!("decode failed: {e}"),
                    };
                    run.reply.fail(e, &m.metrics);
                }
                batcher = new_batcher();
            }
        }
        m.metrics.running.set(running.len() as i64);
    }
}

/// Takes out every request whose client has gone: waiting ones leave the queue, running ones
/// the batch, which frees their cache room now. Returns how many there were.
fn drop_abandoned(
    batcher: &mut Batcher,
    waiting: &mut VecDeque<Admitted>,
    running: &mut HashMap<u64, Running>,
) -> u64 {
    let before = waiting.len() + running.len();
    waiting.retain(|w| !w.reply.is_closed());
    let gone: Vec<u64> =
        running.iter().filter(|(_, r)| r.reply.is_closed()).map(|(&id, _)| id).collect();
    for id in gone {
        running.remove(&id);
        if let Err(e) = batcher.abort(id) {
            tracing::warn!(error = %e, sequence = id, "could not take an abandoned request out of the batch");
        }
    }
    (before - waiting.len() - running.len()) as u64
}
