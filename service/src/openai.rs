//! The OpenAI chat-completions wire format, the part comas speaks, and a small HTTP/1.1 client
//! for it: how rollout workers reach a frozen model served elsewhere (a coach behind vLLM, TGI
//! or `comas serve`), and what `comas serve` answers. `https://` endpoints are verified against
//! the system's CA bundle (`SSL_CERT_FILE`, else the usual paths) and `COMAS_TLS_CA`.
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use thiserror::Error;

/// Tries per endpoint call by default (spec mappa.md §4: `coach_max_attempts`).
pub const DEFAULT_ATTEMPTS: u32 = 8;
/// Largest response body read from an endpoint (a chat completion is a few KiB).
pub const RESPONSE_BYTES: usize = 8 << 20;
/// Largest request body `comas serve` reads.
pub const REQUEST_BYTES: usize = 4 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    /// Text. `null` in some servers' replies (a refusal, a tool call) reads as empty; a list of
    /// content parts (OpenAI's newer form) reads as its text parts joined by newlines, and a
    /// part that is not text (an image, audio) is an error naming its type.
    #[serde(default, deserialize_with = "content_text")]
    pub content: String,
}

/// What `content` may be on the wire.
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

fn content_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let parts = match Option::<Content>::deserialize(d)? {
        None => return Ok(String::new()),
        Some(Content::Text(t)) => return Ok(t),
        Some(Content::Parts(p)) => p,
    };
    let mut texts = Vec::with_capacity(parts.len());
    for p in parts {
        match (p.kind.as_str(), p.text) {
            ("text", Some(t)) => texts.push(t),
            ("text", None) => {
                return Err(serde::de::Error::custom("a text content part has no `text`"))
            }
            (other, _) => {
                return Err(serde::de::Error::custom(format!(
                    "content parts of type `{other}` are not supported: only text"
                )))
            }
        }
    }
    Ok(texts.join("\n"))
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn strings(&self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        }
    }
}

/// What chat and text completions ask of sampling, under OpenAI's (and vLLM's) names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Not in OpenAI's API; vLLM and `comas serve` take it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Not in OpenAI's API: vLLM's and `comas serve`'s least number of new tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Whether the answer comes as server-sent events, a chunk each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// comas's own extension (a guided tail, see `comas_model::guide`): only `comas serve`
    /// knows it, so it is sent only when a turn asks for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_suffix: Option<String>,
}

impl Sampling {
    /// The completion budget, under either name.
    pub fn max_new_tokens(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
    }
}

/// A `POST /chat/completions` body. Fields comas does not use are refused by `comas serve`
/// only where ignoring them would change the answer ([`unsupported`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// Empty: whatever the server serves (`comas serve` serves one model).
    #[serde(default)]
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(flatten)]
    pub sampling: Sampling,
    /// Whether each chosen token's log-probability comes back (`Choice::logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// Every other field, kept so that a server can tell which of them it would ignore.
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// A `POST /completions` body: a raw prompt, no chat template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: String,
    pub prompt: Prompt,
    #[serde(flatten)]
    pub sampling: Sampling,
    /// How many most likely alternatives to give with each token's log-probability (0: the
    /// chosen token's alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Whether the prompt comes back before the completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    /// Text after the completion (insertion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// A completion's prompt: text, or token ids; OpenAI's API also takes a list of either, one
/// completion each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<i64>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<i64>>),
}

/// How a streamed answer is sent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// A last chunk with the usage and no choices, before `[DONE]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
}

/// Fields of OpenAI's API (and vLLM's) that change the answer, with the values that leave it
/// as it is: a server that does not apply them refuses any other value rather than ignore it.
const ANSWER_CHANGING: [(&str, &[&str]); 14] = [
    ("presence_penalty", &["0", "0.0"]),
    ("frequency_penalty", &["0", "0.0"]),
    ("repetition_penalty", &["1", "1.0"]),
    ("logit_bias", &["{}"]),
    ("top_logprobs", &["0"]),
    ("tools", &["[]"]),
    ("functions", &["[]"]),
    ("tool_choice", &["\"none\"", "\"auto\""]),
    ("function_call", &["\"none\"", "\"auto\""]),
    ("response_format", &[r#"{"type":"text"}"#]),
    ("best_of", &["1"]),
    ("use_beam_search", &["false"]),
    ("min_p", &["0", "0.0"]),
    ("ignore_eos", &["false"]),
];

/// Why a server that applies none of [`ANSWER_CHANGING`] cannot answer a request whose
/// fields it does not know are `other` as asked: the first such field set to a value that would
/// change the answer (`null` never does). `None` when there is none.
pub fn unsupported(other: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    ANSWER_CHANGING.iter().find_map(|(name, neutral)| {
        let v = other.get(*name).filter(|v| !v.is_null())?;
        let text = v.to_string();
        (!neutral.contains(&text.as_str())).then(|| {
            format!("{name} = {text} is not supported here, and ignoring it would change the answer; leave it out")
        })
    })
}

/// The log-probabilities of a choice's tokens, in OpenAI's shape.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChoiceLogprobs {
    pub content: Vec<TokenLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token's text (bytes that are not whole UTF-8 characters show as U+FFFD).
    pub token: String,
    pub logprob: f32,
    /// The token's bytes.
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
    /// Always empty: alternatives are not returned (`top_logprobs` is refused).
    #[serde(default)]
    pub top_logprobs: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub index: u32,
    pub message: Message,
    /// "stop" or "length".
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// With `logprobs = true` in the request.
    #[serde(default)]
    pub logprobs: Option<ChoiceLogprobs>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<Choice>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// One server-sent event of a streamed chat completion: a choice's text and tokens since its
/// last one.
/// Every chunk of an answer has the same `id` and `created`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChunk {
    pub id: String,
    /// "chat.completion.chunk".
    pub object: String,
    pub created: u64,
    pub model: String,
    /// One choice (`index` says which of the request's `n`); none in the chunk that carries
    /// the usage, the last.
    pub choices: Vec<ChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    /// Set in the choice's last chunk: "stop" or "length".
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// With `logprobs = true`: the tokens this chunk's text came from.
    #[serde(default)]
    pub logprobs: Option<ChoiceLogprobs>,
}

/// What a chunk adds to the message: the role in the first chunk, text after it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// A text completion, whole (`object: "text_completion"`) or one chunk of a streamed one (the
/// same shape, the text since the last chunk).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    /// With `logprobs` in the request.
    #[serde(default)]
    pub logprobs: Option<TextLogprobs>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// The log-probabilities of a text completion's tokens, one list per field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TextLogprobs {
    /// Each token's text (bytes that are not whole UTF-8 characters show as U+FFFD).
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    /// Always null: alternatives are not given (`logprobs` above 0 is refused).
    #[serde(default)]
    pub top_logprobs: Option<Vec<serde_json::Value>>,
    /// Where each token's text starts in the completion's text, in characters.
    pub text_offset: Vec<u32>,
}

/// An error body: `{"error": {"message": …, "type": …}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum CallError {
    #[error("endpoint URL {url:?}: {why}")]
    BadUrl { url: String, why: String },
    #[error("cannot reach {0}")]
    Connect(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("HTTP {code}: {message}")]
    Status { code: u16, message: String },
    #[error("the reply cannot be read: {0}")]
    Malformed(String),
}

impl CallError {
    /// Worth another try: the server was away, slow, busy or failed inside.
    pub fn retryable(&self) -> bool {
        match self {
            CallError::Connect(_) | CallError::Timeout(_) => true,
            CallError::Status { code, .. } => *code == 408 || *code == 429 || *code >= 500,
            CallError::BadUrl { .. } | CallError::Malformed(_) => false,
        }
    }

    /// A short stable name, for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CallError::BadUrl { .. } => "bad_url",
            CallError::Connect(_) => "connect",
            CallError::Timeout(_) => "timeout",
            CallError::Status { code, .. } if *code >= 500 => "server_error",
            CallError::Status { code: 429, .. } => "rate_limited",
            CallError::Status { .. } => "refused",
            CallError::Malformed(_) => "malformed",
        }
    }
}

/// An OpenAI-compatible server: `http://host[:port][/prefix]`, the prefix being where
/// `/chat/completions` lives (vLLM and OpenAI: `/v1`).
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    authority: String,
    host: String,
    port: u16,
    /// The URL's path without its trailing `/` (`/v1`, or empty).
    prefix: String,
    api_key: Option<String>,
    /// `https://`: the CA bundle to verify the server with (`None`: plain http).
    tls: Option<Roots>,
}

/// Where an https endpoint's trusted CAs come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Roots {
    /// `SSL_CERT_FILE` or the first system bundle found, plus `COMAS_TLS_CA` if set.
    System,
    /// This file alone.
    File(std::path::PathBuf),
}

/// System CA bundles, in the order looked for (Debian/Ubuntu/Alpine, Fedora/RHEL, others).
const SYSTEM_BUNDLES: [&str; 3] =
    ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"];

impl Roots {
    fn files(&self) -> Result<Vec<std::path::PathBuf>, CallError> {
        match self {
            Roots::File(p) => Ok(vec![p.clone()]),
            Roots::System => {
                let env = |k: &str| {
                    std::env::var_os(k).filter(|v| !v.is_empty()).map(std::path::PathBuf::from)
                };
                let system = env("SSL_CERT_FILE").or_else(|| {
                    SYSTEM_BUNDLES.iter().map(std::path::PathBuf::from).find(|p| p.is_file())
                });
                let files: Vec<_> = system.into_iter().chain(env("COMAS_TLS_CA")).collect();
                if files.is_empty() {
                    return Err(CallError::Connect(format!(
                        "no CA bundle to verify https endpoints with: none of {} exists; set SSL_CERT_FILE",
                        SYSTEM_BUNDLES.join(", ")
                    )));
                }
                Ok(files)
            }
        }
    }

    /// A client set-up for these roots, made once per process.
    fn config(&self) -> Result<std::sync::Arc<rustls::ClientConfig>, CallError> {
        static MADE: std::sync::Mutex<Vec<(Roots, std::sync::Arc<rustls::ClientConfig>)>> =
            std::sync::Mutex::new(Vec::new());
        let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, c)) = made.iter().find(|(r, _)| r == self) {
            return Ok(std::sync::Arc::clone(c));
        }
        let mut store = rustls::RootCertStore::empty();
        for f in self.files()? {
            let pem = std::fs::read(&f)
                .map_err(|e| CallError::Connect(format!("{}: {e}", f.display())))?;
            use rustls::pki_types::pem::PemObject;
            for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
                let c = c.map_err(|e| CallError::Connect(format!("{}: {e}", f.display())))?;
                // A bundle may hold certificates webpki cannot use; the others still count.
                let _ = store.add(c);
            }
        }
        if store.is_empty() {
            return Err(CallError::Connect(
                "the CA bundle for https endpoints holds no usable certificate".into(),
            ));
        }
        let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| CallError::Connect(e.to_string()))?
        .with_root_certificates(store)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = std::sync::Arc::new(config);
        made.push((self.clone(), std::sync::Arc::clone(&config)));
        Ok(config)
    }
}

impl Endpoint {
    pub fn parse(url: &str, api_key: Option<String>) -> Result<Self, CallError> {
        let bad = |why: &str| CallError::BadUrl { url: url.to_string(), why: why.to_string() };
        let uri: hyper::Uri =
            url.parse().map_err(|e: hyper::http::uri::InvalidUri| bad(&e.to_string()))?;
        let (tls, default_port) = match uri.scheme_str() {
            Some("http") => (None, 80),
            Some("https") => (Some(Roots::System), 443),
            _ => return Err(bad("give an http:// or https:// URL, e.g. http://judge:8000/v1")),
        };
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_string();
        let prefix = uri.path().trim_end_matches('/').to_string();
        Ok(Self {
            authority: authority.to_string(),
            host,
            port: authority.port_u16().unwrap_or(default_port),
            prefix,
            api_key,
            tls,
        })
    }

    /// An https endpoint verified against `ca` alone (a private CA) instead of the system's.
    pub fn with_ca(mut self, ca: std::path::PathBuf) -> Self {
        if self.tls.is_some() {
            self.tls = Some(Roots::File(ca));
        }
        self
    }

    /// `route` under the URL's prefix: `/completions` → `/v1/completions`.
    pub fn under(&self, route: &str) -> String {
        format!("{}{route}", self.prefix)
    }

    /// One chat completion, with `timeout` for all of it (connect, send, read).
    pub async fn chat(
        &self,
        request: &ChatRequest,
        timeout: Duration,
    ) -> Result<ChatResponse, CallError> {
        let r: ChatResponse =
            self.post_json(&self.under("/chat/completions"), request, timeout).await?;
        if r.choices.is_empty() {
            return Err(CallError::Malformed("no choices".into()));
        }
        Ok(r)
    }

    /// A JSON body posted to `path` (from the server's root) and the JSON answer read as `R`.
    pub async fn post_json<Q: Serialize, R: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        request: &Q,
        timeout: Duration,
    ) -> Result<R, CallError> {
        let body = serde_json::to_vec(request).map_err(|e| CallError::Malformed(e.to_string()))?;
        let bytes = self.call(hyper::Method::POST, path, Some(body), timeout).await?;
        serde_json::from_slice(&bytes).map_err(|e| CallError::Malformed(e.to_string()))
    }

    /// One request to `path` (from the server's root), with `timeout` for all of it (connect,
    /// send, read); a success's body, or the server's error message.
    pub async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        tokio::time::timeout(timeout, self.call_once(method, path, body))
            .await
            .map_err(|_| CallError::Timeout(timeout))?
    }

    async fn call_once(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes, CallError> {
        let connect = |e: std::io::Error| CallError::Connect(format!("{}: {e}", self.authority));
        let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(connect)?;
        match &self.tls {
            None => self.exchange(stream, method, path, body).await,
            Some(roots) => {
                let name = rustls::pki_types::ServerName::try_from(self.host.clone())
                    .map_err(|e| CallError::Connect(format!("{}: {e}", self.host)))?;
                let tls = tokio_rustls::TlsConnector::from(roots.config()?)
                    .connect(name, stream)
                    .await
                    .map_err(connect)?;
                self.exchange(tls, method, path, body).await
            }
        }
    }

    /// The request and its answer over a connection made for it.
    async fn exchange<IO>(
        &self,
        io: IO,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Bytes, CallError>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
                .await
                .map_err(|e| CallError::Connect(format!("{}: {e}", self.authority)))?;
        // The connection is driven beside the request and ends with it.
        let driver = tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::ACCEPT, "application/json");
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        if let Some(key) = &self.api_key {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| CallError::Malformed(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| CallError::Connect(format!("{}: {e}", self.authority)))?;
        let status = resp.status();
        let bytes = Limited::new(resp.into_body(), RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| {
                CallError::Malformed(format!(
                    "reading the body (at most {RESPONSE_BYTES} bytes): {e}"
                ))
            })?
            .to_bytes();
        driver.abort();
        if !status.is_success() {
            let message = match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(b) => b.error.message,
                Err(_) => String::from_utf8_lossy(&bytes[..bytes.len().min(500)]).into_owned(),
            };
            return Err(CallError::Status { code: status.as_u16(), message });
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_to_a_chat_completions_path() {
        let e = Endpoint::parse("http://judge:8000/v1/", None).unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.under("/chat/completions"), e.authority.as_str()),
            ("judge", 8000, "/v1/chat/completions".to_string(), "judge:8000")
        );
        let e = Endpoint::parse("http://127.0.0.1", Some("k".into())).unwrap();
        assert_eq!((e.port, e.under("/chat/completions")), (80, "/chat/completions".into()));
        let e = Endpoint::parse("https://api.openai.com/v1", None).unwrap();
        assert_eq!((e.port, e.tls.clone()), (443, Some(Roots::System)));
        assert!(Endpoint::parse("judge:8000", None).is_err());
    }

    /// An https endpoint signed by a private CA: answered when that CA is trusted, refused with
    /// the reason when it is not (the system bundle does not hold it).
    #[tokio::test]
    async fn an_https_endpoint_is_verified_against_its_ca() {
        use crate::tls::Authority;
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::new("endpoint CA").unwrap();
        let files = ca.write_local(dir.path()).unwrap();
        // An HTTP/1.1 server (the services' own TLS set-up offers only h2).
        let config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                crate::tls::certs(&files.cert).unwrap(),
                crate::tls::key(&files.key).unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let reply = r#"{"id":"x","object":"chat.completion","created":1,"model":"coach","choices":[{"index":0,"message":{"role":"assistant","content":"7"},"finish_reason":"stop"}]}"#;
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let Ok(mut tls) = acceptor.accept(tcp).await else { continue };
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                // The request's headers, then its body by Content-Length.
                while !String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
                    let n = tls.read(&mut buf).await.unwrap();
                    seen.extend_from_slice(&buf[..n]);
                }
                let text = String::from_utf8_lossy(&seen).to_string();
                let head = text.split("\r\n\r\n").next().unwrap().to_string();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap();
                while seen.len() < head.len() + 4 + length {
                    let n = tls.read(&mut buf).await.unwrap();
                    seen.extend_from_slice(&buf[..n]);
                }
                let answer = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}", reply.len());
                tls.write_all(answer.as_bytes()).await.unwrap();
                tls.flush().await.unwrap();
            }
        });
        let request = ChatRequest {
            model: "coach".into(),
            messages: vec![Message { role: "user".into(), content: "3 + 4?".into() }],
            ..ChatRequest::default()
        };
        let url = format!("https://localhost:{port}/v1");
        let e = Endpoint::parse(&url, Some("k".into())).unwrap().with_ca(files.ca.clone());
        let r = e.chat(&request, Duration::from_secs(10)).await.unwrap();
        assert_eq!(r.choices[0].message.content, "7");
        let other =
            Authority::new("another CA").unwrap().write_local(&dir.path().join("other")).unwrap();
        let err = Endpoint::parse(&url, None)
            .unwrap()
            .with_ca(other.ca)
            .chat(&request, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(matches!(&err, CallError::Connect(m) if m.contains("UnknownIssuer")), "{err}");
        assert!(err.retryable());
    }

    #[test]
    fn which_failures_are_retried() {
        assert!(CallError::Status { code: 503, message: String::new() }.retryable());
        assert!(CallError::Status { code: 429, message: String::new() }.retryable());
        assert!(!CallError::Status { code: 400, message: String::new() }.retryable());
        assert!(CallError::Connect("x".into()).retryable());
        assert!(!CallError::Malformed("x".into()).retryable());
        assert_eq!(
            CallError::Status { code: 429, message: String::new() }.reason(),
            "rate_limited"
        );
    }

    #[test]
    fn replies_with_null_content_and_either_stop_form_read() {
        let r: ChatResponse = serde_json::from_str(
            r#"{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null},"finish_reason":"stop"}]}"#,
        )
        .unwrap();
        assert_eq!(r.choices[0].message.content, "");
        let q: ChatRequest =
            serde_json::from_str(r#"{"model":"m","messages":[],"stop":"\n","max_tokens":5}"#)
                .unwrap();
        let s = &q.sampling;
        assert_eq!(
            (s.stop.as_ref().unwrap().strings(), s.max_new_tokens()),
            (vec!["\n".to_string()], Some(5))
        );
        assert!(q.other.is_empty(), "{:?}", q.other);
        let q: ChatRequest = serde_json::from_str(r#"{"model":"m","messages":[],"stop":["a","b"],"max_completion_tokens":7,"max_tokens":5}"#).unwrap();
        let s = &q.sampling;
        assert_eq!((s.stop.as_ref().unwrap().strings().len(), s.max_new_tokens()), (2, Some(7)));
    }

    #[test]
    fn a_completion_prompt_reads_in_each_of_its_four_forms() {
        let read = |prompt: &str| {
            serde_json::from_str::<CompletionRequest>(&format!(
                r#"{{"prompt":{prompt},"max_tokens":3,"logprobs":0,"echo":false,"user":"u"}}"#
            ))
            .unwrap()
        };
        assert_eq!(read(r#""a b""#).prompt, Prompt::Text("a b".into()));
        assert_eq!(read("[1, 2]").prompt, Prompt::Ids(vec![1, 2]));
        assert_eq!(read(r#"["a", "b"]"#).prompt, Prompt::Texts(vec!["a".into(), "b".into()]));
        assert_eq!(read("[[1], [2, 3]]").prompt, Prompt::IdLists(vec![vec![1], vec![2, 3]]));
        let r = read("[]");
        assert_eq!(r.prompt, Prompt::Ids(Vec::new()));
        assert_eq!((r.sampling.max_tokens, r.logprobs, r.echo), (Some(3), Some(0), Some(false)));
        assert_eq!(r.other.keys().collect::<Vec<_>>(), ["user"]);
    }

    #[test]
    fn content_parts_read_as_their_text_and_other_parts_are_named() {
        let m: Message = serde_json::from_str(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#,
        )
        .unwrap();
        assert_eq!(m.content, "a\nb");
        let err = serde_json::from_str::<Message>(
            r#"{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}"#,
        )
        .unwrap_err();
        assert!(err
            .to_string()
            .starts_with("content parts of type `input_audio` are not supported"));
        assert!(serde_json::from_str::<Message>(r#"{"role":"user","content":[{"type":"text"}]}"#)
            .is_err());
    }

    #[test]
    fn fields_that_would_change_the_answer_are_named_and_neutral_values_pass() {
        let read = |extra: &str| {
            serde_json::from_str::<ChatRequest>(&format!(r#"{{"messages":[]{extra}}}"#)).unwrap()
        };
        let unsupported = |r: ChatRequest| unsupported(&r.other);
        assert_eq!(unsupported(read("")), None);
        let neutral = r#","presence_penalty":0,"frequency_penalty":0.0,"logit_bias":{},"tools":[],"tool_choice":"auto","response_format":{"type":"text"},"top_logprobs":0,"best_of":1,"min_p":null,"user":"u","stream_options":{"include_usage":true}"#;
        let r = read(neutral);
        assert_eq!(unsupported(r.clone()), None);
        // The flattened sampling fields are read as such, not left among the others.
        assert_eq!(r.sampling.stream_options.unwrap().include_usage, Some(true));
        assert!(!r.other.contains_key("stream_options"), "{:?}", r.other);
        for (extra, named) in [
            (r#","frequency_penalty":0.1"#, "frequency_penalty = 0.1"),
            (r#","repetition_penalty":1.2"#, "repetition_penalty = 1.2"),
            (r#","tool_choice":"required""#, "tool_choice = \"required\""),
            (r#","ignore_eos":true"#, "ignore_eos = true"),
            (r#","best_of":3"#, "best_of = 3"),
        ] {
            let why = unsupported(read(extra)).unwrap_or_default();
            assert!(why.starts_with(named), "{extra}: {why}");
        }
        // What a client sends carries no field it did not set.
        let json = serde_json::to_string(&ChatRequest::default()).unwrap();
        assert_eq!(json, r#"{"model":"","messages":[]}"#);
    }
}
