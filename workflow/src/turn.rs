//! What a protocol asks a rollout worker for (a `TurnRequest`) and what it gets back (a
//! `TurnOutput`). These are the only types a worker needs to drive any episode.
use serde::{Deserialize, Serialize};
use std::fmt;

/// One chat message; the same shape as `comas_model::ChatMessage`, so it converts field by field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn user(content: impl Into<String>) -> Self {
        Self { role: "user".to_string(), content: content.into() }
    }
}

/// Who speaks a turn. Each method uses its own roles: CoMAS the first three, MAPPA's MathChat
/// chain the next three, and a frozen judge model `Coach`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Solver,
    Evaluator,
    Scorer,
    ProblemSolver,
    CodeExecutor,
    Verifier,
    Coach,
    /// A team member of an evaluation setup (spec §8.2), played by a frozen model.
    Member,
    /// MAPPA DSBench: cleans the data and saves the features.
    DataEngineer,
    /// MAPPA DSBench: trains and saves the model.
    Modeler,
    /// MAPPA DSBench: predicts the test set and writes the submission.
    Analyst,
    /// CoSIR: a seat's public message in a discussion round.
    Discussant,
    /// CoSIR: a seat's private final choice.
    Voter,
    /// NeuroMAS: a node that passes a message on.
    Node,
    /// NeuroMAS: the last layer's node, which gives the answer.
    Readout,
}

impl Role {
    /// The roles of a CoMAS game, in the order a round plays them.
    pub const COMAS: [Role; 3] = [Role::Solver, Role::Evaluator, Role::Scorer];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Solver => "solver",
            Role::Evaluator => "evaluator",
            Role::Scorer => "scorer",
            Role::ProblemSolver => "problem_solver",
            Role::CodeExecutor => "code_executor",
            Role::Verifier => "verifier",
            Role::Coach => "coach",
            Role::Member => "member",
            Role::DataEngineer => "data_engineer",
            Role::Modeler => "modeler",
            Role::Analyst => "analyst",
            Role::Discussant => "discussant",
            Role::Voter => "voter",
            Role::Node => "node",
            Role::Readout => "readout",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop token or stop string ended the completion.
    Stop,
    /// The max_new_tokens limit was reached (the turn is truncated).
    Length,
}

/// Sampling settings of one role. `top_k` 0 means off; `top_p` 1 means off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingSpec {
    /// Sampling temperature; 0 is greedy.
    pub temperature: f64,
    /// Nucleus sampling: the fewest most likely tokens whose probabilities reach top_p.
    pub top_p: f64,
    /// Sample among the top_k most likely tokens.
    pub top_k: u32,
    /// At most this many new tokens per turn.
    pub max_new_tokens: u32,
    /// Stop tokens are suppressed until this many tokens have been generated.
    pub min_new_tokens: u32,
    /// Guided decoding of the reply's tail (a deviation from the spec, for models too small to
    /// follow the format): the agent writes freely until it would stop, then must continue with
    /// text matching this regex, e.g. `<score>[123]</score>`; where the regex leaves a choice
    /// (the digit) the model still chooses. Off by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guided_suffix: Option<String>,
    /// Shorten the reply to the room the model's context (and the worker's token budget) has
    /// left after the prompt, instead of refusing the turn; a prompt that leaves no room gets an
    /// empty reply. Evaluation calls use it, as `comas eval` does on one machine (spec §8.1).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fit_context: bool,
}

impl Default for SamplingSpec {
    /// The rollout settings of the CoMAS main run (spec 6.1).
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 4096,
            min_new_tokens: 16,
            guided_suffix: None,
            fit_context: false,
        }
    }
}

/// The scorer's guided tail: free text, then a score tag whose digit the model picks.
pub const GUIDED_SCORE_SUFFIX: &str = "<score>[123]</score>";
/// Tokens a guided reply keeps for its tail (the rollout engine's reserve).
pub const GUIDED_TAIL_RESERVE: u32 = 16;

impl SamplingSpec {
    /// Returns what is wrong, if anything.
    pub fn check(&self) -> Result<(), String> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(format!("temperature must be finite and >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if self.max_new_tokens == 0 {
            return Err("max_new_tokens must be at least 1".to_string());
        }
        if let Some(g) = &self.guided_suffix {
            if g.is_empty() {
                return Err("guided_suffix must not be empty".to_string());
            }
            // Found at submit rather than when a worker first compiles it: llguidance reads the
            // same syntax (regex-syntax's).
            if let Err(e) = regex::Regex::new(g) {
                return Err(format!("guided_suffix `{g}` is not a regular expression: {e}"));
            }
            if self.max_new_tokens <= GUIDED_TAIL_RESERVE {
                return Err(format!("guided_suffix needs max_new_tokens above {GUIDED_TAIL_RESERVE} (the tail's reserve), got {}", self.max_new_tokens));
            }
        }
        if self.min_new_tokens > self.max_new_tokens {
            return Err(format!(
                "min_new_tokens ({}) exceeds max_new_tokens ({})",
                self.min_new_tokens, self.max_new_tokens
            ));
        }
        Ok(())
    }
}

/// One generation the protocol needs. All requests handed out together form a barrier group:
/// they may run concurrently, in any order, and must be submitted back together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRequest {
    /// Position of the turn in its episode; unique within the episode, starting at 0.
    pub turn_index: u32,
    /// Agent (policy) that must speak this turn, in 0..num_agents.
    pub agent: u32,
    pub role: Role,
    pub round: u32,
    /// Discussion slot d: the solution of solver d in this round and everything about it.
    pub slot: u32,
    /// Which of the slot's evaluations (evaluator turns) or judgments (scorer turns) this is,
    /// in 0..evals_per_solution; 0 for solver turns.
    pub judge_index: u32,
    /// Turn index of the solution this turn is about (evaluator and scorer turns).
    pub about_solution: Option<u32>,
    /// Turn index of the evaluation this turn is about (scorer turns of the full variant).
    pub about_evaluation: Option<u32>,
    /// The conversation to continue: a single user message, no system message.
    pub messages: Vec<ChatMessage>,
    pub sampling: SamplingSpec,
    /// Seed for this turn's sampler, derived from the episode seed and the turn index.
    pub seed: u64,
    /// Quoted discussion blocks left out of the prompt to make it fit (spec 3.7).
    #[serde(default)]
    pub blocks_cut: u32,
}

/// Tells an episode whether a prompt fits: the rollout worker renders it with each agent's chat
/// template and counts tokens against the prompt limit, the context and its token budget. The
/// protocol itself stays free of tokenizers.
pub trait PromptMeter {
    fn fits(&self, role: Role, user_message: &str) -> bool;

    /// `text`'s first `max_tokens` tokens by agent `agent`'s tokenizer when it has more, `None`
    /// when it fits. The default never cuts (callers without a tokenizer).
    fn cut(&self, _agent: u32, _text: &str, _max_tokens: u32) -> Option<String> {
        None
    }
}

/// Every prompt fits: for callers that replay or test the protocol.
pub struct Unmetered;

impl PromptMeter for Unmetered {
    fn fits(&self, _: Role, _: &str) -> bool {
        true
    }
}

/// What a policy sampled in one turn, as a method's record keeps it and training reads it
/// (flattened into the record's turn, so its JSON fields sit beside the method's own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampled {
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constrained: Vec<ConstrainedToken>,
    pub finish_reason: FinishReason,
    pub policy_version: u64,
}

impl Sampled {
    /// The sampled part of a worker's output, and its text.
    pub fn split(out: TurnOutput) -> (Sampled, String) {
        let s = Sampled {
            prompt_ids: out.prompt_ids,
            completion_ids: out.completion_ids,
            logprobs: out.logprobs,
            constrained: out.constrained,
            finish_reason: out.finish_reason,
            policy_version: out.policy_version,
        };
        (s, out.text)
    }

    /// What a worker could get wrong: a log-prob per token, constrained positions in range.
    pub fn check(&self) -> Result<(), TurnFault> {
        if self.logprobs.len() != self.completion_ids.len() {
            return Err(TurnFault::LogprobCount {
                logprobs: self.logprobs.len(),
                tokens: self.completion_ids.len(),
            });
        }
        check_constrained(&self.constrained, &self.completion_ids)
    }
}

/// What the worker produced for one `TurnRequest`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnOutput {
    pub turn_index: u32,
    /// Completion decoded without special tokens and without the stop string.
    pub text: String,
    /// Completion decoded with special tokens and the stop string kept (quoted only when
    /// `quote_raw_completion` is set).
    pub raw_text: String,
    /// The chat-templated prompt as token ids.
    pub prompt_ids: Vec<u32>,
    /// The sampled token ids; training uses these, never a re-tokenisation of `text`.
    pub completion_ids: Vec<u32>,
    /// Sampling log-probability of each completion token.
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
    /// Weight version of the agent that produced the turn.
    pub policy_version: u64,
    /// Tokens of a guided tail that were drawn from a restricted set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constrained: Vec<ConstrainedToken>,
}

/// A completion position whose token was drawn from a restricted set (a guided tail).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConstrainedToken {
    pub position: u32,
    /// Allowed token ids, ascending; a single id means the token was forced.
    pub allowed: Vec<u32>,
}

/// What a worker can get wrong in one sampled turn.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TurnFault {
    #[error("{logprobs} logprobs for {tokens} completion tokens")]
    LogprobCount { logprobs: usize, tokens: usize },
    #[error("constrained position {position} is beyond the {tokens} completion tokens")]
    ConstrainedBeyond { position: u32, tokens: usize },
    #[error("constrained positions are not ascending at {position}")]
    ConstrainedOrder { position: u32 },
    #[error("position {position}: token {token} is not in its ascending allowed set")]
    NotAllowed { position: u32, token: u32 },
}

/// Checks constrained positions against their completion: in range, ascending, each allowed
/// set non-empty and containing the sampled token.
pub fn check_constrained(
    constrained: &[ConstrainedToken],
    completion_ids: &[u32],
) -> Result<(), TurnFault> {
    let mut last = None;
    for c in constrained {
        let position = c.position;
        let Some(&token) = completion_ids.get(position as usize) else {
            return Err(TurnFault::ConstrainedBeyond { position, tokens: completion_ids.len() });
        };
        if last.is_some_and(|l| position <= l) {
            return Err(TurnFault::ConstrainedOrder { position });
        }
        if c.allowed.binary_search(&token).is_err() || !c.allowed.windows(2).all(|w| w[0] < w[1]) {
            return Err(TurnFault::NotAllowed { position, token });
        }
        last = Some(position);
    }
    Ok(())
}

/// Drops `<think>…</think>` blocks (a reasoning model's thoughts) from a hand-off.
pub fn without_thinking(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("<think>") {
        out.push_str(&rest[..i]);
        match rest[i..].find("</think>") {
            Some(j) => rest = &rest[i + j + "</think>".len()..],
            None => return out.trim().to_string(),
        }
    }
    out.push_str(rest);
    out.trim().to_string()
}
