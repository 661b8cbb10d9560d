//! What `comas serve` answers, in the shape of the API a request came through: a finished
//! sequence as a chat or a text completion, and the chunks of a streamed one. Every
//! conversion to the wire types is here.
use comas_service::openai::{
    ChatChunk, ChatResponse, Choice, ChoiceLogprobs, ChunkChoice, CompletionChoice,
    CompletionResponse, Delta, Message, TextLogprobs, TokenLogprob, Usage,
};

/// Which API a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Api {
    /// `/v1/chat/completions`: messages through the chat template.
    Chat,
    /// `/v1/completions`: a raw prompt.
    Text,
}

/// An answer's `id`, `created` and model, shared by every chunk of a streamed one.
pub(super) struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Head {
    pub(super) fn new(api: Api, sequence: u64, model: &str) -> Self {
        use std::time::{SystemTime, UNIX_EPOCH};
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let prefix = match api {
            Api::Chat => "chatcmpl",
            Api::Text => "cmpl",
        };
        Self { id: format!("{prefix}-{created}-{sequence}"), created, model: model.to_string() }
    }
}

/// A generated token's bytes and log-probability.
pub(super) struct Token {
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

impl Token {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// A finished sequence, before it takes its API's shape.
pub(super) struct Answered {
    pub head: Head,
    /// Without the stop token or string.
    pub text: String,
    /// "stop" or "length".
    pub finish: &'static str,
    /// Every generated token (the stop token included), when log-probabilities were asked.
    pub tokens: Option<Vec<Token>>,
    pub usage: Usage,
}

fn chat_logprobs(tokens: &[Token]) -> ChoiceLogprobs {
    let content = tokens
        .iter()
        .map(|t| TokenLogprob {
            token: t.text(),
            logprob: t.logprob,
            bytes: Some(t.bytes.clone()),
            top_logprobs: Vec::new(),
        })
        .collect();
    ChoiceLogprobs { content }
}

/// `offset`: characters of the tokens' texts before these (in earlier chunks).
fn text_logprobs(tokens: &[Token], offset: u32) -> TextLogprobs {
    let mut at = offset;
    let mut out = TextLogprobs::default();
    for t in tokens {
        let text = t.text();
        out.text_offset.push(at);
        at += text.chars().count() as u32;
        out.tokens.push(text);
        out.token_logprobs.push(t.logprob);
    }
    out
}

/// Characters the tokens' texts add to a text completion's `text_offset`.
pub(super) fn text_offset_of(tokens: &[Token]) -> u32 {
    tokens.iter().map(|t| t.text().chars().count() as u32).sum()
}

/// The whole answer's JSON body.
pub(super) fn whole(api: Api, a: Answered) -> String {
    let Answered { head, text, finish, tokens, usage } = a;
    let json = match api {
        Api::Chat => serde_json::to_string(&ChatResponse {
            id: head.id,
            object: "chat.completion".into(),
            created: head.created,
            model: head.model,
            choices: vec![Choice {
                index: 0,
                message: Message { role: "assistant".into(), content: text },
                finish_reason: Some(finish.into()),
                logprobs: tokens.as_deref().map(chat_logprobs),
            }],
            usage: Some(usage),
        }),
        Api::Text => serde_json::to_string(&CompletionResponse {
            id: head.id,
            object: "text_completion".into(),
            created: head.created,
            model: head.model,
            choices: vec![CompletionChoice {
                index: 0,
                text,
                logprobs: tokens.as_deref().map(|t| text_logprobs(t, 0)),
                finish_reason: Some(finish.into()),
            }],
            usage: Some(usage),
        }),
    };
    json.unwrap_or_default()
}

/// What one chunk of a streamed answer adds.
pub(super) struct Piece<'a> {
    pub text: Option<String>,
    /// The tokens the text came from, when log-probabilities were asked, and the characters
    /// of the tokens' texts sent before them.
    pub tokens: Option<(&'a [Token], u32)>,
    pub finish: Option<&'static str>,
}

/// A chunk of a streamed answer's one choice.
pub(super) fn chunk(api: Api, head: &Head, p: Piece) -> String {
    let finish_reason = p.finish.map(String::from);
    match api {
        Api::Chat => {
            let logprobs = p.tokens.map(|(t, _)| chat_logprobs(t));
            let delta = Delta { role: None, content: p.text };
            chat_chunk(head, vec![ChunkChoice { index: 0, delta, finish_reason, logprobs }], None)
        }
        Api::Text => {
            let logprobs = p.tokens.map(|(t, offset)| text_logprobs(t, offset));
            let text = p.text.unwrap_or_default();
            text_chunk(
                head,
                vec![CompletionChoice { index: 0, text, logprobs, finish_reason }],
                None,
            )
        }
    }
}

/// A chat answer's first chunk: the role, no text yet.
pub(super) fn role_chunk(head: &Head) -> String {
    let delta = Delta { role: Some("assistant".into()), content: Some(String::new()) };
    let choice = ChunkChoice { index: 0, delta, finish_reason: None, logprobs: None };
    chat_chunk(head, vec![choice], None)
}

/// The last chunk with `stream_options.include_usage`: the usage, no choice.
pub(super) fn usage_chunk(api: Api, head: &Head, usage: Usage) -> String {
    match api {
        Api::Chat => chat_chunk(head, Vec::new(), Some(usage)),
        Api::Text => text_chunk(head, Vec::new(), Some(usage)),
    }
}

fn chat_chunk(head: &Head, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> String {
    serde_json::to_string(&ChatChunk {
        id: head.id.clone(),
        object: "chat.completion.chunk".into(),
        created: head.created,
        model: head.model.clone(),
        choices,
        usage,
    })
    .unwrap_or_default()
}

fn text_chunk(head: &Head, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> String {
    serde_json::to_string(&CompletionResponse {
        id: head.id.clone(),
        object: "text_completion".into(),
        created: head.created,
        model: head.model.clone(),
        choices,
        usage,
    })
    .unwrap_or_default()
}
