//! MAPPA settings (spec 4, 5, 8) and their checks; a bad setting names its key.
use crate::turn::{Role, SamplingSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The chain of agents (spec 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Pipeline {
    /// Problem Solver → Code Executor (Python) → Verifier.
    #[default]
    MathChat,
    /// Data Engineer → Modeler → Analyst, all with Python, sharing a file workspace.
    DsBench,
}

impl Pipeline {
    /// The roles in chain order.
    pub fn roles(self) -> &'static [Role] {
        match self {
            Pipeline::MathChat => &[Role::ProblemSolver, Role::CodeExecutor, Role::Verifier],
            Pipeline::DsBench => &[Role::DataEngineer, Role::Modeler, Role::Analyst],
        }
    }

    /// Actions each role may take (spec 2: 1 / 2 / 1).
    pub fn default_max_turns(self) -> Vec<u32> {
        match self {
            Pipeline::MathChat => vec![1, 2, 1],
            Pipeline::DsBench => vec![4, 4, 4],
        }
    }

    /// Wall-clock seconds of one execution (spec 6: 30 / 60).
    pub fn default_tool_timeout_secs(self) -> f64 {
        match self {
            Pipeline::MathChat => 30.0,
            Pipeline::DsBench => 60.0,
        }
    }

    /// The files a role's runs hand back into the shared workspace (spec 6); none for MathChat.
    pub fn fetch_patterns(self, role: Role) -> &'static [&'static str] {
        match (self, role) {
            (Pipeline::DsBench, Role::Analyst) => &["submission.csv", "predictions.csv"],
            (Pipeline::DsBench, _) => &["*.pkl", "*.joblib", "*.npy", "*.npz"],
            (Pipeline::MathChat, _) => &[],
        }
    }

    /// Whether the role's fenced Python is executed.
    pub fn has_tools(self, role: Role) -> bool {
        matches!((self, role), (Pipeline::MathChat, Role::CodeExecutor) | (Pipeline::DsBench, _))
    }
}

/// Which samples an agent's advantages are whitened with (spec 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NormScope {
    /// All of the agent's samples in the step (the reference code's).
    #[default]
    PerAgent,
    /// The agent's samples of the same role (an agent that plays several roles).
    PerAgentRole,
    /// Every agent's samples of the step, pooled (the paper's "global batch normalization"):
    /// the learners report their return moments and whiten with the pool.
    Global,
}

/// What an action gets when the coach gives no score even after the format retry (spec 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CoachFallback {
    /// No reward: the sample is left out of training and counted.
    #[default]
    Drop,
    /// Reference parity: a loose number anywhere in the reply, else 5.
    Legacy,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MappaConfig {
    pub pipeline: Pipeline,
    /// The trained agent that plays each role, in chain order; one agent may play several.
    /// Filled from the job's agent list when left out (3 agents: one each; 1 agent: all).
    pub agents: Vec<u32>,
    /// The frozen model that coaches (an agent id past the trained ones; set by the job from
    /// the table's `coach`, the name of a `[[frozen]]` model, default "coach").
    #[schemars(rename = "coach", with = "String", extend("default" = "coach"))]
    pub coach_agent: u32,
    pub max_turns: Vec<u32>,
    /// Independent copies of each question per step.
    pub instances_per_question: u32,
    /// Sampling of the agents' actions (spec 5: temperature 1).
    pub sampling: SamplingSpec,
    /// A role's own sampling, where it differs (`[mappa.role_sampling.code_executor]`).
    pub role_sampling: BTreeMap<Role, SamplingSpec>,
    /// Sampling of the coach (spec 4: temperature 0).
    pub coach_sampling: SamplingSpec,
    /// Wall-clock limit of one execution (spec 6: 30 s for MathChat).
    pub tool_timeout_secs: f64,
    /// Characters of each program's output an agent reads back (head and tail), so that a
    /// program that prints a lot cannot push the agent's context past its model's.
    pub observation_chars: usize,
    /// Characters of a tool observation the coach sees (spec 4: 2000).
    pub coach_observation_chars: usize,
    pub coach_fallback: CoachFallback,
    pub norm_scope: NormScope,
    /// R = process_weight · reward_scale · score + outcome_weight · outcome (spec 5).
    pub reward_scale: f64,
    pub process_weight: f64,
    pub outcome_weight: f64,
    /// Most prompt tokens an action may have; a longer context fails the episode.
    pub prompt_max_len: Option<u32>,
}

impl Default for MappaConfig {
    fn default() -> Self {
        Self {
            pipeline: Pipeline::MathChat,
            agents: vec![0, 1, 2],
            coach_agent: 3,
            max_turns: Pipeline::MathChat.default_max_turns(),
            instances_per_question: 2,
            sampling: SamplingSpec { max_new_tokens: 4096, min_new_tokens: 0, ..SamplingSpec::default() },
            role_sampling: BTreeMap::new(),
            coach_sampling: SamplingSpec { temperature: 0.0, max_new_tokens: 512, min_new_tokens: 0, ..SamplingSpec::default() },
            tool_timeout_secs: 30.0,
            observation_chars: 4000,
            coach_observation_chars: 2000,
            coach_fallback: CoachFallback::Drop,
            norm_scope: NormScope::PerAgent,
            reward_scale: 0.1,
            process_weight: 1.0,
            outcome_weight: 0.0,
            prompt_max_len: None,
        }
    }
}

impl MappaConfig {
    /// Returns the key that is wrong and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, m: String| Err((k.to_string(), m));
        let n = self.pipeline.roles().len();
        if self.agents.len() != n {
            return bad("agents", format!("lists {} agents but the {:?} chain has {n} roles", self.agents.len(), self.pipeline));
        }
        if self.max_turns.len() != n || self.max_turns.contains(&0) {
            return bad("max_turns", format!("needs {n} values of at least 1, got {:?}", self.max_turns));
        }
        if self.agents.contains(&self.coach_agent) {
            return bad("coach_agent", format!("{} is also a trained agent; the coach must be a frozen model", self.coach_agent));
        }
        if self.instances_per_question == 0 {
            return bad("instances_per_question", "must be at least 1".into());
        }
        if let Err(m) = self.sampling.check() {
            return bad("sampling", m);
        }
        for (role, spec) in &self.role_sampling {
            if !self.pipeline.roles().contains(role) {
                return bad("role_sampling", format!("{role} is not a role of the {:?} chain", self.pipeline));
            }
            if let Err(m) = spec.check() {
                return bad(&format!("role_sampling.{role}"), m);
            }
        }
        if let Err(m) = self.coach_sampling.check() {
            return bad("coach_sampling", m);
        }
        if !(self.tool_timeout_secs > 0.0 && self.tool_timeout_secs.is_finite()) {
            return bad("tool_timeout_secs", format!("must be a positive number of seconds, got {}", self.tool_timeout_secs));
        }
        for (k, v) in [("reward_scale", self.reward_scale), ("process_weight", self.process_weight), ("outcome_weight", self.outcome_weight)] {
            if !v.is_finite() {
                return bad(k, format!("must be finite, got {v}"));
            }
        }
        if self.observation_chars == 0 || self.coach_observation_chars == 0 {
            return bad("observation_chars", "observation_chars and coach_observation_chars must be at least 1".into());
        }
        if self.prompt_max_len == Some(0) {
            return bad("prompt_max_len", "must be at least 1".into());
        }
        Ok(())
    }

    /// How a role's actions are sampled.
    pub fn sampling_for(&self, role: Role) -> &SamplingSpec {
        self.role_sampling.get(&role).unwrap_or(&self.sampling)
    }

    /// The longest reply any agent may write.
    pub fn max_new_tokens(&self) -> u32 {
        self.pipeline.roles().iter().map(|&r| self.sampling_for(r).max_new_tokens).max().unwrap_or(self.sampling.max_new_tokens)
    }

    /// Most actions one episode takes.
    pub fn max_actions(&self) -> u32 {
        self.max_turns.iter().sum()
    }

    /// The chain position of each action's role.
    pub fn role_at(&self, position: usize) -> Role {
        self.pipeline.roles()[position]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_mathchat_run_and_bad_keys_are_named() {
        let c = MappaConfig::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.max_actions(), 4);
        assert_eq!(c.role_at(1), Role::CodeExecutor);
        let key = |c: MappaConfig| c.validate().unwrap_err().0;
        assert_eq!(key(MappaConfig { agents: vec![0, 1], ..MappaConfig::default() }), "agents");
        assert_eq!(key(MappaConfig { max_turns: vec![1, 0, 1], ..MappaConfig::default() }), "max_turns");
        assert_eq!(key(MappaConfig { coach_agent: 1, ..MappaConfig::default() }), "coach_agent");
        assert_eq!(key(MappaConfig { tool_timeout_secs: 0.0, ..MappaConfig::default() }), "tool_timeout_secs");
        let solver = |spec| MappaConfig { role_sampling: [(Role::Solver, spec)].into_iter().collect(), ..MappaConfig::default() };
        assert_eq!(key(solver(SamplingSpec::default())), "role_sampling");
        let short = SamplingSpec { max_new_tokens: 64, ..SamplingSpec::default() };
        let c = MappaConfig { role_sampling: [(Role::CodeExecutor, short)].into_iter().collect(), ..MappaConfig::default() };
        assert_eq!((c.sampling_for(Role::CodeExecutor).max_new_tokens, c.sampling_for(Role::Verifier).max_new_tokens, c.max_new_tokens()), (64, 4096, 4096));
    }
}
