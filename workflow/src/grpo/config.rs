//! The `[grpo]` table: how many answers each agent gives a question, how it is asked and
//! sampled, which grader scores an answer and what an answer earns.
use crate::code::TRAINING_TIMEOUT_SECS;
use crate::task::TaskKind;
use crate::turn::SamplingSpec;
use serde::{Deserialize, Serialize};

/// Which rule grades an answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Grader {
    /// By the task's kind: math for `math`, a decimal within 5 % for `science`, the sandbox
    /// for `coding`.
    #[default]
    Auto,
    /// Symbolic equivalence of the final answer (`\boxed{}` first).
    Math,
    /// The letter of the last boxed choice.
    Choice,
    /// A decimal within 5 % of the reference.
    Numeric,
    /// The answer's last ```python block run with the task's tests in the sandbox.
    Code,
}

impl Grader {
    /// The grader of a task of kind `kind`; `None` for a kind no grader here reads.
    pub fn resolve(self, kind: TaskKind) -> Option<Grader> {
        match (self, kind) {
            (Grader::Auto, TaskKind::Math) => Some(Grader::Math),
            (Grader::Auto, TaskKind::Science) => Some(Grader::Numeric),
            (Grader::Auto, TaskKind::Coding) => Some(Grader::Code),
            (Grader::Auto, TaskKind::DataScience) => None,
            (g, _) => Some(g),
        }
    }
}

/// What an answer earns: `correct` or `wrong`, plus `format` when it gives a readable answer
/// (a non-empty last `\boxed{}` for math and numeric answers), less a soft penalty for running long (DAPO's overlong shaping): nothing up to
/// `max_new_tokens − overlong_buffer` tokens, then rising linearly to `overlong_penalty` at
/// `max_new_tokens`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RewardSpec {
    pub correct: f64,
    pub wrong: f64,
    pub format: f64,
    pub overlong_buffer: u32,
    pub overlong_penalty: f64,
    /// Math, numeric and choice answers are graded on the last `\boxed{}`'s content alone: a
    /// reply without one, or with an empty one, is wrong. Off (the default), the grader reads
    /// the answer as `math_verify` does, falling back to the last expression of the text when
    /// there is no usable box, so "7 + 5 = \boxed{}" is right for 12.
    pub answer_in_box: bool,
}

impl Default for RewardSpec {
    fn default() -> Self {
        RewardSpec {
            correct: 1.0,
            wrong: 0.0,
            format: 0.0,
            overlong_buffer: 0,
            overlong_penalty: 0.0,
            answer_in_box: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct GrpoConfig {
    /// Trained agents, each answering on its own (taken from the job's agent list).
    #[schemars(skip)]
    pub agents: u32,
    /// G: answers to each question by each agent per step; their rewards form a group.
    pub group_size: u32,
    pub sampling: SamplingSpec,
    /// A system message before the question; none by default.
    pub system_prompt: Option<String>,
    /// Text after the question in the user message (an answer-format instruction).
    pub prompt_suffix: Option<String>,
    pub grader: Grader,
    pub reward: RewardSpec,
    /// Seconds a code answer's test run may take.
    pub test_timeout_secs: f64,
    /// Most tokens a prompt may have; unset: the model's context less `max_new_tokens`.
    pub prompt_max_len: Option<u32>,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        GrpoConfig {
            agents: 1,
            group_size: 8,
            sampling: SamplingSpec { max_new_tokens: 256, min_new_tokens: 0, ..SamplingSpec::default() },
            system_prompt: None,
            prompt_suffix: None,
            grader: Grader::Auto,
            reward: RewardSpec::default(),
            test_timeout_secs: TRAINING_TIMEOUT_SECS,
            prompt_max_len: None,
        }
    }
}

impl GrpoConfig {
    /// What is wrong, as (key under `grpo.`, message), if anything.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, m: String| Err((k.to_string(), m));
        if self.agents == 0 {
            return bad("agents", "list at least one [[agents]] table".into());
        }
        if self.group_size == 0 {
            return bad("group_size", "must be at least 1 (at least 2 for a group advantage to be other than 0)".into());
        }
        self.sampling.check().map_err(|m| ("sampling".to_string(), m))?;
        let r = &self.reward;
        for (k, v) in [("correct", r.correct), ("wrong", r.wrong), ("format", r.format), ("overlong_penalty", r.overlong_penalty)] {
            if !v.is_finite() {
                return bad(&format!("reward.{k}"), format!("must be finite, got {v}"));
            }
        }
        if r.overlong_buffer > self.sampling.max_new_tokens {
            return bad("reward.overlong_buffer", format!("is {} but sampling.max_new_tokens is {}", r.overlong_buffer, self.sampling.max_new_tokens));
        }
        if !(self.test_timeout_secs > 0.0 && self.test_timeout_secs.is_finite()) {
            return bad("test_timeout_secs", format!("must be positive, got {}", self.test_timeout_secs));
        }
        if self.prompt_max_len == Some(0) {
            return bad("prompt_max_len", "must be at least 1".into());
        }
        Ok(())
    }
}
