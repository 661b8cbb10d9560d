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
#[derive(Clone)]
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

/// A finished sequence (one choice), before it takes its API's shape.
pub(super) struct Answered {
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

/// The usage of a request's choices: the prompt once, every choice's tokens.
pub(super) fn usage_of(choices: &[Answered]) -> Usage {
    let prompt = choices.first().map_or(0, |a| a.usage.prompt_tokens);
    let generated = choices.iter().map(|a| a.usage.completion_tokens).sum::<u64>();
    Usage { prompt_tokens: prompt, completion_tokens: generated, total_tokens: prompt + generated }
}

/// The whole answer's JSON body: `choices[i]` is the request's choice i.
pub(super) fn whole(api: Api, head: Head, choices: Vec<Answered>) -> String {
    let usage = Some(usage_of(&choices));
    let indexed = (0u32..).zip(choices);
    let json = match api {
        Api::Chat => serde_json::to_string(&ChatResponse {
            id: head.id,
            object: "chat.completion".into(),
            created: head.created,
            model: head.model,
            choices: indexed
                .map(|(index, a)| Choice {
                    index,
                    message: Message { role: "assistant".into(), content: a.text },
                    finish_reason: Some(a.finish.into()),
                    logprobs: a.tokens.as_deref().map(chat_logprobs),
                })
                .collect(),
            usage,
        }),
        Api::Text => serde_json::to_string(&CompletionResponse {
            id: head.id,
            object: "text_completion".into(),
            created: head.created,
            model: head.model,
            choices: indexed
                .map(|(index, a)| CompletionChoice {
                    index,
                    text: a.text,
                    logprobs: a.tokens.as_deref().map(|t| text_logprobs(t, 0)),
                    finish_reason: Some(a.finish.into()),
                })
                .collect(),
            usage,
        }),
    };
    json.unwrap_or_default()
}

/// What one chunk of a streamed answer adds to one choice.
pub(super) struct Piece<'a> {
    pub index: u32,
    pub text: Option<String>,
    /// The tokens the text came from, when log-probabilities were asked, and the characters
    /// of the tokens' texts sent before them.
    pub tokens: Option<(&'a [Token], u32)>,
    pub finish: Option<&'static str>,
}

/// A chunk of a streamed answer's choice `p.index`.
pub(super) fn chunk(api: Api, head: &Head, p: Piece) -> String {
    let (index, finish_reason) = (p.index, p.finish.map(String::from));
    match api {
        Api::Chat => {
            let logprobs = p.tokens.map(|(t, _)| chat_logprobs(t));
            let delta = Delta { role: None, content: p.text };
            chat_chunk(head, vec![ChunkChoice { index, delta, finish_reason, logprobs }], None)
        }
        Api::Text => {
            let logprobs = p.tokens.map(|(t, offset)| text_logprobs(t, offset));
            let text = p.text.unwrap_or_default();
            text_chunk(head, vec![CompletionChoice { index, text, logprobs, finish_reason }], None)
        }
    }
}

/// A chat choice's first chunk: the role, no text yet.
pub(super) fn role_chunk(head: &Head, index: u32) -> String {
    let delta = Delta { role: Some("assistant".into()), content: Some(String::new()) };
    let choice = ChunkChoice { index, delta, finish_reason: None, logprobs: None };
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
