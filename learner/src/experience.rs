//! One training sample as it arrives from the coordinator (or a batch file): the prompt and the
//! sampled completion ids, never re-tokenized text.
use crate::error::{LearnerError, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Finish {
    Stop,
    Length,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experience {
    pub prompt_ids: Vec<i64>,
    pub completion_ids: Vec<i64>,
    /// Scalar reward, placed on the last completion token.
    #[serde(default)]
    pub reward: Option<f64>,
    /// Per-token rewards (process rewards), one per completion token.
    #[serde(default)]
    pub token_rewards: Option<Vec<f64>>,
    pub finish_reason: Finish,
    /// Explicit group key for group estimators (e.g. prompt uid + agent + turn key).
    #[serde(default)]
    pub group: String,
    /// The sampler's log-probs, kept to report the sampler/trainer mismatch.
    #[serde(default)]
    pub sampling_logprobs: Option<Vec<f64>>,
    #[serde(default)]
    pub episode_id: Option<String>,
    #[serde(default)]
    pub turn_id: Option<u64>,
    #[serde(default)]
    pub policy_version: Option<u64>,
    /// Guided-tail tokens drawn from a restricted set (`comas_model::guide`): their log-probs
    /// are renormalised over that set; a forced token (a set of one) carries no loss.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constrained: Vec<Constrained>,
    /// The sampling temperature; log-probs are computed at it (default: the config's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Whitening partition (empty: the whole batch); see `rl::compute_advantages`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub norm_group: String,
}

pub use comas_model::guide::Constrained;

impl Experience {
    pub fn len(&self) -> usize {
        self.prompt_ids.len() + self.completion_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.completion_ids.is_empty()
    }

    pub fn scalar_reward(&self) -> f64 {
        self.reward.unwrap_or(0.0)
    }

    /// Per-token loss weights: 1, or 0 at forced tokens (and everywhere when `in_loss` is off).
    pub fn token_weights(&self, in_loss: bool) -> Vec<f64> {
        let mut w = vec![if in_loss { 1.0 } else { 0.0 }; self.completion_ids.len()];
        for c in self.constrained.iter().filter(|c| c.allowed.len() == 1) {
            w[c.position] = 0.0;
        }
        w
    }

    /// Checks one sample against the model's vocabulary; `what` names it in errors.
    pub fn validate(&self, what: &str, vocab: i64) -> Result<()> {
        let bad = |m: String| Err(LearnerError::Batch(format!("{what}: {m}")));
        if self.prompt_ids.is_empty() {
            return bad("empty prompt".into());
        }
        if self.completion_ids.is_empty() {
            return bad("empty completion; drop it before training".into());
        }
        if let Some(t) =
            self.prompt_ids.iter().chain(&self.completion_ids).find(|&&t| t < 0 || t >= vocab)
        {
            return bad(format!("token id {t} is outside the model's vocabulary (size {vocab})"));
        }
        match (self.reward, &self.token_rewards) {
            (None, None) => return bad("no `reward` or `token_rewards`".into()),
            (Some(r), _) if !r.is_finite() => return bad(format!("reward {r} is not finite")),
            _ => {}
        }
        if let Some(tr) = &self.token_rewards {
            if tr.len() != self.completion_ids.len() {
                return bad(format!(
                    "{} token rewards for {} completion tokens",
                    tr.len(),
                    self.completion_ids.len()
                ));
            }
            if let Some(r) = tr.iter().find(|r| !r.is_finite()) {
                return bad(format!("token reward {r} is not finite"));
            }
        }
        if let Some(lp) = &self.sampling_logprobs {
            if lp.len() != self.completion_ids.len() {
                return bad(format!(
                    "{} sampling logprobs for {} completion tokens",
                    lp.len(),
                    self.completion_ids.len()
                ));
            }
        }
        let mut last = None;
        for c in &self.constrained {
            let Some(&token) = self.completion_ids.get(c.position) else {
                return bad(format!(
                    "constrained position {} is beyond the {} completion tokens",
                    c.position,
                    self.completion_ids.len()
                ));
            };
            if last.is_some_and(|l| c.position <= l) {
                return bad(format!("constrained positions are not ascending at {}", c.position));
            }
            if !c.allowed.windows(2).all(|w| w[0] < w[1])
                || c.allowed.binary_search(&token).is_err()
            {
                return bad(format!(
                    "constrained position {}: token {token} is not in its ascending allowed set",
                    c.position
                ));
            }
            if let Some(t) = c.allowed.iter().find(|&&t| t < 0 || t >= vocab) {
                return bad(format!("constrained position {}: allowed token {t} is outside the vocabulary (size {vocab})", c.position));
            }
            last = Some(c.position);
        }
        Ok(())
    }
}

/// Reads a JSONL batch file; errors name the line.
pub fn read_jsonl(path: &std::path::Path) -> Result<Vec<Experience>> {
    let text = std::fs::read_to_string(path).map_err(|e| LearnerError::io(path, e))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let e: Experience = serde_json::from_str(line)
            .map_err(|e| LearnerError::Batch(format!("{} line {}: {e}", path.display(), i + 1)))?;
        out.push(e);
    }
    if out.is_empty() {
        return Err(LearnerError::Batch(format!("{} holds no experiences", path.display())));
    }
    Ok(out)
}
