//! What experience making produces: one experience per trained turn for the learner of the agent
//! that spoke it, and the step's figures. The coordinator turns an [`Experience`] into the wire
//! message; everything here is plain data.
use crate::task::TaskRecord;
use crate::turn::{ConstrainedToken, FinishReason, Role, Sampled};
use serde::{Deserialize, Serialize};

/// One trained turn with its reward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Experience {
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
    pub reward: f64,
    pub finish_reason: FinishReason,
    /// Turns that answered one and the same prompt: the group of group estimators.
    pub group: String,
    /// The partition advantages are whitened within (empty: the agent's whole batch).
    pub norm_group: String,
    /// The temperature the turn was sampled at; `None` for a greedy turn (the learner scores
    /// it at its default).
    pub temperature: Option<f64>,
    pub sampling_logprobs: Vec<f32>,
    pub episode_id: String,
    pub turn_id: u32,
    pub policy_version: u64,
    pub constrained: Vec<ConstrainedToken>,
}

impl Experience {
    /// The experience of one sampled turn with a scalar reward.
    pub fn sampled(
        s: &Sampled,
        reward: f64,
        group: String,
        episode_id: &str,
        turn_id: u32,
        temperature: f64,
    ) -> Experience {
        Experience {
            prompt_ids: s.prompt_ids.clone(),
            completion_ids: s.completion_ids.clone(),
            reward,
            finish_reason: s.finish_reason,
            group,
            norm_group: String::new(),
            temperature: Some(temperature).filter(|&t| t > 0.0),
            sampling_logprobs: s.logprobs.clone(),
            episode_id: episode_id.to_string(),
            turn_id,
            policy_version: s.policy_version,
            constrained: s.constrained.clone(),
        }
    }
}

/// Turns share a group only if they answered one and the same prompt: same task, role, round
/// and exact prompt tokens.
pub fn prompt_group(task: &str, role: Role, round: u32, prompt_ids: &[u32]) -> String {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same prompt gives the same key in every process.
    let mut h = std::hash::DefaultHasher::new();
    prompt_ids.hash(&mut h);
    format!("{task}/{}/r{round}/{:016x}", role.as_str(), h.finish())
}

/// What a step's experience making sees besides the records.
#[derive(Debug, Clone, Copy)]
pub struct StepContext<'a> {
    /// Trained agents of the job.
    pub agents: u32,
    /// The data set the step's tasks came from (empty for generated or listed tasks): a method
    /// whose record carries only a task id finds the reference answer here.
    pub data: &'a [TaskRecord],
    /// Whether each experience carries its turn's sampling temperature (training steps do;
    /// evaluations make no experiences that train).
    pub with_temperatures: bool,
    /// The training step the records are of; `None` for an evaluation.
    pub step: Option<u64>,
}

/// A method's experience making.
#[derive(Debug, Clone, PartialEq)]
pub struct Made<M> {
    /// Experiences per agent, in (episode, turn) order.
    pub per_agent: Vec<Vec<Experience>>,
    pub metrics: M,
    /// Whiten every agent's advantages with return moments pooled over all agents (MAPPA's
    /// `global` scope) instead of each agent's own.
    pub pooled_whitening: bool,
}

/// A step's experiences with its figures as the metrics log carries them (the method's name
/// under `method`).
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    pub per_agent: Vec<Vec<Experience>>,
    pub metrics: serde_json::Value,
    pub pooled_whitening: bool,
}

/// One agent's share of a step: its samples, the turns left out and their mean reward.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentShare {
    pub agent: u32,
    pub samples: u64,
    /// Turns the method left out (MAPPA: actions the coach did not score).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples_dropped: Option<u64>,
    pub reward_mean: Option<f64>,
}

/// A step's figures for a method that counts each agent's samples and mean reward: the
/// method's own figures, flattened, and each agent's share.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Shares<M> {
    #[serde(flatten)]
    pub figures: M,
    #[serde(default)]
    pub agents: Vec<AgentShare>,
}

/// Sorts experiences to their agents and keeps each agent's share.
#[derive(Debug)]
pub struct ShareTally {
    pub per_agent: Vec<Vec<Experience>>,
    pub shares: Vec<AgentShare>,
    sums: Vec<f64>,
}

impl ShareTally {
    /// A tally for `agents` agents; `dropped` counts left-out turns when the method drops some.
    pub fn new(agents: u32, counts_dropped: bool) -> ShareTally {
        ShareTally {
            per_agent: vec![Vec::new(); agents as usize],
            shares: (0..agents)
                .map(|agent| AgentShare {
                    agent,
                    samples_dropped: counts_dropped.then_some(0),
                    ..Default::default()
                })
                .collect(),
            sums: vec![0.0; agents as usize],
        }
    }

    /// Adds agent `agent`'s experience; an agent the job does not have is an error naming the
    /// turn (`what`, e.g. "turn 3").
    pub fn push(
        &mut self,
        agent: u32,
        e: Experience,
        episode_id: &str,
        what: &str,
    ) -> Result<(), crate::WorkflowError> {
        let k = self.agent(agent, episode_id, what)?;
        self.shares[k].samples += 1;
        self.sums[k] += e.reward;
        self.per_agent[k].push(e);
        Ok(())
    }

    /// Counts a turn of agent `agent` that the method left out.
    pub fn drop_turn(
        &mut self,
        agent: u32,
        episode_id: &str,
        what: &str,
    ) -> Result<(), crate::WorkflowError> {
        let k = self.agent(agent, episode_id, what)?;
        *self.shares[k].samples_dropped.get_or_insert(0) += 1;
        Ok(())
    }

    fn agent(
        &self,
        agent: u32,
        episode_id: &str,
        what: &str,
    ) -> Result<usize, crate::WorkflowError> {
        let k = agent as usize;
        if k >= self.shares.len() {
            return Err(crate::WorkflowError::MalformedTrajectory(format!(
                "episode {episode_id}: {what} is agent {agent}'s, but the job has {} agents",
                self.shares.len()
            )));
        }
        Ok(k)
    }

    /// The experiences and each agent's share with its mean reward.
    pub fn finish(mut self) -> (Vec<Vec<Experience>>, Vec<AgentShare>) {
        for (share, sum) in self.shares.iter_mut().zip(&self.sums) {
            share.reward_mean = (share.samples > 0).then(|| sum / share.samples as f64);
        }
        (self.per_agent, self.shares)
    }
}
