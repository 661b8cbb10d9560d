//! The record of a finished MAPPA episode: every action with the exact context its agent saw,
//! its tool calls and observation, and the coach's verdict.
use crate::method::RecordFault;
use crate::task::TaskKind;
use crate::turn::{ChatMessage, Role, Sampled};
use serde::{Deserialize, Serialize};

/// What the coach made of one action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoachVerdict {
    /// 0–10; `None` when no score could be read (the sample then gets no reward).
    pub process_score: Option<f64>,
    /// The coach's correctness flag for the last agent (logging only).
    pub outcome: Option<f64>,
    pub retry_attempted: bool,
    /// The legacy fallback supplied the score.
    pub fallback_used: bool,
    /// The coach's replies, first and (if any) the retry's.
    pub replies: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Action {
    /// Unique in the episode; coach turns take indices too, so actions may skip some.
    pub turn_index: u32,
    pub agent: u32,
    pub role: Role,
    /// Place of the role in the chain.
    pub position: u32,
    /// Which of the role's actions this is, from 0.
    pub step: u32,
    /// The context the policy continued: its prompt, then each earlier action and observation.
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampled: Sampled,
    pub text: String,
    /// One entry per program run: `None` if it ran cleanly, else the failure key.
    pub tool_runs: Vec<Option<String>>,
    /// The action tried to call a tool in a form that cannot be read.
    pub malformed_call: bool,
    /// The tool response the agent (and the coach) read; `None` when it called no tool.
    pub observation: Option<String>,
    pub coach: CoachVerdict,
    /// DSBench: the files in the shared workspace when the agent acted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspace: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MappaTrajectory {
    pub question_id: String,
    pub task: TaskKind,
    pub instance: u32,
    pub actions: Vec<Action>,
    /// The last agent's answer graded against the reference (logging only; `None` when the
    /// task has no automatic grader).
    pub outcome_correct: Option<bool>,
    /// DSBench: the Analyst's submission scored against the hidden answers (spec 7; logging
    /// and the Analyst's coach only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ds_outcome: Option<super::outcome::DsOutcome>,
}

impl MappaTrajectory {
    /// Every action, as the version check sees it.
    pub fn policy_turns(&self) -> Vec<crate::program::PolicyTurn> {
        self.actions
            .iter()
            .map(|a| crate::program::PolicyTurn { turn_index: a.turn_index, agent: a.agent, role: a.role, policy_version: a.sampled.policy_version })
            .collect()
    }

    /// Checks what a worker could get wrong: order, counts and the chain's shape.
    pub fn validate(&self, roles: &[Role], max_turns: &[u32]) -> Result<(), RecordFault> {
        let mut last: Option<(u32, u32, u32)> = None;
        for a in &self.actions {
            let at = format!("action at turn {}", a.turn_index);
            let here = |m: String| Err(RecordFault::at(&at, m));
            a.sampled.check().map_err(|f| RecordFault::turn(&at, f))?;
            let p = a.position as usize;
            if roles.get(p) != Some(&a.role) {
                return here(format!("a {} turn at chain position {p}", a.role));
            }
            if a.step >= max_turns[p] {
                return here(format!("action {} of the {} exceeds its max_turns {}", a.step, a.role, max_turns[p]));
            }
            if let Some((t, pos, step)) = last {
                let next = (a.position == pos && a.step == step + 1) || (a.position == pos + 1 && a.step == 0);
                if a.turn_index <= t || !next {
                    return here(format!("does not follow position {pos} action {step}"));
                }
            } else if a.position != 0 || a.step != 0 {
                return here("the chain does not start with the first role's first action".into());
            }
            last = Some((a.turn_index, a.position, a.step));
        }
        match last {
            Some((_, pos, _)) if pos as usize + 1 == roles.len() => Ok(()),
            _ => Err(format!("the chain stops before its last role ({} actions)", self.actions.len()).into()),
        }
    }

    pub fn completion_tokens(&self) -> u64 {
        self.actions.iter().map(|a| a.sampled.completion_ids.len() as u64).sum()
    }
}
