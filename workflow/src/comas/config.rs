//! CoMAS settings (spec 2, 3, 9) and their validation. Bad settings are rejected before any
//! episode starts, with a message that names the key to fix.
use crate::turn::{Role, SamplingSpec};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// How evaluators and scorers are drawn (spec 3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Assignment {
    /// Every agent judges equally often per round and role across the batch (reference code).
    #[default]
    Balanced,
    /// Every judge is drawn independently and uniformly (the paper's wording).
    IidUniform,
}

/// Which (solution, evaluation) pairs the solvers of round r > 0 see (spec 3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DiscussionSource {
    /// min(κ, #pairs) pairs of round r−1, drawn without replacement (reference code).
    #[default]
    PrevRoundSample,
    /// The last κ pairs in chronological order, possibly reaching into older rounds (paper prose).
    LastKPairsChronological,
}

/// Reward of the judge turn in the `no_evaluation` ablation (spec 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JudgeReward {
    /// 1 − r(s), computed from the judge's own score.
    #[default]
    ZeroSum,
    /// 0 for a valid score.
    Neutral,
}

/// Where the solver's reward comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RewardSource {
    /// The judges' scores (or verdicts): no ground truth, the method itself.
    #[default]
    Comas,
    /// 1 when the solution's final answer matches the data set's, 0 otherwise: a positive
    /// control with a verifier reward (like the paper's MAPoRL baseline). Evaluators and scorers
    /// keep their CoMAS rewards.
    Verifier,
}

/// The full method or one of the two reward ablations (spec 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Variant {
    /// Solve, evaluate, score.
    #[default]
    Full,
    /// Solve, then a judge scores the bare solution; no evaluation turn.
    NoEvaluation {
        #[serde(default)]
        judge_reward: JudgeReward,
    },
    /// Solve, then `evals_per_solution` ≥ 2 evaluations that each end in a verdict; no scorer.
    NoScoring,
}

impl Variant {
    pub fn has_evaluators(self) -> bool {
        !matches!(self, Variant::NoEvaluation { .. })
    }

    pub fn has_scorers(self) -> bool {
        !matches!(self, Variant::NoScoring)
    }

    /// The roles that speak in every round, in barrier order.
    pub fn roles(self) -> Vec<Role> {
        let mut roles = vec![Role::Solver];
        if self.has_evaluators() {
            roles.push(Role::Evaluator);
        }
        if self.has_scorers() {
            roles.push(Role::Scorer);
        }
        roles
    }
}

/// Sampling settings per role.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RoleSampling {
    pub solver: SamplingSpec,
    pub evaluator: SamplingSpec,
    pub scorer: SamplingSpec,
}

impl RoleSampling {
    pub fn for_role(&self, role: Role) -> &SamplingSpec {
        match role {
            Role::Solver => &self.solver,
            Role::Evaluator => &self.evaluator,
            Role::Scorer => &self.scorer,
            // Other methods' roles never speak in a CoMAS game.
            Role::ProblemSolver
            | Role::CodeExecutor
            | Role::Verifier
            | Role::Coach
            | Role::Member
            | Role::DataEngineer
            | Role::Modeler
            | Role::Analyst
            | Role::Discussant
            | Role::Voter
            | Role::Node
            | Role::Readout => &self.solver,
        }
    }

    /// The same settings for every role.
    pub fn uniform(spec: SamplingSpec) -> Self {
        Self { solver: spec.clone(), evaluator: spec.clone(), scorer: spec }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CoMasConfig {
    /// l: number of agents, each with its own weights (follows the job's agent list).
    #[schemars(skip)]
    pub num_agents: u32,
    /// R: discussion rounds; every agent writes one solution per round.
    pub num_rounds: u32,
    /// n: evaluations (or judges) per solution.
    pub evals_per_solution: u32,
    /// κ: (solution, evaluation) pairs shown to the solvers of a round.
    pub num_references: u32,
    /// Independent copies of each question per step.
    pub instances_per_question: u32,
    pub assignment: Assignment,
    /// Forbid an agent from evaluating or scoring its own solution.
    pub exclude_self: bool,
    pub discussion_source: DiscussionSource,
    /// Show evaluators the discussion block (the paper appendix's prompt).
    pub evaluator_sees_discussion: bool,
    pub variant: Variant,
    /// Quote completions with special tokens and stop string kept (reference-code parity).
    pub quote_raw_completion: bool,
    /// Most prompt tokens a turn may have (spec 3.7). Above it, quoted discussion blocks are
    /// left out, oldest first; a prompt that still does not fit fails its episode. Unset: the
    /// model's context less the role's max_new_tokens (the worker's token budget also binds).
    pub prompt_max_len: Option<u32>,
    pub sampling: RoleSampling,
    /// Where the solver's reward comes from: the judges (CoMAS) or the data set's answer.
    pub reward: RewardSource,
    /// Training steps in which scorers are paid for agreeing with the data set's answer, right
    /// and wrong solutions weighing alike over the step (`reward::warm_up_judges`), before the
    /// game runs on their scores alone; 0: none.
    pub judge_warmup_steps: u64,
}

impl Default for CoMasConfig {
    /// The main run of the paper (spec 2, 6.1).
    fn default() -> Self {
        Self {
            num_agents: 4,
            num_rounds: 2,
            evals_per_solution: 1,
            num_references: 2,
            instances_per_question: 4,
            assignment: Assignment::Balanced,
            exclude_self: false,
            discussion_source: DiscussionSource::PrevRoundSample,
            evaluator_sees_discussion: false,
            variant: Variant::Full,
            quote_raw_completion: false,
            prompt_max_len: None,
            sampling: RoleSampling::default(),
            reward: RewardSource::Comas,
            judge_warmup_steps: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    #[error("num_agents must be at least 1")]
    NoAgents,
    #[error("num_rounds must be at least 1")]
    NoRounds,
    #[error("evals_per_solution must be at least 1")]
    NoEvaluations,
    #[error("instances_per_question must be at least 1")]
    NoInstances,
    #[error("variant no_scoring needs evals_per_solution >= 2 (got {0}): each verdict is rewarded by agreement with the others")]
    NoScoringNeedsTwoEvaluations(u32),
    #[error("exclude_self needs num_agents >= 2 (got {0}): with one agent nobody else can judge")]
    ExcludeSelfNeedsTwoAgents(u32),
    #[error("sampling.{role}: {reason}")]
    Sampling { role: Role, reason: String },
    #[error("an episode would have {0} turns; num_agents x num_rounds x evals_per_solution is too large")]
    TooManyTurns(u64),
    #[error("prompt_max_len must be at least 1")]
    NoPromptRoom,
}

impl CoMasConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.num_agents == 0 {
            return Err(ConfigError::NoAgents);
        }
        if self.num_rounds == 0 {
            return Err(ConfigError::NoRounds);
        }
        if self.evals_per_solution == 0 {
            return Err(ConfigError::NoEvaluations);
        }
        if self.instances_per_question == 0 {
            return Err(ConfigError::NoInstances);
        }
        if self.variant == Variant::NoScoring && self.evals_per_solution < 2 {
            return Err(ConfigError::NoScoringNeedsTwoEvaluations(self.evals_per_solution));
        }
        if self.exclude_self && self.num_agents < 2 {
            return Err(ConfigError::ExcludeSelfNeedsTwoAgents(self.num_agents));
        }
        if self.prompt_max_len == Some(0) {
            return Err(ConfigError::NoPromptRoom);
        }
        for role in Role::COMAS {
            self.sampling.for_role(role).check().map_err(|reason| ConfigError::Sampling { role, reason })?;
        }
        let total = self.turns_per_instance();
        if total > u64::from(u32::MAX) {
            return Err(ConfigError::TooManyTurns(total));
        }
        Ok(())
    }

    /// Turns of one role in one round of one instance.
    pub fn turns_per_round_of(&self, role: Role) -> u64 {
        let l = u64::from(self.num_agents);
        let n = u64::from(self.evals_per_solution);
        match role {
            Role::Solver => l,
            Role::Evaluator if self.variant.has_evaluators() => l * n,
            Role::Scorer if self.variant.has_scorers() => l * n,
            _ => 0,
        }
    }

    pub fn turns_per_round(&self) -> u64 {
        Role::COMAS.iter().map(|&r| self.turns_per_round_of(r)).sum()
    }

    pub fn turns_per_instance(&self) -> u64 {
        self.turns_per_round() * u64::from(self.num_rounds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_main_run_and_valid() {
        let c = CoMasConfig::default();
        assert_eq!((c.num_agents, c.num_rounds, c.evals_per_solution, c.num_references), (4, 2, 1, 2));
        assert_eq!(c.instances_per_question, 4);
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.turns_per_instance(), 24);
    }

    #[test]
    fn turn_counts_per_variant() {
        let mut c = CoMasConfig { num_agents: 3, num_rounds: 2, evals_per_solution: 2, ..Default::default() };
        assert_eq!(c.turns_per_round(), 3 + 6 + 6);
        c.variant = Variant::NoEvaluation { judge_reward: JudgeReward::ZeroSum };
        assert_eq!(c.turns_per_round(), 3 + 6);
        assert_eq!(c.variant.roles(), vec![Role::Solver, Role::Scorer]);
        c.variant = Variant::NoScoring;
        assert_eq!(c.turns_per_round(), 3 + 6);
        assert_eq!(c.variant.roles(), vec![Role::Solver, Role::Evaluator]);
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let ok = CoMasConfig::default();
        let cases: Vec<(CoMasConfig, ConfigError)> = vec![
            (CoMasConfig { num_agents: 0, ..ok.clone() }, ConfigError::NoAgents),
            (CoMasConfig { num_rounds: 0, ..ok.clone() }, ConfigError::NoRounds),
            (CoMasConfig { evals_per_solution: 0, ..ok.clone() }, ConfigError::NoEvaluations),
            (CoMasConfig { instances_per_question: 0, ..ok.clone() }, ConfigError::NoInstances),
            (CoMasConfig { variant: Variant::NoScoring, evals_per_solution: 1, ..ok.clone() }, ConfigError::NoScoringNeedsTwoEvaluations(1)),
            (CoMasConfig { exclude_self: true, num_agents: 1, ..ok.clone() }, ConfigError::ExcludeSelfNeedsTwoAgents(1)),
            (CoMasConfig { num_agents: 100_000, evals_per_solution: 100_000, ..ok.clone() }, ConfigError::TooManyTurns(2 * (100_000 + 2 * 100_000 * 100_000))),
        ];
        for (cfg, want) in cases {
            assert_eq!(cfg.validate(), Err(want));
        }
        let mut c = ok.clone();
        c.sampling.scorer.min_new_tokens = 5000;
        assert_eq!(c.validate().unwrap_err().to_string(), "sampling.scorer: min_new_tokens (5000) exceeds max_new_tokens (4096)");
        let mut c = ok;
        c.sampling.evaluator.top_p = 0.0;
        assert_eq!(c.validate().unwrap_err().to_string(), "sampling.evaluator: top_p must be in (0, 1], got 0");
    }

    #[test]
    fn serde_shape() {
        let c: CoMasConfig = serde_json::from_str(
            r#"{"num_agents": 2, "variant": {"kind": "no_evaluation"}, "assignment": "iid_uniform",
                "discussion_source": "last_k_pairs_chronological", "sampling": {"scorer": {"temperature": 0.7}}}"#,
        )
        .unwrap();
        assert_eq!(c.num_agents, 2);
        assert_eq!(c.num_rounds, 2);
        assert_eq!(c.variant, Variant::NoEvaluation { judge_reward: JudgeReward::ZeroSum });
        assert_eq!(c.assignment, Assignment::IidUniform);
        assert_eq!(c.discussion_source, DiscussionSource::LastKPairsChronological);
        assert_eq!(c.sampling.scorer.temperature, 0.7);
        assert_eq!(c.sampling.scorer.max_new_tokens, 4096);
        assert!(serde_json::from_str::<CoMasConfig>(r#"{"num_agent": 2}"#).is_err());
        let v: Variant = serde_json::from_str(r#"{"kind": "no_evaluation", "judge_reward": "neutral"}"#).unwrap();
        assert_eq!(v, Variant::NoEvaluation { judge_reward: JudgeReward::Neutral });
    }
}
