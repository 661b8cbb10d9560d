//! Streamed answers (`stream = true`): a chunk of text as tokens come, as server-sent events.
//!
//! Invariant: the text sent is always a prefix of the whole answer (what `stream = false`
//! gives). Tokens are decoded piece by piece ([`TextStream`]: a character split over tokens
//! waits for its last byte), and text that could be the start of a stop string is held back
//! until it is known not to be one, since the answer ends before its stop string. So no text
//! is sent that the answer would not have, and when the sequence ends the rest of the answer
//! follows. Each chunk's log-probabilities are those of the tokens read since the last chunk,
//! so that they too join to the whole answer's.
use super::model_loop::ModelLoop;
use super::wire::{self, Answered, Api, Head, Piece};
use super::{ApiError, Metrics};
use axum::response::sse::Event;
use comas_model::tokenizer::TextStream;
use comas_model::{Completion, Tokenizer};
use comas_service::openai::{ErrorBody, ErrorDetail, Usage};
use tokio::sync::mpsc::UnboundedSender;

/// What the model thread sends the HTTP side of a streamed answer.
pub(super) enum StreamEvent {
    /// The request was taken: the HTTP side answers 200 and streams what follows.
    Started,
    /// One event's data: a chunk's JSON.
    Data(String),
    /// The request was refused (as the first event: answered with its status instead of a
    /// stream) or failed part-way.
    Failed(ApiError),
    /// The answer is complete.
    Done,
}

impl StreamEvent {
    /// As a server-sent event: a chunk, an error body, or `[DONE]`.
    pub(super) fn into_sse(self) -> Event {
        match self {
            StreamEvent::Started => Event::default().comment("started"),
            StreamEvent::Data(json) => Event::default().data(json),
            StreamEvent::Failed(e) => {
                let kind = e.kind().into();
                let body = ErrorBody { error: ErrorDetail { message: e.message, kind } };
                Event::default().data(serde_json::to_string(&body).unwrap_or_default())
            }
            StreamEvent::Done => Event::default().data("[DONE]"),
        }
    }
}

/// How a streamed answer is asked for.
pub(super) struct Asked {
    pub api: Api,
    /// Choices, each its own sequence.
    pub n: usize,
    pub stops: Vec<String>,
    pub logprobs: bool,
    pub include_usage: bool,
}

/// A streamed answer on the model thread: the channel to its HTTP side and each choice's text.
pub(super) struct Streamed<'t> {
    tx: UnboundedSender<StreamEvent>,
    head: Head,
    asked: Asked,
    /// Whether the request was taken: from then on its outcome is counted here, not by the
    /// HTTP side.
    started: bool,
    choices: Vec<ChoiceText<'t>>,
}

/// What one choice has sent.
struct ChoiceText<'t> {
    text: TextStream<'t>,
    /// Tokens read into `text`.
    read: usize,
    /// Text decoded and not sent: it may be the start of a stop string.
    held: String,
    sent: String,
    /// Tokens whose log-probabilities were sent, and the characters of their texts.
    logprobs_sent: usize,
    offset: u32,
    /// The tokenizer could not decode a piece: the rest comes whole with the last chunk.
    broken: bool,
}

impl<'t> Streamed<'t> {
    pub(super) fn new(
        tx: UnboundedSender<StreamEvent>,
        head: Head,
        tokenizer: &'t Tokenizer,
        asked: Asked,
    ) -> Self {
        let choices = (0..asked.n)
            .map(|_| ChoiceText {
                text: tokenizer.text_stream(true),
                read: 0,
                held: String::new(),
                sent: String::new(),
                logprobs_sent: 0,
                offset: 0,
                broken: false,
            })
            .collect();
        Self { tx, head, asked, started: false, choices }
    }

    pub(super) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    fn send(&self, event: StreamEvent) {
        // A client that has gone is noticed before the next step (`is_closed`).
        let _ = self.tx.send(event);
    }

    /// The request was taken; in a chat answer each choice's first chunk gives the role.
    pub(super) fn start(&mut self) {
        self.send(StreamEvent::Started);
        if self.asked.api == Api::Chat {
            for index in 0..self.asked.n as u32 {
                self.send(StreamEvent::Data(wire::role_chunk(&self.head, index)));
            }
        }
        self.started = true;
    }

    /// After a step: the text of the tokens choice `index` generated since its last chunk,
    /// less what may be the start of a stop string.
    pub(super) fn progress(&mut self, index: usize, out: &Completion, m: &ModelLoop) {
        let Some(c) = self.choices.get_mut(index) else { return };
        if c.broken {
            return;
        }
        for &id in &out.token_ids[c.read.min(out.token_ids.len())..] {
            match c.text.push(id) {
                Ok(Some(piece)) => c.held.push_str(&piece),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, answer = %self.head.id, index, "a streamed piece cannot be decoded; the rest comes at the end");
                    c.broken = true;
                    return;
                }
            }
        }
        c.read = out.token_ids.len();
        let n = sendable(&c.held, &self.asked.stops);
        if n == 0 {
            return;
        }
        let text: String = c.held.drain(..n).collect();
        c.sent.push_str(&text);
        let from = c.logprobs_sent;
        let tokens =
            self.asked.logprobs.then(|| m.tokens(&out.token_ids[from..], &out.logprobs[from..]));
        c.logprobs_sent = out.token_ids.len();
        let offset = c.offset;
        if let Some(t) = &tokens {
            c.offset += wire::text_offset_of(t);
        }
        let tokens = tokens.as_deref().map(|t| (t, offset));
        let piece = Piece { index: index as u32, text: Some(text), tokens, finish: None };
        self.send(StreamEvent::Data(wire::chunk(self.asked.api, &self.head, piece)));
    }

    /// Choice `index` ended: the rest of its answer (`a`, what the unstreamed request gives)
    /// with its finish reason.
    pub(super) fn finish_choice(&self, index: usize, a: &Answered) {
        let Some(c) = self.choices.get(index) else { return };
        let rest = a.text.strip_prefix(c.sent.as_str()).unwrap_or_else(|| {
            // Cannot happen by the invariant above; if it did, what was sent stands.
            tracing::warn!(answer = %self.head.id, index, "a streamed answer's text does not extend what was sent");
            ""
        });
        let tokens = a.tokens.as_deref().map(|t| (&t[c.logprobs_sent.min(t.len())..], c.offset));
        let text = (!rest.is_empty()).then(|| rest.to_string());
        let piece = Piece { index: index as u32, text, tokens, finish: Some(a.finish) };
        self.send(StreamEvent::Data(wire::chunk(self.asked.api, &self.head, piece)));
    }

    /// Every choice ended: the usage if asked, and `[DONE]`.
    pub(super) fn finish(self, usage: Usage, metrics: &Metrics) {
        metrics.prompt_tokens.inc_by(usage.prompt_tokens);
        metrics.completion_tokens.inc_by(usage.completion_tokens);
        if self.asked.include_usage {
            self.send(StreamEvent::Data(wire::usage_chunk(self.asked.api, &self.head, usage)));
        }
        metrics.requests.with_label_values(&["answered"]).inc();
        self.send(StreamEvent::Done);
    }

    /// Refused, or failed part-way.
    pub(super) fn fail(self, e: ApiError, metrics: &Metrics) {
        if self.started {
            metrics.requests.with_label_values(&[e.outcome()]).inc();
        }
        self.send(StreamEvent::Failed(e));
    }
}

/// How much of `held` (text not yet sent, after text that ends no stop string's start) may
/// go now: all of it up to the first stop string in it, or to the longest suffix that a stop
/// string begins with, since the answer ends where a stop string starts.
fn sendable(held: &str, stops: &[String]) -> usize {
    let mut cut = held.len();
    for s in stops {
        if let Some(i) = held.find(s.as_str()) {
            cut = cut.min(i);
        }
        let from = held.len().saturating_sub(s.len().saturating_sub(1));
        if let Some(i) =
            (from..held.len()).find(|&i| held.is_char_boundary(i) && s.starts_with(&held[i..]))
        {
            cut = cut.min(i);
        }
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::sendable;

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn text_that_may_begin_a_stop_string_waits() {
        assert_eq!(sendable("anything", &[]), 8);
        assert_eq!(sendable("abc<", &stops(&["<end>"])), 3);
        assert_eq!(sendable("a<en", &stops(&["<end>"])), 1);
        assert_eq!(sendable("a<e>", &stops(&["<end>"])), 4, "a start that went wrong goes");
        assert_eq!(sendable("hello", &stops(&["lo!"])), 3);
        // The earliest of several stop strings' starts.
        assert_eq!(sendable("axy", &stops(&["yz!", "xyz"])), 1);
        // A whole stop string (below min_tokens, or in a guided tail) and what follows it wait
        // too: the answer may end there.
        assert_eq!(sendable("ab<end>cd", &stops(&["<end>"])), 2);
        // Characters are never split.
        assert_eq!(sendable("aé", &stops(&["é!"])), 1);
        assert_eq!(sendable("é<", &stops(&["<x"])), 2);
        assert_eq!(sendable("", &stops(&["<x"])), 0);
    }
}
