//! Turns of frozen models served elsewhere, behind an OpenAI-compatible endpoint (a coach on
//! vLLM, TGI or `comas serve`). Each call is a task on a small runtime of its own, retried with
//! spec mappa.md §4's backoff, and its reply arrives on the engine's side channel as a tool
//! result does, so the engine thread never waits on the network.
use crate::engine::Stats;
use crate::tools::SideDone;
use comas_service::backoff::Backoff;
use comas_service::openai::{CallError, ChatRequest, ChatResponse, Endpoint, Message, Sampling};
use comas_workflow::program::Reply;
use comas_workflow::{FinishReason, TurnOutput, TurnRequest};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// How long one try of a call may take (a long reply from a busy server).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// A frozen model reached over HTTP.
#[derive(Debug, Clone, PartialEq)]
pub struct RemotePolicy {
    pub endpoint: Endpoint,
    /// The name the endpoint serves it under.
    pub model: String,
    /// Tries per call before its turn is answered empty.
    pub max_attempts: u32,
}

pub struct RemoteCalls {
    runtime: Option<tokio::runtime::Runtime>,
    done: mpsc::Sender<SideDone>,
    stats: Arc<Stats>,
}

/// The chat request of one turn: the turn's messages and sampling. `top_k`, `min_tokens` (vLLM's
/// names) and the guided tail are sent only when set, since other servers may refuse them.
pub fn request_of(turn: &TurnRequest, model: &str) -> ChatRequest {
    let s = &turn.sampling;
    ChatRequest {
        model: model.to_string(),
        messages: turn
            .messages
            .iter()
            .map(|m| Message { role: m.role.clone(), content: m.content.clone() })
            .collect(),
        sampling: Sampling {
            temperature: Some(s.temperature),
            top_p: Some(s.top_p),
            top_k: (s.top_k > 0).then_some(s.top_k),
            min_tokens: (s.min_new_tokens > 0).then_some(s.min_new_tokens),
            max_tokens: Some(s.max_new_tokens),
            seed: Some(turn.seed),
            guided_suffix: s.guided_suffix.clone(),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A turn answered from a reply, or (after every try failed) with nothing, cut at length: the
/// method then treats it as a reply without content (a coach's: no score).
pub fn output_of(turn: &TurnRequest, reply: Option<ChatResponse>) -> TurnOutput {
    let (text, finish) = match reply.and_then(|r| r.choices.into_iter().next()) {
        Some(c) => (
            c.message.content,
            if c.finish_reason.as_deref() == Some("length") {
                FinishReason::Length
            } else {
                FinishReason::Stop
            },
        ),
        None => (String::new(), FinishReason::Length),
    };
    TurnOutput {
        turn_index: turn.turn_index,
        raw_text: text.clone(),
        text,
        prompt_ids: Vec::new(),
        completion_ids: Vec::new(),
        logprobs: Vec::new(),
        finish_reason: finish,
        policy_version: 0,
        constrained: Vec::new(),
    }
}

async fn call(policy: &RemotePolicy, request: &ChatRequest) -> Result<ChatResponse, CallError> {
    let mut attempt = 1;
    let mut backoff = Backoff::endpoint();
    loop {
        match policy.endpoint.chat(request, CALL_TIMEOUT).await {
            Err(e) if e.retryable() && attempt < policy.max_attempts => {
                tracing::warn!(model = %policy.model, attempt, error = %e, "endpoint call failed; trying again");
                tokio::time::sleep(backoff.next_wait()).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

impl RemoteCalls {
    pub fn new(done: mpsc::Sender<SideDone>, stats: Arc<Stats>) -> Self {
        Self { runtime: None, done, stats }
    }

    /// Starts one turn's call; its reply arrives on the side channel, tagged with `episode`.
    pub fn submit(&mut self, episode: u64, turn: TurnRequest, policy: &RemotePolicy) {
        let runtime = match &self.runtime {
            Some(r) => r,
            None => match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("worker-endpoint")
                .enable_all()
                .build()
            {
                Ok(r) => self.runtime.insert(r),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the endpoint runtime");
                    self.stats.endpoint_failures.fetch_add(1, Ordering::Relaxed);
                    let _ = self
                        .done
                        .send(SideDone { episode, reply: Reply::Turn(output_of(&turn, None)) });
                    return;
                }
            },
        };
        let (policy, done, stats) = (policy.clone(), self.done.clone(), Arc::clone(&self.stats));
        runtime.spawn(async move {
            let request = request_of(&turn, &policy.model);
            stats.endpoint_calls.fetch_add(1, Ordering::Relaxed);
            let reply = match call(&policy, &request).await {
                Ok(r) => Some(r),
                Err(e) => {
                    stats.endpoint_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(model = %policy.model, turn = turn.turn_index, reason = e.reason(), error = %e, "endpoint call failed for good; the turn is answered empty");
                    None
                }
            };
            let _ = done.send(SideDone { episode, reply: Reply::Turn(output_of(&turn, reply)) });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comas_service::openai::{Choice, Message};
    use comas_workflow::{ChatMessage, Role, SamplingSpec};

    fn turn() -> TurnRequest {
        TurnRequest {
            turn_index: 7,
            agent: 3,
            role: Role::Coach,
            round: 0,
            slot: 0,
            judge_index: 0,
            about_solution: None,
            about_evaluation: None,
            messages: vec![ChatMessage::user("Score this.")],
            sampling: SamplingSpec {
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
                max_new_tokens: 24,
                min_new_tokens: 0,
                ..Default::default()
            },
            seed: 99,
            blocks_cut: 0,
        }
    }

    #[test]
    fn a_turn_becomes_a_plain_chat_request_and_its_reply_a_turn() {
        let r = request_of(&turn(), "judge");
        let s = &r.sampling;
        assert_eq!(
            (r.model.as_str(), r.messages[0].content.as_str(), s.temperature, s.max_tokens, s.seed),
            ("judge", "Score this.", Some(0.0), Some(24), Some(99))
        );
        // Extensions other servers may refuse stay out unless the turn needs them.
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            !json.contains("top_k")
                && !json.contains("min_tokens")
                && !json.contains("guided_suffix"),
            "{json}"
        );
        let reply = |finish: &str| ChatResponse {
            id: "x".into(),
            object: "chat.completion".into(),
            created: 0,
            model: "judge".into(),
            choices: vec![Choice {
                index: 0,
                message: Message { role: "assistant".into(), content: "PROCESS_SCORE: 7".into() },
                finish_reason: Some(finish.into()),
                logprobs: None,
            }],
            usage: None,
        };
        let out = output_of(&turn(), Some(reply("stop")));
        assert_eq!(
            (out.turn_index, out.text.as_str(), out.finish_reason, out.completion_ids.len()),
            (7, "PROCESS_SCORE: 7", FinishReason::Stop, 0)
        );
        assert_eq!(output_of(&turn(), Some(reply("length"))).finish_reason, FinishReason::Length);
        // Every try failed: an empty reply, which a coach reads as no score.
        let failed = output_of(&turn(), None);
        assert_eq!((failed.text.as_str(), failed.finish_reason), ("", FinishReason::Length));
    }
}
