//! The figures of a CoMAS step as typed records: what the coordinator writes into each step's
//! metrics record (for the team and for each agent), with the same JSON as before they were
//! typed. Each role's entry is null when the role had no turns. Read back leniently: a field an
//! older record lacks takes its default.
use serde::{Deserialize, Serialize};

pub use crate::mean::Spread;

/// One value per CoMAS role.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ByRole<T> {
    pub solver: Option<T>,
    pub evaluator: Option<T>,
    pub scorer: Option<T>,
}

/// Scorer turns by the score they gave; `invalid` when none could be read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ScoreHist {
    #[serde(rename = "1")]
    pub one: u64,
    #[serde(rename = "2")]
    pub two: u64,
    #[serde(rename = "3")]
    pub three: u64,
    pub invalid: u64,
}

/// Solver rewards split by whether the solution was right (graded for logging only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ByCorrectness {
    pub correct: Spread,
    pub wrong: Spread,
}

/// Share of graded solutions that were right, in the first and in the last round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Accuracy {
    pub first_round: Option<f64>,
    pub last_round: Option<f64>,
    /// Last-round solutions graded (what `last_round` is a share of).
    pub last_round_graded: u64,
}

/// The figures of some turns: the whole team's, or one agent's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ComasFigures {
    pub reward_mean: Option<f64>,
    pub reward: ByRole<Spread>,
    pub score_hist: ScoreHist,
    pub parse_failure_rate: Option<f64>,
    pub score_parse_rate: Option<f64>,
    /// Valid verdicts that pass their solution (a score of 3, or "correct" under no_scoring).
    pub approval_rate: Option<f64>,
    pub solver_reward_by_correctness: ByCorrectness,
    /// The judges' scores (1-3) of right and of wrong solutions, and the difference of their
    /// means, E[score | right] - E[score | wrong]: near 0, the judges carry no signal.
    pub judge_score_by_correctness: ByCorrectness,
    pub judge_separation: Option<f64>,
    pub accuracy: Accuracy,
    pub completion_len: ByRole<f64>,
    pub truncation_rate: Option<f64>,
    pub truncation_rate_by_role: ByRole<f64>,
    /// Weight versions that produced the turns: one value in the synchronous schedule.
    pub policy_versions: Vec<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ComasAgentFigures {
    #[serde(flatten)]
    pub figures: ComasFigures,
    pub agent: u32,
}

/// A CoMAS step's metrics, before the coordinator adds timings and training reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ComasMetrics {
    #[serde(flatten)]
    pub team: ComasFigures,
    pub episodes: usize,
    pub turns: ByRole<u64>,
    pub generated_tokens: u64,
    /// Turns whose prompt lost quoted discussion blocks to fit (spec 3.7).
    pub prompts_truncated: usize,
    pub agents: Vec<ComasAgentFigures>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_without_turns_is_null_and_scores_keep_their_digit_keys() {
        let m = ComasMetrics { turns: ByRole { solver: Some(4), evaluator: Some(0), scorer: Some(4) }, ..Default::default() };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["reward"]["solver"], serde_json::Value::Null);
        assert_eq!(v["turns"]["evaluator"], 0);
        assert_eq!(v["score_hist"]["3"], 0);
        assert_eq!(serde_json::from_value::<ComasMetrics>(v).unwrap(), m);
    }
}
