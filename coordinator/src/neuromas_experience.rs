//! Experience making for NeuroMAS (spec neuromas.md §5): each rollout's readout is graded once,
//! and every node's sample of the rollout becomes one experience for the node's adapter with
//! that same reward. The group of `group_norm` is the task and the node, so each node's
//! advantage is its rollout's reward normalised over the task's G rollouts. Pure code, no I/O.
use crate::experience::{scalar_experience, AgentShare, StepBatch, StepRecord};
use comas_proto::v1 as pb;
use comas_workflow::neuromas::metrics::NeuromasMetrics;
use comas_workflow::neuromas::reward::reward;
use comas_workflow::neuromas::{NeuromasConfig, NeuromasTrajectory};
use comas_workflow::WorkflowError;

/// Experiences per agent (in rollout, then node order) and the step's metrics.
pub fn make_neuromas_step(
    rollouts: &[(String, NeuromasTrajectory)],
    config: &NeuromasConfig,
    num_agents: u32,
    versions: Option<&[u64]>,
) -> Result<StepBatch, WorkflowError> {
    let mut per_agent: Vec<Vec<pb::Experience>> = vec![Vec::new(); num_agents as usize];
    let mut shares = AgentShare::for_agents(num_agents, None);
    let mut sums = vec![0.0; num_agents as usize];
    for (episode_id, t) in rollouts {
        if let Some(v) = versions {
            crate::experience::check_turn_versions(&t.policy_turns(), episode_id, v).map_err(WorkflowError::MalformedTrajectory)?;
        }
        let r = reward(config, t);
        for turn in &t.turns {
            let k = turn.agent as usize;
            let Some(share) = shares.get_mut(k) else {
                return Err(WorkflowError::MalformedTrajectory(format!(
                    "episode {episode_id}: node {} is agent {}'s, but the job has {num_agents} agents",
                    turn.node.position(),
                    turn.agent
                )));
            };
            share.samples += 1;
            sums[k] += r;
            let group = format!("{}/node{}", t.task.id, turn.node.uid);
            per_agent[k].push(scalar_experience(&turn.sampled, r, group, episode_id, turn.turn_index, config.sampling_of(&t.graph, turn.node).temperature));
        }
    }
    AgentShare::set_means(&mut shares, &sums);
    let all: Vec<&NeuromasTrajectory> = rollouts.iter().map(|(_, t)| t).collect();
    let metrics = NeuromasMetrics::of(config, &all);
    let record = StepRecord { method: "neuromas", metrics: &metrics, agents: shares };
    let metrics = serde_json::to_value(&record).map_err(|e| WorkflowError::MalformedTrajectory(e.to_string()))?;
    Ok(StepBatch { per_agent, metrics, pooled_whitening: false })
}
