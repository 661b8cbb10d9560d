//! Generation on stock vLLM servers (`--engine vllm`): the worker keeps everything above
//! generation (episode programs, tools, frozen models, relay, versions, metrics) and hands each
//! turn's token ids to a vLLM OpenAI server for its base model, which it starts as a child
//! process or reaches at a given URL.
//!
//! What holds, and how:
//! - Prompts are comas's own token ids (its chat template and tokenizer); completions come back
//!   as token ids with the log-probability of each sampled token. The server runs with
//!   `--logprobs-mode processed_logprobs`: log p under softmax(logits / T) for a sampled token
//!   (T = 1 for greedy), renormalised over the guide's allowed set in a guided tail, which is
//!   what comas's engine records and the learner recomputes. Two differences remain: with top-p
//!   below 1 or top-k set, vLLM reports the truncated distribution's log-probability, and while
//!   `min_tokens` holds the stop tokens back it reports the distribution without them.
//! - A guided tail is generated under vLLM's structured outputs with llguidance (the library
//!   of comas's own guide), and its allowed sets are found by walking comas's guide over the
//!   returned tokens, so the learner gets the same `constrained` positions as from comas's
//!   engine.
//! - LoRA agents share their base's server: each version of an agent's adapter is written in
//!   the PEFT layout and loaded under `a<agent>-v<version>`; the previous one is unloaded once
//!   no turn runs on it. A full-weight agent has a server of its own, whose weights are
//!   reloaded in place from a folder the worker writes.
mod calls;
mod server;
mod wire;

pub use calls::{call_timeout, Done, Generated, Generation, VllmCalls};
pub use server::{
    check_python, log_tail, lora_rank_bound, ServeSpec, VllmServer, VllmSettings, BASE_NAME,
};

use comas_model::guide::{Allowed, Constrained};
use comas_model::{Completion, FinishReason, Tokenizer};
use comas_service::openai::CallError;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum VllmError {
    #[error("cannot start vLLM with {python}: {err}; install it with `bash scripts/setup-vllm.sh` (or point --vllm-python at a Python that has vllm)")]
    NoPython { python: PathBuf, err: String },
    #[error("vLLM: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the vLLM server exited ({status}); the end of its log:\n{log}")]
    Exited { status: String, log: String },
    #[error("the vLLM server did not answer its health check within {secs} s (last: {last}); raise --vllm-startup-secs if it is still loading. The end of its log:\n{log}")]
    NotReady { secs: u64, last: String, log: String },
    #[error("--vllm-url: {0}")]
    Url(String),
    #[error("LoRA rank {0} is above what vLLM serves (512)")]
    LoraRank(i64),
    #[error("vLLM refused or failed {what}: {err}")]
    Call { what: &'static str, err: CallError },
    #[error("vLLM's reply: {0}")]
    Reply(String),
    #[error("vLLM's guided tail: {0}")]
    Guide(String),
    #[error("writing {path} for vLLM: {err}")]
    Write { path: PathBuf, err: String },
    #[error("{0}")]
    Setup(String),
}

/// A turn's completion as comas's own engine gives it: the stop token kept when one ended an
/// unguided reply, a guided tail without the stop token the server adds after it, and the
/// allowed set of each tail position from comas's guide walked over the tail's tokens.
pub fn completion_of(
    g: Generated,
    tokenizer: &Tokenizer,
    guided_suffix: Option<&str>,
) -> Result<Completion, VllmError> {
    let Generated { mut tokens, mut logprobs, tail_from, stopped } = g;
    let (Some(from), Some(regex)) = (tail_from, guided_suffix) else {
        return Ok(completion(tokens, logprobs, stopped, Vec::new()));
    };
    let bad = |m: String| VllmError::Guide(m);
    let mut guide =
        tokenizer.guidance().and_then(|g| g.start(regex)).map_err(|e| bad(e.to_string()))?;
    let mut constrained = Vec::new();
    let mut done = false;
    let mut end = tokens.len();
    for (pos, &t) in tokens.iter().enumerate().skip(from) {
        match guide.allowed().map_err(|e| bad(e.to_string()))? {
            // Matched in full: what follows is the stop token the server adds.
            Allowed::Done => {
                done = true;
                end = pos;
                break;
            }
            Allowed::Tokens(ids) => {
                let allowed = if ids.binary_search(&t).is_ok() {
                    ids
                } else if logprobs[pos] == 0.0 {
                    // A forced token the server's guide split otherwise: forced all the same.
                    vec![t]
                } else {
                    return Err(bad(format!(
                        "token {t} at position {pos} is not one the guide `{regex}` allows there"
                    )));
                };
                constrained.push(Constrained { position: pos, allowed });
            }
        }
        guide.commit(t).map_err(|e| bad(e.to_string()))?;
    }
    if !done && end == tokens.len() {
        done = matches!(guide.allowed(), Ok(Allowed::Done));
    }
    tokens.truncate(end);
    logprobs.truncate(end);
    Ok(completion(tokens, logprobs, done || stopped, constrained))
}

/// A completion of vLLM's tokens: the reported log-probs serve as the sampling ones too.
fn completion(
    token_ids: Vec<i64>,
    logprobs: Vec<f32>,
    stopped: bool,
    constrained: Vec<Constrained>,
) -> Completion {
    Completion {
        sampling_logprobs: logprobs.clone(),
        token_ids,
        logprobs,
        finish_reason: if stopped { FinishReason::Stop } else { FinishReason::Length },
        stop_string: None,
        constrained,
    }
}

/// The served name of an agent's adapter version.
pub fn adapter_name(agent: u32, version: u64) -> String {
    format!("a{agent}-v{version}")
}

/// Loads the PEFT folder `dir` into `server` under `name`.
pub fn load_adapter(server: &VllmServer, name: &str, dir: &Path) -> Result<(), VllmError> {
    let body = wire::LoadAdapter { lora_name: name.into(), lora_path: dir.display().to_string() };
    post_text(server, "/v1/load_lora_adapter", &body, "loading an adapter")
}

pub fn unload_adapter(server: &VllmServer, name: &str) -> Result<(), VllmError> {
    let body = wire::UnloadAdapter { lora_name: name.into() };
    post_text(server, "/v1/unload_lora_adapter", &body, "unloading an adapter")
}

/// Reloads a server's weights in place from the safetensors in `dir`.
pub fn reload_weights(server: &VllmServer, dir: &Path) -> Result<(), VllmError> {
    let body = wire::CollectiveRpc {
        method: "reload_weights".into(),
        kwargs: serde_json::json!({ "weights_path": dir.display().to_string() }),
    };
    post_text(server, "/collective_rpc", &body, "reloading the weights")
}

/// A call of the engine thread, which waits for it (a swap, once a step), whose answer only
/// matters by its status.
fn post_text<Q: serde::Serialize>(
    server: &VllmServer,
    path: &str,
    body: &Q,
    what: &'static str,
) -> Result<(), VllmError> {
    let bytes = serde_json::to_vec(body).map_err(|e| VllmError::Reply(e.to_string()))?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(VllmError::Spawn)?
        .block_on(server.endpoint.call(
            hyper::Method::POST,
            path,
            Some(bytes),
            Duration::from_secs(600),
        ))
        .map(|_| ())
        .map_err(|err| VllmError::Call { what, err })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let dir = tempfile::tempdir().unwrap();
        comas_model::tiny::write_model(
            dir.path(),
            &comas_model::tiny::TinySpec::tiny(comas_model::Architecture::Qwen2),
        )
        .unwrap();
        Tokenizer::from_dir(dir.path()).unwrap()
    }

    /// The ids of `text` in the tiny tokenizer, token by token as the guide forces them.
    fn walk(tok: &Tokenizer, regex: &str, pick: i64) -> Vec<(i64, Vec<i64>)> {
        let mut guide = tok.guidance().unwrap().start(regex).unwrap();
        let mut out = Vec::new();
        while let Allowed::Tokens(ids) = guide.allowed().unwrap() {
            let t = if ids.len() == 1 {
                ids[0]
            } else {
                *ids.iter().find(|&&i| i == pick).unwrap_or(&ids[0])
            };
            guide.commit(t).unwrap();
            out.push((t, ids));
        }
        out
    }

    #[test]
    fn an_unguided_reply_keeps_its_stop_token_and_its_finish() {
        let tok = tokenizer();
        let g = Generated {
            tokens: vec![5, 6, 422],
            logprobs: vec![-1.0, -0.5, -0.1],
            tail_from: None,
            stopped: true,
        };
        let c = completion_of(g, &tok, None).unwrap();
        assert_eq!(
            (c.token_ids, c.finish_reason, c.constrained.len()),
            (vec![5, 6, 422], FinishReason::Stop, 0)
        );
        let g = Generated {
            tokens: vec![5, 6],
            logprobs: vec![-1.0, -0.5],
            tail_from: None,
            stopped: false,
        };
        assert_eq!(completion_of(g, &tok, None).unwrap().finish_reason, FinishReason::Length);
    }

    /// The tail's allowed sets are comas's guide's, the stop token vLLM adds after a matched
    /// tail is dropped, and a token the guide never allows is an error, not a silent record.
    #[test]
    fn a_guided_tail_gets_the_guides_allowed_sets_and_loses_the_added_stop_token() {
        let tok = tokenizer();
        let regex = "<score>[123]</score>";
        let steps = walk(&tok, regex, -1);
        let tail: Vec<i64> = steps.iter().map(|s| s.0).collect();
        let mut tokens = vec![7, 8];
        tokens.extend(&tail);
        tokens.push(422);
        let logprobs: Vec<f32> = tokens
            .iter()
            .enumerate()
            .map(|(i, _)| {
                if (2..2 + tail.len()).contains(&i) && steps[i - 2].1.len() == 1 {
                    0.0
                } else {
                    -0.3
                }
            })
            .collect();
        let g = Generated { tokens: tokens.clone(), logprobs, tail_from: Some(2), stopped: true };
        let c = completion_of(g.clone(), &tok, Some(regex)).unwrap();
        assert_eq!(c.token_ids, tokens[..tokens.len() - 1].to_vec());
        assert_eq!(c.finish_reason, FinishReason::Stop);
        let want: Vec<Constrained> = steps
            .iter()
            .enumerate()
            .map(|(i, (_, ids))| Constrained { position: 2 + i, allowed: ids.clone() })
            .collect();
        assert_eq!(c.constrained, want);
        assert!(
            want.iter().any(|k| k.allowed.len() == 3),
            "the digit is a choice of three: {want:?}"
        );

        // A tail cut by its budget before the guide was done.
        let short = Generated {
            tokens: tokens[..4].to_vec(),
            logprobs: g.logprobs[..4].to_vec(),
            tail_from: Some(2),
            stopped: false,
        };
        let c = completion_of(short, &tok, Some(regex)).unwrap();
        assert_eq!(
            (c.token_ids.len(), c.finish_reason, c.constrained.len()),
            (4, FinishReason::Length, 2)
        );

        // A digit the guide does not allow.
        let digit = steps.iter().position(|s| s.1.len() == 3).unwrap() + 2;
        let mut wrong = g.clone();
        wrong.tokens[digit] = 422;
        let e = completion_of(wrong, &tok, Some(regex)).unwrap_err().to_string();
        assert!(e.contains(&format!("token 422 at position {digit}")), "{e}");
    }
}
