//! Experience making for CoSIR: the evidence of each game is replayed by the method's reward
//! code, and every message and final turn becomes one sample for the seat's agent with its
//! turn reward (spec cosir.md §4.4, §5). Pure code, no I/O.
use crate::experience::{scalar_experience, AgentShare, StepBatch, StepRecord};
use comas_proto::v1 as pb;
use comas_workflow::cosir::metrics::CosirMetrics;
use comas_workflow::cosir::reward::replay;
use comas_workflow::cosir::{CosirConfig, CosirTrajectory};
use comas_workflow::WorkflowError;

/// Experiences per agent (in game, then turn order) and the step's metrics.
pub fn make_cosir_step(
    games: &[(String, CosirTrajectory)],
    config: &CosirConfig,
    num_agents: u32,
    versions: Option<&[u64]>,
) -> Result<StepBatch, WorkflowError> {
    let mut per_agent: Vec<Vec<pb::Experience>> = vec![Vec::new(); num_agents as usize];
    let mut shares = AgentShare::for_agents(num_agents, None);
    let mut sums = vec![0.0; num_agents as usize];
    let mut replays = Vec::with_capacity(games.len());
    for (episode_id, t) in games {
        if let Some(v) = versions {
            crate::experience::check_turn_versions(&t.policy_turns(), episode_id, v).map_err(WorkflowError::MalformedTrajectory)?;
        }
        let r = replay(config, t);
        for (turn, reward) in t.turns.iter().zip(&r.rewards) {
            let k = turn.agent as usize;
            let Some(share) = shares.get_mut(k) else {
                return Err(WorkflowError::MalformedTrajectory(format!(
                    "episode {episode_id}: turn {} is agent {}'s, but the job has {num_agents} agents",
                    turn.turn_index, turn.agent
                )));
            };
            share.samples += 1;
            sums[k] += reward.reward;
            // The group of `group_norm` (spec §5): G rollouts of a table, same seat and turn.
            let group = format!("{}/seat{}/turn{}", t.table.id, turn.seat, turn.turn_index);
            per_agent[k].push(scalar_experience(&turn.sampled, reward.reward, group, episode_id, turn.turn_index, config.sampling_for(turn.role).temperature));
        }
        replays.push((r, t.table.tries, t.completion_tokens()));
    }
    AgentShare::set_means(&mut shares, &sums);
    let games: Vec<_> = replays.iter().map(|(r, tries, tokens)| (r, *tries, *tokens)).collect();
    let metrics = CosirMetrics::of(&games);
    let record = StepRecord { method: "cosir", metrics: &metrics, agents: shares };
    let metrics = serde_json::to_value(&record).map_err(|e| WorkflowError::MalformedTrajectory(e.to_string()))?;
    Ok(StepBatch { per_agent, metrics, pooled_whitening: false })
}
