//! `comas serve`: one model folder behind an OpenAI-compatible chat-completions endpoint, with
//! continuous batching. A job's frozen model (a MAPPA coach, an evaluation team member) can then
//! live on its own machine, and any OpenAI client can talk to a trained agent.
//!
//! The HTTP side parses and answers; one thread owns the model (tensors never leave it),
//! tokenizes each request, admits it into the batch when the token budget allows and answers
//! it when its sequence finishes. A request whose client has gone (its connection closed, so
//! its handler and the receiving end of its reply were dropped) leaves the batch at the next
//! step instead of generating for no one.
use crate::model_args::ModelArgs;
use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use comas_model::{
    Batcher, CausalLm, ChatMessage, Completion, FinishReason, LoraAdapter, SamplingParams,
    Tokenizer,
};
use comas_service::openai::{
    ChatRequest, ChatResponse, Choice, ChoiceLogprobs, ErrorBody, ErrorDetail, Message,
    TokenLogprob, Usage, REQUEST_BYTES,
};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::oneshot;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// PEFT LoRA adapter folder to apply.
    #[arg(long, env = "COMAS_SERVE_ADAPTER")]
    adapter: Option<PathBuf>,
    /// Address to listen on (port 0: any free port; the address is printed on stdout).
    #[arg(long, env = "COMAS_SERVE_LISTEN", default_value = "127.0.0.1:8000")]
    listen: comas_service::Listen,
    /// The model name clients ask for (default: the model folder's name).
    #[arg(long, env = "COMAS_SERVE_NAME")]
    served_name: Option<String>,
    /// Most sequences decoding at once; more requests wait.
    #[arg(long, env = "COMAS_SERVE_MAX_RUNNING", default_value_t = 64)]
    max_running: usize,
    /// KV-cache slots: requests are admitted while their prompts and max_tokens fit; one that
    /// can never fit is refused.
    #[arg(long, env = "COMAS_SERVE_MAX_BATCH_TOKENS", default_value_t = 32768)]
    max_batch_tokens: usize,
}

/// An error answered in OpenAI's shape.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn bad(message: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind =
            if self.status.is_server_error() { "server_error" } else { "invalid_request_error" };
        let body = ErrorBody { error: ErrorDetail { message: self.message, kind: kind.into() } };
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&body).unwrap_or_default(),
        )
            .into_response()
    }
}

struct Call {
    request: ChatRequest,
    reply: oneshot::Sender<Result<ChatResponse, ApiError>>,
}

/// Counters and gauges share their values between clones: the HTTP side and the model thread
/// each hold one.
#[derive(Clone)]
struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    prompt_tokens: IntCounter,
    completion_tokens: IntCounter,
    running: IntGauge,
    waiting: IntGauge,
}

impl Metrics {
    fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("comas_serve_requests_total", "chat completion requests by outcome"),
            &["outcome"],
        )
        .expect("valid metric");
        let prompt_tokens = IntCounter::new(
            "comas_serve_prompt_tokens_total",
            "prompt tokens of answered requests",
        )
        .expect("valid metric");
        let completion_tokens = IntCounter::new(
            "comas_serve_completion_tokens_total",
            "tokens generated for answered requests",
        )
        .expect("valid metric");
        let running = IntGauge::new(
            "comas_serve_running_sequences",
            "requests in the batch (prefilling or decoding)",
        )
        .expect("valid metric");
        let waiting = IntGauge::new(
            "comas_serve_waiting_requests",
            "admitted requests waiting for room in the batch",
        )
        .expect("valid metric");
        Self {
            requests: comas_service::prom::registered(&registry, requests),
            prompt_tokens: comas_service::prom::registered(&registry, prompt_tokens),
            completion_tokens: comas_service::prom::registered(&registry, completion_tokens),
            running: comas_service::prom::registered(&registry, running),
            waiting: comas_service::prom::registered(&registry, waiting),
            registry,
        }
    }
}

struct Served {
    name: String,
    calls: mpsc::Sender<Call>,
    metrics: Metrics,
}

pub fn run(a: Args) -> Result<()> {
    if a.max_running == 0 {
        anyhow::bail!("--max-running must be at least 1");
    }
    if a.max_batch_tokens == 0 {
        anyhow::bail!("--max-batch-tokens must be at least 1");
    }
    if a.served_name.as_deref().is_some_and(|n| n.trim().is_empty()) {
        anyhow::bail!("--served-name is empty: give the name clients ask for, or leave it out");
    }
    let (_, kind, device) = a.model.resolve()?;
    let name = a.served_name.clone().unwrap_or_else(|| {
        a.model
            .model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let (calls, rx) = mpsc::channel::<Call>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
    let served_metrics = Metrics::new();
    let model_metrics = served_metrics.clone();
    let dir = a.model.model.clone();
    let (adapter_dir, served, max_running, max_batch_tokens) =
        (a.adapter.clone(), name.clone(), a.max_running, a.max_batch_tokens);
    let model_thread = std::thread::Builder::new().name("serve-model".into()).spawn(move || {
        let loaded = (|| -> Result<_> {
            let tokenizer = Tokenizer::from_dir(&dir)?;
            let model = CausalLm::load(&dir, kind, device)
                .with_context(|| format!("loading {}", dir.display()))?;
            model.pack_for_decode();
            tokenizer.check_fits(model.config())?;
            tokenizer.check_chat_template().with_context(|| {
                format!("{}: requests are rendered through the chat template", dir.display())
            })?;
            let adapter = match &adapter_dir {
                Some(d) => Some(
                    LoraAdapter::load(d, model.config(), kind, device)
                        .with_context(|| format!("loading adapter {}", d.display()))?,
                ),
                None => None,
            };
            Ok((tokenizer, model, adapter))
        })();
        match loaded {
            Ok((tokenizer, model, adapter)) => {
                let _ = ready_tx.send(Ok(()));
                serve_model(
                    &ModelLoop {
                        model: &model,
                        tokenizer: &tokenizer,
                        adapter: adapter.as_ref(),
                        name: &served,
                        max_running,
                        max_batch_tokens,
                        metrics: model_metrics,
                    },
                    rx,
                );
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        }
    })?;
    ready_rx.recv().context("the model thread stopped while loading")??;
    let state = Arc::new(Served { name: name.clone(), calls, metrics: served_metrics });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(REQUEST_BYTES))
        .with_state(state);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let listener = a.listen.bind().await?;
        // On stdout, so that a script that asked for port 0 learns the port.
        println!("comas serve: {name} at http://{}/v1", listener.local_addr()?);
        use std::io::Write;
        std::io::stdout().flush()?;
        axum::serve(listener, app).with_graceful_shutdown(comas_service::shutdown_signal()).await?;
        anyhow::Ok(())
    })?;
    drop(rt);
    // The HTTP side is gone, so is the last sender: the model thread finishes its batch and ends.
    let _ = model_thread.join();
    Ok(())
}

/// A path this server has no route for (404), in OpenAI's error shape as every other refusal.
async fn no_route(method: Method, uri: Uri) -> Response {
    route_error(StatusCode::NOT_FOUND, method, uri)
}

/// A method a route does not take (405).
async fn wrong_method(method: Method, uri: Uri) -> Response {
    route_error(StatusCode::METHOD_NOT_ALLOWED, method, uri)
}

fn route_error(status: StatusCode, method: Method, uri: Uri) -> Response {
    let message = format!(
        "no {method} {}: this server answers POST /v1/chat/completions, GET /v1/models, GET /health and GET /metrics",
        uri.path()
    );
    ApiError { status, message }.into_response()
}

async fn chat(State(s): State<Arc<Served>>, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            s.metrics.requests.with_label_values(&["refused"]).inc();
            let limit = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                format!(" (the limit is {} MiB)", REQUEST_BYTES >> 20)
            } else {
                String::new()
            };
            return ApiError { status: e.status(), message: format!("{}{limit}", e.body_text()) }
                .into_response();
        }
    };
    let request: ChatRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            s.metrics.requests.with_label_values(&["refused"]).inc();
            return ApiError::bad(format!("the body is not a chat completion request: {e}"))
                .into_response();
        }
    };
    if !request.model.is_empty() && request.model != s.name {
        s.metrics.requests.with_label_values(&["refused"]).inc();
        let e = ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "model {:?} is not served here; this server serves {:?}",
                request.model, s.name
            ),
        };
        return e.into_response();
    }
    let (reply, answer) = oneshot::channel();
    if s.calls.send(Call { request, reply }).is_err() {
        return ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the model thread has stopped".into(),
        }
        .into_response();
    }
    match answer.await {
        Ok(Ok(r)) => {
            s.metrics.requests.with_label_values(&["answered"]).inc();
            if let Some(u) = &r.usage {
                s.metrics.prompt_tokens.inc_by(u.prompt_tokens);
                s.metrics.completion_tokens.inc_by(u.completion_tokens);
            }
            (
                [(header::CONTENT_TYPE, "application/json")],
                serde_json::to_string(&r).unwrap_or_default(),
            )
                .into_response()
        }
        Ok(Err(e)) => {
            s.metrics
                .requests
                .with_label_values(&[if e.status.is_server_error() { "failed" } else { "refused" }])
                .inc();
            e.into_response()
        }
        Err(_) => ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "the model thread stopped before answering".into(),
        }
        .into_response(),
    }
}

async fn models(State(s): State<Arc<Served>>) -> Response {
    let body = serde_json::json!({"object": "list", "data": [{"id": s.name, "object": "model", "owned_by": "comas"}]});
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn metrics(State(s): State<Arc<Served>>) -> String {
    comas_service::prom::render(&s.metrics.registry)
}

struct ModelLoop<'a> {
    model: &'a CausalLm,
    tokenizer: &'a Tokenizer,
    adapter: Option<&'a LoraAdapter>,
    name: &'a str,
    max_running: usize,
    max_batch_tokens: usize,
    metrics: Metrics,
}

/// What a request asks of the model, tokenized and checked.
struct Asked {
    prompt: Vec<i64>,
    params: SamplingParams,
    /// Whether the answer carries each token's log-probability.
    logprobs: bool,
}

type Reply = oneshot::Sender<Result<ChatResponse, ApiError>>;

/// A request waiting for room in the batch.
struct Admitted {
    asked: Asked,
    reply: Reply,
}

/// A request in the batch.
struct Running {
    prompt: usize,
    logprobs: bool,
    reply: Reply,
}

impl ModelLoop<'_> {
    /// The prompt and sampling of a request, or why it cannot run here.
    fn admit(&self, r: &ChatRequest) -> Result<Asked, ApiError> {
        if r.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad("n must be 1: one choice per request"));
        }
        if r.stream == Some(true) {
            return Err(ApiError::bad("streaming is not supported; send stream = false"));
        }
        if let Some(why) = r.unsupported() {
            return Err(ApiError::bad(why));
        }
        if r.messages.is_empty() {
            return Err(ApiError::bad("messages is empty"));
        }
        if r.max_new_tokens() == Some(0) {
            return Err(ApiError::bad("max_tokens must be at least 1"));
        }
        let temperature = r.temperature.unwrap_or(1.0);
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(ApiError::bad(format!(
                "temperature must be finite and at least 0, got {temperature}"
            )));
        }
        let top_p = r.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::bad(format!("top_p must be in (0, 1], got {top_p}")));
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
        let context = self.model.config().max_position_embeddings.max(0) as usize;
        let room = context.saturating_sub(prompt.len());
        let max_new = r.max_new_tokens().map_or(room, |n| n as usize);
        // No max_tokens and a prompt that fills the context leaves nothing to generate.
        if prompt.len() + max_new > context || max_new == 0 {
            return Err(ApiError::bad(format!(
                "this model's context is {context} tokens, and the request asks for {} ({} in the messages, {max_new} to generate); shorten the messages or lower max_tokens",
                prompt.len() + max_new,
                prompt.len()
            )));
        }
        if prompt.len() + max_new > self.max_batch_tokens {
            return Err(ApiError::bad(format!(
                "the request needs {} tokens of KV cache ({} in the messages, {max_new} to generate), over this server's --max-batch-tokens {}",
                prompt.len() + max_new,
                prompt.len(),
                self.max_batch_tokens
            )));
        }
        let params = SamplingParams {
            temperature,
            top_k: r.top_k.unwrap_or(0) as usize,
            top_p,
            seed: r.seed.unwrap_or_else(rand::random),
            max_new_tokens: max_new,
            min_new_tokens: (r.min_tokens.unwrap_or(0) as usize).min(max_new),
            stop_token_ids: self.tokenizer.eos_token_ids().to_vec(),
            stop_strings: r.stop.as_ref().map(|s| s.strings()).unwrap_or_default(),
            guided_suffix: r.guided_suffix.clone(),
        };
        if r.logprobs == Some(true) {
            // Token bytes come from the guided-decoding tables, built on first use.
            self.tokenizer
                .guidance()
                .map_err(|e| ApiError::bad(format!("logprobs cannot be given: {e}")))?;
        }
        Ok(Asked { prompt, params, logprobs: r.logprobs == Some(true) })
    }

    /// Each generated token with its log-probability under softmax(logits / temperature) over
    /// the whole vocabulary (temperature 1 when greedy), the stop token included.
    fn logprobs(&self, c: &Completion) -> ChoiceLogprobs {
        let guidance = self.tokenizer.guidance().ok();
        let content = c
            .token_ids
            .iter()
            .zip(&c.logprobs)
            .map(|(&id, &logprob)| {
                let bytes = guidance.map(|g| g.token_bytes(id)).unwrap_or_default();
                TokenLogprob {
                    token: String::from_utf8_lossy(&bytes).into_owned(),
                    logprob,
                    bytes: Some(bytes),
                    top_logprobs: Vec::new(),
                }
            })
            .collect();
        ChoiceLogprobs { content }
    }

    /// A finished sequence as a chat completion: the text without the stop token or string.
    fn answer(&self, id: u64, run: &Running, c: &Completion) -> ChatResponse {
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
        let finish = match c.finish_reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        };
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        ChatResponse {
            id: format!("chatcmpl-{created}-{id}"),
            object: "chat.completion".into(),
            created,
            model: self.name.to_string(),
            choices: vec![Choice {
                index: 0,
                message: Message { role: "assistant".into(), content: text },
                finish_reason: Some(finish.into()),
                logprobs: run.logprobs.then(|| self.logprobs(c)),
            }],
            usage: Some(Usage {
                prompt_tokens: prompt as u64,
                completion_tokens: c.token_ids.len() as u64,
                total_tokens: (prompt + c.token_ids.len()) as u64,
            }),
        }
    }
}

/// The model thread: takes calls, keeps the batch full within its budget, answers as sequences
/// finish, and drops the requests whose clients have gone. Ends when every sender is gone and
/// the batch is empty.
fn serve_model(m: &ModelLoop, calls: mpsc::Receiver<Call>) {
    let new_batcher = || {
        let mut b = Batcher::new(m.model, Some(m.tokenizer));
        b.set_cache_limit(Some(m.max_batch_tokens));
        b
    };
    let mut batcher = new_batcher();
    let mut waiting: VecDeque<Admitted> = VecDeque::new();
    let mut running: HashMap<u64, Running> = HashMap::new();
    let mut next_id = 0u64;
    let mut open = true;
    loop {
        let take = |call: Call, waiting: &mut VecDeque<Admitted>| match m.admit(&call.request) {
            Ok(asked) => waiting.push_back(Admitted { asked, reply: call.reply }),
            Err(e) => {
                let _ = call.reply.send(Err(e));
            }
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
            let Admitted { asked, reply } = waiting.pop_front().expect("front exists");
            let id = next_id;
            next_id += 1;
            let (prompt, logprobs) = (asked.prompt.len(), asked.logprobs);
            match batcher.add(id, asked.prompt, asked.params, m.adapter) {
                Ok(()) => {
                    running.insert(id, Running { prompt, logprobs, reply });
                }
                Err(e) => {
                    let _ =
                        reply.send(Err(ApiError::bad(format!("the request cannot start: {e}"))));
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
                    if let Some(run) = running.remove(&id) {
                        let answer = m.answer(id, &run, &c);
                        let _ = run.reply.send(Ok(answer));
                    }
                }
            }
            Err(e) => {
                // A failed step poisons its batch: every sequence in it fails, the server goes on.
                tracing::error!(error = %e, "decode step failed");
                for (_, run) in running.drain() {
                    let _ = run.reply.send(Err(ApiError {
                        status: StatusCode::INTERNAL_SERVER_ERROR,
                        message: format!("decode failed: {e}"),
                    }));
                }
                batcher = new_batcher();
            }
        }
        m.metrics.running.set(running.len() as i64);
    }
}

/// Takes out every request whose client has gone (the receiving end of its reply is dropped
/// when its connection closes): waiting ones leave the queue, running ones the batch, which
/// frees their cache room now. Returns how many there were.
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
