//! Experience making for MAPPA: each coached action is one sample for the agent that acted,
//! with the exact context it saw as its prompt and R = w_p · scale · score (spec 5); actions
//! the coach could not score are left out and counted. Pure code, no I/O.
use crate::experience::{prompt_group, scalar_experience, AgentShare, StepBatch, StepRecord};
use comas_proto::v1 as pb;
use comas_workflow::mappa::{action_rewards, MappaConfig, MappaMetrics, MappaTrajectory, NormScope};
use comas_workflow::WorkflowError;

/// Experiences per agent (in episode, then action order) and the step's metrics.
pub fn make_mappa_step(
    episodes: &[(String, MappaTrajectory)],
    config: &MappaConfig,
    num_agents: u32,
    versions: Option<&[u64]>,
) -> Result<StepBatch, WorkflowError> {
    let mut per_agent: Vec<Vec<pb::Experience>> = vec![Vec::new(); num_agents as usize];
    let mut shares = AgentShare::for_agents(num_agents, Some(0));
    let mut sums = vec![0.0; num_agents as usize];
    for (episode_id, t) in episodes {
        if let Some(v) = versions {
            crate::experience::check_turn_versions(&t.policy_turns(), episode_id, v).map_err(WorkflowError::MalformedTrajectory)?;
        }
        for (a, r) in t.actions.iter().zip(action_rewards(config, t)) {
            let k = a.agent as usize;
            let Some(share) = shares.get_mut(k) else {
                return Err(WorkflowError::MalformedTrajectory(format!(
                    "episode {episode_id}: action {} is agent {}'s, but the job has {num_agents} agents",
                    a.turn_index, a.agent
                )));
            };
            let Some(reward) = r.reward else {
                *share.samples_dropped.get_or_insert(0) += 1;
                continue;
            };
            share.samples += 1;
            sums[k] += reward;
            // Only actions from one and the same state share a group (spec 5).
            let group = prompt_group(&t.question_id, a.role, a.step, &a.sampled.prompt_ids);
            let mut e = scalar_experience(&a.sampled, reward, group, episode_id, a.turn_index, config.sampling_for(a.role).temperature);
            e.norm_group = match config.norm_scope {
                NormScope::PerAgent | NormScope::Global => String::new(),
                NormScope::PerAgentRole => a.role.as_str().to_string(),
            };
            per_agent[k].push(e);
        }
    }
    AgentShare::set_means(&mut shares, &sums);
    let trajectories: Vec<&MappaTrajectory> = episodes.iter().map(|(_, t)| t).collect();
    let metrics = MappaMetrics::of(config, &trajectories);
    let record = StepRecord { method: "mappa", metrics: &metrics, agents: shares };
    let metrics = serde_json::to_value(&record).map_err(|e| WorkflowError::MalformedTrajectory(e.to_string()))?;
    Ok(StepBatch { per_agent, metrics, pooled_whitening: config.norm_scope == NormScope::Global })
}

#[cfg(test)]
mod tests {
    use super::*;
    use comas_workflow::mappa::{Action, CoachVerdict};
    use comas_workflow::turn::Sampled;
    use comas_workflow::{FinishReason, Role, TaskKind};

    fn action(turn_index: u32, agent: u32, role: Role, position: u32, step: u32, score: Option<f64>) -> Action {
        Action {
            turn_index,
            agent,
            role,
            position,
            step,
            messages: Vec::new(),
            sampled: Sampled {
                prompt_ids: vec![1, 2, turn_index],
                completion_ids: vec![5, 6],
                logprobs: vec![-0.1, -0.2],
                constrained: Vec::new(),
                finish_reason: FinishReason::Stop,
                policy_version: 3,
            },
            text: String::new(),
            tool_runs: Vec::new(),
            malformed_call: false,
            observation: None,
            coach: CoachVerdict { process_score: score, outcome: None, retry_attempted: score.is_none(), fallback_used: false, replies: Vec::new() },
            workspace: Vec::new(),
        }
    }

    #[test]
    fn each_scored_action_is_one_sample_of_its_agent() {
        let t = MappaTrajectory {
            question_id: "q".into(),
            task: TaskKind::Math,
            instance: 0,
            actions: vec![
                action(0, 0, Role::ProblemSolver, 0, 0, Some(6.0)),
                action(1, 1, Role::CodeExecutor, 1, 0, Some(4.0)),
                action(2, 1, Role::CodeExecutor, 1, 1, None),
                action(3, 2, Role::Verifier, 2, 0, Some(10.0)),
            ],
            outcome_correct: Some(true),
            ds_outcome: None,
        };
        let config = MappaConfig::default();
        let b = make_mappa_step(&[("e1".into(), t.clone())], &config, 3, Some(&[3, 3, 3])).unwrap();
        let counts: Vec<usize> = b.per_agent.iter().map(Vec::len).collect();
        assert_eq!(counts, vec![1, 1, 1]);
        let rewards: Vec<f64> = b.per_agent.iter().map(|e| e[0].reward.unwrap()).collect();
        assert_eq!(rewards, vec![0.6000000000000001, 0.4, 1.0]);
        assert_eq!(b.per_agent[1][0].prompt_ids, vec![1, 2, 1]);
        assert_eq!(b.metrics["samples_dropped"], 1);
        assert_eq!(b.metrics["agents"][1]["samples_dropped"], 1);
        assert_eq!(b.metrics["coach_score"]["verifier"]["mean"], 10.0);
        assert_eq!(b.metrics["method"], "mappa");
        // Whitening partitions: the whole agent by default, or each of its roles.
        assert!(b.per_agent.iter().flatten().all(|e| e.norm_group.is_empty()));
        let by_role = MappaConfig { norm_scope: NormScope::PerAgentRole, ..config.clone() };
        let r = make_mappa_step(&[("e1".into(), t.clone())], &by_role, 3, Some(&[3, 3, 3])).unwrap();
        let groups: Vec<&str> = r.per_agent.iter().flatten().map(|e| e.norm_group.as_str()).collect();
        assert_eq!(groups, vec!["problem_solver", "code_executor", "verifier"]);
        let err = make_mappa_step(&[("e1".into(), t)], &config, 3, Some(&[3, 4, 3])).unwrap_err().to_string();
        assert!(err.contains("turn 1 (code_executor of agent 1) was sampled with policy version 3, but this step uses version 4"), "{err}");
    }
}
