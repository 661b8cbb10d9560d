//! CoMAS rewards (spec 5) and those of the two ablations (spec 9): a pure function from a
//! finished trajectory to one scalar per turn. Ground truth plays no part.
//!
//! - Full: a valid score ŝ gives the solver (ŝ−1)/2 and the evaluator 1 − that; the scorer gets 0.
//!   A broken score gives solver and evaluator 0 and the scorer −1. It is never replaced by a
//!   default. With n > 1 the solver gets the mean over its valid scores (0 if none) and each
//!   evaluator is paid from the score of its own pair.
//! - No evaluation: the solver as above; a judge gets −1 for a broken score, otherwise 1 − (ŝ−1)/2
//!   of its own score (`zero_sum`) or 0 (`neutral`).
//! - No scoring: the solver gets the fraction of valid verdicts that say correct (0 if none); an
//!   evaluator gets −1 for a broken verdict, otherwise the fraction of the other valid verdicts on
//!   the same solution that agree with it (0 if there are none).
//!
//! [`rewards`] also offers the positive control of the experiments, `reward = "verifier"`: the
//! solver is paid from the data set's answer instead (1 correct, 0 wrong, as graded for logging),
//! while evaluators and scorers keep the rewards above. That arm uses ground truth by design.
use super::config::{JudgeReward, RewardSource, Variant};
use super::score::Judgment;
use super::trajectory::{Trajectory, TrajectoryTurn};
use crate::error::WorkflowError;
use crate::mean::Sum;
use crate::grade::is_correct;
use crate::turn::Role;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Reward of one turn; the list returned by [`comas_rewards`] follows the trajectory's turn order.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TurnReward {
    pub turn_index: u32,
    pub agent: u32,
    pub role: Role,
    pub reward: f32,
}

pub const FORMAT_PENALTY: f64 = -1.0;

/// (ŝ−1)/2: 1 → 0, 2 → 0.5, 3 → 1.
fn solution_value(score: u8) -> f64 {
    (f64::from(score) - 1.0) / 2.0
}

/// The mean of `values`, 0 without any.
fn mean(values: impl Iterator<Item = f64>) -> f64 {
    Sum::of(values).value().unwrap_or(0.0)
}

/// Per-turn rewards of a finished CoMAS trajectory (checked with `Trajectory::validate` first).
pub fn comas_rewards(trajectory: &Trajectory) -> Result<Vec<TurnReward>, WorkflowError> {
    trajectory.validate()?;
    // The turns that pass a verdict on each solution: scorers, or the evaluators of no_scoring.
    let verdict_role = if trajectory.variant == Variant::NoScoring { Role::Evaluator } else { Role::Scorer };
    let mut verdicts: HashMap<u32, Vec<&TrajectoryTurn>> = HashMap::new();
    let mut scorer_of_evaluation: HashMap<u32, &TrajectoryTurn> = HashMap::new();
    for t in &trajectory.turns {
        if t.role == verdict_role {
            if let Some(s) = t.about_solution {
                verdicts.entry(s).or_default().push(t);
            }
        }
        if let (Role::Scorer, Some(e)) = (t.role, t.about_evaluation) {
            scorer_of_evaluation.insert(e, t);
        }
    }
    let on = |solution: Option<u32>| -> &[&TrajectoryTurn] { solution.and_then(|s| verdicts.get(&s)).map(Vec::as_slice).unwrap_or(&[]) };

    let rewards = trajectory.turns.iter().map(|t| {
        let reward = match (trajectory.variant, t.role) {
            (Variant::NoScoring, Role::Solver) => {
                mean(on(Some(t.turn_index)).iter().filter_map(|v| v.judgment).map(|j| f64::from(u8::from(j == Judgment::Correct))))
            }
            (Variant::NoScoring, Role::Evaluator) => match t.judgment {
                None => FORMAT_PENALTY,
                Some(mine) => mean(
                    on(t.about_solution).iter().filter(|v| v.turn_index != t.turn_index).filter_map(|v| v.judgment).map(|j| f64::from(u8::from(j == mine))),
                ),
            },
            (_, Role::Solver) => mean(on(Some(t.turn_index)).iter().filter_map(|v| v.score).map(solution_value)),
            (_, Role::Evaluator) => match scorer_of_evaluation.get(&t.turn_index).and_then(|s| s.score) {
                Some(score) => 1.0 - solution_value(score),
                None => 0.0,
            },
            (variant, Role::Scorer) => match (t.score, variant) {
                (None, _) => FORMAT_PENALTY,
                (Some(score), Variant::NoEvaluation { judge_reward: JudgeReward::ZeroSum }) => 1.0 - solution_value(score),
                (Some(_), _) => 0.0,
            },
            // `Trajectory::validate` refuses other methods' roles before rewards are made.
            (_, _) => 0.0,
        };
        TurnReward { turn_index: t.turn_index, agent: t.agent, role: t.role, reward: reward as f32 }
    });
    Ok(rewards.collect())
}

/// Per-turn rewards under the job's reward source. `answer` is the question's reference answer;
/// only the verifier source reads it.
pub fn rewards(trajectory: &Trajectory, source: RewardSource, answer: &str) -> Result<Vec<TurnReward>, WorkflowError> {
    let mut out = comas_rewards(trajectory)?;
    if source == RewardSource::Verifier {
        for (r, t) in out.iter_mut().zip(&trajectory.turns) {
            if t.role == Role::Solver {
                r.reward = f32::from(u8::from(is_correct(trajectory.task, &t.text, answer) == Some(true)));
            }
        }
    }
    Ok(out)
}

/// Whether each solution of `trajectory` is right, by its turn index (solutions the grader
/// cannot judge are left out).
pub(crate) fn graded_solutions(trajectory: &Trajectory, answer: &str) -> HashMap<u32, bool> {
    trajectory
        .turns
        .iter()
        .filter(|t| t.role == Role::Solver)
        .filter_map(|t| Some((t.turn_index, is_correct(trajectory.task, &t.text, answer)?)))
        .collect()
}

/// The scorer turns of one trajectory that the judges' warm-up pays: each with its valid score
/// and whether the solution it scored is right.
fn warm_up_turns<'a>(
    trajectory: &'a Trajectory,
    answer: &str,
) -> impl Iterator<Item = (usize, u8, bool)> + 'a {
    let right = graded_solutions(trajectory, answer);
    trajectory.turns.iter().enumerate().filter_map(move |(i, t)| match (t.role, t.score) {
        (Role::Scorer, Some(score)) => Some((i, score, *right.get(&t.about_solution?)?)),
        _ => None,
    })
}

/// What the judges' warm-up pays per unit of agreement on a right and on a wrong solution.
/// Right and wrong solutions weigh alike in a step: when 3 answers of 32 are right, a scorer
/// that calls every answer wrong would otherwise earn 0.9 while telling nothing apart (it did
/// on SmolLM2: 72 % of scores were 1 and the judges never separated right from wrong). With
/// these weights any constant score earns 0.5 on average and only telling them apart earns more.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmUpWeights {
    pub right: f64,
    pub wrong: f64,
}

impl WarmUpWeights {
    /// n / (2 n_right) and n / (2 n_wrong), over the scorer turns the warm-up pays in the step
    /// (`episodes`: each trajectory with its reference answer). A class with no turn weighs 0.5
    /// of a plain agreement, as the formula gives the other.
    pub fn balanced<'a>(episodes: impl IntoIterator<Item = (&'a Trajectory, &'a str)>) -> Self {
        let (mut right, mut wrong) = (0usize, 0usize);
        for (t, answer) in episodes {
            for (_, _, ok) in warm_up_turns(t, answer) {
                *(if ok { &mut right } else { &mut wrong }) += 1;
            }
        }
        let n = (right + wrong) as f64;
        let weight = |k: usize| if k == 0 { 0.5 } else { n / (2.0 * k as f64) };
        Self { right: weight(right), wrong: weight(wrong) }
    }
}

/// The judges' warm-up (`judge_warmup_steps`): each scorer turn is paid for agreeing with the
/// data set's answer instead of its CoMAS reward, (ŝ−1)/2 for a right solution and (3−ŝ)/2
/// for a wrong one, times its class's weight in the step ([`WarmUpWeights`]); a broken score
/// keeps −1 and a solution the grader cannot judge leaves its scorers' CoMAS rewards. Solvers
/// and evaluators keep theirs, so the judges learn to score before the game runs on their
/// scores alone.
pub fn warm_up_judges(trajectory: &Trajectory, answer: &str, weights: WarmUpWeights, rewards: &mut [TurnReward]) {
    for (i, score, ok) in warm_up_turns(trajectory, answer) {
        let agreement = if ok { solution_value(score) } else { 1.0 - solution_value(score) };
        if let Some(r) = rewards.get_mut(i) {
            r.reward = (agreement * if ok { weights.right } else { weights.wrong }) as f32;
        }
    }
}
