//! `comas serve`: one model folder behind OpenAI-compatible chat and text completion endpoints,
//! with continuous batching. A job's frozen model (a MAPPA coach, an evaluation team member) can then
//! live on its own machine, and any OpenAI client can talk to a trained agent.
//!
//! The HTTP side parses and answers; one thread owns the model (tensors never leave it),
//! tokenizes each request, admits it into the batch when the token budget allows and answers
//! it when its sequence finishes. A request whose client has gone (its connection closed, so
//! its handler and the receiving end of its reply were dropped) leaves the batch at the next
//! step instead of generating for no one. With `stream = true` the answer comes as server-sent
//! events, a chunk as text comes (`stream.rs`). Both APIs' shapes are made in `wire.rs`.
mod model_loop;
mod stream;
mod wire;

use crate::model_args::ModelArgs;
use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::sse::Sse;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use comas_model::{CausalLm, LoraAdapter, Tokenizer};
use comas_service::openai::{
    ChatRequest, CompletionRequest, ErrorBody, ErrorDetail, Sampling, Usage, REQUEST_BYTES,
};
use model_loop::{serve_model, ModelLoop};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use stream::StreamEvent;
use tokio::sync::oneshot;
use tokio_stream::StreamExt;

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
    /// API key that requests to the completion and model routes must carry (`Authorization:
    /// Bearer KEY`, what OpenAI clients send); /health and /metrics stay open. Prefer the
    /// environment variable: a flag's value shows in the process list.
    #[arg(long, env = "COMAS_SERVE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
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

    /// OpenAI's error type.
    fn kind(&self) -> &'static str {
        if self.status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        }
    }

    /// The request's outcome, for `comas_serve_requests_total`.
    fn outcome(&self) -> &'static str {
        if self.status.is_server_error() {
            "failed"
        } else {
            "refused"
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            ErrorBody { error: ErrorDetail { kind: self.kind().into(), message: self.message } };
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&body).unwrap_or_default(),
        )
            .into_response()
    }
}

struct Call {
    request: Request,
    reply: ReplyTo,
}

/// A request of either API.
enum Request {
    Chat(ChatRequest),
    Text(CompletionRequest),
}

impl Request {
    fn parse(api: wire::Api, body: &[u8]) -> Result<Self, serde_json::Error> {
        Ok(match api {
            wire::Api::Chat => Request::Chat(serde_json::from_slice(body)?),
            wire::Api::Text => Request::Text(serde_json::from_slice(body)?),
        })
    }

    fn model(&self) -> &str {
        match self {
            Request::Chat(r) => &r.model,
            Request::Text(r) => &r.model,
        }
    }

    fn sampling(&self) -> &Sampling {
        match self {
            Request::Chat(r) => &r.sampling,
            Request::Text(r) => &r.sampling,
        }
    }
}

/// An unstreamed answer: its JSON body, and its usage for the metrics.
struct Whole {
    body: String,
    usage: Usage,
}

/// Where the HTTP side waits for a request's answer.
enum ReplyTo {
    Whole(oneshot::Sender<Result<Whole, ApiError>>),
    /// Unbounded: the model thread never waits on a slow client (an answer is at most its
    /// max_tokens' text, and a client that has gone is dropped at the next step).
    Stream(tokio::sync::mpsc::UnboundedSender<StreamEvent>),
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
            Opts::new(
                "comas_serve_requests_total",
                "requests by outcome: answered, refused, failed, cancelled, unauthorized",
            ),
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
            "sequences in the batch, prefilling or decoding (a request's choices count each)",
        )
        .expect("valid metric");
        let waiting = IntGauge::new(
            "comas_serve_waiting_requests",
            "sequences of admitted requests waiting for room in the batch (a choice each)",
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
    api_key: Option<String>,
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
    if a.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        anyhow::bail!("--api-key is empty: give the key clients must send, or leave it out");
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
    let state =
        Arc::new(Served { name: name.clone(), api_key: a.api_key, calls, metrics: served_metrics });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(complete))
        .route("/completions", post(complete))
        .route("/v1/models", get(models))
        // The routes above, not the probes and the scrape below.
        .route_layer(axum::middleware::from_fn_with_state(Arc::clone(&state), require_key))
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

/// With `--api-key`, a request without it is refused (401) before it is read.
async fn require_key(
    State(s): State<Arc<Served>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use subtle::ConstantTimeEq;
    let Some(key) = &s.api_key else { return next.run(request).await };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let message = match given {
        Some(g) if bool::from(g.as_bytes().ct_eq(key.as_bytes())) => {
            return next.run(request).await
        }
        Some(_) => "the API key is not this server's",
        None => "this server needs an API key: send it as `Authorization: Bearer KEY`",
    };
    s.metrics.requests.with_label_values(&["unauthorized"]).inc();
    ApiError { status: StatusCode::UNAUTHORIZED, message: message.into() }.into_response()
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
        "no {method} {}: this server answers POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health and GET /metrics",
        uri.path()
    );
    ApiError { status, message }.into_response()
}

async fn chat(State(s): State<Arc<Served>>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(s, wire::Api::Chat, body).await
}

async fn complete(State(s): State<Arc<Served>>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(s, wire::Api::Text, body).await
}

async fn answer(s: Arc<Served>, api: wire::Api, body: Result<Bytes, BytesRejection>) -> Response {
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
    let request = match Request::parse(api, &body) {
        Ok(r) => r,
        Err(e) => {
            s.metrics.requests.with_label_values(&["refused"]).inc();
            let what = match api {
                wire::Api::Chat => "a chat completion",
                wire::Api::Text => "a completion",
            };
            return ApiError::bad(format!("the body is not {what} request: {e}")).into_response();
        }
    };
    if !request.model().is_empty() && request.model() != s.name {
        s.metrics.requests.with_label_values(&["refused"]).inc();
        let e = ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "model {:?} is not served here; this server serves {:?}",
                request.model(),
                s.name
            ),
        };
        return e.into_response();
    }
    if request.sampling().stream == Some(true) {
        return streamed(s, request).await;
    }
    let (reply, answer) = oneshot::channel();
    if s.calls.send(Call { request, reply: ReplyTo::Whole(reply) }).is_err() {
        return stopped();
    }
    match answer.await {
        Ok(Ok(Whole { body, usage })) => {
            s.metrics.requests.with_label_values(&["answered"]).inc();
            s.metrics.prompt_tokens.inc_by(usage.prompt_tokens);
            s.metrics.completion_tokens.inc_by(usage.completion_tokens);
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Ok(Err(e)) => {
            s.metrics.requests.with_label_values(&[e.outcome()]).inc();
            e.into_response()
        }
        Err(_) => stopped_answering(),
    }
}

/// A streamed answer: refused with a status like any request until the model thread has taken
/// it, then server-sent events; from there the model thread counts its outcome.
async fn streamed(s: Arc<Served>, request: Request) -> Response {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    if s.calls.send(Call { request, reply: ReplyTo::Stream(tx) }).is_err() {
        return stopped();
    }
    match rx.recv().await {
        Some(StreamEvent::Started) => {
            let events = tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
                .map(|e| Ok::<_, std::convert::Infallible>(e.into_sse()));
            Sse::new(events).into_response()
        }
        Some(StreamEvent::Failed(e)) => {
            s.metrics.requests.with_label_values(&[e.outcome()]).inc();
            e.into_response()
        }
        Some(StreamEvent::Data(_) | StreamEvent::Done) | None => stopped_answering(),
    }
}

fn stopped() -> Response {
    let message = "the model thread has stopped".into();
    ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message }.into_response()
}

fn stopped_answering() -> Response {
    let message = "the model thread stopped before answering".into();
    ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, message }.into_response()
}

async fn models(State(s): State<Arc<Served>>) -> Response {
    let body = serde_json::json!({"object": "list", "data": [{"id": s.name, "object": "model", "owned_by": "comas"}]});
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn metrics(State(s): State<Arc<Served>>) -> String {
    comas_service::prom::render(&s.metrics.registry)
}
