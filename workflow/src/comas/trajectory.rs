//! The record of a finished episode: every turn with its author, role, position, links, tokens
//! and texts. It is what a worker sends to the coordinator and all the reward function reads.
use super::config::Variant;
use super::score::{extract_judgment, extract_score, Judgment};
use crate::error::WorkflowError;
use crate::task::TaskKind;
use crate::turn::{check_constrained, ConstrainedToken, FinishReason, Role};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryTurn {
    pub turn_index: u32,
    pub agent: u32,
    pub role: Role,
    pub round: u32,
    pub slot: u32,
    /// Which of the slot's n evaluations / judgments this is; 0 for solver turns.
    pub judge_index: u32,
    pub about_solution: Option<u32>,
    pub about_evaluation: Option<u32>,
    /// The user message the agent answered (before its chat template).
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
    pub policy_version: u64,
    /// Guided-tail tokens drawn from a restricted set (see `SamplingSpec::guided_suffix`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constrained: Vec<ConstrainedToken>,
    pub text: String,
    pub raw_text: String,
    /// Quoted discussion blocks left out of this turn's prompt to make it fit (spec 3.7).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub blocks_cut: u32,
    /// Scorer turns: the extracted 1–3 score, `None` when the format was broken.
    pub score: Option<u8>,
    /// Evaluator turns of the no-scoring ablation: the extracted verdict, `None` when broken.
    pub judgment: Option<Judgment>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    pub question_id: String,
    pub task: TaskKind,
    /// Index of the instance in its batch.
    pub instance: u32,
    pub num_agents: u32,
    pub num_rounds: u32,
    pub evals_per_solution: u32,
    pub variant: Variant,
    /// The discussion block the solvers of each round saw.
    pub discussions: Vec<String>,
    /// Turns in turn-index order.
    pub turns: Vec<TrajectoryTurn>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Trajectory {
    /// Every turn, as the version check sees it.
    pub fn policy_turns(&self) -> Vec<crate::program::PolicyTurn> {
        self.turns
            .iter()
            .map(|x| crate::program::PolicyTurn { turn_index: x.turn_index, agent: x.agent, role: x.role, policy_version: x.policy_version })
            .collect()
    }

    /// Turns whose prompt had discussion blocks cut (the `prompt_truncated_total` count).
    pub fn truncated_prompts(&self) -> usize {
        self.turns.iter().filter(|t| t.blocks_cut > 0).count()
    }

    pub fn turns_of(&self, role: Role) -> impl Iterator<Item = &TrajectoryTurn> {
        self.turns.iter().filter(move |t| t.role == role)
    }

    /// Checks that the trajectory is one the CoMAS protocol can produce: complete rounds, links
    /// that point at the right earlier turns, and stored verdicts that match the texts. A
    /// trajectory that arrives over the network is checked before any reward is computed.
    pub fn validate(&self) -> Result<(), WorkflowError> {
        let bad = |m: String| Err(WorkflowError::MalformedTrajectory(m));
        let (l, rounds, n) = (self.num_agents, self.num_rounds, self.evals_per_solution);
        if l == 0 || rounds == 0 || n == 0 {
            return bad(format!("num_agents {l}, num_rounds {rounds}, evals_per_solution {n}: all must be at least 1"));
        }
        if self.discussions.len() != rounds as usize {
            return bad(format!("{} discussions for {rounds} rounds", self.discussions.len()));
        }
        let mut seen = HashSet::new();
        for (i, t) in self.turns.iter().enumerate() {
            let here = |m: String| bad(format!("turn {i}: {m}"));
            if t.turn_index as usize != i {
                return here(format!("turn_index is {}", t.turn_index));
            }
            if t.agent >= l || t.round >= rounds || t.slot >= l || t.judge_index >= n {
                return here(format!("agent {}, round {}, slot {}, judge {} out of range", t.agent, t.round, t.slot, t.judge_index));
            }
            if t.logprobs.len() != t.completion_ids.len() {
                return here(format!("{} logprobs for {} completion tokens", t.logprobs.len(), t.completion_ids.len()));
            }
            if let Err(f) = check_constrained(&t.constrained, &t.completion_ids) {
                return here(f.to_string());
            }
            if !seen.insert((t.round, t.role, t.slot, t.judge_index)) {
                return here(format!("a second {} turn for round {} slot {} judge {}", t.role, t.round, t.slot, t.judge_index));
            }
            if let Err(m) = self.check_links(i, t) {
                return here(m);
            }
        }
        for round in 0..rounds {
            for role in Role::COMAS {
                // In u64: the counts come off the wire, and l · n can pass u32.
                let (l, n) = (u64::from(l), u64::from(n));
                let want = match role {
                    Role::Solver => l,
                    Role::Evaluator if self.variant.has_evaluators() => l * n,
                    Role::Scorer if self.variant.has_scorers() => l * n,
                    _ => 0,
                };
                let have = self.turns.iter().filter(|t| t.round == round && t.role == role).count();
                if have as u64 != want {
                    return bad(format!("round {round} has {have} {role} turns, expected {want}"));
                }
            }
        }
        Ok(())
    }

    /// The solver turn `about` must be an earlier solver turn of the same round and slot.
    fn solution_of(&self, i: usize, t: &TrajectoryTurn) -> Result<&TrajectoryTurn, String> {
        let s = t.about_solution.ok_or_else(|| format!("{} turn without about_solution", t.role))?;
        match self.turns.get(s as usize) {
            Some(sol) if (s as usize) < i && sol.role == Role::Solver && sol.round == t.round && sol.slot == t.slot => Ok(sol),
            _ => Err(format!("about_solution {s} is not the solution of round {} slot {}", t.round, t.slot)),
        }
    }

    fn check_links(&self, i: usize, t: &TrajectoryTurn) -> Result<(), String> {
        match t.role {
            Role::Solver => {
                if t.agent != t.slot || t.judge_index != 0 {
                    return Err(format!("solver of slot {} is agent {} (judge {})", t.slot, t.agent, t.judge_index));
                }
                if t.about_solution.is_some() || t.about_evaluation.is_some() || t.score.is_some() || t.judgment.is_some() {
                    return Err("solver turn with links or a verdict".to_string());
                }
            }
            Role::Evaluator => {
                if !self.variant.has_evaluators() {
                    return Err("evaluator turn in a variant without evaluations".to_string());
                }
                self.solution_of(i, t)?;
                if t.about_evaluation.is_some() || t.score.is_some() {
                    return Err("evaluator turn with about_evaluation or a score".to_string());
                }
                let want = if self.variant == Variant::NoScoring { extract_judgment(&t.text) } else { None };
                if t.judgment != want {
                    return Err(format!("stored judgment {:?} but the text gives {want:?}", t.judgment));
                }
            }
            Role::Scorer => {
                if !self.variant.has_scorers() {
                    return Err("scorer turn in a variant without scoring".to_string());
                }
                self.solution_of(i, t)?;
                match (self.variant.has_evaluators(), t.about_evaluation) {
                    (true, Some(e)) => match self.turns.get(e as usize) {
                        Some(ev)
                            if (e as usize) < i && ev.role == Role::Evaluator && ev.about_solution == t.about_solution && ev.judge_index == t.judge_index => {}
                        _ => return Err(format!("about_evaluation {e} is not evaluation {} of its solution", t.judge_index)),
                    },
                    (true, None) => return Err("scorer turn without about_evaluation".to_string()),
                    (false, Some(_)) => return Err("judge turn with about_evaluation in the no-evaluation variant".to_string()),
                    (false, None) => {}
                }
                if t.judgment.is_some() {
                    return Err("scorer turn with a judgment".to_string());
                }
                let want = extract_score(&t.text);
                if t.score != want {
                    return Err(format!("stored score {:?} but the text gives {want:?}", t.score));
                }
            }
            other => return Err(format!("a {other} turn has no place in a CoMAS game")),
        }
        Ok(())
    }
}
